"""The embedded state store: jobs, attempts, events and requests in one SQLite file.

WAL mode lets the CLI read while the scheduler writes; every write is one short transaction.
The scheduler is the only process that changes job and attempt states; the CLI inserts jobs and
requests (preempt, cancel), which the scheduler acts on, and replaces the spec of a job that has
not ended (resize), which the scheduler reads when it starts the job's next attempt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpufleet.errors import Conflict, NotFound, SpecError, StoreError, UsageError
from gpufleet.jobs.events import MAX_TS, EventKind
from gpufleet.jobs.states import JobState as JobState  # re-exported: where jobs are defined
from gpufleet.jobs.states import Outcome as Outcome
from gpufleet.paths import private_dir

if TYPE_CHECKING:  # the spec's models are built when a spec is first read, not by every command that opens the store
    from gpufleet.spec import JobSpec

JOBS_PAGE = 50
"""Jobs a listing shows by default: the newest ones (``gpufleet jobs --limit/--all``, ``GET /api/jobs?limit=``)."""

TERMINAL = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
"""The states a job never leaves."""

_V1_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL, team TEXT NOT NULL, priority INTEGER NOT NULL,
    backend TEXT NOT NULL, state TEXT NOT NULL, spec TEXT NOT NULL,
    submitted_at REAL NOT NULL, updated_at REAL NOT NULL,
    restarts INTEGER NOT NULL DEFAULT 0, reason TEXT, env TEXT NOT NULL DEFAULT '{}',
    events_offset INTEGER NOT NULL DEFAULT 0
)""",
    """CREATE TABLE IF NOT EXISTS attempts (
    job_id INTEGER NOT NULL REFERENCES jobs(id), n INTEGER NOT NULL,
    state TEXT NOT NULL, pid INTEGER, started_at REAL NOT NULL, ended_at REAL,
    exit_code INTEGER, outcome TEXT, sigterm_at REAL, kill_at REAL,
    PRIMARY KEY (job_id, n)
)""",
    """CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, attempt INTEGER,
    ts REAL NOT NULL, kind TEXT NOT NULL, source TEXT NOT NULL, data TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS events_job ON events(job_id, ts)",
    """CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, kind TEXT NOT NULL,
    grace REAL, created_at REAL NOT NULL, handled_at REAL
)""",
)


def _create_tables(db: sqlite3.Connection) -> None:
    """1: jobs, attempts, events, requests, and ``meta``."""
    for statement in _V1_SCHEMA:
        db.execute(statement)


def _add_backend_ref(db: sqlite3.Connection) -> None:
    """2: ``jobs.backend_ref``, the scheduler's own id for a job (remote backends).

    gpufleet before numbered migrations added this column while staying at version 1, so a
    version 1 database may have it already.
    """
    if "backend_ref" not in _columns(db, "jobs"):
        db.execute("ALTER TABLE jobs ADD COLUMN backend_ref TEXT")


def _index_jobs(db: sqlite3.Connection) -> None:
    """3: indexes on the jobs table for a store of 100,000 jobs: ``jobs(state, priority DESC)`` (a page or a count by
    state, the queue's head in the scheduler's order), ``jobs(team, state)`` (a page or a count by team, the counts
    per team and state from the index alone) and ``jobs(updated_at, state)`` (the jobs that changed last). On the
    jobs table only: a store of 100,000 jobs migrates in a fraction of a second, where an index on ``events`` would
    read every event (gigabytes) while it holds the write lock."""
    db.execute("CREATE INDEX IF NOT EXISTS jobs_queue ON jobs(state, priority DESC)")
    db.execute("CREATE INDEX IF NOT EXISTS jobs_team_state ON jobs(team, state)")
    db.execute("CREATE INDEX IF NOT EXISTS jobs_updated ON jobs(updated_at, state)")


def _index_open_requests(db: sqlite3.Connection) -> None:
    """4: a partial index on the requests not yet handled, which the local scheduler looks for at every round:
    without it that look scans every request ever made (each ``cancel``, ``stop`` or ``resize`` leaves one),
    a cost that grew with the home's age. Small: it holds only the open requests."""
    db.execute("CREATE INDEX IF NOT EXISTS requests_open ON requests(id) WHERE handled_at IS NULL")


def _log_attempt_edits(db: sqlite3.Connection) -> None:
    """5: ``attempt_edits``, each job whose attempts were last changed in place (updated or deleted), with a number
    that grows at every such change (``seq``), kept by triggers on ``attempts``.

    A new attempt shows in the attempts' growing ``rowid``, but a changed one (its end written, a time corrected by
    hand) shows nowhere else: a reader that keeps figures derived from the attempts (the cost cache) reads the jobs
    changed since the ``seq`` it saw last, from the index, instead of reading every attempt ever made to find out.
    One row per job (the newest change), so the table grows with the jobs, not with the changes; the triggers are
    part of the database, so a change made with the ``sqlite3`` shell is logged too."""
    db.execute("CREATE TABLE IF NOT EXISTS attempt_edits (job_id INTEGER PRIMARY KEY, seq INTEGER NOT NULL)")
    db.execute("CREATE INDEX IF NOT EXISTS attempt_edits_seq ON attempt_edits(seq)")
    log = (
        "INSERT OR REPLACE INTO attempt_edits (job_id, seq)"
        " VALUES ({}.job_id, (SELECT ifnull(max(seq), 0) + 1 FROM attempt_edits));"
    )
    for name, when, row in (
        ("attempts_updated", "AFTER UPDATE ON attempts", "new"),
        ("attempts_moved", "AFTER UPDATE OF job_id ON attempts WHEN old.job_id IS NOT new.job_id", "old"),
        ("attempts_deleted", "AFTER DELETE ON attempts", "old"),
    ):
        db.execute(f"CREATE TRIGGER IF NOT EXISTS {name} {when} BEGIN {log.format(row)} END")


