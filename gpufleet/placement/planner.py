"""The placement planner: for each job, the offer and market with the lowest expected cost that fits.

``plan(jobs, catalog)`` is a pure function: it reads frozen values and returns a :class:`Plan`
(the quota book and capacity counters it mutates are its own locals). The CLI renders the plan.

**Candidates.** For each job, every (offer, market) pair of the catalogue: on-demand always, spot
when ``spec.spot`` is true and the offer has a spot market. A pair is a candidate when its GPU type
matches ``resources.gpu_type`` (or a ``placement.any_of`` / ``placement.ordered`` choice, whose unset
fields inherit the job's type and accept any provider or region, as in SkyPilot).

**Expected cost** of a candidate, in the catalogue's currency, with ``W`` = ``placement.gpu_hours``
(GPU-hours on a GPU of relative throughput 1.0 for the workload class; one hour per requested GPU
when unset), ``g`` = ``resources.gpus``, ``r`` = the type's relative throughput, and
``n`` = ``g`` rounded up to whole nodes of ``gpus_per_node`` (what is rented, counted against
capacity and quota, and paid):

- compute hours ``H = W / (r * g)`` (wall-clock; the GPUs idle on a partly used node do not help);
- spot only: preemption loss ``f = lambda * (tau / 2 + R) / 3600`` of each hour (advisor.py), with
  ``tau`` the Young/Daly interval when ``placement.save_seconds`` is known, else the configured
  ``checkpoint.every_seconds``, else ``every_steps * step_seconds / r``, else 30 minutes;
  expected hours ``T = H / (1 - f)`` (``T = H`` on demand);
- cost = ``price * n * H`` (compute) + ``price * n * (T - H)`` (preemption loss) + checkpoint egress
  ``checkpoint_gb * egress_per_gb`` of the job's current provider (``spec.provider``) when the offer
  is at another provider (the highest egress price of that provider's offers).

**Choice.** Static filters first (blocked, throughput, memory, quota row, progress, deadline
``T <= deadline_hours``); then, jobs in priority order (then submission order), the best candidate
that still has capacity and quota wins: with ``ordered`` the first choice that has any feasible
candidate, cost breaking ties inside it; otherwise the cheapest. Capacity and quota are consumed as
jobs are placed. Every loser keeps the reason it lost, and infeasible jobs stay in the plan with
their reasons. The arithmetic runs on numpy arrays, a block of jobs (in placement order) and all
their candidates at once, so memory stays bounded whatever the batch (78 MiB allocated at the peak
for 100,000 jobs x 1,000 offers: ``bench/planner.py --trace-memory``); per-job explanations are
materialised only when read, and the capacity each job saw is replayed from a
:class:`~gpufleet.placement.capacity.CapacityLog` then.

This module holds the rules and the public API: :func:`plan`, what it returns (:class:`Plan`,
:class:`Decision`, :class:`Choice`, :class:`Candidate`, :class:`CostBreakdown`, :class:`Reason`),
the choice loop and the explanations. The arrays the costs above are computed on are
:mod:`gpufleet.placement.costing`'s, which this module imports (never the reverse).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from gpufleet.errors import UsageError
from gpufleet.estimate.interval import CheckpointAdvice, advise
from gpufleet.fmt import finite_or_none
from gpufleet.paths import NAME_HINT, NAME_RE
from gpufleet.placement.capacity import CapacityLog
from gpufleet.placement.catalog import GPU_TYPE_HINT, GPU_TYPE_RE, Catalog, Offer
from gpufleet.placement.choosing import choose
from gpufleet.placement.costing import (
    F8,
    I8,
    MAX_CHECKPOINT_GB,
    MAX_GPU_HOURS,
    CostTables,
    build_tables,
    check_rates,
    pair_markets,
)
from gpufleet.placement.quota import NO_QUOTA, Admission, QuotaBook
from gpufleet.spec import JobSpec


class Reason(IntEnum):
    """Why a candidate lost (or that it won), in the order the planner tests them.

    ``NOT_FINITE`` (last in value, tested after the static filters) is a candidate whose expected
    cost overflowed to infinity: prices and amounts of work so large no comparison means anything.
    """

    CANDIDATE = 0
    EXCLUDED = 1
    BLOCKED = 2
    NO_THROUGHPUT = 3
    MEMORY = 4
    QUOTA = 5
    NO_PROGRESS = 6
    DEADLINE = 7
    CAPACITY = 8
    PREFERENCE = 9
    COSTLIER = 10
    CHOSEN = 11
    NOT_FINITE = 12


REASON_SLUG: dict[Reason, str] = {
    Reason.BLOCKED: "blocked",
    Reason.NO_THROUGHPUT: "no_throughput",
    Reason.MEMORY: "memory",
    Reason.QUOTA: "quota_exhausted",
    Reason.NO_PROGRESS: "no_progress",
    Reason.DEADLINE: "deadline",
    Reason.CAPACITY: "over_capacity",
    Reason.PREFERENCE: "preference_order",
    Reason.COSTLIER: "costlier",
    Reason.CHOSEN: "chosen",
    Reason.NOT_FINITE: "cost_not_finite",
}


@dataclass(frozen=True, slots=True)
class Allocation:
    """GPUs already held by a running job: they count against capacity and the team's quota."""

    team: str
    offer: str
    gpus: int


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    compute: float
    preemption_loss: float
    egress: float

    @property
    def total(self) -> float:
        return self.compute + self.preemption_loss + self.egress

    def to_dict(self) -> dict[str, float]:
        return {
            "compute": self.compute,
            "preemption_loss": self.preemption_loss,
            "egress": self.egress,
            "total": self.total,
        }


