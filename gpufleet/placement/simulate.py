"""A seeded discrete-event simulation of the fleet: what a placement policy costs over weeks of jobs.

A price list does not say what a policy costs. Spot is cheap until preemptions throw away the work
since the last checkpoint; a full quota makes jobs wait; an outage kills every job in a region.
This module replays thousands of jobs against a :class:`~gpufleet.placement.catalog.Catalog` under
each policy, with the *same* jobs, outages and preemption draws for every policy (common random
numbers), so the differences in the results are the policies' doing. It is pure: no I/O, every
draw from a seeded numpy ``Generator``.

The model, in hours:

- Jobs arrive as a Poisson process whose rate follows a daily cycle ``1 + a cos(2 pi (h - peak) / 24)``
  (given the count, arrival times are i.i.d. with that density). A job needs ``gpus`` GPUs of one
  offer, spot or on-demand, out of the offer's ``capacity_gpus`` (pooled, as Kueue admits GPUs; or
  whole nodes per job, as ``gpufleet place`` rents them, with ``whole_nodes``). Its work is in
  GPU-hours of the reference GPU (throughput 1.0), so on an offer it computes for
  ``work / (gpus * throughput)`` hours, blocks ``save`` every checkpoint interval ``c``, and pays
  ``restore`` after a restart.
- A running spot job is preempted after an exponential time of rate ``spot_preemptions_per_hour``;
  an outage of a region or provider kills every job there and takes its capacity away until it
  ends. An interrupted job keeps its last completed checkpoint and loses the rest, computed from
  its own timeline (``c / 2`` on average), then is requeued; restarting at another provider moves
  the checkpoint and pays ``checkpoint_gb * egress_per_gb`` of the offer it leaves.
- Quotas follow Kueue (:mod:`gpufleet.placement.quota`, no reclaim preemption). The queue is
  Kueue's BestEffortFIFO: higher priority first, then earlier arrival; a job that fits starts even
  when one ahead of it does not.
- A policy ranks each job's options once per kind of job (:class:`~gpufleet.placement.policies.Policy`);
  ``spot_failover`` also keeps interrupted jobs, and after an outage every job, away from the region
  for a cool-down.

The jobs, their arrivals and the outages come from :mod:`gpufleet.placement.workload`, the policies
from :mod:`gpufleet.placement.policies`; this module holds the engine and what it reports
(:class:`SimResult`, :class:`Metrics`, :class:`SimTrace`), and ``build_scenario`` and
``compare_policies``, which run every policy over the same draws.

The engine keeps jobs as indices into per-job lists (floats and ints, fast to read one at a time)
and numpy arrays (for the draws and the metrics). Waiting jobs are bucketed into *shapes*: jobs of
one team, size and option list are feasible or not together, so a scheduling pass tests the first
waiting job of each shape, best first, and leaves a shape alone for the rest of the pass once that
job does not fit: a pass costs the number of shapes, not of waiting jobs. Events are tuples in a heap.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gpufleet.errors import ParameterError, UsageError
from gpufleet.placement.catalog import Catalog
from gpufleet.placement.costing import check_rates
from gpufleet.placement.policies import Fleet, Need, Policy, make_policy
from gpufleet.placement.quota import QuotaBook
from gpufleet.placement.workload import (
    INF,
    Bools,
    FailoverRule,
    Floats,
    Ints,
    JobTable,
    Outage,
    WorkloadModel,
    draw_outages,
    generate_jobs,
)

MAX_DAYS = 3650.0
"""Longest arrival window, and longest drain after it (ten years each): the horizon stays a few
hundred thousand hours, which numpy's Poisson draws and the event loop handle."""
MAX_HORIZON_H = 24.0 * 2 * MAX_DAYS
"""Longest horizon :func:`simulate` runs to."""
MAX_JOBS = 1_000_000
"""Most jobs one scenario generates."""
MAX_OUTAGES_PER_DAY = 24.0
"""Most outages per day a workload model may give a region or a provider: one an hour."""
MIN_CHECKPOINT_MINUTES = 1 / 60
"""Shortest checkpoint interval a workload model may draw: one second."""

FINISH, PREEMPT, DOWN, UP, UNBLOCK, REOPEN = 0, 1, 2, 3, 4, 5
KILL, HORIZON = 6, 7
_QUEUED, _RUNNING, _DONE = 1, 2, 3
_END_NAMES = {FINISH: "finished", PREEMPT: "preempted", KILL: "outage", HORIZON: "horizon"}


