"""What pricing reads of a job, kept in the cost cache between reads and brought up to date from the events since.

A running job is priced again on every read of ``gpufleet cost`` (its open attempt grows with the
clock), and what that reads barely changes from one read to the next: its record and spec, its
events other than steps (:data:`~gpufleet.cost.usage.USAGE_KINDS`), and per attempt its newest step
and its last phase totals. Read from the store each time, that cost about 0.5 ms a job: half a
second for a fleet running 1,000 jobs. The cache keeps them per job as a :class:`LiveJob`, as of
the job's newest event id (:attr:`LiveJob.seen`; event ids only grow), and a read folds in only the
events written since (incremental ingestion):

- a ``step`` of the runtime: the attempt's newest step, and its phase totals where they are well formed;
- an event of ``USAGE_KINDS``: added to the job's events, in time order (a ``session_end`` may also
  carry phase totals);
- an ``attempt_start``, or an attempt the job was not read with: the job is read again whole (the
  start sets the world size the phase totals are checked against);
- anything else: nothing the ledger reads.

A job's spec is validated again only when its text changes (a resize). Everything is read through the
cache's connection, in its read transaction, so the events folded in and the id they are kept as of come
from one snapshot.

A job priced from its inputs also leaves what pricing it read, as :class:`Priced`: what its first attempts
that had ended came to (:class:`Closed`, summed in the ledger's order), and for each attempt after them its
:class:`~gpufleet.cost.usage.AttemptReading`, which only needs a time to give its usage. A job nothing was
written about since the last read (no event, no attempt row added or changed, its record not written: the
cache's :meth:`~gpufleet.cost.cache.CostCache.dirty`) is priced from that alone, without reading its
attempts, its record or its inputs: the same figures to the last bit. At 100,000 jobs with 1,042 running,
that took pricing the running jobs from about 0.15 s to 0.05 s.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from gpufleet.cost.cache import COST_COLUMNS, cost_from, cost_values
from gpufleet.cost.ledger import AttemptUsage, Cost, PhaseShares, job_cost
from gpufleet.cost.rates import RateCard
from gpufleet.cost.usage import (
    PHASES_KEY,
    USAGE_KINDS,
    AttemptReading,
    JobFacts,
    StepTail,
    _step,
    _world_size,
    attempt_readings,
    phase_shares,
)
from gpufleet.errors import SpecError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import (
    Attempt,
    Event,
    _placeholder_spec,
    attempt_from_row,
    event_from_row,
    newest_attempt_events_sql,
)

Mark = tuple[float, int]
"""Where an event sits in a job's history: its time, then its id (the order ``Store.events`` reads)."""
_KINDS = ",".join(f"'{k}'" for k in USAGE_KINDS)


@dataclass(frozen=True, slots=True)
class Closed:
    """What a job's first :attr:`n` attempts, all ended, came to when they were priced."""

    n: int
    cost: Cost
    last_end: float
    """When the last of them ended (the ledger's ``end``)."""
    unended: bool
    """One of them has no outcome (the ledger counts it as ``running``)."""

    def to_list(self) -> list[Any]:
        return [self.n, self.last_end, self.unended, list(cost_values(self.cost)[0])]

    @classmethod
    def from_list(cls, kept: Any) -> Closed:
        """What :meth:`to_list` wrote (``ValueError`` or ``TypeError`` on anything else)."""
        n, last_end, unended, values = kept
        if not isinstance(values, list) or len(values) != len(COST_COLUMNS):
            raise ValueError("kept priced attempts of another shape")
        return cls(int(n), cost_from(values), float(last_end), bool(unended))