_ACTIVE = f"state NOT IN ({', '.join(repr(str(s)) for s in TERMINAL)})"
"""Not ended, as SQL with the states written out: what lets SQLite use the partial index ``jobs_active``."""


def _index_active_jobs(db: sqlite3.Connection) -> None:
    """6: a partial index of the jobs not ended, by backend, which every command that reads the store asks about
    each backend (:meth:`Store.has_active`, before it syncs a remote scheduler): without it that question
    read the whole jobs table for each backend with no job (40 ms a backend at 100,000 jobs). Small: it holds only
    the jobs queued or running."""
    db.execute(f"CREATE INDEX IF NOT EXISTS jobs_active ON jobs(backend) WHERE {_ACTIVE}")


MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _create_tables,
    _add_backend_ref,
    _index_jobs,
    _index_open_requests,
    _log_attempt_edits,
    _index_active_jobs,
)
"""Migration ``N`` (``MIGRATIONS[N - 1]``) takes a database from version ``N - 1`` to ``N``.

Append only: a released migration never changes, and a new one also bumps ``SCHEMA_VERSION`` (its
length). The version lives in ``PRAGMA user_version``, mirrored in ``meta.schema_version`` (which
gpufleet before numbered migrations reads, and refuses a database newer than it by).
"""
SCHEMA_VERSION = len(MIGRATIONS)


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {str(r[1]) for r in db.execute(f"PRAGMA table_info({table})")}


def _schema_version(db: sqlite3.Connection) -> int:
    """The database's version: ``user_version``, or for one written before it was kept there, ``meta``'s."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version == 0 and db.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone() is not None:
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        version = int(row[0]) if row is not None else 0
    return version


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the database to ``SCHEMA_VERSION`` in one transaction; refuse one newer than this code."""

    def refuse_newer(version: int) -> None:
        if version > SCHEMA_VERSION:
            raise UsageError(
                f"state database {path} has schema version {version}, newer than this gpufleet knows "
                f"({SCHEMA_VERSION}): a newer gpufleet wrote it; upgrade gpufleet (pip install -U gpufleet), "
                "or set GPUFLEET_HOME to another folder"
            )

    version = _schema_version(db)
    refuse_newer(version)
    if version == SCHEMA_VERSION:
        return  # the usual open: a read, no write lock
    db.execute("BEGIN IMMEDIATE")
    try:
        version = _schema_version(db)  # another process may have migrated it meanwhile
        refuse_newer(version)
        for migration in MIGRATIONS[version:]:
            migration(db)
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION:d}")
    except BaseException:
        if db.in_transaction:  # SQLite may have rolled it back itself (a full disk)
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


MAX_ROW_ID = 2**63 - 1
"""The largest id SQLite can store (a larger one overflows its integer)."""


def _damaged(path: Path, problem: object) -> StoreError:
    """The one error a state database that is not one, or no longer one, gives (nothing rebuilds it)."""
    detail = " ".join(str(problem).split())[:200]  # quick_check's report spans lines
    return StoreError(
        f"state database {path} is damaged or not a database ({detail}): gpufleet cannot rebuild it; "
        f"move the folder {path.parent} aside (its jobs/ folders keep their logs and checkpoints) "
        "or set GPUFLEET_HOME to another folder"
    )


def _store_error(err: sqlite3.DatabaseError, path: Path) -> StoreError | None:
    """The ``StoreError`` SQLite's ``err`` stands for (a full disk, a damaged file); ``None``: a bug, re-raise it."""
    if isinstance(err, sqlite3.OperationalError) and "full" in str(err):
        return StoreError(
            f"no space left on {path.parent}: the state database cannot be written ({err}); "
            "free some space there and gpufleet carries on"
        )
    if type(err) is sqlite3.DatabaseError:  # SQLITE_CORRUPT or SQLITE_NOTADB: the file, not the statement
        return _damaged(path, err)
    return None


CHECKED_TABLES = ("meta", "jobs", "attempts", "requests")
"""Tables whose pages every open checks (``PRAGMA quick_check``): small, and what every command reads
first. Not ``events``, which grows with every step reported: a damaged page of it is reported when
a query reaches it (``_Cursor``)."""


_SOUND_FILES: dict[str, tuple[int, int, int, int]] = {}
"""Per database path, the file (device, inode, size, modification time) this process last found sound.

The check reads every page of the small tables: 0.15 s for a store of 100,000 jobs, which a server that
opens the store at each request would pay each time. A file that has not changed since it passed is
not checked again (a write, a checkpoint of the WAL, a replaced file: checked again); what goes bad
later is reported when a query reaches it (``_Cursor``), as for ``events``."""


