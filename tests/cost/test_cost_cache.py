"""The cost cache (cost/cache.py): cached figures are the store's own, and anything that changes them is seen."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import attempt_events, run_cli

from gpufleet.cost import live, usage
from gpufleet.cost.cache import CostCache
from gpufleet.cost.gather import CostSummary, cost_report, cost_summary
from gpufleet.cost.ledger import Cost
from gpufleet.jobs.store import Attempt, Outcome, Store
from gpufleet.spec import parse_spec

NOW = 2_000_000.0
"""The clock every read here runs at: a running job's cost grows with it."""


def spec(name: str, team: str, gpu_type: str = "H100", *, spot: bool = True, gpus: int = 2) -> Any:
    return parse_spec(
        {
            "name": name,
            "team": team,
            "entrypoint": "gpufleet.workloads.toy:train",
            "resources": {"gpus": gpus, "gpu_type": gpu_type},
            "spot": spot,
        }
    )


def add_attempt(store: Store, job: int, n: int, start: float, outcome: str | None, gpus: int = 2) -> None:
    """Attempt ``n`` of ``job``: the backend's start, the runtime's events and its step events, and its end."""
    end = None if outcome is None else start + (91.0 if outcome == "completed" else 63.0)
    code = None if outcome is None else 0 if outcome == "completed" else 1 if outcome == "failed" else 75
    store.upsert_attempt(
        Attempt(job, n, "running" if end is None else "ended", None, start, end, code, None if outcome is None
                else Outcome(outcome), None, None)
    )  # fmt: skip
    store.add_event(job, "attempt_start", attempt=n, ts=start, gpus=gpus, world_size=gpus)
    runtime = attempt_events(n, start, "completed" if outcome in (None, "completed") else "preempted")
    if outcome is None:  # still running: no end yet
        runtime = [e for e in runtime if e["kind"] != "session_end"]
    phases = {k: [1.0] * gpus for k in ("data_wait", "compute", "collective", "optimizer", "straggler_wait")}
    steps = [
        {"ts": start + 8.0 + s, "kind": "step", "attempt": n, "step": 10 * (n - 1) + s, "loss": 1.0}
        | ({"phase_totals_s": phases} if s == 3 else {})
        for s in range(1, 6)
    ]
    store.add_runtime_events(job, sorted([*runtime, *steps], key=lambda e: e["ts"]), offset=n)


