"""The fleet page's data (``GET /api/fleet``): what the page shows, read in rows bounded whatever the store holds.

A store used for months holds tens of thousands of jobs and millions of events, and the page asks for
this every few seconds. Building a full row (its spec, attempts, progress, GPUs held) for every job
made it grow with the store: seconds at 1,000 jobs, minutes at 100,000. So only the lists are read
in full, and each is bounded:

- the counts by state and by team: one ``GROUP BY`` that SQLite answers from the ``(team, state)``
  index (:meth:`Store.job_counts`), no spec parsed; ``jobs_total`` and ``queue_total`` come from them;
- the jobs listed in full (:class:`~gpufleet.views.FleetJobRow`): the running ones (the newest
  :data:`RUNNING_ROWS`), the queue's first :data:`QUEUE_ROWS` in the scheduler's order (the
  ``(state, priority)`` index) and the :data:`ENDED_ROWS` jobs that ended last (the ``updated_at``
  index); the page says how many more each state holds;
- the GPUs in use: every running job's, not only the listed ones', from one query that finds each
  latest attempt's own start event by the ``(job_id, ts)`` index (:func:`held_gpus`);
- the recent preemptions, rollbacks and failovers: those of the :data:`RECENT_JOBS` jobs updated last
  (:func:`recent_events`). A job's row changes whenever one of its attempts starts or ends, which is
  when these events happen, so the newest ones are among them; a rollback inside the attempt of a
  job that has not been updated since :data:`RECENT_JOBS` others were is not listed.

Read afresh from the store at each call, as every route reads it; :class:`gpufleet.serve.cache.ViewCache`
bounds how often the server builds it (``gpufleet serve --cache``: the staleness it allows).
"""

from __future__ import annotations

import copy
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gpufleet.jobs.events import EventKind
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import TERMINAL, Event, Job, Store, gpu_count
from gpufleet.paths import has_store, state_db

RECENT_KINDS = (
    EventKind.PREEMPTED_BY,
    EventKind.SIGTERM,
    EventKind.ROLLBACK,
    EventKind.FAILOVER,
    EventKind.SPOT_PREEMPTED,
    EventKind.FLEET_DOWN,
    EventKind.RECLAIMED_BY,
    EventKind.REQUEUED,
)
"""What the fleet page lists as recent: preemptions, rollbacks, failovers."""

RUNNING_ROWS = 50
"""Running jobs listed in full, the newest first (``gpufleet jobs --state running`` lists them all)."""
QUEUE_ROWS = 25
"""Queued jobs listed (in ``queue`` and in ``jobs``), the first the scheduler serves."""
ENDED_ROWS = 25
"""Ended jobs (completed, failed, cancelled) listed, the last to end."""
RECENT_EVENTS = 50
"""Recent events served, newest first."""
RECENT_JOBS = 100
"""The jobs updated last whose events are read for the recent ones."""


def fleet_view(home: Path, store: Store | None = None) -> dict[str, Any]:
    """The fleet page's data: counts by state and team, the listed jobs, the queue and why each job waits, the
    pools and the GPUs in use, recent events. ``store``: the home's, open (the server keeps one per thread);
    ``None``: opened here for the call, where the home has one."""
    from gpufleet.views import Capacity, FleetStatus

    now = time.time()
    fleet = FleetStatus.read(home)
    if store is not None:
        found, held = _from_store(store, now)
    elif has_store(home):
        own = Store(state_db(home))
        try:
            found, held = _from_store(own, now)
        finally:
            own.close()
    else:
        found, held = copy.deepcopy(NO_JOBS), {}
    capacity = Capacity.read(home, fleet, list(held.values()))
    return {**found, "fleet": fleet.to_json(), "capacity": capacity.to_json(), "generated_at": now}


NO_JOBS: dict[str, Any] = {
    "jobs": [],
    "jobs_total": 0,
    "states": {},
    "teams": {},
    "queue": [],
    "queue_total": 0,
    "recent": [],
}
"""The page's store part where the home has no store yet (a read never creates one)."""


def _from_store(store: Store, now: float) -> tuple[dict[str, Any], dict[int, tuple[str, int]]]:
    """The page's store part, and each running job's backend and GPUs held."""
    from gpufleet.views import FleetJobRow, QueueRow

    states, teams = job_counts(store)
    held = held_gpus(store)
    listed = listed_jobs(store)
    rows = [FleetJobRow.read(store, j, now, held=held.get(j.id, (j.backend, 0))[1]) for j in listed]
    queued = sorted((j for j in listed if j.state == JobState.QUEUED), key=lambda j: (-j.priority, j.id))
    found = {
        "jobs": [r.to_json() for r in rows],
        "jobs_total": sum(states.values()),
        "states": dict(states),
        "teams": {t: dict(c) for t, c in sorted(teams.items())},
        "queue": [
            QueueRow(id=j.id, name=j.name, team=j.team, priority=j.priority, reason=j.reason).to_json() for j in queued
        ],
        "queue_total": states.get(JobState.QUEUED, 0),
        "recent": recent_events(store, RECENT_EVENTS, RECENT_JOBS),
    }
    return found, held


_STATES = frozenset(JobState)


def job_counts(store: Store) -> tuple[Counter[str], dict[str, Counter[str]]]:
    """Jobs per state, and per team per state, of every job: SQLite counts (:meth:`Store.job_counts`). A state
    that is none (a hand edit) counts as ``failed``, as such a job reads."""
    states: Counter[str] = Counter()
    teams: dict[str, Counter[str]] = {}
    for team, stored, n in store.job_counts():
        state = stored if stored in _STATES else JobState.FAILED
        states[state] += n
        teams.setdefault(team, Counter())[state] += n
    return states, teams