def _file_key(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _sound_marker(path: Path) -> Path:
    """Where the file key of the last check that passed is kept, for the next process (``state.db.sound``)."""
    return path.with_name(path.name + ".sound")


def _check_pages(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a database whose first page opens but whose small tables are damaged (``StoreError``).

    Not again for a file unchanged since a check passed, in this process or, through :func:`_sound_marker`,
    in another one: every `gpufleet jobs` on a store of 100,000 jobs would otherwise read 100 MB first.
    """
    key = _file_key(path)
    marker = _sound_marker(path)
    if key is not None and _SOUND_FILES.get(str(path)) == key:
        return
    if key is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if marker.read_text(encoding="ascii").strip() == " ".join(map(str, key)):
                _SOUND_FILES[str(path)] = key
                return
    for table in CHECKED_TABLES:
        rows = db.execute(f"PRAGMA quick_check({table})").fetchall()
        if [tuple(r) for r in rows] != [("ok",)]:
            raise _damaged(path, rows[0][0] if rows else f"no answer checking {table}")
    if key is not None:
        _SOUND_FILES[str(path)] = key
        with contextlib.suppress(OSError):  # a read-only home checks each time
            tmp = marker.with_name(f"{marker.name}.{os.getpid()}")
            tmp.write_text(" ".join(map(str, key)) + "\n", encoding="ascii")
            os.replace(tmp, marker)


def _job_filter(states: Sequence[str] | None, team: str | None) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause and its arguments of a listing of jobs in ``states`` (any) of ``team`` (any)."""
    where, args = " WHERE 1=1", list[Any]()
    if states:
        where += f" AND state IN ({','.join('?' * len(states))})"
        args += list(states)
    if team:
        where += " AND team=?"
        args.append(team)
    return where, args


class _Cursor(sqlite3.Cursor):
    """A cursor that reports a damaged database as a ``StoreError`` while rows are read, too.

    SQLite reads pages as a query reaches them: a file whose first page is sound opens, and its
    damage only shows when a query steps onto a broken page.
    """

    def _raise(self, err: sqlite3.DatabaseError) -> None:
        connection = self.connection
        problem = _store_error(err, connection.path if isinstance(connection, _Connection) else Path("state.db"))
        if problem is not None:
            raise problem from None

    def fetchone(self) -> Any:
        try:
            return super().fetchone()
        except sqlite3.DatabaseError as err:
            self._raise(err)
            raise

    def fetchall(self) -> list[Any]:
        try:
            return super().fetchall()
        except sqlite3.DatabaseError as err:
            self._raise(err)
            raise

    def __next__(self) -> Any:
        try:
            return super().__next__()
        except sqlite3.DatabaseError as err:
            self._raise(err)
            raise


class _Connection(sqlite3.Connection):
    """A connection that turns SQLite's "disk is full" and "malformed" into one clear ``StoreError``."""

    path: Path = Path("state.db")

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        try:
            return self.cursor(_Cursor).execute(sql, parameters)
        except sqlite3.DatabaseError as err:
            problem = _store_error(err, self.path)
            if problem is None:
                raise
            raise problem from None


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    name: str
    team: str
    priority: int
    backend: str
    state: JobState
    spec: JobSpec
    submitted_at: float
    updated_at: float
    restarts: int
    reason: str | None
    env: dict[str, str]
    events_offset: int
    backend_ref: str | None = None
    """The scheduler's own id for the job (a Slurm job id), when it has one."""


@dataclass(frozen=True, slots=True)
class Attempt:
    job_id: int
    n: int
    state: str
    pid: int | None
    started_at: float
    ended_at: float | None
    exit_code: int | None
    outcome: Outcome | None
    sigterm_at: float | None
    kill_at: float | None


@dataclass(frozen=True, slots=True)
class Event:
    job_id: int
    attempt: int | None
    ts: float
    kind: str
    source: str
    data: dict[str, Any]


_UPSERT_ATTEMPT = (
    "INSERT OR REPLACE INTO attempts (job_id, n, state, pid, started_at, ended_at, exit_code, outcome,"
    " sigterm_at, kill_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
"""Every field of :class:`Attempt`, in its order."""


@dataclass(frozen=True, slots=True)
class SyncEvent:
    """A backend event a sync records (``attempt_start``, ``sigterm``, ``attempt_end``, ...)."""

    kind: str
    attempt: int | None
    ts: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What one sync of a remote backend writes, in one transaction (:meth:`Store.apply_sync`)."""

    attempts: tuple[Attempt, ...]
    """Attempts that changed since the store last saw them."""
    events: tuple[SyncEvent, ...]
    state: str
    reason: str | None
    restarts: int

    def moves(self, job: Job) -> bool:
        """Whether the job row changes."""
        return (self.state, self.restarts) != (job.state, job.restarts) or self.reason not in (None, job.reason)


class Store:
    """A handle on ``state.db``; cheap to open, one per process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        private_dir(path.parent)  # the database holds each job's env, which may hold tokens
        if not path.exists():
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        db: _Connection | None = None
        try:
            db = sqlite3.connect(path, timeout=30.0, isolation_level=None, factory=_Connection)
            db.path = path
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            _migrate(db, path)
            _check_pages(db, path)
        except BaseException as err:
            if db is not None:
                db.close()
            if isinstance(err, sqlite3.DatabaseError):
                raise _damaged(path, err) from None
            raise
        self._db = db

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ---- jobs ----------------------------------------------------------------------------
    def add_job(self, spec: JobSpec, backend: str, env: dict[str, str] | None = None) -> int:
        stored = _stored_spec(spec)
        now = time.time()
        with self.transaction() as db:
            cur = db.execute(
                "INSERT INTO jobs (name, team, priority, backend, state, spec, submitted_at, updated_at, env)"
                " VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?)",
                (spec.name, spec.team, spec.priority, backend, stored, now, now, json.dumps(env or {})),
            )
            job_id = int(cur.lastrowid or 0)
            db.execute(
                "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, NULL, ?, ?, 'backend', ?)",
                (job_id, now, EventKind.QUEUED, json.dumps({"priority": spec.priority})),
            )
        return job_id

    def replace_spec(self, job_id: int, old: JobSpec, new: JobSpec, kind: str, **data: Any) -> None:
        """Give a job that has not ended ``new`` for its next attempts, with a ``kind`` event, in one transaction.

        A compare-and-set: it is written only if the job still has ``old`` and has not ended, so two
        resizes at once cannot both win, and a job that ended meanwhile is left as it ended. An
        attempt already running keeps the spec it started with (the scheduler holds its copy); the
        job's ``spec.json`` follows when its next attempt starts (``write_spec_file``).
        """
        stored = _stored_spec(new)
        now = time.time()
        with self.transaction() as db:
            row = db.execute("SELECT spec, state FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is None:
                raise NotFound(f"no job {job_id} in {self.path} (list them with `gpufleet jobs`)")
            if row["state"] in TERMINAL:
                raise Conflict(f"job {job_id} is already {row['state']}: an ended job keeps the spec it ran with")
            from gpufleet.spec import parse_spec

            if parse_spec(json.loads(row["spec"]), source=f"job {job_id}") != old:
                raise Conflict(
                    f"job {job_id} was resized by another command meanwhile: see `gpufleet show {job_id}`, "
                    "then run this one again if it is still needed"
                )
            db.execute("UPDATE jobs SET spec=?, updated_at=? WHERE id=?", (stored, now, job_id))
            db.execute(
                "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, NULL, ?, ?, 'backend', ?)",
                (job_id, now, kind, json.dumps(data)),
            )

    def _job(self, row: sqlite3.Row) -> Job:
        """The job a row holds; one whose state or spec is unreadable is ``broken`` (and failed, if it had not ended).

        One unreadable job must not stop the others from being listed, priced or scheduled: values a
        hand edit or an older writer left of the wrong type read as harmless ones.
        """
        reason = row["reason"] if isinstance(row["reason"], str) else None
        problem, state = None, _enum(JobState, row["state"])
        if state is None:
            problem = f"its stored state {str(row['state'])[:40]!r} is not a job state"
        try:
            from gpufleet.spec import parse_spec

            spec = parse_spec(json.loads(row["spec"]), source=f"job {row['id']}")
        except (TypeError, ValueError, RecursionError, SpecError) as err:
            spec = _placeholder_spec(row["name"], row["team"])
            problem = f"its stored spec does not validate ({str(err).splitlines()[0][:200]})"
        if problem is not None:
            reason = f"broken: {problem}"
            if state not in TERMINAL:
                state = JobState.FAILED
                self.set_job_state(row["id"], state, reason=reason)
        try:
            env = json.loads(row["env"])
        except (TypeError, ValueError, RecursionError):
            env = {}
        submitted_at = _time(row["submitted_at"])
        updated_at = _time(row["updated_at"])
        ref = row["backend_ref"]
        return Job(
            id=row["id"],
            name=str(row["name"]),
            team=str(row["team"]),
            priority=_integer(row["priority"]),
            backend=str(row["backend"]),
            state=state or JobState.FAILED,
            spec=spec,
            submitted_at=submitted_at if submitted_at is not None else updated_at or 0.0,
            updated_at=updated_at if updated_at is not None else submitted_at or 0.0,
            restarts=max(0, _integer(row["restarts"])),
            reason=reason,
            env={str(k): v for k, v in env.items() if isinstance(v, str)} if isinstance(env, dict) else {},
            events_offset=max(0, _integer(row["events_offset"])),
            backend_ref=None if ref is None else str(ref),
        )

    def job(self, job_id: int) -> Job:
        row = None if not 0 < job_id <= MAX_ROW_ID else self._db.execute("SELECT * FROM jobs WHERE id=?", (job_id,))
        row = row.fetchone() if row is not None else None
        if row is None:
            raise NotFound(f"no job {job_id} in {self.path} (list them with `gpufleet jobs`)")
        return self._job(row)

    def jobs(self, *, states: Sequence[str] | None = None, team: str | None = None) -> list[Job]:
        where, args = _job_filter(states, team)
        found = [self._job(r) for r in self._db.execute("SELECT * FROM jobs" + where + " ORDER BY id", args).fetchall()]
        return [j for j in found if not states or j.state in states]  # a broken job was just failed

    def job_page(
        self, *, states: Sequence[str] | None = None, team: str | None = None, limit: int | None, offset: int = 0
    ) -> tuple[list[Job], int]:
        """The newest ``limit`` jobs (``None``: all) after skipping the ``offset`` newest, oldest first; and how many
        jobs match in all. Two indexed queries: a page of a store of 100,000 jobs parses only its own specs."""
        where, args = _job_filter(states, team)
        total = int(self._db.execute("SELECT COUNT(*) FROM jobs" + where, args).fetchone()[0])
        page = " LIMIT ? OFFSET ?" if limit is not None else " LIMIT -1 OFFSET ?"
        bounds = [limit, offset] if limit is not None else [offset]
        rows = self._db.execute("SELECT * FROM jobs" + where + " ORDER BY id DESC" + page, [*args, *bounds]).fetchall()
        found = [self._job(r) for r in reversed(rows)]
        return [j for j in found if not states or j.state in states], total  # a broken job was just failed

    def queued_ids(self, page: int = 64) -> Iterator[int]:
        """The queued jobs' ids in the order a strict-priority queue serves them (priority, then age), read ``page``
        at a time down the ``(state, priority)`` index and no spec parsed: a scheduler that stops at the head of
        10,000 waiting jobs reads one page, not the queue.

        Each page goes on after the last id given (by its priority and id), so jobs that start or arrive
        between two pages neither repeat nor shift the walk."""
        sql = "SELECT priority, id FROM jobs WHERE state='queued'{} ORDER BY priority DESC, id LIMIT ?"
        rows = self._db.execute(sql.format(""), (page,)).fetchall()
        while rows:
            yield from (int(r[1]) for r in rows)
            if len(rows) < page:
                return
            priority, last = rows[-1][0], rows[-1][1]
            after = " AND (priority < ? OR (priority = ? AND id > ?))"
            rows = self._db.execute(sql.format(after), (priority, priority, last, page)).fetchall()

    def count_jobs(self, *, team: str | None = None) -> int:
        """How many jobs (of ``team``) the store holds: one query, no spec parsed."""
        if team is None:
            return int(self._db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])
        return int(self._db.execute("SELECT COUNT(*) FROM jobs WHERE team=?", (team,)).fetchone()[0])

    # ---- the fleet page: counts and short lists, whatever the store's size ---------------------
    def job_counts(self) -> list[tuple[str, str, int]]:
        """``(team, state, jobs)`` for each team and state that has jobs: counted by SQLite from the ``(team, state)``
        index alone, no row read and no spec parsed. States are as stored (a hand edit's too)."""
        rows = self._db.execute("SELECT team, state, COUNT(*) FROM jobs GROUP BY team, state")
        return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]

    def queue_head(self, limit: int) -> list[Job]:
        """The first ``limit`` queued jobs in the order the scheduler serves them (priority, then age, as
        :meth:`queued_ids`): the ``(state, priority)`` index read in order, so 10,000 waiting cost what ten do."""
        sql = "SELECT * FROM jobs WHERE state='queued' ORDER BY priority DESC, id LIMIT ?"
        found = [self._job(r) for r in self._db.execute(sql, (limit,)).fetchall()]
        return [j for j in found if j.state == JobState.QUEUED]  # a broken job was just failed

    def latest_updated(self, limit: int, *, states: Sequence[str] | None = None) -> list[tuple[int, str, str, Any]]:
        """``(id, name, state, updated_at)`` of the ``limit`` jobs (in ``states``) whose row changed last, newest
        first: the ``updated_at`` index walked backwards, no spec parsed. ``updated_at`` as stored."""
        where = f" WHERE +state IN ({','.join('?' * len(states))})" if states else ""  # +: by updated_at, not state
        args: list[Any] = [*(states or ()), limit]
        sql = f"SELECT id, name, state, updated_at FROM jobs{where} ORDER BY updated_at DESC, id DESC LIMIT ?"
        return [(int(r[0]), str(r[1]), str(r[2]), r[3]) for r in self._db.execute(sql, args)]

    def jobs_by_id(self, ids: Sequence[int]) -> list[Job]:
        """The jobs of ``ids`` that exist, by id (a short list: one query, one spec parsed each)."""
        if not ids:
            return []
        rows = self._db.execute(f"SELECT * FROM jobs WHERE id IN ({','.join('?' * len(ids))}) ORDER BY id", list(ids))
        return [self._job(r) for r in rows.fetchall()]

    def job_names(self, ids: Sequence[int]) -> dict[int, str]:
        """The name of each job of ``ids`` that exists (one query, no spec parsed)."""
        if not ids:
            return {}
        rows = self._db.execute(f"SELECT id, name FROM jobs WHERE id IN ({','.join('?' * len(ids))})", list(ids))
        return {int(r[0]): str(r[1]) for r in rows}

    def running_latest_attempts(self) -> list[tuple[int, str, int, Any]]:
        """``(job, backend, attempt, started_at)`` of each running job's latest attempt: one query over the
        ``state`` index and the attempts' key, no event read. ``started_at`` as stored."""
        sql = (
            "SELECT j.id, j.backend, a.n, a.started_at FROM jobs j JOIN attempts a ON a.job_id=j.id"
            " WHERE j.state='running' AND a.n=(SELECT MAX(n) FROM attempts WHERE job_id=j.id) ORDER BY j.id"
        )
        return [(int(r[0]), str(r[1]), int(r[2]), r[3]) for r in self._db.execute(sql)]

    def attempt_start_data(self, job_id: int, attempt: int, started_at: Any) -> str | None:
        """The stored data of attempt ``attempt``'s own ``attempt_start`` event from the backend (what
        :func:`attempt_gpus` reads first), ``None`` where there is none at or after ``started_at``: found by the
        ``(job_id, ts)`` index from the attempt's start on, where backends write it, not among every event."""
        sql = (
            "SELECT data FROM events WHERE job_id=? AND ts>=? AND attempt=? AND kind=? AND source='backend'"
            " ORDER BY ts, id LIMIT 1"
        )
        row = self._db.execute(sql, (job_id, started_at, attempt, EventKind.ATTEMPT_START)).fetchone()
        return row[0] if row is not None and isinstance(row[0], str) else None

    def has_active(self, backend: str) -> bool:
        """Whether any job of ``backend`` has not ended (one query of the partial index ``jobs_active``)."""
        sql = f"SELECT 1 FROM jobs WHERE backend=? AND {_ACTIVE} LIMIT 1"
        return self._db.execute(sql, (backend,)).fetchone() is not None

    def set_job_state(self, job_id: int, state: str, reason: str | None = None, restarts: int | None = None) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE jobs SET state=?, reason=COALESCE(?, reason), restarts=COALESCE(?, restarts), updated_at=?"
                " WHERE id=?",
                (state, reason, restarts, time.time(), job_id),
            )

    def set_reason(self, job_id: int, reason: str | None) -> None:
        """Why the job is in its state (a queued job's wait), or ``None`` to clear it; the state is kept."""
        with self.transaction() as db:
            db.execute("UPDATE jobs SET reason=?, updated_at=? WHERE id=?", (reason, time.time(), job_id))

    def delete_job(self, job_id: int) -> None:
        """Forget a job that never reached its scheduler (it was refused at submission)."""
        with self.transaction() as db:
            for table in ("events", "attempts", "requests"):
                db.execute(f"DELETE FROM {table} WHERE job_id=?", (job_id,))
            db.execute("DELETE FROM jobs WHERE id=?", (job_id,))

    def set_backend_ref(self, job_id: int, ref: str) -> None:
        self._db.execute("UPDATE jobs SET backend_ref=? WHERE id=?", (ref, job_id))

    def upsert_attempt(self, attempt: Attempt) -> None:
        """Insert or replace an attempt as a remote scheduler reports it."""
        self._db.execute(_UPSERT_ATTEMPT, dataclasses.astuple(attempt))

    def set_events_offset(self, job_id: int, offset: int) -> None:
        self._db.execute("UPDATE jobs SET events_offset=? WHERE id=?", (offset, job_id))

    # ---- attempts ------------------------------------------------------------------------
    def _attempt(self, row: sqlite3.Row) -> Attempt:
        return attempt_from_row(row)

    def begin_attempt(self, job_id: int, n: int, started_at: float) -> None:
        """Record the intent to launch attempt ``n`` (no PID yet) and the job running, in one transaction.

        Written before the process starts, so a scheduler that dies in between finds the attempt
        on restart and looks for its process instead of launching the same attempt twice.
        """
        with self.transaction() as db:
            db.execute(
                "INSERT INTO attempts (job_id, n, state, pid, started_at) VALUES (?, ?, 'launching', NULL, ?)",
                (job_id, n, started_at),
            )
            db.execute("UPDATE jobs SET state='running', updated_at=? WHERE id=?", (started_at, job_id))

    def set_attempt_pid(self, job_id: int, n: int, pid: int) -> None:
        self._db.execute("UPDATE attempts SET pid=?, state='running' WHERE job_id=? AND n=?", (pid, job_id, n))

    def end_attempt(
        self,
        job_id: int,
        n: int,
        *,
        ended_at: float,
        exit_code: int,
        outcome: str,
        job_state: str,
        reason: str | None,
        restarts: int | None,
    ) -> None:
        """Close an attempt and move its job on, in one transaction (no crash leaves one without the other)."""
        insert = "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, ?, ?, ?, 'backend', ?)"
        with self.transaction() as db:
            db.execute(
                "UPDATE attempts SET state='ended', ended_at=?, exit_code=?, outcome=? WHERE job_id=? AND n=?",
                (ended_at, exit_code, outcome, job_id, n),
            )
            db.execute(
                "UPDATE jobs SET state=?, reason=COALESCE(?, reason), restarts=COALESCE(?, restarts), updated_at=?"
                " WHERE id=?",
                (job_state, reason, restarts, ended_at, job_id),
            )
            db.execute(
                insert,
                (job_id, n, ended_at, EventKind.ATTEMPT_END, json.dumps({"exit_code": exit_code, "outcome": outcome})),
            )
            db.execute(
                insert, (job_id, n, ended_at, EventKind.REQUEUED if job_state == JobState.QUEUED else job_state, "{}")
            )

    def add_attempt(self, job_id: int, n: int, pid: int, started_at: float) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO attempts (job_id, n, state, pid, started_at) VALUES (?, ?, 'running', ?, ?)",
                (job_id, n, pid, started_at),
            )
            db.execute("UPDATE jobs SET state='running', updated_at=? WHERE id=?", (started_at, job_id))

    def update_attempt(self, job_id: int, n: int, **fields: Any) -> None:
        allowed = {"state", "ended_at", "exit_code", "outcome", "sigterm_at", "kill_at"}
        if not fields or not set(fields) <= allowed:
            raise ValueError(f"cannot update attempt fields {sorted(fields)}")
        sets = ", ".join(f"{k}=?" for k in fields)
        self._db.execute(f"UPDATE attempts SET {sets} WHERE job_id=? AND n=?", (*fields.values(), job_id, n))

    def attempts(self, job_id: int | None = None) -> list[Attempt]:
        if job_id is None:
            rows = self._db.execute("SELECT * FROM attempts ORDER BY job_id, n")
        else:
            rows = self._db.execute("SELECT * FROM attempts WHERE job_id=? ORDER BY n", (job_id,))
        return [self._attempt(r) for r in rows]

    def running_attempts(self) -> list[Attempt]:
        """Attempts not yet ended: launching, running or stopping (what a new scheduler must recover)."""
        rows = self._db.execute("SELECT * FROM attempts WHERE state IN ('launching', 'running', 'stopping')")
        return [self._attempt(r) for r in rows]

    # ---- events --------------------------------------------------------------------------
    def add_event(
        self, job_id: int, kind: str, attempt: int | None = None, ts: float | None = None, **data: Any
    ) -> None:
        self._db.execute(
            "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, ?, ?, ?, 'backend', ?)",
            (job_id, attempt, ts or time.time(), kind, json.dumps(data)),
        )

    def apply_sync(self, job: Job, plan: SyncPlan) -> None:
        """Write what a remote backend's sync found (attempts, events, the job's state) in one transaction."""
        insert = "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, ?, ?, ?, 'backend', ?)"
        with self.transaction() as db:
            for attempt in plan.attempts:
                db.execute(_UPSERT_ATTEMPT, dataclasses.astuple(attempt))
            for ev in plan.events:
                db.execute(insert, (job.id, ev.attempt, ev.ts, ev.kind, json.dumps(ev.data)))
            if plan.moves(job):
                db.execute(
                    "UPDATE jobs SET state=?, reason=COALESCE(?, reason), restarts=?, updated_at=? WHERE id=?",
                    (plan.state, plan.reason, plan.restarts, time.time(), job.id),
                )

    def add_runtime_events(self, job_id: int, events: Sequence[dict[str, Any]], offset: int) -> None:
        """Ingest lines from the job's event log and move its read offset, in one transaction."""
        with self.transaction() as db:
            for ev in events:
                data = {k: v for k, v in ev.items() if k not in ("ts", "attempt", "kind")}
                attempt = ev.get("attempt")
                db.execute(
                    "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, ?, ?, ?, 'runtime', ?)",
                    (
                        job_id,
                        attempt if isinstance(attempt, int) else None,
                        float(ev["ts"]),
                        ev["kind"],
                        json.dumps(data),
                    ),
                )
            db.execute("UPDATE jobs SET events_offset=? WHERE id=?", (offset, job_id))

    def events(self, job_id: int, kinds: Sequence[str] | None = None) -> list[Event]:
        sql, args = "SELECT * FROM events WHERE job_id=?", [job_id]
        args_any: list[Any] = list(args)
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            args_any += list(kinds)
        rows = self._db.execute(sql + " ORDER BY ts, id", args_any)
        return [e for e in map(event_from_row, rows) if e is not None]

    def event_count(self, job_id: int, *, at_most: int) -> int:
        """How many events the job has, counted no further than ``at_most`` (the work is bounded by it, not by the
        job: the count walks the ``(job_id, ts)`` index alone)."""
        row = self._db.execute(
            "SELECT count(*) FROM (SELECT 1 FROM events WHERE job_id=? LIMIT ?)", (job_id, max(0, at_most))
        ).fetchone()
        return int(row[0])

    def events_after(self, job_id: int, after: int, kinds: Sequence[str]) -> list[tuple[int, Event | None]]:
        """The job's events of ``kinds`` stored after event id ``after``, each with its id, in (time, id) order.

        Ids only grow, so a reader that keeps the last id it saw reads each event once (a sweep following its
        trials' metrics). A row that does not read as an event comes as ``None``, its id still counted."""
        rows = self._db.execute(
            f"SELECT * FROM events WHERE job_id=? AND id>? AND kind IN ({','.join('?' * len(kinds))}) ORDER BY ts, id",
            (job_id, after, *kinds),
        )
        return [(int(row["id"]), event_from_row(row)) for row in rows]

    def last_event(self, job_id: int, kind: str) -> Event | None:
        return next(self.newest_events(job_id, (kind,)), None)

    def newest_events(self, job_id: int, kinds: Sequence[str]) -> Iterator[Event]:
        """The job's events of ``kinds``, newest first, read one row at a time (a reader stops when it has enough).

        The index on ``(job_id, ts)`` walks the job's events backwards, so the latest step of a job with a
        million step events costs one row, not a million parsed.
        """
        rows = self._db.execute(
            f"SELECT * FROM events WHERE job_id=? AND kind IN ({','.join('?' * len(kinds))}) ORDER BY ts DESC, id DESC",
            (job_id, *kinds),
        )
        return (e for e in map(event_from_row, rows) if e is not None)

    def newest_attempt_events(
        self, job_id: int, attempt: int, kinds: Sequence[str], *, source: str, mentions: str | None = None
    ) -> Iterator[Event]:
        """Attempt ``attempt``'s events of ``kinds`` from ``source``, newest first, one row at a time.

        What the cost ledger needs of an attempt's step events (the last step, the last phase totals)
        without parsing the thousands of them: the ``(job_id, ts)`` index is walked backwards and the
        reader stops at the first row it can use. ``mentions``: only rows whose stored data holds that
        text (checked by SQLite before the row is parsed), such as a key that few rows carry.
        """
        sql, args = newest_attempt_events_sql(job_id, attempt, kinds, source=source, mentions=mentions)
        rows = self._db.execute(sql, args)
        return (e for e in map(event_from_row, rows) if e is not None)

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, job_id: int, kind: str, grace: float | None = None) -> None:
        self._db.execute(
            "INSERT INTO requests (job_id, kind, grace, created_at) VALUES (?, ?, ?, ?)",
            (job_id, kind, grace, time.time()),
        )

    def take_requests(self) -> list[tuple[int, str, float | None]]:
        """Unhandled requests, marked handled; a read with no write when there are none."""
        if self._db.execute("SELECT 1 FROM requests WHERE handled_at IS NULL LIMIT 1").fetchone() is None:
            return []
        with self.transaction() as db:
            rows = db.execute(
                "SELECT id, job_id, kind, grace FROM requests WHERE handled_at IS NULL ORDER BY id"
            ).fetchall()
            db.execute("UPDATE requests SET handled_at=? WHERE handled_at IS NULL", (time.time(),))
        return [(r["job_id"], r["kind"], r["grace"]) for r in rows]


