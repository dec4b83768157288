"""What is holding a job back, read from its DCGM series, with the evidence for each finding.

Every rule looks at a per-GPU condition smoothed over ``window_s`` and reports it only when it
holds for ``min_duration_s`` without a break, so that a short dip does not flap. Thresholds and
where they come from:

* ``sm_active_low``: ``PROF_SM_ACTIVE`` below 0.5. DCGM user guide, Profiling Metrics: 0.8 or more
  is necessary but not sufficient for effective use; below 0.5 likely indicates ineffective use.
* ``dram_heavy`` / ``memory_bandwidth_bound``: ``PROF_DRAM_ACTIVE`` at or above 0.5 (heavy use) and
  at or above 0.8 (about the practical peak; the guide notes 1.0 is a DRAM access every cycle, which
  real kernels do not reach). Utilisation alone hides this: a job can show 85% ``GPU_UTIL``.
* ``tensor_idle``: ``PIPE_TENSOR_ACTIVE`` below 0.1 while ``SM_ACTIVE`` is at least 0.5 on a
  bf16/fp16/fp8 job; the 0.1 is gpufleet's heuristic (matmul-dominated training in those types keeps
  the tensor pipe well above it), not a DCGM figure.
* ``comm_bound``: NVLink + PCIe traffic above ``link_busy_bytes_per_s`` while ``SM_ACTIVE`` < 0.5,
  during at least 30% of the window (collectives come in bursts); gpufleet heuristic.
* ``host_bound``: ``GPU_UTIL`` gaps (below 10%) for 10-90% of the window with ``SM_ACTIVE`` < 0.5:
  the GPU waits for the host between steps. ``data_loading_slow``: data loading above 5% of step
  time, when the runtime measured it (published practice, e.g. PyTorch performance tuning guides).
* ``hw_slowdown``, ``thermal_throttle``, ``power_throttle``: clock-event bits 0x8; 0x20 or 0x40;
  0x4 or 0x80 (NVML ``nvmlClocksEventReasons``) set for at least half the window.
* ``oom_risk``: framebuffer used above 95% of used + free during 90% of the window, or allocator
  retries (``torch.cuda.memory_stats()["num_alloc_retries"]``) above zero.
* ``gpu_idle``: ``GPU_UTIL`` at 0 for ``idle_window_s`` (60 minutes by default).
* ``xid_error``: a non-zero ``DEV_XID_ERRORS`` (NVIDIA XID catalogue).

A finding that names a cause hides the generic symptom it explains (``SUPERSEDES``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from gpufleet.errors import ParameterError, UsageError
from gpufleet.telemetry.dcgm import ClocksEventReason as CER
from gpufleet.telemetry.dcgm import Sample

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
Severity = Literal["info", "warning", "critical"]

SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
CLOCKS_EVENT_REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
LINK_METRICS = (
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)
LOW_PRECISION = frozenset({"bf16", "fp16", "fp8"})


@dataclass(frozen=True, slots=True)
class JobSeries:
    """A job's DCGM series: each metric an array of shape (len(gpus), samples), NaN where missing."""

    step_s: float
    gpus: tuple[str, ...]
    metrics: Mapping[str, FloatArray]

    def __post_init__(self) -> None:
        if not self.step_s > 0:
            raise UsageError(f"step_s={self.step_s} must be positive")
        for name, arr in self.metrics.items():
            if arr.ndim != 2 or arr.shape[0] != len(self.gpus):
                raise UsageError(f"{name} has shape {arr.shape}; expected ({len(self.gpus)}, samples)")

    @property
    def duration_s(self) -> float:
        """Seconds covered by the longest metric."""
        return max((a.shape[1] for a in self.metrics.values()), default=0) * self.step_s


MAX_SAMPLE_VALUE = 2.0**63
"""Above any DCGM field (byte counters, bit masks), and what a clock-event mask must stay below to fit an int64."""
MAX_TIMESTAMP_MS = 10**14
"""Sample times are Unix milliseconds: anything past the year 5000 is a broken sample."""


