"""Jobs of several ranks on the real dev Slurm: one Slurm task per rank, started by srun.

The cluster is the one `scripts/dev-slurm up` started (the `slurm` fixture: fails under CI, skips
elsewhere, when none answers). Its partitions `low`/`high` hold one node of 2 CPUs, so two ranks
of one CPU each fill it; `wide` holds both of its nodes (two slurmd on this host) for the job over
two nodes. The dev cluster has no GPUs: ``GPUFLEET_SLURM_GRES=0`` leaves ``--gres`` out, while the
spec still asks for a GPU per rank, which is what the ledger prices.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_bitwise_equal, final_dcp_state, follow, service_missing
from typer.testing import CliRunner

from gpufleet.backends.slurm.backend import SlurmBackend, slurm_env, slurm_usage
from gpufleet.cli.app import app
from gpufleet.cost.ledger import build_ledger
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import store_usages
from gpufleet.jobs.store import TERMINAL, latest_step
from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.spec import JobSpec, parse_spec
from gpufleet.workloads.tinylm import TINY

STEPS = 120


def tinylm_ddp(name: str, **resources: int) -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "team": "perception",
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": {**TINY, "steps": STEPS},
            "resources": {"nodes": 1, "gpus": 2, "cpus": 2, "gpu_type": "A100", **resources},
            "distributed": {"strategy": "ddp", "timeout_seconds": 60},
            "checkpoint": {"every_steps": 10},
            "max_restarts": 3,
        }
    )


@pytest.fixture
def backend(slurm: dict[str, str], home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmBackend]:
    monkeypatch.setenv("GPUFLEET_SLURM_GRES", "0")
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    backend = SlurmBackend(home)
    yield backend
    backend.sync()
    for job in backend.store.jobs():  # leave nothing of ours queued or running on the shared cluster
        if job.state not in TERMINAL:
            backend.cancel(job.id)


def ended(backend: SlurmBackend, job: int) -> Callable[[], bool]:
    return lambda: backend.store.job(job).state in TERMINAL


def at_step(backend: SlurmBackend, job: int, step: int) -> Callable[[], bool]:
    return lambda: backend.store.job(job).state == "running" and (latest_step(backend.store, job) or 0) >= step


def final_state(home: Path, job: int) -> dict[str, Any]:
    return final_dcp_state(home, job, step=STEPS, world_size=2, strategy="ddp")


def task_exits(home: Path, job: int, attempt: int) -> dict[int, str]:
    """What srun said of each task's end in the attempt's log: task -> ``exit code N`` or ``Killed``."""
    log = (home / "jobs" / str(job) / "logs" / f"attempt-{attempt}.log").read_text()
    found: dict[int, str] = {}
    for match in re.finditer(r"srun: error: \S+: tasks? ([\d,-]+): (Exited with exit code \d+|Killed|Terminated)", log):
        for part in match.group(1).split(","):
            low, _, high = part.partition("-")
            for task in range(int(low), int(high or low) + 1):
                found[task] = match.group(2).replace("Exited with ", "")
    return found


def cli(*args: str) -> dict[str, Any]:
    """``gpufleet ARGS`` in this process (its ``$GPUFLEET_HOME`` is the test's): the JSON it printed."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def sacct_nodes(ref: str) -> list[str]:
    """How many nodes, and which, each run of Slurm job ``ref`` held, oldest first."""
    argv = ["sacct", "-X", "--duplicates", "--parsable2", "--noheader", "-j", ref, "-o", "NNodes,NodeList"]
    out = subprocess.run(argv, capture_output=True, text=True, env=slurm_env(), timeout=30, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def rank_pid(home: Path, job: int, attempt: int, rank: int) -> int | None:
    """The PID of one rank of an attempt, found by the variables every rank carries."""
    want = {f"GPUFLEET_JOB_DIR={home / 'jobs' / str(job)}", f"GPUFLEET_ATTEMPT={attempt}", f"RANK={rank}"}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = set(Path(f"/proc/{entry}/environ").read_bytes().decode(errors="replace").split("\0"))
        except OSError:
            continue
        if want <= environ:
            return int(entry)
    return None


@pytest.mark.timeout(600)
def test_two_ranks_complete_and_a_preempted_pair_resumes_bit_identical(backend: SlurmBackend, home: Path) -> None:
    store = backend.store
    straight = backend.submit(tinylm_ddp("straight"))
    follow(backend, ended(backend, straight))
    assert store.job(straight).state == "completed", store.job(straight).reason
    assert [a.outcome for a in store.attempts(straight)] == ["completed"]
    (group,) = store.events(straight, kinds=("group",))
    assert group.data["world_size"] == 2 and {r["rank"] for r in group.data["ranks"]} == {0, 1}
    assert task_exits(home, straight, 1) == {}  # srun reports only tasks that failed

    # Paced so the preemption lands mid-run on a loaded machine too (the pace changes no number): unpaced, the
    # 120 steps take about a second, and a preemption asked for at step 30 could find the job done.
    paced = tinylm_ddp("cut")
    cut = backend.submit(paced.copy_with(args={**paced.args, "step_seconds": 0.05}))
    follow(backend, at_step(backend, cut, 10))
    backend.preempt(cut)
    follow(backend, ended(backend, cut))
    job = store.job(cut)
    assert job.state == "completed" and job.restarts == 1, job.reason
    assert [a.outcome for a in store.attempts(cut)] == ["preempted", "completed"]
    assert len(store.events(cut, kinds=("sigterm",))) == 1
    # Each rank heard the preemption once, saved with the other and asked to be requeued; none was killed.
    # srun reports the tasks' exits unless the step is torn down before it prints (seen on a loaded machine).
    assert task_exits(home, cut, 1) in ({}, {0: "exit code 75", 1: "exit code 75"})
    ends = [e for e in store.events(cut, kinds=("session_end",)) if e.attempt == 1]
    assert [e.data["status"] for e in ends] == ["requeue"]
    saved = [e.data["step"] for e in store.events(cut, kinds=("checkpoint",)) if e.attempt == 1]
    (restored,) = [e for e in store.events(cut, kinds=("restore",)) if e.attempt == 2]
    assert saved and restored.data["step"] == max(saved) < STEPS
    assert_bitwise_equal(final_state(home, cut), final_state(home, straight), "preempted vs uninterrupted")

    usages = store_usages(store, job_ids=[cut])
    assert len(usages) == 2 and all(u.gpus == 2 for u in usages)  # GPU-hours = wall x 2 ranks
    ledger = build_ledger(usages, load_rates())
    assert ledger.jobs[cut].total_gpu_hours == pytest.approx(sum(u.wall_s for u in usages) * 2 / 3600, rel=1e-9)
    assert ledger.jobs[cut].attempts == 2 and ledger.jobs[cut].preemptions == 1
    report = slurm_usage(store)  # the CPUs of both tasks, as sacct bills them
    assert report["ok"] and all(r["ledger_seconds"] == r["sacct_seconds"] for r in report["accounts"]), report

    shown = cli("show", str(cut), "--json")
    assert shown["gpus"] == 2 and shown["spec"]["distributed"]["strategy"] == "ddp"
    assert [a["outcome"] for a in shown["attempts"]] == ["preempted", "completed"]
    listed = cli("ckpt", "list", str(home / "jobs" / str(cut) / "checkpoints"), "--json")
    assert {c["world_size"] for c in listed["checkpoints"]} == {2}


@pytest.mark.timeout(400)
def test_a_killed_rank_requeues_the_group(backend: SlurmBackend, home: Path) -> None:
    """SIGKILL one rank: the other finds the group broken, leaves the marker, and the attempt is requeued."""
    store = backend.store
    job = backend.submit(tinylm_ddp("killed").copy_with(args={**TINY, "steps": 600}))  # long enough to be caught
    found: list[int] = []

    def rank_1_running_past_a_save() -> bool:
        """Step 10 saved and rank 1 found alive (the store hears of steps late: a quick job could end unseen)."""
        pid = rank_pid(home, job, 1, 1) if at_step(backend, job, 10)() else None
        found[:] = [pid] if pid is not None else []
        return bool(found)

    follow(backend, rank_1_running_past_a_save)
    os.kill(found[0], signal.SIGKILL)
    follow(backend, ended(backend, job))
    assert store.job(job).state == "completed", store.job(job).reason
    assert [a.outcome for a in store.attempts(job)] == ["requeued", "completed"]
    assert task_exits(home, job, 1)[1] == "Killed"
    assert (home / "jobs" / str(job) / "rank-lost-attempt-1").exists()


@pytest.mark.timeout(400)
def test_two_nodes_one_rank_each(backend: SlurmBackend, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = subprocess.run(["sinfo", "-h", "-p", "wide", "-o", "%D"], capture_output=True, text=True, env=slurm_env())
    if nodes.stdout.strip() != "2":
        service_missing(f"no partition `wide` of two nodes ({nodes.stdout.strip()!r}): restart `scripts/dev-slurm up`")
    monkeypatch.setenv("GPUFLEET_SLURM_LOW", "wide")
    job = backend.submit(tinylm_ddp("wide", nodes=2, gpus=1, cpus=1))
    follow(backend, ended(backend, job))
    assert backend.store.job(job).state == "completed", backend.store.job(job).reason
    ref = backend.store.job(job).backend_ref
    assert ref is not None
    ((count, names),) = [run.split("|") for run in sacct_nodes(ref)]
    assert count == "2" and "," in names, names  # one rank on each node
    (group,) = backend.store.events(job, kinds=("group",))
    assert group.data["world_size"] == 2
    newest = CheckpointDir(home / "jobs" / str(job) / "checkpoints").scan()[-1]
    assert newest.step == STEPS and newest.manifest is not None and newest.manifest.world_size == 2
    (usage,) = store_usages(backend.store, job_ids=[job])
    assert usage.gpus == 2  # one per node
