"""The objective's values that a sweep's trials logged, each job's events read once.

The driver follows every running trial at every pass (every ``poll_s``). Reading all of a job's metric events
each time costs one JSON parse per event per pass (30 ms a pass for a job of 5,000 steps, and growing with
every step), taken from the cores the trials train on. :class:`MetricReader` keeps, per job, the id of the last
event it read and reads only the rows stored after it (ids only grow); what it hands out is what reading
everything and keeping the values past the last step reported would give:

- the new values, in the order of their time (``ts``, then id), as :func:`metric_values` sorts them all;
- the job's last value: that of its latest event by (``ts``, id), as the last of :func:`metric_values`.

The rows come from :meth:`Store.events_after` (``state.db`` is in WAL mode: a reader sees every committed
write and blocks none; a damaged file is the store's ``StoreError``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store

METRIC_KINDS = (EventKind.EVAL, EventKind.METRICS, EventKind.STEP)
"""The events a trial's objective is read from."""


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def point(data: dict[str, Any], metric: str) -> tuple[int, float] | None:
    """``(step, value)`` of an event's data that logged a finite ``metric`` at a step ``>= 0``."""
    value, step = finite(data.get(metric)), data.get("step")
    if value is not None and isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        return step, value
    return None


def metric_values(store: Store, job_id: int, metric: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every finite value of ``metric`` the job logged, in the order it logged them."""
    out = []
    for e in sorted(store.events(job_id, kinds=METRIC_KINDS), key=lambda e: e.ts):
        found = point(e.data, metric)
        if found is not None:
            out.append(found)
    return out


@dataclass
class _Job:
    after: int = 0
    """The id of the last event read."""
    last: tuple[float, int, float] | None = None
    """``(ts, id, value)`` of the latest value by time."""


class MetricReader:
    """Each job's values of ``metric``, read a job's new events at a time; see the module docstring."""

    def __init__(self, store: Store, metric: str) -> None:
        self.store = store
        self.metric = metric
        self._jobs: dict[int, _Job] = {}

    def new(self, job_id: int) -> list[tuple[int, float]]:
        """``(step, value)`` of the values the job logged since the last call for it, in time order."""
        job = self._jobs.setdefault(job_id, _Job())
        out = []
        for row_id, event in self.store.events_after(job_id, job.after, METRIC_KINDS):
            job.after = max(job.after, row_id)
            found = point(event.data, self.metric) if event is not None else None
            if event is None or found is None:
                continue
            out.append(found)
            if job.last is None or (event.ts, row_id) > job.last[:2]:
                job.last = (event.ts, row_id, found[1])
        return out

    def last(self, job_id: int) -> float | None:
        """The job's latest value by time among those read, ``None`` when it logged none."""
        job = self._jobs.get(job_id)
        return job.last[2] if job is not None and job.last is not None else None

    def forget(self, job_id: int) -> None:
        """Drop what is kept of a job whose trial has ended."""
        self._jobs.pop(job_id, None)


__all__ = ["METRIC_KINDS", "MetricReader", "finite", "metric_values", "point"]
