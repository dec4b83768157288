"""``gpufleet estimate ...``: MFU from a throughput, memory per GPU, the layouts that fit, and what an all-reduce
costs on a placement. Parse, call, render."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from gpufleet import units
from gpufleet.cli.options import JsonOpt
from gpufleet.cli.render import console, emit_json, styled, table
from gpufleet.errors import UsageError, parameters_as_flags
from gpufleet.estimate.flops import MAX_COUNT, TransformerShape, require_at_most, require_positive, require_recompute
from gpufleet.estimate.layout import GIB, LayoutOption, advise_layout, usable_bytes
from gpufleet.estimate.memory import (
    OFFLOADS,
    ActivationShape,
    MemoryEstimate,
    estimate_memory,
    parse_offload,
    parse_precision,
    parse_strategy,
)
from gpufleet.estimate.mfu import MAX_STEP_TIME
from gpufleet.estimate.mfu import mfu as compute_mfu
from gpufleet.estimate.mfu import tokens_per_second as throughput
from gpufleet.estimate.network import (
    FABRICS,
    AllreduceEstimate,
    Placement,
    estimate_allreduce,
    fleet_placement,
    one_switch_placement,
    parse_fabric,
)
from gpufleet.estimate.peak import DTYPES, gpu_peak, parse_dtype
from gpufleet.fmt import number

estimate_app = typer.Typer(
    help="Estimate MFU, memory per GPU, the parallel layouts that fit (PaLM, ZeRO, Korthikanti et al.) and what an "
    "all-reduce costs (NCCL's ring and tree, nccl-tests' bus bandwidth).",
    no_args_is_help=True,
)


Count = Annotated[str, typer.Option(help="A count: 6.74e9, 7B, 350M, 125k.")]
OptCount = Annotated[str | None, typer.Option(help="A count: 6.74e9, 7B, 350M, 125k.")]
Int = Annotated[int | None, typer.Option()]
Recompute = Annotated[str, typer.Option(help="Activation recomputation: none, selective or full.")]
Tp = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")]
Pp = Annotated[int, typer.Option("--pp", help="Pipeline-parallel degree.")]
Ep = Annotated[int, typer.Option("--ep", help="Expert-parallel degree (divides only --expert-params).")]
SeqPar = Annotated[bool, typer.Option("--sequence-parallel", help="Megatron sequence parallelism (with --tp).")]
Precision = Annotated[str, typer.Option(help="mixed (Adam, 2+2+12 B/param) or fp32 (4+4+8 B/param).")]
PerNode = Annotated[int, typer.Option(help="GPUs per node (bounds --tp and fsdp_hybrid's shard group).")]
Gpu = Annotated[str, typer.Option(help="GPU name, e.g. h100, a100-40gb, l4 (see the datasheet table).")]
Layers = Annotated[int | None, typer.Option(help="Transformer layers (activations need all five shape options).")]
Hidden = Annotated[int | None, typer.Option(help="Hidden size h.")]
Heads = Annotated[int | None, typer.Option(help="Attention heads a.")]
Seq = Annotated[int | None, typer.Option(help="Sequence length s.")]
MicroBatch = Annotated[int | None, typer.Option(help="Micro-batch size b (sequences).")]
FleetOpt = Annotated[Path | None, typer.Option("--fleet", help="Fleet topology YAML (docs/topology.md).")]
Nodes = Annotated[
    str | None, typer.Option(help="With --fleet: the job's nodes as a Slurm hostlist, e.g. 'gpu[01-08]'.")
]
FabricOpt = Annotated[
    str | None, typer.Option(help=f"Without --fleet, the one switch's fabric: {', '.join(FABRICS)} (infiniband).")
]
Gbps = Annotated[float | None, typer.Option(help="Without --fleet, the switch's port speed in Gb/s (400).")]
NodeGbps = Annotated[
    float | None, typer.Option(help="One node's network, all NICs together, in Gb/s (GPUs per node x port speed).")
]

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def _flags(*params: str) -> dict[str, str]:
    """Parameter of :mod:`gpufleet.estimate` -> the option a command takes it as (Typer's spelling)."""
    return {p: "--" + p.replace("_", "-") for p in params}


_SHAPE_FLAGS = _flags("params", "layers", "hidden", "heads", "seq", "micro_batch", "expert_params", "ep", "recompute")
_MFU_FLAGS = _flags(
    "params",
    "layers",
    "heads",
    "head_dim",
    "seq",
    "num_gpus",
    "tokens_per_second",
    "step_time",
    "tokens_per_step",
    "embedding_params",
    "recompute",
    "dtype",
)
_MEMORY_FLAGS = _SHAPE_FLAGS | _flags(
    "gpus",
    "strategy",
    "tp",
    "pp",
    "micro_batches",
    "virtual_stages",
    "offload",
    "gpus_per_node",
    "precision",
    "largest_layer_params",
)
_NETWORK_FLAGS = _flags("gpus", "gpus_per_node", "nodes", "fabric", "gbps", "node_gbps")
_LAYOUT_FLAGS = (
    _SHAPE_FLAGS
    | _NETWORK_FLAGS
    | _flags("gpus", "gpus_per_node", "precision", "headroom", "reserve_gib", "step_seconds")
)
_ALLREDUCE_FLAGS = _NETWORK_FLAGS | {"size_bytes": "--bytes"}


def parse_count(text: str, flag: str) -> int:
    """``"6.74e9"``, ``"7B"``, ``"350M"`` -> an int up to ``MAX_COUNT`` (1e15); anything else is a
    :class:`UsageError` naming ``flag``."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    if match is None:
        raise UsageError(f"--{flag} {text!r} is not a count: write e.g. 6.74e9, 7B or 350M")
    value = float(match.group(1)) * _SUFFIX[match.group(2)]
    if not value <= MAX_COUNT:  # also inf: 1e400 reads as infinity
        raise UsageError(f"--{flag} {text!r} is out of range: give a count of at most 1e15")
    return round(value)


def parse_size(text: str, flag: str) -> int:
    """``"2e9"``, ``"2GB"``, ``"2GiB"``, ``"512MiB"`` -> bytes: GB = 1e9 (as nccl-tests counts), GiB = 2**30."""
    return units.parse_size(text, f"--{flag}")


def _placement(
    gpus: int,
    gpus_per_node: int,
    gpu: str,
    fleet: Path | None,
    nodes: str | None,
    fabric: str | None,
    gbps: float | None,
    node_gbps: float | None,
) -> Placement:
    """The fleet file's nodes, or whole nodes under one switch of ``--fabric`` and ``--gbps``."""
    if fleet is None:
        if nodes is not None:
            raise UsageError("--nodes needs --fleet: the fleet file says which switch each node hangs off")
        return one_switch_placement(
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            gpu=gpu,
            fabric=parse_fabric("infiniband" if fabric is None else fabric),
            gbps=400.0 if gbps is None else gbps,
            node_gbps=node_gbps,
        )
    if fabric is not None or gbps is not None:
        raise UsageError("--fabric and --gbps describe the switch assumed without --fleet: drop them or --fleet")
    if nodes is None:
        raise UsageError("--fleet needs --nodes: the job's nodes as a Slurm hostlist, e.g. --nodes 'gpu[01-08]'")
    from gpufleet.backends.slurm.topology import load_fleet

    return fleet_placement(
        load_fleet(fleet), nodes, gpus=gpus, gpus_per_node=gpus_per_node, gpu=gpu, node_gbps=node_gbps
    )


def _size_text(n: float) -> str:
    """Decimal units, as nccl-tests: ``2.0 GB``."""
    for unit, factor in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}" if n < 100 * factor else f"{n / factor:.0f} {unit}"
    return f"{n:.0f} B"


