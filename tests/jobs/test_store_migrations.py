"""The state database's numbered migrations: old databases open, newer ones are refused."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gpufleet.errors import UsageError
from gpufleet.jobs import store as store_module
from gpufleet.jobs.states import JobState, Outcome
from gpufleet.jobs.store import MIGRATIONS, SCHEMA_VERSION, TERMINAL, Store
from gpufleet.spec import parse_spec

# The DDL gpufleet used before numbered migrations, copied as it was: version 1 in ``meta``, no
# ``user_version``, and ``jobs.backend_ref`` either in the CREATE TABLE or added by an ALTER TABLE.
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL, team TEXT NOT NULL, priority INTEGER NOT NULL,
    backend TEXT NOT NULL, state TEXT NOT NULL, spec TEXT NOT NULL,
    submitted_at REAL NOT NULL, updated_at REAL NOT NULL,
    restarts INTEGER NOT NULL DEFAULT 0, reason TEXT, env TEXT NOT NULL DEFAULT '{}',
    events_offset INTEGER NOT NULL DEFAULT 0,
    backend_ref TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    job_id INTEGER NOT NULL REFERENCES jobs(id), n INTEGER NOT NULL,
    state TEXT NOT NULL, pid INTEGER, started_at REAL NOT NULL, ended_at REAL,
    exit_code INTEGER, outcome TEXT, sigterm_at REAL, kill_at REAL,
    PRIMARY KEY (job_id, n)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, attempt INTEGER,
    ts REAL NOT NULL, kind TEXT NOT NULL, source TEXT NOT NULL, data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, ts);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, kind TEXT NOT NULL,
    grace REAL, created_at REAL NOT NULL, handled_at REAL
);
"""
OLD_SCHEMA_WITHOUT_BACKEND_REF = OLD_SCHEMA.replace(",\n    backend_ref TEXT\n", "\n")


def _spec_json() -> str:
    return parse_spec({"name": "old-job", "team": "research", "entrypoint": "train.py"}).model_dump_json()


def _old_database(path: Path, schema: str) -> None:
    """A database as gpufleet before numbered migrations left it: a finished job with one preempted attempt."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.executescript(schema)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.execute(
        "INSERT INTO jobs (name, team, priority, backend, state, spec, submitted_at, updated_at, restarts)"
        " VALUES ('old-job', 'research', 0, 'local', 'completed', ?, 1.0, 9.0, 1)",
        (_spec_json(),),
    )
    db.execute(
        "INSERT INTO attempts (job_id, n, state, pid, started_at, ended_at, exit_code, outcome)"
        " VALUES (1, 1, 'ended', 100, 2.0, 4.0, 75, 'preempted'), (1, 2, 'ended', 101, 5.0, 9.0, 0, 'completed')"
    )
    db.execute(
        "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (1, 1, 4.0, 'attempt_end', 'backend', ?)",
        (json.dumps({"exit_code": 75, "outcome": "preempted"}),),
    )
    db.commit()
    db.close()


def _versions(path: Path) -> tuple[int, str]:
    db = sqlite3.connect(path)
    try:
        user_version = db.execute("PRAGMA user_version").fetchone()[0]
        meta = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    finally:
        db.close()
    return int(user_version), str(meta)


def _schema(path: Path) -> dict[str, list[tuple[str, str, int]]]:
    """Each table's columns (name, type, not null), to compare databases made by different paths."""
    db = sqlite3.connect(path)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return {t: [(r[1], r[2], r[3]) for r in db.execute(f"PRAGMA table_info({t})")] for t in tables}
    finally:
        db.close()


def test_migration_list_matches_schema_version() -> None:
    assert SCHEMA_VERSION == len(MIGRATIONS) == 6
    assert [m.__name__ for m in MIGRATIONS] == [
        "_create_tables",
        "_add_backend_ref",
        "_index_jobs",
        "_index_open_requests",
        "_log_attempt_edits",
        "_index_active_jobs",
    ]