@dataclass(frozen=True, slots=True)
class Priced:
    """What pricing a job read, to price it again at another time without reading anything else."""

    job_id: int
    name: str
    team: str
    closed: Closed | None
    """Its first attempts, ended, priced (``None``: none, or a figure the cache does not keep)."""
    open: tuple[tuple[float | None, AttemptReading], ...]
    """Each attempt after them: when it ended (``None``: still open) and its reading."""

    def price(self, rates: RateCard, now: float, since: float | None) -> tuple[Cost, float, bool]:
        """:meth:`LiveJob.price` at ``now``, from this alone."""
        usages = [reading.at(now if ended is None else ended) for ended, reading in self.open]
        return _total(self.closed, usages, rates, since)

    def dumps(self) -> str:
        return json.dumps(
            {
                "job": [self.job_id, self.name, self.team],
                "closed": None if self.closed is None else self.closed.to_list(),
                "open": [[ended, reading.to_list()] for ended, reading in self.open],
            }
        )

    @classmethod
    def loads(cls, text: str, job_id: int) -> Priced:
        """What :meth:`dumps` wrote for ``job_id`` (``ValueError``, ``TypeError`` or ``KeyError`` on anything else)."""
        d = json.loads(text)
        kept_id, name, team = d["job"]
        if kept_id != job_id or not isinstance(name, str) or not isinstance(team, str):
            raise ValueError(f"kept pricing of another job ({kept_id!r})")
        opened = tuple(
            (None if ended is None else float(ended), AttemptReading.from_list(reading)) for ended, reading in d["open"]
        )
        closed = None if d["closed"] is None else Closed.from_list(d["closed"])
        if closed is None and not opened:
            raise ValueError("kept pricing of no attempt")
        return cls(job_id, name, team, closed, opened)


