"""The cost ledger: pure arithmetic from attempts and a rate card to GPU-hours and money.

Every second an attempt held its GPUs falls in exactly one bucket::

    wall = startup + restore + checkpoint + lost + useful

- ``startup``: process start to the first training step, restore excluded (imports, data), and
  the shut-down after a session ended on purpose (a preempted process exiting);
- ``restore``: reading and verifying the checkpoint it resumed from (also after a rollback);
- ``checkpoint``: time spent saving checkpoints;
- ``lost``: training that had to be redone: the work after the last durable checkpoint of an
  attempt that did not finish (preempted, killed, lost), plus the steps discarded by a rollback;
- ``useful``: the rest.

GPU-seconds are wall seconds times the attempt's GPUs. Money is GPU-hours times the rate card's
price for the attempt's (gpu_type, provider, spot); ``on_demand_money`` prices the same hours at
the on-demand rate, to show what spot saved (or cost, once preemption losses are counted).

**Preemption overhead** is derived, not a sixth bucket: the seconds, taken from the buckets above,
that a job spent only because it was preempted. Lost work alone understates it: a preempted
attempt usually saves at the signal and loses almost nothing, while the restart pays the full
process start-up and the restore again. So, per attempt::

    preemption = lost work of a preempted attempt (rollbacks excluded)
               + its shut-down after the session ended (part of ``startup``)
               + the checkpoint saved at the preemption signal (part of ``checkpoint``)
               + all the start-up of an attempt that restarted after a preemption
               + the restore of that restart (rollback restores excluded)

A rollback's lost work and restore are in ``lost`` and ``restore`` but not in the overhead: a NaN
costs them whether or not the job is ever preempted.

**Preemption notices.** A provider that warns before it takes a node back (a spot notice, a Slurm
``--signal``) lets the attempt save at once; the ledger lists each notice with its lead time (how
long before the node went the attempt heard of it) and the seconds the save took, beside the buckets
above, which it does not change.

**Short-handed steps.** Under ``distributed.recovery: continue`` a lost replica costs no restart:
the others step on without it while it heals. Those steps are not bit-exact (fewer shares of the
batch averaged); the ledger lists how many there were and the samples the missing shares skipped,
beside the buckets, which they do not change (the GPUs were held and used throughout).

**Preempted or killed.** An attempt requeued because a process of it was killed or vanished (a
``kill -9`` of a rank, a rank lost to its group, the OOM killer, a lost node) is not a preemption:
it is counted under ``killed``, not ``preemptions``. Its restart costs what a preemption's does,
so the overhead above counts it the same way.

**Goodput in twelve buckets.** ``AttemptUsage.goodput_seconds`` splits the same wall more finely, in
``GOODPUT_BUCKETS`` order, into parts that sum to it exactly (the last measured in time, ``compute``,
is what remains)::

    wall = queued + startup + staging + data_wait + compute + straggler_wait
         + checkpoint + restore + lost + rollback + resize + idle

- ``queued``: the attempt held its GPUs before its processes started (the local backend takes GPUs
  as it starts the process: 0; on Slurm, sacct's Start up to the batch script's first event);
- ``startup``: process start to the first step, staging and restore excluded (imports, the group);
- ``staging``, ``checkpoint``: as above;
- ``restore``: the restore the attempt started from (a rollback's is in ``rollback``, a resharded
  one's in ``resize``);
- ``lost``: the work after the last durable checkpoint of an attempt that did not finish;
- ``rollback``: the steps a rollback discarded and its restore;
- ``resize``: restoring a checkpoint resharded onto another world size (after ``gpufleet resize``);
- ``idle``: held after the session ended (or after the last step) until the process exited;
- the training time left, ``T``, split by the phase totals the runtime reports (summed over ranks,
  ``S = data_wait + compute + collective + optimizer``): ``data_wait = T x data_wait / S``,
  ``straggler_wait = T x straggler_wait / S`` (the part of the collectives spent waiting for slower
  ranks), ``compute`` the rest; without phase totals all of ``T`` is ``compute``.

Goodput is ``compute`` over the whole; badput is every other bucket.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpufleet.cost.rates import RateCard
from gpufleet.jobs.events import MAX_TS
from gpufleet.jobs.states import Outcome

BUCKETS = ("useful", "lost", "checkpoint", "restore", "staging", "startup")
GOODPUT_BUCKETS = (
    "queued",
    "startup",
    "staging",
    "data_wait",
    "compute",
    "straggler_wait",
    "checkpoint",
    "restore",
    "lost",
    "rollback",
    "resize",
    "idle",
)
"""Where every billed GPU-second went (``AttemptUsage.goodput_seconds``); goodput is ``compute`` over all."""
PREEMPTION_BUCKETS = ("lost", "checkpoint", "restore", "staging", "startup")
"""The buckets a preemption's overhead is drawn from (``useful`` never is)."""
PREEMPTED_OUTCOMES = (Outcome.PREEMPTED, Outcome.REQUEUED, Outcome.LOST)
"""Outcomes of an attempt that ended because the job was taken away from its GPUs (and was requeued):
a preemption, or a kill (``AttemptUsage.killed``), counted apart but costing a restart alike."""


