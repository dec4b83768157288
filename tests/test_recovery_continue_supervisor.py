"""The elastic rank supervisor (``recovery: continue``) with stand-in replicas: no training, torchft's Lighthouse only.

Each replica is a small Python program that records its PID and, when it is a replacement, says it
has healed (the marker ``runtime.elastic`` leaves) or never does. The supervisor must replace a
killed replica without touching the others, record ``group_reformed`` once the replacement heals,
fall back to the requeue when it does not heal in time, and end a replacement still healing once
another replica completed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_recovery_continue import need_torchft

REPLICA = """
import json, os, pathlib, time
rank, mode = int(os.environ["GPUFLEET_REPLICA_RANK"]), os.environ["MODE"]
here = pathlib.Path(os.environ["GPUFLEET_JOB_DIR"]) / "ranks" / "attempt-1"
here.mkdir(parents=True, exist_ok=True)
replacement = (here / f"started-{rank}").exists()
(here / f"started-{rank}").write_text("")
(here / f"pid-{rank}-{os.getpid()}").write_text(os.environ["WORLD_SIZE"] + " " + os.environ["RANK"])
if replacement and mode == "heal":
    (here / f"replica-live-{rank}").write_text(json.dumps({"pid": os.getpid(), "step": 7, "healed": True}))
while not (here / "finish").exists() and not (here / f"finish-{rank}").exists():
    time.sleep(0.05)
"""


def wait_for(what: str, found: Callable[[], Any], timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout  # a safety net only: each wait is for a state
    while not (result := found()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


def launch(job: Path, mode: str, **env: str) -> subprocess.Popen[str]:
    need_torchft()
    job.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "gpufleet.backends.group_launch", "--nproc-per-node=2", "--", "-c", REPLICA]
    full = {
        **os.environ,
        "MODE": mode,
        "GPUFLEET_RECOVERY": "continue",
        "GPUFLEET_JOB_DIR": str(job),
        "GPUFLEET_EVENTS": str(job / "events.jsonl"),
        "GPUFLEET_ATTEMPT": "1",
        "GPUFLEET_EXIT_GRACE_S": "5",
        **env,
    }
    return subprocess.Popen(command, env=full, stderr=subprocess.PIPE, text=True)


def pids(job: Path, rank: int) -> list[int]:
    return sorted(int(p.name.rsplit("-", 1)[1]) for p in (job / "ranks" / "attempt-1").glob(f"pid-{rank}-*"))


def events(job: Path) -> list[dict[str, Any]]:
    path = job / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kill_rank_1(job: Path, victim: int = 1) -> tuple[int, int]:
    wait_for("both replicas", lambda: pids(job, 0) and pids(job, 1))
    first = pids(job, 0)[0], pids(job, 1)[0]
    os.kill(first[victim], signal.SIGKILL)
    wait_for("the replacement", lambda: len(pids(job, victim)) == 2)
    return first


@pytest.mark.timeout(300)
def test_a_killed_replica_is_replaced_alone_and_its_heal_is_recorded(tmp_path: Path) -> None:
    job = tmp_path / "job"
    proc = launch(job, "heal")
    rank0, rank1 = kill_rank_1(job)
    reformed = wait_for("group_reformed", lambda: [e for e in events(job) if e["kind"] == "group_reformed"])
    (job / "ranks" / "attempt-1" / "finish").write_text("")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert pids(job, 0) == [rank0]  # the survivor kept its process, and was never started again
    (event,) = reformed
    assert event["replaced"] == [1] and event["tier"] == "peer" and event["recovery"] == "continue"
    assert event["pids"] == {"0": rank0, "1": next(p for p in pids(job, 1) if p != rank1)} and event["step"] == 7
    assert "rank 1 killed by SIGKILL: the others step on while a replacement starts" in err
    world = {(job / "ranks" / "attempt-1" / f"pid-0-{rank0}").read_text()}
    assert world == {"1 0"}  # torch sees a world of one in every replica


@pytest.mark.timeout(300)
def test_a_replacement_that_does_not_heal_in_time_requeues_the_attempt(tmp_path: Path) -> None:
    job = tmp_path / "job"
    proc = launch(job, "never", GPUFLEET_RECOVERY_TIMEOUT_S="1")
    kill_rank_1(job)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert "the replacement did not heal within 1 s" in err
    assert not [e for e in events(job) if e["kind"] == "group_reformed"]


@pytest.mark.timeout(300)
def test_a_replacement_still_healing_when_a_replica_completes_is_ended_and_the_attempt_completes(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job"
    proc = launch(job, "never")
    kill_rank_1(job)
    (job / "ranks" / "attempt-1" / "finish-0").write_text("")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "a replica completed before rank 1 healed: ending the replacement" in err


@pytest.mark.timeout(300)
def test_a_replica_completing_while_replica_0_still_heals_requeues_the_attempt(tmp_path: Path) -> None:
    job = tmp_path / "job"
    proc = launch(job, "never")
    kill_rank_1(job, victim=0)  # replica 0 writes the job's checkpoints and events
    (job / "ranks" / "attempt-1" / "finish-1").write_text("")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert "replica 0 had not healed when another replica completed its session" in err
