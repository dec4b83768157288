"""Per-rank phases, stragglers and hangs on real 2-rank DDP jobs of a user's script (``_user_ddp_loop.py``).

Each test runs one job through the local backend, as ``gpufleet submit`` does: a rank made slow in its
compute is named as a straggler in the right phase soon after it slows; a healthy run reports its
ranks' phase totals and names nobody; a rank frozen by SIGSTOP is named as hung, killed, and the job
completes in a later attempt. Each waits on states (the job's end, an event in the store), with a
timeout only as a safety net.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import drive, process_gone

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.jobs.store import Event
from gpufleet.spec import JobSpec, parse_spec

SCRIPT = Path(__file__).with_name("_user_ddp_loop.py")
PHASES = ("data_wait", "compute", "collective", "optimizer", "checkpoint", "straggler_wait")
ENDED = ("completed", "failed", "cancelled")
ONSET = 31


def ddp_job(name: str, *, steps: int = 60, **distributed: Any) -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "entrypoint": ["python", str(SCRIPT), "--steps", str(steps)],
            "resources": {"gpus": 2, "cpus": 2},
            "distributed": {"strategy": "ddp", "timeout_seconds": 120, **distributed},
            "checkpoint": {"every_steps": 10, "keep": 2, "grace_seconds": 20},
            "max_restarts": 2,
        }
    )


@pytest.fixture
def local2(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LocalBackend, LocalScheduler]]:
    """A local backend with two slots that spawns nothing, and its scheduler, ticked by the test."""
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=2, poll_s=0.05)
    yield backend, scheduler
    scheduler.shutdown(grace_s=30)


def run_to_end(local2: tuple[LocalBackend, LocalScheduler], spec: JobSpec, env: dict[str, str]) -> int:
    backend, scheduler = local2
    job = backend.submit(spec, env=env)
    drive(scheduler, lambda: backend.store.job(job).state in ENDED, timeout=600)
    assert backend.store.job(job).state == "completed", backend.store.job(job).reason
    return job


def runtime_events(backend: LocalBackend, job: int, kind: str) -> list[Event]:
    return [e for e in backend.store.events(job, kinds=[kind]) if e.source == "runtime"]


def per_rank(values: Any) -> list[float]:
    """A phase's list of one finite non-negative number per rank (2 ranks)."""
    assert isinstance(values, list) and len(values) == 2, values
    assert all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in values), values
    return [float(v) for v in values]


@pytest.mark.timeout(900)
def test_a_rank_with_slow_compute_is_named_in_the_compute_phase_soon_after_it_slows(
    local2: tuple[LocalBackend, LocalScheduler],
) -> None:
    slow = {"SLOW_RANK": "1", "SLOW_FROM": str(ONSET), "SLOW_KIND": "compute", "SLOW_FACTOR": "3"}
    job = run_to_end(local2, ddp_job("slow-compute"), slow)
    stragglers = runtime_events(local2[0], job, "straggler")
    named = [e.data for e in stragglers if e.data.get("status") == "named"]
    assert named, [e.data for e in stragglers]
    first = named[0]
    assert (first["rank"], first["phase"]) == (1, "compute"), named
    assert ONSET <= first["step"] <= ONSET + 20, first
    assert first["factor"] >= 1.5 and first["host"] and first["gpus_per_rank"] == 1, first
    assert all((e["rank"], e["phase"]) == (1, "compute") for e in named), named
    last = [e.data for e in stragglers][-1]
    assert last["status"] == "ended" and last["tax_s"] > 0, last  # the session ended: the final tax


@pytest.mark.timeout(900)
def test_a_healthy_run_reports_each_ranks_phase_totals_and_names_no_straggler(
    local2: tuple[LocalBackend, LocalScheduler],
) -> None:
    job = run_to_end(local2, ddp_job("healthy"), {})
    backend = local2[0]
    assert runtime_events(backend, job, "straggler") == []
    steps = [e.data for e in runtime_events(backend, job, "step") if "phase_totals_s" in e.data]
    assert steps, "no step event carries phase_totals_s"
    for data in steps:
        assert set(data["phase_totals_s"]) == set(PHASES) and set(data["rank_phase_s"]) == set(PHASES), data
        for phase in PHASES:
            per_rank(data["rank_phase_s"][phase])
    totals = [{p: per_rank(d["phase_totals_s"][p]) for p in PHASES} for d in steps]
    for before, after in itertools.pairwise(totals):  # monotone within the attempt
        assert all(a >= b for p in PHASES for a, b in zip(after[p], before[p], strict=True)), (before, after)
    last = totals[-1]
    assert all(last["compute"][r] > 0 and last["data_wait"][r] > 0 for r in (0, 1)), last
    end = runtime_events(backend, job, "session_end")[-1].data
    assert set(end["phase_totals_s"]) == set(PHASES), end


def stop_rank_one_once_it_trains(backend: LocalBackend, scheduler: LocalScheduler, job: int) -> int:
    """SIGSTOP rank 1 of attempt 1 once a step event past step 8 is in the store (the median step is known); its pid."""
    pid: list[int] = []

    def training() -> bool:
        events = [e for e in backend.store.events(job, kinds=["group", "step"]) if e.attempt == 1]
        groups = [e for e in events if e.kind == "group"]
        if groups and any(e.kind == "step" and int(e.data.get("step") or 0) >= 8 for e in events):
            pid.append(int(groups[-1].data["ranks"][1]["pid"]))
            return True
        return False

    drive(scheduler, training, timeout=600)
    os.kill(pid[0], signal.SIGSTOP)
    return pid[0]


def stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] == "T"


@pytest.mark.timeout(900)
def test_a_frozen_rank_is_named_hung_and_killed_and_the_job_completes_in_a_later_attempt(
    local2: tuple[LocalBackend, LocalScheduler],
) -> None:
    backend, scheduler = local2
    job = backend.submit(ddp_job("frozen", steps=60, hang_floor_seconds=3), env={"GPUFLEET_LOG_EVERY_S": "0"})
    pid = stop_rank_one_once_it_trains(backend, scheduler, job)
    try:
        drive(scheduler, lambda: backend.store.job(job).state in ENDED, timeout=600)
    finally:
        if stopped(pid):  # the job did not kill it: let the scheduler's shut-down end it
            os.kill(pid, signal.SIGCONT)
    assert backend.store.job(job).state == "completed", backend.store.job(job).reason
    hung = [e for e in runtime_events(backend, job, "rank_stalled") if e.attempt == 1]
    assert len(hung) == 1, [e.data for e in hung]
    data = hung[0].data
    assert data["ranks"] == [1] and data["hung"] is True and data["action"] == "killed", data
    assert data["phases"]["1"] in (*PHASES[:5], "unknown") and data["threshold_s"] >= 3, data
    assert process_gone(pid)
    attempts = backend.store.attempts(job)
    assert len(attempts) >= 2 and attempts[-1].outcome == "completed", attempts