def _seconds(value: float) -> float:
    """Seconds as the ledger counts them: from 0 to ``MAX_TS``, NaN as 0.

    Times come from a job's own event log and from schedulers' clocks: an infinity or a NaN there
    must not become a bill (nor NaN in a report), and a sum of bounded parts stays finite.
    """
    # min(max(value, 0.0), MAX_TS) with NaN as 0, spelt as comparisons: the ledger calls it some 20 times an
    # attempt, and the builtins' calls were a tenth of pricing a running fleet. The same value in every case
    # (-0.0 included: max() returns its first argument on a tie).
    if value != value or value < 0.0:
        return 0.0
    return MAX_TS if value > MAX_TS else value


@dataclass(frozen=True, slots=True)
class PhaseShares:
    """An attempt's phase totals summed over its ranks: what splits its training time.

    From the last ``phase_totals_s`` the runtime reported (``cost.usage.attempt_phases`` validates
    it). ``busy_s`` is ``data_wait + compute + collective + optimizer`` over all ranks; the
    ``checkpoint`` phase is left out, as the ledger counts saves from their own events.
    """

    data_wait_s: float
    straggler_wait_s: float
    busy_s: float

    def split(self, training_s: float) -> tuple[float, float]:
        """``training_s`` seconds' shares of data wait and straggler wait; ``compute`` is the rest."""
        busy = _seconds(self.busy_s)
        if busy <= 0 or training_s <= 0:
            return 0.0, 0.0
        data = min(1.0, _seconds(self.data_wait_s) / busy)
        straggler = min(1.0 - data, _seconds(self.straggler_wait_s) / busy)
        return training_s * data, training_s * max(0.0, straggler)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptUsage:
    """What one attempt of one job used, as measured by the runtime and the backend."""

    job_id: int
    job_name: str
    team: str
    attempt: int
    gpu_type: str
    provider: str
    spot: bool
    gpus: int
    start: float
    """Unix time the attempt's process started."""
    end: float
    outcome: str
    """``completed``, ``preempted``, ``requeued``, ``failed``, ``cancelled``, ``lost`` or ``running``."""
    killed: bool = False
    """The attempt ended because a process of it was killed or vanished (a ``kill -9``, a rank lost to
    its group, the OOM killer, a lost node), not because a scheduler preempted it: listed under
    ``killed``, never under ``preempted`` (see ``usage.killed_attempt``)."""
    startup_s: float = 0.0
    restore_s: float = 0.0
    staging_s: float = 0.0
    """Staging the job's data in before the first step (``data_staged``), out of the start-up."""
    checkpoint_s: float = 0.0
    lost_s: float = 0.0
    steps_done: int = 0
    """Optimizer steps this attempt ran, redone ones included."""
    steps_redone: int = 0
    """Of ``steps_done``, the ones whose work was thrown away (rollback, or after the last
    durable checkpoint of an attempt that did not finish)."""
    first_step: int | None = None
    last_step: int | None = None
    checkpoints: tuple[float, ...] = ()
    """Unix times at which checkpoints became durable (for the timeline)."""
    rollbacks: tuple[float, ...] = ()
    """Unix times of rollbacks to the last healthy checkpoint (for the timeline)."""
    after_preemption: bool = False
    """This attempt restarted the job after an earlier attempt was preempted: its start-up and
    restore are preemption overhead."""
    shutdown_s: float = 0.0
    """Of ``startup_s``, the process exit after a session ended on purpose (saved at the signal)."""
    preempt_save_s: float = 0.0
    """Of ``checkpoint_s``, the checkpoint saved at the preemption signal (``reason: preempt``)."""
    rollback_lost_s: float = 0.0
    """Of ``lost_s``, the steps discarded by rollbacks (the rest is lost to the attempt's end)."""
    rollback_restore_s: float = 0.0
    """Of ``restore_s``, reloading a healthy checkpoint after a rollback."""
    offer: str | None = None
    """``provider/region/gpu_type`` of the fleet pool the attempt ran on (``None``: no fleet)."""
    price_per_gpu_hour: float | None = None
    """The offer's price the planner placed it at; ``None``: the rate card's."""
    on_demand_per_gpu_hour: float | None = None
    egress_bytes: int = 0
    """Checkpoint bytes copied to this attempt's region before it started (a failover's move)."""
    egress_money: float = 0.0
    notice_source: str | None = None
    """The provider whose preemption notice reached the attempt (``aws``, ``gcp``, ``azure``, ``slurm``)."""
    notice_lead_s: float | None = None
    """Seconds between that notice and the deadline it gave (``None``: no notice, or no deadline)."""
    short_handed_steps: int = 0
    """Steps run without every replica (``distributed.recovery: continue``, while a lost one healed)."""
    samples_skipped: int = 0
    """Samples of the missing replicas' shares of those steps: trained on by nobody."""
    queued_s: float = 0.0
    """Of ``startup_s``, the seconds the attempt held its GPUs before its processes started."""
    idle_s: float = 0.0
    """Held after the session ended (or after the last step) until the attempt's end. ``shutdown_s``
    is part of it; the older buckets count the rest as ``useful``, or as ``startup`` for an attempt
    that never reached a first step (``first_step`` None). Never less than ``shutdown_s``."""
    resize_restore_s: float = 0.0
    """Of ``restore_s``, the restore at start that resharded a checkpoint onto another world size."""
    phases: PhaseShares | None = None
    """The phase totals that split the training time (``None``: the runtime reported none)."""

    @property
    def wall_s(self) -> float:
        return _seconds(self.end - self.start)

    def _overheads(self) -> dict[str, float]:
        return {
            "lost": _seconds(self.lost_s),
            "checkpoint": _seconds(self.checkpoint_s),
            "restore": _seconds(self.restore_s),
            "staging": _seconds(self.staging_s),
            "startup": _seconds(self.startup_s),
        }

    def _scale(self, overheads: dict[str, float] | None = None) -> float:
        """Measured overheads can exceed the wall (clock skew, sacct's whole seconds): shrink them to fit."""
        spent = sum((self._overheads() if overheads is None else overheads).values())
        return self.wall_s / spent if spent > self.wall_s and spent > 0 else 1.0

    def seconds(self, overheads: dict[str, float] | None = None) -> dict[str, float]:
        """Wall seconds by bucket; ``useful`` absorbs the rest and is never negative.

        ``overheads``: :meth:`_overheads`, when the caller has them (pricing an attempt reads them once)."""
        overheads = self._overheads() if overheads is None else overheads
        scale = self._scale(overheads)
        out = {k: v * scale for k, v in overheads.items()}
        out["useful"] = max(0.0, self.wall_s - sum(out.values()))
        return out

    def _goodput_measured(self, overheads: dict[str, float] | None = None) -> dict[str, float]:
        """The goodput buckets measured in time, unscaled: the older buckets split further, plus idle."""
        old = self._overheads() if overheads is None else overheads
        queued = min(_seconds(self.queued_s), old["startup"])
        idle = max(_seconds(self.idle_s), _seconds(self.shutdown_s))
        in_startup = idle if self.first_step is None else _seconds(self.shutdown_s)
        in_startup = min(in_startup, old["startup"] - queued)
        rollback_restore = min(_seconds(self.rollback_restore_s), old["restore"])
        resize = min(_seconds(self.resize_restore_s), old["restore"] - rollback_restore)
        rollback_lost = min(_seconds(self.rollback_lost_s), old["lost"])
        return {
            "queued": queued,
            "startup": old["startup"] - queued - in_startup,
            "staging": old["staging"],
            "checkpoint": old["checkpoint"],
            "restore": old["restore"] - rollback_restore - resize,
            "lost": old["lost"] - rollback_lost,
            "rollback": rollback_lost + rollback_restore,
            "resize": resize,
            "idle": idle,
        }

    def goodput_seconds(self, overheads: dict[str, float] | None = None) -> dict[str, float]:
        """Wall seconds in each of ``GOODPUT_BUCKETS``, summing to ``wall_s`` (see the module doc).

        Measured buckets that together exceed the wall are shrunk to fit, as ``seconds()`` does; the
        training time left is split by ``phases``, and ``compute`` is the remainder, never negative.
        """
        measured = self._goodput_measured(overheads)
        spent = math.fsum(measured.values())
        scale = self.wall_s / spent if spent > self.wall_s and spent > 0 else 1.0
        parts = {k: v * scale for k, v in measured.items()}
        training = max(0.0, self.wall_s - math.fsum(parts.values()))
        data_wait, straggler = self.phases.split(training) if self.phases is not None else (0.0, 0.0)
        parts["data_wait"], parts["straggler_wait"] = data_wait, straggler
        out = {k: parts.get(k, 0.0) for k in GOODPUT_BUCKETS}
        out["compute"] = max(0.0, self.wall_s - math.fsum(out.values()))
        return out

    def preemption_seconds(self, overheads: dict[str, float] | None = None) -> dict[str, float]:
        """Wall seconds of each bucket that were spent because of a preemption (see the module doc).

        Each part is clamped to its bucket and scaled like ``seconds()``, so the overhead never
        exceeds the wall time, nor any bucket's share of it.
        """
        preempted = self.outcome in PREEMPTED_OUTCOMES
        buckets = self._overheads() if overheads is None else overheads
        lost = buckets["lost"] - _seconds(self.rollback_lost_s) if preempted else 0.0
        startup = buckets["startup"] if self.after_preemption else _seconds(self.shutdown_s) if preempted else 0.0
        restore = buckets["restore"] - _seconds(self.rollback_restore_s) if self.after_preemption else 0.0
        staging = buckets["staging"] if self.after_preemption else 0.0
        parts = {
            "lost": lost,
            "checkpoint": _seconds(self.preempt_save_s),
            "restore": restore,
            "staging": staging,
            "startup": startup,
        }
        scale = self._scale(buckets)
        return {k: min(max(0.0, part), buckets[k]) * scale for k, part in parts.items()}


