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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Any

from gpufleet.spec import HealthPolicy

if TYPE_CHECKING:
    from torch import Tensor

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

    def judge_step(self, losses: Sequence[float]) -> tuple[Verdict, int | None]:
        """Judge a step's micro-batch losses: the first non-finite one, else a spike of their mean.

        Returns the verdict and, for a step of several micro-batches, the index of the offending
        one (the first NaN/inf, or the largest loss of a spiking step).
        """
        for index, value in enumerate(losses):
            if not math.isfinite(value):
                verdict = self.judge(value)
                return verdict, (index if len(losses) > 1 else None)
        verdict = self.judge(step_loss(losses))
        if verdict.healthy or len(losses) == 1:
            return verdict, None
        return verdict, max(range(len(losses)), key=losses.__getitem__)

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


def step_loss(losses: Sequence[float]) -> float:
    """The loss of a step of micro-batches: their mean (what gradient accumulation optimises)."""
    return math.fsum(losses) / len(losses)


def first_nonfinite(named: Iterable[tuple[str, Any]]) -> str | None:
    """Name of the first floating tensor holding a NaN or inf, or ``None``: one device sync in all.

    Each tensor is summed in float64 (a NaN or inf anywhere makes its sum non-finite; finite
    values cannot overflow a float64 sum) and the sums are stacked, so the common all-finite case
    costs one pass over the state and a single host transfer; only a failure pays for locating
    the tensor.
    """
    import torch

    tensors = [(name, t) for name, t in named if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    if not tensors:
        return None
    by_device: dict[Any, list[int]] = {}
    for index, (_, t) in enumerate(tensors):
        by_device.setdefault(t.device, []).append(index)
    order: list[int] = []
    parts = []
    for indices in by_device.values():
        order.extend(indices)
        parts.append(torch.stack([tensors[i][1].detach().sum(dtype=torch.float64) for i in indices]).cpu())
    finite = torch.isfinite(torch.cat(parts))
    if bool(finite.all()):
        return None
    return tensors[order[int((~finite).nonzero()[0, 0])]][0]


def loss_values(loss: float | Tensor | Sequence[float | Tensor]) -> list[float]:
    """The step's loss as floats: one value, or one per micro-batch (a single host transfer)."""
    import torch

    if isinstance(loss, torch.Tensor):
        flat = loss.detach().reshape(-1)
        if flat.numel() == 0:
            raise ValueError("report() got an empty loss tensor: pass the step's loss")
        return [float(v) for v in flat.double().cpu().tolist()]
    if isinstance(loss, (int, float)):
        return [float(loss)]
    items = list(loss)
    if not items:
        raise ValueError("report() got an empty list of micro-batch losses")
    tensors = [v.detach().reshape(()) for v in items if isinstance(v, torch.Tensor)]
    if len(tensors) == len(items):
        return [float(v) for v in torch.stack([t.double() for t in tensors]).cpu().tolist()]
    return [float(v.detach().item()) if isinstance(v, torch.Tensor) else float(v) for v in items]


__all__ = ["MAD_TO_SIGMA", "HealthMonitor", "Verdict", "first_nonfinite", "loss_values", "robust_zscore", "step_loss"]
