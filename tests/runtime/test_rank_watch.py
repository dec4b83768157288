"""A rank that stops stepping is named by rank and host within the group timeout, not a silent hang.

The pure parts (who is a suspect, where a thread stands, the findings) are checked directly; the
whole path runs a 2-rank DDP job through the local backend with a ``hang`` fault on rank 1: the
waiting rank's watchdog reports it (event and log line), the group timeout ends the attempt, the
job is requeued and completes, and ``gpufleet diagnose`` gives a ``hung_rank`` finding.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import drive

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.errors import UsageError
from gpufleet.jobs.faults import FaultPlan
from gpufleet.runtime.watchdog import RankInfo, RankWatch, Stall, stall_seconds, suspects, where
from gpufleet.spec import parse_spec
from gpufleet.telemetry.ranks import rank_findings
from gpufleet.workloads.tinylm import TINY


def test_stall_threshold_is_a_quarter_of_the_timeout_within_bounds() -> None:
    assert stall_seconds(300) == 60 and stall_seconds(20) == 5 and stall_seconds(1) == 2 and stall_seconds(1e6) == 60


def test_suspects_are_the_ranks_not_waiting_or_silent() -> None:
    waiting = Stall(rank=0, step=7, since=0.0, waiting=True, where="graph.py:1 in _engine_run_backward")
    busy = Stall(rank=1, step=7, since=0.0, waiting=False, where="faults.py:80 in apply")
    assert suspects(2, {0: waiting, 1: busy}, 7) == [1]
    assert suspects(3, {0: waiting, 2: waiting}, 7) == [1]  # rank 1 said nothing: dead or frozen
    behind = Stall(rank=1, step=6, since=0.0, waiting=True, where="x")
    assert suspects(2, {0: waiting, 1: behind}, 7) == [1]


def test_where_tells_a_collective_from_user_code() -> None:
    assert where(None) == (False, "?")
    here = sys._getframe()
    assert where(here)[0] is False and "test_where_tells" in where(here)[1]


def test_the_lowest_waiting_rank_reports_a_silent_rank_once(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    ranks = [RankInfo(0, "node-a", 10), RankInfo(1, "node-b", 11)]
    watch = RankWatch(
        rank=0,
        ranks=ranks,
        folder=tmp_path,
        stall_s=2.0,
        timeout_s=8.0,
        emit=lambda kind, **data: events.append({"kind": kind, **data}),
        poll_s=0.5,
    )
    watch.folder.mkdir(exist_ok=True)
    watch.progress(7)
    start = time.monotonic()
    # This thread is the main thread and stands in this test (not a collective): pretend it waits.
    import gpufleet.runtime.watchdog as wd

    original = wd.where
    wd.where = lambda frame: (True, "distributed_c10d.py:1 in all_reduce")
    try:
        watch.check(start + 0.5)
        assert not events and not watch.path.exists()  # not stalled yet
        watch.check(start + 1.2)  # half the threshold: the files are written, the others get two polls
        assert not events and json.loads(watch.path.read_text())["waiting"] is True
        watch.check(start + 2.5)
        watch.check(start + 3.0)
    finally:
        wd.where = original
    assert [e["kind"] for e in events] == ["rank_stalled"]
    assert events[0]["ranks"] == [1] and events[0]["hosts"] == ["node-b"] and events[0]["step"] == 7
    # Before three steps are timed the threshold is the stall time; rank 1 runs on another host: reported only.
    assert events[0]["threshold_s"] == 2.0 and events[0]["action"] == "reported" and events[0]["killed"] == []
    assert events[0]["phases"] == {"1": "unknown"} and events[0]["hung"] is True
    watch.progress(8)
    watch.check(time.monotonic())
    assert [e["kind"] for e in events] == ["rank_stalled", "rank_stall_cleared"] and not watch.path.exists()


def test_a_hang_fault_names_its_rank_and_strikes_in_the_first_attempt_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    plan = FaultPlan.parse("nan@3:r1,hang@5:r1")
    loss = torch.tensor(1.0)
    assert plan.apply(loss, 3, rank=0).item() == 1.0 and plan.apply(loss, 3, rank=1).isnan()
    monkeypatch.setenv("GPUFLEET_ATTEMPT", "2")
    assert plan.apply(loss, 5, rank=1).item() == 1.0  # a requeued attempt is not hung again
    with pytest.raises(UsageError, match="KIND@STEP"):
        FaultPlan.parse("hang@5:rank1")


def test_straggler_from_the_ranks_waits() -> None:
    steps = [
        {"kind": "step", "attempt": 1, "ts": 100.0 + i, "rank_step_s": [0.05, 0.15], "rank_wait_s": [0.1, 0.0005]}
        for i in range(5)
    ]
    group = {"kind": "group", "attempt": 1, "ts": 99.0, "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "b"}]}
    found = rank_findings([group, *steps])
    assert [f.rule_id for f in found] == ["straggler"] and found[0].gpus == ("rank1@b",)
    assert found[0].observed == pytest.approx(0.1 / 0.15)
    even = [{**e, "rank_wait_s": [0.001, 0.001]} for e in steps]
    assert rank_findings([group, *even]) == []


def hang_spec(timeout_s: float) -> Any:
    return parse_spec(
        {
            "name": "hangs",
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": {**TINY, "steps": 14},
            "resources": {"nodes": 1, "gpus": 2, "cpus": 2},
            "distributed": {"strategy": "ddp", "timeout_seconds": timeout_s},
            "checkpoint": {"every_steps": 4, "grace_seconds": 10},
            "max_restarts": 3,
        }
    )


@pytest.mark.timeout(900)
def test_a_stuck_rank_is_named_then_the_group_is_requeued_and_completes(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=2, poll_s=0.05)
    try:
        job = backend.submit(hang_spec(timeout_s=16), env={"GPUFLEET_FAULT": "hang@9:r1"})
        drive(scheduler, lambda: backend.store.job(job).state in ("completed", "failed"), timeout=600)
    finally:
        scheduler.shutdown(grace_s=30)
    row = backend.store.job(job)
    assert row.state == "completed", row.reason
    assert [a.outcome for a in backend.store.attempts(job)] == ["requeued", "completed"]
    stalled = [e for e in backend.store.events(job, kinds=["rank_stalled"])]
    assert len(stalled) == 1 and stalled[0].attempt == 1
    data = stalled[0].data
    assert data["ranks"] == [1] and data["waiting"] == [0] and data["step"] == 9
    assert "faults.py" in data["where"]["1"]  # where the stuck rank stood
    log = (home / "jobs" / str(job) / "logs" / "attempt-1.log").read_text()
    assert "rank 1 on" in log and "has not finished step 10" in log
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "diagnose", str(job), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    findings = json.loads(out.stdout)["findings"]
    hung = [f for f in findings if f["rule_id"] == "hung_rank"]
    assert len(hung) == 1 and hung[0]["gpus"][0].startswith("rank1@") and hung[0]["extra"]["step"] == 9