@dataclass(frozen=True, slots=True)
class NoticeLead:
    """One attempt's preemption notice: who gave it, how far ahead, and how long the save after it took."""

    job_id: int
    attempt: int
    source: str
    lead_s: float | None
    saved_s: float

    def to_dict(self) -> dict[str, object]:
        lead = None if self.lead_s is None else round(_seconds(self.lead_s), 3)
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "source": self.source,
            "lead_s": lead,
            "saved_s": round(_seconds(self.saved_s), 6),
        }


@dataclass(frozen=True, slots=True)
class Cost:
    """GPU-hours by bucket, and money; the unit of every row in the ledger."""

    gpu_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    preemption_gpu_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PREEMPTION_BUCKETS, 0.0))
    """GPU-hours spent because of preemptions, by the bucket they also count in."""
    preemption_money: float = 0.0
    """``preemption_gpu_hours`` priced at each attempt's own rate."""
    money: float = 0.0
    on_demand_money: float = 0.0
    attempts: int = 0
    preemptions: int = 0
    """Attempts a scheduler (or a cloud) took away with a preemption signal."""
    killed: int = 0
    """Attempts that ended because a process was killed or lost (``AttemptUsage.killed``): not
    preemptions, though a requeued one costs its restart the same way (counted in the overhead)."""
    steps_redone: int = 0
    unpriced: tuple[str, ...] = ()
    egress_money: float = 0.0
    """Moving checkpoints between providers (in ``money`` too)."""
    egress_bytes: int = 0
    notices: tuple[NoticeLead, ...] = ()
    """The preemption notices its attempts had (none: every preemption came unannounced)."""
    short_handed_steps: int = 0
    """Steps its attempts ran without every replica (``distributed.recovery: continue``)."""
    samples_skipped: int = 0
    """Samples those steps skipped (the missing replicas' shares of the global batch)."""
    goodput_gpu_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GOODPUT_BUCKETS, 0.0))
    """GPU-seconds in each of ``GOODPUT_BUCKETS``: the same GPU time as ``gpu_hours``, split finer."""

    @property
    def total_gpu_hours(self) -> float:
        return sum(self.gpu_hours.values())

    @property
    def gpu_seconds(self) -> float:
        """All GPU-seconds, as the goodput buckets add them up."""
        return math.fsum(self.goodput_gpu_seconds.values())

    @property
    def goodput(self) -> float | None:
        """``compute`` over all GPU-seconds (``None`` with no GPU time to judge)."""
        total = self.gpu_seconds
        return self.goodput_gpu_seconds["compute"] / total if total > 0 else None

    @property
    def rate_per_gpu_second(self) -> float:
        """The average price of a GPU-second here (egress, which no GPU-second costs, left out)."""
        total = self.gpu_seconds
        return max(0.0, self.money - self.egress_money) / total if total > 0 else 0.0

    def badput_top(self, n: int = 3) -> list[tuple[str, float, float]]:
        """The ``n`` largest buckets other than ``compute`` with any time: (bucket, GPU-seconds, money).

        Money is priced at this row's average rate (``rate_per_gpu_second``); ties keep bucket order.
        """
        rate = self.rate_per_gpu_second
        spent = [(k, v) for k, v in self.goodput_gpu_seconds.items() if k != "compute" and v > 0]
        spent.sort(key=lambda kv: -kv[1])
        return [(k, v, v * rate) for k, v in spent[:n]]

    def bucket_gpu_seconds(self) -> dict[str, float]:
        """The goodput buckets rounded to the microsecond, the rounding's remainder put on ``compute``,
        so that they add up to ``round(gpu_seconds, 6)`` as printed."""
        total = round(self.gpu_seconds, 6)
        out = {k: round(v, 6) for k, v in self.goodput_gpu_seconds.items()}
        out["compute"] = max(0.0, round(total - math.fsum(v for k, v in out.items() if k != "compute"), 6))
        return out

    @property
    def lost_money(self) -> float:
        """Money spent on work that was redone (lost GPU-hours at the average rate)."""
        total = self.total_gpu_hours
        return self.money * self.gpu_hours["lost"] / total if total > 0 else 0.0

    @property
    def preemption_overhead_gpu_hours(self) -> float:
        return sum(self.preemption_gpu_hours.values())

    @property
    def preemption_share(self) -> float:
        """The preemption overhead as a fraction of all GPU-hours (0 when there are none)."""
        total = self.total_gpu_hours
        return self.preemption_overhead_gpu_hours / total if total > 0 else 0.0

    def __add__(self, other: Cost) -> Cost:
        return _sum(self, (other,))

    def to_dict(self) -> dict[str, object]:
        return {
            "gpu_hours": _sig(self.total_gpu_hours),
            "useful_gpu_hours": _sig(self.gpu_hours["useful"]),
            "lost_gpu_hours": _sig(self.gpu_hours["lost"]),
            "checkpoint_gpu_hours": _sig(self.gpu_hours["checkpoint"]),
            "restore_gpu_hours": _sig(self.gpu_hours["restore"]),
            "staging_gpu_hours": _sig(self.gpu_hours["staging"]),
            "startup_gpu_hours": _sig(self.gpu_hours["startup"]),
            "money": _sig(self.money),
            "lost_money": _sig(self.lost_money),
            "on_demand_money": _sig(self.on_demand_money),
            "attempts": self.attempts,
            "preemptions": self.preemptions,
            "killed": self.killed,
            "steps_redone": self.steps_redone,
            "unpriced": list(self.unpriced),
            "egress_money": _sig(self.egress_money),
            "egress_bytes": self.egress_bytes,
            "preemption_overhead_gpu_hours": _sig(self.preemption_overhead_gpu_hours),
            "preemption_overhead_gpu_seconds": _sig(self.preemption_overhead_gpu_hours * 3600.0),
            "preemption_overhead_money": _sig(self.preemption_money),
            "preemption_overhead_share": _sig(self.preemption_share),
            "preemption_overhead_gpu_seconds_by_bucket": {
                k: _sig(v * 3600.0) for k, v in self.preemption_gpu_hours.items()
            },
            "preemption_notices": [n.to_dict() for n in self.notices],
            "short_handed_steps": self.short_handed_steps,
            "samples_skipped": self.samples_skipped,
            "gpu_seconds": round(self.gpu_seconds, 6),
            "buckets": self.bucket_gpu_seconds(),
            "goodput": None if self.goodput is None else round(self.goodput, 6),
            "badput_top": [
                {"bucket": k, "gpu_seconds": round(v, 6), "money": _sig(m)} for k, v, m in self.badput_top()
            ],
        }


