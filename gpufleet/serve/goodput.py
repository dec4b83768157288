"""Where a job's GPU time went, as ``gpufleet serve`` shows it: goodput buckets, rank phases, stragglers, hangs.

- **Buckets** come from the ledger (:data:`gpufleet.cost.ledger.GOODPUT_BUCKETS`,
  ``AttemptUsage.goodput_seconds()``): every billed GPU-second of every attempt in exactly one bucket.
  Each attempt's part is priced at that attempt's own rate (its offer's price, else the rate card's), so
  a job that moved from spot to on-demand pays each bucket at what its seconds cost; egress is money
  but no GPU time and is left out of the split.
- **Phases** per rank come from the latest ``step`` event carrying ``rank_phase_s`` (seconds per step of
  each rank in each phase, over the steps since the event before).
- **Stragglers** are the runtime's ``straggler`` events, the latest one per (attempt, rank, phase,
  first step) being the truth; their tax (the GPU-seconds the other ranks waited) is priced like the
  buckets. **Hangs** are the ``rank_stalled`` events that say ``hung: true``.
- ``GET /metrics`` serves the buckets per job as Prometheus counters (:func:`metrics_text`).

Every value in an event was written by a user process: each is checked for its shape (finite
non-negative numbers, one per rank, bounded counts) and a malformed event is skipped, never shown.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.registry import Collector

from gpufleet.jobs.events import EventKind
from gpufleet.jobs.rank_phases import MAX_RANKS, PHASES, phase_table, rank_number, seconds
from gpufleet.jobs.rank_phases import stragglers as latest_stragglers
from gpufleet.jobs.store import Event, Store

if TYPE_CHECKING:
    from gpufleet.cost.ledger import AttemptUsage
    from gpufleet.cost.rates import RateCard

HANG_ACTIONS = frozenset({"killed", "reported"})
MAX_TEXT = 255
"""A host name or a phase longer than this is cut: the page and the API stay small whatever an event says."""


# ---- shapes of what the runtime wrote -------------------------------------------------------------


def _count(value: Any, top: int) -> int | None:
    """An integer from 0 to ``top``, else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top
    return value if ok else None


def _text(value: Any, default: str = "?") -> str:
    return value[:MAX_TEXT] if isinstance(value, str) and value else default


phase_lists = phase_table
"""``{phase: [seconds of rank 0, rank 1, ...]}`` from an event's field, else None
(:func:`gpufleet.jobs.rank_phases.phase_table`, under the name the page's code knows it by)."""


def rank_phases(steps: Sequence[Event]) -> dict[str, Any] | None:
    """The latest well-formed ``rank_phase_s`` of ``steps`` (oldest first), with its step and attempt; None
    when no step event carries one (an older job, a script without a session)."""
    for event in reversed(steps):
        phases = phase_table(event.data.get("rank_phase_s"))
        if phases is None:
            continue
        ranks = len(next(iter(phases.values())))
        totals = phase_table(event.data.get("phase_totals_s"), ranks)
        return {
            "attempt": event.attempt,
            "step": _count(event.data.get("step"), 2**63 - 1),
            "ts": event.ts,
            "ranks": ranks,
            "rank_phase_s": phases,
            "phase_totals_s": totals,
        }
    return None


def stragglers(events: Sequence[Event], rates: Mapping[int | None, float | None]) -> list[dict[str, Any]]:
    """The stragglers named in ``events`` (oldest first), the latest well-formed event of each
    (:func:`gpufleet.jobs.rank_phases.stragglers`), most tax first.

    ``rates``: each attempt's price of a GPU-hour (None: unpriced), for ``tax_money``."""
    rows = [{**s.to_dict(), "tax_money": s.tax_money(rates.get(s.attempt))} for s in latest_stragglers(events)]
    return sorted(rows, key=lambda r: (-r["tax_gpu_seconds"], r["attempt"], r["rank"]))


