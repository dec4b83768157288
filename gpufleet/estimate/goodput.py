"""Goodput of one synchronous training job on N GPUs: the share of wall time that trains.

A synchronous job stops whenever any of its GPUs (or hosts, switches, the software) fails: every
interruption throws away the work done since the last checkpoint, then the job pays a restart (and a
restore, and for a broken node a reschedule) before it computes again. Periodic checkpoints bound the
lost work but stall the job while they save. This module models that trade-off with two engines
that must agree on exponential failures.

The model
---------
Interruptions arrive as a Poisson process of rate ``Λ = Σ λ_c`` over the causes ``c`` of a
failure mix: unexpected causes share ``N / gpu_mtbf`` (so the job's MTBF falls as ``1/N``), planned
interruptions come at a job-level rate (maintenance does not scale with the GPU count). The work
``T_s`` is cut into intervals of ``τ`` seconds of compute, each followed by a save that stalls the
job ``δ`` seconds. An interruption during compute or save loses everything since the last completed
checkpoint; then cause ``c`` costs ``R_c = restart + restore (+ reschedule if it needs a new node)``,
and an interruption during a restart starts a new restart (the cause that came first is charged
with the whole sequence). A planned interruption with *save on signal* instead saves at the signal
(``δ_sig``, not interrupted), keeps its work, and the interval starts again after the restart.

Daly's closed form (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for
restart dumps", Future Generation Computer Systems 22(3), 2006), for one cause of restart ``R`` and
``M = 1/Λ``, is the exact expected wall time of this process::

    T_w = M e^(R/M) (e^((τ+δ)/M) - 1) T_s / τ

:func:`analytic` generalises it by renewal-reward over the cycles between checkpoints: with several
causes ``e^(R/M)`` becomes ``1 / Σ_c (λ_c/Λ) e^(-Λ R_c)`` (the expected length of a chain of
restarts), and save-on-signal causes end a cycle with their progress kept. With one cause and no
signal it *is* the formula above (:func:`daly_wall_time`). The interval ``auto`` is Daly's
higher-order optimum ``τ = √(2δM)·[1 + ⅓√(δ/2M) + ⅑(δ/2M)] - δ`` (``τ = M`` once ``δ ≥ 2M``),
which refines Young's first-order ``√(2δM)`` (J. W. Young, "A first order approximation to the
optimum checkpoint interval", Communications of the ACM 17(9), 1974; computed by
:func:`gpufleet.estimate.interval.young_daly_interval`); ``M`` is then the MTBF of the
interruptions that lose work.

:func:`monte_carlo` simulates whole runs, seeded, vectorised over trials (one numpy step per
interruption, arrays over the trials): same model, any inter-arrival distribution. With
``weibull_shape = 1`` it agrees with :func:`analytic` within sampling error (well under 1 % for a
long run and 1,000 trials; the engines differ only by the last, shorter interval of a run); with
another shape the job's interruptions form a Weibull renewal process of the same mean (shape < 1:
clustered failures, the common finding on large clusters).

Hot spares
----------
``spares`` nodes stand by; a failure that needs a new node takes a spare (``spare_swap_seconds``
instead of ``reschedule_seconds``) when one is free. Failed nodes come back after
``spare_repair_hours``, so the nodes out for repair are Poisson (an M/G/∞ queue) and a failure finds
a spare with probability ``P(Poisson(λ_r · repair) < spares)``; each such cause is split into a
"spare" and a "no spare" branch of those probabilities, exactly, in both engines.

The Llama 3 mix
---------------
:data:`LLAMA3` is Table 5 of Meta's "The Llama 3 Herd of Models" (arXiv:2407.21783, section 3.3.4):
466 interruptions of the 405B pre-training on 16,384 H100 GPUs over a 54-day snapshot, 47 planned
and 419 unexpected, by root cause. The paper reports more than 90 % effective training time; it
gives no save stall, restart or reschedule time, so those are inputs here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.errors import ParameterError, UsageError
from gpufleet.estimate.interval import young_daly_interval

Engine = Literal["analytic", "montecarlo"]
ENGINES: tuple[Engine, ...] = ("analytic", "montecarlo")

SECONDS_PER_HOUR = 3600.0
MAX_GPUS = 10_000_000
"""Most GPUs one job may have (a hundred times today's largest runs)."""
MAX_TRIALS = 100_000
"""Most Monte Carlo trials."""
MAX_SECONDS = 1e9
"""Longest save, restart, restore, reschedule or interval, in seconds (about 32 years)."""
MAX_HOURS = 1e12
"""Longest MTBF or repair time, in hours."""
MAX_WORK_HOURS = 1e6
"""Most hours of work (about 114 years)."""
MAX_PER_DAY = 1e6
"""Most planned interruptions per day."""
MAX_SPARES = 1_000_000
"""Most spare nodes."""
MIN_EFFECTIVE = 0.01
"""Below this effective fraction (wall time over 100x the work) the job "cannot make progress": refused."""
MAX_EVENTS = 200_000_000
"""Most interruptions a Monte Carlo may simulate over all its trials (a few minutes on one core)."""
STEP_COST_TRIALS = 1000
"""A Monte Carlo step (one interruption of every unfinished trial) costs about as much Python overhead as
simulating this many trials' interruptions: a run of few trials is capped at ``MAX_EVENTS / STEP_COST_TRIALS``
interruptions each."""
SPARE_AVAILABILITY = 0.99
"""The hot-spares policy sizes its pool so that a failure finds a free spare this often."""
ASYNC_STALL_SHARE = 0.1
"""Default stall of an asynchronous checkpoint, as a share of the synchronous save."""
FAST_RESTORE_SHARE = 0.1
"""Default restore from an in-memory or peer checkpoint, as a share of the restore from storage."""


# --- failure mixes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cause:
    """One root cause of interruptions: its weight among causes of its kind, and what recovering costs."""

    name: str
    weight: float
    """A count or share; normalised among the unexpected causes (or among the planned ones)."""
    planned: bool = False
    """Announced ahead (maintenance, a config change): a job may save at the signal and lose nothing."""
    reschedule: bool = False
    """Needs a replacement node (a faulty GPU or host): pays ``reschedule_seconds``, or a spare's swap."""
    restart_seconds: float | None = None
    """The whole recovery of this cause, overriding restart + restore + reschedule."""


@dataclass(frozen=True, slots=True)
class FailureMix:
    """Causes of interruptions with their weights, and the run they were counted on (for default rates)."""

    name: str
    source: str
    causes: tuple[Cause, ...]
    reference_gpus: int | None = None
    reference_hours: float | None = None

    @property
    def unexpected(self) -> tuple[Cause, ...]:
        return tuple(c for c in self.causes if not c.planned)

    @property
    def planned(self) -> tuple[Cause, ...]:
        return tuple(c for c in self.causes if c.planned)

    def gpu_mtbf_hours(self) -> float | None:
        """Per-GPU MTBF of the reference run: GPU-hours over unexpected interruptions (counts as weights)."""
        total = sum(c.weight for c in self.unexpected)
        if self.reference_gpus is None or self.reference_hours is None or total <= 0:
            return None
        return self.reference_gpus * self.reference_hours / total

    def planned_per_day(self) -> float | None:
        """Planned interruptions per day of the reference run."""
        if self.reference_hours is None:
            return None
        return sum(c.weight for c in self.planned) * 24.0 / self.reference_hours


def _hw(name: str, count: int) -> Cause:
    return Cause(name, float(count), reschedule=True)


def _sw(name: str, count: int) -> Cause:
    return Cause(name, float(count))


LLAMA3 = FailureMix(
    name="llama3",
    source=(
        "Llama Team, AI @ Meta, 'The Llama 3 Herd of Models', arXiv:2407.21783 (2024), section 3.3.4 and Table 5: "
        "466 interruptions of Llama 3 405B pre-training on 16,384 H100 GPUs in a 54-day snapshot, 47 planned and "
        "419 unexpected (counts; the table prints 30.1% beside 148 faulty GPUs, which is 35.3% of 419)"
    ),
    causes=(
        _hw("faulty GPU (incl. NVLink)", 148),
        _hw("GPU HBM3 memory", 72),
        _sw("software bug", 54),
        _hw("network switch/cable", 35),
        _hw("host maintenance (unplanned)", 32),
        _hw("GPU SRAM memory", 19),
        _hw("GPU system processor", 17),
        _hw("NIC", 7),
        _sw("NCCL watchdog timeouts", 7),
        _hw("silent data corruption", 6),
        _hw("GPU thermal interface + sensor", 6),
        _hw("SSD", 3),
        _hw("power supply", 3),
        _hw("server chassis", 2),
        _hw("IO expansion board", 2),
        _sw("dependency", 2),
        _hw("CPU", 2),
        _hw("system memory", 2),
        Cause("planned (maintenance, firmware, config or dataset update)", 47.0, planned=True),
    ),
    reference_gpus=16_384,
    reference_hours=54 * 24.0,
)
"""Table 5 of the Llama 3 paper; software, dependency and NCCL timeouts restart in place, the rest need a node."""

SIMPLE = FailureMix(
    name="simple",
    source="one unexpected cause (needs a new node) and one planned cause",
    causes=(Cause("unexpected", 1.0, reschedule=True), Cause("planned", 1.0, planned=True)),
)
"""The mix without ``--mix``: every unexpected failure needs a new node."""

BUILTIN_MIXES = {"llama3": LLAMA3}


class _CauseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    count: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    share: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    planned: bool = False
    reschedule: bool = False
    restart_seconds: float | None = Field(default=None, gt=0, le=MAX_SECONDS, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_weight(self) -> _CauseModel:
        if (self.count is None) == (self.share is None):
            raise ValueError("give exactly one of count or share")
        return self


class _MixModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="custom", max_length=200)
    source: str = Field(default="", max_length=2000)
    reference_gpus: int | None = Field(default=None, ge=1, le=MAX_GPUS)
    reference_hours: float | None = Field(default=None, gt=0, le=MAX_WORK_HOURS, allow_inf_nan=False)
    causes: list[_CauseModel] = Field(min_length=1, max_length=1000)

    @model_validator(mode="after")
    def _some_unexpected(self) -> _MixModel:
        if sum((c.count if c.count is not None else c.share or 0.0) for c in self.causes if not c.planned) <= 0:
            raise ValueError("needs at least one unexpected cause (planned: false) with a count or share above 0")
        if (self.reference_gpus is not None or self.reference_hours is not None) and any(
            c.count is None for c in self.causes
        ):
            raise ValueError("reference_gpus and reference_hours turn counts into rates: give every cause a count")
        return self


def load_mix(path: Path) -> FailureMix:
    """A failure mix from a YAML (or JSON) file: ``causes: [{name, count | share, planned, reschedule, ...}]``."""
    from gpufleet.yamlio import read_yaml, validate

    data = read_yaml(path, what="failure mix", error=UsageError)
    model = validate(
        _MixModel, data, source=str(path), what="a failure mix", reference="docs/goodput.md", error=UsageError
    )
    causes = tuple(
        Cause(
            c.name,
            float(c.count if c.count is not None else c.share or 0.0),
            planned=c.planned,
            reschedule=c.reschedule,
            restart_seconds=c.restart_seconds,
        )
        for c in model.causes
    )
    return FailureMix(model.name, model.source or str(path), causes, model.reference_gpus, model.reference_hours)


def resolve_mix(spec: str) -> FailureMix:
    """``llama3`` (built in) or the path of a mix file."""
    if spec in BUILTIN_MIXES:
        return BUILTIN_MIXES[spec]
    path = Path(spec)
    if not path.exists():
        raise UsageError(f"--mix {spec!r} is neither a built-in mix ({', '.join(BUILTIN_MIXES)}) nor a file")
    return load_mix(path)


# --- the scenario -----------------------------------------------------------------------------------------------


def _finite(name: str, value: float, *, low: float, high: float, strict: bool, unit: str) -> None:
    bad = isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    if bad or value > high or (value <= low if strict else value < low):
        relation = "greater than" if strict else "at least"
        of = f" of {unit}" if unit else ""
        raise ParameterError(
            f"{{{name}}} must be a finite number{of} {relation} {low:g} and at most {high:g}", **{name: value}
        )


def _whole(name: str, value: int, *, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ParameterError(f"{{{name}}} must be a whole number from {low:,} to {high:,}", **{name: value})


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One synchronous job and its fault-tolerance settings (seconds, hours as named)."""

    gpus: int
    gpu_mtbf_hours: float
    """Mean time between unexpected interruptions caused by one GPU's share of the job (all causes)."""
    work_hours: float
    """T_s: the compute the job needs without any interruption or save."""
    save_seconds: float
    """δ: how long a periodic checkpoint stalls training (sync: the whole save; async: the snapshot)."""
    restart_seconds: float
    """Relaunch after any interruption: scheduling the job again, process start, NCCL init, data loaders."""
    interval_seconds: float | None = None
    """τ: compute between checkpoints; ``None`` for Daly's optimum."""
    restore_seconds: float = 0.0
    """Loading the checkpoint after a restart."""
    reschedule_seconds: float = 0.0
    """Extra time for a cause that needs a new node (drain, replace, wait for capacity)."""
    planned_per_day: float = 0.0
    """Planned interruptions of the job per day."""
    save_on_signal: bool = False
    """Planned interruptions save at the signal and lose no work."""
    signal_save_seconds: float | None = None
    """The save at a planned interruption's signal (default ``save_seconds``)."""
    mix: FailureMix = SIMPLE
    spares: int = 0
    """Hot spare nodes."""
    gpus_per_node: int = 8
    spare_repair_hours: float = 48.0
    """How long a failed node is away before it is a spare again."""
    spare_swap_seconds: float = 0.0
    """Swapping a hot spare in, instead of ``reschedule_seconds``."""
    weibull_shape: float = 1.0
    """Shape of the interruptions' inter-arrival times (Monte Carlo only); 1 is exponential."""

    def __post_init__(self) -> None:
        _whole("gpus", self.gpus, low=1, high=MAX_GPUS)
        _whole("gpus_per_node", self.gpus_per_node, low=1, high=1024)
        _whole("spares", self.spares, low=0, high=MAX_SPARES)
        hours = {"gpu_mtbf_hours": self.gpu_mtbf_hours, "spare_repair_hours": self.spare_repair_hours}
        for name, value in hours.items():
            _finite(name, value, low=0, high=MAX_HOURS, strict=True, unit="hours")
        _finite("work_hours", self.work_hours, low=0, high=MAX_WORK_HOURS, strict=True, unit="hours")
        for name in ("save_seconds", "restart_seconds"):
            _finite(name, getattr(self, name), low=0, high=MAX_SECONDS, strict=True, unit="seconds")
        for name in ("restore_seconds", "reschedule_seconds", "spare_swap_seconds"):
            _finite(name, getattr(self, name), low=0, high=MAX_SECONDS, strict=False, unit="seconds")
        for name in ("interval_seconds", "signal_save_seconds"):
            value = getattr(self, name)
            if value is not None:
                _finite(name, value, low=0, high=MAX_SECONDS, strict=True, unit="seconds")
        _finite("planned_per_day", self.planned_per_day, low=0, high=MAX_PER_DAY, strict=False, unit="interruptions")
        _finite("weibull_shape", self.weibull_shape, low=0.1, high=10.0, strict=False, unit="")
        if self.planned_per_day > 0 and not self.mix.planned:
            raise ParameterError(
                f"{{planned_per_day}} but the failure mix {self.mix.name!r} has no planned cause: "
                "add one (planned: true) to the mix file",
                planned_per_day=self.planned_per_day,
            )
        mtbf = self.mtbf_seconds
        if self.save_seconds >= mtbf:
            raise ParameterError(
                f"{{save_seconds}} is not shorter than the job's MTBF of {mtbf:,.0f} s ({mtbf / 3600:.3g} h, "
                "from {gpus} and {gpu_mtbf_hours} with the planned interruptions): a checkpoint would rarely "
                "complete; save faster (asynchronously) or run on fewer GPUs",
                save_seconds=self.save_seconds,
                gpus=self.gpus,
                gpu_mtbf_hours=float(f"{self.gpu_mtbf_hours:.6g}"),
            )

    # rates

    @property
    def unexpected_per_second(self) -> float:
        return self.gpus / (self.gpu_mtbf_hours * SECONDS_PER_HOUR)

    @property
    def planned_per_second(self) -> float:
        return self.planned_per_day / 86_400.0

    @property
    def mtbf_seconds(self) -> float:
        """The job's MTBF over every interruption, unexpected and planned."""
        return 1.0 / (self.unexpected_per_second + self.planned_per_second)

    @property
    def lossy_mtbf_seconds(self) -> float:
        """The MTBF of the interruptions that lose work (planned ones do not with save on signal)."""
        rate = self.unexpected_per_second + (0.0 if self.save_on_signal else self.planned_per_second)
        return 1.0 / rate if rate > 0 else math.inf

    @property
    def signal_save(self) -> float:
        return self.save_seconds if self.signal_save_seconds is None else self.signal_save_seconds

    @property
    def reschedule_per_hour(self) -> float:
        """Failures that take a node away, per hour (the demand on the spare pool)."""
        total = sum(c.weight for c in self.mix.unexpected)
        share = sum(c.weight for c in self.mix.unexpected if c.reschedule and c.restart_seconds is None) / total
        return self.unexpected_per_second * SECONDS_PER_HOUR * share

    def spare_availability(self) -> float:
        """Probability that a failure needing a node finds a free hot spare."""
        return spare_availability(self.spares, self.reschedule_per_hour, self.spare_repair_hours)

    def interval(self) -> tuple[float, str]:
        """τ in seconds and where it came from (``given`` or ``daly``), at most the whole work."""
        work = self.work_hours * SECONDS_PER_HOUR
        if self.interval_seconds is not None:
            return min(self.interval_seconds, work), "given"
        lossy = self.lossy_mtbf_seconds
        if not math.isfinite(lossy):
            return work, "daly"
        return min(daly_interval(self.save_seconds, lossy), work), "daly"


def spare_availability(spares: int, failures_per_hour: float, repair_hours: float) -> float:
    """``P(Poisson(failures_per_hour * repair_hours) < spares)``: a failure finds a free spare (M/G/∞)."""
    from scipy.special import pdtr

    if spares <= 0:
        return 0.0
    mean = failures_per_hour * repair_hours
    return 1.0 if mean <= 0 else float(pdtr(spares - 1, mean))


def spares_for(availability: float, failures_per_hour: float, repair_hours: float) -> int:
    """The fewest spare nodes a failure finds free with at least ``availability`` probability."""
    if failures_per_hour <= 0:
        return 0
    lo, hi = 1, 1
    while spare_availability(hi, failures_per_hour, repair_hours) < availability:
        if hi >= MAX_SPARES:
            return MAX_SPARES
        lo, hi = hi + 1, min(2 * hi, MAX_SPARES)
    while lo < hi:  # the smallest pool in [lo, hi] that is free often enough
        mid = (lo + hi) // 2
        if spare_availability(mid, failures_per_hour, repair_hours) >= availability:
            hi = mid
        else:
            lo = mid + 1
    return hi


# --- closed forms -----------------------------------------------------------------------------------------------


def young_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Young (1974): ``√(2δM)``."""
    return young_daly_interval(save_seconds, mtbf_seconds)


def daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly (2006), the higher-order optimum: ``√(2δM)·[1 + ⅓√(δ/2M) + ⅑(δ/2M)] - δ`` for ``δ < 2M``, else ``M``."""
    if save_seconds >= 2.0 * mtbf_seconds:
        return mtbf_seconds
    x = save_seconds / (2.0 * mtbf_seconds)
    return young_interval(save_seconds, mtbf_seconds) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save_seconds


def daly_wall_time(
    solve_seconds: float, interval_seconds: float, save_seconds: float, restart_seconds: float, mtbf_seconds: float
) -> float:
    """Daly (2006): ``M e^(R/M) (e^((τ+δ)/M) - 1) T_s / τ``, the expected wall time (seconds)."""
    m = mtbf_seconds
    return (
        m
        * math.exp(restart_seconds / m)
        * math.expm1((interval_seconds + save_seconds) / m)
        * solve_seconds
        / interval_seconds
    )


# --- branches: what the engines see ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Branch:
    """One way an interruption happens and is recovered from: its rate and its recovery time."""

    cause: str
    rate: float
    """Per second."""
    restart: float
    """Seconds from the interruption (after any save at the signal) until compute resumes."""
    signal: bool
    """Saves at the signal and keeps its work."""
    planned: bool
    reschedule: bool


def branches(s: Scenario) -> tuple[Branch, ...]:
    """The scenario's causes as branches: rates from the GPU MTBF and planned rate, spares split in two."""
    out: list[Branch] = []
    unexpected, planned = s.mix.unexpected, s.mix.planned
    total_u = sum(c.weight for c in unexpected)
    total_p = sum(c.weight for c in planned)
    base = s.restart_seconds + s.restore_seconds
    avail = s.spare_availability()
    for c in unexpected + planned:
        if c.planned:
            rate = s.planned_per_second * (c.weight / total_p if total_p > 0 else 0.0)
        else:
            rate = s.unexpected_per_second * c.weight / total_u
        if rate <= 0:
            continue
        signal = c.planned and s.save_on_signal
        if c.restart_seconds is not None:
            out.append(Branch(c.name, rate, c.restart_seconds, signal, c.planned, c.reschedule))
        elif c.reschedule:
            if avail > 0:
                out.append(Branch(c.name, rate * avail, base + s.spare_swap_seconds, signal, c.planned, True))
            if avail < 1:
                out.append(Branch(c.name, rate * (1 - avail), base + s.reschedule_seconds, signal, c.planned, True))
        else:
            out.append(Branch(c.name, rate, base, signal, c.planned, False))
    return tuple(out)


# --- results ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CauseLoss:
    """What one cause costs over the run (hours of the job's wall time; expected or Monte Carlo mean)."""

    name: str
    planned: bool
    reschedule: bool
    save_on_signal: bool
    rate_per_day: float
    mean_restart_seconds: float
    interruptions: float
    rework_hours: float
    restart_hours: float
    signal_save_hours: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "planned": self.planned,
            "reschedule": self.reschedule,
            "save_on_signal": self.save_on_signal,
            "rate_per_day": self.rate_per_day,
            "mean_restart_seconds": self.mean_restart_seconds,
            "interruptions": self.interruptions,
            "rework_hours": self.rework_hours,
            "restart_hours": self.restart_hours,
            "signal_save_hours": self.signal_save_hours,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    """How the Monte Carlo's trials spread around their mean."""

    trials: int
    seed: int
    wall_hours_std: float
    wall_hours_stderr: float
    effective_p05: float
    effective_p50: float
    effective_p95: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "trials": self.trials,
            "seed": self.seed,
            "wall_hours_std": self.wall_hours_std,
            "wall_hours_stderr": self.wall_hours_stderr,
            "effective_fraction_p05": self.effective_p05,
            "effective_fraction_p50": self.effective_p50,
            "effective_fraction_p95": self.effective_p95,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """Expected figures of one scenario under one engine (hours are the job's wall-clock hours)."""

    engine: Engine
    gpus: int
    mtbf_hours: float
    """The job's MTBF, every interruption counted."""
    interval_seconds: float
    interval_source: str
    save_seconds: float
    work_hours: float
    wall_hours: float
    save_hours: float
    """Periodic saves that completed or were cut by a signal, and saves at the signal."""
    rework_hours: float
    """Work (and unfinished saves) lost since the last checkpoint."""
    restart_hours: float
    """Restart, restore, reschedule or spare swap, restarts interrupted again included."""
    interruptions: float
    spares: int
    spare_gpus: int
    spare_availability: float
    causes: tuple[CauseLoss, ...]
    spread: Spread | None = None

    @property
    def effective_fraction(self) -> float:
        return self.work_hours / self.wall_hours

    @property
    def lost_gpu_hours(self) -> float:
        """The job's GPUs times the wall time that did not train (spares not counted)."""
        return self.gpus * (self.wall_hours - self.work_hours)

    @property
    def spare_gpu_hours(self) -> float:
        return self.spare_gpus * self.wall_hours

    def to_dict(self) -> dict[str, Any]:
        hours = {"saves": self.save_hours, "rework": self.rework_hours, "restarts": self.restart_hours}
        return {
            "engine": self.engine,
            "gpus": self.gpus,
            "mtbf_hours": self.mtbf_hours,
            "interval_seconds": self.interval_seconds,
            "interval_source": self.interval_source,
            "save_seconds": self.save_seconds,
            "work_hours": self.work_hours,
            "wall_hours": self.wall_hours,
            "effective_fraction": self.effective_fraction,
            "lost_gpu_hours": self.lost_gpu_hours,
            "loss_hours": hours,
            "loss_gpu_hours": {k: v * self.gpus for k, v in hours.items()},
            "loss_fraction": {k: v / self.wall_hours for k, v in hours.items()},
            "interruptions": self.interruptions,
            "spares": self.spares,
            "spare_gpus": self.spare_gpus,
            "spare_availability": self.spare_availability,
            "spare_gpu_hours": self.spare_gpu_hours,
            "causes": [c.to_dict() for c in self.causes],
            "montecarlo": None if self.spread is None else self.spread.to_dict(),
        }


@dataclass(slots=True)
class _Tally:
    """Per-branch totals (seconds, counts) before they become :class:`CauseLoss` rows."""

    interruptions: list[float] = field(default_factory=list)
    rework: list[float] = field(default_factory=list)
    restart: list[float] = field(default_factory=list)
    signal_save: list[float] = field(default_factory=list)


def _causes(bs: Sequence[Branch], tally: _Tally) -> tuple[CauseLoss, ...]:
    rows: dict[str, dict[str, Any]] = {}
    for i, b in enumerate(bs):
        row = rows.setdefault(
            b.cause,
            {"b": b, "rate": 0.0, "rr": 0.0, "n": 0.0, "rework": 0.0, "restart": 0.0, "sig": 0.0},
        )
        row["rate"] += b.rate
        row["rr"] += b.rate * b.restart
        row["n"] += tally.interruptions[i]
        row["rework"] += tally.rework[i]
        row["restart"] += tally.restart[i]
        row["sig"] += tally.signal_save[i]
    return tuple(
        CauseLoss(
            name=name,
            planned=r["b"].planned,
            reschedule=r["b"].reschedule,
            save_on_signal=r["b"].signal,
            rate_per_day=r["rate"] * 86_400.0,
            mean_restart_seconds=r["rr"] / r["rate"],
            interruptions=r["n"],
            rework_hours=r["rework"] / SECONDS_PER_HOUR,
            restart_hours=r["restart"] / SECONDS_PER_HOUR,
            signal_save_hours=r["sig"] / SECONDS_PER_HOUR,
        )
        for name, r in rows.items()
    )


def _cannot_progress(s: Scenario, tau: float, why: str) -> ParameterError:
    return ParameterError(
        f"the job cannot make progress: {why} with {{interval_seconds}}, {{save_seconds}} and {{restart_seconds}} "
        f"against a job MTBF of {s.mtbf_seconds:,.0f} s: shorten the interval, save faster or restart faster",
        interval_seconds=round(tau, 3),
        save_seconds=s.save_seconds,
        restart_seconds=s.restart_seconds,
    )


# --- the analytic engine ----------------------------------------------------------------------------------------


def analytic(s: Scenario) -> Goodput:
    """Expected wall time and its breakdown in closed form (Daly 2006, generalised; see the module docstring).

    Refuses (:class:`ParameterError`) a scenario whose effective fraction is below :data:`MIN_EFFECTIVE`.
    """
    tau, source = s.interval()
    delta, dsig = s.save_seconds, s.signal_save
    bs = branches(s)
    work = s.work_hours * SECONDS_PER_HOUR
    lam = sum(b.rate for b in bs)
    n = len(bs)
    if lam == 0:
        cycles = work / tau
        tally = _Tally([0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n)
        return _goodput(s, "analytic", tau, source, work + cycles * delta, cycles * delta, 0.0, 0.0, 0.0, bs, tally)
    length = tau + delta
    if lam * length > 700:  # e^700 is near the largest float: nothing completes
        raise _cannot_progress(s, tau, "no interval would complete")
    q_l, q_tau, q_delta = math.exp(-lam * length), math.exp(-lam * tau), math.exp(-lam * delta)
    p_fail = -math.expm1(-lam * length)
    before = p_fail / lam - length * q_l  # E[T; T < L]
    weights = [b.rate / lam for b in bs]
    keep = math.fsum(w * math.exp(-lam * b.restart) for w, b in zip(weights, bs, strict=True))  # 1 - P̄
    if not keep > 0:  # every restart outlasts the interruptions by so far that e^(-λ·restart) underflows
        raise _cannot_progress(s, tau, "no restart would complete")
    chain = [-math.expm1(-lam * b.restart) / (lam * keep) for b in bs]  # X_c: a restart and its interruptions
    part_save = q_tau * ((1 - q_delta) / lam - delta * q_delta)  # E[(T - τ); τ ≤ T < L]
    progress = tau * q_l
    saves = delta * q_l
    rework, restart, sig = [0.0] * n, [0.0] * n, [0.0] * n
    for i, b in enumerate(bs):
        restart[i] = p_fail * weights[i] * chain[i]
        if b.signal:
            progress += weights[i] * ((1 - q_tau) / lam - tau * q_l)
            saves += weights[i] * part_save
            sig[i] = weights[i] * p_fail * dsig
        else:
            rework[i] = weights[i] * before
    if not progress > 0:
        raise _cannot_progress(s, tau, "no interval would complete")
    cycles = work / progress
    saves_total = cycles * (saves + math.fsum(sig))
    rework_total, restart_total = cycles * math.fsum(rework), cycles * math.fsum(restart)
    wall = work + saves_total + rework_total + restart_total
    exposed = wall - cycles * math.fsum(sig)  # interruptions arrive except during a save at the signal
    tally = _Tally(
        [b.rate * exposed for b in bs],
        [cycles * x for x in rework],
        [cycles * x for x in restart],
        [cycles * x for x in sig],
    )
    if not work / wall >= MIN_EFFECTIVE:
        raise _cannot_progress(s, tau, f"the effective fraction would be {work / wall:.2g}")
    return _goodput(
        s, "analytic", tau, source, wall, saves_total, rework_total, restart_total, exposed * lam, bs, tally
    )


def _goodput(
    s: Scenario,
    engine: Engine,
    tau: float,
    source: str,
    wall: float,
    saves: float,
    rework: float,
    restart: float,
    interruptions: float,
    bs: Sequence[Branch],
    tally: _Tally,
    spread: Spread | None = None,
) -> Goodput:
    h = SECONDS_PER_HOUR
    return Goodput(
        engine=engine,
        gpus=s.gpus,
        mtbf_hours=s.mtbf_seconds / h,
        interval_seconds=tau,
        interval_source=source,
        save_seconds=s.save_seconds,
        work_hours=s.work_hours,
        wall_hours=wall / h,
        save_hours=saves / h,
        rework_hours=rework / h,
        restart_hours=restart / h,
        interruptions=interruptions,
        spares=s.spares,
        spare_gpus=s.spares * s.gpus_per_node,
        spare_availability=s.spare_availability(),
        causes=_causes(bs, tally),
        spread=spread,
    )


# --- the Monte Carlo engine -------------------------------------------------------------------------------------


def _check_trials(trials: int, seed: int) -> None:
    _whole("trials", trials, low=1, high=MAX_TRIALS)
    _whole("seed", seed, low=0, high=2**63 - 1)


def monte_carlo(s: Scenario, *, trials: int = 1000, seed: int = 0) -> Goodput:
    """Mean figures of ``trials`` simulated runs (numpy, vectorised over trials; one step per interruption).

    The schedule between interruptions is deterministic (intervals of ``τ`` then a save of ``δ``, the last
    interval shorter), so each step jumps straight to the next interruption of every unfinished trial.
    """
    _check_trials(trials, seed)
    tau, source = s.interval()
    expected = analytic(s)  # refuses a job that cannot make progress, and bounds the work below
    bs = branches(s)
    nb = len(bs)
    rates = np.array([b.rate for b in bs], dtype=float)
    lam = float(rates.sum())
    per_trial = expected.wall_hours * SECONDS_PER_HOUR * lam
    if per_trial * trials > MAX_EVENTS:
        raise ParameterError(
            f"{{trials}} runs of about {per_trial:,.0f} interruptions each are more than the Monte Carlo's "
            f"{MAX_EVENTS:,.0f}: use fewer trials or the analytic engine",
            trials=trials,
        )
    if per_trial * STEP_COST_TRIALS > MAX_EVENTS:  # one numpy step per interruption, however few the trials
        raise ParameterError(
            f"{{trials}}: each run takes about {per_trial:,.0f} interruptions, one simulation step each, over the "
            f"Monte Carlo's {MAX_EVENTS / STEP_COST_TRIALS:,.0f} steps: use the analytic engine or a shorter run",
            trials=trials,
        )
    work = s.work_hours * SECONDS_PER_HOUR
    delta, dsig, length = s.save_seconds, s.signal_save, tau + s.save_seconds
    rng = np.random.default_rng(seed)
    mean_gap = 1.0 / lam if lam > 0 else math.inf
    shape = s.weibull_shape
    scale = mean_gap / math.gamma(1.0 + 1.0 / shape)

    def gaps(k: int) -> np.ndarray[Any, np.dtype[np.float64]]:
        if lam == 0:
            return np.full(k, np.inf)
        if shape == 1.0:
            return rng.exponential(mean_gap, k)
        return rng.weibull(shape, k) * scale

    cum = np.cumsum(rates / lam) if lam > 0 else np.ones(max(nb, 1))
    cum[-1] = 1.0
    restart_of = np.array([b.restart for b in bs] or [0.0])
    signal_of = np.array([b.signal for b in bs] or [False])
    ready = np.zeros(trials)  # when compute (re)starts
    rs = np.zeros(trials)  # when the current restart chain's latest restart began
    init = np.full(trials, -1, dtype=np.int64)  # branch that began the current restart chain
    ck = np.zeros(trials)  # checkpointed progress
    nf = gaps(trials)  # next interruption
    wall = np.zeros(trials)
    saves = np.zeros(trials)
    rework = np.zeros((trials, max(nb, 1)))
    restart = np.zeros_like(rework)
    sig = np.zeros_like(rework)
    events = np.zeros_like(rework)
    active = np.arange(trials)
    steps, max_steps = 0, int(50 * per_trial + 10 * math.sqrt(per_trial) + 1000)
    while active.size:
        steps += 1
        if steps > max_steps:
            raise _cannot_progress(s, tau, "the simulated runs did not finish")
        f = nf[active]
        br = np.searchsorted(cum, rng.random(active.size), side="right").clip(0, max(nb - 1, 0))
        r = ready[active]
        busy = f < r
        # interrupted while restarting: the chain goes on with this cause's restart
        a, fa, ba = active[busy], f[busy], br[busy]
        restart[a, init[a]] += fa - rs[a]
        rs[a] = fa
        ready[a] = fa + restart_of[ba]
        events[a, ba] += 1
        # interrupted while computing or saving (or finished first)
        c, fc, bc, rc = active[~busy], f[~busy], br[~busy], r[~busy]
        chained = init[c] >= 0
        cc = c[chained]
        restart[cc, init[cc]] += ready[cc] - rs[cc]
        init[c] = -1
        left = np.maximum(work - ck[c], 0.0)
        segments = np.ceil(left / tau - 1e-9)
        finish = left + segments * delta
        up = fc - rc
        done = up >= finish
        d = c[done]
        wall[d] = rc[done] + finish[done]
        saves[d] += segments[done] * delta
        ck[d] = work
        g, fg, bg, ug, lg = c[~done], fc[~done], bc[~done], up[~done], left[~done]
        k = np.minimum(np.floor(ug / length), np.maximum(np.ceil(lg / tau - 1e-9) - 1, 0))
        offset = ug - k * length
        compute = np.minimum(tau, lg - k * tau)
        saves[g] += k * delta
        ck[g] += k * tau
        on_signal = signal_of[bg]
        lossy = ~on_signal
        rework[g[lossy], bg[lossy]] += offset[lossy]
        gs, os_, cs = g[on_signal], offset[on_signal], compute[on_signal]
        ck[gs] += np.minimum(os_, cs)
        saves[gs] += np.maximum(os_ - cs, 0.0)
        sig[gs, bg[on_signal]] += dsig
        events[g, bg] += 1
        start = fg + np.where(on_signal, dsig, 0.0)
        rs[g] = start
        ready[g] = start + restart_of[bg]
        init[g] = bg
        nf[a] = fa + gaps(a.size)
        nf[g] = start + gaps(g.size)
        active = np.concatenate([a, g])
        active.sort()
    mean_wall = float(wall.mean())
    tally = _Tally(
        list(events.mean(axis=0)[:nb]),
        list(rework.mean(axis=0)[:nb]),
        list(restart.mean(axis=0)[:nb]),
        list(sig.mean(axis=0)[:nb]),
    )
    fractions = work / wall
    p05, p50, p95 = (float(x) for x in np.quantile(fractions, [0.05, 0.5, 0.95]))
    std = float(wall.std(ddof=1)) / SECONDS_PER_HOUR if trials > 1 else 0.0
    spread = Spread(
        trials=trials,
        seed=seed,
        wall_hours_std=std,
        wall_hours_stderr=std / math.sqrt(trials),
        effective_p05=p05,
        effective_p50=p50,
        effective_p95=p95,
    )
    return _goodput(
        s,
        "montecarlo",
        tau,
        source,
        mean_wall,
        float(saves.mean() + sig.sum(axis=1).mean()),
        float(rework.sum(axis=1).mean()),
        float(restart.sum(axis=1).mean()),
        float(events.sum(axis=1).mean()),
        bs,
        tally,
        spread,
    )


def evaluate(s: Scenario, engine: Engine = "analytic", *, trials: int = 1000, seed: int = 0) -> Goodput:
    """:func:`analytic` or :func:`monte_carlo`; the analytic engine needs exponential failures."""
    _check_trials(trials, seed)
    if engine == "analytic":
        if s.weibull_shape != 1.0:
            raise ParameterError(
                "{weibull_shape} needs the Monte Carlo engine: the closed form assumes exponential failures",
                weibull_shape=s.weibull_shape,
            )
        return analytic(s)
    if engine == "montecarlo":
        return monte_carlo(s, trials=trials, seed=seed)
    raise ParameterError("unknown {engine}: use analytic or montecarlo", engine=engine)


def optimum_interval(s: Scenario, *, low: float | None = None, high: float | None = None) -> float:
    """The interval that minimises :func:`analytic`'s wall time (golden-section search on log τ)."""
    lossy = s.lossy_mtbf_seconds
    work = s.work_hours * SECONDS_PER_HOUR
    guess = daly_interval(s.save_seconds, lossy) if math.isfinite(lossy) else work
    lo = math.log(low if low is not None else max(guess / 50, 1e-3))
    hi = math.log(high if high is not None else min(guess * 50, work))

    def wall(log_tau: float) -> float:
        try:
            return analytic(replace(s, interval_seconds=math.exp(log_tau))).wall_hours
        except ParameterError:
            return math.inf

    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    x1, x2 = b - ratio * (b - a), a + ratio * (b - a)
    f1, f2 = wall(x1), wall(x2)
    for _ in range(80):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - ratio * (b - a)
            f1 = wall(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + ratio * (b - a)
            f2 = wall(x2)
    return math.exp((a + b) / 2)


def interval_sweep(s: Scenario, intervals: Sequence[float]) -> list[float]:
    """:func:`analytic`'s effective fraction at each interval (NaN where the job cannot make progress)."""
    out = []
    for tau in intervals:
        try:
            out.append(analytic(replace(s, interval_seconds=tau)).effective_fraction)
        except ParameterError:
            out.append(math.nan)
    return out


# --- policies ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyKnobs:
    """What each policy sets (``None``: the default described beside each field)."""

    async_stall_seconds: float | None = None
    """Stall of an asynchronous save; default :data:`ASYNC_STALL_SHARE` of ``save_seconds``."""
    fast_restore_seconds: float | None = None
    """Restore from host memory or a peer; default :data:`FAST_RESTORE_SHARE` of ``restore_seconds``."""
    spares: int | None = None
    """Hot spare nodes; default the fewest a failure finds free :data:`SPARE_AVAILABILITY` of the time."""

    def __post_init__(self) -> None:
        if self.async_stall_seconds is not None:
            _finite(
                "async_stall_seconds", self.async_stall_seconds, low=0, high=MAX_SECONDS, strict=True, unit="seconds"
            )
        if self.fast_restore_seconds is not None:
            _finite(
                "fast_restore_seconds", self.fast_restore_seconds, low=0, high=MAX_SECONDS, strict=False, unit="seconds"
            )
        if self.spares is not None:
            _whole("policy_spares", self.spares, low=0, high=MAX_SPARES)


@dataclass(frozen=True, slots=True)
class Policy:
    """A named change to a scenario, what it changes in words, and the changed scenario."""

    name: str
    change: str
    scenario: Scenario


def policies(s: Scenario, knobs: PolicyKnobs | None = None) -> list[Policy]:
    """The scenario as given, each fault-tolerance policy alone, and all of them together."""
    k = knobs or PolicyKnobs()
    stall = k.async_stall_seconds if k.async_stall_seconds is not None else s.save_seconds * ASYNC_STALL_SHARE
    restore = k.fast_restore_seconds if k.fast_restore_seconds is not None else s.restore_seconds * FAST_RESTORE_SHARE
    spares = k.spares
    if spares is None:
        spares = spares_for(SPARE_AVAILABILITY, s.reschedule_per_hour, s.spare_repair_hours)
    signal = s.signal_save  # an async snapshot still flushes the whole checkpoint at a signal
    changes: list[tuple[str, str, dict[str, Any]]] = [
        ("save on signal", "planned interruptions save at the signal, lose no work", {"save_on_signal": True}),
        ("Young/Daly interval", "checkpoint interval at Daly's optimum", {"interval_seconds": None}),
        (
            "async checkpoints",
            f"save stall {s.save_seconds:g} s -> {stall:g} s",
            {"save_seconds": stall, "signal_save_seconds": signal},
        ),
        (
            "fast restore",
            f"in-memory/peer checkpoints: restore {s.restore_seconds:g} s -> {restore:g} s",
            {"restore_seconds": restore},
        ),
        ("hot spares", f"{spares} spare nodes replace a node in {s.spare_swap_seconds:g} s", {"spares": spares}),
    ]
    out = [Policy("as given", "the inputs", s)]
    combined: dict[str, Any] = {}
    for name, change, fields in changes:
        out.append(Policy(name, change, replace(s, **fields)))
        combined.update(fields)
    out.append(Policy("all of the above", "every policy together", replace(s, **combined)))
    return out


def monte_carlo_sweep(
    s: Scenario, *, intervals: Sequence[float] = (), sizes: Sequence[int] = (), trials: int = 1000, seed: int = 0
) -> list[float]:
    """:func:`monte_carlo`'s effective fraction at each interval, or else at each GPU count (NaN where a point
    cannot be simulated: the job makes no progress there).

    One seed for every point, so the points differ by the knob alone (common random numbers).
    """
    if intervals and sizes:
        raise ParameterError("give {intervals:name} or {sizes:name}, not both", intervals=intervals, sizes=sizes)
    points = [replace(s, interval_seconds=float(t)) for t in intervals] or [replace(s, gpus=int(n)) for n in sizes]
    out = []
    for point in points:
        try:
            out.append(monte_carlo(point, trials=trials, seed=seed).effective_fraction)
        except ParameterError:
            out.append(math.nan)
    return out


def fleet_sweep(s: Scenario, sizes: Sequence[int], knobs: PolicyKnobs | None = None) -> dict[str, list[float]]:
    """Each policy's analytic effective fraction at each GPU count (NaN where the job cannot make progress)."""
    out: dict[str, list[float]] = {}
    for i, gpus in enumerate(sizes):
        try:
            pols = policies(replace(s, gpus=int(gpus)), knobs)
        except ParameterError:  # this many GPUs fail faster than a checkpoint saves
            for p in policies(s, knobs):
                out.setdefault(p.name, [math.nan] * len(sizes))
            continue
        for p in pols:
            row = out.setdefault(p.name, [math.nan] * len(sizes))
            try:
                row[i] = analytic(p.scenario).effective_fraction
            except ParameterError:
                row[i] = math.nan
    return out


__all__ = [
    "BUILTIN_MIXES",
    "ENGINES",
    "LLAMA3",
    "MAX_GPUS",
    "MAX_TRIALS",
    "MIN_EFFECTIVE",
    "SIMPLE",
    "Branch",
    "Cause",
    "CauseLoss",
    "Engine",
    "FailureMix",
    "Goodput",
    "Policy",
    "PolicyKnobs",
    "Scenario",
    "Spread",
    "analytic",
    "branches",
    "daly_interval",
    "daly_wall_time",
    "evaluate",
    "fleet_sweep",
    "interval_sweep",
    "load_mix",
    "monte_carlo",
    "monte_carlo_sweep",
    "optimum_interval",
    "policies",
    "resolve_mix",
    "spare_availability",
    "spares_for",
    "young_interval",
]
