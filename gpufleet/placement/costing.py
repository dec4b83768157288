"""The placement planner's cost tables: every number it compares, computed on numpy arrays at once.

:func:`build_tables` turns a batch of jobs and a catalogue into :class:`CostTables`: per job and candidate
(an offer in one market; candidate ``c`` is offer ``c // 2``, spot when odd) the compute hours,
the checkpoint interval and preemption loss on spot, the expected hours and the expected cost of
:mod:`gpufleet.placement.planner`'s docstring, the GPUs rented, the preference rank and the quota
row, with ``inf`` where a static filter (match, block, throughput, memory, quota row, progress,
deadline) rules the candidate out. Jobs sharing a class (GPU count, workload, checkpoint settings,
spot, memory) share per-offer unit rows, computed once per class; a job's numbers are its class
row times its work, plus its egress. :class:`_OfferColumns` is the catalogue as columns.

It is apart from :mod:`gpufleet.placement.planner`, which chooses (capacity and quota consumed job
by job) and explains (reasons, :class:`~gpufleet.placement.planner.Choice` values), so the
arithmetic reads and changes in one place; it imports nothing from the planner (the planner
imports it) and is private to the placement package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpufleet.errors import UsageError
from gpufleet.estimate.interval import SECONDS_PER_HOUR
from gpufleet.placement.catalog import Catalog
from gpufleet.placement.quota import NO_QUOTA, QuotaBook
from gpufleet.spec import JobSpec, OfferChoice

DEFAULT_INTERVAL_SECONDS = 1800.0
MAX_PREEMPTIONS_PER_HOUR = 60.0
"""Most spot preemptions per node-hour a catalogue may claim: one a minute, 240 times the example
catalogue's most pessimistic 0.25 and far beyond any cloud's spot market (AWS's worst interruption
band is "above 20%" a month); tests model bursts at 50. A larger figure is a unit mistake. Near the
bound a restart is preempted before its first checkpoint and the simulator replays every one of
those preemptions, so the run time grows with the rate (a 50-job month of ``gpufleet simulate``:
1.3 s at 10/h, 115 s at 60/h, hours at 1e4/h)."""
MAX_GPU_HOURS = 1e9
"""Most ``placement.gpu_hours`` of one job: about 114,000 GPU-years, a hundred times today's largest runs."""
MAX_CHECKPOINT_GB = 1e9
"""Most ``placement.checkpoint_gb`` of one job: an exabyte."""
F8 = npt.NDArray[np.float64]
I8 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


def check_rates(catalog: Catalog) -> None:
    """Raise :class:`UsageError` naming the first offer whose spot preemption rate is not a number in
    ``[0, MAX_PREEMPTIONS_PER_HOUR]``: the planner's and the simulator's arithmetic assume physical rates."""
    for i, offer in enumerate(catalog.offers):
        rate = offer.spot_preemptions_per_hour
        if not 0 <= rate <= MAX_PREEMPTIONS_PER_HOUR:  # also NaN and infinity
            raise UsageError(
                f"offers[{i}] ({offer.key}): spot_preemptions_per_hour {rate:g} is out of range: give preemptions "
                f"per node-hour from 0 to {MAX_PREEMPTIONS_PER_HOUR:g} (one a minute)"
            )


def _tiers(job: JobSpec, cols: _OfferColumns, home: int | None) -> I8:
    """Per offer: its rank among the job's preferences (lower wins), -1 when it is no candidate.

    With ``ordered`` the rank is the index of the first choice the offer matches, otherwise 0.
    With a failover ``home`` provider index, ranks become ``2 * rank + (offer not at home)``.
    """
    p = job.placement
    choices = p.ordered or p.any_of or [OfferChoice()]
    tier = np.full(len(cols.provider), -1, dtype=np.int64)
    for i, choice in enumerate(choices):
        mask = (cols.type_name == (choice.gpu_type or job.resources.gpu_type)) & (tier < 0)
        if choice.provider is not None:
            mask &= cols.provider_name == choice.provider
        if choice.region is not None:
            mask &= cols.region_name == choice.region
        tier[mask] = i if p.ordered else 0
    if home is not None:
        tier = np.where(tier >= 0, tier * 2 + (cols.provider != home), tier)
    return tier


