"""Is this step healthy? NaN/inf losses and loss spikes.

A spike is a loss whose robust z-score against the recent healthy losses exceeds a threshold:
``z = (loss - median) / (1.4826 * MAD)``, the median absolute deviation scaled to estimate a
normal standard deviation (Rousseeuw & Croux 1993), so a single earlier outlier cannot hide the
next one as a mean and standard deviation would. PaLM (Chowdhery et al. 2022, section 5.1) met
spikes that recurred with the same data batches and removed them by restarting from a
checkpoint about 100 steps earlier and skipping 200-500 batches; the session does the same.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import median

from gpufleet.spec import HealthPolicy

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True, slots=True)
class Verdict:
    healthy: bool
    reason: str | None = None
    """``nan``, ``inf`` or ``spike`` when unhealthy."""
    zscore: float | None = None


class HealthMonitor:
    """Judges each loss against a window of recent healthy ones."""

    def __init__(self, policy: HealthPolicy, history: list[float] | None = None) -> None:
        self.policy = policy
        self.history: deque[float] = deque(history or (), maxlen=policy.window)

    def judge(self, loss: float) -> Verdict:
        if math.isnan(loss):
            return Verdict(False, "nan")
        if math.isinf(loss):
            return Verdict(False, "inf")
        threshold = self.policy.spike_zscore
        if threshold is None or len(self.history) < self.policy.min_history:
            return Verdict(True)
        z = robust_zscore(loss, list(self.history))
        if z > threshold:
            return Verdict(False, "spike", z)
        return Verdict(True, zscore=z)

    def accept(self, loss: float) -> None:
        """Add a healthy loss to the window."""
        self.history.append(loss)


def robust_zscore(value: float, window: list[float]) -> float:
    """Robust z-score of ``value`` against ``window``; upward deviations only matter here."""
    center = median(window)
    mad = median(abs(x - center) for x in window)
    scale = MAD_TO_SIGMA * mad
    if scale == 0.0:
        scale = max(abs(center) * 1e-6, 1e-12)
    return (value - center) / scale
