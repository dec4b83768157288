"""The placement planner's cost tables: every number it compares, computed on numpy arrays at once.

:func:`build_tables` turns a batch of jobs and a catalogue into :class:`CostTables`: per job and candidate
(an offer in one market; candidate ``c`` is offer ``c // 2``, spot when odd) the compute hours,
the checkpoint interval and preemption loss on spot, the expected hours and the expected cost of
:mod:`gpufleet.placement.planner`'s docstring, the GPUs rented, the preference rank and the quota
row, with ``inf`` where a static filter (match, block, throughput, memory, quota row, progress,
deadline) rules the candidate out. Jobs sharing a class (GPU count, workload, checkpoint settings,
spot, memory) share per-offer unit rows, computed once per class; a job's numbers are its class
row times its work, plus its egress. Which offers a job may use, and at which rank, is
:mod:`gpufleet.placement.candidates`'s part.

**Memory.** Only what is per class, per preference shape, per team or per job is kept: the
expected costs themselves, a jobs x candidates matrix (1.6 GB of float64 at 100,000 jobs x 1,000
offers), are computed by :meth:`CostTables.block` a block of jobs at a time, as the planner reaches
them, over the candidates of each job's offer group (:mod:`gpufleet.placement.candidates`), and
again by :meth:`CostTables.key` for one job when its explanation is read. A cell is the same
elementwise arithmetic whatever the block, so a cost never depends on how the jobs were cut.

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
from gpufleet.placement.candidates import (
    F8,
    I8,
    B,
    OfferColumns,
    OfferGroup,
    Ranks,
    cut_group,
    index,
    preferences,
)
from gpufleet.placement.catalog import Catalog
from gpufleet.placement.quota import NO_QUOTA, QuotaBook
from gpufleet.spec import JobSpec

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


def pair_markets(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Interleave on-demand and spot columns: ``(..., O)`` twice -> ``(..., 2 * O)``."""
    return np.stack([a, b], axis=-1).reshape(*a.shape[:-1], 2 * a.shape[-1])


def _column(values: Sequence[float]) -> F8:
    return np.array(values, dtype=float).reshape(-1, 1)


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
    row times its work ``W``, plus its egress. Candidate ``c`` is offer ``c // 2``, spot when odd.
    The expected costs of all jobs at once are never held: :meth:`block` makes them for a block of
    jobs, over the candidates of each job's :class:`~gpufleet.placement.candidates.OfferGroup`."""

    jobs: Sequence[JobSpec]
    catalog: Catalog
    blocked: frozenset[str]
    now_hours: float
    stay: Mapping[str, str]
    """Job name -> provider ranked first (failover)."""
    cols: OfferColumns
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
    checkpoint_gb: F8  # (J,)
    deadline: F8  # (J,) hours, inf when none
    groups: list[OfferGroup]
    group: I8  # (J,) the job's offer group
    slot: I8  # (J,) the row of the job's preference shape in its group's ``tiers``
    ranked: B  # (J,) more than one rank among the job's candidates
    resources: I8  # (T, C) quota row per team, UNGOVERNED or NO_QUOTA
    team_row: I8  # (J,) row of ``resources``

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

    def offer_tiers(self, j: int) -> Ranks:
        """Rank of every offer for job ``j`` (lower wins), -1 where it is no candidate."""
        group = self.groups[self.group[j]]
        tiers = np.full(len(self.cols.provider), -1, dtype=group.tiers.dtype)
        tiers[group.offers] = group.tiers[self.slot[j]]
        return tiers

    def tiers(self, j: int) -> Ranks:
        """Rank of every candidate of job ``j`` (both markets of an offer share it)."""
        return np.repeat(self.offer_tiers(j), 2)

    def interval_source(self, j: int) -> str:
        """``young-daly``, ``configured`` or ``assumed``: where job ``j``'s spot checkpoint interval comes from."""
        return _interval_source(self.jobs[j])

    def key(self, j: int) -> F8:
        """The expected cost of every candidate of job ``j``, ``inf`` where a static filter rules it out."""
        g = int(self.group[j])
        key = np.full(2 * len(self.cols.provider), np.inf)
        key[self.groups[g].candidates] = self._keys(g, np.array([j], dtype=np.int64), None)[0]
        return key

    def block(self, rows: I8, left: I8) -> list[tuple[OfferGroup, F8, int]]:
        """For each job of ``rows``: its offer group, the expected cost of each of the group's candidates
        (``inf`` where a static filter rules it out, or ``left`` lacks the GPUs it rents), and the
        position of the cheapest (the lowest on a tie; -1 when the group has no offer)."""
        out: dict[int, tuple[OfferGroup, F8, int]] = {}
        group = self.group[rows]
        for g in np.unique(group).tolist():
            at = np.flatnonzero(group == g)
            keys = self._keys(g, rows[at], left)
            firsts = keys.argmin(axis=1).tolist() if keys.shape[1] else [-1] * len(at)
            for i, key, first in zip(at.tolist(), keys, firsts, strict=True):
                out[i] = (self.groups[g], key, first)
        return [out[i] for i in range(len(rows))]

    def _keys(self, g: int, rows: I8, left: I8 | None) -> F8:
        """``(len(rows), 2m)``: the costs of the planner's docstring, ``inf`` where out. The products and
        sums cannot give NaN here (work and egress are finite and non-negative, NaN unit costs were
        made ``inf``), so a cell is ``inf`` exactly where one of the masks says so."""
        group = self.groups[g]
        k, w = self.klass[rows], self.work[rows].reshape(-1, 1)
        with np.errstate(over="ignore", invalid="ignore"):
            key: F8 = np.take(group.unit_cost, k, axis=0)
            key *= w
            gb, source = self.checkpoint_gb[rows], self.source[rows]
            moving = np.flatnonzero((gb > 0) & (source >= 0))
            if len(moving):
                key[moving] += np.repeat(group.leaving[source[moving]] * gb[moving].reshape(-1, 1), 2, axis=1)
            shut = np.take(group.tiers, self.slot[rows], axis=0) < 0
            shut |= np.take(group.shut, self.team_row[rows], axis=0)
            if left is not None:
                shut |= np.take(left[group.candidates[::2]] < group.alloc[:, ::2], k, axis=0)
            out = np.repeat(shut, 2, axis=1)
            due = np.flatnonzero(np.isfinite(self.deadline[rows]))
            if len(due):
                hours = w[due] * group.unit_hours[k[due]]
                limit = self.deadline[rows[due]].reshape(-1, 1)
                out[due] |= pair_markets(hours > limit, ~(hours * group.stretch[k[due]] <= limit))
        np.copyto(key, np.inf, where=out)
        return key