@dataclass(eq=False)
class _OfferColumns:
    """The catalogue's offers as columns (index ``o``); candidate ``c`` is offer ``c // 2``, spot if odd."""

    type_name: npt.NDArray[np.str_]
    provider_name: npt.NDArray[np.str_]
    region_name: npt.NDArray[np.str_]
    provider: I8
    gpus_per_node: I8
    on_demand: F8
    spot: F8
    rate: F8
    memory: F8
    blocked: B

    @classmethod
    def of(cls, catalog: Catalog, blocked: Sequence[bool]) -> _OfferColumns:
        """``blocked``: per offer, whether a block target covers it."""
        offers, providers = catalog.offers, catalog.providers
        return cls(
            type_name=np.array([o.gpu_type for o in offers], dtype=str),
            provider_name=np.array([o.provider for o in offers], dtype=str),
            region_name=np.array([o.region for o in offers], dtype=str),
            provider=np.array([providers.index(o.provider) for o in offers], dtype=np.int64),
            gpus_per_node=np.array([o.gpus_per_node for o in offers], dtype=np.int64),
            on_demand=np.array([o.on_demand_per_gpu_hour for o in offers], dtype=float),
            spot=np.array([np.nan if o.spot_per_gpu_hour is None else o.spot_per_gpu_hour for o in offers]),
            rate=np.array([o.spot_preemptions_per_hour for o in offers], dtype=float),
            memory=np.array([catalog.gpu_types[o.gpu_type].memory_gib for o in offers], dtype=float),
            blocked=np.array(blocked, dtype=bool),
        )


