"""The driver's passes: each job's metric events read once, the study read only after the driver wrote to it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages._rdb import storage as rdb

from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store
from gpufleet.spec import JobSpec, parse_spec
from gpufleet.sweeps.driver import JOB_ID, Progress, SweepDriver
from gpufleet.sweeps.spec import SweepSpec
from gpufleet.sweeps.values import MetricReader, metric_values

BASE: dict[str, Any] = {"name": "lm", "entrypoint": "m:train", "resources": {"gpus": 0, "cpus": 1}}
SWEEP: dict[str, Any] = {
    "name": "s",
    "base": BASE,
    "space": {"lr": {"grid": [0.001, 0.002]}},
    "objective": {"metric": "val_loss"},
    "budget": {"trials": 2},
    "parallelism": 2,
    "sampler": {"kind": "grid"},
}


def reported(values: list[tuple[int, float]], seen: int) -> list[tuple[int, float]]:
    """What the driver reports of ``values``: each one past the last step reported."""
    out = []
    for step, value in values:
        if step > seen:
            out.append((step, value))
            seen = step
    return out


def test_the_reader_gives_what_reading_every_event_each_pass_gives(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    job = store.add_job(parse_spec(BASE), "local")
    other = store.add_job(parse_spec(BASE), "local")
    reader = MetricReader(store, "val_loss")
    passes: list[list[tuple[float, str, dict[str, Any]]]] = [
        [(10.0, EventKind.STEP, {"step": 1, "loss": 2.0}), (11.0, EventKind.EVAL, {"step": 2, "val_loss": 3.0})],
        [],
        [  # a value, one that is not finite, one without a step, and one stored late with an earlier time
            (12.0, EventKind.METRICS, {"step": 4, "val_loss": 2.5}),
            (12.5, EventKind.EVAL, {"step": 5, "val_loss": float("nan")}),
            (12.6, EventKind.EVAL, {"val_loss": 1.0}),
            (10.5, EventKind.EVAL, {"step": 3, "val_loss": 2.8}),
            (12.7, EventKind.SESSION_END, {"step": 6, "val_loss": 0.1}),  # not a metric event
        ],
        [(13.0, EventKind.EVAL, {"step": 4, "val_loss": 2.4}), (14.0, EventKind.EVAL, {"step": 6, "val_loss": 2.2})],
    ]
    seen_by_reader = seen_by_whole = -1
    for events in passes:
        for ts, kind, data in events:
            store.add_event(job, kind, attempt=1, ts=ts, **data)
            store.add_event(other, kind, attempt=1, ts=ts, **{**data, "val_loss": 9.0})
        fresh = reported(reader.new(job), seen_by_reader)
        whole = reported(metric_values(store, job, "val_loss"), seen_by_whole)
        assert fresh == whole
        seen_by_reader = max([seen_by_reader, *(s for s, _ in fresh)])
        seen_by_whole = max([seen_by_whole, *(s for s, _ in whole)])
        assert reader.last(job) == metric_values(store, job, "val_loss")[-1][1]
    assert reader.new(job) == []  # nothing stored since: nothing read again
    assert reader.last(other) is None  # never asked for
    reader.forget(job)
    assert reader.last(job) is None


class ScriptedBackend:
    """Stands in for the sweep's backend: a submitted job is stored queued, and the test moves it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def sync(self) -> None:
        return None

    def submit(self, spec: JobSpec) -> int:
        return self.store.add_job(spec, "local")

    def cancel(self, job_id: int) -> None:
        self.store.set_job_state(job_id, "cancelled")


@contextlib.contextmanager
def counted(monkeypatch: pytest.MonkeyPatch, counts: list[int]) -> Iterator[None]:
    """Count the study's storage sessions (every read or write of the study opens one)."""
    opened = rdb._create_scoped_session

    @contextlib.contextmanager
    def session(*args: Any, **kwargs: Any) -> Iterator[Any]:
        counts[-1] += 1
        with opened(*args, **kwargs) as s:
            yield s

    monkeypatch.setattr(rdb, "_create_scoped_session", session)
    yield


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_a_pass_that_finds_nothing_new_reads_nothing_from_the_study(
    home: Path, monkeypatch: pytest.MonkeyPatch, direction: str
) -> None:
    sweep = SweepSpec.model_validate({**SWEEP, "objective": {"metric": "val_loss", "direction": direction}})
    driver = SweepDriver(home, sweep, parse_spec(BASE), poll_s=0.0)
    store = driver.store
    driver.backend = ScriptedBackend(store)  # type: ignore[assignment]
    sessions: list[int] = [0]  # sessions[n - 1]: the study's sessions in tick n, up to its on_tick
    ticks: list[Progress] = []
    scripts: dict[int, list[tuple[int, dict[str, Any]]]] = {  # on tick n: (job's index, eval event) to add
        3: [(0, {"step": 5, "val_loss": 3.0}), (1, {"step": 5, "val_loss": 2.0})],
        5: [(0, {"step": 10, "val_loss": 2.5}), (1, {"step": 10, "val_loss": 1.5})],
    }

    def tick(d: SweepDriver, p: Progress) -> None:
        ticks.append(p)
        jobs = sorted(j.id for j in store.jobs())
        for index, data in scripts.get(len(ticks), []):
            store.set_job_state(jobs[index], "running")
            store.add_event(jobs[index], EventKind.EVAL, attempt=1, **data)
        if len(ticks) == 5:
            for job in jobs:
                store.set_job_state(job, "completed")
        sessions.append(0)

    driver.on_tick = tick
    with counted(monkeypatch, sessions):
        progress = driver.run()
    assert len(ticks) == 6 and progress.finished == 2 and progress.stop == "2 trials finished or pruned"
    assert sessions[1] > 0 and sessions[2] == 0  # after a launch: read once; then idle: nothing
    assert sessions[3] > 0 and sessions[4] == 0  # new values: reported and read back; then idle: nothing
    assert sessions[5] > 0  # the jobs ended: their trials told
    trials = driver.trials()
    by_job = {int(t.user_attrs[JOB_ID]): t for t in trials}
    first, second = (by_job[j] for j in sorted(by_job))
    assert (first.intermediate_values, first.value) == ({5: 3.0, 10: 2.5}, 2.5)
    assert (second.intermediate_values, second.value) == ({5: 2.0, 10: 1.5}, 1.5)
    assert progress.best == (2.5 if direction == "maximize" else 1.5) == driver.study.best_value
    assert driver.progress().best == progress.best
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
