"""What one job's measurements say about its checkpoint interval (``gpufleet advise JOB``).

:func:`advise_job` reads what a job measured (its saves, restores, restart start-ups, step time and
preemptions, through :func:`gpufleet.cost.usage.job_usages`) and gives Young's interval and Daly's
higher-order one (:func:`gpufleet.estimate.goodput.daly_interval`), recommending Daly's, with the share
of wall time lost at today's interval and at each from Daly's closed form
(:func:`~gpufleet.estimate.interval.lost_share`: saves, rework and restarts, so it is not
:func:`~gpufleet.estimate.interval.loss_fraction`, which leaves out the saves and the restarts
interrupted again). The formulas live in :mod:`gpufleet.estimate.interval`.

It also ranks what would recover the most GPU time: the job's badput buckets (the ledger's goodput
split), largest first in GPU-seconds and money, each with the remedy its own events point to
(:func:`gpufleet.cost.recover.recoverable`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpufleet.estimate.interval import (
    SECONDS_PER_HOUR,
    CheckpointAdvice,
    PreemptionRate,
    advise,
    expected_hours,
    loss_fraction,
    lost_share,
    young_daly_interval,
)
from gpufleet.fmt import number

if TYPE_CHECKING:
    from gpufleet.cost.ledger import AttemptUsage
    from gpufleet.cost.recover import Evidence, Recovery
    from gpufleet.jobs.store import Job, Store

# --- one job's advice, from what it measured -------------------------------------------------------------------


def _mean(total: float, count: int) -> float | None:
    return total / count if count > 0 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobMeasurements:
    """What a job's attempts measured: means, each with how many measurements it is from (``None``: none)."""

    save_seconds: float | None
    saves: int
    restore_seconds: float | None
    """The restore of a restart after a preemption (rollback restores left out)."""
    restores: int
    startup_seconds: float | None
    """Process start to the first step, restore and shut-down left out: of the restarts, else of the first attempt."""
    startups: int
    startup_of_restarts: bool
    step_seconds: float | None
    """Training seconds (useful and lost) per step run."""
    steps: int
    preemptions: int
    """Attempts that ended because the job was taken off its GPUs (preempted, requeued, lost)."""
    run_hours: float
    """Wall hours of all its attempts (a running one up to now)."""

    @property
    def preemptions_per_hour(self) -> float:
        return self.preemptions / self.run_hours if self.run_hours > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "save_seconds": self.save_seconds,
            "saves": self.saves,
            "restore_seconds": self.restore_seconds,
            "restores": self.restores,
            "startup_seconds": self.startup_seconds,
            "startups": self.startups,
            "startup_of_restarts": self.startup_of_restarts,
            "step_seconds": self.step_seconds,
            "steps": self.steps,
            "preemptions": self.preemptions,
            "run_hours": self.run_hours,
            "preemptions_per_hour": self.preemptions_per_hour,
        }


def measure(usages: Sequence[AttemptUsage]) -> JobMeasurements:
    """A job's measurements from its attempts' usage (:func:`gpufleet.cost.usage.job_usages`)."""
    from gpufleet.cost.ledger import PREEMPTED_OUTCOMES

    saves = sum(len(u.checkpoints) for u in usages)
    restarts = [u for u in usages if u.after_preemption and u.first_step is not None]
    started = restarts or [u for u in usages if u.first_step is not None][:1]
    trained = [(u.seconds(), u.steps_done) for u in usages if u.steps_done > 0]
    steps = sum(n for _, n in trained)
    return JobMeasurements(
        save_seconds=_mean(math.fsum(u.checkpoint_s for u in usages), saves),
        saves=saves,
        restore_seconds=_mean(math.fsum(u.restore_s - u.rollback_restore_s for u in restarts), len(restarts)),
        restores=len(restarts),
        startup_seconds=_mean(math.fsum(u.startup_s - u.shutdown_s for u in started), len(started)),
        startups=len(started),
        startup_of_restarts=bool(restarts),
        step_seconds=_mean(math.fsum(b["useful"] + b["lost"] for b, _ in trained), steps),
        steps=steps,
        preemptions=sum(1 for u in usages if u.outcome in PREEMPTED_OUTCOMES),
        run_hours=math.fsum(u.wall_s for u in usages) / SECONDS_PER_HOUR,
    )


