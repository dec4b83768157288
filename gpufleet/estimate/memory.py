"""Memory one GPU needs to train a transformer: model states (ZeRO, FSDP, offload, tensor/pipeline/expert
parallelism) and activations.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", arXiv:1910.02054, section 3 and figure 1). Mixed-precision Adam keeps, per parameter, 2 bytes of
16-bit weights, 2 bytes of 16-bit gradients and K = 12 bytes of optimizer state (fp32 master weights, momentum and
variance); plain fp32 training keeps 4 + 4 + 8. With N_d data-parallel ranks and Ψ parameters::

    ddp (baseline)        (2 + 2 + K)·Ψ
    zero1 (P_os)          2Ψ + 2Ψ + K·Ψ/N_d
    zero2 (P_os+g)        2Ψ + (2 + K)·Ψ/N_d            fsdp_grad_op (SHARD_GRAD_OP) is the same
    zero3 (P_os+g+p)      (2 + 2 + K)·Ψ/N_d             fsdp_full (FULL_SHARD) is the same
    fsdp_hybrid           zero3 with N_d = the data-parallel ranks of one node (HYBRID_SHARD)

Sharded weights must be gathered to compute: zero3 and FSDP also hold one gathered unit, its 16-bit weights and
gradients, ``(2 + 2)·largest layer`` as in DeepSpeed's ``estimate_zero3_model_states_mem_needs`` (a transformer
block by default, FSDP's usual wrapping unit). CPU offload follows ZeRO-Offload (Ren et al. 2021): ``optimizer``
moves the optimizer states and the sharded gradients to the host; ``params`` (ZeRO-Infinity, FSDP
``CPUOffload(offload_params=True)``) moves every model state there, leaving the gathered unit on the GPU.

Tensor parallelism of degree t splits every weight matrix, so parameters, gradients and optimizer states are
divided by t; pipeline parallelism of degree p gives each stage L/p layers; expert parallelism of degree e divides
only the expert weights, whose states are then sharded over the N_d/e ranks that hold the same experts.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198, sections 4-5, table 2), in bytes per layer for 16-bit activations with s the sequence, b the
micro-batch, h the hidden size, a the heads::

    no parallelism                      sbh(34 + 5as/h)
    tensor parallel                     sbh(10 + 24/t + 5as/(ht))
    tensor + sequence parallel          sbh/t · (34 + 5as/h)
    selective recompute (tensor only)   sbh(10 + 24/t)
    selective recompute (+ sequence)    sbh · 34/t
    full recompute                      2sbh (the layer's input only; 2sbh/t with sequence parallelism)

With the 1F1B pipeline schedule the first stage holds p micro-batches of its L/p layers, i.e. L layers' worth
(fewer if a step has fewer than p micro-batches); the interleaved schedule with v model chunks per stage multiplies
that by 1 + (p - 1)/(p·v). Embedding, final norm and logits activations are left out, as in the paper.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from gpufleet.errors import ParameterError
from gpufleet.estimate.flops import (
    MAX_COUNT,
    MAX_GPUS,
    MAX_SIZE,
    Recompute,
    require_at_most,
    require_positive,
    require_recompute,
)

Strategy = Literal["ddp", "zero1", "zero2", "zero3", "fsdp_full", "fsdp_grad_op", "fsdp_hybrid"]
STRATEGIES: tuple[Strategy, ...] = ("ddp", "zero1", "zero2", "zero3", "fsdp_full", "fsdp_grad_op", "fsdp_hybrid")
STRATEGY_ALIASES: dict[str, Strategy] = {"fsdp": "fsdp_full", "full_shard": "fsdp_full", "hybrid_shard": "fsdp_hybrid"}
Offload = Literal["none", "optimizer", "params"]
OFFLOADS: tuple[Offload, ...] = ("none", "optimizer", "params")
Precision = Literal["mixed", "fp32"]
STATE_BYTES: dict[Precision, tuple[int, int, int]] = {"mixed": (2, 2, 12), "fp32": (4, 4, 8)}
"""Bytes per parameter of (weights, gradients, optimizer states) for Adam: mixed precision or plain fp32."""

_SHARDED: dict[Strategy, tuple[bool, bool, bool]] = {
    "ddp": (False, False, False),
    "zero1": (False, False, True),
    "zero2": (False, True, True),
    "fsdp_grad_op": (False, True, True),
    "zero3": (True, True, True),
    "fsdp_full": (True, True, True),
    "fsdp_hybrid": (True, True, True),
}
"""Which of (weights, gradients, optimizer states) each strategy shards across data-parallel ranks."""


def parse_strategy(name: str) -> Strategy:
    key = name.strip().lower().replace("-", "_")
    key = STRATEGY_ALIASES.get(key, key)
    if key not in STRATEGIES:
        raise ParameterError(
            f"unknown {{strategy}}: use one of {', '.join(STRATEGIES)} (or fsdp = fsdp_full)", strategy=name
        )
    return key


def parse_offload(name: str) -> Offload:
    if name not in OFFLOADS:
        raise ParameterError(f"unknown {{offload}}: use one of {', '.join(OFFLOADS)}", offload=name)
    return name


def parse_precision(name: str) -> Precision:
    if name not in STATE_BYTES:
        raise ParameterError(f"unknown {{precision}}: use one of {', '.join(STATE_BYTES)}", precision=name)
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationShape:
    """The sizes Korthikanti et al.'s activation formulas need."""

    layers: int
    hidden: int
    heads: int
    seq: int
    micro_batch: int

    def __post_init__(self) -> None:
        require_positive(layers=self.layers, hidden=self.hidden, heads=self.heads, seq=self.seq)
        require_positive(micro_batch=self.micro_batch)
        require_at_most(
            MAX_SIZE,
            "2**31",
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            seq=self.seq,
            micro_batch=self.micro_batch,
        )
        if self.hidden % self.heads:
            raise ParameterError(
                "{hidden} is not divisible by {heads}: fix the model shape", hidden=self.hidden, heads=self.heads
            )


