"""``Store.event_count``: how many events a job has, counted no further than asked (what the server checks
before answering a job's view on its event loop)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.jobs.store import Store
from gpufleet.spec import parse_spec


def test_the_count_is_the_jobs_own_and_stops_at_its_bound(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    spec = parse_spec({"name": "counted", "team": "research", "entrypoint": "train.py"})
    busy, quiet = store.add_job(spec, "local"), store.add_job(spec, "local")
    before = store.event_count(busy, at_most=10**6)  # what submitting wrote
    for step in range(25):
        store.add_event(busy, "step", attempt=1, step=step)
    assert store.event_count(busy, at_most=10**6) == before + 25
    assert store.event_count(busy, at_most=10) == 10
    assert store.event_count(busy, at_most=0) == 0
    assert store.event_count(busy, at_most=-5) == 0
    assert store.event_count(quiet, at_most=10**6) == store.event_count(quiet, at_most=before + 1)
    assert store.event_count(10**6, at_most=10) == 0  # no such job: nothing counted, no error