@dataclass(frozen=True, slots=True)
class Segment:
    """One attempt: a job held ``gpus`` GPUs of ``offer`` (spot or not) from ``start_h`` to ``end_h``."""

    job: int
    offer: int
    spot: bool
    gpus: int
    """GPUs rented: the job's, rounded up to whole nodes unless the fleet is pooled."""
    start_h: float
    end_h: float
    end: str
    """``finished``, ``preempted``, ``outage`` or ``horizon``."""


@dataclass(frozen=True, slots=True)
class SimTrace:
    """What happened, for checks and plots: every attempt, and each quota row's usage after each change."""

    segments: tuple[Segment, ...]
    usage: tuple[tuple[float, int, int], ...]
    """``(hour, quota row in Catalog.quotas, GPUs in use after the change)``."""


@dataclass(frozen=True, eq=False)
class JobOutcomes:
    """Per-job results, parallel to the :class:`JobTable` rows. GPU-hours are on the GPUs rented."""

    finish_h: Floats
    """``inf`` for a job unfinished at the horizon."""
    first_start_h: Floats
    wait_h: Floats
    """Hours queued, over every wait (the first and each requeue), up to the horizon."""
    attempts: Ints
    cost: Floats
    """Compute cost plus egress."""
    egress_cost: Floats
    useful_gpu_hours: Floats
    lost_gpu_hours: Floats
    restore_gpu_hours: Floats
    checkpoint_gpu_hours: Floats
    idle_gpu_hours: Floats
    """GPUs of a rented node the job did not use, times the hours it held them."""
    work_done_gpu_hours: Floats
    """Work done in reference GPU-hours (the job's work once finished; checkpointed plus in-flight
    work for a job still running at the horizon)."""
    preemptions: Ints
    outage_kills: Ints
    moves: Ints
    """Restarts in another region than the last attempt's; egress is paid when the provider changes."""


@dataclass(frozen=True, slots=True)
class Metrics:
    """Totals over a set of jobs: ``gpu_hours = useful + wasted + checkpoint + idle``, ``wasted = lost + restore``.

    Queue-wait percentiles are over every job, a job still waiting counted up to the horizon."""

    jobs: int
    completed: int
    unfinished: int
    never_started: int
    cost: float
    compute_cost: float
    egress_cost: float
    gpu_hours: float
    useful_gpu_hours: float
    wasted_gpu_hours: float
    lost_gpu_hours: float
    restore_gpu_hours: float
    checkpoint_gpu_hours: float
    idle_gpu_hours: float
    work_done_gpu_hours: float
    queue_wait_p50_h: float | None
    queue_wait_p95_h: float | None
    deadline_jobs: int
    deadline_misses: int
    preemptions: int
    outage_kills: int
    moves: int
    makespan_h: float | None
    """Last completion minus first arrival."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class SimResult:
    """One policy's run over one job table."""

    policy: str
    currency: str
    horizon_h: float
    jobs: JobTable
    outcomes: JobOutcomes
    overall: Metrics
    teams: dict[str, Metrics]
    trace: SimTrace | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "currency": self.currency,
            "horizon_hours": self.horizon_h,
            "overall": self.overall.to_dict(),
            "teams": {team: m.to_dict() for team, m in self.teams.items()},
        }


def _metrics(jobs: JobTable, out: JobOutcomes, mask: Bools, horizon_h: float) -> Metrics:
    def total(a: npt.NDArray[Any]) -> float:
        return float(a[mask].sum())

    done = np.isfinite(out.finish_h) & mask
    started = np.isfinite(out.first_start_h) & mask
    waits = out.wait_h[mask]
    p50, p95 = (float(v) for v in np.percentile(waits, [50, 95])) if waits.size else (None, None)
    due = jobs.arrival_h + jobs.deadline_h
    has = np.isfinite(jobs.deadline_h) & mask
    missed = has & ((out.finish_h > due) | (~np.isfinite(out.finish_h) & (due <= horizon_h)))
    lost, restore = total(out.lost_gpu_hours), total(out.restore_gpu_hours)
    useful, ckpt, idle = total(out.useful_gpu_hours), total(out.checkpoint_gpu_hours), total(out.idle_gpu_hours)
    first = float(jobs.arrival_h[mask].min()) if mask.any() else 0.0
    return Metrics(
        jobs=int(mask.sum()),
        completed=int(done.sum()),
        unfinished=int(mask.sum() - done.sum()),
        never_started=int(mask.sum() - started.sum()),
        cost=total(out.cost),
        compute_cost=total(out.cost) - total(out.egress_cost),
        egress_cost=total(out.egress_cost),
        gpu_hours=useful + lost + restore + ckpt + idle,
        useful_gpu_hours=useful,
        wasted_gpu_hours=lost + restore,
        lost_gpu_hours=lost,
        restore_gpu_hours=restore,
        checkpoint_gpu_hours=ckpt,
        idle_gpu_hours=idle,
        work_done_gpu_hours=total(out.work_done_gpu_hours),
        queue_wait_p50_h=p50,
        queue_wait_p95_h=p95,
        deadline_jobs=int(has.sum()),
        deadline_misses=int(missed.sum()),
        preemptions=int(total(out.preemptions)),
        outage_kills=int(total(out.outage_kills)),
        moves=int(total(out.moves)),
        makespan_h=float(out.finish_h[done].max() - first) if done.any() else None,
    )


