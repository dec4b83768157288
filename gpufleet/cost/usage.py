"""From what the store recorded (attempts and events) to ``AttemptUsage`` values for the ledger.

Each attempt is priced at the GPUs it ran on, not at the job's spec: a job can change its GPUs
between attempts (``gpufleet resize``), and its spec only says what the next attempt gets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from gpufleet.cost.ledger import PREEMPTED_OUTCOMES, AttemptUsage, PhaseShares
from gpufleet.jobs.events import MAX_TS, EventKind
from gpufleet.jobs.rank_phases import STRAGGLER_WAIT, phase_table
from gpufleet.jobs.states import Outcome
from gpufleet.jobs.store import Attempt, Event, Job, Store, attempt_gpus, recorded_gpus
from gpufleet.jobs.store import gpu_count as _count


def _num(data: dict[str, Any], key: str, default: float = 0.0) -> float:
    """A finite number from an event's data, else ``default``: the runtime's event log is written by user code."""
    value = data.get(key)
    if type(value) is float:  # the usual case, first: a ledger reads some ten per attempt
        return value if value - value == 0.0 else default  # inf - inf and nan - nan are nan: not finite
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return default
    return number if math.isfinite(number) else default


def _seconds(data: dict[str, Any], key: str) -> float:
    """A duration from an event's data: finite, not negative, and at most ``MAX_TS`` (so sums stay finite)."""
    return min(max(0.0, _num(data, key)), MAX_TS)


def _step(data: dict[str, Any], key: str) -> int:
    """A step count from an event's data (0 when it has none that is a finite number)."""
    return int(_num(data, key))


def _price(data: dict[str, Any], key: str) -> float | None:
    """A price or an amount of money from an event's data: finite and not negative, else ``None``."""
    value = _num(data, key, -1.0)
    return value if value >= 0 else None


def attempt_placement(attempt: Attempt, events: Sequence[Event]) -> dict[str, Any]:
    """Where a fleet placed the attempt (its backend ``attempt_start``), and the checkpoint move before it.

    Empty without a fleet. A ``checkpoint_moved`` event belongs to the attempt that starts next:
    the move is made just before that attempt is launched, in the region it runs in.
    """
    starts = sorted(
        (e for e in events if e.kind == EventKind.ATTEMPT_START and e.source == "backend"), key=lambda e: e.ts
    )
    mine = next((e for e in starts if e.attempt == attempt.n), None)
    if mine is None or not isinstance(mine.data.get("offer"), str):
        return {}
    data = mine.data
    out: dict[str, Any] = {"offer": data["offer"]}
    for key in ("gpu_type", "provider"):
        if isinstance(data.get(key), str):
            out[key] = data[key]
    if isinstance(data.get("spot"), bool):
        out["spot"] = data["spot"]
    out["price_per_gpu_hour"] = _price(data, "price_per_gpu_hour")
    out["on_demand_per_gpu_hour"] = _price(data, "on_demand_per_gpu_hour")
    before = max((e.ts for e in starts if e.ts < mine.ts), default=-math.inf)
    moves = [e for e in events if e.kind == EventKind.CHECKPOINT_MOVED and before < e.ts <= mine.ts]
    out["egress_money"] = sum(_price(e.data, "egress_money") or 0.0 for e in moves)
    out["egress_bytes"] = sum(_count(e.data.get("bytes")) or 0 for e in moves)
    return out


def attempt_notice(n: int, events: Sequence[Event]) -> tuple[str | None, float | None]:
    """The provider and lead time of the first preemption notice attempt ``n`` had (``None, None``: none).

    The local backend records it (``notices.NoticeDrain``), the Slurm batch script writes it to the
    event log; either way it only annotates the note, so a lead time that is not a finite,
    non-negative number reads as unknown.
    """
    for e in events:
        if e.kind == EventKind.PREEMPTION_NOTICE and e.attempt == n:
            source = e.data.get("source")
            if not isinstance(source, str) or not source.isprintable() or not 0 < len(source) <= 32:
                source = "unknown"
            lead = _num(e.data, "lead_s", -1.0)
            return source, min(lead, MAX_TS) if lead >= 0 else None
    return None, None