def _usable(sample: Sample) -> bool:
    """Whether a sample's value and time can enter the rules' arithmetic.

    NaN is an unknown value, as a missing sample is; an infinity or a negative value is no DCGM
    reading (every field is a count, a ratio, a size or a mask): such samples are left out.
    """
    t = sample.timestamp_ms
    return 0 <= sample.value < MAX_SAMPLE_VALUE and (t is None or 0 <= t <= MAX_TIMESTAMP_MS)


MAX_GPU_SERIES = 4096
"""Most distinct ``gpu`` labels one diagnosis takes (a large fleet's job, many times over)."""
MAX_TIMESTAMPS = 1 << 20
"""Most distinct sample times one diagnosis takes: 12 days at one sample a second."""
MAX_SERIES_CELLS = 1 << 23
"""Most GPU x time cells over all metrics (64 MiB of float64): the rules work on dense arrays."""


def _check_bounds(n_gpus: int, n_times: int, n_metrics: int) -> None:
    """A :class:`UsageError` before allocating, when the series would not fit the dense arrays."""
    if n_gpus > MAX_GPU_SERIES:
        raise UsageError(
            f"more than {MAX_GPU_SERIES} GPU series ({n_gpus} distinct gpu labels) in the samples: "
            "diagnose one job or a few nodes at a time (filter by hpc_job)"
        )
    if n_times > MAX_TIMESTAMPS:
        raise UsageError(
            f"more than {MAX_TIMESTAMPS} distinct sample times ({n_times}) in the samples: "
            "diagnose a shorter stretch, or downsample the scrapes"
        )
    cells = n_gpus * n_times * n_metrics
    if cells > MAX_SERIES_CELLS:
        raise UsageError(
            f"{n_metrics} metric(s) x {n_gpus} GPU series x {n_times} sample times is {cells} values, "
            f"more than the {MAX_SERIES_CELLS} one diagnosis takes: diagnose fewer GPUs or a shorter stretch "
            "(GPUs scraped at different times do not share a time axis; align the scrapes)"
        )


def series_from_samples(samples: Iterable[Sample], *, job: str | None = None, step_s: float | None = None) -> JobSeries:
    """Samples (e.g. parsed scrapes) as a ``JobSeries``, keeping those of ``job`` (label ``hpc_job``).

    Samples without a ``gpu`` label cannot be placed and are dropped (the parser already warned), as
    are values no GPU reports (NaN, infinities, negative numbers) and times out of range.
    Without ``step_s`` the step is the median gap between timestamps, or 1 s.
    """
    rows: dict[str, dict[str, dict[int, float]]] = {}
    times: set[int] = set()
    for i, s in enumerate(samples):
        gpu = s.labels.get("gpu")
        if gpu is None or (job is not None and s.labels.get("hpc_job") != job) or not _usable(s):
            continue
        t = s.timestamp_ms if s.timestamp_ms is not None else i
        rows.setdefault(s.name, {}).setdefault(gpu, {})[t] = s.value
        times.add(t)
    gpus = tuple(sorted({g for per in rows.values() for g in per}, key=lambda g: (len(g), g)))
    _check_bounds(len(gpus), len(times), len(rows))
    order = sorted(times)
    index = {t: k for k, t in enumerate(order)}
    if step_s is None:
        gaps = np.diff(np.array(order, dtype=np.float64)) / 1000.0
        step_s = float(np.median(gaps)) if gaps.size else 1.0
    metrics: dict[str, FloatArray] = {}
    for name, per_gpu in rows.items():
        arr = np.full((len(gpus), len(order)), np.nan)
        for g, gpu in enumerate(gpus):
            for t, v in per_gpu.get(gpu, {}).items():
                arr[g, index[t]] = v
        metrics[name] = arr
    return JobSeries(step_s=step_s, gpus=gpus, metrics=metrics)


