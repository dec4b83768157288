"""``gpufleet profile``: where a job's step time goes, and what to look at next.

A few steps of the job's ``module:function`` run in this process under ``torch.profiler``; every
profiled event is put in one bucket and the buckets are shares of the profiled wall time:

* **compute**: aten operators and device kernels;
* **communication**: collectives (NCCL, Gloo, c10d: all-reduce, all-gather, reduce-scatter...);
* **data loading**: ``DataLoader`` iteration and ``record_function("data")`` ranges;
* **host overhead**: other named host ranges (optimizer and autograd bookkeeping, CUDA runtime
  calls) plus *unattributed host time*: Python between operators, which the profiler cannot name
  (a batch function that is not wrapped in ``record_function("data")`` lands here);
* **idle**: wall time the main thread was neither in an operator nor on a CPU (sleep, I/O, waits).

With CUDA the buckets describe the device timeline instead (HTA's "temporal breakdown"): kernel
time is compute or communication, and the time the GPU waited is put on data loading, then on a
CPU that was itself idle, and the rest on the host (launch and Python overhead).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import re
import tempfile
import time
import types
import typing
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import ParameterError, SpecError, UsageError
from gpufleet.spec import JobSpec

COMM_RE = re.compile(
    r"nccl|gloo|c10d|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|barrier", re.I
)
DATA_RE = re.compile(r"dataloader|^data(?:$|[^a-z])|data_?load", re.I)
MATMUL_RE = re.compile(r"mm|matmul|linear|gemm|addmm|bmm|sdpa|attention", re.I)
FUSIBLE_RE = re.compile(r"softmax|norm|gelu|silu|add|mul|div|exp|dropout|where|copy_", re.I)
BUCKETS = ("compute", "communication", "data_loading", "host_overhead", "idle")
JOB_ENV = (
    "GPUFLEET_SPEC",
    "GPUFLEET_CKPT_DIR",
    "GPUFLEET_EVENTS",
    "GPUFLEET_LOG_EVERY_S",
    "GPUFLEET_ATTEMPT",
    "GPUFLEET_FAULT",
)


MAX_STEPS = 10_000
"""Most steps ``profile_job`` runs, warm-up and recorded each: a few show where the time goes, and the
profiler keeps every event of every recorded step in memory."""


class _EnoughSteps(Exception):
    """Raised from ``on_step`` to stop a job that takes no ``steps`` argument."""


def entrypoint_function(spec: JobSpec) -> tuple[Callable[..., Any], set[str]]:
    """The job's function and the names of its parameters; ``SpecError`` for a command entrypoint."""
    target = spec.callable_entrypoint
    if target is None:
        raise SpecError(
            f"entrypoint {spec.entrypoint!r} is a command; this needs a `package.module:function` entrypoint"
        )
    module_name, func_name = target.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as err:
        raise SpecError(
            f"cannot import entrypoint {target!r} ({err}); check the module path and function name"
        ) from None
    if not callable(func):
        raise SpecError(f"entrypoint {target!r} is not callable; point it at a function")
    return func, set(inspect.signature(func).parameters)


def check_counts(steps: int, warmup: int) -> None:
    """Refuse step counts ``profile_job`` cannot run: at least one recorded step, at most :data:`MAX_STEPS` each."""
    if not (1 <= steps <= MAX_STEPS and 0 <= warmup <= MAX_STEPS):
        raise ParameterError(
            "{steps}, {warmup}: profile from 1 to {most!s} steps after 0 to {most!s} warm-up steps "
            "({steps:name} and {warmup:name}; a few steps show where the time goes)",
            steps=steps,
            warmup=warmup,
            most=MAX_STEPS,
        )


_SIMPLE = {int: "an integer", float: "a number", str: "text", bool: "true or false"}


