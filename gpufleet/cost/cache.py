"""The cost cache: each ended job's priced row, so that ``gpufleet cost`` reads what changed, not every job.

A job that ended never changes, yet pricing it reads its attempts and events and runs the ledger:
at 100,000 jobs that is a minute for figures that were the same the last time. The cache keeps, per
pricing (:func:`pricing_digest`: the rate card and the code that prices) and per job, the job's
:class:`~gpufleet.cost.ledger.Cost` as columns, the job's ``--json`` text, and per team the sums of
those columns (kept by triggers as rows come and go), so that a report reads a few rows whatever the
number of jobs. It is never a source of truth:

- it lives in ``$GPUFLEET_HOME/cache/cost.db``; deleted, damaged, or written by another version, it
  is rebuilt from the store; where it cannot be written at all the figures are computed without it;
- **staleness rule** (docs/cost.md): a job's row is used while the job has ended (completed, failed
  or cancelled, every attempt closed) and nothing was written about it since it was priced: no
  event (the events table's ids only grow), no attempt row added or changed (the store's triggers log
  each job whose attempts change in place, ``attempt_edits``), and its record (state, times, restarts,
  name, team) the one it was priced from, with the same pricing digest. Anything else prices it
  again: a late event, a changed rate card, a gpufleet upgrade. Running jobs, and jobs new since
  the last read, are looked at on every read (the *watch* list), and priced if they have attempts; a
  watched job without attempts (queued) only once something is written about it or its record
  (``updated_at``) since the last read: until then it still has none, so it costs nothing. A hand edit
  of ``state.db`` that leaves no event is not seen: delete the cache then;
- one process writes it at a time (SQLite's lock, WAL): a reader that finds the cache moved on since
  it looked gives its rows up rather than write over newer ones (:meth:`CostCache.store`).

What a read costs is the jobs that changed (found from the ids written since the last read, with the
store attached read-only to the cache's connection), not the jobs there are. The reads over valid
rows live in :mod:`gpufleet.cost.cache_read`.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gpufleet._version import __version__
from gpufleet.cost.ledger import BUCKETS, GOODPUT_BUCKETS, PREEMPTION_BUCKETS, Cost, NoticeLead
from gpufleet.cost.rates import RateCard
from gpufleet.jobs.store import TERMINAL

CACHE_VERSION = 5
"""Bumped when what a row holds changes; part of every pricing digest and checked against the file."""

FINGERPRINT = ("updated_at", "submitted_at", "state", "restarts", "events_offset", "name", "team")
"""The columns of a job's record a cached row was priced from, compared as stored (``IS``)."""

REAL = (
    *(f"gh_{b}" for b in BUCKETS),
    *(f"pgh_{b}" for b in PREEMPTION_BUCKETS),
    *(f"gs_{b}" for b in GOODPUT_BUCKETS),
    "preemption_money",
    "money",
    "on_demand_money",
    "egress_money",
)
INTEGER = ("attempts", "preemptions", "killed", "steps_redone", "egress_bytes", "short_handed_steps", "samples_skipped")
SUMMED = (*REAL, *INTEGER)
"""The columns a team's sum adds up."""
COST_COLUMNS = (*SUMMED, "unpriced", "notices")
"""A :class:`Cost` as columns: GPU-hours, money and counts summed by SQLite, the two lists as JSON text."""
ROW_COLUMNS = ("job_id", "team", "name", "last_end", *COST_COLUMNS)
"""A job, its team and name, when its last attempt ended, and its cost."""

