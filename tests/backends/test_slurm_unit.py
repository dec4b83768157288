"""The Slurm backend without a cluster: script rendering, sbatch arguments, sacct parsing, states."""

from __future__ import annotations

import ast
import json
import subprocess
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends.slurm.backend import (
    SlurmBackend,
    batch_script,
    parse_sacct,
    plan_slurm,
    sbatch_argv,
    slurm_usage,
)
from gpufleet.cost.usage import store_usages
from gpufleet.errors import UsageError
from gpufleet.jobs.store import Store
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


SACCT = """4242|PREEMPTED|2026-12-02T10:00:00|2026-12-02T10:00:30|0:15|30|billing=2,cpu=2,node=1|perception
4242|COMPLETED|2026-12-02T10:00:40|2026-12-02T10:01:40|0:0|60|billing=2,cpu=2,node=1|perception
garbage line
"""


def test_parse_sacct() -> None:
    runs = parse_sacct(SACCT)
    assert [r.state for r in runs] == ["PREEMPTED", "COMPLETED"]
    assert runs[0].end is not None and runs[0].start is not None and runs[0].end - runs[0].start == 30
    assert runs[1].elapsed_s == 60 and runs[1].alloc_tres.startswith("billing") and runs[1].account == "perception"


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
    fake = FakeSlurm(sacct="4242|RUNNING|2026-12-02T10:00:00|Unknown|0:0|5|cpu=2|perception\n")
    backend = SlurmBackend(home, runner=fake)
    job_id = backend.submit(SPEC)
    backend.sync()
    assert backend.store.job(job_id).state == "running"
    fake.sacct = SACCT.splitlines()[0] + "\n4242|PENDING|Unknown|Unknown|0:0|0||perception\n"
    backend.sync()
    job = backend.store.job(job_id)
    assert job.state == "queued" and backend.store.attempts(job_id)[0].outcome == "preempted"


# A loaded machine: each run's interpreter writes its first event seconds after Slurm's Start, and
# attempt 1's session ends 0.3 s after the whole second sacct truncated its End to.
BILLED = """4242|PREEMPTED|2026-12-02T10:00:00|2026-12-02T10:00:30|0:15|30|billing=2,cpu=2,gres/gpu=1,node=1|perception
4242|COMPLETED|2026-12-02T10:00:40|2026-12-02T10:01:40|0:0|60|billing=2,cpu=2,gres/gpu=1,node=1|perception
"""
T1 = datetime.fromisoformat("2026-12-02T10:00:00").timestamp()  # parsed as sacct's times are: local time
T2 = datetime.fromisoformat("2026-12-02T10:00:40").timestamp()
LATE_EVENTS: list[tuple[float, int, str, dict[str, Any]]] = [
    (T1 + 7.4, 1, "attempt_start", {"pid": 11}),
    (T1 + 8.9, 1, "restore", {"step": None, "seconds": 0.0, "cause": "start"}),
    (T1 + 9.0, 1, "train_start", {"step": 0}),
    (T1 + 20.0, 1, "checkpoint", {"step": 10, "seconds": 0.5, "reason": "periodic"}),
    (T1 + 29.6, 1, "preempt_signal", {"step": 14, "signal": "SIGTERM"}),
    (T1 + 30.2, 1, "checkpoint", {"step": 14, "seconds": 0.6, "reason": "preempt"}),
    (T1 + 30.3, 1, "session_end", {"step": 14, "status": "requeue"}),
    (T2 + 6.2, 2, "attempt_start", {"pid": 12}),
    (T2 + 7.9, 2, "restore", {"step": 14, "seconds": 0.4, "cause": "start"}),
    (T2 + 8.3, 2, "train_start", {"step": 14}),
    (T2 + 59.5, 2, "session_end", {"step": 100, "status": "completed"}),
]


