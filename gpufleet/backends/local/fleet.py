"""The local scheduler on a fleet: Kueue-style admission, the planner's placement, storms, failover.

:class:`FleetScheduling` is the scheduler's :class:`~gpufleet.backends.local.scheduler.FleetPolicy`:
one :meth:`FleetScheduling.tick` replaces the one pool of slots of
:class:`~gpufleet.backends.local.scheduler.LocalScheduler` while ``$GPUFLEET_HOME/fleet/fleet.yaml``
exists (the fleet's files and the placing both backends share are ``backends/pools.py``):

1. **Down.** Jobs running on a target marked down (``gpufleet fleet down``) or in an outage of the
   fleet file are stopped: with their grace (they save), or at once when abrupt (they lose the work
   since their last checkpoint). The target is avoided until it is up again.
2. **Storms.** A spot job on a pool in a storm is preempted as a Poisson process at the storm's
   rate (seeded draws). Each preemption is recorded by the failover rule of the fleet file; the
   preemption that trips it blocks the region for the cool-down and moves the other jobs there.
3. **Placement.** The queued jobs, highest priority first, go to the offers the planner chooses
   (:func:`~gpufleet.placement.planner.plan`: cheapest expected cost that fits capacity and quota,
   within the job's ``placement`` preferences, blocked targets avoided, the region its checkpoint is
   in ranked first). A job moving to another region has its checkpoint copied and verified there
   first. A job that fits nowhere waits, and its reason is the planner's (``gpufleet jobs``).
4. **Reclaim.** A job refused for quota whose team is within its nominal quota takes it back
   (Kueue's ``reclaimWithinCohort: Any``): the other teams' jobs that borrowed it are preempted,
   lowest priority and newest first; they save, requeue, and wait for quota again.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from typing import Any

from gpufleet.backends.local.scheduler import LocalScheduler, RunningAttempt, plug_fleet_policy, startable
from gpufleet.backends.pools import (
    Move,
    Placed,
    active_fleet,
    explain_choice,
    fleet_file,
    matches,
    place_checkpoints,
    placed_from,
    planning_name,
    planning_spec,
    read_failover,
    read_marks,
    write_failover,
)
from gpufleet.errors import CheckpointError, UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Job
from gpufleet.placement.failover import Failover
from gpufleet.placement.fleetfile import Fleet
from gpufleet.placement.planner import Allocation, Plan, plan
from gpufleet.placement.quota import NO_QUOTA, QuotaBook
from gpufleet.spec import JobSpec

REPLAN_S = 2.0
"""Seconds between two placements of an unchanged queue (a blocked target may have expired)."""


class FleetScheduling:
    """The fleet half of one local scheduler; its state is the scheduler's ``running`` and the fleet files."""

    def __init__(self, sched: LocalScheduler, fleet: Fleet) -> None:
        self.sched = sched
        self.home = sched.home
        self.store = sched.store
        self.fleet = fleet
        self.mtime = fleet_file(self.home).stat().st_mtime_ns
        self.rng = random.Random(fleet.seed)
        self.failover: Failover = read_failover(self.home, fleet)
        self.last_tick: float | None = None
        self.last_plan: tuple[Any, ...] | None = None
        self.last_plan_at = 0.0
        self.reclaiming: dict[int, set[int]] = {}
        """Job id -> the borrowers preempted for it, until they are gone."""

    @staticmethod
    def load(sched: LocalScheduler) -> FleetScheduling | None:
        """The policy of the fleet in use in the scheduler's home, or ``None`` when it has none."""
        fleet = active_fleet(sched.home)
        return None if fleet is None else FleetScheduling(sched, fleet)

    def current(self) -> bool:
        """Whether the fleet file is still the one this was made from (``fleet use`` rewrites it)."""
        try:
            return fleet_file(self.home).stat().st_mtime_ns == self.mtime
        except OSError:  # dropped (`gpufleet fleet drop`): back to the one pool
            return False

    # ---- one tick ------------------------------------------------------------------------------
    def tick(self) -> None:
        now = time.time()
        marks = read_marks(self.home)
        seconds, hours = marks.seconds(now), marks.seconds(now) / 3600.0
        down = dict(marks.down)
        for pool in self.fleet.pools:
            outage = self.fleet.outage(pool.offer, seconds)
            if outage is not None:
                down[pool.offer] = down.get(pool.offer, False) or outage.abrupt
        self._stop_down(down)
        dt = 0.0 if self.last_tick is None else max(0.0, now - self.last_tick)
        self.last_tick = now
        self._storms(seconds, hours, dt)
        blocked = set(self.failover.blocked(hours)) | set(down)
        self._place(blocked, hours, now)

    def _live(self) -> list[RunningAttempt]:
        return [r for r in self.sched.running.values() if r.placed is not None and r.stop is None]

    def _stop_down(self, down: dict[str, bool]) -> None:
        for run in self._live():
            assert run.placed is not None
            hit = [t for t in down if matches(t, run.placed.offer)]
            if not hit:
                continue
            abrupt = any(down[t] for t in hit)
            self.store.add_event(
                run.job.id, EventKind.FLEET_DOWN, attempt=run.n, target=hit[0], offer=run.placed.offer, abrupt=abrupt
            )
            self.sched.stop(run, "preempted", None, abrupt=abrupt)

    def _storms(self, seconds: float, hours: float, dt: float) -> None:
        if dt <= 0:
            return
        changed = False
        for run in self._live():
            assert run.placed is not None
            rate = self.fleet.storm_rate(run.placed.offer, seconds) if run.placed.spot else 0.0
            if rate <= 0 or self.rng.random() >= 1.0 - math.exp(-rate * dt / 3600.0):
                continue
            region = run.placed.location
            self.store.add_event(
                run.job.id, EventKind.SPOT_PREEMPTED, attempt=run.n, offer=run.placed.offer, rate_per_hour=rate
            )
            self.sched.stop(run, "preempted", None)
            before = {b.target for b in self.failover.active(hours)}
            self.failover = self.failover.record_preemption(region, hours)
            changed = True
            if region in before or region not in {b.target for b in self.failover.active(hours)}:
                continue
            block = next(b for b in self.failover.active(hours) if b.target == region)
            for other in self._live():
                assert other.placed is not None
                if matches(region, other.placed.offer):
                    self.store.add_event(
                        other.job.id, EventKind.FAILOVER, attempt=other.n, target=region, why=block.why,
                        until_hours=block.until_hours,
                    )  # fmt: skip
                    self.sched.stop(other, "preempted", None)
            self.store.add_event(
                run.job.id,
                EventKind.FAILOVER,
                attempt=run.n,
                target=region,
                why=block.why,
                until_hours=block.until_hours,
            )
        if changed:
            write_failover(self.home, self.failover)

    # ---- placement ---------------------------------------------------------------------------------
    def _allocations(self) -> list[Allocation]:
        held = []
        for run in self.sched.running.values():
            if run.placed is not None:
                held.append(Allocation(run.placed.team, run.placed.offer, run.placed.gpus))
        return held

    def _place(self, blocked: set[str], hours: float, now: float) -> None:
        queued_jobs = startable(self.sched.home, self.store.jobs(states=("queued",)))
        queue = sorted(queued_jobs, key=lambda j: (-j.priority, j.id))
        queued = {j.id for j in queue}
        for owner in [o for o in self.reclaiming if o not in queued]:
            del self.reclaiming[owner]  # placed (or gone): its borrowers may borrow again
        # Kueue admits what fits in nominal quota before what borrows: a reclaimed borrower waits for its owner.
        held_back = {v: o for o, victims in self.reclaiming.items() for v in victims}
        for job in [j for j in queue if j.id in held_back]:
            self._wait(job, f"waiting: its borrowed quota was reclaimed for job {held_back[job.id]}")
        queue = [j for j in queue if j.id not in held_back]
        if not queue:
            return
        signature = (
            tuple(j.id for j in queue),
            tuple(sorted((r.job.id, r.stop) for r in self.sched.running.values())),
            tuple(sorted(blocked)),
        )
        if signature == self.last_plan and now - self.last_plan_at < REPLAN_S:
            return
        self.last_plan, self.last_plan_at = signature, now
        try:
            specs = [planning_spec(j, self.home) for j in queue]
            result = plan(
                specs,
                self.fleet.catalog,
                now_hours=hours,
                blocked=sorted(blocked),
                running=self._allocations(),
                prefer_provider={s.name: s.provider for s in specs},
            )
        except UsageError as err:  # a job the fleet cannot plan at all (its spec changed by a resize)
            for job in queue:
                self._wait(job, str(err))
            return
        launched = False
        for job in queue:
            decision = result.decision(planning_name(job.id))
            choice = decision.choice
            if choice is None:
                why_not = self._quota_reason(job) or "; ".join(decision.reasons) or "no pool fits"
                self._wait(job, f"waiting: {why_not}")
                continue
            why = explain_choice(result, decision.job)
            placed = placed_from(choice, self.fleet, job.team, why)
            try:
                move = place_checkpoints(self.home, job.id, placed.location)
            except (OSError, CheckpointError) as err:
                self._wait(job, f"waiting: its checkpoint could not be moved to {placed.location}: {err}")
                continue
            if move is not None and move.step is not None:
                self._record_move(job, move, placed)
            self.store.add_event(job.id, EventKind.PLACED, **placed.to_event())
            if job.reason:  # it waited; it no longer does
                self.store.set_reason(job.id, None)
            self.sched.launch(job, placed)
            launched = True
        if not launched:
            self._reclaim(queue, result)

    def _quota_reason(self, job: Job) -> str | None:
        """Why the job's team has no quota for it now, when a quota is what holds it (Kueue's words)."""
        book = QuotaBook(self.fleet.catalog.quotas)
        for held in self._allocations():
            o = self.fleet.offer(held.offer)
            row = book.resource(held.team, o.gpu_type, o.provider)
            if row >= 0:
                book.hold(row, held.gpus)
        reasons = []
        for o in self.fleet.catalog.offers:
            if o.gpu_type not in _gpu_types(job.spec):
                continue
            row = book.resource(job.team, o.gpu_type, o.provider)
            if row == NO_QUOTA:
                reasons.append(f"team {job.team} has no quota for {o.gpu_type} at {o.provider}")
            elif row >= 0:
                reason = book.why_not(row, job.spec.total_gpus)
                if reason is None:
                    return None  # a quota has room: capacity (or something else) holds it
                reasons.append(reason)
        return "; ".join(dict.fromkeys(reasons)) or None

    def _wait(self, job: Job, reason: str) -> None:
        if job.reason != reason:
            self.store.set_reason(job.id, reason)

    def _record_move(self, job: Job, move: Move, placed: Placed) -> None:
        source_provider = move.source.split("/", 1)[0]
        rate = max((o.egress_per_gb for o in self.fleet.catalog.offers if o.provider == source_provider), default=0.0)
        cross = source_provider != placed.provider
        self.store.add_event(
            job.id,
            EventKind.CHECKPOINT_MOVED,
            source=move.source,
            target=move.target,
            step=move.step,
            bytes=move.bytes,
            seconds=move.seconds,
            egress_per_gb=rate if cross else 0.0,
            egress_money=(move.bytes / 1e9) * rate if cross else 0.0,
        )

    def _reclaim(self, queue: Sequence[Job], result: Plan) -> None:
        """Take back lent quota for the first queued job refused for quota within its nominal."""
        if self.reclaiming:
            return  # one reclaim at a time: its borrowers are still saving, or its owner not yet placed
        for job in queue:
            if result.decision(planning_name(job.id)).placed:
                continue
            victims = self._borrowers_for(job)
            if not victims:
                continue
            for victim in victims:
                self.store.add_event(victim.job.id, EventKind.RECLAIMED_BY, attempt=victim.n, job=job.id)
                self.sched.stop(victim, "preempted", None)
            self.reclaiming[job.id] = {v.job.id for v in victims}
            return

    def _borrowers_for(self, job: Job) -> list[RunningAttempt]:
        """Running jobs of other teams in the cohort that borrowed what ``job``'s team is owed."""
        catalog, need = self.fleet.catalog, job.spec.total_gpus
        for gpu_type in sorted(_gpu_types(job.spec)):
            rows = [q for q in catalog.quotas_for(job.team) if q.gpu_type == gpu_type and q.cohort is not None]
            for quota in rows:
                mine = sum(
                    r.placed.gpus
                    for r in self.sched.running.values()
                    if r.placed is not None and r.placed.team == job.team and r.placed.gpu_type == gpu_type
                )
                if mine + need > quota.nominal:
                    continue  # beyond its nominal a team borrows; it never takes
                cohort = {q.team for q in catalog.quotas if q.cohort == quota.cohort}
                borrowers = sorted(
                    (
                        r
                        for r in self._live()
                        if r.placed is not None
                        and r.placed.team in cohort - {job.team}
                        and r.placed.gpu_type == gpu_type
                        and r.placed.borrowed_gpus > 0
                        and r.job.priority <= job.priority
                    ),
                    key=lambda r: (r.job.priority, -r.started),
                )
                chosen, freed = [], 0
                for run in borrowers:
                    if freed >= need:
                        break
                    assert run.placed is not None
                    chosen.append(run)
                    freed += run.placed.borrowed_gpus
                if chosen:
                    return chosen
        return []


def _gpu_types(spec: JobSpec) -> set[str]:
    """The GPU types a job accepts: its own and those of its placement preferences."""
    choices = [*spec.placement.any_of, *spec.placement.ordered]
    return {spec.resources.gpu_type} | {c.gpu_type for c in choices if c.gpu_type}


plug_fleet_policy(FleetScheduling.load)

__all__ = ["REPLAN_S", "FleetScheduling"]
