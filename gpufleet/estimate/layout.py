"""Which parallel layouts of a model fit on a GPU, least communication first.

The advisor enumerates data-parallel strategies (with their CPU-offload variants) times tensor degrees t (divisors
of the GPU count, at most one node's GPUs, because tensor parallelism all-reduces activations in every layer and
needs NVLink) times pipeline degrees p (divisors of what is left), estimates each with
:func:`gpufleet.estimate.memory.estimate_memory`, and keeps those whose per-GPU total fits in the usable memory::

    usable = datasheet memory * (1 - headroom) - reserve        (defaults: 10% and 1 GiB)

The headroom covers the allocator's fragmentation and the buffers the formulas leave out (communication buckets,
temporary tensors); the reserve covers the CUDA context and the kernels it loads.

Order, cheapest communication first: no offload before offload (PCIe is slower than any collective here), then
smaller t (a collective per layer), then smaller p (bubbles and point-to-point sends), then the strategy: ddp
(one all-reduce of the gradients, 2Ψ per step) < zero1 (same volume) < zero2 (same volume, reduce-scatter) <
fsdp_hybrid (zero3 inside a node) < zero3 / fsdp_full (1.5x: the weights are gathered again for the backward pass),
as in the ZeRO paper's section 7.

Given a :class:`~gpufleet.estimate.network.Placement`, each layout also gets the time of one step's gradient
communication: an all-reduce of the gradients of one model shard, ``grad bytes per parameter * Ψ / (t·p)`` (experts
divided by e too), over one data-parallel group (:func:`~gpufleet.estimate.network.data_parallel_group`), the faster
of NCCL's ring and tree (:func:`~gpufleet.estimate.network.allreduce`), times the strategy's volume: 1 for ddp,
zero1 and zero2 (reduce-scatter + all-gather move what an all-reduce moves), 1.5 for zero3 / fsdp_full, and for
fsdp_hybrid the ddp time plus half an all-reduce inside the node (the extra gather stays on NVLink). Without overlap
with the backward pass this is what a step waits; PCIe traffic of offloading is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpufleet.errors import ParameterError, UsageError
from gpufleet.estimate.flops import MAX_COUNT, MAX_GPUS, Recompute, require_at_most, require_positive
from gpufleet.estimate.memory import (
    STATE_BYTES,
    ActivationShape,
    MemoryEstimate,
    Offload,
    Precision,
    Strategy,
    estimate_memory,
)
from gpufleet.estimate.network import ALGORITHMS, Placement, allreduce, data_parallel_group
from gpufleet.estimate.peak import GpuPeak, gpu_peak

GIB = 2**30
CANDIDATES: tuple[tuple[Strategy, Offload], ...] = (
    ("ddp", "none"),
    ("zero1", "none"),
    ("zero2", "none"),
    ("fsdp_hybrid", "none"),
    ("zero3", "none"),
    ("zero2", "optimizer"),
    ("zero3", "optimizer"),
    ("zero3", "params"),
)
"""(strategy, offload) pairs in order of communication; fsdp_full and fsdp_grad_op are zero3 and zero2 in memory."""
LABELS: dict[Strategy, str] = {"zero2": "zero2 / fsdp_grad_op", "zero3": "zero3 / fsdp_full"}
VOLUME: dict[Strategy, float] = {"ddp": 1.0, "zero1": 1.0, "zero2": 1.0, "fsdp_hybrid": 1.0, "zero3": 1.5}
"""Gradient communication per step in all-reduces of the gradients (ZeRO paper, section 7); fsdp_hybrid adds its
in-node gather on top (see the module docstring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutOption:
    """One candidate layout and whether it fits."""

    strategy: Strategy
    offload: Offload
    tp: int
    pp: int
    dp: int
    fits: bool
    needed_bytes: int | None
    """Per-GPU total, or ``None`` when the degrees do not divide the model."""
    usable_bytes: int
    reason: str
    estimate: MemoryEstimate | None
    comm_seconds: float | None = None
    """One step's gradient communication on the placement given to :func:`advise_layout`; ``None`` without one."""

    @property
    def label(self) -> str:
        name = LABELS.get(self.strategy, self.strategy)
        return name if self.offload == "none" else f"{name} + offload {self.offload}"

    @property
    def rank(self) -> tuple[int, int, int, int]:
        """Sort key: offload, tensor degree, pipeline degree, strategy (see the module docstring)."""
        offload = ("none", "optimizer", "params").index(self.offload)
        return offload, self.tp, self.pp, [s for s, _ in CANDIDATES].index(self.strategy)

    def as_dict(self) -> dict[str, object]:
        return {
            "strategy": self.strategy,
            "offload": self.offload,
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "fits": self.fits,
            "needed_bytes": self.needed_bytes,
            "usable_bytes": self.usable_bytes,
            "reason": self.reason,
            "memory": None if self.estimate is None else self.estimate.as_dict(),
            "comm_seconds": self.comm_seconds,
        }


def usable_bytes(gpu: GpuPeak, *, headroom: float = 0.10, reserve_gib: float = 1.0) -> int:
    """Memory a training process can plan on: the datasheet figure less a fraction and a fixed reserve."""
    if not 0 <= headroom < 1:
        raise ParameterError(
            "{headroom} must be in [0, 1): a fraction of the GPU's memory to keep free", headroom=headroom
        )
    if not (math.isfinite(reserve_gib) and reserve_gib >= 0):
        raise ParameterError(
            "{reserve_gib} must be a finite number >= 0: the GiB kept for the CUDA context", reserve_gib=reserve_gib
        )
    usable = gpu.memory_bytes * (1 - headroom) - reserve_gib * GIB
    if not usable > 0:
        raise ParameterError(
            "{headroom} and {reserve_gib} leave nothing of {gpu!s}'s memory",
            headroom=headroom,
            reserve_gib=reserve_gib,
            gpu=gpu.name,
        )
    return int(usable)


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, in O(sqrt n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def advise_layout(
    params: int,
    gpus: int,
    gpu: str | GpuPeak,
    *,
    gpus_per_node: int = 8,
    shape: ActivationShape | None = None,
    expert_params: int = 0,
    ep: int = 1,
    recompute: Recompute = "none",
    sequence_parallel: bool = False,
    precision: Precision = "mixed",
    headroom: float = 0.10,
    reserve_gib: float = 1.0,
    placement: Placement | None = None,
) -> list[LayoutOption]:
    """Every candidate layout, those that fit first, each group least communication first.

    A candidate whose degrees do not divide the model (heads by t, layers by p, data-parallel ranks by ep) is
    rejected with that reason rather than estimated. With a ``placement`` of the same GPUs, every estimated layout
    gets its gradient communication time per step (module docstring).
    """
    require_positive(params=params, gpus=gpus, gpus_per_node=gpus_per_node)
    require_at_most(MAX_COUNT, "1e15 parameters", params=params)
    require_at_most(MAX_GPUS, "1e6 GPUs", gpus=gpus, gpus_per_node=gpus_per_node)
    if placement is not None and (placement.gpus, placement.gpus_per_node) != (gpus, min(gpus, gpus_per_node)):
        raise ParameterError(
            "{gpus} and {gpus_per_node} differ from the placement's {held!s} GPUs, {per_node!s} a node: "
            "place the same GPUs",
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            held=placement.gpus,
            per_node=placement.gpus_per_node,
        )
    row = gpu if isinstance(gpu, GpuPeak) else gpu_peak(gpu)
    usable = usable_bytes(row, headroom=headroom, reserve_gib=reserve_gib)

    def estimate(strategy: Strategy, offload: Offload, tp: int, pp: int) -> MemoryEstimate:
        return estimate_memory(
            params,
            gpus,
            strategy,
            tp=tp,
            pp=pp,
            ep=ep,
            expert_params=expert_params,
            shape=shape,
            recompute=recompute,
            sequence_parallel=sequence_parallel,
            offload=offload,
            gpus_per_node=gpus_per_node,
            precision=precision,
        )

    options: list[LayoutOption] = []
    for tp in (d for d in _divisors(gpus) if d <= gpus_per_node):
        for pp in _divisors(gpus // tp):
            for strategy, offload in CANDIDATES:
                if strategy == "fsdp_hybrid" and gpus // (tp * pp) <= gpus_per_node // tp:
                    continue  # all data-parallel ranks within one node: the same as zero3
                options.append(_option(strategy, offload, tp, pp, gpus // (tp * pp), usable, row, estimate))
    if placement is not None:
        grads = STATE_BYTES[precision][1] * ((params - expert_params) + expert_params / ep)
        options = [replace(o, comm_seconds=gradient_sync_seconds(o, placement, grads)) for o in options]
    return sorted(options, key=lambda o: (not o.fits, o.rank))


def gradient_sync_seconds(option: LayoutOption, placement: Placement, grad_bytes: float) -> float | None:
    """One step's gradient communication of ``option`` on ``placement`` (module docstring); ``None`` if not estimated.

    ``grad_bytes`` are the gradients of the whole model (experts already divided by their degree).
    """
    if option.estimate is None:
        return None
    if option.dp == 1:
        return 0.0
    size = max(1, round(grad_bytes / (option.tp * option.pp)))
    group = data_parallel_group(placement, tp=option.tp, dp=option.dp)
    seconds = min(allreduce(size, group, algorithm).seconds for algorithm in ALGORITHMS) * VOLUME[option.strategy]
    shard = option.estimate.shard
    if option.strategy == "fsdp_hybrid" and shard > 1:
        node = replace(group, nodes=1, gpus_per_node=shard, network=None)
        seconds += 0.5 * min(allreduce(size, node, algorithm).seconds for algorithm in ALGORITHMS)
    return seconds


def _option(
    strategy: Strategy,
    offload: Offload,
    tp: int,
    pp: int,
    dp: int,
    usable: int,
    gpu: GpuPeak,
    estimate: Callable[[Strategy, Offload, int, int], MemoryEstimate],
) -> LayoutOption:
    est: MemoryEstimate | None
    try:
        est = estimate(strategy, offload, tp, pp)
    except UsageError as err:
        est, reason = None, str(err).split(":")[0]
    need = None if est is None else est.total_bytes
    fits = need is not None and need <= usable
    if need is not None:
        of = f"{usable / GIB:.1f} GiB usable of {gpu.name}'s {gpu.memory_gib:g} GiB"
        reason = f"uses {need / GIB:.1f} GiB of {of}" if fits else f"needs {need / GIB:.1f} GiB, more than the {of}"
    return LayoutOption(
        strategy=strategy,
        offload=offload,
        tp=tp,
        pp=pp,
        dp=dp,
        fits=fits,
        needed_bytes=need,
        usable_bytes=usable,
        reason=reason,
        estimate=est,
    )


__all__ = ["CANDIDATES", "VOLUME", "LayoutOption", "advise_layout", "gradient_sync_seconds", "usable_bytes"]