def _rate(bytes_per_s: float) -> str:
    for unit, factor in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= factor:
            return f"{number(bytes_per_s / factor)} {unit}"
    return f"{number(bytes_per_s)} B/s"


def _seconds(s: float) -> str:
    if s < 1e-3:
        return f"{number(s * 1e6)} µs"
    return f"{number(s * 1e3)} ms" if s < 1 else f"{number(s)} s"


def _shape(
    layers: int | None, hidden: int | None, heads: int | None, seq: int | None, micro_batch: int | None
) -> ActivationShape | None:
    given = {"layers": layers, "hidden": hidden, "heads": heads, "seq": seq, "micro-batch": micro_batch}
    if all(v is None for v in given.values()):
        return None
    if layers is None or hidden is None or heads is None or seq is None or micro_batch is None:
        missing = ", ".join(f"--{k}" for k, v in given.items() if v is None)
        raise UsageError(f"activations need {missing} too: give all of --layers --hidden --heads --seq --micro-batch")
    return ActivationShape(layers=layers, hidden=hidden, heads=heads, seq=seq, micro_batch=micro_batch)


def _gib(n: int | float | None) -> str:
    return "" if n is None else f"{n / GIB:.2f}"


@estimate_app.command()
@parameters_as_flags(_MFU_FLAGS)
def mfu(
    params: Count,
    layers: Annotated[int, typer.Option(help="Transformer layers L.")],
    heads: Annotated[int, typer.Option(help="Attention heads H.")],
    head_dim: Annotated[int, typer.Option(help="Head size Q (hidden / heads).")],
    seq: Annotated[int, typer.Option(help="Sequence length T.")],
    gpu: Gpu,
    num_gpus: Annotated[int, typer.Option(help="GPUs the run holds.")] = 1,
    tokens_per_second: Annotated[float | None, typer.Option(help="Throughput of the whole run.")] = None,
    step_time: Annotated[float | None, typer.Option(help="Seconds per optimizer step.")] = None,
    tokens_per_step: OptCount = None,
    embedding_params: Annotated[str, typer.Option(help="Embedding parameters to leave out of N.")] = "0",
    recompute: Recompute = "none",
    dtype: Annotated[str, typer.Option(help=f"Peak to divide by: {', '.join(DTYPES)}.")] = "bf16",
    json_out: JsonOpt = False,
) -> None:
    """Model and hardware FLOPs utilization: 6N + 12*L*H*Q*T per token (PaLM appendix B) over the datasheet peak."""
    if tokens_per_second is not None and (step_time is not None or tokens_per_step is not None):
        raise UsageError("give either --tokens-per-second or --step-time with --tokens-per-step, not both")
    if tokens_per_second is None:
        if step_time is None or tokens_per_step is None:
            raise UsageError("give --tokens-per-second, or --step-time and --tokens-per-step")
        tokens_per_second = throughput(
            step_time=step_time, tokens_per_step=parse_count(tokens_per_step, "tokens-per-step")
        )
    shape = TransformerShape(
        params=parse_count(params, "params"),
        layers=layers,
        heads=heads,
        head_dim=head_dim,
        seq=seq,
        embedding_params=parse_count(embedding_params, "embedding-params"),
    )
    row, peak_dtype = gpu_peak(gpu), parse_dtype(dtype)
    est = compute_mfu(
        shape,
        tokens_per_second=tokens_per_second,
        peak_flops_per_gpu=row.peak_flops(peak_dtype),
        num_gpus=num_gpus,
        recompute=require_recompute(recompute),
    )
    if json_out:
        emit_json({**est.as_dict(), "gpu": row.name, "dtype": dtype, "recompute": recompute})
        return
    rows = [
        ["model FLOPs / token", f"{number(est.flops_per_token, 4)}", "6N + 12*L*H*Q*T"],
        ["hardware FLOPs / token", f"{number(est.hardware_flops_per_token, 4)}", f"recompute: {recompute}"],
        ["tokens / s", f"{number(est.tokens_per_second, 4)}", "whole run"],
        ["achieved", f"{number(est.achieved_flops / 1e12, 4)} TFLOP/s", "tokens/s * model FLOPs/token"],
        [
            "peak",
            f"{number(est.peak_flops / 1e12, 4)} TFLOP/s",
            f"{num_gpus} x {row.name} {dtype} dense {number(row.tflops(peak_dtype), 6)}",
        ],
        ["MFU", f"{est.mfu:.1%}", "achieved / peak"],
        ["HFU", f"{est.hfu:.1%}", "with recomputation"],
    ]
    console.print(table("utilization", ["", "value", "how"], rows))


