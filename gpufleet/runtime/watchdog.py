"""Who holds the group up: a rank that stops stepping is named, by rank and host, before the timeout.

A stuck rank (a wedged data loader, a dead link, a process frozen by the OS) does not fail: the
other ranks wait for it inside a collective until the process-group timeout
(``distributed.timeout_seconds``) breaks the group, and all they can say then is "timed out". So
every rank of a distributed session runs a :class:`RankWatch` thread that notices when its own
step has not advanced for the **hang threshold**: ``hang_factor`` (10) times the job's rolling
median step time, at least ``hang_floor_s`` (30 s) and at most three quarters of the timeout, so a
hang is named before the timeout (before a few steps are timed: ``stall_s``, a quarter of the
timeout between 2 and 60 s). Then:

1. writes ``rank-<r>.json`` in the attempt's rank folder: its step, its host and pid, and whether
   its main thread is **waiting on the others** (its innermost Python frame is in
   ``torch.distributed`` or ``torch.autograd``, where DDP reduces gradients and FSDP gathers
   parameters, or in the runtime's own collectives) or **somewhere else** (its own code: a sleep,
   a data loader, a computation);
2. reads every rank's file. A rank that is not waiting, or that wrote nothing (dead, frozen, or
   holding the interpreter), is the one the others wait for. The lowest-numbered waiting rank
   reports it, once per stall: a ``rank_stalled`` event (ranks, hosts, step, seconds, where) and
   a line on its stderr, which is the attempt's log (``gpufleet logs``), saying what follows the
   timeout: a requeue, or under ``distributed.recovery: wait`` a group re-formed with the stuck rank
   replaced. When the steps move again the same rank reports ``rank_stall_cleared``;
3. names the phase each stuck rank was last in (from its phase board,
   :class:`gpufleet.runtime.components.phases.PhaseBoard`, which a frozen process cannot take back)
   and, for a stuck rank on this host that is **frozen** (its heartbeat and its CPU time have not
   moved for two polls: stopped, deadlocked, blocked in I/O), kills it: the others then see a lost
   rank at once and the job's recovery policy applies (a requeue, or the rank replaced in place),
   instead of waiting out the collective timeout. A rank that still computes (a long evaluation on
   one rank, a compilation) is only reported: the timeout stays the backstop.

Nothing of this runs on the step path: the loop only stores its step and the time (two
assignments in :meth:`RankWatch.progress`); the thread wakes every ``poll_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from gpufleet.jobs.events import EventKind
from gpufleet.runtime.board import PhaseBoard, board_path
from gpufleet.runtime.group import after_peer_loss

WAITING_MARKS = ("/torch/distributed/", "/torch/autograd/", "/gpufleet/runtime/group.py")
"""Where a rank's main thread waits on the other ranks (collectives, DDP's backward, FSDP's gathers)."""


def stall_seconds(timeout_s: float) -> float:
    """After how long without a step a rank is reported before the step time is known: a quarter of the
    group timeout, 2-60 s."""
    return max(2.0, min(60.0, timeout_s / 4))