@pytest.fixture
def store(home: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """Jobs of two teams: preempted then completed, failed, killed, running, queued, unpriced, with a notice."""
    monkeypatch.setattr(time, "time", lambda: NOW)
    store = Store(home / "state.db")
    done = store.add_job(spec("lm", "nlp"), "local")
    for n, outcome in enumerate(("preempted", "requeued", "completed"), start=1):
        add_attempt(store, done, n, 1000.0 * n, outcome)
    store.add_event(done, "preemption_notice", attempt=1, ts=1050.0, source="aws", lead_s=120.0)
    store.set_job_state(done, "completed")
    failed = store.add_job(spec("vit", "vision", "A100", spot=False), "local")
    add_attempt(store, failed, 1, 5000.0, "failed", gpus=4)
    store.set_job_state(failed, "failed", reason="exit code 1")
    killed = store.add_job(spec("rl", "vision"), "local")
    add_attempt(store, killed, 1, 6000.0, "lost")  # its node vanished: killed, not preempted
    add_attempt(store, killed, 2, 7000.0, "completed")
    store.set_job_state(killed, "completed")
    running = store.add_job(spec("long", "nlp"), "local")
    add_attempt(store, running, 1, 8000.0, None)
    store.set_job_state(running, "running")
    store.add_job(spec("waits", "nlp"), "local")  # queued: no attempt, no cost
    odd = store.add_job(spec("tpu", "vision", "TPUv9"), "local")
    add_attempt(store, odd, 1, 9000.0, "completed", gpus=8)
    store.set_job_state(odd, "completed")
    gone = store.add_job(spec("never", "nlp"), "local")
    store.set_job_state(gone, "cancelled")  # cancelled before it started: no cost either
    return store


class Expected:
    """What ``gpufleet cost --json`` printed before the cache, and the ledger it came from: every attempt priced."""

    def __init__(self, store: Store, **kwargs: Any) -> None:
        report = cost_report(store, **kwargs)
        self.ledger = report.ledger
        self.dict: dict[str, Any] = json.loads(json.dumps(report.to_dict()))

    @property
    def jobs(self) -> list[dict[str, Any]]:
        return list(self.dict["jobs"])


def report_of(store: Store, **kwargs: Any) -> Expected:
    return Expected(store, **kwargs)


def assert_close(ours: Cost, theirs: Cost) -> None:
    """Two costs to the cent and the GPU-millisecond: the totals are summed in another order, so a figure on the
    edge of its sixth digit may print rounded the other way."""
    for name in ("gpu_hours", "preemption_gpu_hours", "goodput_gpu_seconds"):
        assert getattr(ours, name) == pytest.approx(getattr(theirs, name), rel=1e-12, abs=1e-6), name
    for name in ("money", "on_demand_money", "preemption_money", "egress_money"):
        assert getattr(ours, name) == pytest.approx(getattr(theirs, name), abs=0.005), name
    for name in ("attempts", "preemptions", "killed", "steps_redone", "unpriced", "egress_bytes", "notices"):
        assert getattr(ours, name) == getattr(theirs, name), name


def assert_same_figures(summary: CostSummary, expected: Expected) -> None:
    """The jobs exactly (in ``--json`` and as listed); the team and fleet totals to the cent."""
    got = summary.to_dict()
    assert got.keys() == expected.dict.keys()
    assert got["jobs"] == expected.jobs
    assert list(summary.teams) == list(expected.ledger.teams) and summary.job_count == len(expected.jobs)
    assert_close(summary.total, expected.ledger.total)
    for team, cost in summary.teams.items():
        assert_close(cost, expected.ledger.teams[team])
    for job_id, name, cost in summary.jobs:
        assert {"id": job_id, "name": name, **cost.to_dict()} == next(j for j in expected.jobs if j["id"] == job_id)


def priced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids of the jobs the next reads price (not read from the cache's rows): from their events, or from what
    their last pricing read (``live.Priced``)."""
    seen: list[int] = []
    real = usage.attempt_readings
    real_kept = live.Priced.price

    def counting(job: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(job.id)
        return real(job, *args, **kwargs)

    def counting_kept(self: live.Priced, *args: Any, **kwargs: Any) -> Any:
        seen.append(self.job_id)
        return real_kept(self, *args, **kwargs)

    monkeypatch.setattr(live, "attempt_readings", counting)
    monkeypatch.setattr(live.Priced, "price", counting_kept)
    return seen


def test_cached_figures_are_the_uncached_ones(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = report_of(store)
    total = expected.dict["total"]
    assert [j["id"] for j in expected.jobs] == [1, 2, 3, 4, 6]
    assert total["preemptions"] == 2 and total["killed"] == 1 and total["preemption_notices"]
    assert total["unpriced"] == ["TPUv9/local/spot"] and total["goodput"] < 1
    uncached = cost_summary(store, with_json=True, cached=False)
    assert_same_figures(uncached, expected)
    seen = priced(monkeypatch)
    cold = cost_summary(store, with_json=True)
    assert sorted(seen) == [1, 2, 3, 4, 6]
    assert_same_figures(cold, expected)
    seen.clear()
    warm = cost_summary(store, with_json=True)
    assert seen == [4]  # only the running job is priced again
    assert_same_figures(warm, expected)
    assert warm.killed == [(3, "rl", 1)]
    by_money = sorted(expected.ledger.jobs.items(), key=lambda jc: (-jc[1].money, jc[0]))
    assert [j for j, _, _ in warm.jobs] == [j for j, _ in by_money]
    assert [j for j, _, _ in cost_summary(store, limit=2).jobs] == [j for j, _ in by_money[:2]]


def test_the_json_text_is_what_emit_json_prints(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    from gpufleet.cli.render import emit_json

    cost_summary(store)  # cached
    text = cost_summary(store, with_json=True).json_text
    emit_json(json.loads(text or ""))
    assert capsys.readouterr().out == f"{text}\n"


@pytest.mark.parametrize(
    "filters", [{"team": "vision"}, {"job_ids": [2, 4, 5]}, {"since": 7050.0}, {"team": "nlp", "since": 0.0}]
)
def test_filtered_reads_match(store: Store, filters: dict[str, Any]) -> None:
    cost_summary(store)  # every row cached first
    expected = report_of(store, **filters)
    assert_same_figures(cost_summary(store, with_json=True, **filters), expected)
    assert_same_figures(cost_summary(store, with_json=True, **filters), expected)


def test_a_changed_rate_card_prices_again(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cost_summary(store)
    card = tmp_path / "rates.yaml"
    card.write_text("currency: EUR\nrates:\n  - {gpu_type: H100, on_demand: 9.0}\n  - {gpu_type: A100, on_demand: 1}\n")
    seen = priced(monkeypatch)
    assert_same_figures(cost_summary(store, rates_path=card, with_json=True), report_of(store, rates_path=card))
    assert sorted(seen) == [1, 2, 3, 4, 6]
    seen.clear()
    assert cost_summary(store).currency == "USD" and seen == [4]  # the shipped card's rows are still there


def test_a_late_event_or_a_rewritten_attempt_prices_the_job_again(
    store: Store, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cost_summary(store)
    store.add_event(2, "checkpoint_moved", attempt=1, ts=4999.0, egress_money=3.25, bytes=10)
    store.add_event(2, "attempt_start", attempt=1, ts=5000.0, offer="aws/us/A100", price_per_gpu_hour=0.5)
    seen = priced(monkeypatch)
    late = cost_summary(store, with_json=True)
    assert sorted(seen) == [2, 4]
    assert_same_figures(late, report_of(store))
    db = sqlite3.connect(home / "state.db")  # a hand edit: job 6's attempt ended an hour later, no event
    db.execute("UPDATE attempts SET ended_at = ended_at + 3600 WHERE job_id = 6")
    db.commit()
    db.close()
    seen.clear()
    edited = cost_summary(store, with_json=True)
    assert sorted(seen) == [4, 6]
    assert_same_figures(edited, report_of(store))


def test_a_job_that_ends_is_priced_once_more_then_kept(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    cost_summary(store)
    store.end_attempt(
        4, 1, ended_at=8100.0, exit_code=0, outcome="completed", job_state="completed", reason=None, restarts=None
    )
    seen = priced(monkeypatch)
    assert_same_figures(cost_summary(store, with_json=True), report_of(store))
    assert seen == [4]
    seen.clear()
    assert_same_figures(cost_summary(store, with_json=True), report_of(store))
    assert seen == []


@pytest.mark.parametrize("damage", ["garbage", "truncated", "folder is a file", "other version"])
def test_a_damaged_cache_is_rebuilt_and_the_figures_stand(store: Store, home: Path, damage: str) -> None:
    cost_summary(store)
    path = home / "cache" / "cost.db"
    if damage == "garbage":
        path.write_bytes(b"not a database at all" * 100)
    elif damage == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3] + b"\0" * 5000)
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    elif damage == "folder is a file":
        for p in sorted(path.parent.iterdir()):
            p.unlink()
        path.parent.rmdir()
        path.parent.write_text("x")
    else:
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version=99")
        db.commit()
        db.close()
    assert_same_figures(cost_summary(store, with_json=True), report_of(store))
    assert_same_figures(cost_summary(store, with_json=True), report_of(store))
    if damage != "folder is a file":
        check = sqlite3.connect(path)
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        check.close()


def test_concurrent_reads_and_writes_leave_a_sound_cache(store: Store, home: Path) -> None:
    errors: list[BaseException] = []
    results: list[dict[str, Any]] = []

    def read() -> None:
        try:
            own = Store(home / "state.db")
            for _ in range(3):
                results.append(cost_summary(own, with_json=True).to_dict())
            own.close()
        except BaseException as err:  # noqa: BLE001 - reported below, with the thread's figures
            errors.append(err)

    def write() -> None:
        own = Store(home / "state.db")
        for ts in (9100.0, 9200.0, 9300.0):
            own.add_event(6, "checkpoint_moved", attempt=1, ts=ts, egress_money=1.0, bytes=1)
        own.close()

    threads = [threading.Thread(target=read) for _ in range(4)] + [threading.Thread(target=write)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 12 and all(r["jobs"][:4] == results[0]["jobs"][:4] for r in results)
    check = sqlite3.connect(home / "cache" / "cost.db")
    assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    check.close()
    assert_same_figures(cost_summary(store, with_json=True), report_of(store))


def test_the_command_lists_the_costliest_jobs(
    store: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run_cli(capsys, monkeypatch, "cost", "--limit", "2")
    assert code == 0
    expected = report_of(store)
    top = sorted(expected.jobs, key=lambda j: (-j["money"], j["id"]))[:2]
    assert "the 2 costliest of 5" in out and "3 more jobs: --limit N or --all" in out
    assert all(f"#{j['id']} {j['name']}" in out for j in top) and "total" in out and "killed: 1 attempt" in out
    assert "no rate for TPUv9/local/spot" in out
    code, out, _ = run_cli(capsys, monkeypatch, "cost", "--all")
    assert code == 0 and "more job" not in out and all(f"#{j['id']} " in out for j in expected.jobs)
    code, out, _ = run_cli(capsys, monkeypatch, "cost", "--json")
    assert code == 0
    assert json.loads(out)["jobs"] == expected.jobs and json.loads(out).keys() == expected.dict.keys()
    code, _, err = run_cli(capsys, monkeypatch, "cost", "--limit", "-1")
    assert code == 2 and "--limit" in err and "Traceback" not in err


def test_a_queued_job_is_looked_at_again_only_once_something_is_written_about_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job 5 waits (no attempt): once watched, a read passes it over until its record or its attempts change; when
    it starts (an attempt and its record written, no event yet) the next read prices it."""
    clock = [NOW]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    looked: list[list[int]] = []
    real = CostCache.lookup

    def spying(self: CostCache, filters: Any) -> Any:
        misses = real(self, filters)
        looked.append([m.job_id for m in misses])
        return misses

    monkeypatch.setattr(CostCache, "lookup", spying)

    def check() -> None:
        assert_same_figures(cost_summary(store, with_json=True), report_of(store))

    check()
    clock[0] += 10.0
    store.add_job(spec("later", "nlp"), "local")  # job 8: new
    check()
    clock[0] += 10.0
    check()  # the running job 4, and job 8, written at the latest time seen (a tie is looked at again)
    assert looked[-1] == [4, 8]
    clock[0] += 10.0
    store.set_job_state(6, "completed")  # another job's record written (priced again), at a later time
    check()
    assert looked[-1] == [4, 6, 8]
    clock[0] += 10.0
    check()  # 8 is passed over now: nothing written about it since it was looked at
    assert looked[-1] == [4]
    clock[0] += 10.0
    store.begin_attempt(5, 1, clock[0] - 5.0)  # job 5 started: its record and an attempt written, no event
    check()
    assert looked[-1] == [4, 5]
    clock[0] += 10.0
    check()
    assert looked[-1] == [4, 5]  # running now: priced at every read
    clock[0] += 10.0
    store.set_job_state(8, "cancelled")  # its record written, nothing else: looked at, kept as ended
    check()
    assert looked[-1] == [4, 5, 8]
    clock[0] += 10.0
    check()
    assert looked[-1] == [4, 5]