class _Shape:
    """Waiting jobs that are feasible or not together: a heap of ``(-priority, arrival, job, version)``,
    their options in order and the GPUs each option rents."""

    __slots__ = ("gpus", "group", "heap", "options", "rents", "team")

    def __init__(self, options: tuple[int, ...], rents: tuple[int, ...], gpus: int, team: int, group: int) -> None:
        self.heap: list[tuple[int, float, int, int]] = []
        self.options, self.rents, self.gpus, self.team, self.group = options, rents, gpus, team, group


class _Engine:
    """The event loop. Per-job state lives in lists indexed by job; see the module docstring."""

    def __init__(
        self,
        fleet: Fleet,
        jobs: JobTable,
        policy: Policy,
        outages: Sequence[Outage],
        horizon_h: float,
        rng: np.random.Generator,
        trace: bool,
    ) -> None:
        cat = fleet.catalog
        self.fleet, self.jobs, self.policy, self.horizon, self.rng = fleet, jobs, policy, horizon_h, rng
        offers, n = cat.offers, len(jobs)
        self.book = QuotaBook(cat.quotas)
        self.types = list(cat.gpu_types)
        self.gtype = [self.types.index(o.gpu_type) for o in offers]
        self.free = [o.capacity_gpus for o in offers]
        self.down = [0] * len(offers)
        self.closed = [0.0] * (2 * len(offers))
        """Per option: hour until which ``spot_failover`` sends no job there (fleet-wide blocks)."""
        self.recent: dict[str, list[float]] = defaultdict(list)
        self.running: list[set[int]] = [set() for _ in offers]
        self.rate = [r for o in offers for r in (0.0, o.spot_preemptions_per_hour)]
        self.speed = [[cat.throughput(o.gpu_type, w) or 0.0 for w in jobs.workloads] for o in offers]
        self.qrow = [[self.book.resource(t, o.gpu_type, o.provider) for o in offers] for t in jobs.teams]
        self._compile_quotas(cat)
        self.outage_offers = [
            [i for i, o in enumerate(offers) if o.provider == out.provider and out.region in (None, o.region)]
            for out in outages
        ]
        self.ev: list[tuple[float, int, int, int, int]] = []
        self.seq = itertools.count()
        for k, out in enumerate(outages):
            if out.end_h > out.start_h:
                self.ev += [(out.start_h, next(self.seq), DOWN, k, 0), (out.end_h, next(self.seq), UP, k, 0)]
        heapq.heapify(self.ev)
        self.arrival, self.team, self.gpus = jobs.arrival_h.tolist(), jobs.team.tolist(), jobs.gpus.tolist()
        self.work, self.wl = jobs.work_gpu_hours.tolist(), jobs.workload.tolist()
        self.neg_prio = (-jobs.priority).tolist()
        self.ckpt, self.scales = jobs.checkpoint_h.tolist(), jobs.checkpoint_scales.tolist()
        self.save, self.restore, self.gb = jobs.save_h.tolist(), jobs.restore_h.tolist(), jobs.checkpoint_gb.tolist()
        columns = (jobs.team, jobs.gpus, jobs.workload, jobs.spot, jobs.choice, jobs.home, jobs.memory_gib)
        keys = np.stack([np.asarray(c, dtype=float) for c in columns], 1).reshape(n, len(columns))
        self.base = np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1).tolist()
        self.shapes: dict[Hashable, _Shape] = {}
        self.waiting: dict[tuple[int, int], set[_Shape]] = {}
        """Shapes with waiting jobs, by (GPU type group, GPUs per job): a pass skips whole buckets."""
        self.state, self.ver, self.attempt = [0] * n, [0] * n, [0] * n
        self.cur, self.rent, self.last = [-1] * n, [0] * n, [-1] * n
        self.started, self.cur_restore, self.cur_compute = [0.0] * n, [0.0] * n, [0.0] * n
        self.cur_every, self.cur_saves, self.cur_speed = [0.0] * n, [0] * n, [0.0] * n
        self.progress, self.queued_since = [0.0] * n, [0.0] * n
        self.acc = {k: [0.0] * n for k in ("cost", "egress", "useful", "lost", "restore", "ckpt", "idle", "wait")}
        self.count = {k: [0] * n for k in ("preemptions", "kills", "moves")}
        self.first_start, self.finish = [INF] * n, [INF] * n
        self.avoid: dict[int, dict[str, float]] = {}
        self.expo: list[float] = []
        self.expo_at = 0
        self.segments: list[Segment] | None = [] if trace else None
        self.usage_log: list[tuple[float, int, int]] | None = [] if trace else None

    def _compile_quotas(self, cat: Catalog) -> None:
        """Each row's cap, guaranteed part and cohort pool, as in :class:`QuotaBook` but O(1) per admission."""
        lend = [q.nominal if q.lending_limit is None else q.lending_limit for q in cat.quotas]
        pools: dict[tuple[str, str, str], int] = {}
        self.cap: list[float] = []
        self.guar: list[int] = []
        self.pool_of: list[int] = []
        for q, lendable in zip(cat.quotas, lend, strict=True):
            solo = q.cohort is None
            more = INF if q.borrowing_limit is None else q.borrowing_limit
            self.cap.append(q.nominal if solo else q.nominal + more)
            self.guar.append(q.nominal if solo else q.nominal - lendable)
            self.pool_of.append(-1 if solo else pools.setdefault((q.cohort or "", q.gpu_type, q.provider), len(pools)))
        self.pool_size = [0] * len(pools)
        for p, lendable in zip(self.pool_of, lend, strict=True):
            if p >= 0:
                self.pool_size[p] += lendable
        self.pool_used = [0] * len(pools)
        self.usage = [0] * len(cat.quotas)

    def _admit(self, q: int, g: int) -> bool:
        used = self.usage[q]
        if used + g > self.cap[q]:
            return False
        p = self.pool_of[q]
        if p < 0:
            return True
        gq = self.guar[q]
        return self.pool_used[p] + max(0, used + g - gq) - max(0, used - gq) <= self.pool_size[p]

    def _use(self, q: int, g: int, t: float) -> None:
        used, gq, p = self.usage[q], self.guar[q], self.pool_of[q]
        if p >= 0:
            self.pool_used[p] += max(0, used + g - gq) - max(0, used - gq)
        self.usage[q] = used + g
        if self.usage_log is not None:
            self.usage_log.append((t, q, used + g))

    # -- queue -------------------------------------------------------------------------------

    def _shape(self, j: int, t: float) -> _Shape:
        key: Hashable = self.base[j]
        last_provider, avoid = None, frozenset[str]()
        if self.policy.uses_history:
            if self.last[j] >= 0:
                last_provider = self.fleet.catalog.offers[self.last[j]].provider
            avoid = frozenset(r for r, until in self.avoid.get(j, {}).items() if until > t)
            key = (key, last_provider, avoid)
        shape = self.shapes.get(key)
        if shape is None:
            jobs, home = self.jobs, self.jobs.home[j]
            need = Need(
                team=jobs.teams[self.team[j]],
                gpus=self.gpus[j],
                workload=jobs.workloads[self.wl[j]],
                spot=bool(jobs.spot[j]),
                choice=jobs.choice_sets[jobs.choice[j]],
                memory_gib=float(jobs.memory_gib[j]),
                home=self.fleet.catalog.providers[home] if home >= 0 else None,
                last_provider=last_provider,
                avoid=avoid,
            )
            options = self.policy.options(self.fleet, need, self.book)
            rents = tuple(self.fleet.rented(o >> 1, need.gpus) for o in options)
            types = {self.gtype[o >> 1] for o in options}
            group = types.pop() if len(types) == 1 else len(self.types)
            shape = self.shapes[key] = _Shape(options, rents, need.gpus, self.team[j], group)
        return shape

    def _enqueue(self, j: int, t: float, fresh: bool) -> _Shape:
        shape = self._shape(j, t)
        self.state[j] = _QUEUED
        self.ver[j] += 1
        if fresh:
            self.queued_since[j] = t
        if shape.options:
            heapq.heappush(shape.heap, (self.neg_prio[j], self.arrival[j], j, self.ver[j]))
            self.waiting.setdefault((shape.group, shape.gpus), set()).add(shape)
        pending = [until for until in self.avoid.get(j, {}).values() if until > t]
        if pending:
            heapq.heappush(self.ev, (min(pending), next(self.seq), UNBLOCK, j, self.ver[j]))
        return shape

    def _head(self, shape: _Shape) -> tuple[int, float, int, int] | None:
        heap, ver = shape.heap, self.ver
        while heap and heap[0][3] != ver[heap[0][2]]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _fit(self, shape: _Shape, t: float) -> int:
        """Index of the shape's first option that can start now, or -1."""
        free, down, closed, qrow = self.free, self.down, self.closed, self.qrow[shape.team]
        for k, o in enumerate(shape.options):
            f, n = o >> 1, shape.rents[k]
            if down[f] or free[f] < n or closed[o] > t:
                continue
            q = qrow[f]
            if q >= 0 and not self._admit(q, n):
                continue
            return k
        return -1

    def _best(self, t: float) -> list[int]:
        """Most free GPUs in one open offer, per GPU type and (last) over all: no shape needing more can start."""
        best = [0] * (len(self.types) + 1)
        for f, g in enumerate(self.free):
            if g > best[self.gtype[f]] and not self.down[f] and self.closed[2 * f] <= t:
                best[self.gtype[f]] = g
        best[-1] = max(best)
        return best

    def _pass(self, t: float, only: _Shape | None = None) -> None:
        """Start every waiting job that fits, best first; a shape whose first job fails is done for this pass."""
        best = self._best(t)
        if not best[-1]:
            return
        heads: list[tuple[int, float, int, _Shape]] = []
        empty: list[_Shape] = []
        groups = [((only.group, only.gpus), {only})] if only is not None else self.waiting.items()
        for (group, gpus), shapes in groups:
            if gpus <= best[group]:
                for shape in shapes:
                    h = self._head(shape)
                    if h is None:
                        empty.append(shape)
                    else:
                        heads.append((h[0], h[1], h[2], shape))
        for shape in empty:
            self._forget(shape)
        heapq.heapify(heads)
        while heads:
            _, _, j, shape = heapq.heappop(heads)
            k = self._fit(shape, t) if shape.gpus <= best[shape.group] else -1
            if k < 0:
                continue
            heapq.heappop(shape.heap)
            self._start(j, shape.options[k], shape.rents[k], t)
            best = self._best(t)
            h = self._head(shape)
            if h is None:
                self._forget(shape)
            else:
                heapq.heappush(heads, (h[0], h[1], h[2], shape))

    def _forget(self, shape: _Shape) -> None:
        bucket = self.waiting.get((shape.group, shape.gpus))
        if bucket is not None:
            bucket.discard(shape)

    # -- attempts ------------------------------------------------------------------------------

    def _draw(self) -> float:
        if self.expo_at == len(self.expo):
            self.expo, self.expo_at = self.rng.standard_exponential(1 << 14).tolist(), 0
        self.expo_at += 1
        return self.expo[self.expo_at - 1]

    def _start(self, j: int, o: int, n: int, t: float) -> None:
        f, g = o >> 1, self.gpus[j]
        self.free[f] -= n
        q = self.qrow[self.team[j]][f]
        if q >= 0:
            self._use(q, n, t)
        self.running[f].add(j)
        self.state[j], self.cur[j], self.rent[j], self.started[j] = _RUNNING, o, n, t
        self.acc["wait"][j] += t - self.queued_since[j]
        self.first_start[j] = min(self.first_start[j], t)
        last, offers = self.last[j], self.fleet.catalog.offers
        if last >= 0 and self.fleet.region[last] != self.fleet.region[f]:
            self.count["moves"][j] += 1
            if self.progress[j] > 0 and offers[last].provider != offers[f].provider:
                self.acc["egress"][j] += self.gb[j] * offers[last].egress_per_gb
        throughput = self.speed[f][self.wl[j]]
        every = self.ckpt[j] / throughput if self.scales[j] else self.ckpt[j]
        restore = self.restore[j] if self.attempt[j] else 0.0
        self.attempt[j] += 1
        compute = (self.work[j] - self.progress[j]) / (g * throughput)
        saves = max(0, math.ceil(compute / every) - 1)
        self.cur_restore[j], self.cur_compute[j], self.cur_saves[j] = restore, compute, saves
        self.cur_every[j], self.cur_speed[j] = every, g * throughput
        duration, kind = restore + compute + saves * self.save[j], FINISH
        if self.rate[o] > 0:
            until = self._draw() / self.rate[o]
            if until < duration:
                duration, kind = until, PREEMPT
        heapq.heappush(self.ev, (t + duration, next(self.seq), kind, j, self.attempt[j]))

    def _close(self, j: int, t: float, how: int) -> None:
        """End the running attempt at ``t``: split its GPU time into buckets, free its GPUs and quota."""
        o, g, n, acc = self.cur[j], self.gpus[j], self.rent[j], self.acc
        f, elapsed, restore = o >> 1, t - self.started[j], self.cur_restore[j]
        c, s = self.cur_every[j], self.save[j]
        if how == FINISH:
            compute, saving, lost = self.cur_compute[j], self.cur_saves[j] * s, 0.0
            self.progress[j] = self.work[j]
        else:
            restore = min(restore, elapsed)
            done = elapsed - restore
            k = math.floor(done / (c + s))
            compute, saving, lost = k * c, k * s, done - k * (c + s)
            if how == HORIZON:  # still running: the work since the last save is in flight, not lost
                compute, saving, lost = compute + min(lost, c), saving + max(0.0, lost - c), 0.0
            self.progress[j] = min(self.work[j], self.progress[j] + compute * self.cur_speed[j])
        acc["useful"][j] += compute * g
        acc["ckpt"][j] += saving * g
        acc["lost"][j] += lost * g
        acc["restore"][j] += restore * g
        acc["idle"][j] += elapsed * (n - g)
        acc["cost"][j] += elapsed * n * self.fleet.price[o]
        self.free[f] += n
        q = self.qrow[self.team[j]][f]
        if q >= 0:
            self._use(q, -n, t)
        self.running[f].discard(j)
        self.cur[j], self.last[j] = -1, f
        if self.segments is not None:
            self.segments.append(Segment(j, f, bool(o & 1), n, self.started[j], t, _END_NAMES[how]))

    def _interrupt(self, j: int, t: float, how: int) -> None:
        self._close(j, t, how)
        self.count["preemptions" if how == PREEMPT else "kills"][j] += 1
        rule, region = self.policy.failover, self.fleet.region[self.last[j]]
        if rule is not None:
            self.avoid.setdefault(j, {})[region] = t + rule.cooldown_hours
            if how == PREEMPT and rule.preemptions is not None:
                recent = self.recent[region] = [h for h in self.recent[region] if h > t - rule.window_hours] + [t]
                if len(recent) >= rule.preemptions:
                    self.recent.pop(region)
                    self._close_markets(region, t, rule, markets=(1,))
        self._enqueue(j, t, fresh=True)

    def _close_markets(self, region: str, t: float, rule: FailoverRule, markets: tuple[int, ...] = (0, 1)) -> None:
        """Keep every job away from ``region``'s markets (0 on-demand, 1 spot) for the cool-down."""
        for f, name in enumerate(self.fleet.region):
            if name == region:
                for m in markets:
                    self.closed[2 * f + m] = max(self.closed[2 * f + m], t + rule.cooldown_hours)
        heapq.heappush(self.ev, (t + rule.cooldown_hours, next(self.seq), REOPEN, 0, 0))

    # -- loop ------------------------------------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None) -> None:
        order = np.argsort(self.jobs.arrival_h, kind="stable").tolist()
        arrival, ev, horizon = self.arrival, self.ev, self.horizon
        nxt = 0
        for step in itertools.count():
            if progress is not None and step % 8192 == 0:
                progress(min(1.0, (ev[0][0] if ev else 0.0) / horizon))
            t_arrival = arrival[order[nxt]] if nxt < len(order) else INF
            if t_arrival <= (ev[0][0] if ev else INF):
                if t_arrival >= horizon:
                    break
                j = order[nxt]
                nxt += 1
                self._pass(t_arrival, self._enqueue(j, t_arrival, fresh=True))
                continue
            if not ev or ev[0][0] >= horizon:
                break
            t, _, kind, a, b = heapq.heappop(ev)
            if kind in (FINISH, PREEMPT):
                if self.state[a] != _RUNNING or self.attempt[a] != b:
                    continue  # the attempt already ended (an outage killed it)
                if kind == FINISH:
                    self._close(a, t, FINISH)
                    self.state[a], self.finish[a] = _DONE, t
                else:
                    self._interrupt(a, t, PREEMPT)
            elif kind == DOWN:
                self._outage(a, t)
            elif kind == UP:
                for f in self.outage_offers[a]:
                    self.down[f] -= 1
            elif kind == UNBLOCK:  # a job's cool-down ended: it may use the region again
                if self.state[a] == _QUEUED and self.ver[a] == b:
                    self._pass(t, self._enqueue(a, t, fresh=False))
                continue
            self._pass(t)
        self._stop(horizon)
        if progress is not None:
            progress(1.0)

    def _outage(self, k: int, t: float) -> None:
        rule = self.policy.failover
        for f in self.outage_offers[k]:
            self.down[f] += 1
        if rule is not None:
            for region in dict.fromkeys(self.fleet.region[f] for f in self.outage_offers[k]):
                self._close_markets(region, t, rule)
        for f in self.outage_offers[k]:
            for j in sorted(self.running[f]):
                self._interrupt(j, t, KILL)

    def _stop(self, horizon: float) -> None:
        for j, state in enumerate(self.state):
            if state == _RUNNING:
                self._close(j, horizon, HORIZON)
            elif state == _QUEUED:
                self.acc["wait"][j] += horizon - self.queued_since[j]

    def outcomes(self) -> JobOutcomes:
        def floats(values: list[float]) -> Floats:
            return np.array(values, dtype=float)

        def ints(values: list[int]) -> Ints:
            return np.array(values, dtype=np.int64)

        acc = self.acc
        return JobOutcomes(
            finish_h=floats(self.finish),
            first_start_h=floats(self.first_start),
            wait_h=floats(acc["wait"]),
            attempts=ints(self.attempt),
            cost=floats(acc["cost"]) + floats(acc["egress"]),
            egress_cost=floats(acc["egress"]),
            useful_gpu_hours=floats(acc["useful"]),
            lost_gpu_hours=floats(acc["lost"]),
            restore_gpu_hours=floats(acc["restore"]),
            checkpoint_gpu_hours=floats(acc["ckpt"]),
            idle_gpu_hours=floats(acc["idle"]),
            work_done_gpu_hours=floats(self.progress),
            preemptions=ints(self.count["preemptions"]),
            outage_kills=ints(self.count["kills"]),
            moves=ints(self.count["moves"]),
        )