def listed_jobs(store: Store) -> list[Job]:
    """The jobs the page lists in full, by id: the newest :data:`RUNNING_ROWS` running, the first
    :data:`QUEUE_ROWS` queued and the last :data:`ENDED_ROWS` to end (a job counted once)."""
    running, _ = store.job_page(states=(JobState.RUNNING,), limit=RUNNING_ROWS)
    ended = store.jobs_by_id([job_id for job_id, *_ in store.latest_updated(ENDED_ROWS, states=TERMINAL)])
    found = {j.id: j for j in (*running, *store.queue_head(QUEUE_ROWS), *ended)}
    return [found[i] for i in sorted(found)]


RECORDED_GPUS: dict[tuple[str, int, int, Any], int] = {}
"""GPUs each attempt's backend recorded when it started it, by (database, job, attempt, start): a fact that
never changes once written, so the page reads it once per attempt, not at every poll (a fleet with 1,000
running jobs: 1,000 seeks into the events). Only a figure found is kept (one not yet written is looked for
again); emptied when it holds :data:`MAX_RECORDED`."""
MAX_RECORDED = 100_000


def held_gpus(store: Store) -> dict[int, tuple[str, int]]:
    """Each running job's backend and the GPUs (over all nodes) its latest attempt holds, by job id.

    The figure its backend recorded in the attempt's ``attempt_start`` event (:data:`RECORDED_GPUS`, else
    :meth:`Store.attempt_start_data`); a job without one gets the whole rule of
    :func:`gpufleet.jobs.store.attempt_gpus` (its resizes, its spec), which reads all its events.
    """
    from gpufleet.errors import NotFound
    from gpufleet.views import running_gpus

    held: dict[int, tuple[str, int]] = {}
    for job_id, backend, n, started_at in store.running_latest_attempts():
        key = (str(store.path), job_id, n, started_at)
        gpus = RECORDED_GPUS.get(key)
        if gpus is None:
            gpus = _recorded_gpus(store.attempt_start_data(job_id, n, started_at))
            if gpus is not None:
                if len(RECORDED_GPUS) >= MAX_RECORDED:
                    RECORDED_GPUS.clear()
                RECORDED_GPUS[key] = gpus
        if gpus is None:
            try:
                gpus = running_gpus(store, store.job(job_id))
            except NotFound:
                continue  # removed meanwhile
        held[job_id] = (backend, gpus)
    return held


def _recorded_gpus(data: str | None) -> int | None:
    """The ``gpus`` a stored ``attempt_start`` event records, ``None`` where it records no valid count."""
    try:
        parsed = json.loads(data) if data is not None else None
    except (ValueError, RecursionError):
        return None
    return gpu_count(parsed.get("gpus")) if isinstance(parsed, dict) else None


def recent_events(store: Store, limit: int = RECENT_EVENTS, jobs: int = RECENT_JOBS) -> list[dict[str, Any]]:
    """The newest ``limit`` preemptions, rollbacks and failovers of the ``jobs`` jobs updated last, newest first.

    A job's events are read newest first (the ``(job_id, ts)`` index) and no further than the ``limit``-th
    newest found so far; a job that is not running, and was last updated before that, is not read (its
    events happened by then). An event's own ``job`` field names the job that took the GPUs (``preempted_by``,
    ``reclaimed_by``): it is served as ``by`` (and ``by_name``), never over ``job``, the job the event happened to.
    """
    found: list[tuple[Event, str]] = []
    for job_id, name, state, updated in store.latest_updated(jobs):
        floor = found[limit - 1][0].ts if len(found) >= limit else None
        if floor is not None and state != JobState.RUNNING and _older(updated, floor):
            continue
        for n, e in enumerate(store.newest_events(job_id, RECENT_KINDS)):
            if n == limit or (floor is not None and e.ts < floor):
                break
            found.append((e, name))
        found.sort(key=lambda f: (f[0].ts, f[0].job_id), reverse=True)
        del found[limit:]
    takers = {e.data["job"] for e, _ in found if isinstance(e.data.get("job"), int)}
    names = store.job_names(sorted(takers))
    return [_served(e, name, names) for e, name in found]


def _older(updated: Any, floor: float) -> bool:
    """Whether a stored ``updated_at`` is a time before ``floor`` (a value that is no time is not)."""
    return isinstance(updated, int | float) and not isinstance(updated, bool) and updated < floor


def _served(e: Event, name: str, names: dict[int, str]) -> dict[str, Any]:
    """One recent event as the page reads it: its data, ``by`` and ``by_name`` for the job that took the GPUs."""
    data = dict(e.data)
    by = data.pop("job", None)
    taker = {"by": by, "by_name": names.get(by)} if isinstance(by, int) else {}
    return {**data, **taker, "job": e.job_id, "name": name, "ts": e.ts, "kind": e.kind}


__all__ = [
    "ENDED_ROWS",
    "QUEUE_ROWS",
    "RECENT_EVENTS",
    "RECENT_JOBS",
    "RECENT_KINDS",
    "RECORDED_GPUS",
    "RUNNING_ROWS",
    "fleet_view",
    "held_gpus",
    "job_counts",
    "listed_jobs",
    "recent_events",
]
