"""Model and hardware FLOPs utilization of a training run, from its throughput.

PaLM (Chowdhery et al. 2022, appendix B) defines MFU as the model FLOPs a run achieves per second over the peak
FLOP/s of the hardware it holds::

    MFU = tokens/s * (6N + 12·L·H·Q·T) / (peak FLOP/s per GPU * GPUs)

HFU uses the hardware FLOPs instead, which include activation recomputation (see :mod:`gpufleet.estimate.flops`).
MFU is the number to compare across runs and systems: recomputing more raises HFU without training any faster.
The runtime reports live MFU through :func:`mfu` so that the CLI and the logs agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.errors import ParameterError, UsageError
from gpufleet.estimate.flops import (
    MAX_COUNT,
    MAX_GPUS,
    MAX_TOKENS_PER_SECOND,
    Recompute,
    TransformerShape,
    flops_per_token,
    hardware_flops_per_token,
    require_at_most,
    require_positive,
)

MAX_STEP_TIME = 1e7
"""Most seconds per optimizer step (about 116 days) a throughput is computed from."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MfuEstimate:
    """Utilization of one run. FLOP/s figures are for all GPUs together."""

    flops_per_token: int
    """Model FLOPs per token, 6N + 12·L·H·Q·T."""
    hardware_flops_per_token: int
    """Model FLOPs plus recomputation."""
    tokens_per_second: float
    """Throughput of the whole run (all GPUs)."""
    achieved_flops: float
    """Model FLOP/s achieved by the run: tokens/s * flops_per_token."""
    peak_flops: float
    """Dense peak FLOP/s of the run's GPUs together: per-GPU peak * GPUs."""
    peak_flops_per_gpu: float
    num_gpus: int
    mfu: float
    """achieved_flops / peak_flops."""
    hfu: float
    """tokens/s * hardware_flops_per_token / peak_flops."""

    def as_dict(self) -> dict[str, float | int]:
        return {
            "flops_per_token": self.flops_per_token,
            "achieved_flops": self.achieved_flops,
            "peak_flops": self.peak_flops,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "hardware_flops_per_token": self.hardware_flops_per_token,
            "tokens_per_second": self.tokens_per_second,
            "peak_flops_per_gpu": self.peak_flops_per_gpu,
            "num_gpus": self.num_gpus,
        }


def tokens_per_second(*, step_time: float, tokens_per_step: float) -> float:
    """Throughput from a step time in seconds and the tokens one step consumes across all GPUs."""
    require_positive(step_time=step_time, tokens_per_step=tokens_per_step)
    require_at_most(MAX_STEP_TIME, "1e7 seconds", step_time=step_time)
    require_at_most(MAX_COUNT, "1e15 tokens", tokens_per_step=tokens_per_step)
    rate = tokens_per_step / step_time
    if not rate <= MAX_TOKENS_PER_SECOND:
        raise ParameterError(
            "{tokens_per_step} in {step_time} is more than 1e15 tokens per second: check both",
            tokens_per_step=tokens_per_step,
            step_time=step_time,
        )
    return rate


def utilization(tokens_per_second: float, flops_per_token: float, peak_flops: float) -> float:
    """Achieved FLOP/s over peak FLOP/s (PaLM, appendix B): the one formula behind MFU and HFU.

    The runtime calls it every time it logs a step, with the model's FLOPs per token.
    """
    return tokens_per_second * flops_per_token / peak_flops


def mfu(
    shape: TransformerShape,
    *,
    tokens_per_second: float,
    peak_flops_per_gpu: float,
    num_gpus: int,
    recompute: Recompute = "none",
) -> MfuEstimate:
    """MFU and HFU of a run of ``shape`` at ``tokens_per_second`` on ``num_gpus`` GPUs of ``peak_flops_per_gpu``.

    ``peak_flops_per_gpu`` is a dense figure in FLOP/s, e.g. ``gpu_peak("h100").peak_flops("bf16")``.
    """
    require_positive(tokens_per_second=tokens_per_second, num_gpus=num_gpus)
    require_at_most(MAX_TOKENS_PER_SECOND, "1e15 tokens per second", tokens_per_second=tokens_per_second)
    require_at_most(MAX_GPUS, "1e6 GPUs", num_gpus=num_gpus)
    if not 0 < peak_flops_per_gpu < float("inf"):
        raise UsageError(f"peak FLOP/s per GPU must be positive, got {peak_flops_per_gpu!r}")
    model = flops_per_token(shape)
    hardware = hardware_flops_per_token(shape, recompute)
    peak = peak_flops_per_gpu * num_gpus
    achieved = tokens_per_second * model
    return MfuEstimate(
        flops_per_token=model,
        hardware_flops_per_token=hardware,
        tokens_per_second=tokens_per_second,
        achieved_flops=achieved,
        peak_flops=peak,
        peak_flops_per_gpu=peak_flops_per_gpu,
        num_gpus=num_gpus,
        mfu=utilization(tokens_per_second, model, peak),
        hfu=utilization(tokens_per_second, hardware, peak),
    )


__all__ = ["MAX_STEP_TIME", "MfuEstimate", "mfu", "tokens_per_second", "utilization"]