def _sig(value: float, digits: int = 6) -> float:
    """Round to significant digits: a CPU demo costs millionths of a dollar, and that must show."""
    return float(f"{value:.{digits}g}")


def attempt_price(usage: AttemptUsage, rates: RateCard) -> float | None:
    """The price of one GPU-hour of an attempt, as the ledger charges it: its fleet offer's, else the card's."""
    if usage.price_per_gpu_hour is not None:  # placed on a fleet pool: the offer's own prices
        return usage.price_per_gpu_hour
    return rates.price(usage.gpu_type, usage.provider, spot=usage.spot)


def attempt_cost(usage: AttemptUsage, rates: RateCard) -> Cost:
    """Price one attempt. An attempt with no rate is counted in hours and listed as unpriced."""
    overheads = usage._overheads()  # the same for the three splits below: read once
    hours = {k: v * usage.gpus / 3600.0 for k, v in usage.seconds(overheads).items()}
    preemption = {k: v * usage.gpus / 3600.0 for k, v in usage.preemption_seconds(overheads).items()}
    total = sum(hours.values())
    price = attempt_price(usage, rates)
    on_demand = (
        usage.on_demand_per_gpu_hour
        if usage.price_per_gpu_hour is not None
        else rates.price(usage.gpu_type, usage.provider, spot=False)
    )
    key = f"{usage.gpu_type}/{usage.provider}/{'spot' if usage.spot else 'on-demand'}"
    egress = usage.egress_money if math.isfinite(usage.egress_money) and usage.egress_money > 0 else 0.0
    return Cost(
        gpu_hours=hours,
        goodput_gpu_seconds={k: v * usage.gpus for k, v in usage.goodput_seconds(overheads).items()},
        preemption_gpu_hours=preemption,
        preemption_money=sum(preemption.values()) * price if price is not None else 0.0,
        money=(total * price if price is not None else 0.0) + egress,
        on_demand_money=total * (on_demand if on_demand is not None else price or 0.0) + egress,
        egress_money=egress,
        egress_bytes=max(0, usage.egress_bytes),
        attempts=1,
        preemptions=1 if usage.outcome in PREEMPTED_OUTCOMES and not usage.killed else 0,
        killed=1 if usage.killed else 0,
        steps_redone=usage.steps_redone,
        unpriced=() if price is not None else (key,),
        notices=_notices(usage),
        short_handed_steps=max(0, usage.short_handed_steps),
        samples_skipped=max(0, usage.samples_skipped),
    )


