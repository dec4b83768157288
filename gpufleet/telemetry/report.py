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
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.cost.ledger import AttemptUsage, Cost, build_ledger
from gpufleet.cost.rates import RateCard
from gpufleet.cost.usage import attempt_usage
from gpufleet.errors import UsageError
from gpufleet.fmt import finite_json
from gpufleet.paths import job_dir
from gpufleet.store import TERMINAL, Attempt, Event, Job, Store
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
SINCE_FORMS = "a duration like 90m, 24h or 7d, or an ISO date/time like 2026-01-31 or 2026-01-31T08:00 (UTC)"


def parse_since(text: str, now: float) -> float:
    """``--since``: ``90m``, ``24h``, ``7d`` before ``now``, or an ISO date/time (UTC unless it says)."""
    value = text.strip()
    match = _DURATION_RE.match(value.lower())
    if match:
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
        if seconds <= 0:
            raise UsageError(f"--since {text!r} is an empty window: give {SINCE_FORMS}")
        return now - seconds
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"--since {text!r} is not understood: give {SINCE_FORMS}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    ts = moment.timestamp()
    if ts > now:
        raise UsageError(f"--since {text!r} is in the future: give {SINCE_FORMS}")
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
                "since": None if self.since is None else _iso(self.since),
                "until": _iso(self.generated_at),
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
    store: Store,
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
    job's recorded DCGM samples (an empty sequence when there are none).
    """
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
    states = Counter(f.job.state for f in facts)
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
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - LOG_TAIL_BYTES))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


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
        "startup": h["restore"] + h["startup"],
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


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- writing: Markdown, JSON and charts ------------------------------------------------------

_COLORS = {
    "useful": "#3c9d6b",
    "idle": "#b0b0b0",
    "host_bound": "#f2a541",
    "comm_bound": "#7b5ea7",
    "checkpoint": "#1b2f5e",
    "startup": "#8c8c5a",
    "lost_to_preemption": "#d62728",
}
_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£"}
_HOW_TO_READ = """\
Each job's GPU-hours add up to its parts: **lost to preemption** (work redone after a preemption or \
rollback), **startup** (process start-up and checkpoint restore, the first start included), **checkpoint** \
(saving), and the rest split in the proportions its recorded GPU series shows: **idle** (no work for \
60 s or more), **host-bound** (shorter stalls between busy samples: the GPU waits for data), \
**comm-bound** (NVLink/PCIe busy while the SMs are not) and **useful**. Jobs marked `no series` had no \
recorded GPU series: all of their rest counts as useful. Attempts are counted whole when they overlap \
the window. Error budget left: 100 % untouched, 0 % spent, negative overspent."""


