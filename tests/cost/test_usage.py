"""From stored attempts and runtime events to ledger buckets and the preemption overhead (usage.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import attempt_events

from gpufleet.cost.ledger import build_ledger
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import job_usages
from gpufleet.jobs.store import Attempt, Outcome, Store
from gpufleet.spec import parse_spec

SPEC = parse_spec({"name": "lm", "team": "nlp", "entrypoint": "gpufleet.workloads.toy:train"})
OUTCOMES = ("preempted", "requeued", "preempted", "completed")


def test_three_preemptions_from_stored_events(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    job_id = store.add_job(SPEC, "local")
    events: list[dict[str, Any]] = []
    for n, outcome in enumerate(OUTCOMES, start=1):
        start = 1000.0 * n
        end = start + (91.0 if outcome == "completed" else 63.0)
        store.upsert_attempt(Attempt(job_id, n, "ended", None, start, end, 0, Outcome(outcome), None, None))
        events += attempt_events(n, start, outcome)
    store.add_runtime_events(job_id, events, offset=1)
    usages = job_usages(store, store.job(job_id), now=10_000.0)

    assert [u.after_preemption for u in usages] == [False, True, True, True]
    assert [u.preempt_save_s for u in usages] == pytest.approx([0.7, 0.7, 0.7, 0.0])
    assert [u.checkpoint_s for u in usages] == pytest.approx([1.1, 1.1, 1.1, 0.4])
    assert [u.lost_s for u in usages] == pytest.approx([0.02, 0.02, 0.02, 0.0])
    assert [u.shutdown_s for u in usages] == pytest.approx([2.97, 2.97, 2.97, 0.0])
    assert [u.startup_s for u in usages] == pytest.approx([8.0 + 2.97, 7.5 + 2.97, 7.5 + 2.97, 7.5])

    cost = build_ledger(usages, load_rates()).jobs[job_id]
    parts = {k: v * 3600 for k, v in cost.preemption_gpu_hours.items()}
    # lost 3 x 0.02; start-up: attempt 1's shut-down, then every restart's start-up and shut-down;
    # restore: the three restarts; checkpoint: the three saves at the signal.
    expected = {
        "lost": 0.06,
        "startup": 2.97 + 2 * (7.5 + 2.97) + 7.5,
        "restore": 1.5,
        "checkpoint": 2.1,
        "staging": 0.0,
    }
    assert parts == pytest.approx(expected)
    assert cost.gpu_hours["lost"] * 3600 == pytest.approx(0.06)  # what the headline used to call the whole cost
    assert cost.preemption_overhead_gpu_hours * 3600 == pytest.approx(sum(expected.values()))
    assert cost.preemption_share == pytest.approx(sum(expected.values()) / (3 * 63.0 + 91.0))


def test_events_outside_the_recorded_wall_are_clamped_in(tmp_path: Path) -> None:
    """Slurm's End is truncated to the second: the save at the signal and the session's end may come
    after it. They are clamped into the wall: no lost work, no shut-down, and the buckets still sum to it."""
    store = Store(tmp_path / "state.db")
    job_id = store.add_job(SPEC, "slurm")
    store.upsert_attempt(Attempt(job_id, 1, "ended", None, 1000.0, 1060.0, 0, Outcome.PREEMPTED, None, None))
    events = attempt_events(1, 1000.0 + 0.25, OUTCOMES[0])  # the save at 1060.26, the session's end at 1060.28
    store.add_runtime_events(job_id, events, offset=1)
    (u,) = job_usages(store, store.job(job_id), now=10_000.0)
    assert u.wall_s == 60.0 and u.lost_s == 0.0 and u.shutdown_s == 0.0
    assert u.startup_s == pytest.approx(8.25)
    assert sum(u.seconds().values()) == pytest.approx(60.0)


def test_killed_attempts_are_listed_apart_from_preemptions(tmp_path: Path) -> None:
    """A rank lost to its group, a rank killed before its session ended, a vanished attempt and the OOM
    killer's SIGKILL are kills, not preemptions; a session that saved at a signal and asked to be requeued
    was preempted, like an attempt the scheduler preempted."""
    store = Store(tmp_path / "state.db")
    job_id = store.add_job(SPEC, "local")
    ends: list[tuple[str, int, dict[str, Any] | None]] = [
        ("preempted", 75, {"status": "requeue"}),  # the scheduler's SIGTERM
        ("requeued", 75, {"status": "requeue"}),  # a signal from elsewhere (a cloud's reclaim)
        ("requeued", 75, {"status": "requeue", "reason": "rank_lost", "error": "connection closed by peer"}),
        ("requeued", 75, None),  # rank 0 killed: nobody ended its session
        ("lost", -9, None),
        ("failed", -9, None),  # the OOM killer
        ("failed", 1, {"status": "failed", "error": "ValueError: bad"}),
        ("completed", 0, {"status": "completed"}),
    ]
    events: list[dict[str, Any]] = []
    for n, (outcome, code, end) in enumerate(ends, start=1):
        start = 1000.0 * n
        store.upsert_attempt(Attempt(job_id, n, "ended", None, start, start + 60.0, code, Outcome(outcome), None, None))
        events += [{"ts": start + 1.0, "kind": "train_start", "step": 0, "attempt": n}]
        if end is not None:
            events += [{"ts": start + 50.0, "kind": "session_end", "step": 5, "attempt": n, **end}]
    store.add_runtime_events(job_id, events, offset=1)
    usages = job_usages(store, store.job(job_id), now=10_000.0)
    assert [u.killed for u in usages] == [False, False, True, True, True, True, False, False]
    cost = build_ledger(usages, load_rates()).jobs[job_id]
    assert (cost.preemptions, cost.killed, cost.attempts) == (2, 4, 8)
    assert cost.to_dict()["preemptions"] == 2 and cost.to_dict()["killed"] == 4