def activation_bytes_per_layer(
    shape: ActivationShape, *, tp: int = 1, sequence_parallel: bool = False, recompute: Recompute = "none"
) -> float:
    """Bytes one transformer layer keeps for the backward pass of one micro-batch (Korthikanti et al., table 2)."""
    sbh = shape.seq * shape.micro_batch * shape.hidden
    scores = 5 * shape.heads * shape.seq / shape.hidden
    if recompute == "full":
        return 2 * sbh / (tp if sequence_parallel else 1)
    if recompute == "selective":
        return sbh * 34 / tp if sequence_parallel else sbh * (10 + 24 / tp)
    if sequence_parallel:
        return sbh * (34 + scores) / tp
    return sbh * (10 + 24 / tp + scores / tp)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryItem:
    """One line of the breakdown."""

    name: str
    device: Literal["gpu", "cpu"]
    bytes: int
    formula: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Bytes per GPU (and the host memory each GPU's offloaded share needs)."""

    strategy: Strategy
    precision: Precision
    offload: Offload
    gpus: int
    tp: int
    pp: int
    ep: int
    dp: int
    """Data-parallel ranks: gpus / (tp·pp)."""
    shard: int
    """Ranks the sharded states are divided over (1 for ddp; a node's data-parallel ranks for fsdp_hybrid)."""
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    total_bytes: int
    cpu_bytes: int
    breakdown: tuple[MemoryItem, ...]

    def as_dict(self) -> dict[str, object]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "breakdown"}
        out["breakdown"] = [asdict(item) for item in self.breakdown]
        return out