@dataclass(frozen=True, slots=True)
class Interval:
    """A checkpoint interval, in seconds and (with a step time) whole steps, and the share of wall time it loses."""

    seconds: float
    steps: int | None
    lost_share: float | None
    """``None`` without a save time."""

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "steps": self.steps, "lost_share": self.lost_share}


@dataclass(frozen=True, slots=True, kw_only=True)
class JobAdvice:
    """The interval a job should checkpoint at, from what it measured, against what it does today."""

    job_id: int
    name: str
    measured: JobMeasurements
    rate: PreemptionRate
    """The rate planned for (``observed`` when nothing else was given: maybe 0)."""
    save_seconds: float | None
    """δ: the measured mean save, else ``placement.save_seconds``."""
    restart_seconds: float
    """R: start-up plus restore of a restart (what is missing counts 0, or the save for the restore)."""
    current: Interval | None
    current_source: str
    young: Interval | None
    daly: Interval | None
    """Daly's higher-order interval: the recommendation (``every: auto`` applies it while the job runs)."""
    notes: tuple[str, ...]
    """What was missing, and what stood in for it."""
    recover: tuple[Recovery, ...] = ()
    """The badput buckets, most GPU-seconds first, each with its remedy."""
    currency: str = "USD"
    """Of the money in ``recover``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job_id,
            "name": self.name,
            "measured": self.measured.to_dict(),
            "preemptions_per_hour": self.rate.per_hour,
            "rate_source": self.rate.source,
            "mtbf_seconds": SECONDS_PER_HOUR / self.rate.per_hour if self.rate.per_hour > 0 else None,
            "save_seconds": self.save_seconds,
            "restart_seconds": self.restart_seconds,
            "current": None if self.current is None else {**self.current.to_dict(), "source": self.current_source},
            "young": None if self.young is None else self.young.to_dict(),
            "daly": None if self.daly is None else self.daly.to_dict(),
            "recommended": "daly" if self.daly is not None else None,
            "notes": list(self.notes),
            "recover": [r.to_dict() for r in self.recover],
            "currency": self.currency,
        }


def _steps(seconds: float, step_seconds: float | None) -> int | None:
    return max(1, round(seconds / step_seconds)) if step_seconds else None


def _current(job: Job, m: JobMeasurements, auto_seconds: float | None, notes: list[str]) -> tuple[float | None, str]:
    """Today's interval: the shortest of what the spec asks (``every: auto``: its last logged interval)."""
    ck = job.spec.checkpoint
    found: list[tuple[float, str]] = []
    if ck.every_seconds is not None:
        found.append((ck.every_seconds, f"checkpoint.every_seconds {number(ck.every_seconds, 6)}"))
    if ck.every_steps is not None:
        if m.step_seconds is not None:
            found.append((ck.every_steps * m.step_seconds, f"checkpoint.every_steps {ck.every_steps} x measured step"))
        elif not found:
            notes.append(f"checkpoint.every_steps is {ck.every_steps} but no step time was measured: no interval today")
    if ck.every == "auto":
        if auto_seconds is not None:
            found.append((auto_seconds, "every: auto, as last logged"))
        else:
            notes.append("every: auto has logged no interval yet")
    if not found:
        return None, ""
    return min(found)