@dataclass(frozen=True, slots=True)
class Choice:
    """The offer a job goes to, and what it is expected to cost."""

    offer: str
    provider: str
    region: str
    gpu_type: str
    spot: bool
    nodes: int
    allocated_gpus: int
    price_per_gpu_hour: float
    compute_hours: float
    expected_hours: float
    finish_at_hours: float
    cost: CostBreakdown
    admission: Admission | None
    interval_seconds: float | None
    """Checkpoint interval the preemption loss assumes (spot only)."""
    interval_source: str | None
    """``young-daly``, ``configured`` or ``assumed``."""
    advice: CheckpointAdvice | None
    """Young/Daly optimum at this offer's preemption rate (spot with a known save time)."""
    preference: int | None
    """Index of the ``ordered`` choice that won, else ``None``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "offer": self.offer,
            "provider": self.provider,
            "region": self.region,
            "gpu_type": self.gpu_type,
            "spot": self.spot,
            "nodes": self.nodes,
            "allocated_gpus": self.allocated_gpus,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "compute_hours": self.compute_hours,
            "expected_hours": self.expected_hours,
            "finish_at_hours": self.finish_at_hours,
            "cost": self.cost.to_dict(),
            "admission": None if self.admission is None else self.admission.to_dict(),
            "interval_seconds": self.interval_seconds,
            "interval_source": self.interval_source,
            "young_daly": None if self.advice is None else self.advice.to_dict(),
            "preference": self.preference,
        }


@dataclass(frozen=True, slots=True)
class Candidate:
    """One (offer, market) the job could have gone to, and why it did not."""

    offer: str
    spot: bool
    reason: str
    detail: str
    expected_hours: float | None
    expected_cost: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "offer": self.offer,
            "spot": self.spot,
            "reason": self.reason,
            "detail": self.detail,
            "expected_hours": self.expected_hours,
            "expected_cost": self.expected_cost,
        }


def parse_target(text: str) -> str:
    """Validate a block target: ``provider``, ``provider/region`` or ``provider/region/gpu_type``."""
    parts = text.split("/")
    ok = 1 <= len(parts) <= 3 and all(NAME_RE.match(p) for p in parts[:2])
    if ok and len(parts) == 3:
        ok = bool(GPU_TYPE_RE.match(parts[2]))
    if not ok:
        raise UsageError(
            f"block target {text!r} is not provider, provider/region or provider/region/gpu_type "
            f"(names: {NAME_HINT}; GPU types: {GPU_TYPE_HINT})"
        )
    return text


def blocked_by(offer: Offer, blocked: Collection[str]) -> str | None:
    """The block target that covers ``offer``, or ``None``."""
    for target in (offer.provider, f"{offer.provider}/{offer.region}", offer.key):
        if target in blocked:
            return target
    return None


def job_gpu_types(job: JobSpec) -> list[str]:
    """The GPU types a job accepts: its choices' types, or ``resources.gpu_type``."""
    choices = job.placement.ordered or job.placement.any_of
    if not choices:
        return [job.resources.gpu_type]
    return list(dict.fromkeys(c.gpu_type or job.resources.gpu_type for c in choices))


