"""A job's curves (``GET /api/jobs/{id}/series``): loss, tokens/s and MFU per logged step, and its progress."""

from __future__ import annotations

import time
from typing import Any

from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store

SERIES_POINTS = 2_000
"""Points of a job's curves at most: longer runs are thinned evenly (the last point is always kept)."""


def series_view(store: Store, job_id: int) -> dict[str, Any]:
    """A job's curves from its step events: loss, tokens/s, MFU, the unhealthy steps, rollbacks and
    checkpoints, and its progress (:class:`gpufleet.views.JobProgress`: the total, the rate now, the ETA)."""
    from gpufleet.jobs.store import latest_step
    from gpufleet.views import JobProgress

    steps = store.events(job_id, (EventKind.STEP,))
    if len(steps) > SERIES_POINTS:
        stride = len(steps) / SERIES_POINTS
        steps = [steps[int(i * stride)] for i in range(SERIES_POINTS - 1)] + [steps[-1]]
    points = [
        {
            "step": e.data.get("step"),
            "attempt": e.attempt,
            "ts": e.ts,
            "loss": e.data.get("loss"),
            "tokens_per_s": e.data.get("tokens_per_s"),
            "mfu": e.data.get("mfu"),
        }
        for e in steps
    ]
    unhealthy = [
        {"step": e.data.get("step"), "attempt": e.attempt, "why": e.data.get("why") or e.data.get("reason")}
        for e in store.events(job_id, (EventKind.UNHEALTHY,))
    ]
    rollbacks = [
        {"from_step": e.data.get("from_step"), "to_step": e.data.get("to_step"), "attempt": e.attempt}
        for e in store.events(job_id, (EventKind.ROLLBACK,))
    ]
    checkpoints = [
        {
            "step": e.data.get("step"),
            "attempt": e.attempt,
            "ts": e.ts,
            "reason": e.data.get("reason"),
            "seconds": e.data.get("seconds"),
        }
        for e in store.events(job_id, (EventKind.CHECKPOINT,))
    ]
    progress = JobProgress.read(store, store.job(job_id), latest_step(store, job_id), time.time())
    return {
        "id": job_id,
        "points": points,
        "unhealthy": unhealthy,
        "rollbacks": rollbacks,
        "checkpoints": checkpoints,
        "progress": progress.to_json(),
    }


__all__ = ["SERIES_POINTS", "series_view"]