def advise_job(
    store: Store,
    job_id: int,
    *,
    rate: PreemptionRate | None = None,
    prior: PreemptionRate | None = None,
    now: float | None = None,
) -> JobAdvice:
    """The checkpoint interval job ``job_id`` should use, from what its attempts measured.

    ``rate`` replaces the observed preemption rate (a pool the job moves to); ``prior`` is used only
    while no preemption was observed (the catalogue rate of the pool it ran on).
    """
    from gpufleet.cost.usage import job_usages
    from gpufleet.estimate.goodput import daly_interval
    from gpufleet.jobs.events import EventKind

    job = store.job(job_id)
    usages = job_usages(store, job, now)
    m = measure(usages)
    notes: list[str] = []
    observed = PreemptionRate(m.preemptions_per_hour, "observed")
    if rate is not None:
        if m.preemptions:
            notes.append(
                f"planning for {number(rate.per_hour, 6)}/h ({rate.source}), "
                f"not the {number(observed.per_hour)}/h observed"
            )
        planned = rate
    elif m.preemptions == 0 and prior is not None:
        notes.append(
            f"no preemption observed in {number(m.run_hours)} h: "
            f"planning for {number(prior.per_hour, 6)}/h ({prior.source})"
        )
        planned = prior
    else:
        planned = observed
    save = m.save_seconds if m.save_seconds else None
    if save is None and job.spec.placement.save_seconds is not None:
        save = job.spec.placement.save_seconds
        notes.append(f"no checkpoint save measured: placement.save_seconds ({number(save, 6)} s) stands in")
    elif save is None:
        notes.append("no checkpoint save measured: no interval to recommend")
    restore = m.restore_seconds
    if restore is None:
        restore = save or 0.0
        notes.append(
            "no restart after a preemption measured: the save time stands in for the restore"
            if save
            else "no restart after a preemption measured: restore counted as 0"
        )
    startup = m.startup_seconds
    if startup is None:
        startup = 0.0
        notes.append("no attempt reached its first step: start-up counted as 0")
    elif not m.startup_of_restarts:
        notes.append("start-up is the first attempt's (no restart after a preemption yet)")
    restart = startup + restore
    if planned.per_hour == 0:
        notes.append("no preemptions measured: no interval to recommend")

    last = store.last_event(job_id, EventKind.CHECKPOINT_INTERVAL)
    auto = last.data.get("seconds") if last is not None else None
    auto_seconds = float(auto) if isinstance(auto, int | float) and not isinstance(auto, bool) and auto > 0 else None
    current_seconds, source = _current(job, m, auto_seconds, notes)

    def interval(seconds: float) -> Interval:
        lost = None if save is None else lost_share(seconds, save, restart, planned.per_hour)
        return Interval(seconds, _steps(seconds, m.step_seconds), lost)

    current = None if current_seconds is None else interval(current_seconds)
    young = daly = None
    first = advise(save, planned.per_hour, m.step_seconds) if save is not None else None  # None at a rate of 0
    if save is not None and first is not None:
        young = interval(first.interval_seconds)
        daly = interval(daly_interval(save, first.mtbf_seconds))
    evidence = _evidence(store, job, usages, m, current_seconds, daly)
    recover, currency = _recover(usages, evidence)
    return JobAdvice(
        job_id=job.id,
        name=job.name,
        measured=m,
        rate=planned,
        save_seconds=save,
        restart_seconds=restart,
        current=current,
        current_source=source,
        young=young,
        daly=daly,
        notes=tuple(notes),
        recover=tuple(recover),
        currency=currency,
    )


def _evidence(
    store: Store,
    job: Job,
    usages: Sequence[AttemptUsage],
    m: JobMeasurements,
    interval_s: float | None,
    daly: Interval | None,
) -> Evidence:
    """What the job measured that names a remedy: its stragglers and data waits, saves, restores, interval."""
    from gpufleet.cost.recover import Evidence, flat_events, rank_evidence

    named, data_wait = rank_evidence(flat_events(store.events(job.id)))
    ck = job.spec.checkpoint
    return Evidence(
        stragglers=named,
        data_wait_by_rank=data_wait,
        save_seconds=m.save_seconds,
        restore_seconds=m.restore_seconds,
        startup_seconds=m.startup_seconds,
        interval_seconds=interval_s,
        recommended_seconds=None if daly is None else daly.seconds,
        memory_tier=ck.memory is not None,
        async_save=ck.async_save,
        rollbacks=sum(len(u.rollbacks) for u in usages),
    )


def _recover(usages: Sequence[AttemptUsage], evidence: Evidence) -> tuple[list[Recovery], str]:
    """The ranked badput buckets, priced with the shipped rate card as ``gpufleet cost`` prices them."""
    from gpufleet.cost.rates import load_rates
    from gpufleet.cost.recover import attempt_prices, recoverable
    from gpufleet.errors import GpufleetError

    try:
        rates = load_rates()
    except GpufleetError:  # no card: GPU-seconds alone
        return recoverable(usages, {}, evidence), "USD"
    return recoverable(usages, attempt_prices(usages, rates), evidence), rates.currency


__all__ = [
    "SECONDS_PER_HOUR",
    "CheckpointAdvice",
    "Interval",
    "JobAdvice",
    "JobMeasurements",
    "PreemptionRate",
    "advise",
    "advise_job",
    "expected_hours",
    "loss_fraction",
    "lost_share",
    "measure",
    "young_daly_interval",
]