def check_jobs(jobs: Sequence[JobSpec], catalog: Catalog) -> None:
    """Raise ``UsageError`` naming the job for what no plan can fix: unknown GPU types and the like."""
    seen: set[str] = set()
    known = ", ".join(catalog.gpu_types)
    for job in jobs:
        if job.name in seen:
            raise UsageError(f"job name {job.name!r} appears twice in the batch: give each job its own name")
        seen.add(job.name)
        for gpu_type in job_gpu_types(job):
            if gpu_type not in catalog.gpu_types:
                raise UsageError(
                    f"job {job.name!r}: unknown gpu_type {gpu_type!r}; the catalogue has {known}: ask for one of "
                    "them (resources.gpu_type, placement.any_of or .ordered), or give --catalog a catalogue with it"
                )
        if job.resources.gpus < 1:
            raise UsageError(f"job {job.name!r}: resources.gpus is 0, nothing to place: ask for at least 1 GPU")
        if job.placement.deadline_hours is not None and job.placement.gpu_hours is None:
            raise UsageError(f"job {job.name!r}: placement.deadline_hours needs placement.gpu_hours to be judged")
        for field_name, value, limit in (
            ("gpu_hours", job.placement.gpu_hours, MAX_GPU_HOURS),
            ("checkpoint_gb", job.placement.checkpoint_gb, MAX_CHECKPOINT_GB),
        ):
            if value is not None and not (math.isfinite(value) and value <= limit):
                raise UsageError(
                    f"job {job.name!r}: placement.{field_name} {value:g} is out of range: give at most {limit:g}"
                )


_STATIC = (
    Reason.EXCLUDED,
    Reason.BLOCKED,
    Reason.NO_THROUGHPUT,
    Reason.MEMORY,
    Reason.QUOTA,
    Reason.NO_PROGRESS,
    Reason.DEADLINE,
)


def _static_codes(t: CostTables, j: int) -> npt.NDArray[np.int8]:
    """The reason each candidate of job ``j`` is out before capacity and quota are looked at."""
    job, cols, k = t.jobs[j], t.cols, t.klass[j]
    tier = t.offer_tiers(j)
    r = t.throughput[k]
    memory = job.placement.memory_gib or 0.0
    deadline = job.placement.deadline_hours or np.inf
    conditions = [
        pair_markets(tier < 0, (tier < 0) | ~t.spot_ok[k]),
        pair_markets(cols.blocked, cols.blocked),
        pair_markets(np.isnan(r), np.isnan(r)),
        pair_markets(memory > cols.memory, memory > cols.memory),
        t.resources[t.team_row[j]] == NO_QUOTA,
        pair_markets(np.zeros(len(tier), dtype=bool), np.isinf(t.stretch[k])),
        t.expected(j) > deadline,
    ]
    return np.select(conditions, [int(r) for r in _STATIC], default=int(Reason.CANDIDATE)).astype(np.int8)


def _codes(
    t: CostTables, j: int, chosen: int, left: I8, failed: Sequence[tuple[int, int, str]]
) -> npt.NDArray[np.int8]:
    """Every candidate's reason, replaying the choice: capacity, quota, then rank."""
    codes = _static_codes(t, j)
    codes[(codes == Reason.CANDIDATE) & ~np.isfinite(t.key(j))] = Reason.NOT_FINITE
    ok = codes == Reason.CANDIDATE
    alloc, rows = t.alloc[t.klass[j]], t.resources[t.team_row[j]]
    short = ok & (left < alloc)
    codes[short] = Reason.CAPACITY
    ok &= ~short
    for row, need, _ in failed:
        over = ok & (rows == row) & (alloc >= need)
        codes[over] = Reason.QUOTA
        ok &= ~over
    if chosen >= 0:
        tiers = t.tiers(j)
        codes[ok & (tiers == tiers[chosen])] = Reason.COSTLIER
        codes[ok & (tiers > tiers[chosen])] = Reason.PREFERENCE
        codes[chosen] = Reason.CHOSEN
    return codes


