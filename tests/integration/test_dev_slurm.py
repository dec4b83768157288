"""The real Slurm that `scripts/dev-slurm up` starts: two nodes, accounting, accounts, preemption.

These tests do not start Slurm themselves: the Makefile runs `scripts/dev-slurm up` first. They find the
cluster through `$GPUFLEET_SLURM_DIR/env` (default `.dev/slurm/env`). When it is not up they fail under CI
(the env var CI is set) and are skipped otherwise, with the command that starts it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import service_missing

REPO = Path(__file__).resolve().parents[2]
START_CMD = "scripts/dev-slurm up"

Env = dict[str, str]


def _state_dir() -> Path:
    return Path(os.environ.get("GPUFLEET_SLURM_DIR") or REPO / ".dev" / "slurm")


def _slurm_conf() -> Path:
    """SLURM_CONF as the state dir's `env` file exports it (falling back to <state>/slurm.conf)."""
    env_file = _state_dir() / "env"
    if env_file.is_file():
        for line in env_file.read_text().splitlines():
            words = shlex.split(line, comments=True)
            if len(words) == 2 and words[0] == "export" and words[1].startswith("SLURM_CONF="):
                return Path(words[1].removeprefix("SLURM_CONF="))
    return _state_dir() / "slurm.conf"


def _run(env: Env, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
    )