E = TypeVar("E", JobState, Outcome)


def _enum(kind: type[E], value: Any) -> E | None:
    """``value`` as a member of ``kind``, or ``None`` when it names none."""
    try:
        return kind(value)
    except ValueError:
        return None


def _time(value: Any) -> float | None:
    """A stored Unix time: a finite number from 0 to ``MAX_TS``; ``None`` for anything else (NULL, text)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_TS
    return float(value) if ok else None


def _integer(value: Any) -> int:
    """A stored integer, 0 for anything else (text where a number belongs)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def attempt_from_row(row: sqlite3.Row) -> Attempt:
    """The attempt a row of ``attempts`` holds; values of the wrong type (a hand edit) read as harmless ones.

    An outcome gpufleet does not know reads as ``lost`` (nobody can tell how it ended); a start
    that is not a time as the attempt's end, and an end that is not one as its start: no wall
    time to bill, rather than one from 1970 or one that never ends.
    """
    started_at, ended_at = _time(row["started_at"]), _time(row["ended_at"])
    if started_at is None:
        started_at = ended_at or 0.0
    if ended_at is None and row["ended_at"] is not None:
        ended_at = started_at
    outcome = None if row["outcome"] is None else _enum(Outcome, row["outcome"]) or Outcome.LOST
    pid, exit_code = row["pid"], row["exit_code"]
    return Attempt(
        job_id=row["job_id"],
        n=row["n"],
        state=str(row["state"]),
        pid=pid if isinstance(pid, int) else None,
        started_at=started_at,
        ended_at=ended_at,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        outcome=outcome,
        sigterm_at=_time(row["sigterm_at"]),
        kill_at=_time(row["kill_at"]),
    )