def simulate(
    catalog: Catalog,
    jobs: JobTable,
    policy: Policy | str,
    *,
    horizon_h: float,
    outages: Sequence[Outage] = (),
    seed: int | np.random.SeedSequence = 0,
    workload: WorkloadModel | None = None,
    trace: bool = False,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Run one policy over ``jobs`` until ``horizon_h``; ``seed`` drives the spot preemption draws.

    ``workload`` sets whether jobs rent whole nodes and configures a policy given by name (its
    failover rule, team preferences); ``trace=True`` keeps every attempt and quota change
    (:class:`SimTrace`); ``progress`` is called with the simulated fraction of the horizon now and then.
    """
    if not 0 < horizon_h <= MAX_HORIZON_H:  # also NaN and infinity
        raise UsageError(f"the horizon must be > 0 and at most {MAX_HORIZON_H:g} hours, got {horizon_h}")
    check_rates(catalog)
    chosen = make_policy(policy, workload) if isinstance(policy, str) else policy
    fleet = Fleet.of(catalog, whole_nodes=(workload or chosen.workload).whole_nodes)
    engine = _Engine(fleet, jobs, chosen, outages, horizon_h, np.random.default_rng(seed), trace)
    engine.run(progress)
    out = engine.outcomes()
    everyone = np.ones(len(jobs), dtype=bool)
    teams = {name: _metrics(jobs, out, jobs.team == i, horizon_h) for i, name in enumerate(jobs.teams)}
    trace_out = None
    if engine.segments is not None and engine.usage_log is not None:
        trace_out = SimTrace(tuple(engine.segments), tuple(engine.usage_log))
    return SimResult(
        policy=chosen.name,
        currency=catalog.currency,
        horizon_h=horizon_h,
        jobs=jobs,
        outcomes=out,
        overall=_metrics(jobs, out, everyone, horizon_h),
        teams=teams,
        trace=trace_out,
    )


@dataclass(frozen=True, slots=True)
class Scenario:
    """The inputs every policy shares in one comparison: the same jobs and outages."""

    jobs: JobTable
    outages: tuple[Outage, ...]
    horizon_h: float
    preemption_seed: np.random.SeedSequence
    workload: WorkloadModel = field(default_factory=WorkloadModel)


def check_workload(workload: WorkloadModel) -> None:
    """Raise :class:`UsageError` naming the first field of ``workload`` beyond what a simulation can run."""
    problems = (
        ("drain_days", workload.drain_days, 0 <= workload.drain_days <= MAX_DAYS, "from 0 to 3650 (ten years)"),
        *(
            (f"outages.{name}", rate, 0 <= rate <= MAX_OUTAGES_PER_DAY, "from 0 to 24 a day (one an hour)")
            for name, rate in (
                ("region_per_day", workload.outages.region_per_day),
                ("provider_per_day", workload.outages.provider_per_day),
            )
        ),
        *(
            ("checkpoint_minutes", minutes, minutes >= MIN_CHECKPOINT_MINUTES, "at least 1/60 (a second)")
            for minutes in workload.checkpoint_minutes
        ),
    )
    for name, value, ok, bound in problems:
        if not ok:  # a comparison with NaN is false too
            raise UsageError(f"the workload model's {name} {value:g} is out of range: give {bound}")


def build_scenario(catalog: Catalog, workload: WorkloadModel, *, jobs: int, days: float, seed: int) -> Scenario:
    """Jobs over ``days`` days, outages over the days plus ``drain_days``, all from ``seed``.

    Bounds: ``days`` and the workload's ``drain_days`` at most ``MAX_DAYS``, ``jobs`` at most
    ``MAX_JOBS``, outages at most ``MAX_OUTAGES_PER_DAY``, checkpoints at least a second apart;
    the catalogue's spot preemption rates at most 60 an hour (:func:`~gpufleet.placement.costing.check_rates`).
    """
    if not days > 0:
        raise ParameterError("{days:name} must be > 0, got {days!s}", days=days)
    if not days <= MAX_DAYS:  # also infinity
        raise ParameterError("{days:name} must be at most 3650 (ten years), got {days!s}", days=days)
    if jobs < 1:
        raise ParameterError("{jobs:name} must be >= 1, got {jobs!s}", jobs=jobs)
    if jobs > MAX_JOBS:
        raise ParameterError("{jobs:name} must be at most 1000000, got {jobs!s}", jobs=jobs)
    if seed < 0:
        raise ParameterError("{seed:name} must be >= 0, got {seed!s}", seed=seed)
    check_workload(workload)
    check_rates(catalog)
    for_jobs, for_outages, for_preemptions = np.random.SeedSequence(seed).spawn(3)
    table = generate_jobs(catalog, workload, jobs=jobs, days=days, rng=np.random.default_rng(for_jobs))
    horizon = 24.0 * (days + workload.drain_days)
    outages = draw_outages(catalog, workload.outages, horizon_h=horizon, rng=np.random.default_rng(for_outages))
    return Scenario(table, outages, horizon, for_preemptions, workload)


def compare_policies(
    catalog: Catalog,
    scenario: Scenario,
    policies: Sequence[str],
    *,
    trace: bool = False,
    progress: Callable[[str, float], None] | None = None,
) -> list[SimResult]:
    """Each policy over the same scenario, with the same preemption seed."""
    chosen = [make_policy(name, scenario.workload) for name in policies]
    results = []
    for policy in chosen:
        report = None if progress is None else (lambda f, name=policy.name: progress(name, f))
        results.append(
            simulate(
                catalog,
                scenario.jobs,
                policy,
                horizon_h=scenario.horizon_h,
                outages=scenario.outages,
                seed=scenario.preemption_seed,
                workload=scenario.workload,
                trace=trace,
                progress=report,
            )
        )
    return results


__all__ = [
    "MAX_DAYS",
    "MAX_HORIZON_H",
    "MAX_JOBS",
    "MAX_OUTAGES_PER_DAY",
    "MIN_CHECKPOINT_MINUTES",
    "JobOutcomes",
    "Metrics",
    "Scenario",
    "Segment",
    "SimResult",
    "SimTrace",
    "build_scenario",
    "check_workload",
    "compare_policies",
    "simulate",
]
