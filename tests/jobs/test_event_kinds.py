"""Every event kind gpufleet writes is an ``EventKind``; the notable ones shown to people are among them."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import drive

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.jobs.events import NOTABLE, EventKind, read_events
from gpufleet.jobs.store import latest_step
from gpufleet.runtime import Preempted, TrainSession
from gpufleet.spec import JobSpec, parse_spec
from gpufleet.workloads import tinylm
from gpufleet.workloads.tinylm import TINY

KINDS = {kind.value for kind in EventKind}


def test_members_are_the_strings_in_logs() -> None:
    assert {"step": 1}[EventKind.STEP] == 1 and isinstance(EventKind.SESSION_END, str)
    assert f"{EventKind.CHECKPOINT}" == str(EventKind.CHECKPOINT) == "checkpoint"
    assert json.dumps({"kind": EventKind.ROLLBACK}) == '{"kind": "rollback"}'
    assert all(kind.value == kind.name.lower() for kind in EventKind)


def test_notable_is_a_subset_without_repeats() -> None:
    assert set(NOTABLE) <= set(EventKind)
    assert len(set(NOTABLE)) == len(NOTABLE)
    assert all(isinstance(kind, EventKind) for kind in NOTABLE)


def test_every_kind_a_training_run_writes_is_a_member(
    job_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with checkpoints, a NaN step rolled back, a SIGTERM that requeues, and the attempt that resumes."""
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    monkeypatch.setenv("GPUFLEET_FAULT", "nan@12")
    monkeypatch.setenv("GPUFLEET_ATTEMPT", "1")

    def on_step(sess: TrainSession) -> None:
        if sess.step == 20:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Preempted):
        tinylm.train(**{**TINY, "steps": 30}, on_step=on_step)
    monkeypatch.setenv("GPUFLEET_ATTEMPT", "2")
    tinylm.train(**{**TINY, "steps": 30})

    events, _ = read_events(tmp_path / "events.jsonl")
    written = {e["kind"] for e in events}
    assert written <= KINDS, f"kinds that are not EventKind members: {sorted(written - KINDS)}"
    expected = {
        EventKind.SESSION_START,
        EventKind.RESTORE,
        EventKind.TRAIN_START,
        EventKind.STEP,
        EventKind.CHECKPOINT,
        EventKind.UNHEALTHY,
        EventKind.ROLLBACK,
        EventKind.PREEMPT_SIGNAL,
        EventKind.SESSION_END,
    }
    assert expected <= written


def _toy(name: str, priority: int = 0, **args: Any) -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "team": "t",
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": 150, "step_seconds": 0.01, **args},
            "priority": priority,
            "checkpoint": {"every_steps": 20, "grace_seconds": 20},
        }
    )


def test_every_kind_the_local_backend_stores_is_a_member(local: tuple[LocalBackend, LocalScheduler]) -> None:
    """A low-priority job preempted by a high-priority one, requeued and completed: backend and runtime events."""
    backend, scheduler = local
    low = backend.submit(_toy("low"))
    drive(scheduler, lambda: (latest_step(backend.store, low) or 0) >= 30)
    high = backend.submit(_toy("high", priority=10, steps=20))
    drive(scheduler, lambda: all(backend.store.job(j).state == "completed" for j in (low, high)))

    stored = {e.kind for j in (low, high) for e in backend.store.events(j)}
    assert stored <= KINDS, f"kinds that are not EventKind members: {sorted(stored - KINDS)}"
    expected = {
        EventKind.QUEUED,
        EventKind.ATTEMPT_START,
        EventKind.PREEMPTED_BY,
        EventKind.SIGTERM,
        EventKind.PREEMPT_SIGNAL,
        EventKind.ATTEMPT_END,
        EventKind.REQUEUED,
        EventKind.COMPLETED,
    }
    assert expected <= stored
    shown = {e.kind for e in backend.store.events(low, NOTABLE)}
    assert {EventKind.PREEMPTED_BY, EventKind.SIGTERM, EventKind.REQUEUED, EventKind.COMPLETED} <= shown
