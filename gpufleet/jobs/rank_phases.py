"""The runtime's per-rank phase times and straggler reports, read one way for every reader.

Rank 0 of a training group writes them to the job's ``events.jsonl`` (:mod:`gpufleet.runtime.components.phases`
times the phases, :mod:`gpufleet.runtime.components.stragglers` names the stragglers):

- ``step`` events carry ``rank_phase_s`` (each rank's mean seconds a step in each phase since the step event
  before) and ``phase_totals_s`` (each rank's cumulative seconds since the attempt's ``train_start``), both
  ``{phase: [seconds of rank 0, rank 1, ...]}``; ``session_end`` carries the final ``phase_totals_s``.
  :func:`phase_table` reads either.
- ``straggler`` events name a rank slow in ``compute`` or ``data_wait``, with the seconds the other ranks
  waited for it (its tax); the latest event of one straggler, keyed by (attempt, rank, phase, first step),
  is the truth. :func:`stragglers` reads them into :class:`Straggler` values.

The diagnosis (``telemetry.ranks``), the ledger (``cost.usage``), the advice (``cost.recover``) and the
server's goodput page (``serve.goodput``) all read through here, so one event reads the same everywhere.
Every value was written by a user process: a field of the wrong shape makes its table or its event
unreadable (``None``, skipped), never an error, and never a partly read table (one bad number would
shift every rank's bar).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpufleet.jobs.events import MAX_INT, MAX_TS, EventKind

if TYPE_CHECKING:  # the training process reads the phase names from here: it needs no SQLite store
    from gpufleet.jobs.store import Event

TIMED_PHASES = ("data_wait", "compute", "collective", "optimizer", "checkpoint")
"""The phases the runtime times on every rank, in the order a step runs them; they add up to the rank's wall
time from ``train_start`` to its last step boundary."""
STRAGGLER_WAIT = "straggler_wait"
"""Derived across ranks: the part of ``collective`` a rank spent waiting for slower ranks."""
PHASES = (*TIMED_PHASES, STRAGGLER_WAIT)
"""The phases the events report, in the runtime's order: the timed ones, then ``straggler_wait``."""
STRAGGLER_PHASES = ("compute", "data_wait")
"""The phases a straggler is named in: the work of one rank (its other phases wait on the group)."""
STRAGGLER_STATUSES = ("named", "ended")
"""``named`` once detected (the tax so far), ``ended`` when it stops being slow or the session ends."""
MAX_RANKS = 1 << 20
"""More ranks than any job has (1,024 nodes of 1,024 GPUs, the bounds of a spec): a rank number or a
per-rank list beyond it is a broken event."""
MAX_HOST = 253
"""The longest host name (DNS); a longer one is not a host."""
MAX_GPUS_PER_RANK = 1 << 10
"""More GPUs than one rank drives: a larger ``gpus_per_rank`` is a broken event."""


