"""A scheduler killed at any store write of a preempt-and-resume scenario: the next one finishes the job.

Each run of the scenario (a low-priority job runs, is preempted, resumes and completes) lets the
first scheduler make ``k`` store writes and "kills" it at write ``k + 1`` (an exception out of its
tick; it never runs again, its children are left to the survivor). A new scheduler then recovers
and drives the job to the end. Whatever ``k``: the job completes, every attempt ran in exactly one
process, and the ledger prices every attempt.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from backend_contract import Killed, kill_at_write
from conftest import drive

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.cost.usage import store_usages
from gpufleet.jobs.events import read_events
from gpufleet.jobs.store import latest_step
from gpufleet.spec import parse_spec

SPEC = parse_spec(
    {
        "name": "victim",
        "entrypoint": "gpufleet.workloads.toy:train",
        "args": {"steps": 40, "step_seconds": 0.01},
        "checkpoint": {"every_steps": 10, "grace_seconds": 20},
        "max_restarts": 20,
    }
)


def scenario(home: Path, k: int) -> tuple[LocalBackend, int, bool]:
    """Run the scenario with the first scheduler killed at write ``k``; True if it was killed."""
    backend = LocalBackend(home, spawn=False)
    first = LocalScheduler(home, slots=1, poll_s=0.02)
    kill_at_write(first.store, k)
    job = backend.submit(SPEC)
    killed = False
    try:
        drive(first, lambda: (latest_step(backend.store, job) or 0) >= 5)
        backend.preempt(job)
        drive(first, lambda: backend.store.job(job).state == "completed")
    except Killed:
        killed = True
    survivor = LocalScheduler(home, slots=1, poll_s=0.02)
    survivor.adopt_orphans()
    for run in first.running.values():  # the dead scheduler's children: reaped for hygiene only
        run.proc.wait(timeout=60)
        run.log.close()
    drive(survivor, lambda: backend.store.job(job).state in ("completed", "failed"))
    survivor.shutdown()
    return backend, job, killed


SCENARIO_WRITES = 24
"""The scenario makes about 22 writes (more or fewer ingests, by timing); past the last, nothing is killed."""


def crash_points() -> list[int]:
    """Every write under ``make soak`` (GPUFLEET_SOAK=1); every fourth in the default suite (2 cores)."""
    step = 1 if os.environ.get("GPUFLEET_SOAK") else 4
    return list(range(1, SCENARIO_WRITES + 1, step))


@pytest.mark.parametrize("k", crash_points())
def test_a_scheduler_killed_at_any_write_loses_nothing(tmp_path: Path, k: int) -> None:
    home = tmp_path / "home"
    backend, job, killed = scenario(home, k)
    state = backend.store.job(job)
    assert state.state == "completed", (k, state.reason)
    attempts = backend.store.attempts(job)
    events, _ = read_events(home / "jobs" / str(job) / "events.jsonl")
    starts = [e["attempt"] for e in events if e["kind"] == "session_start"]
    # One process per attempt at most (one stopped during its start-up may never open a session).
    assert len(starts) == len(set(starts)) and set(starts) <= {a.n for a in attempts}, (k, starts)
    assert all(a.state == "ended" and a.outcome for a in attempts)
    assert len(store_usages(backend.store, job_ids=[job])) == len(attempts)  # the ledger counts each one
    finals = [e for e in events if e["kind"] == "session_end" and e.get("status") == "completed"]
    assert len(finals) == 1 and finals[0]["step"] == 40
    assert killed or k > 20  # the early writes (both launches, the preemption) are always reached
