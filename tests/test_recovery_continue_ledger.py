"""The cost ledger counts the steps a ``recovery: continue`` job ran short-handed and the samples they skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import attempt_events

from gpufleet.cost.ledger import build_ledger
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import job_usages
from gpufleet.jobs.store import Attempt, Outcome, Store
from gpufleet.spec import parse_spec

SPEC = parse_spec(
    {
        "name": "elastic",
        "team": "nlp",
        "entrypoint": "gpufleet.workloads.tinylm:train",
        "resources": {"gpus": 2},
        "distributed": {"strategy": "ddp", "recovery": "continue"},
        "health": {"action": "mark"},
    }
)


def short(ts: float, steps: Any, skipped: Any, attempt: int = 1) -> dict[str, Any]:
    return {"ts": ts, "attempt": attempt, "kind": "short_handed", "steps": steps, "samples_skipped": skipped}


def test_short_handed_steps_and_skipped_samples_reach_the_ledger_per_job_and_in_total(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    job = store.add_job(SPEC, "local")
    other = store.add_job(SPEC.copy_with(name="whole"), "local")
    for job_id in (job, other):
        store.upsert_attempt(Attempt(job_id, 1, "ended", None, 1000.0, 1091.0, 0, Outcome("completed"), None, None))
    events = attempt_events(1, 1000.0, "completed")
    store.add_runtime_events(job, [*events, short(1010.0, 50, 200), short(1020.0, 3, 12)], offset=1)
    store.add_runtime_events(other, events, offset=1)
    usages = job_usages(store, store.job(job), now=2000.0) + job_usages(store, store.job(other), now=2000.0)
    assert [(u.short_handed_steps, u.samples_skipped) for u in usages] == [(53, 212), (0, 0)]
    ledger = build_ledger(usages, load_rates())
    assert ledger.jobs[job].to_dict()["short_handed_steps"] == 53
    assert ledger.jobs[job].to_dict()["samples_skipped"] == 212
    assert ledger.jobs[other].to_dict()["short_handed_steps"] == 0
    assert (ledger.total.short_handed_steps, ledger.total.samples_skipped) == (53, 212)


def test_counts_that_are_not_whole_numbers_read_as_zero(tmp_path: Path) -> None:
    """The event log is written by user processes: a bad count adds nothing, it does not break the ledger."""
    store = Store(tmp_path / "state.db")
    job = store.add_job(SPEC, "local")
    store.upsert_attempt(Attempt(job, 1, "ended", None, 1000.0, 1091.0, 0, Outcome("completed"), None, None))
    bad = [short(1010.0, -4, 1.5), short(1011.0, True, "9"), short(1012.0, 2, 8), short(1013.0, 1, 4, attempt=2)]
    store.add_runtime_events(job, [*attempt_events(1, 1000.0, "completed"), *bad], offset=1)
    (usage,) = job_usages(store, store.job(job), now=2000.0)
    assert (usage.short_handed_steps, usage.samples_skipped) == (2, 8)
