"""Event log: what a training process reports, one JSON object a line.

The runtime appends to ``jobs/<id>/events.jsonl`` (flushed, not fsynced: losing the last lines
on a crash loses detail, never state); the backend ingests the file into the state database.
Lines are ``{"ts": <unix time>, "attempt": <n>, "kind": <str>, ...}``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from gpufleet.jobs.protocol import REQUEUE_EXIT_CODE


class EventKind(StrEnum):
    """Every event kind the core writes or reads: the runtime to ``events.jsonl``, the backends and the store
    to the database's ``events`` table.

    A member equals its string (``EventKind.STEP == "step"``), which is what logs and databases hold, so
    reading code may compare either way. A feature's own kinds (RL's ``rl``, a sweep's ``pruned``) are
    strings it registers with their payloads (:mod:`gpufleet.jobs.features`), and ``TrainSession.log(kind,
    ...)`` may write any other kind of a user's choosing: a kind read back is a ``str``, not necessarily a
    member, and one nobody registered is shown as it was written.
    """

    # ---- the runtime (TrainSession, its rank watchdog), in events.jsonl ----------------------------
    SESSION_START = "session_start"
    """A training process opened its session (pid, total_steps, resume policy)."""
    GPU_SOURCE = "gpu_source"
    """Where the session's GPU samples come from (NVML, DCGM, a simulation)."""
    GROUP = "group"
    """A distributed session's ranks: world size, backend, and each rank's host and pid."""
    RESTORE = "restore"
    """A checkpoint was restored (at start or by a rollback), or none was found (``step: null``)."""
    CHECKPOINT_SKIPPED = "checkpoint_skipped"
    """A checkpoint could not be used on restore (corrupt, mismatched) and an older one was tried."""
    TIER_SKIPPED = "tier_skipped"
    """A memory-tier copy was not used on restore (missing, corrupt, stale, unhealthy): the tier and the
    reason; the next tier (own RAM, a peer's RAM, the disk) was tried."""
    MEMORY_TIER = "memory_tier"
    """The session's memory tier: bytes per copy, where the own and peer copies live, the cadence."""
    GROUP_REFORMED = "group_reformed"
    """The ranks re-formed in place after a lost rank (``distributed.recovery: wait``): the generation,
    the ranks replaced, the step every rank resumed from, the tier it came from, seconds since the fault."""
    SHORT_HANDED = "short_handed"
    """Under ``distributed.recovery: continue``, steps the replicas ran without every replica (one event per
    run of such steps, not per step): the steps, the samples of the missing replicas' shares skipped, the
    fewest replicas that took part, and the first and last step of the run."""
    RNG_RESEEDED = "rng_reseeded"
    """The random state was reseeded because the world size changed since the checkpoint."""
    CONFIG_CHANGED = "config_changed"
    """The restored optimizer settings differ from this run's; the checkpoint's were kept."""
    RUN_CHANGED = "run_changed"
    """A resumed run's global batch or ``total_steps`` differ from its checkpoint's (another world size):
    both numbers of each, the world sizes, and what the data position now stands for."""
    NOTHING_TO_TRAIN = "nothing_to_train"
    """The restored step is already at ``total_steps``: the loop has nothing left to run."""
    TRAIN_START = "train_start"
    """The loop begins: the step and data position it starts from."""
    STEP = "step"
    """A healthy step ended: loss, throughput, MFU, per-rank timings."""
    UNHEALTHY = "unhealthy"
    """A step's loss or the model state was NaN, inf or a spike."""
    ROLLBACK = "rollback"
    """Training went back to the last healthy checkpoint, skipping the offending batches."""
    CHECKPOINT = "checkpoint"
    """A checkpoint was committed: step, seconds, bytes, why it was taken."""
    CHECKPOINT_FAILED = "checkpoint_failed"
    """A checkpoint could not be written (no space); the last good one is kept."""
    CHECKPOINT_INTERVAL = "checkpoint_interval"
    """``checkpoint: {every: auto}`` set or changed its interval: seconds, steps, the save time and rate, why."""
    PREEMPT_SIGNAL = "preempt_signal"
    """The process saw SIGTERM or SIGUSR1 (or a preemption request) and saves before exiting."""
    METRICS = "metrics"
    """Anything a script logged with ``TrainSession.log`` without naming a kind."""
    EVAL = "eval"
    """Evaluation losses the built-in workloads log (``TrainSession.log("eval", ...)``)."""
    RANK_STALLED = "rank_stalled"
    """The watchdog found ranks that stopped stepping (where each one is stuck)."""
    RANK_STALL_CLEARED = "rank_stall_cleared"
    """The group steps again after a reported stall."""
    STRAGGLER = "straggler"
    """Rank 0 named a rank that holds the others up (``status`` named, then ended): the rank, its host, the
    phase (compute or data_wait), the factor over the others' median, its first step and the tax."""
    SESSION_END = "session_end"
    """The session ended: ``status`` completed, requeue or failed (see ``SESSION_EXIT``)."""

    # ---- data staging (gpufleet.data.stage_in, before the runtime starts), in events.jsonl -----------
    # The data feature registers their payloads and gauges (gpufleet.data.feature); they are members
    # because the core reads them: the cost ledger's staging bucket, the trace's staging span, `watch`.
    DATA_STAGED = "data_staged"
    """An attempt's data was staged in before its first step: seconds, files and bytes copied and reused."""
    DATA_STAGE_FAILED = "data_stage_failed"
    """Staging the data failed (the file and why); the attempt exits without training."""

    # ---- the backends and the store, in the database ---------------------------------------------
    QUEUED = "queued"
    """A job was submitted to the store (its priority)."""
    SUBMITTED = "submitted"
    """A remote scheduler accepted the job (the Slurm job id, the Ray actor)."""
    RESIZED = "resized"
    """The job's GPUs or world size changed for its next attempts."""
    ATTEMPT_START = "attempt_start"
    """An attempt's process started (pid, node, GPUs, world size)."""
    PREEMPTED_BY = "preempted_by"
    """An attempt is being preempted to make room for a higher-priority job."""
    PREEMPTION_NOTICE = "preemption_notice"
    """A provider announced the node's preemption (AWS, GCP, Azure, Slurm): the source, when the node
    goes, and the lead time the attempt had to save and drain."""
    SIGTERM = "sigterm"
    """An attempt was sent SIGTERM (preempted or cancelled), with its grace time to save."""
    SIGKILL = "sigkill"
    """An attempt was killed after its grace time expired."""
    ATTEMPT_END = "attempt_end"
    """An attempt's process ended: exit code and outcome."""
    REQUEUED = "requeued"
    """The job went back to the queue for another attempt."""
    COMPLETED = "completed"
    """The job completed (its final state)."""
    FAILED = "failed"
    """The job failed (its final state)."""
    CANCELLED = "cancelled"
    """The job was cancelled (its final state)."""
    PLACED = "placed"
    """The fleet's planner chose where the next attempt runs: offer, market, price, and why."""
    CHECKPOINT_MOVED = "checkpoint_moved"
    """The job's checkpoint was copied to the region it moves to, verified, and charged as egress."""
    SPOT_PREEMPTED = "spot_preempted"
    """The spot pool the attempt ran on took its GPUs back (an injected storm on the local fleet)."""
    FAILOVER = "failover"
    """A region preempted too often, or was marked down: its jobs move to the next offer."""
    FLEET_DOWN = "fleet_down"
    """The attempt's pool is down (``gpufleet fleet down`` or an outage): it stops, gently or abruptly."""
    RECLAIMED_BY = "reclaimed_by"
    """The attempt borrowed quota its owner needs back: it is preempted for the owner's job."""
    HELD = "held"
    """A queued job was held back (``gpufleet hold``): it is not started until released."""
    RELEASED = "released"
    """A held job was released: it waits for a slot like any queued job."""
    EVENTS_REJECTED = "events_rejected"
    """Lines of the job's ``events.jsonl`` that are not events were skipped when it was read."""


