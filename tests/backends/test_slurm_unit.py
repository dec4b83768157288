"""The Slurm backend without a cluster: script rendering, sbatch arguments, sacct parsing, states."""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpufleet.backends.slurm import SlurmBackend, batch_script, parse_sacct, sbatch_argv
from gpufleet.errors import UsageError
from gpufleet.spec import parse_spec

SPEC = parse_spec(
    {
        "name": "lm",
        "team": "perception",
        "entrypoint": ["python", "train.py", "--name", "$(rm -rf /)"],
        "priority": 5,
        "resources": {"cpus": 2, "gpus": 1},
        "env": {"A": 'it\'s "quoted"'},
    }
)


class FakeSlurm:
    """Records commands; answers sbatch with a job id and sacct with canned runs."""

    def __init__(self, sacct: str = "", refuse: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.sacct = sacct
        self.refuse = refuse

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        if self.refuse:
            raise UsageError(f"{argv[0]} refused: {self.refuse}")
        out = "4242\n" if argv[0] == "sbatch" else self.sacct if argv[0] == "sacct" else ""
        return subprocess.CompletedProcess(list(argv), 0, out, "")


def test_batch_script_is_python_with_values_as_literals(tmp_path: Path) -> None:
    script = batch_script(SPEC, 7, tmp_path)
    ast.parse(script)  # valid Python
    assert script.startswith("#!") and "subprocess" not in script and "shell" not in script
    assert "$(rm -rf /)" in script and "SLURM_RESTART_COUNT" in script and "execvp" in script


def test_sbatch_arguments_map_the_spec(tmp_path: Path) -> None:
    argv = sbatch_argv(SPEC, 7, tmp_path, tmp_path / "job.sbatch")
    assert argv[0] == "sbatch" and "--requeue" in argv and "--open-mode=append" in argv
    assert "--account=perception" in argv and "--partition=high" in argv and "--cpus-per-task=2" in argv
    assert "--gres=gpu:1" in argv
    low = sbatch_argv(SPEC.copy_with(priority=0, resources={"cpus": 1, "gpus": 0}), 7, tmp_path, tmp_path / "x")
    assert "--partition=low" in low and not any(a.startswith("--gres") for a in low)


SACCT = """4242|PREEMPTED|2026-12-02T10:00:00|2026-12-02T10:00:30|0:15|30|billing=2,cpu=2,node=1
4242|COMPLETED|2026-12-02T10:00:40|2026-12-02T10:01:40|0:0|60|billing=2,cpu=2,node=1
garbage line
"""


def test_parse_sacct() -> None:
    runs = parse_sacct(SACCT)
    assert [r.state for r in runs] == ["PREEMPTED", "COMPLETED"]
    assert runs[0].end is not None and runs[0].start is not None and runs[0].end - runs[0].start == 30
    assert runs[1].elapsed_s == 60 and runs[1].alloc_tres.startswith("billing")


def test_submit_then_sync_records_two_attempts(home: Path) -> None:
    fake = FakeSlurm(sacct=SACCT)
    backend = SlurmBackend(home, runner=fake)
    job_id = backend.submit(SPEC)
    assert backend.store.job(job_id).backend_ref == "4242"
    assert (home / "jobs" / str(job_id) / "job.sbatch").exists()
    backend.sync()
    job = backend.store.job(job_id)
    assert job.state == "completed" and job.restarts == 1
    assert [a.outcome for a in backend.store.attempts(job_id)] == ["preempted", "completed"]
    backend.preempt  # noqa: B018 - exists
    with pytest.raises(UsageError, match="already completed"):
        backend.preempt(job_id)


def test_refused_submission_leaves_nothing(home: Path) -> None:
    backend = SlurmBackend(home, runner=FakeSlurm(refuse="Invalid account or account/partition combination"))
    with pytest.raises(UsageError, match="Invalid account"):
        backend.submit(SPEC)
    assert backend.store.jobs() == []
    assert not (home / "jobs" / "1").exists()


def test_running_then_requeued_states(home: Path) -> None:
    fake = FakeSlurm(sacct="4242|RUNNING|2026-12-02T10:00:00|Unknown|0:0|5|cpu=2\n")
    backend = SlurmBackend(home, runner=fake)
    job_id = backend.submit(SPEC)
    backend.sync()
    assert backend.store.job(job_id).state == "running"
    fake.sacct = SACCT.splitlines()[0] + "\n4242|PENDING|Unknown|Unknown|0:0|0|\n"
    backend.sync()
    job = backend.store.job(job_id)
    assert job.state == "queued" and backend.store.attempts(job_id)[0].outcome == "preempted"