def write_report(report: FleetReport, out_dir: Path) -> list[Path]:
    """Write ``report.md``, ``report.json`` and the charts into ``out_dir``; the paths written."""
    import json

    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {str(out_dir)!r} is a file: give a folder for the report")
    out_dir.mkdir(parents=True, exist_ok=True)
    charts = {
        "teams.png": _chart_teams,
        "waste.png": _chart_waste,
        "queue_wait.png": _chart_queue,
        "slo.png": _chart_slo,
    }
    paths = [out_dir / "report.md", out_dir / "report.json"]
    paths[1].write_text(json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    for name, draw in charts.items():
        draw(report, out_dir / name)
        paths.append(out_dir / name)
    paths[0].write_text(report_markdown(report, list(charts)), encoding="utf-8")
    return paths


def report_markdown(report: FleetReport, charts: Sequence[str] = ()) -> str:
    """The report as a Markdown page embedding ``charts`` (file names next to it)."""
    cur, scale, unit = report.currency, *_gpu_unit(report.total.total_gpu_hours)
    window = f"since {_iso(report.since)}" if report.since is not None else "all history"
    who = f"team {report.team}" if report.team else "all teams"
    states = ", ".join(f"{n} {s}" for s, n in report.jobs_by_state.items()) or "none"
    out = [
        "# Fleet report",
        "",
        f"_{window} until {_iso(report.generated_at)}, {who}; prices in {cur}"
        + (f" (rate card as of {report.rate_card_as_of})_" if report.rate_card_as_of else "_"),
        "",
        f"Jobs: {states}. GPU time **{_num(report.total.total_gpu_hours * scale)} {unit}** over "
        f"{report.total.attempts} attempts, **{_money(report.total.money, cur)}**; "
        f"{len(report.breached)} of {len(report.slos)} objectives breached.",
        "",
    ]
    if report.unpriced:
        out += [f"> **Unpriced:** {', '.join(report.unpriced)}: counted in hours but not in money.", ""]
    rows = [
        [
            s.name,
            _slo_value(s.measured, s.unit),
            f"{s.comparison} {_slo_value(s.target, s.unit)}" if s.target is not None else "-",
            {True: "met", False: "**BREACHED**", None: "no data" if s.measured is None else "no target"}[s.met],
            "-" if s.error_budget_remaining is None else f"{s.error_budget_remaining:.0%}",
            str(s.count),
        ]
        for s in report.slos
    ]
    out += ["## Objectives", "", *_md_table(["SLO", "Measured", "Target", "Status", "Budget left", "Based on"], rows)]
    out += ["", *(f"![{Path(c).stem}]({c})" for c in charts), ""]
    rows = [
        [
            t.team,
            str(t.jobs),
            str(t.attempts),
            "-" if t.failure_rate is None else f"{t.failure_rate:.1%}",
            str(t.preemptions),
            _num(t.gpu_hours * scale),
            _num(t.lost_to_preemption_gpu_hours * scale),
            _money(t.money, cur),
        ]
        for t in report.teams
    ]
    head = ["Team", "Jobs", "Attempts", "Failure rate", "Preemptions", unit, f"Lost ({unit})", "Money"]
    out += ["## Teams", "", *_md_table(head, rows), ""]
    rows = [
        [
            f"#{j.job_id} {j.name}",
            j.team,
            j.state,
            _num(j.gpu_hours * scale),
            *(_num(j.breakdown[p] * scale) for p in WASTE_PARTS),
            "yes" if j.gpu_series else "no series",
        ]
        for j in report.jobs
    ]
    head = ["Job", "Team", "State", unit, *(p.replace("_", " ") for p in WASTE_PARTS), "GPU series"]
    out += [f"## Jobs, most waste first ({unit})", "", *_md_table(head, rows, text_columns=3), ""]
    out += ["## How to read this", "", _HOW_TO_READ, ""]
    return "\n".join(out)


def _md_table(head: list[str], rows: list[list[str]], text_columns: int = 1) -> list[str]:
    """A Markdown table: the first ``text_columns`` left-aligned, figures right-aligned."""

    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    lines = [
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" if i < text_columns else "---:" for i in range(len(head))) + " |",
    ]
    return lines + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]


def _gpu_unit(hours: float) -> tuple[float, str]:
    """GPU-seconds below 0.1 GPU-hour (laptop demos), GPU-hours above."""
    return (3600.0, "GPU-s") if hours < 0.1 else (1.0, "GPU-h")


def _num(x: float) -> str:
    """Three significant figures, thousands separators from 100 on."""
    if not math.isfinite(x):
        return "n/a"
    x = float(f"{x:.3g}")
    if x == 0 or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def _money(x: float, currency: str) -> str:
    symbol = _SYMBOLS.get(currency.upper())
    text = f"{x:,.2f}" if abs(x) >= 1 or x == 0 else f"{x:.3g}"
    return f"{symbol}{text}" if symbol else f"{text} {currency}"


def _slo_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ratio":
        return f"{value:.2%}"
    return f"{_num(value)} {unit}"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    plt = _pyplot()
    try:
        fig.savefig(path, dpi=110, format="png")
    finally:
        plt.close(fig)


def _chart_teams(report: FleetReport, path: Path) -> None:
    plt = _pyplot()
    scale, unit = _gpu_unit(max((t.gpu_hours for t in report.teams), default=0.0))
    teams = [t.team for t in report.teams]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 1.6 + 0.45 * max(1, len(teams))), layout="constrained")
    lost = [t.lost_to_preemption_gpu_hours * scale for t in report.teams]
    rest = [t.gpu_hours * scale - x for t, x in zip(report.teams, lost, strict=True)]
    left.barh(teams, rest, color=_COLORS["useful"], label="rest")
    left.barh(teams, lost, left=rest, color=_COLORS["lost_to_preemption"], label="lost to preemption")
    left.set(title=f"GPU time per team ({unit})", xlabel=unit)
    left.legend(fontsize=8, frameon=False)
    right.barh(teams, [t.money for t in report.teams], color="#1b2f5e")
    right.set(title=f"Money per team ({report.currency})", xlabel=report.currency)
    for ax in (left, right):
        ax.invert_yaxis()
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
    if not teams:
        left.text(0.5, 0.5, "no jobs in the window", ha="center", transform=left.transAxes)
    _save(fig, path)