def _check_degrees(
    params: int, gpus: int, tp: int, pp: int, ep: int, expert_params: int, shape: ActivationShape | None
) -> None:
    require_positive(params=params, gpus=gpus, tp=tp, pp=pp, ep=ep)
    require_at_most(MAX_COUNT, "1e15 parameters", params=params)
    require_at_most(MAX_GPUS, "1e6 GPUs", gpus=gpus, tp=tp, pp=pp, ep=ep)
    if gpus % (tp * pp):
        raise ParameterError(
            "{gpus} is not divisible by {tp} * {pp}: pick degrees whose product divides it", gpus=gpus, tp=tp, pp=pp
        )
    if (gpus // (tp * pp)) % ep:
        raise ParameterError(
            f"{{ep}} does not divide the {gpus // (tp * pp)} data-parallel ranks: pick a divisor", ep=ep
        )
    if not 0 <= expert_params < params:
        raise ParameterError(
            "{expert_params} must be in [0, {params}): the experts' share", expert_params=expert_params, params=params
        )
    if ep > 1 and expert_params == 0:
        raise ParameterError(
            "{ep} needs {expert_params:name}: expert parallelism divides only the expert weights",
            ep=ep,
            expert_params=expert_params,
        )
    if shape is not None and shape.heads % tp:
        raise ParameterError(
            "{heads} is not divisible by {tp}: pick a tensor degree dividing it", heads=shape.heads, tp=tp
        )
    if shape is not None and shape.layers % pp:
        raise ParameterError(
            "{layers} is not divisible by {pp}: pick a pipeline degree dividing it", layers=shape.layers, pp=pp
        )


def _shard_degree(strategy: Strategy, dp: int, tp: int, gpus_per_node: int) -> int:
    """Ranks the sharded states are divided over: all data-parallel ranks, or those within a node for hybrid."""
    if not any(_SHARDED[strategy]):
        return 1
    if strategy == "fsdp_hybrid":
        return math.gcd(dp, gpus_per_node // tp) if tp <= gpus_per_node else 1
    return dp


def _activations(
    shape: ActivationShape,
    *,
    tp: int,
    pp: int,
    sequence_parallel: bool,
    recompute: Recompute,
    micro_batches: int,
    virtual_stages: int,
    scale: int,
) -> MemoryItem:
    per_layer = scale * activation_bytes_per_layer(
        shape, tp=tp, sequence_parallel=sequence_parallel, recompute=recompute
    )
    in_flight = min(micro_batches, pp)
    factor = 1 + (pp - 1) / (pp * virtual_stages) if virtual_stages > 1 else 1.0
    total = per_layer * (shape.layers // pp) * in_flight * factor
    formula = f"{per_layer:.4g} B/layer * {shape.layers // pp} layers * {in_flight} micro-batches in flight"
    if virtual_stages > 1:
        formula += f" * {factor:.4g} (interleaved, v={virtual_stages})"
    return MemoryItem(name=f"activations ({recompute} recompute)", device="gpu", bytes=round(total), formula=formula)


def _validate_options(
    strategy: Strategy, offload: str, precision: str, pp: int, virtual_stages: int, shape: ActivationShape | None
) -> None:
    parse_offload(offload)
    parse_precision(precision)
    shard_p, _, shard_o = _SHARDED[strategy]
    if offload != "none" and not shard_o:
        raise ParameterError(
            "{offload:name} needs a sharded strategy (zero1, zero2, zero3 or fsdp_*): ddp keeps states on GPU",
            offload=offload,
        )
    if offload == "params" and not shard_p:
        raise ParameterError(
            "{offload} needs sharded weights (zero3, fsdp_full, fsdp_hybrid), not {strategy!s}",
            offload=offload,
            strategy=strategy,
        )
    if virtual_stages > 1 and (pp == 1 or (shape is not None and shape.layers % (pp * virtual_stages))):
        raise ParameterError(
            "{virtual_stages} needs {pp:name} > 1 and layers divisible by pp * v", virtual_stages=virtual_stages, pp=pp
        )


def estimate_memory(
    params: int,
    gpus: int,
    strategy: Strategy = "ddp",
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    expert_params: int = 0,
    shape: ActivationShape | None = None,
    recompute: Recompute = "none",
    sequence_parallel: bool = False,
    micro_batches: int | None = None,
    virtual_stages: int = 1,
    offload: Offload = "none",
    gpus_per_node: int = 8,
    largest_layer_params: int | None = None,
    precision: Precision = "mixed",
) -> MemoryEstimate:
    """Bytes per GPU to train ``params`` parameters on ``gpus`` GPUs (see the module docstring for every formula).

    ``shape`` is needed for activations (without it they are 0). ``micro_batches`` is the number per step (default
    ``pp``); ``largest_layer_params`` is the unit zero3/FSDP gathers (default params / layers, else 0). With
    ``precision="fp32"`` the 16-bit activation formulas are doubled (their 1-byte dropout masks too: a slight
    over-estimate).
    """
    strategy = parse_strategy(strategy)
    recompute = require_recompute(recompute)
    _check_degrees(params, gpus, tp, pp, ep, expert_params, shape)
    require_positive(gpus_per_node=gpus_per_node, virtual_stages=virtual_stages)
    require_at_most(MAX_GPUS, "1e6 GPUs", gpus_per_node=gpus_per_node)
    require_at_most(MAX_SIZE, "2**31", virtual_stages=virtual_stages)
    _validate_options(strategy, offload, precision, pp, virtual_stages, shape)
    micro_batches = pp if micro_batches is None else micro_batches
    require_positive(micro_batches=micro_batches)
    require_at_most(MAX_SIZE, "2**31", micro_batches=micro_batches)
    if largest_layer_params is not None and not 0 <= largest_layer_params <= params:
        raise ParameterError(
            "{largest_layer_params} must be in [0, {params}]: a layer is part of the model",
            largest_layer_params=largest_layer_params,
            params=params,
        )

    dp = gpus // (tp * pp)
    shard = _shard_degree(strategy, dp, tp, gpus_per_node)
    expert_shard = math.gcd(dp // ep, shard)
    dense = (params - expert_params) / (tp * pp)
    experts = expert_params / (tp * pp * ep)
    split = f"{params:.4g} / (tp·pp = {tp * pp})" + (f", experts / ep {ep}" if ep > 1 else "")
    offloaded = {"none": (), "optimizer": ("optimizer states",), "params": ("parameters", "optimizer states")}[offload]
    items = []
    for name, per_param, sharded in zip(
        ("parameters", "gradients", "optimizer states"), STATE_BYTES[precision], _SHARDED[strategy], strict=True
    ):
        divisor = (shard, expert_shard) if sharded else (1, 1)
        on_cpu = name in offloaded or (name == "gradients" and offload != "none" and sharded)
        items.append(
            MemoryItem(
                name=name,
                device="cpu" if on_cpu else "gpu",
                bytes=round(dense * per_param / divisor[0] + experts * per_param / divisor[1]),
                formula=f"{per_param} B * {split}" + (f" / shard {shard}" if sharded else ""),
            )
        )
    if _SHARDED[strategy][0]:
        unit = largest_layer_params
        if unit is None:
            unit = params // shape.layers if shape is not None else 0
        for name, per_param in zip(("weights", "gradients"), STATE_BYTES[precision][:2], strict=True):
            items.append(
                MemoryItem(
                    name=f"gathered unit: {name}",
                    device="gpu",
                    bytes=round(unit * per_param / tp),
                    formula=f"{per_param} B * largest unit {unit:.4g} / tp {tp}",
                )
            )
    if shape is not None:
        items.append(
            _activations(
                shape,
                tp=tp,
                pp=pp,
                sequence_parallel=sequence_parallel,
                recompute=recompute,
                micro_batches=micro_batches,
                virtual_stages=virtual_stages,
                scale=2 if precision == "fp32" else 1,
            )
        )
    return _total(items, strategy, precision, offload, gpus=gpus, tp=tp, pp=pp, ep=ep, dp=dp, shard=shard)


def _total(
    items: list[MemoryItem], strategy: Strategy, precision: Precision, offload: Offload, **degrees: int
) -> MemoryEstimate:
    def gpu(*names: str) -> int:
        return sum(i.bytes for i in items if i.device == "gpu" and i.name.startswith(names))

    params_b, grads_b = gpu("parameters", "gathered unit: weights"), gpu("gradients", "gathered unit: gradients")
    optimizer_b, activations_b = gpu("optimizer"), gpu("activations")
    return MemoryEstimate(
        strategy=strategy,
        precision=precision,
        offload=offload,
        **degrees,
        params_bytes=params_b,
        grads_bytes=grads_b,
        optimizer_bytes=optimizer_b,
        activations_bytes=activations_b,
        total_bytes=params_b + grads_b + optimizer_b + activations_b,
        cpu_bytes=sum(i.bytes for i in items if i.device == "cpu"),
        breakdown=tuple(items),
    )


__all__ = [
    "OFFLOADS",
    "STATE_BYTES",
    "STRATEGIES",
    "ActivationShape",
    "MemoryEstimate",
    "MemoryItem",
    "Offload",
    "Precision",
    "Strategy",
    "activation_bytes_per_layer",
    "estimate_memory",
    "parse_offload",
    "parse_precision",
    "parse_strategy",
]