MAX_WINDOW_S = 365 * 86400.0
"""Longest window or duration a :class:`DiagnosisConfig` takes: a year."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DiagnosisConfig:
    """Windows and thresholds; the defaults are the sourced values in the module docstring."""

    window_s: float = 60.0
    """Conditions are averaged over this trailing window before they count."""
    min_duration_s: float = 300.0
    """A smoothed condition must hold this long without a break to become a finding."""
    idle_window_s: float = 3600.0
    """``GPU_UTIL`` at 0 this long is an idle GPU."""
    sm_active_low: float = 0.5
    dram_heavy: float = 0.5
    dram_bound: float = 0.8
    tensor_low: float = 0.1
    link_busy_bytes_per_s: float = 100e9
    util_gap_pct: float = 10.0
    data_loading_max_fraction: float = 0.05
    fb_used_max_fraction: float = 0.95

    def __post_init__(self) -> None:
        for name in ("window_s", "min_duration_s", "idle_window_s"):
            if not 0 < getattr(self, name) <= MAX_WINDOW_S:  # also NaN and infinity
                raise ParameterError(
                    f"{{{name}}} must be positive seconds, at most a year (31536000)", **{name: getattr(self, name)}
                )


@dataclass(frozen=True, kw_only=True, slots=True)
class JobContext:
    """What the runtime knows about the job beyond DCGM."""

    precision: str | None = None
    """Training dtype (``bf16``, ``fp16``, ``fp8``, ``fp32``); ``tensor_idle`` needs a low one."""
    data_loading_fraction: float | None = None
    """Share of step time spent waiting for data, when the runtime measured it."""
    allocator_retries: int | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """What a finding means, independent of the numbers that triggered it."""

    title: str
    severity: Severity
    source: str
    suggestion: str


RULES: Mapping[str, Rule] = {
    "sm_active_low": Rule(
        "SMs mostly idle",
        "warning",
        "DCGM user guide, Profiling Metrics: SM_ACTIVE < 0.5 likely indicates ineffective GPU use",
        "Increase batch size or work per kernel; check what the GPU waits on (profile the step).",
    ),
    "dram_heavy": Rule(
        "Heavy memory traffic",
        "info",
        "DCGM user guide, Profiling Metrics: DRAM_ACTIVE >= 0.5 is heavy use",
        "Fuse element-wise ops (torch.compile) to cut memory round trips.",
    ),
    "memory_bandwidth_bound": Rule(
        "Memory-bandwidth bound",
        "warning",
        "DCGM user guide, Profiling Metrics: DRAM_ACTIVE ~0.8 is the practical peak",
        "Fuse kernels, use flash attention, raise arithmetic intensity (bigger matmuls, fewer casts).",
    ),
    "tensor_idle": Rule(
        "Tensor cores idle on a low-precision job",
        "warning",
        "gpufleet heuristic: PIPE_TENSOR_ACTIVE < 0.1 with SM_ACTIVE >= 0.5 on bf16/fp16/fp8",
        "Check matmuls run in bf16/fp16 (autocast), dimensions are multiples of 8/16, no fp32 fallback.",
    ),
    "comm_bound": Rule(
        "Communication bound",
        "warning",
        "gpufleet heuristic: NVLink+PCIe above link_busy_bytes_per_s while SM_ACTIVE < 0.5",
        "Overlap communication with compute, bucket gradients, check NCCL topology and NCCL_ALGO.",
    ),
    "host_bound": Rule(
        "Host or data-loader bound",
        "warning",
        "gpufleet heuristic: GPU_UTIL gaps in 10-90% of the window with SM_ACTIVE < 0.5",
        "More DataLoader workers, pin_memory, prefetch; move preprocessing off the training loop.",
    ),
    "data_loading_slow": Rule(
        "Data loading above 5% of step time",
        "warning",
        "published practice: data loading should stay under ~5% of step time",
        "More DataLoader workers, prefetch_factor, faster storage or a local cache.",
    ),
    "hw_slowdown": Rule(
        "Hardware slowdown",
        "critical",
        "NVML nvmlClocksEventReasons 0x8 HW_SLOWDOWN",
        "Check cooling and power delivery of the node; report it to the provider.",
    ),
    "thermal_throttle": Rule(
        "Thermal throttling",
        "warning",
        "NVML nvmlClocksEventReasons 0x20 SW_THERMAL_SLOWDOWN, 0x40 HW_THERMAL_SLOWDOWN",
        "Check the node's cooling and airflow; move the job to another node.",
    ),
    "power_throttle": Rule(
        "Power capped",
        "info",
        "NVML nvmlClocksEventReasons 0x4 SW_POWER_CAP, 0x80 HW_POWER_BRAKE_SLOWDOWN",
        "Check the power limit (nvidia-smi -q -d POWER); expected on some heavy kernels.",
    ),
    "oom_risk": Rule(
        "Out-of-memory risk",
        "warning",
        "published practice: framebuffer used > 95% sustained, or allocator retries > 0",
        "Activation checkpointing, smaller micro-batch, FSDP/ZeRO sharding, set expandable_segments.",
    ),
    "gpu_idle": Rule(
        "GPU idle",
        "warning",
        "published practice: 0% GPU_UTIL for 60 minutes is an idle allocation",
        "Release the GPUs or find what the job waits on.",
    ),
    "xid_error": Rule(
        "XID error",
        "critical",
        "NVIDIA XID error catalogue (DCGM_FI_DEV_XID_ERRORS is the last XID seen)",
        "Look the XID up; drain the node if it is a hardware XID (48, 63, 64, 79, 94, 95).",
    ),
}

SUPERSEDES: Mapping[str, tuple[str, ...]] = {
    "gpu_idle": ("sm_active_low", "host_bound", "comm_bound"),
    "comm_bound": ("sm_active_low",),
    "host_bound": ("sm_active_low",),
    "memory_bandwidth_bound": ("dram_heavy",),
    "thermal_throttle": ("hw_slowdown",),
    "power_throttle": ("hw_slowdown",),
}
"""A cause that explains a symptom hides it; the cause's finding carries the evidence."""