def attempt_short_handed(mine: Sequence[Event]) -> tuple[int, int]:
    """Steps an attempt ran without every replica, and the samples their missing shares skipped.

    From its ``short_handed`` events (``distributed.recovery: continue``; each counts a run of such
    steps). Written by user processes: a count that is not a whole number of at least 0 reads as 0.
    """
    steps = skipped = 0
    for e in mine:
        if e.kind == EventKind.SHORT_HANDED:
            steps += _whole(e.data.get("steps"))
            skipped += _whole(e.data.get("samples_skipped"))
    return steps, skipped


def _whole(value: Any) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TS
    return int(value) if ok else 0


BUSY_PHASES = ("data_wait", "compute", "collective", "optimizer")
"""The phases whose sum over ranks divides the training time (``checkpoint`` has its own events)."""


def phase_shares(data: dict[str, Any], ranks: int | None = None) -> PhaseShares | None:
    """The ``phase_totals_s`` of a ``step`` or ``session_end`` event, summed over ranks; ``None`` if malformed.

    Written by user processes, read by :func:`gpufleet.jobs.rank_phases.phase_table`: every phase given
    must be a list of finite, non-negative numbers, all of one length (``ranks``, the attempt's world
    size, when known), and each phase used here must be given. Anything else is ignored, never an
    error: the ledger then counts the training time as ``compute``.
    """
    table = phase_table(data.get("phase_totals_s"), ranks)
    if table is None or any(phase not in table for phase in (*BUSY_PHASES, STRAGGLER_WAIT)):
        return None
    sums = {k: math.fsum(v) for k, v in table.items()}
    return PhaseShares(
        data_wait_s=sums["data_wait"],
        straggler_wait_s=sums[STRAGGLER_WAIT],
        busy_s=math.fsum(sums[k] for k in BUSY_PHASES),
    )


def _world_size(n: int, events: Sequence[Event]) -> int | None:
    """The world size the backend recorded in attempt ``n``'s ``attempt_start`` (``None``: not recorded)."""
    for e in events:
        if e.kind == EventKind.ATTEMPT_START and e.attempt == n and e.source == "backend":
            size = _count(e.data.get("world_size"))
            return size if size else None
    return None


def attempt_phases(n: int, mine: Sequence[Event], events: Sequence[Event]) -> PhaseShares | None:
    """The last well-formed phase totals of attempt ``n`` (its ``step`` and ``session_end`` events).

    The totals are cumulative since the attempt's first step, so the last one covers its training.
    """
    return first_phases(reversed(mine), _world_size(n, events))


def first_phases(newest_first: Iterable[Event], ranks: int | None) -> PhaseShares | None:
    """The first well-formed phase totals of ``step`` or ``session_end`` events given newest first."""
    for e in newest_first:
        if e.kind in (EventKind.STEP, EventKind.SESSION_END) and "phase_totals_s" in e.data:
            shares = phase_shares(e.data, ranks)
            if shares is not None:
                return shares
    return None


USAGE_KINDS = (
    EventKind.ATTEMPT_START,
    EventKind.CHECKPOINT_MOVED,
    EventKind.PREEMPTION_NOTICE,
    EventKind.SHORT_HANDED,
    EventKind.RESTORE,
    EventKind.TRAIN_START,
    EventKind.CHECKPOINT,
    EventKind.ROLLBACK,
    EventKind.DATA_STAGED,
    EventKind.DATA_STAGE_FAILED,
    EventKind.SESSION_END,
    EventKind.RUN_CHANGED,
    EventKind.RNG_RESEEDED,
    EventKind.RESIZED,
)
"""The event kinds an attempt's usage reads, ``step`` aside: a job's step events outnumber all the others
by hundreds to one, and the ledger needs only the newest of them (:class:`StepTail`)."""

PHASES_KEY = '"phase_totals_s"'
"""How the key of the phase totals reads in a stored event (what :meth:`Store.newest_attempt_events` looks for)."""


@dataclass(frozen=True, slots=True)
class StepTail:
    """What the ledger takes from an attempt's ``step`` events: the newest one, and the last phase totals.

    ``ts`` and ``step`` are the newest step event's (``None``: the attempt reported no step); the
    newest event, not the highest step: after a rollback the steps count again from the checkpoint,
    and the step reached is the last one reported.
    """

    ts: float | None = None
    step: int | None = None
    phases: PhaseShares | None = None


