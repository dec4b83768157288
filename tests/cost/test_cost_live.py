"""A running job's pricing inputs kept between reads (cost/live.py): brought up to date from the events since, the
figures always those of a read from scratch."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from test_cost_cache import NOW, Expected, add_attempt, assert_same_figures, spec

from gpufleet.cost import live, usage
from gpufleet.cost.gather import cost_summary
from gpufleet.jobs.store import Store


@pytest.fixture
def store(home: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """Two running jobs (one of two attempts, the first preempted) and one completed."""
    monkeypatch.setattr(time, "time", lambda: NOW)
    store = Store(home / "state.db")
    a = store.add_job(spec("a", "nlp"), "local")
    add_attempt(store, a, 1, 8000.0, None)
    store.set_job_state(a, "running")
    b = store.add_job(spec("b", "vision", "A100", spot=False, gpus=4), "local")
    add_attempt(store, b, 1, 7000.0, "preempted", gpus=4)
    add_attempt(store, b, 2, 7500.0, None, gpus=4)
    store.set_job_state(b, "running")
    done = store.add_job(spec("done", "nlp"), "local")
    add_attempt(store, done, 1, 6000.0, "completed")
    store.set_job_state(done, "completed")
    return store


@pytest.fixture
def whole(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The jobs the next reads read from scratch (not from their kept inputs)."""
    seen: list[int] = []
    real = live.LiveReader._whole

    def counting(self: live.LiveReader, facts: Any, *args: Any) -> Any:
        seen.append(facts.id)
        return real(self, facts, *args)

    monkeypatch.setattr(live.LiveReader, "_whole", counting)
    return seen


def check(store: Store) -> None:
    """A cached read gives the figures of a read that prices every attempt from the store."""
    assert_same_figures(cost_summary(store, with_json=True), Expected(store))


def steps(job: int, attempt: int, start: float, first: int, n: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"ts": start + s, "kind": "step", "attempt": attempt, "step": first + s, "loss": 1.0, **extra} for s in range(n)
    ]


def test_a_running_job_is_read_once_then_brought_up_to_date(store: Store, whole: list[int]) -> None:
    check(store)
    assert sorted(whole) == [1, 2, 3]  # nothing kept yet
    whole.clear()
    check(store)
    assert whole == []  # nothing written since: the kept inputs, no query
    # Steps (one with phase totals), a checkpoint: folded in, not read again.
    phases = {k: [2.0, 2.0] for k in ("compute", "collective", "optimizer", "straggler_wait")} | {
        "data_wait": [9.0, 7.0]
    }
    store.add_runtime_events(1, [*steps(1, 1, 8100.0, 50, 5), *steps(1, 1, 8106.0, 56, 1, phase_totals_s=phases)], 9)
    # Steps written late (older times, newer ids) do not move the newest step back.
    store.add_runtime_events(1, steps(1, 1, 8050.0, 20, 3), 11)
    check(store)
    assert whole == []
    store.add_runtime_events(1, [{"ts": 8107.0, "kind": "checkpoint", "attempt": 1, "step": 56, "seconds": 2.5}], 10)
    check(store)
    assert whole == []


def test_a_new_attempt_or_a_resize_reads_the_job_again(store: Store, whole: list[int]) -> None:
    check(store)
    whole.clear()
    store.end_attempt(
        1, 1, ended_at=9000.0, exit_code=75, outcome="preempted", job_state="queued", reason=None, restarts=1
    )
    add_attempt(store, 1, 2, 9500.0, None)
    check(store)
    assert whole == [1]
    whole.clear()
    old = store.job(2).spec
    store.replace_spec(2, old, old.model_copy(update={"spot": True}), "resized")
    check(store)
    assert whole == [2]


def test_malformed_phase_totals_are_passed_over_as_a_read_from_scratch_does(store: Store, whole: list[int]) -> None:
    check(store)
    whole.clear()
    good = {k: [3.0, 3.0] for k in ("compute", "collective", "optimizer", "straggler_wait")} | {"data_wait": [8.0, 1.0]}
    bad = {k: [1.0] for k in ("data_wait", "compute", "collective", "optimizer", "straggler_wait")}  # 1 rank of 2
    store.add_runtime_events(1, steps(1, 1, 8200.0, 70, 1, phase_totals_s=good), 12)
    store.add_runtime_events(1, steps(1, 1, 8201.0, 71, 1, phase_totals_s=bad), 13)
    check(store)
    assert 1 not in whole


def test_damaged_kept_inputs_are_read_again(store: Store, home: Path, whole: list[int]) -> None:
    check(store)
    whole.clear()
    with sqlite3.connect(home / "cache" / "cost.db") as db:
        db.execute("UPDATE live SET body='{\"facts\": 3}' WHERE job_id=1")
    store.add_runtime_events(1, steps(1, 1, 8300.0, 80, 2), 14)
    check(store)
    assert whole == [1]


