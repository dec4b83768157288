"""How often to checkpoint when failures arrive at random: Young (1974) and Daly (2006).

With a checkpoint that takes ``S`` seconds to save and failures arriving with a mean time between
failures ``M``, the interval that minimises expected lost time is, to first order,
``tau = sqrt(2 * S * M)``. On a spot market the "failures" are preemptions at ``lambda`` per hour, so
``M = 3600 / lambda`` seconds. Each preemption throws away, on average, half an interval of work plus
the restart and restore time ``R``: per hour of run that is ``f = lambda * (tau / 2 + R) / 3600`` hours,
so a job needing ``H`` hours of compute runs ``T = H / (1 - f)`` hours; when ``f >= 1`` it never ends.

Pure formulas, used by the runtime (``checkpoint.every: auto``), the planner and ``gpufleet advise``;
Daly's higher-order interval and wall time are in :mod:`gpufleet.estimate.goodput`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import UsageError

SECONDS_PER_HOUR = 3600.0


def young_daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """``sqrt(2 * save_seconds * mtbf_seconds)``: the checkpoint interval in seconds."""
    if not save_seconds > 0:
        raise UsageError(f"save_seconds must be > 0, got {save_seconds}: measure one checkpoint save")
    if not mtbf_seconds > 0:
        raise UsageError(f"mtbf_seconds must be > 0, got {mtbf_seconds}")
    return math.sqrt(2.0 * save_seconds * mtbf_seconds)


@dataclass(frozen=True, slots=True)
class CheckpointAdvice:
    """The Young/Daly interval for one save time and one preemption rate."""

    save_seconds: float
    preemptions_per_hour: float
    mtbf_seconds: float
    interval_seconds: float
    interval_steps: int | None
    """The interval in whole steps (at least 1), when the step time is known."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "save_seconds": self.save_seconds,
            "preemptions_per_hour": self.preemptions_per_hour,
            "mtbf_seconds": self.mtbf_seconds,
            "interval_seconds": self.interval_seconds,
            "interval_steps": self.interval_steps,
        }


def advise(
    save_seconds: float, preemptions_per_hour: float, step_seconds: float | None = None
) -> CheckpointAdvice | None:
    """The optimum interval for a node preempted ``preemptions_per_hour`` times an hour.

    ``None`` when the rate is 0 (nothing to protect against: checkpoint for other reasons).
    """
    if preemptions_per_hour < 0:
        raise UsageError(f"preemptions_per_hour must be >= 0, got {preemptions_per_hour}")
    if preemptions_per_hour == 0:
        return None
    if step_seconds is not None and not step_seconds > 0:
        raise UsageError(f"step_seconds must be > 0, got {step_seconds}")
    mtbf = SECONDS_PER_HOUR / preemptions_per_hour
    interval = young_daly_interval(save_seconds, mtbf)
    if not math.isfinite(interval) or (step_seconds is not None and not math.isfinite(interval / step_seconds)):
        raise UsageError(
            f"preemptions_per_hour={preemptions_per_hour:g} is too rare to plan an interval for: "
            "give 0 (no preemptions) or a rate of at least one in a million hours"
        )
    steps = None if step_seconds is None else max(1, round(interval / step_seconds))
    return CheckpointAdvice(save_seconds, preemptions_per_hour, mtbf, interval, steps)


def loss_fraction(preemptions_per_hour: float, interval_seconds: float, restore_seconds: float) -> float:
    """Hours lost per hour of run: ``lambda * (interval / 2 + restore) / 3600``."""
    return preemptions_per_hour * (interval_seconds / 2.0 + restore_seconds) / SECONDS_PER_HOUR


def expected_hours(compute_hours: float, loss: float) -> float:
    """Wall-clock hours to do ``compute_hours`` of work when ``loss`` of each hour is lost."""
    return compute_hours / (1.0 - loss) if loss < 1.0 else math.inf


@dataclass(frozen=True, slots=True)
class PreemptionRate:
    """Preemptions per hour to plan for, and where the figure came from."""

    per_hour: float
    source: str


def lost_share(
    interval_seconds: float, save_seconds: float, restart_seconds: float, preemptions_per_hour: float
) -> float:
    """Share of wall time that does not train: Daly's closed form (``goodput.daly_wall_time``) for one job.

    ``1 - τ / (M e^(R/M) (e^((τ+δ)/M) - 1))`` with ``M = 3600 / rate``: saves, lost work and restarts
    (restarts interrupted again included). With no preemptions, only the saves: ``δ / (τ + δ)``; a
    job that would never finish loses all of it (1.0).
    """
    from gpufleet.estimate.goodput import daly_wall_time  # numpy: loaded on first use

    if preemptions_per_hour <= 0:
        return save_seconds / (interval_seconds + save_seconds)
    mtbf = SECONDS_PER_HOUR / preemptions_per_hour
    try:
        wall = daly_wall_time(interval_seconds, interval_seconds, save_seconds, restart_seconds, mtbf)
    except OverflowError:
        return 1.0
    return min(1.0, max(0.0, 1.0 - interval_seconds / wall)) if math.isfinite(wall) else 1.0


__all__ = [
    "SECONDS_PER_HOUR",
    "CheckpointAdvice",
    "PreemptionRate",
    "advise",
    "expected_hours",
    "loss_fraction",
    "lost_share",
    "young_daly_interval",
]