def step_tail(n: int, events: Sequence[Event]) -> StepTail:
    """Attempt ``n``'s :class:`StepTail` from a job's events in time order (its step events included)."""
    mine = [e for e in events if e.attempt == n and e.source == "runtime"]
    newest = next((e for e in reversed(mine) if e.kind == EventKind.STEP), None)
    return StepTail(
        ts=None if newest is None else newest.ts,
        step=None if newest is None else _step(newest.data, "step"),
        phases=first_phases(reversed(mine), _world_size(n, events)),
    )


def stored_step_tail(store: Store, job_id: int, n: int, events: Sequence[Event]) -> StepTail:
    """Attempt ``n``'s :class:`StepTail` read from the store: one step row, and only the rows that hold phase
    totals (``events``: the job's other events, for the attempt's world size)."""
    newest = next(store.newest_attempt_events(job_id, n, (EventKind.STEP,), source="runtime"), None)
    timed = store.newest_attempt_events(
        job_id, n, (EventKind.STEP, EventKind.SESSION_END), source="runtime", mentions=PHASES_KEY
    )
    return StepTail(
        ts=None if newest is None else newest.ts,
        step=None if newest is None else _step(newest.data, "step"),
        phases=first_phases(timed, _world_size(n, events)),
    )


def _last_step(tail: StepTail, mine: Sequence[Event], first_step: int | None) -> int | None:
    """The step the attempt reached: that of its newest ``step``, ``checkpoint`` or ``session_end`` event.

    At equal times a session's end comes after a checkpoint, which comes after a step (the order the
    runtime writes them); an attempt that reported none of them is at its first step.
    """
    order: dict[str, int] = {EventKind.CHECKPOINT: 1, EventKind.SESSION_END: 2}
    marks = [(e.ts, order[e.kind], _step(e.data, "step")) for e in mine if e.kind in order]
    if tail.ts is not None and tail.step is not None:
        marks.append((tail.ts, 0, tail.step))
    return max(marks)[2] if marks else first_step


def attempt_queued(attempt: Attempt, mine: Sequence[Event], end: float) -> float:
    """Seconds the attempt held its GPUs before its processes started.

    The local backend takes the GPUs as it starts the process and records that moment as the
    attempt's start: 0. A Slurm attempt starts at sacct's ``Start``, when the allocation was made;
    its batch script writes an ``attempt_start`` to the event log once it runs, so the gap between
    the two is the allocation held before any process of the job ran (a prolog, a slow node). An
    attempt without such an event (local, or a script that never ran) shows none.
    """
    first = min((e.ts for e in mine if e.kind == EventKind.ATTEMPT_START), default=None)
    return _queued(first, attempt.started_at, end)


def _queued(first_start: float | None, started_at: float, end: float) -> float:
    return 0.0 if first_start is None else max(0.0, min(first_start, end) - started_at)


def _size_changed(old: Any, new: Any) -> bool:
    before, after = _count(old), _count(new)
    return bool(before) and bool(after) and before != after


def resharded_restore(attempt: Attempt, mine: Sequence[Event], events: Sequence[Event], restore: Event) -> bool:
    """Whether the restore at start read a checkpoint written on another world size (after a resize).

    Any of: the ``restore`` event names both world sizes (or ``resharded: true``); a ``run_changed``
    of the attempt names two world sizes; the RNG was reseeded before training started (a checkpoint
    of another world size holds no RNG state for this rank); or the backend started this attempt on
    another world size than the attempt before it.
    """
    if restore.data.get("step") is None:
        return False
    d = restore.data
    if d.get("resharded") is True or _size_changed(
        d.get("old_world_size", d.get("saved_world_size")), d.get("world_size")
    ):
        return True
    for e in mine:
        if e.kind == EventKind.RUN_CHANGED and _size_changed(e.data.get("old_world_size"), e.data.get("world_size")):
            return True
        if e.kind == EventKind.RNG_RESEEDED and e.ts <= restore.ts:
            return True
    before = _world_size(attempt.n - 1, events) if attempt.n > 1 else None
    return _size_changed(before, _world_size(attempt.n, events))