@dataclass
class LiveJob:
    """One job's pricing inputs, as of its event :attr:`seen`."""

    facts: JobFacts
    spec_key: str
    """A digest of the record the facts came from (name, team, spec text)."""
    seen: int
    """The newest event id of the job folded in (0: none)."""
    attempts: tuple[int, ...]
    """The attempts the job was read with (another one appearing reads it again whole)."""
    events: list[tuple[int, Event]] = field(default_factory=list)
    """Its events of ``USAGE_KINDS`` with their ids, in (time, id) order."""
    steps: dict[int, tuple[Mark, int]] = field(default_factory=dict)
    """Per attempt: its newest runtime step's mark and step number."""
    phases: dict[int, tuple[Mark, PhaseShares]] = field(default_factory=dict)
    """Per attempt: its newest well-formed phase totals and their mark."""
    priced: Priced | None = None
    """What :meth:`price` read, for the next read (not kept in :meth:`dumps`: beside it)."""

    def price(
        self, attempts: Sequence[Attempt], rates: RateCard, now: float, since: float | None
    ) -> tuple[Cost, float, bool]:
        """The job's cost at ``now``, when its last attempt ended (or ``now``), and whether it ran at or after
        ``since``: what pricing every attempt gives (``job_usages``, ``job_cost``); :attr:`priced` is left set."""
        read = attempt_readings(self.facts, attempts, self.usage_events, self.tails())
        usages = [r.at(now if a.ended_at is None else a.ended_at) for a, r in read]
        ended = next((i for i, (a, _) in enumerate(read) if a.ended_at is None), len(read))  # first ones, ended
        closed = None
        if ended:
            first = job_cost(usages[:ended], rates)
            if cost_values(first)[1]:  # a figure the cache keeps (else every attempt is kept as a reading)
                unended = any(u.outcome == "running" for u in usages[:ended])
                closed = Closed(ended, first, max(u.end for u in usages[:ended]), unended)
                read, usages = read[ended:], usages[ended:]
        f = self.facts
        self.priced = Priced(f.id, f.name, f.team, closed, tuple((a.ended_at, r) for a, r in read))
        return _total(closed, usages, rates, since)

    @property
    def usage_events(self) -> list[Event]:
        return [e for _, e in self.events]

    def tails(self) -> dict[int, StepTail]:
        """Each attempt's :class:`StepTail`, as ``stored_step_tail`` reads it from the store."""
        out: dict[int, StepTail] = {}
        for n in {*self.steps, *self.phases}:
            step = self.steps.get(n)
            phases = self.phases.get(n)
            out[n] = StepTail(
                ts=None if step is None else step[0][0],
                step=None if step is None else step[1],
                phases=None if phases is None else phases[1],
            )
        return out

    # ---- folding ------------------------------------------------------------------------------
    def fold(self, rows: Iterable[sqlite3.Row]) -> bool:
        """Fold in the job's events newer than :attr:`seen` (by id); ``False``: it must be read again whole."""
        added = False
        for row in rows:
            self.seen = max(self.seen, int(row["id"]))
            kind = row["kind"]
            if kind == EventKind.ATTEMPT_START:
                return False
            if kind != EventKind.STEP and kind not in USAGE_KINDS:
                continue
            event = event_from_row(row)
            if event is None:
                continue
            mark = (event.ts, int(row["id"]))
            if kind in USAGE_KINDS:
                self.events.append((mark[1], event))
                added = True
            if event.source != "runtime" or event.attempt is None:
                continue
            if kind == EventKind.STEP:
                self.step_seen(event, mark)
            if kind in (EventKind.STEP, EventKind.SESSION_END):
                self.phases_seen(event, mark)
        if added:
            self.events.sort(key=lambda ie: (ie[1].ts, ie[0]))
        return True

    def step_seen(self, event: Event, mark: Mark) -> None:
        n = event.attempt
        assert n is not None
        held = self.steps.get(n)
        if held is None or mark > held[0]:
            self.steps[n] = (mark, _step(event.data, "step"))

    def phases_seen(self, event: Event, mark: Mark) -> None:
        """Keep ``event``'s phase totals if they are well formed and newer than those kept: the newest
        well-formed totals, the ones ``first_phases`` finds walking the attempt's events newest first."""
        n = event.attempt
        assert n is not None
        held = self.phases.get(n)
        if "phase_totals_s" not in event.data or (held is not None and mark <= held[0]):
            return
        shares = phase_shares(event.data, _world_size(n, self.usage_events))
        if shares is not None:
            self.phases[n] = (mark, shares)

    # ---- kept as text -------------------------------------------------------------------------
    def dumps(self) -> str:
        f = self.facts
        return json.dumps(
            {
                "facts": [f.id, f.name, f.team, f.gpu_type, f.provider, f.spot, f.total_gpus],
                "attempts": list(self.attempts),
                "events": [[i, e.attempt, e.ts, e.kind, e.source, e.data] for i, e in self.events],
                "steps": [[n, *mark, step] for n, (mark, step) in self.steps.items()],
                "phases": [
                    [n, *mark, s.data_wait_s, s.straggler_wait_s, s.busy_s] for n, (mark, s) in self.phases.items()
                ],
            }
        )

    @classmethod
    def loads(cls, text: str, spec_key: str, seen: int) -> LiveJob:
        """What :meth:`dumps` wrote (``ValueError``, ``TypeError`` or ``KeyError`` on anything else)."""
        d = json.loads(text)
        i, name, team, gpu_type, provider, spot, gpus = d["facts"]
        facts = JobFacts(int(i), str(name), str(team), str(gpu_type), str(provider), bool(spot), int(gpus))
        events = [
            (int(k), Event(facts.id, a, float(ts), str(kd), str(src), dict(data)))
            for k, a, ts, kd, src, data in d["events"]
        ]
        return cls(
            facts,
            spec_key,
            seen,
            tuple(int(n) for n in d["attempts"]),
            events,
            {int(n): ((float(ts), int(k)), int(step)) for n, ts, k, step in d["steps"]},
            {
                int(n): ((float(ts), int(k)), PhaseShares(float(w), float(s), float(b)))
                for n, ts, k, w, s, b in d["phases"]
            },
        )