def _preference(t: CostTables, j: int, c: int) -> int:
    """Index of the ``ordered`` choice candidate ``c`` matched (0 without ``ordered``)."""
    rank = int(t.offer_tiers(j)[c // 2])
    return rank // 2 if t.jobs[j].name in t.stay else rank


def _choice(t: CostTables, j: int, c: int, admission: Admission | None) -> Choice:
    """The :class:`Choice` that candidate ``c`` of job ``j`` makes, with its cost broken down."""
    o, spot = divmod(c, 2)
    offer, job, k = t.catalog.offers[o], t.jobs[j], t.klass[j]
    n = int(t.alloc[k, c])
    price = offer.price(spot=bool(spot)) or 0.0
    h, x = float(t.hours(j)[o]), float(t.expected(j)[c])
    advice = None
    if spot and job.placement.save_seconds is not None:
        step = job.placement.step_seconds
        step = None if step is None else step / float(t.throughput[k, o])
        advice = advise(job.placement.save_seconds, offer.spot_preemptions_per_hour, step)
    return Choice(
        offer=offer.key,
        provider=offer.provider,
        region=offer.region,
        gpu_type=offer.gpu_type,
        spot=bool(spot),
        nodes=n // offer.gpus_per_node,
        allocated_gpus=n,
        price_per_gpu_hour=price,
        compute_hours=h,
        expected_hours=x,
        finish_at_hours=t.now_hours + x,
        cost=CostBreakdown(price * n * h, price * n * (x - h), float(t.egress(j)[o])),
        admission=admission,
        interval_seconds=finite_or_none(float(t.interval[k, o])) if spot else None,
        interval_source=t.interval_source(j) if spot else None,
        advice=advice,
        preference=_preference(t, j, c) if job.placement.ordered else None,
    )


def _detail(
    t: CostTables, j: int, c: int, code: Reason, chosen: int, left: I8, notes: Mapping[int, str], total: F8
) -> str:
    """One line on why candidate ``c`` lost; ``total`` is :meth:`CostTables.total` of the job."""
    o = c // 2
    offer, job = t.catalog.offers[o], t.jobs[j]
    if code is Reason.BLOCKED:
        return f"{blocked_by(offer, t.blocked)} is blocked"
    if code is Reason.NO_THROUGHPUT:
        return f"{offer.gpu_type} has no throughput for workload {job.placement.workload!r}"
    if code is Reason.MEMORY:
        has = t.catalog.gpu_types[offer.gpu_type].memory_gib
        return f"needs {job.placement.memory_gib:g} GiB per GPU, {offer.gpu_type} has {has:g}"
    if code is Reason.QUOTA:
        row = int(t.resources[t.team_row[j], c])
        if row == NO_QUOTA:
            return f"team {job.team} has no quota for {offer.gpu_type} at {offer.provider}"
        return notes.get(row, "quota exhausted")
    if code is Reason.NO_PROGRESS:
        return f"{offer.spot_preemptions_per_hour:g} preemptions/h lose {t.loss[t.klass[j], o]:.0%} of each hour"
    if code is Reason.DEADLINE:
        return f"expected {t.expected(j)[c]:.1f} h > deadline {job.placement.deadline_hours:g} h"
    if code is Reason.CAPACITY:
        return f"needs {t.alloc[t.klass[j], c]} GPUs, {left[c]} left"
    if code is Reason.PREFERENCE:
        mine, won = _preference(t, j, c), _preference(t, j, chosen)
        if mine > won:
            return f"ordered choice {mine + 1}; choice {won + 1} was feasible"
        return f"failover tries {t.stay[job.name]}'s other regions before other providers"
    if code is Reason.COSTLIER:
        return f"+{total[c] - total[chosen]:,.2f} {t.catalog.currency} over the chosen"
    if code is Reason.NOT_FINITE:
        return "the expected cost overflows: check the offer's prices and placement.gpu_hours"
    return ""


@dataclass(frozen=True, eq=False)
class Decision:
    """Where one job goes, or why it goes nowhere; the losing candidates are worked out when read."""

    job: str
    team: str
    priority: int
    gpus: int
    workload: str
    order: int
    """Position in the placement order (priority, then submission)."""
    chosen: int = field(repr=False)
    """Candidate index that won, -1 when infeasible."""
    admission: Admission | None = field(repr=False)
    work_assumed: bool
    """``placement.gpu_hours`` was unset: one hour per requested GPU was assumed."""
    _tables: CostTables = field(repr=False)
    _row: int = field(repr=False)
    _capacity: CapacityLog = field(repr=False)
    """Capacity left per candidate as the plan was built; ``before(order)`` is what this job saw."""
    _failed: tuple[tuple[int, int, str], ...] = field(repr=False)
    """(quota row, GPUs asked, why) of every quota check that failed."""

    @property
    def placed(self) -> bool:
        return self.chosen >= 0

    @property
    def expected_cost(self) -> float | None:
        return float(self._tables.total(self._row)[self.chosen]) if self.placed else None

    @cached_property
    def choice(self) -> Choice | None:
        return _choice(self._tables, self._row, self.chosen, self.admission) if self.placed else None

    @cached_property
    def rejected(self) -> tuple[Candidate, ...]:
        """Every candidate that lost, in catalogue order, with its reason."""
        t, j = self._tables, self._row
        left = self._capacity.before(self.order)
        codes = _codes(t, j, self.chosen, left, self._failed)
        notes = {row: why for row, _, why in self._failed}
        hours, total = t.expected(j), t.total(j)
        out = []
        for c in np.flatnonzero((codes != Reason.EXCLUDED) & (codes != Reason.CHOSEN)).tolist():
            code = Reason(int(codes[c]))
            o, spot = divmod(c, 2)
            out.append(
                Candidate(
                    offer=t.catalog.offers[o].key,
                    spot=bool(spot),
                    reason=REASON_SLUG[code],
                    detail=_detail(t, j, c, code, self.chosen, left, notes, total),
                    expected_hours=finite_or_none(float(hours[c])),
                    expected_cost=finite_or_none(float(total[c])),
                )
            )
        return tuple(out)

    @cached_property
    def reasons(self) -> tuple[str, ...]:
        """Why an infeasible job was not placed, one line per reason with its count; empty when placed."""
        if self.placed:
            return ()
        if not self.rejected:
            types = ", ".join(job_gpu_types(self._tables.jobs[self._row]))
            return (f"no offer of {types} matches the job's choices",)
        counts = Counter(c.reason for c in self.rejected)
        first = {c.reason: c.detail for c in reversed(self.rejected)}
        return tuple(f"{reason} x{n} (e.g. {first[reason]})" for reason, n in counts.most_common())

    def to_dict(self, explain: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "team": self.team,
            "priority": self.priority,
            "gpus": self.gpus,
            "workload": self.workload,
            "order": self.order,
            "placed": self.placed,
            "work_assumed": self.work_assumed,
            "choice": None if self.choice is None else self.choice.to_dict(),
            "reasons": list(self.reasons),
        }
        if explain:
            out["rejected"] = [c.to_dict() for c in self.rejected]
        return out


@dataclass(frozen=True, eq=False)
class Plan:
    """Every job's decision, in submission order."""

    as_of: str
    currency: str
    now_hours: float
    blocked: tuple[str, ...]
    decisions: tuple[Decision, ...]

    @property
    def placed(self) -> list[Decision]:
        return [d for d in self.decisions if d.placed]

    @property
    def infeasible(self) -> list[Decision]:
        return [d for d in self.decisions if not d.placed]

    @property
    def ok(self) -> bool:
        """Every job was placed."""
        return all(d.placed for d in self.decisions)

    @property
    def total_cost(self) -> float:
        return sum(d.expected_cost or 0.0 for d in self.decisions)

    @cached_property
    def _by_name(self) -> dict[str, Decision]:
        return {d.job: d for d in self.decisions}

    def decision(self, job: str) -> Decision:
        """The decision for the job named ``job`` (``KeyError`` if the batch had none)."""
        return self._by_name[job]

    def to_dict(self, explain: bool = True) -> dict[str, Any]:
        return {
            "as_of": self.as_of,
            "currency": self.currency,
            "now_hours": self.now_hours,
            "blocked": list(self.blocked),
            "ok": self.ok,
            "placed": len(self.placed),
            "infeasible": len(self.infeasible),
            "total_cost": self.total_cost,
            "decisions": [d.to_dict(explain) for d in self.decisions],
        }


BLOCK_CELLS = 1 << 19
"""Jobs x candidates costed at once (4 MiB of float64 at most, less where offer groups are narrower):
numpy's per-call overhead vanishes at that size, and the block stays in cache while its jobs are
chosen one by one."""


def plan(
    jobs: Sequence[JobSpec],
    catalog: Catalog,
    *,
    now_hours: float = 0,
    blocked: Collection[str] = (),
    running: Sequence[Allocation] = (),
    prefer_provider: Mapping[str, str] | None = None,
) -> Plan:
    """Place ``jobs`` on ``catalog``'s offers; see the module docstring for the rules.

    ``blocked``: provider, provider/region or offer keys to avoid. ``running``: GPUs already held.
    ``prefer_provider``: job name -> provider whose offers rank first within each preference
    (failover's "next region first, then next provider").
    """
    check_jobs(jobs, catalog)
    check_rates(catalog)
    block = frozenset(parse_target(b) for b in blocked)
    book = QuotaBook(catalog.quotas)
    remaining = np.repeat(np.array([o.capacity_gpus for o in catalog.offers], dtype=np.int64), 2)
    for held in running:
        o = catalog.offers.index(catalog.offer(held.offer))
        remaining[2 * o : 2 * o + 2] -= held.gpus
        row = book.resource(held.team, catalog.offers[o].gpu_type, catalog.offers[o].provider)
        if row >= 0:
            book.hold(row, held.gpus)
    if not jobs:
        return Plan(catalog.as_of.isoformat(), catalog.currency, float(now_hours), tuple(sorted(block)), ())
    blocked_offers = [blocked_by(o, block) is not None for o in catalog.offers]
    t = build_tables(jobs, catalog, block, blocked_offers, float(now_hours), prefer_provider or {}, book)
    order = np.argsort(-np.array([job.priority for job in jobs], dtype=np.int64), kind="stable")
    capacity = CapacityLog(remaining)
    decisions: list[Decision | None] = [None] * len(jobs)
    block_rows = max(1, BLOCK_CELLS // max(1, len(remaining)))
    for start in range(0, len(jobs), block_rows):
        rows = order[start : start + block_rows]
        costed = t.block(rows, capacity.left)
        for i, (j, (group, key, first)) in enumerate(zip(rows.tolist(), costed, strict=True)):
            position = start + i
            capacity.turn(position)
            chosen, admission, failed = choose(t, j, group, key, first, capacity.left, book)
            if chosen >= 0:
                capacity.take(position, chosen, int(t.alloc[t.klass[j], chosen]))
            decisions[j] = _decision(jobs[j], j, position, chosen, admission, failed, t, capacity)
    return Plan(
        as_of=catalog.as_of.isoformat(),
        currency=catalog.currency,
        now_hours=float(now_hours),
        blocked=tuple(sorted(block)),
        decisions=tuple(d for d in decisions if d is not None),
    )


def _decision(
    job: JobSpec,
    j: int,
    position: int,
    chosen: int,
    admission: Admission | None,
    failed: list[tuple[int, int, str]],
    t: CostTables,
    capacity: CapacityLog,
) -> Decision:
    """The decision of job ``j``, placed ``position``-th; what it lost to is worked out when read."""
    return Decision(
        job=job.name,
        team=job.team,
        priority=job.priority,
        gpus=job.resources.gpus,
        workload=job.placement.workload,
        order=position,
        chosen=chosen,
        admission=admission,
        work_assumed=job.placement.gpu_hours is None,
        _tables=t,
        _row=j,
        _capacity=capacity,
        _failed=tuple(failed),
    )


__all__ = [
    "REASON_SLUG",
    "Allocation",
    "Candidate",
    "Choice",
    "CostBreakdown",
    "Decision",
    "Plan",
    "Reason",
    "blocked_by",
    "check_jobs",
    "job_gpu_types",
    "parse_target",
    "plan",
]