@estimate_app.command()
@parameters_as_flags(_MEMORY_FLAGS)
def memory(
    params: Count,
    gpus: Annotated[int, typer.Option(help="GPUs of the job.")],
    strategy: Annotated[
        str, typer.Option(help="ddp, zero1, zero2, zero3, fsdp (= fsdp_full), fsdp_grad_op, fsdp_hybrid.")
    ] = "ddp",
    tp: Tp = 1,
    pp: Pp = 1,
    ep: Ep = 1,
    expert_params: Annotated[str, typer.Option(help="Parameters in experts (divided by --ep).")] = "0",
    layers: Layers = None,
    hidden: Hidden = None,
    heads: Heads = None,
    seq: Seq = None,
    micro_batch: MicroBatch = None,
    micro_batches: Annotated[int | None, typer.Option(help="Micro-batches per step (default --pp).")] = None,
    virtual_stages: Annotated[int, typer.Option(help="Model chunks per pipeline stage (interleaved 1F1B).")] = 1,
    sequence_parallel: SeqPar = False,
    recompute: Recompute = "none",
    offload: Annotated[str, typer.Option(help=f"CPU offload: {', '.join(OFFLOADS)}.")] = "none",
    gpus_per_node: PerNode = 8,
    largest_layer_params: Annotated[
        str | None, typer.Option(help="Unit zero3/FSDP gathers (default params/layers).")
    ] = None,
    precision: Precision = "mixed",
    gpu: Annotated[str | None, typer.Option(help="Also say whether it fits this GPU (10% + 1 GiB kept free).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Bytes per GPU: model states (ZeRO paper), activations (Korthikanti et al. 2022), with every parallelism."""
    est = estimate_memory(
        parse_count(params, "params"),
        gpus,
        parse_strategy(strategy),
        tp=tp,
        pp=pp,
        ep=ep,
        expert_params=parse_count(expert_params, "expert-params"),
        shape=_shape(layers, hidden, heads, seq, micro_batch),
        recompute=require_recompute(recompute),
        sequence_parallel=sequence_parallel,
        micro_batches=micro_batches,
        virtual_stages=virtual_stages,
        offload=parse_offload(offload),
        gpus_per_node=gpus_per_node,
        largest_layer_params=None
        if largest_layer_params is None
        else parse_count(largest_layer_params, "largest-layer-params"),
        precision=parse_precision(precision),
    )
    usable = None if gpu is None else usable_bytes(gpu_peak(gpu))
    if json_out:
        extra = (
            {}
            if usable is None
            else {"gpu": gpu_peak(str(gpu)).name, "usable_bytes": usable, "fits": est.total_bytes <= usable}
        )
        emit_json({**est.as_dict(), **extra})
        return
    _print_memory(est, usable)


def _print_memory(est: MemoryEstimate, usable: int | None) -> None:
    title = (
        f"memory per GPU: {est.strategy}, tp={est.tp} pp={est.pp} ep={est.ep} dp={est.dp}, shard={est.shard}, "
        f"offload={est.offload}, {est.precision}"
    )
    rows: list[list[object]] = [[i.name, i.device, _gib(i.bytes), i.formula] for i in est.breakdown]
    rows.append([styled("[bold]total on GPU[/]"), "gpu", styled(f"[bold]{_gib(est.total_bytes)}[/]"), ""])
    if est.cpu_bytes:
        rows.append(["offloaded to host", "cpu", _gib(est.cpu_bytes), "per GPU"])
    console.print(table(title, ["component", "where", "GiB", "formula"], rows))
    if usable is not None:
        verdict = "[green]fits[/]" if est.total_bytes <= usable else "[red]does not fit[/]"
        console.print(f"{verdict}: {_gib(est.total_bytes)} GiB of {_gib(usable)} GiB usable")


@estimate_app.command()
@parameters_as_flags(_LAYOUT_FLAGS)
def layout(
    params: Count,
    gpus: Annotated[int, typer.Option(help="GPUs of the job.")],
    gpu: Gpu,
    gpus_per_node: PerNode = 8,
    layers: Layers = None,
    hidden: Hidden = None,
    heads: Heads = None,
    seq: Seq = None,
    micro_batch: MicroBatch = None,
    expert_params: Annotated[str, typer.Option(help="Parameters in experts (divided by --ep).")] = "0",
    ep: Ep = 1,
    recompute: Recompute = "none",
    sequence_parallel: SeqPar = False,
    precision: Precision = "mixed",
    headroom: Annotated[float, typer.Option(help="Fraction of the GPU's memory kept free.")] = 0.10,
    reserve_gib: Annotated[float, typer.Option(help="GiB kept for the CUDA context.")] = 1.0,
    top: Annotated[int, typer.Option(help="Fitting layouts to show (0: all); --json lists all.")] = 12,
    fleet: FleetOpt = None,
    nodes: Nodes = None,
    fabric: FabricOpt = None,
    gbps: Gbps = None,
    node_gbps: NodeGbps = None,
    step_seconds: Annotated[
        float | None, typer.Option(help="Compute time of one step: show what share the communication adds.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Layouts (strategy x tp x pp) that fit the GPU, least communication first, and why the others do not.

    With a network (--fleet and --nodes, or --fabric/--gbps for one switch), each layout also shows the time of one
    step's gradient all-reduce on it (docs/topology.md).
    """
    placement = None
    if any(v is not None for v in (fleet, nodes, fabric, gbps, node_gbps)):
        placement = _placement(gpus, gpus_per_node, gpu, fleet, nodes, fabric, gbps, node_gbps)
    if step_seconds is not None:
        if placement is None:
            raise UsageError("--step-seconds needs a network: give --fleet and --nodes, or --fabric and --gbps")
        require_positive(step_seconds=step_seconds)
        require_at_most(MAX_STEP_TIME, "1e7 seconds", step_seconds=step_seconds)
    options = advise_layout(
        parse_count(params, "params"),
        gpus,
        gpu,
        gpus_per_node=gpus_per_node,
        shape=_shape(layers, hidden, heads, seq, micro_batch),
        expert_params=parse_count(expert_params, "expert-params"),
        ep=ep,
        recompute=require_recompute(recompute),
        sequence_parallel=sequence_parallel,
        precision=parse_precision(precision),
        headroom=headroom,
        reserve_gib=reserve_gib,
        placement=placement,
    )
    fitting = [o for o in options if o.fits]
    rejected = [o for o in options if not o.fits]
    if json_out:
        network = {} if placement is None else {"placement": placement.as_dict(), "step_seconds": step_seconds}
        emit_json(
            {
                "gpu": gpu_peak(gpu).name,
                "usable_bytes": options[0].usable_bytes if options else None,
                **network,
                "fits": [o.as_dict() for o in fitting],
                "rejected": [o.as_dict() for o in rejected],
            }
        )
        return
    _print_layout(fitting, rejected, top, placement, step_seconds)


def _print_layout(
    fitting: list[LayoutOption],
    rejected: list[LayoutOption],
    top: int,
    placement: Placement | None = None,
    step_seconds: float | None = None,
) -> None:
    shown = fitting if top <= 0 else fitting[:top]
    head = ["#", "strategy", "tp", "pp", "dp", "GiB/GPU", "params", "grads", "optim", "activ"]
    if placement is not None:
        head.append("comm/step")
        if step_seconds is not None:
            head.append("of step")
    rows = []
    for n, o in enumerate(shown, 1):
        e = o.estimate
        if e is None:
            continue
        row: list[object] = [
            n,
            o.label,
            o.tp,
            o.pp,
            o.dp,
            _gib(e.total_bytes),
            _gib(e.params_bytes),
            _gib(e.grads_bytes),
            _gib(e.optimizer_bytes),
            _gib(e.activations_bytes),
        ]
        if placement is not None and o.comm_seconds is not None:
            row.append(_seconds(o.comm_seconds) if o.comm_seconds else "0")
            if step_seconds is not None:
                row.append(f"{o.comm_seconds / step_seconds:.1%}")
        rows.append(row)
    usable = _gib(fitting[0].usable_bytes if fitting else rejected[0].usable_bytes if rejected else 0)
    console.print(
        table(f"layouts that fit ({len(fitting)}, {usable} GiB usable), least communication first", head, rows)
    )
    if len(shown) < len(fitting):
        console.print(f"[dim]... and {len(fitting) - len(shown)} more (--top 0 shows all)[/]")
    if placement is not None:
        console.print(f"[dim]comm/step: {_where(placement)}; one gradient all-reduce per step, not overlapped[/]")
    if rejected:
        console.print(
            table("rejected", ["strategy", "tp", "pp", "reason"], [[o.label, o.tp, o.pp, o.reason] for o in rejected])
        )


def _where(placement: Placement) -> str:
    """``8 nodes x 8 GPUs across 2 leaf switches (2 switch hops)``, or ``1 node (NVLink 4)``."""
    if placement.network is None:
        return f"1 node of {placement.gpus_per_node} GPUs ({placement.intra.name})"
    leaves = placement.leaves
    switches = f"{leaves} leaf switch" + ("es" if leaves != 1 else "")
    hops = f"{placement.max_hops} switch hop" + ("s" if placement.max_hops != 1 else "")
    return f"{placement.nodes} nodes x {placement.gpus_per_node} GPUs across {switches} ({hops})"


def allreduce_verdict(size_bytes: int, placement: Placement, results: tuple[AllreduceEstimate, ...]) -> str:
    """One line: the message, where it runs, each algorithm's time and bus bandwidth, and what bounds the faster."""
    best = min(results, key=lambda r: r.seconds)
    times = ", ".join(f"{r.algorithm} {_seconds(r.seconds)} (busbw {_rate(r.busbw)})" for r in results)
    return (
        f"all-reduce of {_size_text(size_bytes)} over {placement.gpus} GPUs on {_where(placement)}: {times}; "
        f"{best.algorithm} is faster, bound by {best.bottleneck}"
    )


@estimate_app.command()
@parameters_as_flags(_ALLREDUCE_FLAGS)
def allreduce(
    size: Annotated[str, typer.Option("--bytes", help="Message size: 2e9, 2GB (1e9 bytes), 2GiB (2**30), 512MiB.")],
    gpus: Annotated[int, typer.Option(help="GPUs taking part (whole nodes).")],
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node, one NIC each.")] = 8,
    gpu: Annotated[str, typer.Option(help="GPU name: sets the link inside a node (NVLink or PCIe).")] = "h100",
    fleet: FleetOpt = None,
    nodes: Nodes = None,
    fabric: FabricOpt = None,
    gbps: Gbps = None,
    node_gbps: NodeGbps = None,
    json_out: JsonOpt = False,
) -> None:
    """Time, algbw and busbw of one all-reduce with NCCL's ring and tree on a placement (alpha-beta model)."""
    size_bytes = parse_size(size, "bytes")
    placement = _placement(gpus, gpus_per_node, gpu, fleet, nodes, fabric, gbps, node_gbps)
    results = estimate_allreduce(size_bytes, placement)
    verdict = allreduce_verdict(size_bytes, placement, results)
    if json_out:
        emit_json(
            {
                "bytes": size_bytes,
                **placement.as_dict(),
                **{r.algorithm: r.as_dict() for r in results},
                "faster": min(results, key=lambda r: r.seconds).algorithm,
                "verdict": verdict,
            }
        )
        return
    head = ["algorithm", "time", "algbw", "busbw", "bottleneck", "switch hops"]
    rows = [
        [r.algorithm, _seconds(r.seconds), _rate(r.algbw), _rate(r.busbw), r.bottleneck, r.max_hops] for r in results
    ]
    console.print(table(f"all-reduce of {_size_text(size_bytes)} ({size_bytes} bytes)", head, rows))
    console.print(verdict, markup=False, highlight=False, soft_wrap=True)


__all__ = ["allreduce_verdict", "estimate_app", "parse_count", "parse_size"]