class LiveReader:
    """One read's pricing inputs for the jobs the cost cache missed: :meth:`read`, then each job from :attr:`kept`
    (nothing written about it since) or from :attr:`jobs` and :attr:`attempts`.

    ``db`` is the cost cache's connection (the store attached as ``s``, the ``live`` table, ``temp.cand``);
    the jobs read again or brought up to date are left in ``temp.live_fresh`` for the cache to keep (:meth:`keep`).
    """

    def __init__(self, db: sqlite3.Connection, digest: str) -> None:
        self.db = db
        self.digest = digest
        self.jobs: dict[int, LiveJob] = {}
        self.attempts: dict[int, list[Attempt]] = {}
        self.kept: dict[int, Priced] = {}
        """The jobs priced from what their last pricing read: nothing was written about them since."""
        self.changed: set[int] = set()
        """The jobs whose inputs changed in this read (read again, brought up to date, priced anew): :meth:`keep`."""

    def read(self, job_ids: Sequence[int], dirty: set[int]) -> None:
        """Read (or bring up to date) the inputs of ``job_ids``; ``dirty``: those written about since the last read."""
        db = self.db
        db.execute("DROP TABLE IF EXISTS temp.live_fresh")
        db.execute(
            "CREATE TEMP TABLE live_fresh (job_id INTEGER PRIMARY KEY, spec_key TEXT, seen INTEGER, body TEXT,"
            " priced TEXT)"
        )
        self.changed.clear()
        db.execute("DROP TABLE IF EXISTS temp.live_ids")
        db.execute("CREATE TEMP TABLE live_ids (job_id INTEGER PRIMARY KEY)")
        db.executemany("INSERT OR IGNORE INTO temp.live_ids VALUES (?)", ((j,) for j in job_ids if j not in dirty))
        for job_id, text in db.execute(
            "SELECT job_id, priced FROM live WHERE digest=? AND priced IS NOT NULL AND job_id IN temp.live_ids",
            (self.digest,),
        ).fetchall():
            with suppress(ValueError, TypeError, KeyError):  # written by something else: read the job as below
                self.kept[int(job_id)] = Priced.loads(str(text), int(job_id))
        db.execute("DELETE FROM temp.live_ids")
        db.executemany("INSERT INTO temp.live_ids VALUES (?)", ((j,) for j in set(job_ids) if j not in self.kept))
        cursor = db.cursor()
        cursor.row_factory = sqlite3.Row
        # CROSS JOIN: from the few jobs asked for into the store's tables by key (SQLite would scan the store's
        # tables otherwise, not knowing how small the temporary one is).
        for row in cursor.execute(
            "SELECT a.* FROM temp.live_ids l CROSS JOIN s.attempts a ON a.job_id=l.job_id ORDER BY a.job_id, a.n"
        ):
            self.attempts.setdefault(int(row["job_id"]), []).append(attempt_from_row(row))
        kept = {
            int(j): (str(k), int(s), str(b))
            for j, k, s, b in db.execute(
                "SELECT job_id, spec_key, seen, body FROM live WHERE digest=? AND job_id IN temp.live_ids",
                (self.digest,),
            )
        }
        records = db.execute(
            "SELECT j.id, j.name, j.team, j.spec FROM temp.live_ids l CROSS JOIN s.jobs j ON j.id=l.job_id"
        ).fetchall()
        for job_id, name, team, spec in records:
            key = _spec_key(name, team, spec)
            attempts = tuple(a.n for a in self.attempts.get(job_id, ()))
            live = self._kept(kept.get(job_id), key, attempts)
            if live is not None and job_id not in dirty:
                self.jobs[job_id] = live
                continue
            if live is None or not live.fold(self._rows(job_id, after=live.seen)):
                facts = live.facts if live is not None and live.spec_key == key else _facts(job_id, name, team, spec)
                live = self._whole(facts, key, attempts)
            self.jobs[job_id] = live
            self.changed.add(job_id)

    def keep(self) -> None:
        """Leave the inputs of the jobs :attr:`changed` in ``temp.live_fresh``, for the cache to keep."""
        self.db.executemany(
            "INSERT OR REPLACE INTO temp.live_fresh VALUES (?, ?, ?, ?, ?)",
            (
                (j, live.spec_key, live.seen, live.dumps(), None if live.priced is None else live.priced.dumps())
                for j in sorted(self.changed)
                if (live := self.jobs.get(j))
            ),
        )

    def _kept(self, kept: tuple[str, int, str] | None, key: str, attempts: tuple[int, ...]) -> LiveJob | None:
        """The kept inputs, if they can be brought up to date: read with these attempts, from this record."""
        if kept is None or kept[0] != key:
            return None
        try:
            live = LiveJob.loads(kept[2], kept[0], kept[1])
        except (ValueError, TypeError, KeyError):  # written by something else: read it again
            return None
        return live if live.attempts == attempts else None

    def _rows(self, job_id: int, *, after: int) -> Iterable[sqlite3.Row]:
        cursor = self.db.cursor()
        cursor.row_factory = sqlite3.Row
        return cursor.execute("SELECT * FROM s.events WHERE job_id=? AND id > ? ORDER BY id", (job_id, after))

    def _whole(self, facts: JobFacts, key: str, attempts: tuple[int, ...]) -> LiveJob:
        """A job's inputs read from scratch: what ``job_usages`` reads, with the ids to go on from."""
        db, job_id = self.db, facts.id
        cursor = db.cursor()
        cursor.row_factory = sqlite3.Row
        seen = db.execute("SELECT ifnull(max(id), 0) FROM s.events WHERE job_id=?", (job_id,)).fetchone()[0]
        live = LiveJob(facts, key, int(seen), attempts)
        rows = cursor.execute(
            f"SELECT * FROM s.events WHERE job_id=? AND kind IN ({_KINDS}) ORDER BY ts, id", (job_id,)
        )
        live.events = [(int(row["id"]), e) for row in rows if (e := event_from_row(row)) is not None]
        for n in attempts:
            sql, args = newest_attempt_events_sql(job_id, n, (EventKind.STEP,), source="runtime", schema="s")
            for row in cursor.execute(sql, args):
                if (event := event_from_row(row)) is not None:
                    live.step_seen(event, (event.ts, int(row["id"])))
                    break
            sql, args = newest_attempt_events_sql(
                job_id, n, (EventKind.STEP, EventKind.SESSION_END), source="runtime", mentions=PHASES_KEY, schema="s"
            )
            for row in cursor.execute(sql, args):
                if (event := event_from_row(row)) is not None:
                    live.phases_seen(event, (event.ts, int(row["id"])))
                    if n in live.phases:
                        break
        return live


