"""From what the store recorded (attempts and events) to ``AttemptUsage`` values for the ledger."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from gpufleet.cost.ledger import AttemptUsage
from gpufleet.store import Attempt, Event, Job, Store


def _num(data: dict[str, Any], key: str, default: float = 0.0) -> float:
    value = data.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def attempt_usage(job: Job, attempt: Attempt, events: Sequence[Event], now: float) -> AttemptUsage:
    """Split one attempt's wall time into the ledger's buckets, from its runtime events."""
    start = attempt.started_at
    end = attempt.ended_at if attempt.ended_at is not None else now
    outcome = attempt.outcome or "running"
    mine = [e for e in events if e.attempt == attempt.n and e.source == "runtime"]
    restore = next((e for e in mine if e.kind == "restore" and e.data.get("cause") != "rollback"), None)
    train_start = next((e for e in mine if e.kind == "train_start"), None)
    checkpoints = [e for e in mine if e.kind == "checkpoint"]
    rollbacks = [e for e in mine if e.kind == "rollback"]
    restore_s = (_num(restore.data, "seconds") if restore else 0.0) + sum(
        _num(e.data, "restore_seconds") for e in rollbacks
    )
    if train_start is None:
        startup_s = end - start  # never reached the first step: all of it was start-up
        first_step = None
    else:
        startup_s = max(0.0, train_start.ts - start - (_num(restore.data, "seconds") if restore else 0.0))
        first_step = int(_num(train_start.data, "step"))
    checkpoint_s = sum(_num(e.data, "seconds") for e in checkpoints)
    lost_s = sum(_num(e.data, "redone_seconds") for e in rollbacks)
    steps = [int(_num(e.data, "step")) for e in mine if e.kind in ("step", "checkpoint", "session_end")]
    last_step = max(steps) if steps else first_step
    steps_done, steps_redone, segment_start = 0, 0, first_step or 0
    for e in rollbacks:
        from_step, to_step = int(_num(e.data, "from_step")), int(_num(e.data, "to_step"))
        steps_done += from_step - segment_start
        steps_redone += from_step - to_step
        segment_start = to_step
    if last_step is not None:
        steps_done += max(0, last_step - segment_start)
    if outcome not in ("completed", "running") and train_start is not None:
        durable = max([e.ts for e in checkpoints], default=train_start.ts)
        # A session that ended on purpose after its last checkpoint trained nothing after it:
        # from there to the process exit is shut-down, not lost work.
        ended = [e.ts for e in mine if e.kind == "session_end" and e.ts >= durable]
        stop = ended[0] if ended else end
        lost_s += max(0.0, stop - durable)
        startup_s += max(0.0, end - stop)
        durable_step = int(_num(checkpoints[-1].data, "step")) if checkpoints else segment_start
        steps_redone += max(0, (last_step or 0) - durable_step)
    spec = job.spec
    return AttemptUsage(
        job_id=job.id,
        job_name=job.name,
        team=job.team,
        attempt=attempt.n,
        gpu_type=spec.resources.gpu_type,
        provider=spec.provider,
        spot=spec.spot,
        gpus=spec.resources.gpus,
        start=start,
        end=end,
        outcome=outcome,
        startup_s=startup_s,
        restore_s=restore_s,
        checkpoint_s=checkpoint_s,
        lost_s=lost_s,
        steps_done=steps_done,
        steps_redone=steps_redone,
        first_step=first_step,
        last_step=last_step,
        checkpoints=tuple(e.ts for e in checkpoints),
        rollbacks=tuple(e.ts for e in rollbacks),
    )


def job_usages(store: Store, job: Job, now: float | None = None) -> list[AttemptUsage]:
    now = time.time() if now is None else now
    events = store.events(job.id)
    return [attempt_usage(job, a, events, now) for a in store.attempts(job.id)]


def store_usages(store: Store, team: str | None = None, job_ids: Sequence[int] | None = None) -> list[AttemptUsage]:
    now = time.time()
    out: list[AttemptUsage] = []
    for job in store.jobs(team=team):
        if job_ids is None or job.id in job_ids:
            out.extend(job_usages(store, job, now))
    return out
