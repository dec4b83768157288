"""Multi-rank jobs on a real Ray cluster: two DDP ranks in the job's placement group, preempted together.

A job run straight and the same job preempted once end with bitwise equal weights, priced at two
GPUs per attempt; a job whose actor dies leaves no rank behind, resumes, and a cancel stops it.

The cluster is the one `scripts/dev-ray up` started (the `ray` fixture: fails under CI, skips
elsewhere, when none answers). Each rank asks for one CPU (``resources.cpus: 2`` shared by 2 ranks),
so the job fits the 2-CPU cluster dev-ray starts on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_bitwise_equal, final_dcp_state, follow, process_gone
from typer.testing import CliRunner

from gpufleet.backends.ray.backend import RayBackend
from gpufleet.backends.ray.runner import placement_name, read_status, status_path
from gpufleet.cli.app import app
from gpufleet.cost.ledger import build_ledger
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import store_usages
from gpufleet.jobs.store import latest_step
from gpufleet.spec import JobSpec, parse_spec
from gpufleet.workloads.tinylm import TINY

STEPS = 30


def tinylm_ddp(name: str) -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "team": "perception",
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": {**TINY, "steps": STEPS},
            "resources": {"nodes": 1, "gpus": 2, "cpus": 2},
            "distributed": {"strategy": "ddp", "timeout_seconds": 60},
            "checkpoint": {"every_steps": 5, "grace_seconds": 60},
            "max_restarts": 3,
        }
    )


def ended(backend: RayBackend, job: int) -> Callable[[], bool]:
    return lambda: backend.store.job(job).state in ("completed", "failed", "cancelled")


def final_state(home: Path, job: int) -> dict[str, Any]:
    return final_dcp_state(home, job, step=STEPS, world_size=2, strategy="ddp")


def cli(*args: str) -> dict[str, Any]:
    """``gpufleet ARGS`` in this process (its ``$GPUFLEET_HOME`` is the test's): the JSON it printed."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def placement_exists(job: int) -> bool:
    from ray.util.placement_group import get_placement_group

    try:
        get_placement_group(placement_name(job))
    except ValueError:
        return False
    return True


@pytest.fixture
def backend(ray: str, home: Path) -> Iterator[RayBackend]:
    backend = RayBackend(home)
    cpus = backend.cluster().resources().get("CPU", 0.0)
    assert cpus >= 2, f"the Ray cluster has {cpus:g} CPUs; two ranks need 2: restart it with GPUFLEET_RAY_CPUS=2"
    yield backend
    for job in backend.store.jobs():  # leave no actor or placement group of ours on the shared cluster
        if job.state not in ("completed", "failed", "cancelled"):
            backend.cancel(job.id)


@pytest.mark.timeout(600)
def test_two_ranks_complete_and_a_preempted_pair_resumes_bit_identical(backend: RayBackend, home: Path) -> None:
    store = backend.store
    straight = backend.submit(tinylm_ddp("straight"))
    follow(backend, ended(backend, straight))
    assert store.job(straight).state == "completed", store.job(straight).reason
    assert [a.outcome for a in store.attempts(straight)] == ["completed"]
    assert store.job(straight).spec.world_size == 2
    (group,) = store.events(straight, kinds=("group",))
    assert group.data["world_size"] == 2 and {r["rank"] for r in group.data["ranks"]} == {0, 1}
    (start,) = store.events(straight, kinds=("attempt_start",))
    assert [r["rank"] for r in start.data["ranks"]] == [0, 1]
    assert not placement_exists(straight), "the job's placement group outlived it"

    # Paced so the preemption lands mid-run on a loaded machine too (the pace changes no number).
    paced = tinylm_ddp("cut")
    cut = backend.submit(paced.copy_with(args={**paced.args, "step_seconds": 0.2}))
    follow(backend, lambda: store.job(cut).state == "running" and (latest_step(store, cut) or 0) >= 5)
    backend.preempt(cut)
    follow(backend, ended(backend, cut))
    job = store.job(cut)
    assert job.state == "completed" and job.restarts == 1, job.reason
    assert [a.outcome for a in store.attempts(cut)] == ["preempted", "completed"]
    assert len(store.events(cut, kinds=("sigterm",))) == 1 and not store.events(cut, kinds=("sigkill",))
    status = read_status(status_path(home, cut))
    assert status is not None and [len(a.ranks) for a in status.attempts] == [2, 2]
    first_pids = [r.pid for r in status.attempts[0].ranks]
    assert all(pid is not None and process_gone(pid) for pid in first_pids), "a rank of the preempted attempt lives on"
    ends = [e for e in store.events(cut, kinds=("session_end",)) if e.attempt == 1]
    assert [e.data["status"] for e in ends] == ["requeue"]  # the ranks agreed, saved and asked to be requeued
    saved = [e.data["step"] for e in store.events(cut, kinds=("checkpoint",)) if e.attempt == 1]
    (restored,) = [e for e in store.events(cut, kinds=("restore",)) if e.attempt == 2]
    assert saved and restored.data["step"] == max(saved)
    assert_bitwise_equal(final_state(home, cut), final_state(home, straight), "preempted vs uninterrupted")
    assert not placement_exists(cut)

    usages = store_usages(store, job_ids=[cut])
    assert len(usages) == 2 and all(u.gpus == 2 for u in usages)
    ledger = build_ledger(usages, load_rates())
    assert ledger.jobs[cut].total_gpu_hours == pytest.approx(sum(u.wall_s for u in usages) * 2 / 3600, rel=1e-9)
    assert ledger.jobs[cut].attempts == 2 and ledger.jobs[cut].preemptions == 1
    shown = cli("show", str(cut), "--json")
    assert shown["gpus"] == 2 and shown["spec"]["distributed"]["strategy"] == "ddp"
    assert [a["outcome"] for a in shown["attempts"]] == ["preempted", "completed"]
    listed = cli("ckpt", "list", str(home / "jobs" / str(cut) / "checkpoints"), "--json")
    assert {c["world_size"] for c in listed["checkpoints"]} == {2}


@pytest.mark.timeout(600)
def test_a_lost_actor_leaves_no_rank_alive_and_a_cancel_stops_every_rank(backend: RayBackend, home: Path) -> None:
    store = backend.store
    job = backend.submit(tinylm_ddp("lost").copy_with(args={**TINY, "steps": 100_000}))
    follow(backend, lambda: store.job(job).state == "running" and (latest_step(store, job) or 0) >= 5)
    before = read_status(status_path(home, job))
    assert before is not None and before.actor_pid is not None
    first = [r.pid for r in before.attempts[-1].ranks]
    os.kill(before.actor_pid, signal.SIGKILL)  # the job's actor dies as with its node
    follow(backend, lambda: any(e.attempt == 2 for e in store.events(job, kinds=("restore",))))
    assert all(pid is not None and process_gone(pid) for pid in first), "a rank outlived its job's actor"
    assert [a.outcome for a in store.attempts(job)] == ["lost", None]
    saved = [e.data["step"] for e in store.events(job, kinds=("checkpoint",)) if e.attempt == 1]
    (restored,) = [e for e in store.events(job, kinds=("restore",)) if e.attempt == 2]
    # The newest save the store had heard of, or a later one committed just before the kill whose event line
    # the dying rank never wrote: never an older one.
    assert restored.data["step"] >= max(saved) and restored.data["step"] % 5 == 0
    after = read_status(status_path(home, job))
    assert after is not None and after.actor_id == before.actor_id and after.actor_pid != before.actor_pid
    second = [r.pid for r in after.attempts[-1].ranks]
    backend.cancel(job)
    follow(backend, ended(backend, job))
    assert store.job(job).state == "cancelled"
    assert [a.outcome for a in store.attempts(job)] == ["lost", "cancelled"]
    assert all(pid is not None and process_gone(pid) for pid in second)
    follow(backend, lambda: not placement_exists(job), timeout=30)