def _wait(what: str, done: Callable[[], bool], timeout: float, interval: float = 0.5) -> float:
    """Poll until done(); returns the time.monotonic() at which it was."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic()


@pytest.fixture(scope="module")
def slurm() -> Env:
    """The environment for Slurm clients, once the dev cluster answers; skip or fail when it does not."""
    conf = _slurm_conf()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env["SLURM_CONF"] = str(conf)
    problem = ""
    if not conf.is_file():
        problem = f"no Slurm config at {conf}"
    else:
        try:
            res = _run(env, "scontrol", "ping", timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = f"`scontrol ping` failed: {exc}"
        else:
            if res.returncode != 0 or "UP" not in res.stdout:
                problem = f"slurmctld does not answer: {(res.stdout + res.stderr).strip()}"
    if problem:
        service_missing(f"dev Slurm is not up ({problem}); start it with `{START_CMD}`")
    return env


def _node_cpus(env: Env) -> int:
    res = _run(env, "sinfo", "-h", "-N", "-o", "%c")
    assert res.returncode == 0, res.stderr
    return int(res.stdout.split()[0])


def _sbatch(env: Env, *args: str) -> str:
    res = _run(env, "sbatch", "--parsable", *args)
    assert res.returncode == 0, f"sbatch failed: {res.stderr}"
    return res.stdout.strip().split(";")[0]


def _job_states(env: Env, job_id: str) -> list[str]:
    """The accounted state of each run of a job (requeued runs included), oldest first."""
    res = _run(env, "sacct", "--duplicates", "-X", "-n", "--parsable2", "-j", job_id, "-o", "State")
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()] if res.returncode == 0 else []


def _squeue_state(env: Env, job_id: str) -> str:
    return _run(env, "squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip()


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_node_is_idle(slurm: Env) -> None:
    """The nodes are up and schedulable: idle, or busy with jobs that some other test left queued."""

    def healthy() -> bool:
        res = _run(slurm, "sinfo", "-h", "-N", "-o", "%T")
        states = set(res.stdout.split())  # one line per partition the node is in
        if res.returncode != 0 or not states:
            return False
        if _run(slurm, "squeue", "-h", "-t", "RUNNING,COMPLETING", "-o", "%i").stdout.strip():
            return states <= {"idle", "mixed", "allocated", "completing"}
        return states == {"idle"}

    _wait("the node to be idle", healthy, timeout=20)


def test_two_nodes_one_of_them_behind_low_and_high(slurm: Env) -> None:
    """`low` and `high` share one node, so a high job that needs it must preempt; `wide` spans both."""
    res = _run(slurm, "sinfo", "-h", "-N", "-o", "%P %N")  # one line per node and partition
    assert res.returncode == 0, res.stderr
    members: dict[str, set[str]] = {}
    for partition, node in map(str.split, res.stdout.splitlines()):
        members.setdefault(partition.rstrip("*"), set()).add(node)
    assert len(members["low"]) == 1 and members["low"] == members["high"]
    assert len(members["wide"]) == 2 and members["low"] < members["wide"]


def test_trivial_job_completes_and_is_accounted(slurm: Env, tmp_path: Path) -> None:
    job = _sbatch(slurm, "-A", "perception", "-p", "low", "-D", str(tmp_path), "-o", "out-%j.txt", "--wrap", "sleep 1")
    _wait(f"job {job} to be COMPLETED in sacct", lambda: _job_states(slurm, job) == ["COMPLETED"], timeout=45)
    res = _run(slurm, "sacct", "-j", job, "--parsable2", "-o", "JobID,State,Elapsed,AllocTRES,Account")
    rows = [line.split("|") for line in res.stdout.splitlines()]
    assert rows[0] == ["JobID", "State", "Elapsed", "AllocTRES", "Account"]
    job_row = next(row for row in rows[1:] if row[0] == job)
    assert job_row[1] == "COMPLETED"
    assert "cpu=" in job_row[3]
    assert job_row[4] == "perception"


def test_unknown_account_is_rejected(slurm: Env, tmp_path: Path) -> None:
    account = f"nosuch{uuid.uuid4().hex[:8]}"
    res = _run(slurm, "sbatch", "-A", account, "-D", str(tmp_path), "--wrap", "true")
    assert res.returncode != 0
    assert "Invalid account" in res.stderr


def test_high_partition_preempts_and_requeues_low_job(slurm: Env, tmp_path: Path) -> None:
    cpus = str(_node_cpus(slurm))  # both jobs take the whole node, so the high one must preempt
    low_script = 'trap "echo got TERM; exit 75" TERM; echo start $SLURM_RESTART_COUNT; sleep 30 & wait'
    low = _sbatch(
        slurm,
        *("-A", "perception", "-p", "low", "--requeue", "--open-mode=append", "-c", cpus),
        *("-D", str(tmp_path), "-o", "low-%j.out", "--wrap", low_script),
    )
    out = tmp_path / f"low-{low}.out"
    high = ""
    try:
        _wait("the low job to start", lambda: "start" in _read(out), timeout=20, interval=0.2)
        high_submitted = time.monotonic()
        high = _sbatch(
            slurm,
            *("-A", "planning", "-p", "high", "-c", cpus),
            *("-D", str(tmp_path), "-o", "high-%j.out", "--wrap", "sleep 3"),
        )
        term_at = _wait("the low job to get SIGTERM", lambda: "got TERM" in _read(out), timeout=15, interval=0.2)
        assert term_at - high_submitted < 10
        high_done = _wait(
            f"high job {high} to complete", lambda: _job_states(slurm, high) == ["COMPLETED"], timeout=20, interval=0.2
        )
        restarted = _wait("the low job to restart", lambda: "start 1" in _read(out), timeout=25, interval=0.2)
        assert restarted - high_done < 20, f"restarted {restarted - high_done:.1f}s after the high job ended"
        lines = _read(out).splitlines()
        assert lines[0].strip() == "start"  # SLURM_RESTART_COUNT is unset on the first run
        assert "got TERM" in lines
        assert _squeue_state(slurm, low) == "RUNNING"
        # Both runs are in accounting: the preempted one and the one now running.
        _wait(f"two runs of job {low} in sacct", lambda: len(_job_states(slurm, low)) >= 2, timeout=15)
        states = _job_states(slurm, low)
        assert states[0] in ("PREEMPTED", "REQUEUED"), states
        assert states[-1] == "RUNNING", states
    finally:
        _run(slurm, "scancel", *(j for j in (low, high) if j))
        _wait(f"job {low} to leave the queue", lambda: _squeue_state(slurm, low) == "", timeout=20)
