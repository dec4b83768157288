"""The rank agreement: the ranks of a group judge the same numbers, so they act on the same step.

Each rank sees its own loss, its own signals and its own clock. If each acted on what it saw, one
rank would roll back while another saved, and the next collective would hang. Every
``agree_every`` steps (and at every step a checkpoint or an injected fault is due) the ranks sum
one vector: the loss of every micro-batch, the tokens, whether any rank was asked to stop, whether
a time-based checkpoint is due on any rank, and each rank's timings: its step and wait times and
its seconds in each phase of the steps (``components.phases``), which rank 0 reports and the
straggler detector reads. Every rank then judges the mean losses; a NaN on one rank makes the mean
NaN on all.

An agreement that decides nothing is sent (:meth:`RankAgreement.send`) and read at the next step
boundary (:meth:`RankAgreement.receive`), so its round trip and the wait for the slowest rank overlap
the next step's compute. Its steps are then judged a step late, while the state in memory is already
a step further: a rollback throws that step away too, and a stop or a time-based save it asks for is
taken at the next step, which the ranks agree on and wait for before acting. Steps where a checkpoint,
the last step or an injected fault is due are agreed on and waited for at once.

The agreement also keeps the rank watch (``runtime.watchdog``), which names a rank that stops
stepping, and the two small collectives a session needs to decide together (a metric's mean, the
first non-finite tensor of any rank's shard).

Imports: ``runtime.group``, ``runtime.watchdog`` and the event log; nothing of the session.

Seam for in-place recovery: a rank lost between two agreements surfaces today as ``PeerLost`` and
the attempt is requeued. Recovering in place would add a field to :class:`Agreement` (the ranks
that answered) for the guard to turn into its verdict, the vector staying one all-reduce.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.jobs.events import EventKind, EventLog, append_event
from gpufleet.runtime.group import Group, Reduction, dist_timeout
from gpufleet.runtime.watchdog import RankInfo, RankWatch, stall_seconds


@dataclass(frozen=True, slots=True)
class PendingStep:
    """A step reported by a rank of a group and not yet agreed on."""

    values: list[float]
    tokens: int
    batches: int
    metrics: dict[str, float]
    seconds: float


@dataclass(frozen=True, slots=True)
class AgreedStep:
    """One step as every rank judges it."""

    losses: list[float]
    """The mean over the ranks of each micro-batch's loss."""
    tokens: int
    """The tokens of all ranks."""
    ended: float
    """When the step ended on this rank's clock (the last one: at the agreement)."""


@dataclass(frozen=True, slots=True)
class Agreement:
    """What the ranks agreed on at one step agreement."""

    steps: tuple[AgreedStep, ...]
    preempt: bool
    """Some rank was asked to stop."""
    seconds_due: bool
    """A time-based checkpoint was due on some rank's clock."""
    rank_step_s: tuple[float, ...]
    """Per rank: its mean seconds a step, outside the agreements."""
    rank_wait_s: tuple[float, ...]
    """Per rank: its wait in the previous agreement for the others (the slowest rank never waits)."""
    rank_phases: tuple[tuple[float, ...], ...] = ()
    """Per rank: its seconds in each phase (``phases.PHASES``) since the previous agreement; empty when the
    ranks do not time their phases."""


@dataclass(frozen=True, slots=True)
class _InFlight:
    """An agreement sent and not yet received: the steps it judges, and what reading it needs."""

    pending: list[PendingStep]
    now: float
    width: int
    reduction: Reduction