NOTABLE: tuple[EventKind, ...] = (
    EventKind.DATA_STAGED,
    EventKind.DATA_STAGE_FAILED,
    EventKind.QUEUED,
    EventKind.ATTEMPT_START,
    EventKind.PREEMPTION_NOTICE,
    EventKind.SIGTERM,
    EventKind.SIGKILL,
    EventKind.PREEMPTED_BY,
    EventKind.PLACED,
    EventKind.CHECKPOINT_MOVED,
    EventKind.SPOT_PREEMPTED,
    EventKind.FAILOVER,
    EventKind.FLEET_DOWN,
    EventKind.RECLAIMED_BY,
    EventKind.HELD,
    EventKind.RELEASED,
    EventKind.RESIZED,
    EventKind.RESTORE,
    EventKind.CHECKPOINT_SKIPPED,
    EventKind.TIER_SKIPPED,
    EventKind.GROUP_REFORMED,
    EventKind.SHORT_HANDED,
    EventKind.RUN_CHANGED,
    EventKind.UNHEALTHY,
    EventKind.ROLLBACK,
    EventKind.PREEMPT_SIGNAL,
    EventKind.ATTEMPT_END,
    EventKind.REQUEUED,
    EventKind.COMPLETED,
    EventKind.FAILED,
    EventKind.CANCELLED,
    EventKind.RANK_STALLED,
    EventKind.RANK_STALL_CLEARED,
    EventKind.STRAGGLER,
    EventKind.CHECKPOINT_FAILED,
)
"""The core's events a person watching a job should see (``gpufleet show``, ``gpufleet watch``); a feature
marks its own notable kinds when it registers them (:func:`gpufleet.jobs.features.notable_kinds`)."""


