"""The fleet page's data (``GET /api/fleet``): every job's row, counts by state and team, the queue, recent events.

Read afresh from the store at each call, as every route reads it; :class:`gpufleet.serve.cache.ViewCache`
bounds how often the server builds it.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from gpufleet.jobs.events import EventKind
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import Store
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


def fleet_view(home: Path) -> dict[str, Any]:
    """The fleet page's data: counts by state and team, the queue and why each job waits, the pools, recent events."""
    from gpufleet.views import Capacity, FleetJobRow, FleetStatus

    store = Store(state_db(home)) if has_store(home) else None
    now = time.time()
    rows = [] if store is None else [FleetJobRow.read(store, j, now) for j in store.jobs()]
    jobs = [r.to_json() for r in rows]
    by_state = Counter(j["state"] for j in jobs)
    by_team: dict[str, Counter[str]] = {}
    for j in jobs:
        by_team.setdefault(j["team"], Counter())[j["state"]] += 1
    queue = [
        {"id": j["id"], "name": j["name"], "team": j["team"], "priority": j["priority"], "reason": j["reason"]}
        for j in sorted(jobs, key=lambda j: (-j["priority"], j["submitted_at"]))
        if j["state"] == JobState.QUEUED
    ]
    recent = [] if store is None else recent_events(store, {j["id"]: j["name"] for j in jobs})
    fleet = FleetStatus.read(home)
    return {
        "jobs": jobs,
        "states": dict(by_state),
        "teams": {t: dict(c) for t, c in sorted(by_team.items())},
        "queue": queue,
        "recent": recent[:50],
        "fleet": fleet.to_json(),
        "capacity": Capacity.read(home, fleet, rows).to_json(),
        "generated_at": now,
    }


def recent_events(store: Store, names: dict[int, str]) -> list[dict[str, Any]]:
    """The jobs' preemptions, rollbacks and failovers, newest first. An event's own ``job`` field names the
    job that took the GPUs (``preempted_by``, ``reclaimed_by``): it is served as ``by`` (and ``by_name``),
    never over ``job``, the job the event happened to."""
    recent = []
    for job_id, name in names.items():
        for e in store.events(job_id, RECENT_KINDS):
            data = dict(e.data)
            by = data.pop("job", None)
            taker = {"by": by, "by_name": names.get(by)} if isinstance(by, int) else {}
            recent.append({**data, **taker, "job": job_id, "name": name, "ts": e.ts, "kind": e.kind})
    recent.sort(key=lambda e: e["ts"], reverse=True)
    return recent


__all__ = ["RECENT_KINDS", "fleet_view", "recent_events"]
