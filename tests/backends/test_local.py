"""The local backend with real processes: preemption, requeue, grace, cancel, crash recovery."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import drive

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.errors import UsageError
from gpufleet.jobs.store import latest_step
from gpufleet.runtime import CheckpointDir
from gpufleet.spec import JobSpec, parse_spec
from gpufleet.workloads.tinylm import TINY


def toy(name: str, priority: int = 0, **overrides: Any) -> JobSpec:
    spec: dict[str, Any] = {
        "name": name,
        "team": "t",
        "entrypoint": "gpufleet.workloads.toy:train",
        "args": {"steps": 150, "step_seconds": 0.01},
        "priority": priority,
        "checkpoint": {"every_steps": 20, "grace_seconds": 20},
    }
    spec.update(overrides)
    return parse_spec(spec)


def state_of(backend: LocalBackend, job_id: int) -> str:
    return backend.store.job(job_id).state


def test_high_priority_preempts_low_which_resumes_without_losing_steps(local: Any) -> None:
    backend, scheduler = local
    low = backend.submit(toy("low"))
    drive(scheduler, lambda: (latest_step(backend.store, low) or 0) >= 30)
    high = backend.submit(toy("high", priority=10, args={"steps": 20, "step_seconds": 0.01}))
    drive(scheduler, lambda: all(state_of(backend, j) == "completed" for j in (low, high)))
    attempts = backend.store.attempts(low)
    assert [a.outcome for a in attempts] == ["preempted", "completed"]
    assert attempts[0].exit_code == 75
    events = backend.store.events(low)
    signalled = next(e for e in events if e.kind == "preempt_signal")
    restored = next(e for e in events if e.kind == "restore" and e.attempt == 2)
    assert restored.data["step"] == signalled.data["step"]  # zero steps lost
    high_start = backend.store.attempts(high)[0].started_at
    assert attempts[0].ended_at is not None and attempts[0].ended_at <= high_start
    assert backend.store.job(low).restarts == 1


def test_grace_expiry_kills_and_max_restarts_fails(local: Any, tmp_path: Path) -> None:
    backend, scheduler = local
    script = tmp_path / "stubborn.py"
    ready = tmp_path / "ready"
    script.write_text(
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "pathlib.Path(sys.argv[1]).touch()\n"
        "time.sleep(120)\n"
    )
    job = backend.submit(toy("stubborn", entrypoint=[sys.executable, str(script), str(ready)], max_restarts=0))
    drive(scheduler, ready.exists)
    backend.preempt(job, grace=0.5)
    drive(scheduler, lambda: state_of(backend, job) == "failed")
    kinds = [e.kind for e in backend.store.events(job)]
    assert "sigterm" in kinds and "sigkill" in kinds
    assert "max_restarts" in (backend.store.job(job).reason or "")


def test_cancel_running_and_queued(local: Any) -> None:
    backend, scheduler = local
    first = backend.submit(toy("first", args={"steps": 10_000, "step_seconds": 0.01}))
    second = backend.submit(toy("second"))
    drive(scheduler, lambda: state_of(backend, first) == "running")
    backend.cancel(second)
    backend.cancel(first)
    drive(scheduler, lambda: state_of(backend, first) == "cancelled" and state_of(backend, second) == "cancelled")
    assert backend.store.attempts(second) == []
    with pytest.raises(UsageError, match="already cancelled"):
        backend.cancel(first)


def test_nonzero_exit_fails_without_requeue(local: Any) -> None:
    backend, scheduler = local
    job = backend.submit(toy("crash", args={"steps": 3, "step_seconds": 0.0, "exit_code": 3}))
    drive(scheduler, lambda: state_of(backend, job) == "failed")
    assert backend.store.job(job).reason == "exit code 3"
    assert len(backend.store.attempts(job)) == 1


def test_missing_command_fails_cleanly(local: Any) -> None:
    backend, scheduler = local
    job = backend.submit(toy("missing", entrypoint=["/nonexistent/trainer"]))
    drive(scheduler, lambda: state_of(backend, job) == "failed")
    assert "cannot start" in (backend.store.job(job).reason or "")


def test_too_many_gpus_is_refused(local: Any) -> None:
    backend, _ = local
    with pytest.raises(UsageError, match="virtual GPU slot"):
        backend.submit(toy("big", resources={"gpus": 4}))
    assert backend.store.jobs() == []


def test_crashed_scheduler_attempts_are_requeued_and_resume(home: Path) -> None:
    backend = LocalBackend(home, spawn=False)
    crashed = LocalScheduler(home, slots=1, poll_s=0.02)
    job = backend.submit(toy("orphan", args={"steps": 80, "step_seconds": 0.02}))
    drive(crashed, lambda: (latest_step(backend.store, job) or 0) >= 25)
    pid = backend.store.attempts(job)[0].pid
    assert pid is not None
    # The first scheduler "dies" here: nobody reaps its child. A new one takes over.
    survivor = LocalScheduler(home, slots=1, poll_s=0.02)
    survivor.adopt_orphans()
    crashed.running[job].proc.wait(timeout=10)  # killed by the survivor, reaped for hygiene
    crashed.running[job].log.close()
    # The survivor SIGTERMs the orphan, which saves and exits 75: nothing is lost.
    assert backend.store.attempts(job)[0].outcome == "requeued"
    drive(survivor, lambda: state_of(backend, job) == "completed")
    saved = [e for e in backend.store.events(job, kinds=("preempt_signal",)) if e.attempt == 1]
    restore = [e for e in backend.store.events(job, kinds=("restore",)) if e.attempt == 2]
    assert saved and restore and restore[0].data["step"] == saved[0].data["step"] >= 25
    survivor.shutdown()


SMALL_LM: dict[str, Any] = {**TINY, "steps": 80}


def test_real_sigterm_resume_is_bit_exact_across_processes(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two real preemptions by the scheduler, SIGTERM and all; weights equal the uninterrupted run."""
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")  # a step event every step, to preempt on time
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=1, poll_s=0.02)
    lm = {
        "name": "lm",
        "entrypoint": "gpufleet.workloads.tinylm:train",
        "args": SMALL_LM,
        "resources": {"cpus": 1},
        "checkpoint": {"every_steps": 13},
    }
    job = backend.submit(parse_spec(lm))
    for n, at in ((1, 12), (2, 31)):

        def reached(n: int = n, at: int = at) -> bool:
            attempts = backend.store.attempts(job)
            return len(attempts) == n and (latest_step(backend.store, job) or 0) >= at

        def ended(n: int = n) -> bool:
            return backend.store.attempts(job)[n - 1].outcome is not None

        drive(scheduler, reached)
        backend.preempt(job)
        drive(scheduler, ended)
    drive(scheduler, lambda: state_of(backend, job) == "completed", timeout=180)
    scheduler.shutdown()
    assert [a.outcome for a in backend.store.attempts(job)] == ["preempted", "preempted", "completed"]
    ckpt = home / "jobs" / str(job) / "checkpoints"
    _, resumed = CheckpointDir(ckpt).load(ckpt / f"step-{SMALL_LM['steps']:08d}")

    from gpufleet.workloads import tinylm

    os.environ.pop("GPUFLEET_SPEC", None)
    torch.set_num_threads(1)
    tinylm.train(**SMALL_LM, ckpt_dir=str(tmp_path / "reference"))
    ref_dir = tmp_path / "reference"
    _, reference = CheckpointDir(ref_dir).load(ref_dir / f"step-{SMALL_LM['steps']:08d}")
    for name in ("model", "optimizer"):
        for key, value in reference[name].items() if name == "model" else []:
            assert torch.equal(value, resumed[name][key]), key
    ref_opt, res_opt = reference["optimizer"]["state"], resumed["optimizer"]["state"]
    for index, moments in ref_opt.items():
        for key, value in moments.items():
            assert torch.equal(value, res_opt[index][key]), (index, key)