def build_tables(
    jobs: Sequence[JobSpec],
    catalog: Catalog,
    blocked: frozenset[str],
    blocked_offers: Sequence[bool],
    now_hours: float,
    stay: Mapping[str, str],
    book: QuotaBook,
) -> CostTables:
    """All the arithmetic of the planner's docstring that is per class ``(K, O)``, per preference shape,
    per team and per job; the per job and candidate costs are :meth:`CostTables.block`.

    ``blocked``: the block targets (kept for the explanations); ``blocked_offers``: per offer,
    whether one of them covers it. A product that overflows (huge prices) is ``inf``, silently:
    the planner reports such a candidate as ``cost_not_finite``.
    """
    with np.errstate(over="ignore"):
        cols = OfferColumns.of(catalog, blocked_offers)
        classes, klass = index([_class_key(j) for j in jobs])
        units = _class_rows(classes, catalog, cols)
        unit_cost = units.pop("unit_cost")
        teams, team_row = index([j.team for j in jobs])
        quota_rows = np.array(
            [[book.resource(t, o.gpu_type, o.provider) for o in catalog.offers] for t in teams], dtype=np.int64
        ).reshape(len(teams), len(catalog.offers))
        leaving = _leaving(catalog, cols)
        prefs = preferences(jobs, cols, catalog.providers, stay)
        tables = {
            "unit_cost": np.where(np.isnan(unit_cost), np.inf, unit_cost),  # an overflow is no candidate
            "unit_hours": units["unit_hours"],
            "stretch": units["stretch"],
            "alloc": units["alloc"],
            "resources": np.repeat(quota_rows, 2, axis=1),
            "shut": (quota_rows == NO_QUOTA) | cols.blocked,
            "leaving": leaving,
        }
        groups = [
            cut_group(types, offers, tiers, tables)
            for types, offers, tiers in zip(prefs.group_types, prefs.group_offers, prefs.group_tiers, strict=True)
        ]
        return CostTables(
            jobs=jobs,
            catalog=catalog,
            blocked=blocked,
            now_hours=now_hours,
            stay=dict(stay),
            cols=cols,
            work=np.array([j.placement.gpu_hours or j.resources.gpus for j in jobs], dtype=float),
            klass=klass,
            **units,
            leaving=leaving,
            source=_sources(jobs, catalog.providers),
            checkpoint_gb=np.array([j.placement.checkpoint_gb for j in jobs], dtype=float),
            deadline=np.array([j.placement.deadline_hours or np.inf for j in jobs], dtype=float),
            groups=groups,
            group=prefs.job_group,
            slot=prefs.job_slot,
            ranked=prefs.ranked,
            resources=tables["resources"],
            team_row=team_row,
        )


def _class_rows(classes: list[tuple[Any, ...]], catalog: Catalog, cols: OfferColumns) -> dict[str, Any]:
    """Per class and offer: throughput, hours per unit of work, GPUs rented, checkpoint interval,
    preemption loss, and the cost per unit of work in each market (``CostTables`` fields by name)."""
    gpus, workload, save, every, stepped, restore, spot, memory = (list(x) for x in zip(*classes, strict=True))
    types = list(catalog.gpu_types)
    offer_type = np.array([types.index(o.gpu_type) for o in catalog.offers], dtype=np.int64)
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
        on_demand_unit = np.where(out, np.inf, cols.on_demand * alloc * unit_hours)
        spot_unit = np.where(out | ~spot_ok | np.isinf(stretch), np.inf, cols.spot * alloc * unit_hours * stretch)
    return {
        "throughput": throughput,
        "unit_hours": unit_hours,
        "interval": interval,
        "loss": loss,
        "stretch": stretch,
        "spot_ok": spot_ok,
        "alloc": np.repeat(alloc, 2, axis=1),
        "unit_cost": pair_markets(on_demand_unit, spot_unit),
    }


def _leaving(catalog: Catalog, cols: OfferColumns) -> F8:
    """``(P + 1, O)``: the egress price per GB of leaving each provider for each offer (0 within the
    provider: the highest egress price of its offers), and a last row of zeros for jobs from outside."""
    providers, n_offers = catalog.providers, len(catalog.offers)
    rate_of = [max(o.egress_per_gb for o in catalog.offers_for(provider=p)) for p in providers]
    leaving = np.array([[rate_of[p] if p != q else 0.0 for q in cols.provider] for p in range(len(providers))])
    return np.vstack([leaving.reshape(len(providers), n_offers), np.zeros((1, n_offers))])


def _sources(jobs: Sequence[JobSpec], providers: list[str]) -> I8:
    """Each job's row of :func:`_leaving`: its current provider, or -1 (the last row) when outside the catalogue."""
    where = {p: i for i, p in enumerate(providers)}
    return np.array([where.get(j.provider, -1) for j in jobs], dtype=np.int64)


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