def _notices(usage: AttemptUsage) -> tuple[NoticeLead, ...]:
    if usage.notice_source is None:
        return ()
    lead = usage.notice_lead_s
    lead = lead if lead is not None and math.isfinite(lead) else None
    return (NoticeLead(usage.job_id, usage.attempt, usage.notice_source, lead, usage.preempt_save_s),)


def _total(costs: Iterable[Cost]) -> Cost:
    """``Cost() + a + b + ...``, built once (:func:`_sum`)."""
    return _sum(Cost(), costs)


def _sum(first: Cost, rest: Iterable[Cost]) -> Cost:
    """``first + a + b + ...`` built once: each figure added in order (the floats of the chained ``+``), the
    unpriced keys united and sorted, the notices joined in order. Chaining ``+`` built one whole ``Cost`` per
    term, a third of pricing a job again; ``+`` itself is this with one term, so the two never differ."""
    hours = {k: first.gpu_hours[k] for k in BUCKETS}
    preempted = {k: first.preemption_gpu_hours[k] for k in PREEMPTION_BUCKETS}
    goodput = {k: first.goodput_gpu_seconds[k] for k in GOODPUT_BUCKETS}
    preemption_money, money = first.preemption_money, first.money
    on_demand_money, egress_money = first.on_demand_money, first.egress_money
    attempts, preemptions, killed, steps_redone = first.attempts, first.preemptions, first.killed, first.steps_redone
    egress_bytes, short_handed, skipped = first.egress_bytes, first.short_handed_steps, first.samples_skipped
    unpriced = set(first.unpriced)
    notices = first.notices
    for c in rest:
        for k in BUCKETS:
            hours[k] += c.gpu_hours[k]
        for k in PREEMPTION_BUCKETS:
            preempted[k] += c.preemption_gpu_hours[k]
        for k in GOODPUT_BUCKETS:
            goodput[k] += c.goodput_gpu_seconds[k]
        preemption_money += c.preemption_money
        money += c.money
        on_demand_money += c.on_demand_money
        egress_money += c.egress_money
        attempts += c.attempts
        preemptions += c.preemptions
        killed += c.killed
        steps_redone += c.steps_redone
        egress_bytes += c.egress_bytes
        short_handed += c.short_handed_steps
        skipped += c.samples_skipped
        unpriced.update(c.unpriced)
        notices += c.notices
    return Cost(
        gpu_hours=hours,
        preemption_gpu_hours=preempted,
        preemption_money=preemption_money,
        money=money,
        on_demand_money=on_demand_money,
        attempts=attempts,
        preemptions=preemptions,
        killed=killed,
        steps_redone=steps_redone,
        unpriced=tuple(sorted(unpriced)),
        egress_money=egress_money,
        egress_bytes=egress_bytes,
        notices=notices,
        short_handed_steps=short_handed,
        samples_skipped=skipped,
        goodput_gpu_seconds=goodput,
    )