def _judged(summed: Sequence[float], pending: Sequence[PendingStep], now: float, world: int, width: int) -> Agreement:
    """The :class:`Agreement` in the sum of every rank's vector (the layout :meth:`RankAgreement.send` writes)."""
    n, k = sum(len(step.values) for step in pending), len(pending)
    steps, at = [], 0
    for i, (step, ended) in enumerate(zip(pending, step_ends(pending, now), strict=True)):
        mean = [v / world for v in summed[at : at + len(step.values)]]
        steps.append(AgreedStep(mean, int(summed[n + i]), ended))
        at += len(step.values)
    base = n + k + 2
    at_phases = base + 2 * world
    rank_phases = tuple(
        tuple(summed[at_phases + r * width : at_phases + (r + 1) * width]) for r in range(world) if width
    )
    return Agreement(
        steps=tuple(steps),
        preempt=summed[n + k] > 0,
        seconds_due=summed[n + k + 1] > 0,
        rank_step_s=tuple(summed[base : base + world]),
        rank_wait_s=tuple(summed[base + world : base + 2 * world]),
        rank_phases=rank_phases,
    )


def step_ends(pending: Sequence[PendingStep], now: float) -> list[float]:
    """When each pending step ended, the last one ``now``: each step's throughput is its own."""
    ends, at = [], now
    for step in reversed(pending):
        ends.append(at)
        at -= step.seconds
    ends.reverse()
    return ends