def _chart_waste(report: FleetReport, path: Path) -> None:
    plt = _pyplot()
    jobs = list(report.jobs[:30])
    scale, unit = _gpu_unit(max((j.gpu_hours for j in jobs), default=0.0))
    fig, ax = plt.subplots(figsize=(10, 1.8 + 0.4 * max(1, len(jobs))), layout="constrained")
    labels = [f"#{j.job_id} {j.name} ({j.team})" + ("" if j.gpu_series else " *") for j in jobs]
    left = np.zeros(len(jobs))
    for part in WASTE_PARTS:
        width = np.array([j.breakdown[part] * scale for j in jobs])
        ax.barh(labels, width, left=left, color=_COLORS[part], label=part.replace("_", " "))
        left += width
    ax.invert_yaxis()
    ax.set(title=f"Where each job's GPU time went ({unit}), most waste first", xlabel=unit)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    note = "  (* no GPU series: the rest counts as useful)" if any(not j.gpu_series for j in jobs) else ""
    fig.legend(loc="outside lower center", ncols=len(WASTE_PARTS), fontsize=8, frameon=False, title=note or None)
    if not jobs:
        ax.text(0.5, 0.5, "no job ran in the window", ha="center", transform=ax.transAxes)
    _save(fig, path)


def _chart_queue(report: FleetReport, path: Path) -> None:
    plt = _pyplot()
    waits = np.asarray(report.queue_waits_s, dtype=np.float64)
    minutes = waits.size > 0 and float(waits.max()) >= 600
    scale, unit = (1 / 60, "min") if minutes else (1.0, "s")
    fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
    if waits.size:
        ax.hist(waits * scale, bins=min(30, max(5, waits.size)), color="#7aa6c2", edgecolor="white")
        for s in (r for r in report.slos if r.name.startswith("queue_wait_")):
            style = "--" if s.name.endswith("p50") else "-"
            if s.measured is not None:
                label = f"{s.name.removeprefix('queue_wait_')} = {_num(s.measured * scale)} {unit}"
                ax.axvline(s.measured * scale, color="#d62728", linestyle=style, label=label)
            if s.target is not None:
                label = f"{s.name.removeprefix('queue_wait_')} target <= {_num(s.target * scale)} {unit}"
                ax.axvline(s.target * scale, color="#333333", linestyle=":", linewidth=1, label=label)
        ax.legend(fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "no queue waits in the window", ha="center", transform=ax.transAxes)
    ax.set(title=f"Queue wait: submission or requeue to start ({unit})", xlabel=f"wait ({unit})")
    ax.set_ylabel("number of waits")
    ax.yaxis.get_major_locator().set_params(integer=True)
    _save(fig, path)


def _attainment(s: SloResult) -> float | None:
    """Measured over target (``>=``) or target over measured (``<=``): 1 is exactly on target."""
    if s.measured is None or s.target is None:
        return None
    if s.comparison == ">=":
        return s.measured / s.target if s.target else None
    return s.target / s.measured if s.measured > 0 else math.inf


def _chart_slo(report: FleetReport, path: Path) -> None:
    plt = _pyplot()
    names = [s.name for s in report.slos]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.45 * max(1, len(names))), layout="constrained")
    for y, s in enumerate(report.slos):
        value = _attainment(s)
        shown = 0.0 if value is None else min(value, 2.0)
        color = {True: "#3c9d6b", False: "#d62728", None: "#b0b0b0"}[s.met]
        ax.barh(y, shown, color=color)
        text = "no data" if s.measured is None else _slo_value(s.measured, s.unit)
        text += f" (target {s.comparison} {_slo_value(s.target, s.unit)})" if s.target is not None else " (no target)"
        ax.text(shown + 0.03, y, text, va="center", fontsize=8, bbox={"facecolor": "white", "edgecolor": "none"})
    ax.axvline(1.0, color="#333333", linewidth=1, zorder=0)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, 3.2)
    ax.set(title="SLO attainment (1 = on target; green met, red breached, grey not judged)", xlabel="attainment")
    _save(fig, path)