_ADD = ", ".join(f"{c}={c}+new.{c}" for c in SUMMED)
_SUB = ", ".join(f"{c}={c}-old.{c}" for c in SUMMED)
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS digests (digest TEXT PRIMARY KEY, used REAL NOT NULL, seen TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS watch (digest TEXT NOT NULL, job_id INTEGER NOT NULL, attempted INTEGER NOT NULL,
    PRIMARY KEY (digest, job_id))""",
    f"""CREATE TABLE IF NOT EXISTS rows (
    rid INTEGER PRIMARY KEY, digest TEXT NOT NULL, job_id INTEGER NOT NULL,
    {", ".join(f"fp_{c}" for c in FINGERPRINT)},
    team TEXT NOT NULL, name TEXT NOT NULL, last_end REAL NOT NULL,
    {", ".join(f"{c} REAL NOT NULL" for c in REAL)},
    {", ".join(f"{c} INTEGER NOT NULL" for c in INTEGER)},
    unpriced TEXT, notices TEXT,
    UNIQUE (digest, job_id))""",
    "CREATE INDEX IF NOT EXISTS rows_money ON rows (digest, money DESC, job_id) WHERE attempts > 0",
    "CREATE INDEX IF NOT EXISTS rows_killed ON rows (digest, job_id) WHERE killed > 0",
    "CREATE INDEX IF NOT EXISTS rows_unpriced ON rows (digest, job_id) WHERE unpriced IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS rows_notices ON rows (digest, job_id) WHERE notices IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS frags (rid INTEGER PRIMARY KEY, json TEXT NOT NULL)",
    f"""CREATE TABLE IF NOT EXISTS sums (digest TEXT NOT NULL, team TEXT NOT NULL, n INTEGER NOT NULL,
    {", ".join(f"{c} NOT NULL DEFAULT 0" for c in SUMMED)}, PRIMARY KEY (digest, team))""",
    f"""CREATE TRIGGER IF NOT EXISTS rows_in AFTER INSERT ON rows WHEN new.attempts > 0 BEGIN
    INSERT OR IGNORE INTO sums (digest, team, n) VALUES (new.digest, new.team, 0);
    UPDATE sums SET n=n+1, {_ADD} WHERE digest=new.digest AND team=new.team; END""",
    f"""CREATE TRIGGER IF NOT EXISTS rows_out AFTER DELETE ON rows WHEN old.attempts > 0 BEGIN
    UPDATE sums SET n=n-1, {_SUB} WHERE digest=old.digest AND team=old.team;
    DELETE FROM sums WHERE digest=old.digest AND team=old.team AND n <= 0; END""",
    "CREATE TRIGGER IF NOT EXISTS rows_text AFTER DELETE ON rows BEGIN DELETE FROM frags WHERE rid=old.rid; END",
    """CREATE TABLE IF NOT EXISTS live (digest TEXT NOT NULL, job_id INTEGER NOT NULL, spec_key TEXT NOT NULL,
    seen INTEGER NOT NULL, body TEXT NOT NULL, priced TEXT, PRIMARY KEY (digest, job_id))""",
)
_FRESH_COLUMNS = 1 + len(FINGERPRINT) + 2 + 3 + len(COST_COLUMNS) + 1
KEPT_DIGESTS = 3
"""Pricings whose rows are kept (the shipped card, a team's own ``--rates``, ...); older ones are dropped."""
LARGEST = 2.0**60
"""A figure above it is not kept (a team's sum of such rows could lose the small ones): priced every time."""


def pricing_digest(rates: RateCard) -> str:
    """What a cached row was priced with: the rate card, this version of gpufleet and the pricing code itself.

    The code's own bytes are in it so that a changed ledger (an upgrade, a local edit) never serves a
    figure computed by the old one.
    """
    from gpufleet.cost import ledger, usage

    h = hashlib.sha256(f"{CACHE_VERSION}\0{__version__}\0{rates.to_json()}".encode())
    for module in (ledger, usage):
        h.update(Path(str(module.__file__)).read_bytes())
    return h.hexdigest()


def cost_values(cost: Cost) -> tuple[tuple[Any, ...], bool]:
    """``cost`` as :data:`COST_COLUMNS` values, and whether it may be kept (every figure finite and sane).

    The ledger clamps every time and a rate card's prices are finite, so a figure that is not is a bug
    somewhere: SQLite would store it as ``NULL``, so it is summed as 0 for this read and not kept.
    """
    reals = (
        *(cost.gpu_hours[b] for b in BUCKETS),
        *(cost.preemption_gpu_hours[b] for b in PREEMPTION_BUCKETS),
        *(cost.goodput_gpu_seconds[b] for b in GOODPUT_BUCKETS),
        cost.preemption_money,
        cost.money,
        cost.on_demand_money,
        cost.egress_money,
    )
    ints = (
        cost.attempts,
        cost.preemptions,
        cost.killed,
        cost.steps_redone,
        cost.egress_bytes,
        cost.short_handed_steps,
        cost.samples_skipped,
    )
    sane = all(math.isfinite(v) and abs(v) < LARGEST for v in reals) and all(abs(v) < LARGEST for v in ints)
    notices = [[n.job_id, n.attempt, n.source, n.lead_s, n.saved_s] for n in cost.notices]
    values = (
        *(v if math.isfinite(v) else 0.0 for v in reals),
        *ints,
        json.dumps(list(cost.unpriced)) if cost.unpriced else None,
        json.dumps(notices) if sane and notices else None,
    )
    return values, sane


def cost_from(values: Sequence[Any]) -> Cost:
    """The :class:`Cost` that :func:`cost_values` (or a sum of them) stands for."""
    it = iter(values)
    gpu_hours = {b: float(next(it)) for b in BUCKETS}
    preemption = {b: float(next(it)) for b in PREEMPTION_BUCKETS}
    goodput = {b: float(next(it)) for b in GOODPUT_BUCKETS}
    preemption_money, money, on_demand, egress = (float(next(it)) for _ in range(4))
    attempts, preemptions, killed, redone, egress_bytes, short, skipped = (int(next(it) or 0) for _ in range(7))
    unpriced, notices = next(it), next(it)
    return Cost(
        gpu_hours=gpu_hours,
        preemption_gpu_hours=preemption,
        preemption_money=preemption_money,
        money=money,
        on_demand_money=on_demand,
        attempts=attempts,
        preemptions=preemptions,
        killed=killed,
        steps_redone=redone,
        unpriced=tuple(json.loads(unpriced)) if unpriced else (),
        egress_money=egress,
        egress_bytes=egress_bytes,
        notices=tuple(NoticeLead(*n) for n in json.loads(notices)) if notices else (),
        short_handed_steps=short,
        samples_skipped=skipped,
        goodput_gpu_seconds=goodput,
    )


@dataclass(frozen=True, slots=True)
class Miss:
    """A job the cache holds no valid row for, in the report asked for: price it, then :meth:`CostCache.add` it."""

    job_id: int
    fingerprint: tuple[Any, ...]
    """Its record's :data:`FINGERPRINT` values, as read when it was found missing."""
    ended: bool
    """Completed, failed or cancelled with every attempt closed: its row may be kept."""
    attempted: bool = True
    """It has attempts (a job that never started costs nothing: nothing to read)."""


@dataclass(frozen=True, slots=True)
class Filters:
    """Which jobs a report covers (every one when all are ``None``)."""

    team: str | None = None
    job_ids: tuple[int, ...] | None = None
    since: float | None = None
    """Only jobs with an attempt that ended at or after it (or still running)."""


Seen = tuple[int, int, int, int, float, tuple[int, ...]]
"""The last event id, attempt row id, job id and attempt edit (``attempt_edits.seq``) a digest's rows account for,
the latest time a job's record was written (``jobs.updated_at``), and the jobs written at that time."""
UNSEEN: Seen = (-1, -1, -1, -1, -1.0, ())


class CostCache:
    """One read of the cache against the store: :meth:`lookup`, :meth:`add` the misses priced, read, :meth:`store`.

    Everything from :meth:`lookup` to :meth:`store` runs in one read transaction over both databases,
    so the rows found valid cannot change under the reads; :meth:`store` then tries to write.
    """

    def __init__(self, db: sqlite3.Connection, digest: str) -> None:
        self.db = db
        self.digest = digest
        self.trusted = False
        """Whether the rows of this digest may be used at all (else every job is priced again)."""
        self._seen: Seen = UNSEEN
        self._now_seen: Seen = UNSEEN
        self._records: set[int] = set()
        """The jobs whose record was written since the last read (:meth:`_candidates`; with the rows trusted)."""
        self._added: list[tuple[Any, ...]] = []

    # ---- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Path | None, state: Path, digest: str) -> CostCache:
        """The cache at ``path`` (``None``: one in memory, kept nowhere) with the store ``state`` attached."""
        db = sqlite3.connect(":memory:" if path is None else path, timeout=2.0, isolation_level=None, uri=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version not in (0, CACHE_VERSION):
                raise sqlite3.DatabaseError(f"cost cache of version {version}, not {CACHE_VERSION}")
            if version == 0:
                db.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version={CACHE_VERSION}")
                db.execute("COMMIT")
            db.execute("ATTACH DATABASE ? AS s", (f"file:{quote(str(state))}?mode=ro",))
        except BaseException:
            db.close()
            raise
        return cls(db, digest)

    def close(self) -> None:
        with suppress(sqlite3.Error):
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
        self.db.close()

    # ---- finding what changed -----------------------------------------------------------------
    def lookup(self, filters: Filters) -> list[Miss]:
        """Find the jobs whose rows cannot be used (kept in ``temp.stale``) and return those of them in the
        report asked for, to price, in id order."""
        db = self.db
        db.execute("BEGIN")
        self._seen = self._read_seen()
        self._now_seen = (
            self._max("s.events", "id"),
            self._max("s.attempts", "rowid"),
            self._max("s.jobs", "id"),
            self._max("s.attempt_edits", "seq"),
            *self._latest_update(),
        )
        now, seen = self._now_seen, self._seen  # every id and time only grows: else rebuild
        grown = now[0] >= seen[0] and now[1] >= seen[1] and now[2] >= seen[2] and now[3] >= seen[3]
        self.trusted = seen != UNSEEN and grown and now[4] >= seen[4]
        self._candidates()
        ended = (
            f"j.state IN ({','.join('?' * len(TERMINAL))})"
            " AND NOT EXISTS (SELECT 1 FROM s.attempts a WHERE a.job_id=j.id AND a.ended_at IS NULL)"
        )
        match = " AND ".join(f"r.fp_{c} IS j.{c}" for c in FINGERPRINT)
        rows = db.execute(
            f"SELECT c.job_id, j.id IS NOT NULL, {', '.join(f'j.{c}' for c in FINGERPRINT)}, ifnull({ended}, 0),"
            " EXISTS (SELECT 1 FROM s.attempts a WHERE a.job_id=c.job_id),"
            f" r.rid, r.rid IS NOT NULL AND NOT c.dirty AND {match} AND {ended} AND ?"
            " FROM temp.cand c LEFT JOIN s.jobs j ON j.id=c.job_id LEFT JOIN rows r ON r.digest=? AND r.job_id=c.job_id"
            " ORDER BY c.job_id",
            (*TERMINAL, *TERMINAL, int(self.trusted), self.digest),
        ).fetchall()
        wanted = None if filters.job_ids is None else set(filters.job_ids)
        misses, stale, unpriced = [], [], []
        for job_id, exists, *fingerprint, is_ended, attempted, rid, valid in (tuple(r) for r in rows):
            fp = tuple(fingerprint)
            if valid:
                continue
            if rid is not None:
                stale.append((rid,))
            if not exists:
                continue
            unpriced.append((job_id, int(bool(attempted))))
            team = fp[FINGERPRINT.index("team")]
            if (not filters.team or team == filters.team) and (wanted is None or job_id in wanted):
                misses.append(Miss(job_id, fp, bool(is_ended), bool(attempted)))
        db.executemany("INSERT OR IGNORE INTO temp.stale VALUES (?)", stale)
        db.executemany("INSERT INTO temp.unpriced VALUES (?, ?)", unpriced)
        return misses

    def _read_seen(self) -> Seen:
        row = self.db.execute("SELECT seen FROM digests WHERE digest=?", (self.digest,)).fetchone()
        try:
            seen = json.loads(row[0])
        except (TypeError, ValueError):
            return UNSEEN
        ok = (
            isinstance(seen, list)
            and len(seen) == 6
            and all(isinstance(v, int) and v >= 0 for v in seen[:4])
            and isinstance(seen[4], (int, float))
            and math.isfinite(seen[4])
            and isinstance(seen[5], list)
            and all(isinstance(v, int) for v in seen[5])
        )
        return (seen[0], seen[1], seen[2], seen[3], float(seen[4]), tuple(seen[5])) if ok else UNSEEN

    def _max(self, table: str, column: str) -> int:
        value = self.db.execute(f"SELECT max({column}) FROM {table}").fetchone()[0]
        return value if isinstance(value, int) and value >= 0 else 0

    def _latest_update(self) -> tuple[float, tuple[int, ...]]:
        """The latest ``updated_at`` of a job, and the jobs written then (from the index)."""
        value = self.db.execute("SELECT max(updated_at) FROM s.jobs").fetchone()[0]
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return 0.0, ()
        ids = self.db.execute("SELECT id FROM s.jobs WHERE updated_at = ? ORDER BY id", (value,))
        return float(value), tuple(int(j) for (j,) in ids)

    def _candidates(self) -> None:
        """``temp.cand``: the jobs to look at (all of them when the rows cannot be trusted; else those watched,
        new since, or written about since, ``dirty``); ``stale``: rows not to use; ``unpriced``: jobs left
        without a valid row (watched from now on unless priced and kept); ``fresh``: this read's prices."""
        db = self.db
        for table in ("cand", "stale", "unpriced", "fresh", "live_fresh"):
            db.execute(f"DROP TABLE IF EXISTS temp.{table}")
        db.execute("CREATE TEMP TABLE cand (job_id INTEGER PRIMARY KEY, dirty INTEGER NOT NULL)")
        db.execute("CREATE TEMP TABLE stale (rid INTEGER PRIMARY KEY)")
        db.execute("CREATE TEMP TABLE unpriced (job_id INTEGER PRIMARY KEY, attempted INTEGER NOT NULL)")
        db.execute(
            f"""CREATE TEMP TABLE fresh (job_id INTEGER PRIMARY KEY, {", ".join(f"fp_{c}" for c in FINGERPRINT)},
            keep INTEGER NOT NULL, shown INTEGER NOT NULL, team TEXT NOT NULL, name TEXT NOT NULL,
            last_end REAL NOT NULL, {", ".join(COST_COLUMNS)}, json TEXT NOT NULL)"""
        )
        if not self.trusted:
            db.execute("INSERT INTO temp.cand SELECT id, 1 FROM s.jobs")
            return
        events, attempts, jobs, edits, updated, _ = self._seen
        db.execute("INSERT OR IGNORE INTO temp.cand SELECT job_id, 1 FROM s.events WHERE id > ?", (events,))
        db.execute("INSERT OR IGNORE INTO temp.cand SELECT job_id, 1 FROM s.attempts WHERE rowid > ?", (attempts,))
        db.execute("INSERT OR IGNORE INTO temp.cand SELECT job_id, 1 FROM s.attempt_edits WHERE seq > ?", (edits,))
        db.execute("INSERT OR IGNORE INTO temp.cand SELECT id, 0 FROM s.jobs WHERE id > ?", (jobs,))
        written = db.execute("SELECT id, updated_at FROM s.jobs WHERE updated_at >= ?", (updated,)).fetchall()
        db.executemany("INSERT OR IGNORE INTO temp.cand VALUES (?, 0)", ((j,) for j, _ in written))
        then = set(self._seen[5])  # the jobs written at the latest time seen: a record written since is later,
        self._records = {int(j) for j, at in written if at > updated or j not in then}  # or by another job
        # A watched job that had no attempt, and nothing written about it or its record since, still has none: a
        # queued job costs nothing, so it is not looked at (at 100,000 jobs, two thirds of those watched).
        db.execute(
            "INSERT OR IGNORE INTO temp.cand SELECT job_id, 0 FROM watch WHERE digest=? AND attempted", (self.digest,)
        )

    def add(
        self, miss: Miss, *, team: str, name: str, last_end: float, cost: Cost | None, shown: bool, text: str
    ) -> None:
        """A job priced now. ``cost`` ``None``: it has no attempt, so no row in any report (kept if it ended,
        so that it is not looked at again); ``shown``: in this report (``since`` may leave it out);
        ``text``: its ``--json`` entry (needed when it is kept, or printed). Written by :meth:`flush`."""
        values, sane = cost_values(Cost() if cost is None else cost)
        keep = miss.ended and sane
        row = (miss.job_id, *miss.fingerprint, int(keep), int(shown and cost is not None), team, name, last_end)
        self._added.append((*row, *values, text))

    def flush(self) -> None:
        """Write the jobs :meth:`add` priced into ``temp.fresh``, in one statement (what the reads then see)."""
        self.db.executemany(f"INSERT OR REPLACE INTO temp.fresh VALUES ({','.join('?' * _FRESH_COLUMNS)})", self._added)
        self._added = []

    # ---- writing ----------------------------------------------------------------------------
    def store(self, now: float) -> bool:
        """Keep the rows priced now of jobs that ended, forget the stale ones, watch the rest; end the read.

        ``False`` when another process wrote the cache since :meth:`lookup`: its rows stand, and these
        are given up rather than written over a newer state (they are priced again next time).
        """
        db = self.db
        self.flush()
        if self.trusted and self._seen == self._now_seen and not self._changes():
            db.execute("COMMIT")  # nothing new: no write, no lock
            return True
        digest = self.digest
        fields = ", ".join(("job_id", *(f"fp_{c}" for c in FINGERPRINT), "team", "name", "last_end", *COST_COLUMNS))
        try:
            if not self.trusted:
                db.execute("DELETE FROM rows WHERE digest=?", (digest,))
                db.execute("DELETE FROM watch WHERE digest=?", (digest,))
            db.execute("DELETE FROM rows WHERE rid IN (SELECT rid FROM temp.stale)")
            db.execute(f"INSERT INTO rows (digest, {fields}) SELECT ?, {fields} FROM temp.fresh WHERE keep", (digest,))
            db.execute(
                "INSERT INTO frags SELECT r.rid, f.json FROM temp.fresh f"
                " JOIN rows r ON r.digest=? AND r.job_id=f.job_id WHERE f.keep",
                (digest,),
            )
            db.execute("DELETE FROM watch WHERE digest=? AND job_id IN (SELECT job_id FROM temp.cand)", (digest,))
            db.execute(
                "INSERT INTO watch SELECT ?, job_id, attempted FROM temp.unpriced"
                " WHERE job_id NOT IN (SELECT job_id FROM temp.fresh WHERE keep)",
                (digest,),
            )
            self._keep_live()
            db.execute("INSERT OR REPLACE INTO digests VALUES (?, ?, ?)", (digest, now, json.dumps(self._now_seen)))
            self._drop_old_digests()
            db.execute("COMMIT")
        except sqlite3.OperationalError:  # busy, or this read's snapshot is stale: another process wrote it
            db.execute("ROLLBACK")
            return False
        return True

    def _keep_live(self) -> None:
        """Keep the watched jobs' pricing inputs read or brought up to date now (:mod:`gpufleet.cost.live`);
        forget those of the jobs no longer watched, and of the jobs written about that this read left out.

        A read for one team or some jobs (``--team``, ``--job``) prices only those, yet the marks it stores
        say everything written so far was seen: a left-out job's kept inputs would be taken as current by
        the next read, which would price it from them without what was written meanwhile. Forgotten, they
        are read again whole then.
        """
        db, digest = self.db, self.digest
        fresh = self._has("live_fresh")
        if fresh:
            db.execute(
                "INSERT OR REPLACE INTO live SELECT ?, job_id, spec_key, seen, body, priced FROM temp.live_fresh"
                " WHERE job_id IN (SELECT job_id FROM watch WHERE digest=?)",
                (digest, digest),
            )
        db.execute(
            "DELETE FROM live WHERE digest=? AND job_id IN (SELECT job_id FROM temp.cand)"
            " AND job_id NOT IN (SELECT job_id FROM watch WHERE digest=?)",
            (digest, digest),
        )
        refreshed = "SELECT job_id FROM temp.live_fresh" if fresh else "SELECT NULL WHERE 0"
        db.execute(
            f"DELETE FROM live WHERE digest=? AND job_id IN (SELECT job_id FROM temp.cand WHERE dirty)"
            f" AND job_id NOT IN ({refreshed})",
            (digest,),
        )
        if self._records:
            kept = {int(j) for (j,) in db.execute(refreshed)}
            db.executemany(
                "DELETE FROM live WHERE digest=? AND job_id=?", ((digest, j) for j in sorted(self._records - kept))
            )

    def _has(self, table: str) -> bool:
        return self.db.execute("SELECT 1 FROM temp.sqlite_master WHERE name=?", (table,)).fetchone() is not None

    def dirty(self) -> set[int]:
        """The jobs of this read written about since the last one (events, attempts, their record), or all if the
        rows are not trusted."""
        written = {int(j) for (j,) in self.db.execute("SELECT job_id FROM temp.cand WHERE dirty")}
        return written | self._records

    def _changes(self) -> bool:
        """Whether this read found anything to write: rows gone stale, rows to keep, jobs to watch or not,
        pricing inputs read again."""
        db = self.db
        if db.execute("SELECT 1 FROM temp.stale UNION ALL SELECT 1 FROM temp.fresh WHERE keep LIMIT 1").fetchone():
            return True
        if self._has("live_fresh") and db.execute("SELECT 1 FROM temp.live_fresh LIMIT 1").fetchone():
            return True
        watched = db.execute(
            "SELECT count(*) FROM watch WHERE digest=? AND job_id IN (SELECT job_id FROM temp.cand)", (self.digest,)
        ).fetchone()[0]
        same = db.execute(
            "SELECT count(*) FROM temp.unpriced u JOIN watch w ON w.digest=? AND w.job_id=u.job_id"
            " AND w.attempted=u.attempted",
            (self.digest,),
        ).fetchone()[0]
        unpriced = db.execute("SELECT count(*) FROM temp.unpriced").fetchone()[0]
        return not watched == same == unpriced  # a job watched or not, or one that has attempts now

    def _drop_old_digests(self) -> None:
        kept = f"SELECT digest FROM digests ORDER BY used DESC LIMIT {KEPT_DIGESTS}"
        for table in ("rows", "watch", "sums", "live"):
            self.db.execute(f"DELETE FROM {table} WHERE digest NOT IN ({kept})")
        self.db.execute(f"DELETE FROM digests WHERE digest NOT IN ({kept})")


__all__ = [
    "CACHE_VERSION",
    "COST_COLUMNS",
    "FINGERPRINT",
    "ROW_COLUMNS",
    "SUMMED",
    "CostCache",
    "Filters",
    "Miss",
    "cost_from",
    "cost_values",
    "pricing_digest",
]