def test_ledger_hours_equal_sacct_billed_hours_with_a_late_first_event(home: Path) -> None:
    fake = FakeSlurm(sacct=BILLED)
    backend = SlurmBackend(home, runner=fake)
    job_id = backend.submit(SPEC)
    with (home / "jobs" / str(job_id) / "events.jsonl").open("a") as fh:
        for ts, attempt, kind, data in LATE_EVENTS:
            fh.write(json.dumps({"ts": ts, "attempt": attempt, "kind": kind, **data}) + "\n")
    backend.sync()
    attempts = backend.store.attempts(job_id)
    assert [(a.started_at, a.ended_at) for a in attempts] == [(T1, T1 + 30), (T2, T2 + 60)]  # sacct's, not events'

    first, second = store_usages(backend.store)
    assert first.wall_s == 30 and second.wall_s == 60  # == ElapsedRaw
    assert first.startup_s == pytest.approx(9.0)  # Slurm's Start to the first step: the late interpreter included
    assert second.startup_s == pytest.approx(8.3 - 0.4) and second.restore_s == pytest.approx(0.4)
    assert first.lost_s == 0 and first.shutdown_s == 0  # the session end after the truncated End is clamped in
    assert sum(first.seconds().values()) == pytest.approx(30)

    report = slurm_usage(backend.store, runner=fake)
    assert report["ok"], report
    (row,) = report["accounts"]
    assert (row["account"], row["resource"]) == ("perception", "gpu")
    assert row["sacct_seconds"] == 90 and row["ledger_seconds"] == 90 and row["allowed_seconds"] == 0
    assert row["ledger_hours"] == row["sacct_hours"] == round(90 / 3600, 6) and row["difference_hours"] == 0


def test_usage_reports_a_ledger_that_outgrew_the_bill(home: Path) -> None:
    fake = FakeSlurm(sacct=BILLED)
    backend = SlurmBackend(home, runner=fake)
    backend.submit(SPEC)
    backend.sync()
    fake.sacct = BILLED.replace("|30|", "|29|")  # Slurm bills one second less than its own Start..End
    report = slurm_usage(backend.store, runner=fake)
    assert not report["ok"] and report["accounts"][0]["ledger_seconds"] - report["accounts"][0]["sacct_seconds"] == 1


def _runs(*states: str) -> list[Any]:
    """sacct runs of job 4242, one per ``STATE`` or ``STATE:exit``, a minute apart."""
    lines = []
    for i, item in enumerate(states):
        state, _, code = item.partition(":")
        if state == "PENDING":
            lines.append("4242|PENDING|Unknown|Unknown|0:0|0||perception")
            continue
        start = f"2026-12-02T10:{i:02d}:00"
        lines.append(f"4242|{state}|{start}|{start[:-2]}30|{code or 0}:0|30|billing=1,cpu=1,node=1|perception")
    return parse_sacct("\n".join(lines))


@pytest.mark.parametrize(
    ("states", "max_restarts", "expect"),
    [
        # exit 75 on a cluster without RequeueExit=75: Slurm has ended the job, gpufleet requeues it
        (("FAILED:75",), 5, ("queued", "requeue", ["requeued"])),
        # ... once: the requeued run is pending again
        (("REQUEUED:75", "PENDING"), 5, ("queued", None, ["requeued"])),
        # preempted once more than max_restarts allows: Slurm would run it again, gpufleet cancels it
        (("PREEMPTED", "PREEMPTED", "PREEMPTED", "PENDING"), 2, ("failed", "cancel", ["preempted"] * 3)),
        (("PREEMPTED", "COMPLETED"), 2, ("completed", None, ["preempted", "completed"])),
        (("TIMEOUT",), 2, ("failed", None, ["failed"])),
        (("RUNNING",), 2, ("running", None, [None])),
    ],
)
def test_plan_follows_the_one_attempt_rule(
    home: Path, states: tuple[str, ...], max_restarts: int, expect: tuple[str, str | None, list[str | None]]
) -> None:
    store = Store(home / "state.db")
    job_id = store.add_job(SPEC.copy_with(max_restarts=max_restarts), "slurm")
    plan, action = plan_slurm(store.job(job_id), [], _runs(*states), now=0.0)
    assert (plan.state, action, [a.outcome for a in plan.attempts]) == expect
    if states == ("TIMEOUT",):
        assert plan.reason == "Slurm ended the run TIMEOUT"


def test_signals_and_never_started_runs_in_sacct() -> None:
    runs = parse_sacct(
        "4242|FAILED|2026-12-02T10:00:00|2026-12-02T10:00:01|0:35|1|billing=1,cpu=1,node=1|perception\n"
        "4243|CANCELLED by 0|2026-12-02T10:00:05|2026-12-02T10:00:05|0:0|0||perception\n"
    )
    assert runs[0].exit_code == -35 and runs[0].start is not None
    assert runs[1].state == "CANCELLED" and runs[1].start is None  # cancelled while pending: never ran