def killed_attempt(attempt: Attempt, mine: Sequence[Event]) -> bool:
    """Whether the attempt ended because a process of it was killed or vanished, not by a preemption.

    ``mine``: the attempt's runtime events. ``lost``: nobody saw it end (a lost node, a scheduler
    that died). ``requeued`` (exit 75 without a preemption by the backend): killed when a rank
    found its group broken (``session_end`` with ``reason: rank_lost``), or when the session never
    ended on its own (no ``session_end`` with ``status: requeue``: a rank killed by a signal);
    a session that saved and asked to be requeued heard a preemption signal. ``failed`` by a
    signal (``exit_code`` below 0: the OOM killer's SIGKILL) was killed too.
    """
    if attempt.outcome == Outcome.LOST:
        return True
    if attempt.outcome == Outcome.FAILED:
        return attempt.exit_code is not None and attempt.exit_code < 0
    if attempt.outcome != Outcome.REQUEUED:
        return False
    ends = [e for e in mine if e.kind == EventKind.SESSION_END]
    if any(e.data.get("reason") == "rank_lost" for e in ends):
        return True
    return not any(e.data.get("status") == "requeue" for e in ends)


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the ledger reads of a job: who it is, and what its spec asks for where the events do not say.

    The cost cache keeps these for a running job (:mod:`gpufleet.cost.live`), so that pricing it again
    does not validate its whole spec again.
    """

    id: int
    name: str
    team: str
    gpu_type: str
    provider: str
    spot: bool
    total_gpus: int

    @classmethod
    def of(cls, job: Job) -> JobFacts:
        spec = job.spec
        return cls(job.id, job.name, job.team, spec.resources.gpu_type, spec.provider, spec.spot, spec.total_gpus)


def attempt_usage(
    job: Job | JobFacts,
    attempt: Attempt,
    events: Sequence[Event],
    now: float,
    *,
    after_preemption: bool = False,
    tail: StepTail | None = None,
) -> AttemptUsage:
    """Split one attempt's wall time into the ledger's buckets, from its runtime events.

    ``after_preemption`` says the attempt before this one was preempted (``job_usages`` knows the
    attempts; this function sees one): its start-up and restore then count as preemption overhead.
    The wall is the attempt's ``started_at``..``ended_at`` as its backend recorded it (for Slurm,
    sacct's Start and End); events outside it are clamped in, so no bucket outgrows the wall; an
    attempt still open ends at ``now``. ``tail``: what its step events hold, when ``events`` leaves
    them out (``job_usages`` reads only ``USAGE_KINDS``); without it, taken from ``events``.
    """
    reading = attempt_reading(job, attempt, events, after_preemption=after_preemption, tail=tail)
    return reading.at(attempt.ended_at if attempt.ended_at is not None else now)


@dataclass(frozen=True, slots=True)
class AttemptReading:
    """What an attempt's events say, read once: :meth:`at` gives its :class:`AttemptUsage` ending at a time.

    Only a few figures depend on when the attempt ends (its wall, the start-up of an attempt that never
    reached a step, the work lost and the shut-down after the last checkpoint, the idle tail, the GPUs held
    before the processes ran); the rest is in :attr:`usage`, read from the events. An attempt still open
    is priced at the current time at every read of ``gpufleet cost``: the cost cache keeps its reading
    (:mod:`gpufleet.cost.live`), so a read where nothing was written about the job does not read its
    events again.
    """

    usage: AttemptUsage
    """Every figure but those :meth:`at` sets (``end``, ``startup_s``, ``lost_s``, ``shutdown_s``, ``idle_s``,
    ``queued_s``)."""
    train_start: float | None
    """When its first step began (``train_start``), ``None`` if it never did."""
    restore_s: float
    """Its restore at start, out of the start-up (rollbacks' restores apart)."""
    session_ends: tuple[float, ...]
    """When its sessions ended (``session_end``), in the events' order."""
    last_step_at: float | None
    """When its newest step was logged."""
    first_start: float | None
    """Its earliest ``attempt_start`` (the processes running), ``None`` if none."""
    loses_work: bool
    """It ended neither completed nor running after it trained: work after its last checkpoint is lost."""

    def at(self, end: float) -> AttemptUsage:
        """Its usage if it ended at ``end``: the figures :func:`attempt_usage` gives."""
        u, start = self.usage, self.usage.start
        if self.train_start is None:
            startup_s = max(0.0, end - start - u.staging_s)  # never reached the first step: all of it was start-up
        else:
            first = min(max(self.train_start, start), end)
            startup_s = max(0.0, first - start - self.restore_s - u.staging_s)
        lost_s, shutdown_s = u.lost_s, 0.0
        if self.loses_work:
            assert self.train_start is not None
            durable = min(max(u.checkpoints, default=self.train_start), end)
            # A session that ended on purpose after its last checkpoint trained nothing after it:
            # from there to the process exit is shut-down, not lost work.
            ended = [t for t in self.session_ends if t >= durable]
            stop = min(ended[0], end) if ended else end
            lost_s += max(0.0, stop - durable)
            shutdown_s = max(0.0, end - stop)
            startup_s += shutdown_s
            idle_s = shutdown_s
        else:
            since = min(max(self.train_start if self.train_start is not None else start, start), end)
            idle_s = _idle_tail(self.session_ends, self.last_step_at, since, end, finished=u.outcome == "completed")
        return replace(
            u,
            end=end,
            startup_s=startup_s,
            lost_s=lost_s,
            shutdown_s=shutdown_s,
            idle_s=idle_s,
            queued_s=_queued(self.first_start, start, end),
        )

    def to_list(self) -> list[Any]:
        """As JSON values (what :meth:`from_list` reads back: the same floats, ints and strings)."""
        usage = [_plain(getattr(self.usage, name)) for name in _USAGE_FIELDS]
        return [
            self.train_start,
            self.restore_s,
            list(self.session_ends),
            self.last_step_at,
            self.first_start,
            self.loses_work,
            usage,
        ]

    @classmethod
    def from_list(cls, values: Any) -> AttemptReading:
        """What :meth:`to_list` wrote; ``ValueError`` on anything else (values of other types included)."""
        if not isinstance(values, list) or len(values) != 7:
            raise ValueError("not an attempt's reading")
        train_start, restore, ends, last_step_at, first_start, loses, usage = values
        if not isinstance(usage, list) or len(usage) != len(_USAGE_FIELDS):
            raise ValueError("not an attempt's usage")
        typed = {name: read(value) for (name, read), value in zip(_USAGE_FIELDS.items(), usage, strict=True)}
        if typed["outcome"] in _OUTCOMES:  # an attempt's outcome as the store reads it (``running`` is none)
            typed["outcome"] = Outcome(typed["outcome"])
        return cls(
            usage=AttemptUsage(**typed),
            train_start=_optional(_number)(train_start),
            restore_s=_number(restore),
            session_ends=tuple(_number(t) for t in _list(ends)),
            last_step_at=_optional(_number)(last_step_at),
            first_start=_optional(_number)(first_start),
            loses_work=_exactly(bool)(loses),
        )


_OUTCOMES = frozenset(o.value for o in Outcome)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, PhaseShares):
        return [value.data_wait_s, value.straggler_wait_s, value.busy_s]
    return value