def _clean(value: Any) -> Any:
    """JSON has no NaN or inf: encode them as strings so a NaN loss survives the trip."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def append_event(path: str | Path | None, attempt: int, kind: str, **data: Any) -> None:
    """Append one event to the log at ``path`` (none: nothing), from a process that writes only that one."""
    if not path:
        return
    log = EventLog(Path(path), attempt=attempt)
    try:
        log.emit(kind, **data)
    finally:
        log.close()


class EventLog:
    """Append-only JSONL sink; without a path it keeps events in memory (tests, plain scripts)."""

    def __init__(self, path: Path | None, attempt: int = 1, keep_last: int | None = None) -> None:
        self.path = path
        self.attempt = attempt
        self.keep_last = keep_last
        """Without a path: keep at most about this many events in memory (the newest); ``None``: all."""
        self.memory: list[dict[str, Any]] = []
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        """Called with every event after it is written (metrics exporters)."""
        self._fh: IO[str] | None = None
        self._lock = threading.Lock()  # a rank's watchdog thread may report while the loop emits
        self.dropped = 0
        """Events that could not be written (a full disk)."""
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", encoding="utf-8")

    def emit(self, kind: str, **data: Any) -> dict[str, Any]:
        event = {"ts": time.time(), "attempt": self.attempt, "kind": str(kind), **_clean(data)}  # plain str
        with self._lock:
            self._write(event)
        for listener in self.listeners:
            listener(event)
        return event

    def _write(self, event: dict[str, Any]) -> None:
        if self._fh is None:
            self.memory.append(event)
            if self.keep_last is not None and len(self.memory) > 2 * self.keep_last:  # amortised: trim in halves
                del self.memory[: len(self.memory) - self.keep_last]
        else:
            try:
                self._fh.write(json.dumps(event, separators=(",", ":")) + "\n")
                self._fh.flush()
            except OSError as err:  # a full disk loses detail, never the training: say it once
                if not self.dropped:
                    print(f"gpufleet: events not recorded in {self.path}: {err.strerror}", file=sys.stderr, flush=True)
                self.dropped += 1

    def close(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None


MAX_TS = 1e11
"""Event times are Unix seconds; anything past the year 5000 is a hostile or broken line."""
MAX_ATTEMPT = 1_000_000
MAX_INT = 2**63 - 1
"""The largest integer an event may hold anywhere: what SQLite stores, and a float can hold without overflowing."""

_FINITE_KEYS = frozenset(
    {
        *("seconds", "step", "from_step", "to_step", "total_steps", "data_position"),
        *("gpus", "old_gpus", "world_size", "rank", "pid", "bytes", "tokens"),
    }
)
_FINITE_SUFFIXES = ("_s", "_seconds", "_at", "_ms", "_step", "_steps")


def _must_be_finite(key: str) -> bool:
    """A time, a duration, a step or a count: NaN or an infinity there is a broken line, not a measurement.

    A loss (or any other measured value) may be NaN or infinite on purpose: the runtime reports
    such steps as ``unhealthy``, and readers show them as ``null``.
    """
    return key in _FINITE_KEYS or key.endswith(_FINITE_SUFFIXES)


def _is_text(value: str) -> bool:
    """Whether ``value`` is valid Unicode (no lone surrogate, which JSON's ``\\ud800`` escape can produce)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _value_problem(event: dict[str, Any]) -> str | None:
    """Why a value anywhere inside ``event`` cannot be stored or computed with (``None`` when none).

    Walked without recursion: a line may nest as deep as the JSON parser allowed.
    """
    stack: list[tuple[str, Any]] = [(str(k), v) for k, v in event.items()]
    if not all(_is_text(k) for k, _ in stack):
        return "a key is not valid Unicode (a lone surrogate)"
    while stack:
        key, value = stack.pop()
        if isinstance(value, str):
            if not _is_text(value):
                return f"{key[:40]!r} is not valid Unicode (a lone surrogate)"
        elif isinstance(value, float):
            if not math.isfinite(value) and _must_be_finite(key):
                return f"{key[:40]!r} is not a finite number"
        elif isinstance(value, int) and not isinstance(value, bool):
            if not -MAX_INT - 1 <= value <= MAX_INT:
                return f"{key[:40]!r} is an integer beyond 64 bits"
        elif isinstance(value, list):
            stack.extend((key, item) for item in value)
        elif isinstance(value, dict):
            items = [(str(k), v) for k, v in value.items()]
            if not all(_is_text(k) for k, _ in items):
                return "a key is not valid Unicode (a lone surrogate)"
            stack.extend(items)
    return None


def event_problem(event: Any) -> str | None:
    """Why a decoded line cannot be an event (``None`` when it can): the file is written by user code.

    Beyond its ``kind``, ``ts`` and ``attempt``: no text that is not valid Unicode (it cannot be
    stored), no integer beyond 64 bits, and no NaN or infinity in a time, duration, step or count
    (``seconds``, ``step``, ``*_s``...). A NaN loss is kept: it is what an unhealthy step reports.
    """
    if not isinstance(event, dict):
        return "not a JSON object"
    kind, ts, attempt = event.get("kind"), event.get("ts"), event.get("attempt")
    if not isinstance(kind, str) or not 0 < len(kind) <= 64:
        return "kind is not a string of 1-64 characters"
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        return "ts is not a number"
    if isinstance(ts, int) and not 0 <= ts <= MAX_TS:
        return "ts is out of range"
    if isinstance(ts, float) and not (math.isfinite(ts) and 0 <= ts <= MAX_TS):
        return "ts is not a finite time"
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)):
        return "attempt is not an integer"
    if isinstance(attempt, int) and not 0 <= attempt <= MAX_ATTEMPT:
        return "attempt is out of range"
    return _value_problem(event)