class RankAgreement:
    """The steps a rank holds until the next agreement, and the agreement itself."""

    def __init__(self, group: Group, every: int = 4, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.group = group
        self.every = every
        """Steps per agreement (``distributed.agree_every``); also at every step a checkpoint is due. A NaN
        or a SIGTERM on one rank is acted on up to this many steps later (the agreement is read at the
        next step boundary); read there, even one agreement a step costs under 2 % of a step
        (``bench/dist_step_overhead.py``; waited for at once, the ranks wait for the slowest: several %)."""
        self.pending: list[PendingStep] = []
        """The steps reported since the last agreement, judged at the next one."""
        self._clock = clock
        self._agreed_at = clock()
        self._last_wait = 0.0
        self._watch: RankWatch | None = None
        self._in_flight: _InFlight | None = None
        self.hosts: list[str] = []
        """Each rank's host, once the watch started."""

    def hold(self, step: PendingStep, *, due: bool) -> bool:
        """Keep ``step`` for the next agreement; True when the ranks should meet now."""
        self.pending.append(step)
        return len(self.pending) >= self.every or due

    def take(self) -> list[PendingStep]:
        pending, self.pending = self.pending, []
        return pending

    def restart(self) -> None:
        """Training starts: timings count from here."""
        self._agreed_at = self._clock()

    def agree(
        self,
        pending: Sequence[PendingStep],
        now: float,
        *,
        preempt: bool,
        seconds_due: bool,
        phases: Sequence[float] = (),
    ) -> Agreement:
        """Collective: one all-reduce for ``pending`` (this rank's view: ``preempt``, ``seconds_due``), waited on.

        Each rank must report as many micro-batch losses as the others. Each rank fills its own slot
        of the timings, so the sum holds every rank's; ``phases`` (this rank's phase seconds since the
        last agreement) must have the same length on every rank, or be empty on all.
        """
        self.send(pending, now, preempt=preempt, seconds_due=seconds_due, phases=phases)
        received = self.receive()
        assert received is not None  # sent just now
        self._agreed_at = self._clock()  # the next step's time starts after the wait
        return received[1]

    def send(
        self,
        pending: Sequence[PendingStep],
        now: float,
        *,
        preempt: bool,
        seconds_due: bool,
        phases: Sequence[float] = (),
    ) -> None:
        """Collective: start the all-reduce of :meth:`agree` and return; :meth:`receive` reads it.

        Why: waiting at the step boundary makes every rank wait for the slowest one there, and for the
        collective's own round trip. Read at the next step boundary instead, the sum travels while the
        ranks compute the next step, and a rank's lateness is absorbed by the next step's own
        synchronisation (DDP's gradient all-reduce). Its verdicts then come a step late: a decision
        that acts on the state in memory (save, stop) must wait for an agreement on that state.
        """
        if self._in_flight is not None:
            raise RuntimeError("an agreement is in flight: receive() it before sending the next")
        losses = [v for step in pending for v in step.values]
        flags = [*(float(step.tokens) for step in pending), float(preempt), float(seconds_due)]
        k, world, rank, width = len(pending), self.group.world_size, self.group.rank, len(phases)
        timing = [0.0] * ((2 + width) * world)
        timing[rank], timing[world + rank] = (now - self._agreed_at) / k, self._last_wait
        timing[2 * world + rank * width : 2 * world + (rank + 1) * width] = phases
        reduction = self.group.agree_later([*losses, *flags, *timing])
        self._in_flight = _InFlight(list(pending), now, width, reduction)
        self._agreed_at = self._clock()

    @property
    def in_flight(self) -> bool:
        """An agreement was sent and not yet received."""
        return self._in_flight is not None

    def receive(self) -> tuple[list[PendingStep], Agreement] | None:
        """Collective: wait for the agreement in flight; its steps and what the ranks agreed on (``None``: none)."""
        sent, self._in_flight = self._in_flight, None
        if sent is None:
            return None
        entered = self._clock()
        summed = sent.reduction.wait()
        self._last_wait = self._clock() - entered
        return sent.pending, _judged(summed, sent.pending, sent.now, self.group.world_size, sent.width)

    @property
    def last_wait(self) -> float:
        """This rank's wait for the others in the last agreement."""
        return self._last_wait

    def mean(self, value: float) -> float:
        """Collective: the mean of ``value`` over the ranks (a metric that decides for all of them)."""
        return self.group.agree([float(value)])[0] / self.group.world_size

    def first(self, name: str | None) -> str | None:
        """Collective: the first rank's ``name`` that is not ``None`` (a finding in one rank's shard)."""
        if not self.group.distributed:
            return name
        found = [each for each in self.group.gather(name) if each is not None]
        return found[0] if found else None

    # ---- the rank watch --------------------------------------------------------------------
    def watch(
        self,
        events: EventLog,
        step: int,
        fallback: Path,
        env: Mapping[str, str] = os.environ,
        *,
        hang: tuple[float, float] = (10.0, 30.0),
    ) -> Path:
        """Collective: every rank says where it runs (rank 0 records it), then watches for a rank that stops.

        The watch's files go to the job's folder (``GPUFLEET_JOB_DIR``), else beside the checkpoints
        (``fallback``); a rank other than 0 reports a stall straight into the job's event log. ``hang``:
        the spec's ``(hang_factor, hang_floor_seconds)``. Returns the rank folder (the phase boards').
        """
        here = RankInfo.here(self.group.rank)
        ranks = [RankInfo(*info) for info in self.group.gather((here.rank, here.host, here.pid))]
        self.hosts = [r.host for r in ranks]
        events.emit(
            EventKind.GROUP,
            world_size=self.group.world_size,
            backend=self.group.backend,
            ranks=[{"rank": r.rank, "host": r.host, "pid": r.pid} for r in ranks],
        )
        base = env.get("GPUFLEET_JOB_DIR")
        folder = (Path(base) if base else fallback) / "ranks" / f"attempt-{events.attempt}"
        timeout = dist_timeout()
        emit: Callable[..., Any] = (
            events.emit
            if self.group.is_main
            else functools.partial(append_event, env.get("GPUFLEET_EVENTS"), events.attempt)
        )
        self._watch = RankWatch(
            rank=self.group.rank,
            ranks=ranks,
            folder=folder,
            stall_s=stall_seconds(timeout),
            timeout_s=timeout,
            emit=emit,
            hang_factor=hang[0],
            hang_floor_s=hang[1],
        )
        self._watch.progress(step)
        self._watch.start()
        return folder

    def progress(self, step: int) -> None:
        if self._watch is not None:
            self._watch.progress(step)

    def close(self) -> None:
        """The session ends: stop the watch, and drop an agreement still in flight unread.

        Never waited for here: the session ends on an error then (a normal end receives it first), and a
        rank gone meanwhile would hold this one for the whole collective timeout.
        """
        self._in_flight = None
        if self._watch is not None:
            self._watch.close()


__all__ = ["AgreedStep", "Agreement", "PendingStep", "RankAgreement", "step_ends"]