def _exactly(*types: type) -> Callable[[Any], Any]:
    """A reader of a JSON value that must be of one of ``types`` (``bool`` is not an ``int`` here)."""

    def read(value: Any) -> Any:
        if type(value) not in types:
            raise ValueError(f"{value!r} is not a {' or '.join(t.__name__ for t in types)}")
        return value

    return read


def _optional(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else inner(value)


def _list(value: Any, length: int | None = None) -> list[Any]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise ValueError(f"{value!r} is not a list of {length or 'any'} values")
    return value


_number = _exactly(int, float)  # ints stay ints: the sums they enter are the same


def _reader(kind: str) -> Callable[[Any], Any]:
    """What reads back a JSON value of a field of type ``kind`` (as written), or raises ``ValueError``."""
    if kind.endswith(" | None"):
        return _optional(_reader(kind.removesuffix(" | None")))
    simple = {"bool": _exactly(bool), "str": _exactly(str), "int": _exactly(int), "float": _number}
    if kind in simple:
        return simple[kind]
    if kind == "tuple[float, ...]":
        return lambda value: tuple(_number(v) for v in _list(value))
    if kind == "PhaseShares":
        return lambda value: PhaseShares(*(float(_number(v)) for v in _list(value, 3)))
    raise ValueError(f"no reading of a {kind}")


_USAGE_FIELDS = {f.name: _reader(str(f.type)) for f in fields(AttemptUsage)}
"""Each field of :class:`AttemptUsage` and what reads it back from JSON (types as written: ``from __future__``)."""


def attempt_reading(
    job: Job | JobFacts,
    attempt: Attempt,
    events: Sequence[Event],
    *,
    after_preemption: bool = False,
    tail: StepTail | None = None,
) -> AttemptReading:
    """What ``attempt``'s events say (see :func:`attempt_usage`, which ends it at its end or the current time)."""
    tail = step_tail(attempt.n, events) if tail is None else tail
    start = attempt.started_at
    outcome = attempt.outcome or "running"
    mine = [e for e in events if e.attempt == attempt.n and e.source == "runtime"]
    restore = next((e for e in mine if e.kind == EventKind.RESTORE and e.data.get("cause") != "rollback"), None)
    train_start = next((e for e in mine if e.kind == EventKind.TRAIN_START), None)
    checkpoints = [e for e in mine if e.kind == EventKind.CHECKPOINT]
    rollbacks = [e for e in mine if e.kind == EventKind.ROLLBACK]
    rollback_restore_s = sum(_seconds(e.data, "restore_seconds") for e in rollbacks)
    restore_s = (_seconds(restore.data, "seconds") if restore else 0.0) + rollback_restore_s
    # Ranks on several nodes stage at the same time: the attempt waited for the slowest.
    staged = [e for e in mine if e.kind in (EventKind.DATA_STAGED, EventKind.DATA_STAGE_FAILED)]
    staging_s = max((_seconds(e.data, "seconds") for e in staged), default=0.0)
    first_step = None if train_start is None else _step(train_start.data, "step")
    checkpoint_s = sum(_seconds(e.data, "seconds") for e in checkpoints)
    preempt_save_s = sum(_seconds(e.data, "seconds") for e in checkpoints if e.data.get("reason") == "preempt")
    rollback_lost_s = sum(_seconds(e.data, "redone_seconds") for e in rollbacks)
    last_step = _last_step(tail, mine, first_step)
    steps_done, steps_redone, segment_start = 0, 0, first_step or 0
    for e in rollbacks:
        from_step, to_step = _step(e.data, "from_step"), _step(e.data, "to_step")
        steps_done += from_step - segment_start
        steps_redone += from_step - to_step
        segment_start = to_step
    if last_step is not None:
        steps_done += max(0, last_step - segment_start)
    loses_work = outcome not in ("completed", "running") and train_start is not None
    if loses_work:
        durable_step = _step(checkpoints[-1].data, "step") if checkpoints else segment_start
        steps_redone += max(0, (last_step or 0) - durable_step)
    resized = restore is not None and resharded_restore(attempt, mine, events, restore)
    facts = job if isinstance(job, JobFacts) else JobFacts.of(job)
    placed = attempt_placement(attempt, events)
    notice_source, notice_lead_s = attempt_notice(attempt.n, events)
    short_handed_steps, samples_skipped = attempt_short_handed(mine)
    usage = AttemptUsage(
        job_id=facts.id,
        job_name=facts.name,
        team=facts.team,
        attempt=attempt.n,
        gpu_type=placed.get("gpu_type") or facts.gpu_type,
        provider=placed.get("provider") or facts.provider,
        spot=placed["spot"] if isinstance(placed.get("spot"), bool) else facts.spot,
        offer=placed.get("offer"),
        price_per_gpu_hour=placed.get("price_per_gpu_hour"),
        on_demand_per_gpu_hour=placed.get("on_demand_per_gpu_hour"),
        egress_bytes=placed.get("egress_bytes", 0),
        egress_money=placed.get("egress_money", 0.0),
        gpus=facts.total_gpus if (recorded := recorded_gpus(attempt, events)) is None else recorded,
        start=start,
        end=start,
        outcome=outcome,
        killed=killed_attempt(attempt, mine),
        restore_s=restore_s,
        staging_s=staging_s,
        checkpoint_s=checkpoint_s,
        lost_s=rollback_lost_s,
        steps_done=steps_done,
        steps_redone=steps_redone,
        first_step=first_step,
        last_step=last_step,
        checkpoints=tuple(e.ts for e in checkpoints),
        rollbacks=tuple(e.ts for e in rollbacks),
        after_preemption=after_preemption,
        preempt_save_s=preempt_save_s,
        rollback_lost_s=rollback_lost_s,
        rollback_restore_s=rollback_restore_s,
        notice_source=notice_source,
        notice_lead_s=notice_lead_s,
        short_handed_steps=short_handed_steps,
        samples_skipped=samples_skipped,
        resize_restore_s=_seconds(restore.data, "seconds") if restore is not None and resized else 0.0,
        phases=tail.phases,
    )
    return AttemptReading(
        usage=usage,
        train_start=None if train_start is None else train_start.ts,
        restore_s=_seconds(restore.data, "seconds") if restore else 0.0,
        session_ends=tuple(e.ts for e in mine if e.kind == EventKind.SESSION_END),
        last_step_at=tail.ts,
        first_start=min((e.ts for e in mine if e.kind == EventKind.ATTEMPT_START), default=None),
        loses_work=loses_work,
    )


def _idle_tail(
    session_ends: Sequence[float], last_step_at: float | None, since: float, end: float, *, finished: bool
) -> float:
    """Seconds held after the session ended (or, for a finished attempt without one, after its last step).

    ``since`` is where training began (the attempt's start if it never did), already within the wall:
    the processes' exit, the GPUs held but no longer used.
    """
    ends = [t for t in session_ends if t >= since]
    stop = ends[0] if ends else None
    if stop is None and finished and last_step_at is not None and last_step_at >= since:
        stop = last_step_at
    return 0.0 if stop is None else max(0.0, end - min(stop, end))


def attempt_usages(
    job: Job | JobFacts,
    attempts: Sequence[Attempt],
    events: Sequence[Event],
    now: float,
    tails: Mapping[int, StepTail] | None = None,
) -> list[AttemptUsage]:
    """Every attempt of one job, each told whether the attempt before it was preempted.

    ``tails``: each attempt's :class:`StepTail`, when ``events`` leaves the step events out.
    """
    return [
        reading.at(attempt.ended_at if attempt.ended_at is not None else now)
        for attempt, reading in attempt_readings(job, attempts, events, tails)
    ]


def attempt_readings(
    job: Job | JobFacts,
    attempts: Sequence[Attempt],
    events: Sequence[Event],
    tails: Mapping[int, StepTail] | None = None,
) -> list[tuple[Attempt, AttemptReading]]:
    """:func:`attempt_usages`' attempts with their readings, not yet ended at a time."""
    ordered = sorted(attempts, key=lambda a: a.n)
    job = job if isinstance(job, JobFacts) else JobFacts.of(job)  # read once, not per attempt
    out: list[tuple[Attempt, AttemptReading]] = []
    for i, attempt in enumerate(ordered):
        after = i > 0 and (ordered[i - 1].outcome or "") in PREEMPTED_OUTCOMES
        tail = None if tails is None else tails.get(attempt.n, StepTail())
        out.append((attempt, attempt_reading(job, attempt, events, after_preemption=after, tail=tail)))
    return out


def job_usages(
    store: Store, job: Job, now: float | None = None, *, attempts: Sequence[Attempt] | None = None
) -> list[AttemptUsage]:
    """Every attempt of ``job`` as the ledger counts it, read without its step events (``USAGE_KINDS``).

    A job's cost reads a few dozen rows whatever the number of steps it reported: the step events
    are walked newest first for the one or two the ledger needs (:func:`stored_step_tail`).
    ``attempts``: the job's attempts, when the caller has read them already.
    """
    now = time.time() if now is None else now
    attempts = store.attempts(job.id) if attempts is None else attempts
    if not attempts:
        return []
    events = store.events(job.id, kinds=USAGE_KINDS)
    tails = {a.n: stored_step_tail(store, job.id, a.n, events) for a in attempts}
    return attempt_usages(job, attempts, events, now, tails)


def store_usages(store: Store, team: str | None = None, job_ids: Sequence[int] | None = None) -> list[AttemptUsage]:
    now = time.time()
    wanted = None if job_ids is None else set(job_ids)
    out: list[AttemptUsage] = []
    for job in store.jobs(team=team):
        if wanted is None or job.id in wanted:
            out.extend(job_usages(store, job, now))
    return out


__all__ = [
    "PHASES_KEY",
    "USAGE_KINDS",
    "AttemptReading",
    "JobFacts",
    "StepTail",
    "attempt_gpus",
    "attempt_notice",
    "attempt_phases",
    "attempt_queued",
    "attempt_reading",
    "attempt_readings",
    "attempt_short_handed",
    "attempt_usage",
    "attempt_usages",
    "job_usages",
    "killed_attempt",
    "phase_shares",
    "resharded_restore",
    "step_tail",
    "store_usages",
    "stored_step_tail",
]
