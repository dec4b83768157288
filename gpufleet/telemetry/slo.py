"""Service-level objectives for the fleet: what it promises its users, and how well it kept them.

Objectives, with the defaults (an ``--slo`` YAML file overrides any of them; ``null`` turns a
target off, and the figure is still measured and reported)::

    availability: 0.99          completed / (completed + failed) jobs ended in the window;
                                cancellations are the user's choice and count on neither side
    failure_rate: 0.05          failed or lost attempts / ended attempts (cancelled ones excluded)
    oom_rate: 0.01              attempts that died of out-of-memory / ended attempts (same base)
    queue_wait_p50_s: 120       median wait: submission -> first start, and requeue -> next start
    queue_wait_p95_s: 600       95th percentile of the same waits
    tokens_per_s_per_job: null  median over jobs of each job's tokens per second (>= target)
    tokens_per_gpu_hour: null   tokens trained per GPU-hour, fleet-wide (>= target)

Rates are taken over *ended* attempts: a running attempt has not yet had its chance to fail.
A job still queued counts among the waits with its wait so far, so a stuck queue shows instead of
hiding until the job starts.

Error budget, as the Google SRE workbook ("Implementing SLOs") defines it: the share of bad
events the objective allows, and how much of it is left (1 = untouched, 0 = spent, below 0 =
overspent). For availability with target ``T`` the budget is ``1 - T`` of ended jobs, so
``remaining = 1 - (1 - measured) / (1 - T)``; for a rate ceiling ``T`` (failures, OOM) it is
``1 - rate / T``; for a percentile ceiling (p95 <= L) the budget is the 5 % of waits allowed above
``L``: ``remaining = 1 - share_above_L / 0.05``. Throughput objectives have no budget.

An attempt died of out-of-memory when it ended other than completed or cancelled and either its
``session_end`` event carries an error naming ``OutOfMemoryError`` or "out of memory", or the
tail of its log holds PyTorch's ``CUDA out of memory`` / ``OutOfMemoryError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.errors import UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import Attempt, Event, Job
from gpufleet.yamlio import read_yaml, validate

Comparison = Literal[">=", "<="]

OOM_ERROR_MARKERS = ("OutOfMemoryError", "out of memory")
"""Text in a ``session_end`` error that means the process ran out of memory."""
OOM_LOG_MARKERS = ("CUDA out of memory", "OutOfMemoryError")
"""Text in an attempt's log that means PyTorch's allocator gave up (message and exception name)."""


class SloConfig(BaseModel):
    """Targets; ``None`` means measure and report, but do not judge."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    availability: float | None = Field(default=0.99, gt=0, lt=1)
    failure_rate: float | None = Field(default=0.05, gt=0, le=1)
    oom_rate: float | None = Field(default=0.01, gt=0, le=1)
    queue_wait_p50_s: float | None = Field(default=120.0, ge=0)
    queue_wait_p95_s: float | None = Field(default=600.0, ge=0)
    tokens_per_s_per_job: float | None = Field(default=None, gt=0)
    tokens_per_gpu_hour: float | None = Field(default=None, gt=0)