def seconds(value: Any) -> float | None:
    """A duration: a finite number from 0 to ``MAX_TS`` (so sums over ranks stay finite), else ``None``.

    A bool is not a number here, and an integer too large for a float is not one either."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and 0.0 <= number <= MAX_TS else None


def rank_seconds(value: Any, ranks: int | None = None) -> list[float] | None:
    """Seconds of each rank: a list of 1 to ``MAX_RANKS`` durations (exactly ``ranks`` when given), else ``None``."""
    if not isinstance(value, list) or not 0 < len(value) <= MAX_RANKS or (ranks is not None and len(value) != ranks):
        return None
    out: list[float] = []
    for item in value:
        number = seconds(item)
        if number is None:
            return None
        out.append(number)
    return out


def phase_table(value: Any, ranks: int | None = None) -> dict[str, list[float]] | None:
    """``{phase: [seconds of rank 0, rank 1, ...]}`` from a ``rank_phase_s`` or ``phase_totals_s`` field.

    The known phases (:data:`PHASES`) the field gives, in that order, each read by :func:`rank_seconds`, all
    of one length (``ranks``, the attempt's world size, when known). A phase the field leaves out is left
    out and an unknown key is ignored; a known phase of the wrong shape, lists of different lengths or no
    known phase at all make the whole field unreadable: ``None``."""
    if not isinstance(value, Mapping):
        return None
    out: dict[str, list[float]] = {}
    for phase in PHASES:
        if phase in value:
            numbers = rank_seconds(value[phase], ranks)
            if numbers is None:
                return None
            out[phase] = numbers
    return out if out and len({len(v) for v in out.values()}) == 1 else None


def is_host(value: Any) -> bool:
    """A host name as the runtime writes it: printable text of 1 to ``MAX_HOST`` characters."""
    return isinstance(value, str) and 0 < len(value) <= MAX_HOST and value.isprintable()


def rank_number(value: Any) -> int | None:
    """A rank: an integer from 0 below ``MAX_RANKS`` (not a bool), else ``None``."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_RANKS
    return value if ok else None


def _whole(value: Any, top: int) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top
    return value if ok else None


def _flat(event: Event | Mapping[str, Any]) -> Mapping[str, Any]:
    """An event as its ``events.jsonl`` line reads: the data with ``kind``, ``ts`` and ``attempt`` beside it."""
    if isinstance(event, Mapping):
        return event
    return {**event.data, "kind": event.kind, "ts": event.ts, "attempt": event.attempt}


def event_attempt(event: Mapping[str, Any]) -> int:
    """The attempt an event line names (0 when it names none that is a whole number)."""
    return _whole(event.get("attempt"), MAX_INT) or 0


def _ts(event: Mapping[str, Any]) -> float:
    value = event.get("ts")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    try:
        number = float(value)
    except OverflowError:
        return 0.0
    return number if math.isfinite(number) else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Straggler:
    """One straggler as its latest ``straggler`` event tells it (contract: the runtime's rank 0 writes them)."""

    attempt: int
    rank: int
    host: str
    phase: str
    """``compute`` or ``data_wait``."""
    factor: float
    """The rank's seconds a step in ``phase`` over the other ranks' median, over the runtime's window."""
    first_step: int
    last_step: int
    tax_s: float
    """Seconds the other ranks spent waiting for it (their ``straggler_wait``), summed over them."""
    gpus_per_rank: int
    status: str
    """``named`` while it lasts, ``ended`` once it stopped being slow or the session ended."""
    since: float
    """Time of the first event about it."""
    ts: float
    """Time of the latest."""

    @property
    def key(self) -> tuple[int, int, str, int]:
        """What makes it one straggler: a rank slow again later in the attempt is another one."""
        return self.attempt, self.rank, self.phase, self.first_step

    @property
    def tax_gpu_seconds(self) -> float:
        return self.tax_s * self.gpus_per_rank

    def tax_money(self, price_per_gpu_hour: float | None) -> float | None:
        """The tax at the attempt's price of a GPU-hour (``None``: no price known)."""
        return None if price_per_gpu_hour is None else self.tax_gpu_seconds / 3600.0 * price_per_gpu_hour

    def to_dict(self) -> dict[str, Any]:
        """Its event's fields with the tax in GPU-seconds, as the diagnosis and the goodput API show them (the
        times stay out: the diagnosis gives the duration, the page the attempt)."""
        return {
            "attempt": self.attempt,
            "rank": self.rank,
            "host": self.host,
            "phase": self.phase,
            "factor": self.factor,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "status": self.status,
            "tax_s": self.tax_s,
            "gpus_per_rank": self.gpus_per_rank,
            "tax_gpu_seconds": self.tax_gpu_seconds,
        }


def read_straggler(event: Event | Mapping[str, Any]) -> Straggler | None:
    """The straggler a ``straggler`` event names, or ``None`` when it is another kind or a field has the
    wrong shape: every field of the contract is required (a rank, a host, a straggler phase, a finite
    non-negative factor and tax, ``first_step <= last_step``, 1 to ``MAX_GPUS_PER_RANK`` GPUs a rank, a
    known status)."""
    line = _flat(event)
    if line.get("kind") != EventKind.STRAGGLER:
        return None
    rank, host, phase, status = rank_number(line.get("rank")), line.get("host"), line.get("phase"), line.get("status")
    factor, tax_s = seconds(line.get("factor")), seconds(line.get("tax_s"))
    first, last = _whole(line.get("first_step"), MAX_INT), _whole(line.get("last_step"), MAX_INT)
    gpus = _whole(line.get("gpus_per_rank"), MAX_GPUS_PER_RANK)
    if (
        rank is None
        or not is_host(host)
        or phase not in STRAGGLER_PHASES
        or status not in STRAGGLER_STATUSES
        or factor is None
        or tax_s is None
        or first is None
        or last is None
        or last < first
        or not gpus
    ):
        return None
    ts = _ts(line)
    return Straggler(
        attempt=event_attempt(line),
        rank=rank,
        host=str(host),
        phase=str(phase),
        factor=factor,
        first_step=first,
        last_step=last,
        tax_s=tax_s,
        gpus_per_rank=gpus,
        status=str(status),
        since=ts,
        ts=ts,
    )


def stragglers(events: Iterable[Event | Mapping[str, Any]]) -> list[Straggler]:
    """Every straggler of a job's events (oldest first; store events or ``events.jsonl`` lines), each as its
    latest well-formed event tells it, in the order they were first named.

    A malformed event is skipped, so a later broken line leaves the last good one standing; ``since`` keeps
    the time of the first event about the straggler."""
    latest: dict[tuple[int, int, str, int], Straggler] = {}
    for event in events:
        found = read_straggler(event)
        if found is None:
            continue
        before = latest.get(found.key)
        since = found.since if before is None else min(before.since, found.since)
        latest[found.key] = replace(found, since=since)
    return list(latest.values())


__all__ = [
    "MAX_GPUS_PER_RANK",
    "MAX_HOST",
    "MAX_RANKS",
    "PHASES",
    "STRAGGLER_PHASES",
    "STRAGGLER_STATUSES",
    "STRAGGLER_WAIT",
    "TIMED_PHASES",
    "Straggler",
    "event_attempt",
    "is_host",
    "phase_table",
    "rank_number",
    "rank_seconds",
    "read_straggler",
    "seconds",
    "stragglers",
]
