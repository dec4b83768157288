"""The fleet page's data at scale: counts of every job by SQL, bounded lists, the same figures as reading every job.

Homes of a few hundred jobs are written straight into the store (as months of use leave it, and as
``bench/growth.py`` writes its 100,000-job ones): the view's counts, queue, GPUs in use and recent
events must equal a naive computation over every job, and the view must read the same rows and run
the same statements when hundreds of older jobs are added.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.jobs import store as store_module
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import TERMINAL, Store, _stored_spec
from gpufleet.paths import state_db
from gpufleet.serve import fleet_view as view_module
from gpufleet.serve.fleet_view import ENDED_ROWS, QUEUE_ROWS, RECENT_EVENTS, RECENT_KINDS, RUNNING_ROWS, fleet_view
from gpufleet.spec import parse_spec
from gpufleet.views import running_gpus

TEAMS = ("vision", "nlp", "speech")
T0 = 1_700_000_000.0
STATES = ("completed",) * 5 + ("failed", "cancelled", "queued", "running", "running")


def spec_json(team: str, gpus: int) -> str:
    spec = parse_spec(
        {"name": "run", "team": team, "entrypoint": "gpufleet.workloads.toy:train", "resources": {"gpus": gpus}}
    )
    return _stored_spec(spec)


def job_story(job_id: int, updated: float) -> tuple[str, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """One job's state, attempts and events, every event at or before ``updated`` unless it runs.

    Every 7th job was preempted by the job before it (``preempted_by``, ``requeued``) and ran again;
    every 4th running job has no ``attempt_start`` of its own (its GPUs come from its spec), every 3rd
    logged a rollback after its row last changed."""
    state = STATES[job_id % len(STATES)]
    attempts: list[tuple[Any, ...]] = []
    events: list[tuple[Any, ...]] = []

    def event(n: int | None, ts: float, kind: str, **data: Any) -> None:
        events.append((job_id, n, ts, kind, "backend", json.dumps(data)))

    if state == "queued":
        return state, attempts, events
    n, start = 1, updated - 50
    if job_id % 7 == 0:
        attempts.append((job_id, 1, "ended", 4000, start - 100, start - 60, 75, "preempted"))
        event(1, start - 100, EventKind.ATTEMPT_START, gpus=2)
        event(1, start - 62, EventKind.PREEMPTED_BY, job=job_id - 1)
        event(1, start - 60, EventKind.REQUEUED)
        n = 2
    running = state == "running"
    end = (None, None) if running else (updated, 0)
    attempts.append((job_id, n, "running" if running else "ended", 4001, start, *end, None if running else state))
    if not (running and job_id % 4 == 0):
        event(n, start, EventKind.ATTEMPT_START, gpus=2 + job_id % 3)
    for step in range(1, 4):
        event(n, start + step, EventKind.STEP, step=step, loss=1.0 / step)
    if running and job_id % 3 == 0:
        event(n, updated + 30, EventKind.ROLLBACK, to_step=1)
    return state, attempts, events


def write_home(home: Path, ids: list[int], updated: float, *, bogus: int | None = None) -> None:
    """Jobs ``ids``, each updated a minute after the one before from ``updated``, written in one transaction."""
    Store(state_db(home)).close()
    specs = {(team, g): spec_json(team, g) for team in TEAMS for g in (1, 2)}
    jobs, attempts, events = [], [], []
    for i, job_id in enumerate(ids):
        at = updated + 60 * i
        state, tries, evs = job_story(job_id, at)
        team = TEAMS[job_id % len(TEAMS)]
        state = "bogus" if job_id == bogus else state
        jobs.append((job_id, f"job-{job_id}", team, job_id % 3, "local", state, specs[(team, 1 + job_id % 2)], at, at))
        attempts += tries
        events += evs
    with sqlite3.connect(state_db(home)) as db:
        db.executemany(
            "INSERT INTO jobs (id, name, team, priority, backend, state, spec, submitted_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            jobs,
        )
        db.executemany("INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)", attempts)
        db.executemany("INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, ?, ?, ?, ?, ?)", events)
    db.close()


def naive(home: Path) -> dict[str, Any]:
    """What reading every job gives: counts, the queue, the GPUs in use, every job's recent events."""
    store = Store(state_db(home))
    try:
        jobs = store.jobs()
        teams: dict[str, Counter[str]] = {}
        for j in jobs:
            teams.setdefault(j.team, Counter())[j.state] += 1
        queued = sorted((j for j in jobs if j.state == "queued"), key=lambda j: (-j.priority, j.id))
        held = [(j.backend, running_gpus(store, j)) for j in jobs if j.state == "running"]
        recent = [(e.ts, e.job_id, e.kind) for j in jobs for e in store.events(j.id, RECENT_KINDS)]
        return {
            "states": dict(Counter(j.state for j in jobs)),
            "teams": {t: dict(c) for t, c in teams.items()},
            "queue": [j.id for j in queued],
            "in_use": sum(g for b, g in held if b == "local"),
            "recent": sorted(recent, reverse=True),
            "updated": [j.id for j in sorted(jobs, key=lambda j: -j.updated_at)],
        }
    finally:
        store.close()