@dataclass(frozen=True, slots=True)
class Ledger:
    """Costs per job, per team, and in total."""

    jobs: dict[int, Cost]
    teams: dict[str, Cost]
    total: Cost
    currency: str


def job_cost(usages: Sequence[AttemptUsage], rates: RateCard, *, first: Cost | None = None) -> Cost:
    """One job's row of the ledger: its attempts' costs added in order, as :func:`build_ledger` adds them.

    ``first``: what the job's earlier attempts came to (this function's result for them): the sum goes on from
    it, and is the same to the last bit as pricing every attempt (each figure is added in order)."""
    return _sum(Cost() if first is None else first, (attempt_cost(u, rates) for u in usages))


def build_ledger(usages: Sequence[AttemptUsage], rates: RateCard) -> Ledger:
    """Aggregate attempts into per-job, per-team and total costs."""
    per_attempt = [(u, attempt_cost(u, rates)) for u in usages]
    jobs: dict[int, Cost] = {}
    teams: dict[str, Cost] = {}
    for usage, cost in per_attempt:
        jobs[usage.job_id] = jobs.get(usage.job_id, Cost()) + cost
        teams[usage.team] = teams.get(usage.team, Cost()) + cost
    return Ledger(
        jobs=dict(sorted(jobs.items())),
        teams=dict(sorted(teams.items())),
        total=_total(c for _, c in per_attempt),
        currency=rates.currency,
    )


__all__ = [
    "BUCKETS",
    "GOODPUT_BUCKETS",
    "PREEMPTED_OUTCOMES",
    "PREEMPTION_BUCKETS",
    "AttemptUsage",
    "Cost",
    "Ledger",
    "NoticeLead",
    "PhaseShares",
    "attempt_cost",
    "attempt_price",
    "build_ledger",
    "job_cost",
]