def newest_attempt_events_sql(
    job_id: int, attempt: int, kinds: Sequence[str], *, source: str, mentions: str | None = None, schema: str = "main"
) -> tuple[str, list[Any]]:
    """The query of :meth:`Store.newest_attempt_events` (rows newest first), on the store attached as ``schema``."""
    sql = (
        f"SELECT * FROM {schema}.events WHERE job_id=? AND attempt=? AND typeof(attempt)='integer' AND source=?"
        f" AND kind IN ({','.join('?' * len(kinds))})"
    )
    args: list[Any] = [job_id, attempt, source, *kinds]
    if mentions is not None:
        sql += " AND instr(data, ?) > 0"
        args.append(mentions)
    return sql + " ORDER BY ts DESC, id DESC", args


def event_from_row(row: sqlite3.Row) -> Event | None:
    """A stored event, or ``None`` for a row that cannot be one (a hand edit, an older writer): readers skip it.

    Its values are as stored: a NaN loss stays NaN, for the reader to show as it sees fit.
    """
    ts, attempt, kind = _time(row["ts"]), row["attempt"], row["kind"]
    if ts is None or not isinstance(kind, str):
        return None
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)):
        return None
    try:
        data = json.loads(row["data"])
    except (TypeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    return Event(row["job_id"], attempt, ts, kind, str(row["source"]), data)


def _stored_spec(spec: JobSpec) -> str:
    """``spec`` as the jobs table holds it, refused when it would not read back as itself."""
    from gpufleet.spec import parse_spec

    stored = spec.model_dump_json()
    if parse_spec(json.loads(stored), source=f"job {spec.name!r} as stored") != spec:
        raise SpecError(
            f"job {spec.name!r} does not read back as it was written (a value JSON cannot hold, such as "
            "inf or NaN, inside args?): give finite numbers"
        )
    return stored


def _placeholder_spec(name: str, team: str) -> JobSpec:
    """A valid stand-in for a job whose stored spec no longer validates (it is shown, never run)."""
    from gpufleet.spec import parse_spec

    fields = {"name": name, "team": team, "entrypoint": "gpufleet.broken:spec"}
    try:
        return parse_spec(fields)
    except SpecError:
        return parse_spec({**fields, "name": "broken", "team": "default"})


MAX_GPUS = 1024 * 1024
"""The most GPUs an attempt can hold (1024 nodes of 1024, the bounds of a spec): a larger figure is not one."""


def gpu_count(value: Any) -> int | None:
    """A count of GPUs (or bytes) from an event's data: an int in ``[0, MAX_GPUS]``, else ``None``."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_GPUS
    return value if ok else None


def attempt_gpus(job: Job, attempt: Attempt, events: Sequence[Event]) -> int:
    """The GPUs (over all nodes) ``attempt`` held, as its backend recorded them when it started it.

    Every backend puts ``gpus`` and ``world_size`` in its ``attempt_start`` event, taken from the
    spec it starts the attempt from: an event, not a new column of ``attempts``, so no database is
    migrated and records written before keep their meaning. Only the backend's own event counts:
    the runtime's event log (where a Slurm batch script also writes one) is written by user code,
    and a line claiming fewer GPUs must not lower a bill.

    Without that figure (a record from before attempts carried it, or a local scheduler that died
    between starting the attempt and recording it), the GPUs in force when the attempt started:
    the ``old_gpus`` of the first ``resized`` event after its start, else the job's spec (which,
    for a job never resized, is what every attempt ran on).
    """
    recorded = recorded_gpus(attempt, events)
    return job.spec.total_gpus if recorded is None else recorded


def recorded_gpus(attempt: Attempt, events: Sequence[Event]) -> int | None:
    """:func:`attempt_gpus` from the events alone: ``None`` where they do not say (the spec's count then)."""
    for e in events:
        if e.kind == EventKind.ATTEMPT_START and e.attempt == attempt.n and e.source == "backend":
            recorded = gpu_count(e.data.get("gpus"))
            if recorded is not None:
                return recorded
    for e in events:
        if e.kind == EventKind.RESIZED and e.ts >= attempt.started_at:
            before = gpu_count(e.data.get("old_gpus"))
            if before is not None:
                return before
    return None


def latest_step(store: Store, job_id: int) -> int | None:
    """The job's most recent step count, as reported by its runtime (``None`` before any)."""
    for ev in store.newest_events(
        job_id, (EventKind.TRAIN_START, EventKind.STEP, EventKind.CHECKPOINT, EventKind.ROLLBACK)
    ):
        value = ev.data.get("to_step" if ev.kind == EventKind.ROLLBACK else "step")
        if isinstance(value, int):
            return value
    return None


__all__ = [
    "MAX_GPUS",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "TERMINAL",
    "Attempt",
    "Event",
    "Job",
    "JobState",
    "Outcome",
    "Store",
    "SyncEvent",
    "SyncPlan",
    "attempt_gpus",
    "gpu_count",
    "latest_step",
]
