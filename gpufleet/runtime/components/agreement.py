"""The rank agreement: the ranks of a group judge the same numbers, so they act on the same step.

Each rank sees its own loss, its own signals and its own clock. If each acted on what it saw, one
rank would roll back while another saved, and the next collective would hang. Every
``agree_every`` steps (and at every step a checkpoint or an injected fault is due) the ranks sum
one vector: the loss of every micro-batch, the tokens, whether any rank was asked to stop, whether
a time-based checkpoint is due on any rank, and each rank's timings: its step and wait times and
its seconds in each phase of the steps (``components.phases``), which rank 0 reports and the
straggler detector reads. Every rank then judges the mean losses; a NaN on one rank makes the mean
NaN on all.

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
from gpufleet.runtime.group import Group, dist_timeout
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
        or a SIGTERM on one rank is acted on up to this many steps minus one later; one agreement a step
        costs a few % of a step (the ranks wait for the slowest), every 4 steps under 2 %
        (``bench/dist_step_overhead.py``)."""
        self.pending: list[PendingStep] = []
        """The steps reported since the last agreement, judged at the next one."""
        self._clock = clock
        self._agreed_at = clock()
        self._last_wait = 0.0
        self._watch: RankWatch | None = None
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
        """Collective: one all-reduce for ``pending`` (this rank's view: ``preempt``, ``seconds_due``).

        Each rank must report as many micro-batch losses as the others. Each rank fills its own slot
        of the timings, so the sum holds every rank's; ``phases`` (this rank's phase seconds since the
        last agreement) must have the same length on every rank, or be empty on all.
        """
        losses = [v for step in pending for v in step.values]
        flags = [*(float(step.tokens) for step in pending), float(preempt), float(seconds_due)]
        n, k, world, rank = len(losses), len(pending), self.group.world_size, self.group.rank
        width = len(phases)
        timing = [0.0] * ((2 + width) * world)
        timing[rank], timing[world + rank] = (now - self._agreed_at) / k, self._last_wait
        timing[2 * world + rank * width : 2 * world + (rank + 1) * width] = phases
        entered = self._clock()
        summed = self.group.agree([*losses, *flags, *timing])
        self._agreed_at = self._clock()
        self._last_wait = self._agreed_at - entered
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
        if self._watch is not None:
            self._watch.close()


__all__ = ["AgreedStep", "Agreement", "PendingStep", "RankAgreement", "step_ends"]