def _total(
    closed: Closed | None, usages: Sequence[AttemptUsage], rates: RateCard, since: float | None
) -> tuple[Cost, float, bool]:
    """A job's cost (its closed attempts' sum, then ``usages`` added in order), when its last attempt ended, and
    whether it ran at or after ``since``."""
    cost = job_cost(usages, rates, first=None if closed is None else closed.cost)
    ends = [u.end for u in usages] + ([] if closed is None else [closed.last_end])
    shown = (
        since is None
        or any(u.end >= since or u.outcome == "running" for u in usages)
        or (closed is not None and (closed.unended or closed.last_end >= since))
    )
    return cost, max(ends), shown


def _spec_key(name: Any, team: Any, spec: Any) -> str:
    return hashlib.sha256(json.dumps([str(name), str(team), str(spec)]).encode()).hexdigest()[:32]


def _facts(job_id: int, name: Any, team: Any, spec_text: Any) -> JobFacts:
    """A job's :class:`JobFacts` from its stored record (a spec that no longer validates reads as ``Store.job``
    reads it: a placeholder)."""
    from gpufleet.spec import parse_spec  # only for a job read whole: most reads validate no spec

    try:
        spec = parse_spec(json.loads(spec_text), source=f"job {job_id}")
    except (TypeError, ValueError, RecursionError, SpecError):
        spec = _placeholder_spec(str(name), str(team))
    return JobFacts(job_id, str(name), str(team), spec.resources.gpu_type, spec.provider, spec.spot, spec.total_gpus)


__all__ = ["Closed", "LiveJob", "LiveReader", "Priced"]