def _fits(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` (from YAML) is of the simple type ``hint`` (``X | None`` too); ``None`` when it cannot tell."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        verdicts = [_fits(value, h) for h in typing.get_args(hint)]
        return True if True in verdicts else None if None in verdicts else False
    if hint is type(None):
        return value is None
    if hint not in _SIMPLE:
        return None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def check_args(func: Callable[..., Any], target: str, args: dict[str, Any], supplied: set[str]) -> None:
    """Refuse (``SpecError``, naming the arg) spec args the function cannot take, before anything runs.

    ``supplied`` are the parameters gpufleet passes itself (``steps``, ``on_step``, ``ckpt_dir``). An
    arg the function has no parameter for, a required parameter no arg gives, and a value whose type
    differs from a simple annotation (``int``, ``float``, ``str``, ``bool``, or one of them ``| None``)
    are refused; other annotations are not judged.
    """
    signature = inspect.signature(func)
    params = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in args:
        if name not in params and not takes_any:
            raise SpecError(f"args.{name}: {target} has no parameter {name!r}; it takes: {', '.join(named) or 'none'}")
    for name in named:
        if params[name].default is inspect.Parameter.empty and name not in args and name not in supplied:
            raise SpecError(f"args.{name} is missing: {target} requires it")
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - an annotation this process cannot evaluate: no type is judged
        hints = {}
    for name, value in args.items():
        hint = hints.get(name)
        if name in supplied or hint is None or _fits(value, hint) is not False:
            continue
        expected = " or ".join(_SIMPLE.get(h, "null") for h in typing.get_args(hint)) or _SIMPLE[hint]
        shown = json.dumps(value, default=str)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise SpecError(f"args.{name} is {shown}, but {target} takes {expected} for {name!r}: fix its type")


@contextlib.contextmanager
def isolated_job(spec: JobSpec, root: Path, *, every_steps: int | None = None, events: bool = False) -> Iterator[Path]:
    """Run the job's function in-process as the runtime would, but in ``root``; restore everything after.

    Exports ``GPUFLEET_SPEC`` (a copy of the spec, optionally checkpointing only every
    ``every_steps``), ``GPUFLEET_CKPT_DIR`` and the spec's ``env``; with ``events`` every step is
    logged to ``root/events.jsonl``. Yields the checkpoint directory.
    """
    import torch

    if every_steps is not None:
        spec = spec.copy_with(
            checkpoint={**spec.checkpoint.model_dump(), "every_steps": every_steps, "every_seconds": None}
        )
    root.mkdir(parents=True, exist_ok=True)
    (root / "spec.json").write_text(spec.model_dump_json(), encoding="utf-8")
    env = {"GPUFLEET_SPEC": str(root / "spec.json"), "GPUFLEET_CKPT_DIR": str(root / "checkpoints"), **spec.env}
    if events:
        env |= {"GPUFLEET_EVENTS": str(root / "events.jsonl"), "GPUFLEET_LOG_EVERY_S": "0"}
    saved = {key: os.environ.get(key) for key in (*JOB_ENV, *env)}
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    for key in JOB_ENV:
        os.environ.pop(key, None)
    os.environ.update(env)
    torch.set_num_threads(spec.resources.cpus)
    try:
        yield root / "checkpoints"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


@dataclass(frozen=True, slots=True)
class OpStat:
    name: str
    calls: int
    self_ms: float
    share: float
    """Of the profiled wall time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSummary:
    job: str
    device: str
    """``cpu``: shares of the main thread's time; ``cuda``: shares of the device timeline."""
    scope: str
    """``steps`` (only the active steps) or ``whole_run`` (the job takes no ``on_step``)."""
    steps: int
    wall_s: float
    seconds: dict[str, float]
    shares: dict[str, float]
    unattributed_host_s: float
    top_ops: list[OpStat]
    checklist: list[str]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def profile_job(spec: JobSpec, steps: int = 5, warmup: int = 2, top: int = 10) -> ProfileSummary:
    """Profile ``steps`` steps of the job after ``warmup`` unrecorded ones (CPU, and CUDA when present)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    check_counts(steps, warmup)
    func, params = entrypoint_function(spec)
    target = str(spec.callable_entrypoint)
    if "on_step" not in params and "steps" not in params:
        raise UsageError(f"{target} takes neither `steps` nor `on_step`; add one so a run can be cut short")
    supplied = {"steps", "on_step", "ckpt_dir"} & params
    check_args(func, target, {k: v for k, v in spec.args.items() if k not in supplied}, supplied)
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    total = warmup + steps
    by_step = "on_step" in params
    before: list[tuple[float, float]] = []  # wall and main-thread CPU clocks as each step ends
    after: list[tuple[float, float]] = []  # and once the profiler has moved on (it may stop and collect)

    with (
        tempfile.TemporaryDirectory(prefix="gpufleet-profile-") as tmp,
        isolated_job(spec, Path(tmp), every_steps=10**9) as ckpt,
    ):
        args = {**spec.args, **({"steps": total} if "steps" in params else {})}
        args |= {"ckpt_dir": str(ckpt)} if "ckpt_dir" in params else {}
        with warnings.catch_warnings():  # --warmup 0 is the user's choice, not a surprise
            warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
            sched = schedule(wait=0, warmup=warmup, active=steps, repeat=1) if by_step else None
        with profile(activities=activities, schedule=sched) as prof:
            if by_step:

                def on_step(_sess: Any) -> None:
                    before.append((time.perf_counter(), time.thread_time()))
                    prof.step()
                    after.append((time.perf_counter(), time.thread_time()))
                    if len(before) >= total:
                        raise _EnoughSteps

                args["on_step"] = on_step
            after.append((time.perf_counter(), time.thread_time()))
            try:
                with contextlib.suppress(_EnoughSteps):
                    func(**args)
            except TypeError as err:  # the args passed check_args, but a value is still not what the code needs
                given = ", ".join(f"{k}={v!r}" for k, v in spec.args.items())
                raise SpecError(
                    f"{target} failed with TypeError ({err}) when called with the spec's args ({given or 'none'}): "
                    "check the arg it names"
                ) from None
            before.append((time.perf_counter(), time.thread_time()))
        if cuda:
            torch.cuda.synchronize()
    if by_step and len(after) <= total:
        raise ParameterError(
            "the job stopped after {done!s} steps; ask for fewer ({warmup:name} + {steps:name})",
            done=len(after) - 1,
            warmup=warmup,
            steps=steps,
        )
    (t0, c0), (t1, c1) = (after[warmup], before[total - 1]) if by_step else (after[0], before[-1])
    return summarize(
        prof,
        spec,
        wall_s=t1 - t0,
        cpu_s=c1 - c0,
        steps=steps if by_step else total,
        cuda=cuda,
        top=top,
        scope="steps" if by_step else "whole_run",
    )


def _bucket(evt: Any) -> str:
    names, node = [], evt
    while node is not None:
        names.append(node.name)
        node = node.cpu_parent
    if any(COMM_RE.search(n) for n in names):
        return "communication"
    if any(DATA_RE.search(n) for n in names):
        return "data_loading"
    return "compute" if evt.name.startswith("aten::") else "host_overhead"


def summarize(
    prof: Any, spec: JobSpec, *, wall_s: float, cpu_s: float, steps: int, cuda: bool, top: int, scope: str
) -> ProfileSummary:
    """Bucket the profiled events (see the module docstring) into shares that sum to one."""
    from torch.profiler import DeviceType

    host = dict.fromkeys(BUCKETS, 0.0)
    device = dict.fromkeys(BUCKETS, 0.0)
    data_ranges = 0
    for evt in prof.events():
        if evt.device_type == DeviceType.CUDA:
            kind = "communication" if COMM_RE.search(evt.name) else "data_loading" if "HtoD" in evt.name else "compute"
            device[kind] += evt.self_device_time_total / 1e6
        elif not evt.name.startswith("ProfilerStep"):
            host[_bucket(evt)] += evt.self_cpu_time_total / 1e6
            data_ranges += bool(DATA_RE.search(evt.name))
    attributed = sum(host.values())
    cpu_idle = max(0.0, wall_s - max(cpu_s, attributed))
    unattributed = max(0.0, wall_s - cpu_idle - attributed)
    seconds = {**host, "host_overhead": host["host_overhead"] + unattributed, "idle": cpu_idle}
    on_device = sum(device.values()) > 0
    if on_device:
        gpu_idle = max(0.0, wall_s - device["compute"] - device["communication"])
        data = min(host["data_loading"], gpu_idle)
        idle = min(cpu_idle, gpu_idle - data)
        seconds = {**device, "data_loading": data, "idle": idle, "host_overhead": gpu_idle - data - idle}
    denominator = max(wall_s, sum(seconds.values()), 1e-12)
    shares = {k: seconds[k] / denominator for k in BUCKETS}

    # Operators: CPU ops by self CPU time, or (on a GPU) kernels by device time.
    def self_us(a: Any) -> float:
        return float(a.self_device_time_total if on_device else a.self_cpu_time_total)

    averages = [
        a
        for a in prof.key_averages()
        if not a.key.startswith("ProfilerStep") and self_us(a) > 0 and (a.device_type == DeviceType.CUDA) == on_device
    ]
    averages.sort(key=self_us, reverse=True)
    ops = [OpStat(a.key, a.count, self_us(a) / 1e3, self_us(a) / 1e6 / denominator) for a in averages[:top]]
    launches = [a for a in averages if on_device or a.key.startswith("aten::")]
    calls = sum(a.count for a in launches)
    small = calls / max(steps, 1) > 200 and sum(self_us(a) for a in launches) / max(calls, 1) < 20
    notes = [] if data_ranges else [NO_DATA_RANGES]
    return ProfileSummary(
        job=spec.name,
        device="cuda" if on_device else "cpu",
        scope=scope,
        steps=steps,
        wall_s=wall_s,
        seconds=seconds,
        shares=shares,
        unattributed_host_s=unattributed,
        top_ops=ops,
        notes=notes,
        checklist=checklist(shares, ops, cuda=on_device, small_ops=small),
    )


NO_DATA_RANGES = (
    "no DataLoader or record_function('data') range was seen: batch preparation is counted as compute or "
    "unattributed host time; wrap it in torch.profiler.record_function('data') to measure it"
)


def nsys_command() -> str:
    """Nsight Systems: the whole timeline (CUDA API, kernels, NVTX ranges, OS runtime, cuDNN/cuBLAS)."""
    return (
        "GPUFLEET_SPEC=spec.json GPUFLEET_CKPT_DIR=/tmp/nsys-ckpt nsys profile -t cuda,nvtx,osrt,cudnn,cublas "
        "-s none --cuda-memory-usage=true -o gpufleet-report -f true python -m gpufleet.runtime.launch"
    )


def ncu_command(kernel_regex: str) -> str:
    """Nsight Compute: every metric section for the first 20 launches of the kernels that matter."""
    return (
        f"GPUFLEET_SPEC=spec.json GPUFLEET_CKPT_DIR=/tmp/ncu-ckpt ncu --set full -k 'regex:{kernel_regex}' -c 20 "
        "--target-processes all -o gpufleet-kernels python -m gpufleet.runtime.launch"
    )


# (bucket, threshold, advice): advice is shown when the bucket's share exceeds the threshold.
ADVICE = (
    ("data_loading", 0.05, "raise DataLoader num_workers, set pin_memory=True, persistent_workers=True and "
     "prefetch_factor>=2, and move decoding out of the training process"),
    ("communication", 0.15, "overlap it with backward (DDP bucket_cap_mb, FSDP prefetch); check the transport "
     "(NVLink/IB, not TCP) with NCCL_DEBUG=INFO and `nvidia-smi topo -m`"),
    ("idle", 0.10, "look for host syncs (.item(), .cpu(), printing, checkpoint saves) with "
     "torch.cuda.set_sync_debug_mode('warn'), and for sleeps or I/O in the loop"),
)  # fmt: skip


def checklist(shares: dict[str, float], ops: list[OpStat], *, cuda: bool, small_ops: bool) -> list[str]:
    """Next steps chosen by the shares; the Nsight Systems and Compute commands always close the list."""
    items = [f"{b.replace('_', ' ')} is {shares[b]:.0%}: {advice}" for b, limit, advice in ADVICE if shares[b] > limit]
    top_name = ops[0].name if ops else ""
    if shares["compute"] > 0.5 and MATMUL_RE.search(top_name):
        where = "check the GEMMs use tensor cores (bf16 autocast, TF32, dims multiple of 8)" if cuda else (
            "CPU shares do not transfer: profile on a GPU, then check tensor-core use (bf16, TF32)")  # fmt: skip
        items.append(f"compute is {shares['compute']:.0%}, led by {top_name}: {where}, and compare MFU with the peak")
    if small_ops or shares["host_overhead"] > 0.2:
        many = " with many short operators" if small_ops else ""
        items.append(
            f"host overhead is {shares['host_overhead']:.0%}{many}: do more work per step, try torch.compile "
            "(fuses ops) and CUDA graphs (mode='reduce-overhead') to cut launch cost"
        )
    if any(FUSIBLE_RE.search(o.name) for o in ops[:5]):
        items.append(
            "elementwise or normalisation ops rank high: if torch.compile does not fuse them, a fused Triton kernel "
            "is the next step; first confirm with Nsight Compute that the kernel is memory-bound"
        )
    regex = re.escape(top_name)[:60] if cuda and top_name else "gemm|sm90|sm80|ampere|hopper"
    items.append(f"timeline on a GPU box (spec.json: the JSON spec, e.g. jobs/<id>/spec.json): {nsys_command()}")
    items.append(f"kernel detail: {ncu_command(regex)}")
    return items


__all__ = [
    "ADVICE",
    "BUCKETS",
    "COMM_RE",
    "DATA_RE",
    "FUSIBLE_RE",
    "JOB_ENV",
    "MATMUL_RE",
    "MAX_STEPS",
    "NO_DATA_RANGES",
    "OpStat",
    "ProfileSummary",
    "check_args",
    "check_counts",
    "checklist",
    "entrypoint_function",
    "isolated_job",
    "ncu_command",
    "nsys_command",
    "profile_job",
    "summarize",
]
