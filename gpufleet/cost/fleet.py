"""The fleet report: SLOs, use and money per team, and where each job's GPU time went.

The report covers a window ``[since, now]``. A job is in it when it was submitted in the window,
is still queued or running, or has an attempt that ended in it; attempts are counted whole (their
GPU-hours and money are not clipped at ``since``), so a figure never depends on where an attempt
happened to straddle the edge. Money comes from the cost ledger and the rate card given.

Each job's GPU-hours are split into parts that add up to them exactly::

    gpu_hours = lost_to_preemption + startup + checkpoint + useful + idle + host_bound + comm_bound

``lost_to_preemption`` is the ledger's lost bucket (work redone after a preemption or rollback);
``startup`` its startup + restore buckets (starting processes and reading checkpoints back, the
first start included); ``checkpoint`` is the ledger's. The rest, the ledger's ``useful``, is divided in the
proportions of GPU time that ``classify_gpu_time`` finds in the job's recorded DCGM series
(``busy`` becomes ``useful``). The series covers the whole run, so this is a proportional split,
not a sample-by-sample attribution. A job without a series keeps all of the rest as ``useful``
and says ``gpu_series: false``.

Beside that split, each job carries the ledger's goodput (``compute`` over all of its GPU time), its
twelve goodput buckets in GPU-seconds and its three largest badput buckets with their money (see
:mod:`gpufleet.cost.ledger`).

This module works the figures out; :mod:`gpufleet.cost.fleet_page` writes them as Markdown,
JSON and charts.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.cost.ledger import AttemptUsage, Cost, build_ledger
from gpufleet.cost.rates import RateCard
from gpufleet.cost.usage import attempt_usage
from gpufleet.errors import ParameterError
from gpufleet.fmt import finite_json
from gpufleet.jobs.store import TERMINAL, Attempt, Event, Job, Store
from gpufleet.outfiles import read_tail
from gpufleet.paths import job_dir
from gpufleet.telemetry.dcgm import Sample
from gpufleet.telemetry.diagnose import (
    GPU_UTIL,
    LINK_METRICS,
    SM_ACTIVE,
    BoolArray,
    DiagnosisConfig,
    series_from_samples,
)
from gpufleet.telemetry.slo import (
    SloConfig,
    SloInputs,
    SloResult,
    breached,
    died_of_oom,
    evaluate_slos,
    queue_waits,
    training_tokens,
)

GPU_CLASSES = ("busy", "comm_bound", "host_bound", "idle")
WASTE_PARTS = ("useful", "idle", "host_bound", "comm_bound", "checkpoint", "startup", "lost_to_preemption")
STATE_ORDER = ("queued", "running", "completed", "failed", "cancelled")
FAILED_OUTCOMES = ("failed", "lost")
"""Attempt outcomes that count as failures: the process failed, or the node or scheduler lost it."""
LOG_TAIL_BYTES = 64 * 1024

GpuSamples = Callable[[int], Sequence[Sample]]


# --- GPU time classes ---------------------------------------------------------------------------


def classify_gpu_time(
    samples: Sequence[Sample], *, sample_seconds: float | None = None, config: DiagnosisConfig | None = None
) -> dict[str, float]:
    """GPU-seconds per class (``busy``, ``comm_bound``, ``host_bound``, ``idle``) in DCGM samples.

    Per GPU and sample, with ``diagnose``'s thresholds (``DiagnosisConfig``):

    * ``comm_bound``: NVLink + PCIe TX + RX at or above ``link_busy_bytes_per_s`` while
      ``SM_ACTIVE`` < ``sm_active_low`` (the ``comm_bound`` rule's condition, sample by sample);
    * no work: ``GPU_UTIL`` < ``util_gap_pct`` and ``SM_ACTIVE`` (when known) < ``sm_active_low``
      (the ``host_bound`` rule's gap condition). A run of such samples lasting ``window_s`` (60 s)
      or more, or touching either end of the series (start-up, shut-down), is ``idle``; a shorter
      run between working samples is ``host_bound``: the GPU waited for the host between steps;
    * ``busy``: the rest, samples without a utilisation reading included (nothing shows them idle).

    ``sample_seconds`` is the spacing of samples; by default the median gap between timestamps.
    """
    out = dict.fromkeys(GPU_CLASSES, 0.0)
    series = series_from_samples(samples, step_s=sample_seconds)
    if not series.metrics:
        return out
    cfg = config or DiagnosisConfig()
    arrays = list(series.metrics.values())
    present = np.zeros(arrays[0].shape, dtype=np.bool_)
    for arr in arrays:
        present |= ~np.isnan(arr)
    nan = np.full(present.shape, np.nan)
    sm, util = series.metrics.get(SM_ACTIVE, nan), series.metrics.get(GPU_UTIL, nan)
    links = [series.metrics[name] for name in LINK_METRICS if name in series.metrics]
    traffic = np.nansum(np.stack(links), axis=0) if links else np.zeros(present.shape)
    comm = present & (traffic >= cfg.link_busy_bytes_per_s) & (sm < cfg.sm_active_low)
    no_work = present & ~comm & (util < cfg.util_gap_pct) & ~(sm >= cfg.sm_active_low)
    idle = _long_or_edge_runs(no_work, max(1, math.ceil(cfg.window_s / series.step_s - 1e-9)))
    classes = {"busy": present & ~comm & ~no_work, "comm_bound": comm, "host_bound": no_work & ~idle, "idle": idle}
    return {name: float(mask.sum()) * series.step_s for name, mask in classes.items()}


def _long_or_edge_runs(mask: BoolArray, min_len: int) -> BoolArray:
    """The runs of True in each row that are ``min_len`` long or more, or touch the row's ends."""
    out = np.zeros_like(mask)
    for r, row in enumerate(mask):
        edges = np.diff(np.concatenate(([0], row.astype(np.int8), [0])))
        for start, end in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
            if end - start >= min_len or start == 0 or end == row.size:
                out[r, start:end] = True
    return out


# --- the window --------------------------------------------------------------------------------

_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)([mhd])$")
_UNIT_S = {"m": 60.0, "h": 3600.0, "d": 86400.0}
_EARLIEST_SINCE = datetime(2, 1, 1, tzinfo=UTC).timestamp()
"""The earliest window start: a year above ``datetime.min``, so any time zone can still show it."""
SINCE_FORMS = "a duration like 90m, 24h or 7d, or an ISO date/time like 2026-01-31 or 2026-01-31T08:00 (UTC)"


def parse_since(since: str, now: float) -> float:
    """``since``: ``90m``, ``24h``, ``7d`` before ``now``, or an ISO date/time (UTC unless it says)."""
    value = since.strip()
    match = _DURATION_RE.match(value.lower())
    if match:
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
        if seconds <= 0:
            raise ParameterError("{since} is an empty window: give {forms!s}", since=since, forms=SINCE_FORMS)
        ts = now - seconds
    else:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ParameterError("{since} is not understood: give {forms!s}", since=since, forms=SINCE_FORMS) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        ts = moment.timestamp()
        if ts > now:
            raise ParameterError("{since} is in the future: give {forms!s}", since=since, forms=SINCE_FORMS)
    if not ts >= _EARLIEST_SINCE:  # also -inf: a window of 1e400 days
        raise ParameterError(
            "{since} starts before 0002-01-01, earlier than a date can show: give a shorter window or a later date",
            since=since,
        )
    return ts


# --- the report --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TeamUsage:
    """One team's jobs and attempts in the window, priced by the ledger."""

    team: str
    jobs: int
    attempts: int
    failed_attempts: int
    failure_rate: float | None
    """Failed or lost attempts / ended attempts, cancellations excluded (``None`` with none ended)."""
    gpu_hours: float
    lost_to_preemption_gpu_hours: float
    money: float
    on_demand_money: float
    preemptions: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JobWaste:
    """One job's GPU-hours in the window, and where they went."""

    job_id: int
    name: str
    team: str
    state: str
    attempts: int
    preemptions: int
    oom_attempts: int
    gpu_hours: float
    money: float
    breakdown: dict[str, float]
    """GPU-hours by part (``WASTE_PARTS``); they add up to ``gpu_hours``."""
    gpu_series: bool
    tokens_per_s: float | None
    goodput: float | None = None
    """Compute over all of the job's GPU time (the ledger's goodput buckets); ``None`` with none."""
    buckets: dict[str, float] = field(default_factory=dict)
    """GPU-seconds in each of the ledger's ``GOODPUT_BUCKETS`` (they add up to ``gpu_hours`` x 3600)."""
    badput_top: tuple[dict[str, Any], ...] = ()
    """The three largest buckets other than compute: ``bucket``, ``gpu_seconds`` and ``money``."""

    @property
    def waste_gpu_hours(self) -> float:
        return self.gpu_hours - self.breakdown["useful"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RateUsed:
    """A price the report used, and the GPU-hours it priced (``None``: the card has no row)."""

    gpu_type: str
    provider: str
    spot: bool
    price_per_gpu_hour: float | None
    gpu_hours: float


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetReport:
    """What ``gpufleet observe report`` shows; ``to_dict`` is its JSON."""

    generated_at: float
    """The end of the window (``now``)."""
    since: float | None
    team: str | None
    currency: str
    rate_card_as_of: str | None
    rates_used: tuple[RateUsed, ...]
    unpriced: tuple[str, ...]
    slos: tuple[SloResult, ...]
    jobs_by_state: dict[str, int]
    teams: tuple[TeamUsage, ...]
    jobs: tuple[JobWaste, ...]
    """Jobs that ran in the window, most wasted GPU-hours first."""
    queue_waits_s: tuple[float, ...]
    waiting_now: int
    """Jobs still queued at ``generated_at``: their wait so far is among ``queue_waits_s``."""
    total: Cost = field(default_factory=Cost)
    """The ledger's total over the attempts in the window."""

    @property
    def breached(self) -> list[SloResult]:
        return breached(self.slos)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: finite floats or ``null``, times as Unix seconds and ISO text."""
        data = {
            "window": {
                "since": None if self.since is None else iso_utc(self.since),
                "until": iso_utc(self.generated_at),
                "since_ts": self.since,
                "until_ts": self.generated_at,
            },
            "team": self.team,
            "currency": self.currency,
            "rate_card": {"as_of": self.rate_card_as_of, "rates_used": [asdict(r) for r in self.rates_used]},
            "unpriced": list(self.unpriced),
            "slos": [s.to_dict() for s in self.slos],
            "breached": [s.name for s in self.breached],
            "jobs_by_state": dict(self.jobs_by_state),
            "totals": {
                "jobs": sum(self.jobs_by_state.values()),
                "attempts": self.total.attempts,
                "gpu_hours": self.total.total_gpu_hours,
                "money": self.total.money,
                "on_demand_money": self.total.on_demand_money,
                "preemptions": self.total.preemptions,
            },
            "teams": [asdict(t) for t in self.teams],
            "jobs": [{**asdict(j), "waste_gpu_hours": j.waste_gpu_hours} for j in self.jobs],
            "queue_waits_s": list(self.queue_waits_s),
            "waiting_now": self.waiting_now,
        }
        finite: dict[str, Any] = finite_json(data)
        return finite


@dataclass(frozen=True, slots=True)
class _JobFacts:
    """One job as the report needs it, restricted to the window."""

    job: Job
    attempts: list[Attempt]
    usages: list[AttemptUsage]
    ended_in_window: bool
    waits: list[float]
    waiting: bool
    ended_attempts: int
    failed_attempts: int
    oom_attempts: int
    tokens: float
    token_seconds: float


def build_fleet_report(
    store: Store | None,
    home: Path,
    *,
    since: float | None,
    now: float,
    rates: RateCard,
    gpu_samples: GpuSamples,
    slo: SloConfig,
    team: str | None = None,
) -> FleetReport:
    """The report over ``[since, now]`` (all history when ``since`` is ``None``), for one team or all.

    Reads the store and the attempts' log tails under ``home``; ``gpu_samples(job_id)`` gives a
    job's recorded DCGM samples (an empty sequence when there are none). ``store`` is ``None`` for a
    home that has none yet: no jobs, and a report that reads no store creates none.
    """
    facts: list[_JobFacts] = []
    if store is not None:
        facts = [f for job in store.jobs(team=team) if (f := _job_facts(store, home, job, since, now)) is not None]
    usages = [u for f in facts for u in f.usages]
    ledger = build_ledger(usages, rates)
    jobs = []
    for f in facts:
        if f.job.id in ledger.jobs:
            jobs.append(_job_waste(f, ledger.jobs[f.job.id], gpu_samples(f.job.id)))
    jobs.sort(key=lambda j: (-j.waste_gpu_hours, j.job_id))
    token_jobs = [(f, j) for f in facts for j in jobs if j.job_id == f.job.id and f.tokens > 0]
    inputs = SloInputs(
        jobs_completed=sum(1 for f in facts if f.ended_in_window and f.job.state == "completed"),
        jobs_failed=sum(1 for f in facts if f.ended_in_window and f.job.state == "failed"),
        attempts_ended=sum(f.ended_attempts for f in facts),
        attempts_failed=sum(f.failed_attempts for f in facts),
        attempts_oom=sum(f.oom_attempts for f in facts),
        queue_waits_s=tuple(w for f in facts for w in f.waits),
        job_tokens_per_s=tuple(f.tokens / f.token_seconds for f, _ in token_jobs),
        tokens=sum(f.tokens for f, _ in token_jobs),
        token_gpu_hours=sum(j.gpu_hours for _, j in token_jobs),
    )
    states: Counter[str] = Counter(f.job.state for f in facts)
    order = [s for s in STATE_ORDER if s in states] + sorted(set(states) - set(STATE_ORDER))
    return FleetReport(
        generated_at=now,
        since=since,
        team=team,
        currency=rates.currency,
        rate_card_as_of=rates.as_of,
        rates_used=_rates_used(usages, rates),
        unpriced=ledger.total.unpriced,
        slos=evaluate_slos(inputs, slo),
        jobs_by_state={s: states[s] for s in order},
        teams=tuple(_team_usage(t, facts, ledger.teams.get(t, Cost())) for t in sorted({f.job.team for f in facts})),
        jobs=tuple(jobs),
        queue_waits_s=inputs.queue_waits_s,
        waiting_now=sum(1 for f in facts if f.waiting),
        total=ledger.total,
    )


def _job_facts(store: Store, home: Path, job: Job, since: float | None, now: float) -> _JobFacts | None:
    attempts, events = store.attempts(job.id), store.events(job.id)
    end = _job_end(job, attempts, events)
    live = job.state not in TERMINAL
    in_window = (
        since is None
        or live
        or job.submitted_at >= since
        or (end is not None and end >= since)
        or any(a.ended_at is None or a.ended_at >= since for a in attempts)
    )
    if not in_window:
        return None
    mine = [a for a in attempts if since is None or a.ended_at is None or a.ended_at >= since]
    ended = [a for a in mine if a.ended_at is not None and a.outcome != "cancelled"]
    logs = job_dir(home, job.id) / "logs"
    oom = sum(
        died_of_oom(a.outcome, [e for e in events if e.attempt == a.n], partial(_tail, logs / f"attempt-{a.n}.log"))
        for a in ended
    )
    waits, waiting = queue_waits(job, attempts, since, now)
    tokens, seconds = training_tokens(mine, events)
    return _JobFacts(
        job=job,
        attempts=mine,
        usages=[attempt_usage(job, a, events, now) for a in mine],
        ended_in_window=not live and end is not None and (since is None or end >= since),
        waits=waits,
        waiting=waiting,
        ended_attempts=len(ended),
        failed_attempts=sum(1 for a in ended if a.outcome in FAILED_OUTCOMES),
        oom_attempts=oom,
        tokens=tokens,
        token_seconds=seconds,
    )


def _job_end(job: Job, attempts: Sequence[Attempt], events: Sequence[Event]) -> float | None:
    """When a job reached its terminal state: its terminal event, else its last attempt's end."""
    if job.state not in TERMINAL:
        return None
    marks = [e.ts for e in events if e.kind == job.state]
    ends = [a.ended_at for a in attempts if a.ended_at is not None]
    return max(marks) if marks else max(ends) if ends else job.updated_at


def _tail(path: Path) -> str:
    tail = read_tail(path, LOG_TAIL_BYTES)  # a regular file only, bounded: never a device or a FIFO
    return "" if tail is None else tail[0].decode("utf-8", errors="replace")


def _job_waste(f: _JobFacts, cost: Cost, samples: Sequence[Sample]) -> JobWaste:
    h = cost.gpu_hours
    rest = h["useful"]
    classes = classify_gpu_time(samples) if samples else dict.fromkeys(GPU_CLASSES, 0.0)
    seen = sum(classes.values())
    share = {k: v / seen for k, v in classes.items()} if seen > 0 else {"busy": 1.0}
    parts = {
        "useful": rest * share.get("busy", 0.0),
        "idle": rest * share.get("idle", 0.0),
        "host_bound": rest * share.get("host_bound", 0.0),
        "comm_bound": rest * share.get("comm_bound", 0.0),
        "checkpoint": h["checkpoint"],
        "startup": h["restore"] + h["staging"] + h["startup"],
        "lost_to_preemption": h["lost"],
    }
    return JobWaste(
        job_id=f.job.id,
        name=f.job.name,
        team=f.job.team,
        state=f.job.state,
        attempts=cost.attempts,
        preemptions=cost.preemptions,
        oom_attempts=f.oom_attempts,
        gpu_hours=cost.total_gpu_hours,
        money=cost.money,
        breakdown={k: parts[k] for k in WASTE_PARTS},
        gpu_series=seen > 0,
        tokens_per_s=f.tokens / f.token_seconds if f.tokens > 0 and f.token_seconds > 0 else None,
        goodput=cost.goodput,
        buckets=cost.bucket_gpu_seconds(),
        badput_top=tuple({"bucket": k, "gpu_seconds": v, "money": m} for k, v, m in cost.badput_top()),
    )


def _team_usage(team: str, facts: Sequence[_JobFacts], cost: Cost) -> TeamUsage:
    mine = [f for f in facts if f.job.team == team]
    ended, failed = sum(f.ended_attempts for f in mine), sum(f.failed_attempts for f in mine)
    h = cost.gpu_hours
    return TeamUsage(
        team=team,
        jobs=len(mine),
        attempts=sum(len(f.attempts) for f in mine),
        failed_attempts=failed,
        failure_rate=failed / ended if ended else None,
        gpu_hours=cost.total_gpu_hours,
        lost_to_preemption_gpu_hours=h["lost"],
        money=cost.money,
        on_demand_money=cost.on_demand_money,
        preemptions=cost.preemptions,
    )


def _rates_used(usages: Sequence[AttemptUsage], rates: RateCard) -> tuple[RateUsed, ...]:
    hours: dict[tuple[str, str, bool], float] = {}
    for u in usages:
        key = (u.gpu_type, u.provider, u.spot)
        hours[key] = hours.get(key, 0.0) + u.wall_s * u.gpus / 3600.0
    return tuple(
        RateUsed(gpu_type=g, provider=p, spot=s, price_per_gpu_hour=rates.price(g, p, spot=s), gpu_hours=h)
        for (g, p, s), h in sorted(hours.items())
    )


def iso_utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "FAILED_OUTCOMES",
    "GPU_CLASSES",
    "LOG_TAIL_BYTES",
    "SINCE_FORMS",
    "STATE_ORDER",
    "WASTE_PARTS",
    "FleetReport",
    "GpuSamples",
    "JobWaste",
    "RateUsed",
    "TeamUsage",
    "build_fleet_report",
    "classify_gpu_time",
    "iso_utc",
    "parse_since",
]
