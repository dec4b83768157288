"""The local scheduler forks its attempts from its warm server, and starts them cold when it cannot."""

from __future__ import annotations

import os
import select
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import drive

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.local.warm import WarmProcess
from gpufleet.jobs.store import latest_step
from gpufleet.paths import attempt_log
from gpufleet.spec import parse_spec


def toy(name: str, steps: int, step_seconds: float = 0.02) -> Any:
    return parse_spec(
        {
            "name": name,
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": steps, "step_seconds": step_seconds},
            "checkpoint": {"every_steps": 1000, "grace_seconds": 60},
        }
    )


def kinds_of(procs: dict[int, Any]) -> list[str]:
    return ["warm" if isinstance(p, WarmProcess) else "cold" for _, p in sorted(procs.items())]


def seen_processes(scheduler: LocalScheduler, job: int, procs: dict[int, Any]) -> bool:
    """Note the process of the job's running attempt; false, so that ``or`` goes on to the condition."""
    run = scheduler.running.get(job)
    if run is not None:
        procs.setdefault(run.n, run.proc)
    return False


def test_a_preempted_job_restarts_warm_and_loses_no_step(home: Path) -> None:
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=1, poll_s=0.02)
    job = backend.submit(toy("warm", 400))
    procs: dict[int, Any] = {}

    def tick_until(cond: Any) -> None:
        drive(scheduler, lambda: seen_processes(scheduler, job, procs) or cond(), timeout=300)

    tick_until(lambda: (latest_step(backend.store, job) or 0) >= 5)
    assert scheduler.warm is not None
    assert select.select([scheduler.warm], [], [], 300)[0], "the warm server never said it was ready"  # unread
    backend.preempt(job)
    tick_until(lambda: len(backend.store.attempts(job)) == 2)
    tick_until(lambda: backend.store.job(job).state == "completed")
    scheduler.shutdown()
    first, second = backend.store.attempts(job)
    assert (first.exit_code, first.outcome, second.exit_code) == (75, "preempted", 0)
    assert kinds_of(procs)[1] == "warm"
    saved = max(e.data["step"] for e in backend.store.events(job, kinds=("checkpoint",)) if e.attempt == 1)
    restored = [e.data["step"] for e in backend.store.events(job, kinds=("restore",)) if e.attempt == 2]
    assert restored == [saved]
    assert "Warning" not in attempt_log(home, job, 2).read_text()  # run as `-m` would be, not imported twice
    assert scheduler.warm is None  # shut down with the scheduler


def test_warm_start_off_starts_every_attempt_cold(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_WARM_START", "0")
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=1, poll_s=0.02)
    job = backend.submit(toy("cold", 10, 0.0))
    procs: dict[int, Any] = {}
    drive(scheduler, lambda: seen_processes(scheduler, job, procs) or backend.store.job(job).state == "completed")
    scheduler.shutdown()
    assert scheduler.warm is None and all(isinstance(p, subprocess.Popen) for p in procs.values())


def test_a_dead_warm_server_saves_its_attempts_and_the_next_start_cold(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=1, poll_s=0.02)
    first = backend.submit(toy("first", 3, 0.0))
    drive(scheduler, lambda: backend.store.job(first).state == "completed", timeout=300)
    assert scheduler.warm is not None and scheduler.warm.wait_ready(300)
    job = backend.submit(toy("orphaned", 400))
    procs: dict[int, Any] = {}
    drive(scheduler, lambda: seen_processes(scheduler, job, procs) or (latest_step(backend.store, job) or 0) >= 5)
    assert kinds_of(procs) == ["warm"]
    os.kill(scheduler.warm.pid, signal.SIGKILL)  # its child gets SIGTERM: it saves and exits 75
    drive(scheduler, lambda: seen_processes(scheduler, job, procs) or backend.store.job(job).state == "completed")
    scheduler.shutdown()
    attempts = backend.store.attempts(job)
    assert [(a.exit_code, a.outcome) for a in attempts] == [(75, "requeued"), (0, "completed")]
    assert kinds_of(procs) == ["warm", "cold"]
    assert capsys.readouterr().out.count("no warm start") == 1