@pytest.fixture
def big_home(home: Path) -> Path:
    write_home(home, list(range(1, 401)), T0, bogus=13)
    return home


def test_the_counts_queue_and_gpus_in_use_equal_reading_every_job(big_home: Path) -> None:
    page = fleet_view(big_home)
    want = naive(big_home)  # after the view: reading job 13 marks its unknown state failed, as the view counts it
    assert page["states"] == want["states"] and page["teams"] == want["teams"]
    assert page["jobs_total"] == 400 and page["queue_total"] == want["states"]["queued"] == 40
    assert [q["id"] for q in page["queue"]] == want["queue"][:QUEUE_ROWS]
    assert page["capacity"]["in_use"] == want["in_use"]
    listed = Counter(j["state"] for j in page["jobs"])
    assert listed["running"] == min(RUNNING_ROWS, want["states"]["running"]) and listed["queued"] == QUEUE_ROWS
    assert [j["id"] for j in page["jobs"]] == sorted(j["id"] for j in page["jobs"])
    running = [i for i in range(1, 401) if STATES[i % len(STATES)] == "running"]
    assert [j["id"] for j in page["jobs"] if j["state"] == "running"] == running[-RUNNING_ROWS:]


def test_the_recent_events_are_the_newest_of_the_jobs_updated_last(
    big_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    naive(big_home)  # job 13's unknown state is marked failed: its row changed last
    want = naive(big_home)
    monkeypatch.setattr(view_module, "RECENT_JOBS", 1000)  # every job a candidate: every job's events
    every = fleet_view(big_home)["recent"]
    assert [(e["ts"], e["job"], e["kind"]) for e in every] == want["recent"][:RECENT_EVENTS]
    taken = next(e for e in every if e["kind"] == EventKind.PREEMPTED_BY)
    assert taken["by"] == taken["job"] - 1 and taken["by_name"] == f"job-{taken['job'] - 1}"
    assert any(e["kind"] == EventKind.ROLLBACK for e in every)  # logged after its running job's row last changed

    monkeypatch.setattr(view_module, "RECENT_JOBS", 30)
    last = set(want["updated"][:30])
    assert [(e["ts"], e["job"]) for e in fleet_view(big_home)["recent"]] == [
        (ts, job) for ts, job, _ in want["recent"] if job in last
    ][:RECENT_EVENTS]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How many job rows the store turns into jobs and how many statements it runs."""
    seen: Counter[str] = Counter()
    read_job, execute = Store._job, store_module._Connection.execute

    def job(self: Store, row: sqlite3.Row) -> Any:
        seen["jobs"] += 1
        return read_job(self, row)

    def statement(self: Any, sql: str, parameters: Any = (), /) -> Any:
        seen["statements"] += 1
        return execute(self, sql, parameters)

    monkeypatch.setattr(Store, "_job", job)
    monkeypatch.setattr(store_module._Connection, "execute", statement)
    yield seen


def test_older_jobs_add_no_row_read_and_no_statement(big_home: Path, counted: Counter[str]) -> None:
    fleet_view(big_home)  # the file's pages checked once
    counted.clear()
    before = fleet_view(big_home)
    first = dict(counted)
    older = [i for i in range(401, 801) if STATES[i % len(STATES)] in TERMINAL]
    write_home(big_home, older, T0 - 10**6)  # ended jobs, updated before all the others
    fleet_view(big_home)
    counted.clear()
    after = fleet_view(big_home)
    assert dict(counted) == first, (first, dict(counted))
    no_start = [i for i in range(1, 401) if STATES[i % len(STATES)] == "running" and i % 4 == 0]
    assert first["jobs"] <= RUNNING_ROWS + QUEUE_ROWS + ENDED_ROWS + len(no_start)  # listed, and GPUs from a spec
    assert after["jobs_total"] == 400 + len(older) and [j["id"] for j in after["jobs"]] == [
        j["id"] for j in before["jobs"]
    ]
    assert after["recent"] == before["recent"] and after["queue"] == before["queue"]
    assert after["states"]["completed"] > before["states"]["completed"]


def test_an_empty_home_and_a_home_without_a_store_have_empty_lists(home: Path) -> None:
    page = fleet_view(home)
    assert (page["jobs"], page["jobs_total"], page["queue"], page["queue_total"], page["recent"]) == ([], 0, [], 0, [])
    Store(state_db(home)).close()
    assert fleet_view(home)["states"] == {} and fleet_view(home)["capacity"]["in_use"] == 0


ADD_START = (
    "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (8, ?, ?, 'attempt_start', 'backend', ?)"
)


def test_gpus_in_use_follow_a_start_recorded_late_and_a_new_attempt(home: Path) -> None:
    """Job 8 runs with no ``attempt_start`` yet: its spec's GPU; then its backend's figure, kept; then its next
    attempt's."""
    write_home(home, [8], T0)
    assert fleet_view(home)["capacity"]["in_use"] == 1  # spec: 1 GPU
    start = T0 - 50
    with sqlite3.connect(state_db(home)) as db:
        db.execute(ADD_START, (1, start, json.dumps({"gpus": 6})))
    db.close()
    assert fleet_view(home)["capacity"]["in_use"] == 6
    assert view_module.RECORDED_GPUS[(str(state_db(home)), 8, 1, start)] == 6
    assert fleet_view(home)["capacity"]["in_use"] == 6
    with sqlite3.connect(state_db(home)) as db:
        db.execute("UPDATE attempts SET state='ended', ended_at=? WHERE job_id=8", (T0 + 5,))
        db.execute("INSERT INTO attempts (job_id, n, state, started_at) VALUES (8, 2, 'running', ?)", (T0 + 10,))
        db.execute(ADD_START, (2, T0 + 10, json.dumps({"gpus": 3})))
    db.close()
    assert fleet_view(home)["capacity"]["in_use"] == 3


def test_the_documented_list_sizes_are_the_codes() -> None:
    from gpufleet.views import _field_docstrings

    docs = _field_docstrings()["FleetPage"]
    assert f"the newest {RUNNING_ROWS}), the queue's first {QUEUE_ROWS} and the {ENDED_ROWS}" in docs["jobs"]
    assert f"first {QUEUE_ROWS} queued" in docs["queue"]
    assert f"at most {RECENT_EVENTS}, newest first) of the {view_module.RECENT_JOBS} jobs" in docs["recent"]
    page = (Path(__file__).parents[2] / "docs" / "serve.md").read_text()
    assert f"the newest {RUNNING_ROWS}), the first {QUEUE_ROWS} queued" in page


@pytest.mark.timeout(300)
def test_the_page_says_how_many_jobs_are_not_listed(big_home: Path, browser_page: Any) -> None:
    from conftest import served

    from gpufleet.serve.app import ServeConfig, create_app

    page = browser_page
    with served(create_app(ServeConfig(home=big_home, token=None, sync_remote=False))) as url:
        page.goto(url + "/")
        page.locator("#queue-more").wait_for(timeout=60_000)
        assert page.inner_text("#queue-more").startswith(f"{40 - QUEUE_ROWS} more queued behind these")
        listed = RUNNING_ROWS + QUEUE_ROWS + ENDED_ROWS
        assert page.inner_text("#f-count") == (
            f"{listed} shown of {listed} listed; {400 - listed} more jobs not listed: gpufleet jobs --all"
        )
        page.select_option("#f-state", "queued")
        page.select_option("#f-team", "nlp")
        nlp = sum(1 for i in range(1, 401) if STATES[i % len(STATES)] == "queued" and TEAMS[i % len(TEAMS)] == "nlp")
        shown = page.locator("#fleet-jobs tbody tr[data-job]").count()
        assert page.inner_text("#f-count").endswith(
            f"{nlp - shown} more queued jobs of nlp not listed: gpufleet jobs --state queued --team nlp"
        )