def hang_seconds(
    median_step_s: float | None, *, factor: float, floor_s: float, timeout_s: float, stall_s: float
) -> float:
    """The hang threshold: max(factor x median step, floor), below the timeout; ``stall_s`` while no median."""
    if median_step_s is None:
        return stall_s
    return min(max(factor * median_step_s, floor_s), 0.75 * timeout_s)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads), or ``None`` (gone, not Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class RankInfo:
    """Where a rank runs, gathered once when the session opens (a frozen rank cannot say it later)."""

    rank: int
    host: str
    pid: int

    @classmethod
    def here(cls, rank: int) -> RankInfo:
        return cls(rank=rank, host=socket.gethostname(), pid=os.getpid())


def where(frame: FrameType | None) -> tuple[bool, str]:
    """Whether a thread stopped at ``frame`` waits on other ranks, and ``file:line in function``."""
    if frame is None:
        return False, "?"
    path = frame.f_code.co_filename.replace(os.sep, "/")
    waiting = any(mark in path for mark in WAITING_MARKS)
    return waiting, f"{Path(path).name}:{frame.f_lineno} in {frame.f_code.co_name}"


@dataclass(frozen=True, slots=True)
class Stall:
    """One rank's view of a stall, as written to its ``rank-<r>.json``."""

    rank: int
    step: int
    since: float
    """Wall time (Unix) of the last step this rank completed."""
    waiting: bool
    where: str

    def to_json(self) -> str:
        fields = {"rank": self.rank, "step": self.step, "since": self.since, "waiting": self.waiting}
        return json.dumps({**fields, "where": self.where})

    @classmethod
    def read(cls, path: Path) -> Stall | None:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                rank=int(raw["rank"]),
                step=int(raw["step"]),
                since=float(raw["since"]),
                waiting=bool(raw["waiting"]),
                where=str(raw["where"])[:200],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def suspects(world_size: int, stalls: dict[int, Stall], step: int) -> list[int]:
    """The ranks the others wait for at ``step``: not waiting themselves, or silent (no file)."""
    out = []
    for rank in range(world_size):
        stall = stalls.get(rank)
        if stall is None or stall.step < step or not stall.waiting:
            out.append(rank)
    return out


class RankWatch:
    """The watchdog thread of one rank (see the module docstring)."""

    def __init__(
        self,
        *,
        rank: int,
        ranks: Sequence[RankInfo],
        folder: Path,
        stall_s: float,
        timeout_s: float,
        emit: Callable[..., Any],
        poll_s: float | None = None,
        hang_factor: float = 10.0,
        hang_floor_s: float = 30.0,
    ) -> None:
        self.rank = rank
        self.ranks = list(ranks)
        self.folder = folder
        self.stall_s = stall_s
        self.timeout_s = timeout_s
        self.emit = emit
        """Writes one event to the job's log (any rank may report)."""
        self.poll_s = poll_s if poll_s is not None else min(1.0, stall_s / 4)
        self.hang_factor, self.hang_floor_s = hang_factor, hang_floor_s
        self._durations: deque[float] = deque(maxlen=64)
        """Seconds between the last step boundaries that moved the step forward (the rolling median's)."""
        self._moves: dict[int, tuple[float | None, int | None]] = {}
        """Stuck rank -> (CPU seconds, heartbeat) at the previous poll: a frozen rank moves neither."""
        self._step = 0
        self._at = time.monotonic()
        self._wall = time.time()
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._reported: int | None = None
        """The step of the stall this rank reported, until it clears."""
        self._thread = threading.Thread(target=self._run, name=f"gpufleet-rank-watch-{rank}", daemon=True)

    @property
    def path(self) -> Path:
        return self.folder / f"rank-{self.rank}.json"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def progress(self, step: int) -> None:
        """Called by the loop at every step boundary (and after a restore)."""
        now = time.monotonic()
        if step == self._step + 1:
            self._durations.append(now - self._at)
        self._step, self._at, self._wall = step, now, time.time()

    @property
    def median_step_s(self) -> float | None:
        """The rolling median step time, once three steps were timed."""
        return statistics.median(self._durations) if len(self._durations) >= 3 else None

    @property
    def threshold_s(self) -> float:
        return hang_seconds(
            self.median_step_s,
            factor=self.hang_factor,
            floor_s=self.hang_floor_s,
            timeout_s=self.timeout_s,
            stall_s=self.stall_s,
        )

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check(time.monotonic())
            except Exception as err:  # noqa: BLE001 - the watchdog must never take the training down
                print(f"gpufleet: rank watchdog: {type(err).__name__}: {err}", file=sys.stderr, flush=True)

    def check(self, now: float) -> None:
        """One look: record this rank's stall, and report the stuck ranks when this rank is the reporter."""
        step, stalled, threshold = self._step, now - self._at, self.threshold_s
        if stalled < threshold / 2:
            if self._reported is not None and step > self._reported:
                self.emit(EventKind.RANK_STALL_CLEARED, step=step, reported_at_step=self._reported)
                print(f"gpufleet: the group steps again (step {step})", file=sys.stderr, flush=True)
                self._reported = None
            self._moves.clear()
            with contextlib.suppress(OSError):
                self.path.unlink()
            return
        frame = sys._current_frames().get(self._main) if self._main is not None else None
        waiting, place = where(frame)
        mine = Stall(rank=self.rank, step=step, since=self._wall, waiting=waiting, where=place)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(mine.to_json(), encoding="utf-8")
        os.replace(tmp, self.path)
        if not waiting or self._reported == step or stalled < threshold / 2 + 2 * self.poll_s:
            return  # the others have had two polls to write theirs
        stalls = {s.rank: s for s in (Stall.read(self.folder / f"rank-{r}.json") for r in range(len(self.ranks))) if s}
        waiters = [r for r, s in stalls.items() if s.waiting and s.step >= step]
        if not waiters or min(waiters) != self.rank:
            return  # the lowest waiting rank reports, once
        stuck = suspects(len(self.ranks), stalls, step)
        if not stuck:
            return
        frozen = self._frozen(stuck)  # looked at every poll from here, so there is a "before" at the threshold
        if frozen is None or stalled < threshold - self.poll_s:
            return
        self._reported = step
        hosts = [self.ranks[r].host for r in stuck]
        silent = "no answer (dead, frozen or holding the interpreter)"
        places = {str(r): stalls[r].where if r in stalls else silent for r in stuck}
        phases = {str(r): self._phase(r) for r in stuck}
        killed = [r for r in frozen if self._kill(r)]
        median = self.median_step_s
        self.emit(
            EventKind.RANK_STALLED,
            step=step,
            ranks=stuck,
            hosts=hosts,
            pids=[self.ranks[r].pid for r in stuck],
            seconds=round(stalled, 1),
            waiting=sorted(waiters),
            where=places,
            phases=phases,
            timeout_s=self.timeout_s,
            threshold_s=round(threshold, 3),
            median_step_s=None if median is None else round(median, 6),
            hung=True,
            action="killed" if killed else "reported",
            killed=killed,
        )
        named = ", ".join(
            f"rank {r} on {self.ranks[r].host} (pid {self.ranks[r].pid}, in {phases[str(r)]}, at {places[str(r)]})"
            for r in stuck
        )
        then = (
            f"killed frozen rank(s) {', '.join(map(str, killed))}: the job's recovery policy applies now"
            if killed
            else f"the group gives up after {self.timeout_s:g} s and {after_peer_loss()}"
        )
        print(
            f"gpufleet: hang: {named} has not finished step {step + 1} for {stalled:.0f} s "
            f"(threshold {threshold:.0f} s); rank(s) {', '.join(map(str, sorted(waiters)))} wait for it; {then}",
            file=sys.stderr,
            flush=True,
        )

    def _phase(self, rank: int) -> str:
        board = PhaseBoard.read(board_path(self.folder, rank))
        return board[0] if board is not None else "unknown"

    def _frozen(self, stuck: list[int]) -> list[int] | None:
        """The stuck ranks on this host whose CPU time and heartbeat did not move since the last poll.

        ``None`` at the first look (nothing to compare with yet). A rank on another host is never
        judged frozen here: its process cannot be looked at, nor signalled, from this one.
        """
        host = socket.gethostname()
        now: dict[int, tuple[float | None, int | None]] = {}
        for r in stuck:
            if self.ranks[r].host != host:
                continue
            board = PhaseBoard.read(board_path(self.folder, r))
            now[r] = (cpu_seconds(self.ranks[r].pid), board[1] if board is not None else None)
        before, self._moves = self._moves, now
        if not now:
            return []
        if any(r not in before for r in now):
            return None
        frozen = []
        for r, (cpu, beat) in now.items():
            cpu_before, beat_before = before[r]
            still = cpu is not None and cpu_before is not None and cpu - cpu_before < 0.05 * self.poll_s
            if still and beat == beat_before:
                frozen.append(r)
        return frozen

    def _kill(self, rank: int) -> bool:
        pid = self.ranks[rank].pid
        if pid == os.getpid():
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            return False
        return True


__all__ = [
    "WAITING_MARKS",
    "RankInfo",
    "RankWatch",
    "Stall",
    "cpu_seconds",
    "hang_seconds",
    "stall_seconds",
    "suspects",
    "where",
]
