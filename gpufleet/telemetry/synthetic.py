"""DCGM-shaped series for one job on N GPUs, following a chosen pattern, from a seed.

The series use dcgm-exporter's metric names and labels (``gpu``, ``UUID``, ``pci_bus_id``,
``device``, ``modelName``, ``hostname``, ``hpc_job``), so the dashboards, alert rules and
``diagnose`` that read a real fleet read these too. Each pattern moves the metrics the way the
DCGM user guide's profiling-metrics section describes the corresponding bottleneck:

==================  ===========================================================================
healthy             SM_ACTIVE ~0.85, tensor pipe ~0.45, DRAM ~0.35, util ~99%, no clock events
tensor_idle         SM_ACTIVE ~0.8 but PIPE_TENSOR_ACTIVE ~0.02 (a bf16 job doing fp32 matmuls)
memory_bound        DRAM_ACTIVE ~0.9 (>= 0.8, the practical peak), SM_ACTIVE ~0.65
comm_bound          12 s of every 20: NVLink ~180 GB/s each way, SM_ACTIVE ~0.15, util 100%
host_bound          5 s of every 10: util 0, SM_ACTIVE 0 (the GPU waits for the next batch)
thermal_throttle    GPU_TEMP ~90 C, clock-event bit 0x20 (SW thermal slowdown)
power_throttle      power at the cap, clock-event bit 0x4 (SW power cap)
oom_risk            FB_USED ~97% of the framebuffer
idle                util 0, SM 0, clock-event bit 0x1 (GPU idle)
==================  ===========================================================================

Clock-event bits are NVML's ``nvmlClocksEventReasons`` (see ``ClocksEventReason``).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

import numpy as np

from gpufleet.errors import ParameterError, UsageError
from gpufleet.spec.gpu_source import PATTERNS, Pattern
from gpufleet.telemetry.dcgm import ClocksEventReason as CER
from gpufleet.telemetry.dcgm import Sample
from gpufleet.telemetry.diagnose import FloatArray, JobSeries

MAX_GPUS = 1024
"""Most GPUs of one synthetic job."""
MAX_DURATION_S = 7 * 86400.0
"""Longest synthetic job: a week."""
MAX_POINTS = 2_000_000
"""Most GPU-steps (GPUs x time steps) of one synthetic job's arrays: 16 float64 series each, about 256 MB
(e.g. 1024 GPUs for 2,000 steps, or 8 GPUs for 69 h at 1 s steps)."""
MAX_SAMPLE_POINTS = 100_000
"""Most GPU-steps :func:`generate_samples` turns into :class:`Sample` objects (16 per GPU-step, about
7 kB): 8 GPUs for about 3.5 h at 1 s steps, under 1 GB."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SyntheticJobConfig:
    """One synthetic job: pattern, shape of the fleet, and the seed."""

    pattern: Pattern = "healthy"
    gpus: int = 8
    duration_s: float = 600.0
    step_s: float = 1.0
    seed: int = 0
    job: str = "synthetic-job"
    hostname: str = "node-0"
    model_name: str = "NVIDIA H100 80GB HBM3"
    fb_total_mib: float = 81559.0
    power_cap_w: float = 700.0
    start_ms: int = 1_700_000_000_000

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise UsageError(f"unknown pattern {self.pattern!r}; choose one of {', '.join(PATTERNS)}")
        if not 1 <= self.gpus <= MAX_GPUS:
            raise ParameterError(f"{{gpus}} must be in [1, {MAX_GPUS}]: give the synthetic job's GPUs", gpus=self.gpus)
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ParameterError("{step_s} must be a finite number of seconds > 0", step_s=self.step_s)
        if not self.step_s <= self.duration_s <= MAX_DURATION_S:  # also NaN
            raise ParameterError(
                "{duration_s} must be at least one step ({step_s}) and at most a week (604800 s)",
                duration_s=self.duration_s,
                step_s=self.step_s,
            )
        _require_points(self, MAX_POINTS)
        if self.seed < 0:
            raise ParameterError("{seed} must be >= 0: numpy seeds are non-negative", seed=self.seed)


def _require_points(config: SyntheticJobConfig, limit: int) -> None:
    steps = config.duration_s / config.step_s  # inf for a step near 0: compared, never rounded
    if not math.isfinite(steps) or config.gpus * round(steps) > limit:
        raise ParameterError(
            f"{{gpus}} for {{duration_s}} at {{step_s}} is more than {limit:,} GPU-steps: "
            "shorten the job, lengthen the step or use fewer GPUs",
            gpus=config.gpus,
            duration_s=config.duration_s,
            step_s=config.step_s,
        )


@dataclass(frozen=True, slots=True)
class SyntheticJob:
    """The generated series and the labels of each GPU."""

    config: SyntheticJobConfig
    series: JobSeries
    gpu_labels: tuple[dict[str, str], ...]

    @property
    def n_times(self) -> int:
        return round(self.config.duration_s / self.config.step_s)

    def samples_at(self, index: int) -> list[Sample]:
        """Every metric of every GPU at one time step, as a dcgm-exporter scrape would show it."""
        ts = self.config.start_ms + round(index * self.config.step_s * 1000)
        return [
            Sample(name, dict(labels), float(arr[g, index]), ts)
            for name, arr in self.series.metrics.items()
            for g, labels in enumerate(self.gpu_labels)
        ]

    def samples(self) -> list[Sample]:
        """The whole run, time step by time step."""
        return [s for i in range(self.n_times) for s in self.samples_at(i)]