def test_an_attempt_changed_in_place_is_logged_with_a_growing_number(tmp_path: Path) -> None:
    path = tmp_path / "home" / "state.db"
    _old_database(path, OLD_SCHEMA)  # attempts written before the log existed: none logged by the migration
    Store(path).close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT * FROM attempt_edits").fetchall() == []
        db.execute(
            "INSERT INTO jobs SELECT 2, name, team, priority, backend, state, spec, submitted_at, updated_at,"
            " restarts, reason, env, events_offset, backend_ref FROM jobs WHERE id=1"
        )
        db.execute("INSERT INTO attempts (job_id, n, state, started_at) VALUES (2, 1, 'running', 10.0)")
        assert db.execute("SELECT * FROM attempt_edits").fetchall() == []  # a new row shows in the rowid
        db.execute("UPDATE attempts SET ended_at = ended_at + 1 WHERE job_id = 1 AND n = 2")  # as by hand
        db.execute("UPDATE attempts SET state = 'ended', ended_at = 12.0 WHERE job_id = 2")
        db.execute("UPDATE attempts SET exit_code = 0 WHERE job_id = 1 AND n = 1")
        assert db.execute("SELECT job_id, seq FROM attempt_edits ORDER BY seq").fetchall() == [(2, 2), (1, 3)]
        db.execute("DELETE FROM attempts WHERE job_id = 2")
        db.execute("UPDATE attempts SET job_id = 2 WHERE job_id = 1 AND n = 1")  # moved: both jobs changed
        assert db.execute("SELECT job_id, seq FROM attempt_edits ORDER BY seq").fetchall() == [(1, 5), (2, 6)]
        plan = " ".join(
            str(r[-1]) for r in db.execute("EXPLAIN QUERY PLAN SELECT job_id FROM attempt_edits WHERE seq > 3")
        )
        assert "attempt_edits_seq" in plan
    finally:
        db.close()


def test_a_page_of_jobs_is_read_through_the_jobs_indexes(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    plans = {
        sql: " ".join(str(r[-1]) for r in store._db.execute("EXPLAIN QUERY PLAN " + sql, args))
        for sql, args in (
            ("SELECT COUNT(*) FROM jobs WHERE team=?", ("a",)),
            ("SELECT * FROM jobs WHERE state IN (?) ORDER BY id DESC LIMIT 50", ("queued",)),
            ("SELECT 1 FROM requests WHERE handled_at IS NULL LIMIT 1", ()),
            (f"SELECT 1 FROM jobs WHERE backend=? AND {store_module._ACTIVE} LIMIT 1", ("slurm",)),
        )
    }
    assert all("USING" in plan and "INDEX" in plan for plan in plans.values()), plans
    assert "jobs_active" in plans[f"SELECT 1 FROM jobs WHERE backend=? AND {store_module._ACTIVE} LIMIT 1"]


def test_fresh_database_is_created_at_the_latest_version(tmp_path: Path) -> None:
    path = tmp_path / "home" / "state.db"
    store = Store(path)
    store.close()
    assert _versions(path) == (SCHEMA_VERSION, str(SCHEMA_VERSION))
    assert "backend_ref" in {c[0] for c in _schema(path)["jobs"]}
    Store(path).close()  # opening it again changes nothing
    assert _versions(path) == (SCHEMA_VERSION, str(SCHEMA_VERSION))


@pytest.mark.parametrize("schema", [OLD_SCHEMA, OLD_SCHEMA_WITHOUT_BACKEND_REF], ids=["backend_ref", "no_backend_ref"])
def test_database_from_before_numbered_migrations_opens(tmp_path: Path, schema: str) -> None:
    path = tmp_path / "home" / "state.db"
    _old_database(path, schema)
    store = Store(path)
    try:
        job = store.job(1)
        stored: str = "completed"
        assert job.state == JobState.COMPLETED == stored
        assert job.state in TERMINAL
        assert job.backend_ref is None
        assert [a.outcome for a in store.attempts(1)] == [Outcome.PREEMPTED, Outcome.COMPLETED]
        assert store.events(1)[0].data == {"exit_code": 75, "outcome": "preempted"}
        store.set_backend_ref(1, "1234")  # the column a version 1 database may lack
        assert store.job(1).backend_ref == "1234"
        job_id = store.add_job(job.spec, "local")
        assert store.job(job_id).state == JobState.QUEUED
    finally:
        store.close()
    assert _versions(path) == (SCHEMA_VERSION, str(SCHEMA_VERSION))
    fresh = tmp_path / "fresh" / "state.db"
    Store(fresh).close()
    assert _schema(path) == _schema(fresh)


def test_each_migration_takes_the_previous_version_to_the_next(tmp_path: Path) -> None:
    """Run migration by migration: every intermediate database opens and ends where a fresh one does."""
    for version in range(SCHEMA_VERSION + 1):
        path = tmp_path / str(version) / "state.db"
        path.parent.mkdir()
        db = sqlite3.connect(path, isolation_level=None)
        for migration in MIGRATIONS[:version]:
            migration(db)
        if version:  # as the store leaves a database at this version
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(version),))
        db.execute(f"PRAGMA user_version={version}")
        db.close()
        Store(path).close()
        assert _versions(path) == (SCHEMA_VERSION, str(SCHEMA_VERSION))
        assert _schema(path) == _schema(tmp_path / "0" / "state.db")