def hangs(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The watchdog's hang reports (``rank_stalled`` with ``hung: true``) in ``events``, oldest first."""
    out = []
    for event in events:
        d = event.data
        if event.kind != EventKind.RANK_STALLED or d.get("hung") is not True:
            continue
        raw = d.get("ranks")
        ranks = [r for r in (rank_number(x) for x in raw) if r is not None] if isinstance(raw, list) else []
        if not ranks or len(ranks) > 1024:
            continue
        raw_hosts, raw_where = d.get("hosts"), d.get("phases")
        hosts: list[Any] = raw_hosts if isinstance(raw_hosts, list) else []
        where: Mapping[str, Any] = raw_where if isinstance(raw_where, Mapping) else {}
        out.append(
            {
                "attempt": event.attempt,
                "ts": event.ts,
                "step": _count(d.get("step"), 2**63 - 1),
                "ranks": ranks,
                "hosts": [_text(hosts[i]) if i < len(hosts) else "?" for i in range(len(ranks))],
                "phases": {str(r): _hang_phase(where.get(str(r))) for r in ranks},
                "seconds": seconds(d.get("seconds")),
                "threshold_s": seconds(d.get("threshold_s")),
                "median_step_s": seconds(d.get("median_step_s")),
                "action": d.get("action") if d.get("action") in HANG_ACTIONS else None,
            }
        )
    return out


def _hang_phase(value: Any) -> str:
    return value if value in PHASES else "unknown"


# ---- the ledger's buckets ---------------------------------------------------------------------------


def attempt_rate(usage: AttemptUsage, rates: RateCard) -> float | None:
    """The price of one GPU-hour of ``usage`` as the ledger charged it (None: unpriced or no time)."""
    from gpufleet.cost.ledger import attempt_price

    return attempt_price(usage, rates) if usage.wall_s * usage.gpus > 0 else None


def bucket_split(usages: Sequence[AttemptUsage], rates: RateCard) -> dict[str, Any]:
    """GPU-seconds and money per goodput bucket over ``usages``, in the ledger's order, and the goodput.

    ``money`` is None for the whole split when an attempt with time has no price (a partial sum would
    read as the bill). ``goodput`` is ``compute`` over all; None when there is no time."""
    from gpufleet.cost.ledger import GOODPUT_BUCKETS

    seconds = dict.fromkeys(GOODPUT_BUCKETS, 0.0)
    money = dict.fromkeys(GOODPUT_BUCKETS, 0.0)
    priced = True
    for usage in usages:
        rate = attempt_rate(usage, rates)
        priced = priced and (rate is not None or usage.wall_s * usage.gpus <= 0)
        for bucket, wall in usage.goodput_seconds().items():
            seconds[bucket] += wall * usage.gpus
            money[bucket] += wall * usage.gpus / 3600.0 * (rate or 0.0)
    total = sum(seconds.values())
    return {
        "currency": rates.currency,
        "gpu_seconds": total,
        "money": sum(money.values()) if priced else None,
        "goodput": seconds["compute"] / total if total > 0 else None,
        "buckets": [
            {"bucket": b, "gpu_seconds": seconds[b], "money": money[b] if priced else None} for b in GOODPUT_BUCKETS
        ],
    }


def preemption_overhead(usages: Sequence[AttemptUsage], rates: RateCard, *, priced: bool) -> dict[str, Any]:
    """The GPU time and money ``usages`` spent only because they were preempted or killed: redone work and
    the restarts (:func:`gpufleet.cost.ledger.attempt_cost`, the ledger's own overhead), its share of the
    whole, and how many attempts were preempted and killed. ``money`` is None unless ``priced``."""
    from gpufleet.cost.ledger import Cost, attempt_cost

    cost = sum((attempt_cost(u, rates) for u in usages), Cost())
    return {
        "preemptions": cost.preemptions,
        "killed": cost.killed,
        "gpu_seconds": cost.preemption_overhead_gpu_hours * 3600.0,
        "money": cost.preemption_money if priced else None,
        "share": cost.preemption_share,
    }


def job_time_view(store: Store, job_id: int) -> dict[str, Any]:
    """``GET /api/jobs/{id}/goodput``: the job's buckets, what preemptions cost it, its ranks' phases, its
    stragglers and hangs."""
    from gpufleet.cost.rates import load_rates
    from gpufleet.cost.usage import job_usages

    rates = load_rates()
    usages = job_usages(store, store.job(job_id))
    per_attempt: dict[int | None, float | None] = {u.attempt: attempt_rate(u, rates) for u in usages}
    steps = store.events(job_id, (EventKind.STEP,))
    notable = store.events(job_id, (EventKind.STRAGGLER, EventKind.RANK_STALLED))
    split = bucket_split(usages, rates)
    return {
        "id": job_id,
        **split,
        "preemption": preemption_overhead(usages, rates, priced=split["money"] is not None),
        "phases": list(PHASES),
        "ranks": rank_phases(steps),
        "stragglers": stragglers(notable, per_attempt),
        "hangs": hangs(notable),
    }


# ---- /metrics --------------------------------------------------------------------------------------


class _Families(Collector):
    """A collector of families computed beforehand (one scrape's)."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Iterator[Any]:
        return iter(self.families)


def goodput_families(store: Store | None) -> list[Any]:
    """``gpufleet_goodput_gpu_seconds_total{team,job_id,bucket}`` and
    ``gpufleet_goodput_money_total{team,job_id,bucket,currency}`` for every job that ran.

    They are counters: a job's GPU-seconds only grow. A bucket may lose seconds to another one when an
    attempt ends (work after the last checkpoint becomes ``lost``); Prometheus reads such a drop as a
    reset of that one series, which ``increase()`` over a window tolerates. A job with an unpriced
    attempt has no money series."""
    from prometheus_client.core import CounterMetricFamily

    from gpufleet.cost.rates import load_rates
    from gpufleet.cost.usage import store_usages

    seconds = CounterMetricFamily(
        "gpufleet_goodput_gpu_seconds",
        "GPU-seconds billed to the job, by goodput bucket (compute is goodput).",
        labels=["team", "job_id", "bucket"],
    )
    money = CounterMetricFamily(
        "gpufleet_goodput_money",
        "Money billed to the job, by goodput bucket, at each attempt's price.",
        labels=["team", "job_id", "bucket", "currency"],
    )
    if store is not None:
        rates = load_rates()
        by_job: dict[int, list[AttemptUsage]] = {}
        for usage in store_usages(store):
            by_job.setdefault(usage.job_id, []).append(usage)
        for job_id, usages in sorted(by_job.items()):
            split = bucket_split(usages, rates)
            team = usages[0].team
            for row in split["buckets"]:
                seconds.add_metric([team, str(job_id), row["bucket"]], row["gpu_seconds"])
                if row["money"] is not None:
                    money.add_metric([team, str(job_id), row["bucket"], split["currency"]], row["money"])
    return [seconds, money]


def metrics_text(store: Store | None) -> bytes:
    """The Prometheus text exposition of :func:`goodput_families`, read from the ledger now."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(goodput_families(store)))
    return generate_latest(registry)


__all__ = [
    "MAX_RANKS",
    "PHASES",
    "attempt_rate",
    "bucket_split",
    "goodput_families",
    "hangs",
    "job_time_view",
    "metrics_text",
    "phase_lists",
    "preemption_overhead",
    "rank_phases",
    "stragglers",
]