def load_slo(path: Path | None = None) -> SloConfig:
    """The objectives in ``path`` (YAML; unknown fields are errors), or the defaults."""
    if path is None:
        return SloConfig()
    data = read_yaml(path, what="SLO file", error=UsageError)
    return validate(
        SloConfig,
        {} if data is None else data,
        source=str(path),
        what="an SLO file",
        reference="the SLO fields in gpufleet/telemetry/slo.py",
        error=UsageError,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SloResult:
    """One objective, judged: ``met`` is ``None`` when there is no data or no target."""

    name: str
    objective: str
    measured: float | None
    target: float | None
    comparison: Comparison
    unit: str
    met: bool | None
    error_budget_remaining: float | None
    count: int
    """How many jobs, attempts or waits the measurement is based on."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class SloInputs:
    """What the objectives are measured from, already restricted to the report's window."""

    jobs_completed: int = 0
    jobs_failed: int = 0
    attempts_ended: int = 0
    """Ended attempts, cancelled ones excluded."""
    attempts_failed: int = 0
    attempts_oom: int = 0
    queue_waits_s: tuple[float, ...] = ()
    job_tokens_per_s: tuple[float, ...] = ()
    tokens: float = 0.0
    """Tokens trained by the jobs that report tokens."""
    token_gpu_hours: float = 0.0
    """GPU-hours of those same jobs."""


# --- measurements ------------------------------------------------------------------------------


def mentions_oom(text: str, markers: Sequence[str] = OOM_LOG_MARKERS) -> bool:
    return any(m in text for m in markers)


def died_of_oom(outcome: str | None, events: Sequence[Event], log_tail: Callable[[], str]) -> bool:
    """Whether an attempt with ``outcome`` ended by running out of memory.

    ``events`` are the attempt's; ``log_tail`` reads the end of its log, and is only called for an
    attempt that failed and whose events do not already tell.
    """
    if outcome in (None, "running", "completed", "cancelled"):
        return False
    for e in events:
        error = e.data.get("error")
        if e.kind == EventKind.SESSION_END and isinstance(error, str) and mentions_oom(error, OOM_ERROR_MARKERS):
            return True
    return mentions_oom(log_tail())


def queue_waits(job: Job, attempts: Sequence[Attempt], since: float | None, now: float) -> tuple[list[float], bool]:
    """Waits that ended in the window (submission or requeue to start), and the open one if queued."""
    waits: list[float] = []
    ready: float | None = job.submitted_at
    for a in attempts:
        if ready is not None and (since is None or a.started_at >= since):
            waits.append(max(0.0, a.started_at - ready))
        ready = a.ended_at
    waiting = job.state == JobState.QUEUED and ready is not None
    if waiting and ready is not None:
        waits.append(max(0.0, now - ready))
    return waits, waiting


def training_tokens(attempts: Sequence[Attempt], events: Sequence[Event]) -> tuple[float, float]:
    """Tokens trained and training seconds, from the runtime's ``step`` events.

    Each ``step`` event carries ``tokens_per_s`` over the time since the previous one (or since
    ``train_start``), so the tokens of a window are that rate times the gap between the two events.
    """
    tokens = seconds = 0.0
    for a in attempts:
        mine = [e for e in events if e.attempt == a.n and e.source == "runtime"]
        prev = next((e.ts for e in mine if e.kind == EventKind.TRAIN_START), None)
        if prev is None:
            continue
        for e in mine:
            if e.kind != EventKind.STEP or e.ts < prev:
                continue
            rate = e.data.get("tokens_per_s")
            if isinstance(rate, int | float) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0:
                tokens += float(rate) * (e.ts - prev)
            seconds += e.ts - prev
            prev = e.ts
    return tokens, seconds


# --- judgement ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def _judge(measured: float | None, target: float | None, comparison: Comparison) -> bool | None:
    if measured is None or target is None:
        return None
    return measured >= target if comparison == ">=" else measured <= target


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _rate_budget(rate: float | None, target: float | None) -> float | None:
    return None if rate is None or not target else 1.0 - rate / target


def _wait_result(name: str, q: float, waits: Sequence[float], target: float | None) -> SloResult:
    measured = percentile(waits, q)
    budget = None
    if waits and target is not None:
        allowed = 1.0 - q / 100.0
        above = sum(1 for w in waits if w > target) / len(waits)
        budget = 1.0 - above / allowed
    return SloResult(
        name=name,
        objective=f"p{q:g} queue wait (submission or requeue to start, still-queued jobs at their wait so far)",
        measured=measured,
        target=target,
        comparison="<=",
        unit="s",
        met=_judge(measured, target, "<="),
        error_budget_remaining=budget,
        count=len(waits),
    )


def evaluate_slos(inputs: SloInputs, config: SloConfig) -> tuple[SloResult, ...]:
    """Every objective of ``config`` judged against ``inputs``."""
    ended_jobs = inputs.jobs_completed + inputs.jobs_failed
    availability = _ratio(inputs.jobs_completed, ended_jobs)
    avail_budget = None
    if availability is not None and config.availability is not None:
        avail_budget = 1.0 - (1.0 - availability) / (1.0 - config.availability)
    failure = _ratio(inputs.attempts_failed, inputs.attempts_ended)
    oom = _ratio(inputs.attempts_oom, inputs.attempts_ended)
    tokens_job = float(np.median(inputs.job_tokens_per_s)) if inputs.job_tokens_per_s else None
    per_hour = inputs.tokens / inputs.token_gpu_hours if inputs.token_gpu_hours > 0 else None
    return (
        SloResult(
            name="availability",
            objective="completed / ended jobs, user cancellations excluded",
            measured=availability,
            target=config.availability,
            comparison=">=",
            unit="ratio",
            met=_judge(availability, config.availability, ">="),
            error_budget_remaining=avail_budget,
            count=ended_jobs,
        ),
        SloResult(
            name="failure_rate",
            objective="failed or lost attempts / ended attempts, cancellations excluded",
            measured=failure,
            target=config.failure_rate,
            comparison="<=",
            unit="ratio",
            met=_judge(failure, config.failure_rate, "<="),
            error_budget_remaining=_rate_budget(failure, config.failure_rate),
            count=inputs.attempts_ended,
        ),
        SloResult(
            name="oom_rate",
            objective="attempts that died of out-of-memory / ended attempts, cancellations excluded",
            measured=oom,
            target=config.oom_rate,
            comparison="<=",
            unit="ratio",
            met=_judge(oom, config.oom_rate, "<="),
            error_budget_remaining=_rate_budget(oom, config.oom_rate),
            count=inputs.attempts_ended,
        ),
        _wait_result("queue_wait_p50", 50.0, inputs.queue_waits_s, config.queue_wait_p50_s),
        _wait_result("queue_wait_p95", 95.0, inputs.queue_waits_s, config.queue_wait_p95_s),
        SloResult(
            name="tokens_per_s_per_job",
            objective="median over jobs of each job's tokens per second of training",
            measured=tokens_job,
            target=config.tokens_per_s_per_job,
            comparison=">=",
            unit="tokens/s",
            met=_judge(tokens_job, config.tokens_per_s_per_job, ">="),
            error_budget_remaining=None,
            count=len(inputs.job_tokens_per_s),
        ),
        SloResult(
            name="tokens_per_gpu_hour",
            objective="tokens trained per GPU-hour, fleet-wide, over the jobs that report tokens",
            measured=per_hour,
            target=config.tokens_per_gpu_hour,
            comparison=">=",
            unit="tokens/GPU-h",
            met=_judge(per_hour, config.tokens_per_gpu_hour, ">="),
            error_budget_remaining=None,
            count=len(inputs.job_tokens_per_s),
        ),
    )


def breached(results: Sequence[SloResult]) -> list[SloResult]:
    """The objectives that were measured and missed."""
    return [r for r in results if r.met is False]


__all__ = [
    "OOM_ERROR_MARKERS",
    "OOM_LOG_MARKERS",
    "Comparison",
    "SloConfig",
    "SloInputs",
    "SloResult",
    "breached",
    "died_of_oom",
    "evaluate_slos",
    "load_slo",
    "mentions_oom",
    "percentile",
    "queue_waits",
    "training_tokens",
]