def test_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "home" / "state.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(UsageError, match="upgrade gpufleet") as err:
        Store(path)
    assert str(path) in str(err.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in str(err.value)


def test_newer_database_from_before_user_version_is_refused(tmp_path: Path) -> None:
    """``meta.schema_version`` is the version of a database whose ``user_version`` was never set."""
    path = tmp_path / "home" / "state.db"
    _old_database(path, OLD_SCHEMA)
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    with pytest.raises(UsageError, match=str(path)):
        Store(path)


def test_a_failing_migration_leaves_the_database_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "home" / "state.db"
    _old_database(path, OLD_SCHEMA_WITHOUT_BACKEND_REF)
    before = _schema(path)

    def broken(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half_done (x INTEGER)")
        raise RuntimeError("migration 3 failed")

    migrations = (*MIGRATIONS, broken)
    monkeypatch.setattr(store_module, "MIGRATIONS", migrations)
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", len(migrations))
    with pytest.raises(RuntimeError, match="migration 3 failed"):
        Store(path)
    assert _schema(path) == before  # migration 2 (backend_ref) rolled back with it
    assert _versions(path) == (0, "1")
    monkeypatch.undo()
    Store(path).close()
    assert _versions(path) == (SCHEMA_VERSION, str(SCHEMA_VERSION))


def test_states_and_outcomes_equal_their_strings() -> None:
    assert JobState("cancelled") is JobState.CANCELLED
    assert TERMINAL == ("completed", "failed", "cancelled")
    assert json.dumps({"state": JobState.RUNNING, "outcome": Outcome.LOST}) == '{"state": "running", "outcome": "lost"}'
    assert f"{Outcome.REQUEUED}" == "requeued"


def test_the_queue_is_walked_a_page_at_a_time_in_serving_order(tmp_path: Path) -> None:
    """Priority first, then age, across pages; jobs that start between two pages are not given again."""
    store = Store(tmp_path / "state.db")
    db = store._db
    for i in range(1, 12):
        db.execute(
            "INSERT INTO jobs (id, name, team, priority, backend, state, spec, submitted_at, updated_at)"
            " VALUES (?, ?, 't', ?, 'local', 'queued', '{}', 0, 0)",
            (i, f"j{i}", i % 3),
        )
    db.execute("UPDATE jobs SET state='completed' WHERE id=11")
    order = sorted(range(1, 11), key=lambda i: (-(i % 3), i))
    assert list(store.queued_ids(page=3)) == order == list(store.queued_ids())
    walk = store.queued_ids(page=3)
    first = [next(walk) for _ in range(3)]
    db.execute("UPDATE jobs SET state='running' WHERE id IN (?, ?)", (first[0], order[5]))
    assert first + list(walk) == [i for i in order if i != order[5]]