@dataclass(frozen=True, slots=True)
class RejectedLine:
    """A line of an event log that is not an event: where it is, why, and how it starts."""

    offset: int
    reason: str
    preview: str


def _read_from(path: Path, offset: int) -> bytes:
    """A regular file's bytes from ``offset``; none for a missing or unreadable file, a folder, a FIFO or a device.

    Opened without blocking, so a FIFO put where the log should be does not hang the reader, and a
    link to ``/dev/zero`` is not read forever.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return b""
    with os.fdopen(fd, "rb") as fh:
        try:
            fh.seek(offset)
            return fh.read()
        except OSError:
            return b""


def read_events_checked(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], list[RejectedLine], int]:
    """Read complete lines from ``offset``: the events, the lines rejected, and the offset after the last.

    A torn last line (the writer was killed mid-write) is left for a later read. Every other line
    is either a valid event (:func:`event_problem`) or rejected with its reason, never fatal.
    """
    offset = max(0, offset)
    data = _read_from(path, offset)
    end = data.rfind(b"\n") + 1
    events: list[dict[str, Any]] = []
    rejected: list[RejectedLine] = []
    position = offset
    for line in data[:end].split(b"\n")[:-1]:
        here, position = position, position + len(line) + 1
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            problem = event_problem(event)
        except (ValueError, UnicodeDecodeError, RecursionError):
            event, problem = None, "not valid JSON"
        if problem is None:
            events.append(event)
        else:
            rejected.append(RejectedLine(here, problem, line[:120].decode("utf-8", "replace")))
    return events, rejected, offset + end


def read_events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Valid events from ``offset`` and the offset after the last complete line (see ``read_events_checked``)."""
    events, _, end = read_events_checked(path, offset)
    return events, end


def iter_events(path: Path) -> Iterator[dict[str, Any]]:
    events, _ = read_events(path)
    yield from events


SESSION_EXIT = {"completed": 0, "requeue": REQUEUE_EXIT_CODE, "failed": 1}
"""The exit status an attempt's ``session_end`` status stands for."""


def exit_from_events(events_path: Path, attempt: int) -> int | None:
    """The exit status an attempt's last ``session_end`` stands for, or ``None`` if it has none."""
    events, _ = read_events(events_path)
    ends = [e for e in events if e["kind"] == EventKind.SESSION_END and e.get("attempt") == attempt]
    return SESSION_EXIT.get(str(ends[-1].get("status"))) if ends else None


__all__ = [
    "MAX_ATTEMPT",
    "MAX_INT",
    "MAX_TS",
    "NOTABLE",
    "SESSION_EXIT",
    "EventKind",
    "EventLog",
    "RejectedLine",
    "append_event",
    "event_problem",
    "exit_from_events",
    "iter_events",
    "read_events",
    "read_events_checked",
]