def pair_markets(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Interleave on-demand and spot columns: ``(..., O)`` twice -> ``(..., 2 * O)``."""
    return np.stack([a, b], axis=-1).reshape(*a.shape[:-1], 2 * a.shape[-1])


def _column(values: Sequence[float]) -> F8:
    return np.array(values, dtype=float).reshape(-1, 1)


def _index(keys: Sequence[Any]) -> tuple[list[Any], I8]:
    """Distinct keys in first-seen order, and each item's position among them."""
    seen: dict[Any, int] = {}
    rows = np.array([seen.setdefault(k, len(seen)) for k in keys], dtype=np.int64)
    return list(seen), rows


def _class_key(job: JobSpec) -> tuple[Any, ...]:
    """What the per-offer unit numbers of a job depend on (not its amount of work, deadline or team)."""
    p, ck = job.placement, job.checkpoint
    stepped = None if ck.every_steps is None or p.step_seconds is None else ck.every_steps * p.step_seconds
    return (
        job.resources.gpus,
        p.workload,
        p.save_seconds,
        ck.every_seconds,
        stepped,
        p.restore_seconds,
        job.spot,
        p.memory_gib,
    )


def _interval_source(job: JobSpec) -> str:
    p, ck = job.placement, job.checkpoint
    if p.save_seconds is not None:
        return "young-daly"
    if ck.every_seconds is not None or (ck.every_steps is not None and p.step_seconds is not None):
        return "configured"
    return "assumed"


@dataclass(eq=False)
class CostTables:
    """Every number the planner compares. Jobs sharing a class (GPU count, workload, checkpoint
    settings, spot, memory) share per-offer *unit* rows ``(K, O)``; a job's numbers are its class
    row times its work ``W``, plus its egress. Candidate ``c`` is offer ``c // 2``, spot when odd."""

    jobs: Sequence[JobSpec]
    catalog: Catalog
    blocked: frozenset[str]
    now_hours: float
    stay: Mapping[str, str]
    """Job name -> provider ranked first (failover)."""
    cols: _OfferColumns
    work: F8  # (J,) W
    klass: I8  # (J,) class row
    throughput: F8  # (K, O) relative throughput, NaN where the type lacks the workload
    unit_hours: F8  # (K, O) compute hours per unit of work: 1 / (r * g)
    interval: F8  # (K, O) checkpoint interval on spot, seconds
    loss: F8  # (K, O) preemption loss fraction on spot
    stretch: F8  # (K, O) 1 / (1 - loss), inf when no progress
    spot_ok: B  # (K, O) spot allowed and sold
    alloc: I8  # (K, C) GPUs rented
    leaving: F8  # (P + 1, O) egress price per GB from each provider (last row: from outside)
    source: I8  # (J,) row of ``leaving``
    tier_row: I8  # (J,) row of ``tiers``
    tiers: I8  # (S, C) candidate ranks (lower wins), -1 not a candidate
    ranked: B  # (J,) more than one rank among the job's candidates
    resources: I8  # (T, C) quota row per team, UNGOVERNED or NO_QUOTA
    team_row: I8  # (J,) row of ``resources``
    key: F8  # (J, C) expected cost; inf when statically out
    interval_source: list[str]

    def hours(self, j: int) -> F8:
        with np.errstate(over="ignore"):
            hours: F8 = self.unit_hours[self.klass[j]] * self.work[j]
        return hours

    def spot_hours(self, j: int) -> F8:
        with np.errstate(over="ignore", invalid="ignore"):
            hours: F8 = self.hours(j) * self.stretch[self.klass[j]]
        return hours

    def egress(self, j: int) -> F8:
        with np.errstate(over="ignore"):
            cost: F8 = self.leaving[self.source[j]] * self.jobs[j].placement.checkpoint_gb
        return cost

    def expected(self, j: int) -> F8:
        return pair_markets(self.hours(j), self.spot_hours(j))

    def total(self, j: int) -> F8:
        """Expected cost of every candidate of job ``j``."""
        cols, a, eg = self.cols, self.alloc[self.klass[j], ::2], self.egress(j)
        with np.errstate(over="ignore", invalid="ignore"):
            return pair_markets(cols.on_demand * a * self.hours(j) + eg, cols.spot * a * self.spot_hours(j) + eg)


def build_tables(
    jobs: Sequence[JobSpec],
    catalog: Catalog,
    blocked: frozenset[str],
    blocked_offers: Sequence[bool],
    now_hours: float,
    stay: Mapping[str, str],
    book: QuotaBook,
) -> CostTables:
    """All the arithmetic of the planner's docstring: per class ``(K, O)``, then per job ``(J, O)``.

    ``blocked``: the block targets (kept for the explanations); ``blocked_offers``: per offer,
    whether one of them covers it. A product that overflows (huge prices) is ``inf``, silently:
    the planner reports such a candidate as ``cost_not_finite``.
    """
    with np.errstate(over="ignore"):
        return _build_tables(jobs, catalog, blocked, blocked_offers, now_hours, stay, book)


def _build_tables(
    jobs: Sequence[JobSpec],
    catalog: Catalog,
    blocked: frozenset[str],
    blocked_offers: Sequence[bool],
    now_hours: float,
    stay: Mapping[str, str],
    book: QuotaBook,
) -> CostTables:
    offers, providers, cols = catalog.offers, catalog.providers, _OfferColumns.of(catalog, blocked_offers)
    n_offers = len(offers)
    classes, klass = _index([_class_key(j) for j in jobs])

    # Per class: throughput, hours per unit of work, nodes, checkpoint interval, preemption loss.
    gpus, workload, save, every, stepped, restore, spot, memory = (list(x) for x in zip(*classes, strict=True))
    types = list(catalog.gpu_types)
    offer_type = np.array([types.index(o.gpu_type) for o in offers], dtype=np.int64)
    table = np.array([[catalog.gpu_types[t].throughput.get(w, np.nan) for t in types] for w in workload])
    throughput = table.reshape(len(classes), len(types))[:, offer_type]
    g = _column(gpus)
    unit_hours = 1.0 / (throughput * g)
    alloc = (np.ceil(g / cols.gpus_per_node) * cols.gpus_per_node).astype(np.int64)

    def known(values: list[float | None]) -> F8:
        return _column([np.nan if v is None else v for v in values])

    s, e, st = known(save), known(every), known(stepped)
    with np.errstate(divide="ignore", invalid="ignore"):
        configured = np.where(np.isnan(e), np.where(np.isnan(st), DEFAULT_INTERVAL_SECONDS, st / throughput), e)
        interval = np.where(np.isnan(s), configured, np.sqrt(2.0 * s * SECONDS_PER_HOUR / cols.rate))
        loss = np.where(cols.rate > 0, cols.rate * (interval / 2.0 + _column(restore)) / SECONDS_PER_HOUR, 0.0)
        stretch = np.where(loss < 1.0, 1.0 / (1.0 - loss), np.inf)
        spot_ok = np.array(spot, dtype=bool).reshape(-1, 1) & ~np.isnan(cols.spot)
        out = np.isnan(throughput) | (_column([m or 0.0 for m in memory]) > cols.memory)
        od_unit = np.where(out, np.inf, cols.on_demand * alloc * unit_hours)
        spot_unit = np.where(out | ~spot_ok | np.isinf(stretch), np.inf, cols.spot * alloc * unit_hours * stretch)

    # Per preference shape and per team: candidate ranks, quota rows.
    homes = [stay.get(j.name) for j in jobs]
    shapes, tier_row = _index(
        [(j.resources.gpu_type, bool(j.placement.ordered), tuple(j.placement.ordered or j.placement.any_of), h)
         for j, h in zip(jobs, homes, strict=True)]
    )  # fmt: skip
    first: dict[int, int] = {}
    for i, shape_row in enumerate(tier_row.tolist()):
        first.setdefault(shape_row, i)
    tier_rows = [
        _tiers(jobs[first[i]], cols, providers.index(home) if (home := shape[3]) in providers else None)
        for i, shape in enumerate(shapes)
    ]
    tiers = np.array(tier_rows, dtype=np.int64).reshape(len(shapes), n_offers)
    ranked = np.array([len(set(t[t >= 0].tolist())) > 1 for t in tiers])[tier_row]
    teams, team_row = _index([j.team for j in jobs])
    quota_rows = np.array([[book.resource(t, o.gpu_type, o.provider) for o in offers] for t in teams], dtype=np.int64)
    quota_rows = quota_rows.reshape(len(teams), n_offers)
    shut = (tiers < 0)[tier_row] | (quota_rows == NO_QUOTA)[team_row] | cols.blocked

    # Per job: work times the class's unit cost, plus egress; deadlines only where there are some.
    work = np.array([j.placement.gpu_hours or j.resources.gpus for j in jobs], dtype=float)
    w = work.reshape(-1, 1)
    on_demand = np.where(shut, np.inf, w * od_unit[klass])
    spot_cost = np.where(shut, np.inf, w * spot_unit[klass])
    rate_of = [max(o.egress_per_gb for o in catalog.offers_for(provider=p)) for p in providers]
    leaving = np.array([[rate_of[p] if p != q else 0.0 for q in cols.provider] for p in range(len(providers))])
    leaving = np.vstack([leaving.reshape(len(providers), n_offers), np.zeros((1, n_offers))])
    source = np.array([providers.index(j.provider) if j.provider in providers else -1 for j in jobs], dtype=np.int64)
    gb = np.array([j.placement.checkpoint_gb for j in jobs], dtype=float)
    moving = np.flatnonzero((gb > 0) & (source >= 0))
    if len(moving):
        cost = leaving[source[moving]] * gb[moving].reshape(-1, 1)
        on_demand[moving] += cost
        spot_cost[moving] += cost
    deadline = np.array([j.placement.deadline_hours or np.inf for j in jobs], dtype=float)
    due = np.flatnonzero(np.isfinite(deadline))
    if len(due):
        hours = w[due] * unit_hours[klass[due]]
        limit = deadline[due].reshape(-1, 1)
        on_demand[due] = np.where(hours > limit, np.inf, on_demand[due])
        with np.errstate(invalid="ignore"):
            spot_cost[due] = np.where(~(hours * stretch[klass[due]] <= limit), np.inf, spot_cost[due])
    key = pair_markets(on_demand, spot_cost)
    return CostTables(
        jobs=jobs,
        catalog=catalog,
        blocked=blocked,
        now_hours=now_hours,
        stay=dict(stay),
        cols=cols,
        work=work,
        klass=klass,
        throughput=throughput,
        unit_hours=unit_hours,
        interval=interval,
        loss=loss,
        stretch=stretch,
        spot_ok=spot_ok,
        alloc=np.repeat(alloc, 2, axis=1),
        leaving=leaving,
        source=source,
        tier_row=tier_row,
        tiers=np.repeat(tiers, 2, axis=1),
        ranked=ranked,
        resources=np.repeat(quota_rows, 2, axis=1),
        team_row=team_row,
        key=np.where(np.isnan(key), np.inf, key),  # an overflow (inf - inf, 0 * inf) is no candidate
        interval_source=[_interval_source(j) for j in jobs],
    )


__all__ = [
    "DEFAULT_INTERVAL_SECONDS",
    "F8",
    "I8",
    "MAX_CHECKPOINT_GB",
    "MAX_GPU_HOURS",
    "MAX_PREEMPTIONS_PER_HOUR",
    "B",
    "CostTables",
    "build_tables",
    "check_rates",
    "pair_markets",
]
