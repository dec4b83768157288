"""``checkpoint: {every: auto}``: the checkpoint interval a running session re-estimates from its own saves.

The interval is Daly's higher-order optimum (:func:`gpufleet.estimate.goodput.daly_interval`) for the
mean of this run's last :data:`SAVE_WINDOW` save stalls and the MTBF ``3600 / rate`` of the preemption
rate the session was given: ``$GPUFLEET_PREEMPTIONS_PER_HOUR`` (what a backend knows of the pool it runs
on), else ``checkpoint.preemptions_per_hour``. Before any save is measured, a restore at start stands
in for one (it reads what a save writes); with neither, the first save comes after the MTBF over
:data:`FIRST_SAVE_SHARE`, at most :data:`FALLBACK_SECONDS`. With no rate known the session saves every
:data:`FALLBACK_SECONDS`; with a rate of 0, every :data:`MAX_SECONDS`. The interval is at most
:data:`MAX_SECONDS` and, being a time checked at step boundaries, at least one step.

When to save never changes what is trained: a resumed run stays bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from gpufleet.estimate.interval import PreemptionRate
from gpufleet.fmt import compact_duration
from gpufleet.spec import CheckpointPolicy

ENV_PREEMPTIONS = "GPUFLEET_PREEMPTIONS_PER_HOUR"
"""Preemptions an hour of the pool an attempt runs on, exported by a backend that knows it."""
FALLBACK_SECONDS = 1800.0
"""The interval when no preemption rate is known (and the longest wait for a first save)."""
MAX_SECONDS = 6 * 3600.0
"""The longest interval, whatever the formula says: a crash that is not a preemption loses at most this."""
FIRST_SAVE_SHARE = 10.0
"""Before a save is measured, the first comes after the MTBF over this (Young's interval for a save of MTBF/200)."""
SAVE_WINDOW = 5
"""The interval uses the mean of this many latest save stalls."""
STEP_WINDOW = 50
"""The interval in steps uses the mean of this many latest step times."""
CHANGE_LOGGED = 0.1
"""A new estimate this much (relative) away from the last one logged is logged (``checkpoint_interval``)."""
MAX_RATE = 3600.0
"""Most preemptions an hour (one a second), as ``checkpoint.preemptions_per_hour``."""


def rate_from(env: Mapping[str, str], policy: CheckpointPolicy) -> PreemptionRate | None:
    """``$GPUFLEET_PREEMPTIONS_PER_HOUR``, else ``checkpoint.preemptions_per_hour``, else ``None``."""
    raw = env.get(ENV_PREEMPTIONS, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not 0 <= value <= MAX_RATE:
            raise ValueError(f"{ENV_PREEMPTIONS}={raw!r} must be a number of preemptions an hour, 0 to {MAX_RATE:g}")
        return PreemptionRate(value, f"${ENV_PREEMPTIONS}")
    if policy.preemptions_per_hour is not None:
        return PreemptionRate(policy.preemptions_per_hour, "checkpoint.preemptions_per_hour")
    return None


def _mean(values: deque[float]) -> float:
    return math.fsum(values) / len(values)


class AutoInterval:
    """The current ``every: auto`` interval, re-estimated as save (and step) times are measured."""

    def __init__(self, rate: PreemptionRate | None) -> None:
        self.rate = rate
        self._saves: deque[float] = deque(maxlen=SAVE_WINDOW)
        self._steps: deque[float] = deque(maxlen=STEP_WINDOW)
        self._restore: float | None = None
        self._logged: float | None = None
        self.seconds, self.why = self._estimate()

    @property
    def mtbf_seconds(self) -> float | None:
        if self.rate is None:
            return None
        return 3600.0 / self.rate.per_hour if self.rate.per_hour > 0 else math.inf

    @property
    def save_seconds(self) -> float | None:
        """The save time the interval is planned for (``None``: none measured yet)."""
        return _mean(self._saves) if self._saves else self._restore

    @property
    def steps(self) -> int | None:
        """The interval in whole steps (at least 1), once a step time is measured."""
        if not self._steps:
            return None
        step = _mean(self._steps)
        return max(1, round(self.seconds / step)) if step > 0 else None

    def due(self, since_save: float) -> bool:
        return since_save >= self.seconds

    def note_step(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds >= 0:
            self._steps.append(seconds)

    def note_save(self, seconds: float) -> bool:
        """A save stalled training ``seconds``; True when the new interval should be logged."""
        if math.isfinite(seconds) and seconds >= 0:
            self._saves.append(seconds)
        return self._update()

    def note_restore(self, seconds: float) -> bool:
        """A checkpoint was restored in ``seconds``: the save time until one is measured."""
        if math.isfinite(seconds) and seconds > 0 and not self._saves:
            self._restore = seconds
        return self._update()

    def event(self) -> dict[str, Any]:
        """The fields of a ``checkpoint_interval`` event; marks this estimate as logged."""
        self._logged = self.seconds
        mtbf = self.mtbf_seconds
        return {
            "seconds": self.seconds,
            "steps": self.steps,
            "save_seconds": self.save_seconds,
            "preemptions_per_hour": None if self.rate is None else self.rate.per_hour,
            "mtbf_seconds": mtbf if mtbf is not None and math.isfinite(mtbf) else None,
            "why": self.why,
        }

    def _update(self) -> bool:
        self.seconds, self.why = self._estimate()
        last = self._logged
        return last is None or abs(self.seconds - last) > CHANGE_LOGGED * last

    def _estimate(self) -> tuple[float, str]:
        from gpufleet.estimate.goodput import daly_interval  # numpy: loaded with the first session only

        rate, mtbf = self.rate, self.mtbf_seconds
        if rate is None or mtbf is None:
            return FALLBACK_SECONDS, (
                f"no preemption rate known: every {compact_duration(FALLBACK_SECONDS)} "
                f"(set checkpoint.preemptions_per_hour, or ${ENV_PREEMPTIONS})"
            )
        given = f"{rate.per_hour:g} preemptions/h ({rate.source})"
        if not math.isfinite(mtbf):
            return MAX_SECONDS, f"{given}: none expected, so the longest interval, {compact_duration(MAX_SECONDS)}"
        save = self.save_seconds
        if save is None or save <= 0:
            first = min(FALLBACK_SECONDS, mtbf / FIRST_SAVE_SHARE)
            most = compact_duration(FALLBACK_SECONDS)
            return first, f"{given}, no save measured yet: the first after MTBF/{FIRST_SAVE_SHARE:g}, at most {most}"
        what = (
            f"a mean save of {save:.3g} s over the last {len(self._saves)}"
            if self._saves
            else f"the restore's {save:.3g} s standing in for a save"
        )
        seconds = daly_interval(save, mtbf)
        capped = f", capped at {compact_duration(MAX_SECONDS)}" if seconds > MAX_SECONDS else ""
        return min(seconds, MAX_SECONDS), f"Daly's interval for {given} and {what}{capped}"


__all__ = [
    "CHANGE_LOGGED",
    "ENV_PREEMPTIONS",
    "FALLBACK_SECONDS",
    "FIRST_SAVE_SHARE",
    "MAX_RATE",
    "MAX_SECONDS",
    "SAVE_WINDOW",
    "STEP_WINDOW",
    "AutoInterval",
    "PreemptionRate",
    "rate_from",
]