def test_a_job_that_ends_leaves_no_kept_inputs(store: Store, home: Path) -> None:
    check(store)
    store.end_attempt(
        1, 1, ended_at=9000.0, exit_code=0, outcome="completed", job_state="completed", reason=None, restarts=None
    )
    check(store)
    with sqlite3.connect(home / "cache" / "cost.db") as db:
        assert sorted(j for (j,) in db.execute("SELECT job_id FROM live")) == [2]


def test_a_late_attempt_start_reads_the_job_again(store: Store, whole: list[int]) -> None:
    """Its world size decides which phase totals are well formed: totals of 4 ranks, passed over while the attempt
    ran 2, become its newest well-formed ones when an earlier start says it ran 4."""
    check(store)
    four = {k: [1.0] * 4 for k in ("compute", "collective", "optimizer", "straggler_wait")} | {"data_wait": [5.0] * 4}
    store.add_runtime_events(1, steps(1, 1, 8400.0, 90, 1, phase_totals_s=four), 15)
    check(store)
    whole.clear()
    store.add_event(1, "attempt_start", attempt=1, ts=7999.0, gpus=4, world_size=4)
    check(store)
    assert whole == [1]


def test_a_job_that_ends_is_priced_from_its_kept_inputs_brought_up_to_date(store: Store, whole: list[int]) -> None:
    """Its last step (here written before steps that arrived late) decides its idle tail once it has ended."""
    check(store)
    whole.clear()
    store.add_runtime_events(1, steps(1, 1, 8500.0, 100, 3), 16)
    store.add_runtime_events(1, steps(1, 1, 8450.0, 95, 2), 17)
    store.end_attempt(
        1, 1, ended_at=8600.0, exit_code=0, outcome="completed", job_state="completed", reason=None, restarts=None
    )
    check(store)
    assert whole == []


def test_a_job_nothing_was_written_about_is_priced_from_what_its_last_pricing_read(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job 2 (its first attempt preempted, its second open): a read where nothing was written about it prices it
    from its kept reading alone (``kept``), at the read's time, with the figures of a read from scratch; an event,
    a change to an attempt or to its record reads it again (``events``)."""
    how: dict[int, list[str]] = {}
    real, real_kept = usage.attempt_readings, live.Priced.price

    def from_events(facts: Any, *args: Any, **kwargs: Any) -> Any:
        how.setdefault(facts.id, []).append("events")
        return real(facts, *args, **kwargs)

    def from_kept(self: live.Priced, *args: Any, **kwargs: Any) -> Any:
        how.setdefault(self.job_id, []).append("kept")
        return real_kept(self, *args, **kwargs)

    monkeypatch.setattr(live, "attempt_readings", from_events)
    monkeypatch.setattr(live.Priced, "price", from_kept)
    clock = [NOW]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    check(store)
    assert how == {1: ["events"], 2: ["events"], 3: ["events"]}  # nothing kept yet
    changes: list[tuple[bool, Any]] = [
        (False, lambda: None),  # nothing written: the kept reading, at a later time
        (True, lambda: store.add_runtime_events(2, steps(2, 2, 7600.0, 40, 3), 9)),  # steps of its open attempt
        (False, lambda: None),
        (True, lambda: store.add_event(2, "checkpoint", attempt=1, ts=7050.0, step=4, seconds=30.0)),  # a late one
        (True, lambda: store.update_attempt(2, 1, ended_at=7080.0)),  # attempt 1 changed in place (attempt_edits)
        (False, lambda: None),
        (True, lambda: store.set_reason(2, "waiting on a node")),  # its record written, nothing else
        (False, lambda: None),
    ]
    for written, change in changes:
        how.clear()
        clock[0] += 30.0  # later, as a user reads it again: the open attempt has grown
        change()
        check(store)
        assert how[2] == (["events"] if written else ["kept"])
        assert how[1] == ["kept"]  # nothing written about job 1 all along


@pytest.mark.parametrize("narrow", [{"team": "vision"}, {"job_ids": [2]}])
def test_a_read_for_one_team_or_job_does_not_hide_what_was_written_about_the_others(
    store: Store, whole: list[int], narrow: dict[str, Any]
) -> None:
    """``--team vision`` or ``--job 2`` prices only job 2, yet marks everything written so far as seen: job 1's
    kept inputs, left out, are read again whole by the next read instead of taken as current."""
    check(store)
    whole.clear()
    store.add_runtime_events(1, [{"ts": 8107.0, "kind": "checkpoint", "attempt": 1, "step": 56, "seconds": 30.0}], 10)
    cost_summary(store, with_json=True, **narrow)
    assert whole == []  # job 2: nothing written, its kept inputs; job 1 not in this report
    check(store)
    assert whole == [1]
    whole.clear()
    store.end_attempt(
        1, 1, ended_at=9000.0, exit_code=75, outcome="preempted", job_state="queued", reason=None, restarts=1
    )
    add_attempt(store, 1, 2, 9500.0, None)
    cost_summary(store, with_json=True, **narrow)
    check(store)
    assert whole == [1]