def _phase(t: FloatArray, period: float, on: float) -> FloatArray:
    """1.0 during the first ``on`` seconds of every ``period``, else 0.0."""
    return ((t % period) < on).astype(np.float64)


def synthesize(config: SyntheticJobConfig) -> SyntheticJob:
    """Series for ``config.pattern``; the same config gives the same numbers."""
    rng = np.random.default_rng(config.seed)
    n, shape = config.gpus, (config.gpus, round(config.duration_s / config.step_s))
    t = np.broadcast_to(np.arange(shape[1]) * config.step_s, shape)

    def noisy(mean: float | FloatArray, sd: float) -> FloatArray:
        return np.asarray(mean + rng.normal(0.0, sd, shape), dtype=np.float64)

    p, total = config.pattern, config.fb_total_mib
    sm, tensor, dram = noisy(0.85, 0.03), noisy(0.45, 0.05), noisy(0.35, 0.05)
    occupancy, util = noisy(0.45, 0.03), noisy(99.0, 1.0)
    nvlink, pcie = noisy(30e9, 5e9), noisy(2e9, 0.3e9)
    fb_used, power, temp = noisy(0.7 * total, 200.0), noisy(550.0, 20.0), noisy(65.0, 2.0)
    events = np.zeros(shape)
    if p == "tensor_idle":
        sm, tensor = noisy(0.8, 0.03), noisy(0.02, 0.01)
    elif p == "memory_bound":
        sm, tensor, dram = noisy(0.65, 0.03), noisy(0.15, 0.03), noisy(0.9, 0.03)
    elif p == "comm_bound":
        comm = _phase(t, 20.0, 12.0)
        sm = np.where(comm > 0, noisy(0.15, 0.03), sm)
        tensor = np.where(comm > 0, noisy(0.02, 0.01), tensor)
        nvlink = np.where(comm > 0, noisy(180e9, 10e9), nvlink)
        util = np.where(comm > 0, 100.0, util)
    elif p == "host_bound":
        gap = _phase(t, 10.0, 5.0)
        sm, tensor, dram = (np.where(gap > 0, 0.0, a) for a in (sm, tensor, dram))
        util, power = np.where(gap > 0, 0.0, util), np.where(gap > 0, noisy(120.0, 5.0), power)
    elif p == "thermal_throttle":
        temp, events = noisy(90.0, 1.5), np.full(shape, float(CER.SW_THERMAL_SLOWDOWN))
    elif p == "power_throttle":
        power = np.minimum(noisy(config.power_cap_w - 3.0, 2.0), config.power_cap_w)
        events = np.full(shape, float(CER.SW_POWER_CAP))
    elif p == "oom_risk":
        fb_used = np.minimum(noisy(0.97 * total, 100.0), total)
    elif p == "idle":
        sm, tensor, dram, occupancy, util = (np.zeros(shape) for _ in range(5))
        nvlink, pcie, fb_used = np.zeros(shape), noisy(1e6, 1e5), noisy(600.0, 5.0)
        power, temp, events = noisy(70.0, 2.0), noisy(35.0, 1.0), np.full(shape, float(CER.GPU_IDLE))

    def clean(x: FloatArray, lo: float, hi: float | None = None, decimals: int = 0) -> FloatArray:
        return np.asarray(np.round(np.clip(x, lo, hi), decimals), dtype=np.float64)

    ratio = {"SM_ACTIVE": sm, "SM_OCCUPANCY": occupancy, "PIPE_TENSOR_ACTIVE": tensor, "DRAM_ACTIVE": dram}
    metrics: dict[str, FloatArray] = {f"DCGM_FI_PROF_{k}": clean(v, 0, 1, 4) for k, v in ratio.items()}
    for link, arr in (("PCIE", pcie), ("NVLINK", nvlink)):
        for direction in ("TX", "RX"):
            metrics[f"DCGM_FI_PROF_{link}_{direction}_BYTES"] = clean(arr, 0)
    fb_used = clean(fb_used, 0, total)
    power = clean(power, 0, None, 3)
    metrics |= {
        "DCGM_FI_DEV_GPU_UTIL": clean(util, 0, 100),
        "DCGM_FI_DEV_FB_USED": fb_used,
        "DCGM_FI_DEV_FB_FREE": total - fb_used,
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_GPU_TEMP": clean(temp, -273),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": events,
        "DCGM_FI_DEV_XID_ERRORS": np.zeros(shape),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": clean(np.cumsum(power * config.step_s * 1000.0, axis=1), 0),
    }
    labels = tuple(
        {
            "gpu": str(g),
            "UUID": f"GPU-{uuid.UUID(bytes=rng.bytes(16))}",
            "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0",
            "device": f"nvidia{g}",
            "modelName": config.model_name,
            "hostname": config.hostname,
            "hpc_job": config.job,
        }
        for g in range(n)
    )
    series = JobSeries(step_s=config.step_s, gpus=tuple(str(g) for g in range(n)), metrics=metrics)
    return SyntheticJob(config=config, series=series, gpu_labels=labels)


def generate_samples(config: SyntheticJobConfig) -> list[Sample]:
    """All samples of a synthetic job at ``config.step_s`` resolution (at most ``MAX_SAMPLE_POINTS`` GPU-steps)."""
    _require_points(config, MAX_SAMPLE_POINTS)
    return synthesize(config).samples()


__all__ = [
    "MAX_DURATION_S",
    "MAX_GPUS",
    "MAX_POINTS",
    "MAX_SAMPLE_POINTS",
    "PATTERNS",
    "Pattern",
    "SyntheticJob",
    "SyntheticJobConfig",
    "generate_samples",
    "synthesize",
]