_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One diagnosis with its evidence."""

    rule_id: str
    title: str
    metric: str
    observed: float
    statistic: str
    """How ``observed`` was computed (median over the sustained span, fraction of time...)."""
    comparison: str
    threshold: float
    duration_s: float
    gpus: tuple[str, ...]
    severity: Severity
    source: str
    suggestion: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def _rolling_mean(x: FloatArray, window: int) -> FloatArray:
    """Trailing mean over ``window`` samples per row, ignoring NaN; NaN where nothing is known."""
    valid = ~np.isnan(x)
    zero = np.zeros((x.shape[0], 1))
    csum = np.concatenate([zero, np.cumsum(np.where(valid, x, 0.0), axis=1)], axis=1)
    ccnt = np.concatenate([zero, np.cumsum(valid, axis=1, dtype=np.float64)], axis=1)
    hi = np.arange(1, x.shape[1] + 1)
    lo = np.maximum(hi - window, 0)
    total, count = csum[:, hi] - csum[:, lo], ccnt[:, hi] - ccnt[:, lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(count > 0, total / np.maximum(count, 1.0), np.nan)
    return out


def _longest_runs(mask: BoolArray) -> npt.NDArray[np.int64]:
    """Length of the longest run of True in each row."""
    if mask.shape[1] == 0:
        return np.zeros(mask.shape[0], dtype=np.int64)
    idx = np.arange(mask.shape[1], dtype=np.int64)
    last_false = np.maximum.accumulate(np.where(mask, -1, idx[np.newaxis, :]), axis=1)
    best: npt.NDArray[np.int64] = (idx[np.newaxis, :] - last_false).max(axis=1)
    return best


class _Diagnoser:
    """Holds one job's series and settings while the rules run over it."""

    def __init__(self, series: JobSeries, config: DiagnosisConfig) -> None:
        self.s, self.cfg = series, config
        self.window = max(1, round(config.window_s / series.step_s))
        self.min_steps = max(1, math.ceil(config.min_duration_s / series.step_s))

    def smooth(self, x: FloatArray) -> FloatArray:
        return _rolling_mean(x, self.window)

    def fraction(self, cond: BoolArray, known: FloatArray) -> FloatArray:
        """Share of the window where ``cond`` holds, among samples where ``known`` is not NaN."""
        return self.smooth(np.where(np.isnan(known), np.nan, cond.astype(np.float64)))

    def finding(
        self,
        rule_id: str,
        active: BoolArray,
        values: FloatArray,
        *,
        metric: str,
        comparison: str,
        threshold: float,
        statistic: str = "median over the sustained span",
        min_steps: int | None = None,
    ) -> Finding | None:
        """A finding when ``active`` holds ``min_steps`` in a row on some GPU; else ``None``."""
        runs = _longest_runs(active)
        flagged = runs >= (self.min_steps if min_steps is None else min_steps)
        if not flagged.any():
            return None
        picked = values[flagged][active[flagged]]
        picked = picked[~np.isnan(picked)]
        rule = RULES[rule_id]
        return Finding(
            rule_id=rule_id,
            title=rule.title,
            metric=metric,
            observed=float(np.median(picked)) if picked.size else math.nan,
            statistic=statistic,
            comparison=comparison,
            threshold=threshold,
            duration_s=float(runs.max()) * self.s.step_s,
            gpus=tuple(g for g, f in zip(self.s.gpus, flagged, strict=True) if f),
            severity=rule.severity,
            source=rule.source,
            suggestion=rule.suggestion,
        )

    def get(self, name: str) -> FloatArray | None:
        return self.s.metrics.get(name)

    def run(self, context: JobContext) -> list[Finding]:
        c, out = self.cfg, []
        sm, util, dram, tensor = self.get(SM_ACTIVE), self.get(GPU_UTIL), self.get(DRAM_ACTIVE), self.get(TENSOR_ACTIVE)
        sm_s = self.smooth(sm) if sm is not None else None
        if sm is not None and sm_s is not None:
            out.append(
                self.finding(
                    "sm_active_low",
                    sm_s < c.sm_active_low,
                    sm_s,
                    metric=SM_ACTIVE,
                    comparison="<",
                    threshold=c.sm_active_low,
                )
            )
        if dram is not None:
            dram_s = self.smooth(dram)
            for rule_id, thr in (("memory_bandwidth_bound", c.dram_bound), ("dram_heavy", c.dram_heavy)):
                out.append(
                    self.finding(rule_id, dram_s >= thr, dram_s, metric=DRAM_ACTIVE, comparison=">=", threshold=thr)
                )
        if tensor is not None and sm_s is not None and (context.precision or "").lower() in LOW_PRECISION:
            tensor_s = self.smooth(tensor)
            active = (tensor_s < c.tensor_low) & (sm_s >= c.sm_active_low)
            out.append(
                self.finding(
                    "tensor_idle", active, tensor_s, metric=TENSOR_ACTIVE, comparison="<", threshold=c.tensor_low
                )
            )
        links = [a for a in (self.get(n) for n in LINK_METRICS) if a is not None]
        if links and sm is not None:
            traffic = np.nansum(np.stack(links), axis=0)
            cond = (traffic >= c.link_busy_bytes_per_s) & (sm < c.sm_active_low)
            frac = self.fraction(cond, sm)
            out.append(
                self.finding(
                    "comm_bound",
                    frac >= 0.3,
                    np.where(cond, traffic, np.nan),
                    metric="NVLINK+PCIE TX+RX bytes/s",
                    comparison=">=",
                    threshold=c.link_busy_bytes_per_s,
                )
            )
        if util is not None:
            gaps = self.fraction(util < c.util_gap_pct, util)
            active = (gaps >= 0.1) & (gaps < 0.9)
            if sm_s is not None:
                active &= sm_s < c.sm_active_low
            out.append(
                self.finding(
                    "host_bound",
                    active,
                    gaps,
                    metric=GPU_UTIL,
                    comparison=">=",
                    threshold=0.1,
                    statistic=f"median share of the window with util < {c.util_gap_pct:g}%",
                )
            )
            idle_steps = max(1, math.ceil(c.idle_window_s / self.s.step_s))
            out.append(
                self.finding(
                    "gpu_idle", util <= 0, util, metric=GPU_UTIL, comparison="<=", threshold=0.0, min_steps=idle_steps
                )
            )
        out.extend(self._clock_events())
        out.extend(self._memory(context))
        out.extend(self._context(context))
        return self._prune([f for f in out if f is not None])

    def _clock_events(self) -> list[Finding | None]:
        bits = self.get(CLOCKS_EVENT_REASONS)
        if bits is None:
            return []
        ints = np.where(np.isnan(bits), 0, bits).astype(np.int64)
        out: list[Finding | None] = []
        for rule_id, mask in (
            ("hw_slowdown", CER.HW_SLOWDOWN),
            ("thermal_throttle", CER.SW_THERMAL_SLOWDOWN | CER.HW_THERMAL_SLOWDOWN),
            ("power_throttle", CER.SW_POWER_CAP | CER.HW_POWER_BRAKE_SLOWDOWN),
        ):
            frac = self.fraction((ints & int(mask)) != 0, bits)
            out.append(
                self.finding(
                    rule_id,
                    frac >= 0.5,
                    frac,
                    metric=f"{CLOCKS_EVENT_REASONS} & {int(mask):#x}",
                    comparison=">=",
                    threshold=0.5,
                    statistic="median share of the window with the bits set",
                )
            )
        return out

    def _memory(self, context: JobContext) -> list[Finding | None]:
        used, free = self.get(FB_USED), self.get(FB_FREE)
        out: list[Finding | None] = []
        if used is not None and free is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                share = used / (used + free)
            frac = self.fraction(share > self.cfg.fb_used_max_fraction, share)
            out.append(
                self.finding(
                    "oom_risk",
                    frac >= 0.9,
                    share,
                    metric=f"{FB_USED} / ({FB_USED} + {FB_FREE})",
                    comparison=">",
                    threshold=self.cfg.fb_used_max_fraction,
                )
            )
        if context.allocator_retries and not any(out):
            rule = RULES["oom_risk"]
            out.append(
                Finding(
                    rule_id="oom_risk",
                    title=rule.title,
                    metric="num_alloc_retries",
                    observed=float(context.allocator_retries),
                    statistic="count",
                    comparison=">",
                    threshold=0.0,
                    duration_s=self.s.duration_s,
                    gpus=self.s.gpus,
                    severity=rule.severity,
                    source=rule.source,
                    suggestion=rule.suggestion,
                )
            )
        xid = self.get(XID_ERRORS)
        if xid is not None:
            out.append(
                self.finding(
                    "xid_error",
                    xid > 0,
                    xid,
                    metric=XID_ERRORS,
                    comparison=">",
                    threshold=0.0,
                    statistic="median XID code",
                    min_steps=1,
                )
            )
        return out

    def _context(self, context: JobContext) -> list[Finding]:
        frac, limit = context.data_loading_fraction, self.cfg.data_loading_max_fraction
        if frac is None or frac <= limit:
            return []
        rule = RULES["data_loading_slow"]
        return [
            Finding(
                rule_id="data_loading_slow",
                title=rule.title,
                metric="data_loading_fraction",
                observed=frac,
                statistic="share of step time",
                comparison=">",
                threshold=limit,
                duration_s=self.s.duration_s,
                gpus=self.s.gpus,
                severity=rule.severity,
                source=rule.source,
                suggestion=rule.suggestion,
            )
        ]

    @staticmethod
    def _prune(findings: list[Finding]) -> list[Finding]:
        found = {f.rule_id for f in findings}
        hidden = {h for r in found for h in SUPERSEDES.get(r, ())}
        kept = [f for f in findings if f.rule_id not in hidden]
        order = list(RULES)
        return sorted(kept, key=lambda f: (_SEVERITY_ORDER[f.severity], order.index(f.rule_id)))


def diagnose(
    series: JobSeries, context: JobContext | None = None, config: DiagnosisConfig | None = None
) -> list[Finding]:
    """Findings for one job, most severe first; an empty list for a healthy job."""
    return _Diagnoser(series, config or DiagnosisConfig()).run(context or JobContext())


__all__ = [
    "CLOCKS_EVENT_REASONS",
    "DRAM_ACTIVE",
    "FB_FREE",
    "FB_USED",
    "GPU_UTIL",
    "LINK_METRICS",
    "LOW_PRECISION",
    "MAX_GPU_SERIES",
    "MAX_SAMPLE_VALUE",
    "MAX_SERIES_CELLS",
    "MAX_TIMESTAMPS",
    "MAX_TIMESTAMP_MS",
    "MAX_WINDOW_S",
    "RULES",
    "SM_ACTIVE",
    "SUPERSEDES",
    "TENSOR_ACTIVE",
    "XID_ERRORS",
    "BoolArray",
    "DiagnosisConfig",
    "Finding",
    "FloatArray",
    "JobContext",
    "JobSeries",
    "Rule",
    "Severity",
    "diagnose",
    "series_from_samples",
]
