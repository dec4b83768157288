"""``gpufleet resize``: a job changes its GPUs between attempts, and each attempt is priced at its own.

The refusals and the ledger's rule are checked without running a job; then, on the local backend,
a 2-rank FSDP job preempted after a checkpoint resumes on 4 ranks from its 2-rank checkpoint and
completes, with attempt 1 priced at 2 GPUs and attempt 2 at 4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import drive, final_dcp_state

from gpufleet.backends.base import Feature, resized_spec
from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.ray.backend import RayBackend
from gpufleet.backends.slurm.backend import SlurmBackend
from gpufleet.cost.usage import attempt_gpus, store_usages
from gpufleet.errors import SpecError, UsageError
from gpufleet.jobs.protocol import ENV_TORCHRUN_SHUTDOWN, ONE_RANK_RENDEZVOUS, entry_argv, job_environment, rank_argv
from gpufleet.jobs.store import Attempt, Event, Outcome, Store
from gpufleet.spec import JobSpec, parse_spec
from gpufleet.workloads.tinylm import TINY


def spec_of(name: str = "job", **overrides: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": name,
        "team": "t",
        "entrypoint": [sys.executable, "-c", "pass"],
        "resources": {"gpus": 1, "cpus": 1},
        "checkpoint": {"every_steps": 10, "grace_seconds": 20},
    }
    data.update(overrides)
    return parse_spec(data)


def group_of(gpus: int = 2, **overrides: Any) -> JobSpec:
    return spec_of(resources={"gpus": gpus, "cpus": 2}, distributed={"strategy": "fsdp"}, **overrides)


def spec_file(home: Path, job: int) -> JobSpec:
    return parse_spec(json.loads((home / "jobs" / str(job) / "spec.json").read_text()))


@pytest.fixture
def slots4(home: Path, monkeypatch: pytest.MonkeyPatch) -> LocalBackend:
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "4")
    return LocalBackend(home, spawn=False)


# ---- the spec rewrite -----------------------------------------------------------------------------


def test_a_group_resized_to_one_gpu_stays_a_torchrun_group_of_one_rank() -> None:
    group = group_of(2)
    one = resized_spec(group, gpus=1, nodes=None, source="job 1 resized")
    assert one.distributed is not None and one.distributed.one_rank and one.world_size == 1 and one.total_gpus == 1
    assert group.distributed is not None
    assert one.distributed.model_dump(exclude={"one_rank"}) == group.distributed.model_dump(exclude={"one_rank"})
    assert one.model_dump(exclude={"resources", "distributed"}) == group.model_dump(
        exclude={"resources", "distributed"}
    )
    # Started by torchrun with one rank, which gives it RANK, LOCAL_RANK, WORLD_SIZE as it gave the two.
    assert entry_argv(one)[1:4] == ["-m", "gpufleet.backends.group_launch", "--nproc-per-node=1"]
    back = resized_spec(one, gpus=2, nodes=None, source="job 1 resized")
    assert back.world_size == 2 and back.distributed is not None and back.distributed.strategy == "fsdp"
    plain_one = resized_spec(group, gpus=1, nodes=None, source="job 1 resized", one_process=True)
    assert plain_one.distributed is None and plain_one.world_size == 1 and entry_argv(plain_one) == rank_argv(group)
    with pytest.raises(UsageError, match=r"^gpus=2 on 1 node\(s\) is a world of 2 ranks, but one_process runs"):
        resized_spec(group, gpus=2, nodes=None, source="job 1 resized", one_process=True)
    four = resized_spec(group, gpus=4, nodes=None, source="job 1 resized")
    assert four.distributed == group.distributed and four.world_size == 4
    two_nodes = resized_spec(group, gpus=1, nodes=2, source="job 1 resized")  # one GPU on each of 2 nodes: a group
    assert two_nodes.distributed == group.distributed and two_nodes.world_size == 2
    plain = resized_spec(spec_of(), gpus=3, nodes=None, source="job 1 resized")
    assert plain.distributed is None and plain.world_size == 1 and plain.total_gpus == 3  # one process, 3 GPUs


def test_every_one_rank_attempt_gets_torchruns_rendezvous_variables(home: Path) -> None:
    """A script that reads RANK/LOCAL_RANK or calls init_process_group() runs as one process too."""
    rendezvous = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    plain = job_environment(spec_of(), 1, home, "local")
    assert {k: plain[k] for k in rendezvous} == ONE_RANK_RENDEZVOUS
    one_rank = job_environment(resized_spec(group_of(2), gpus=1, nodes=None, source="x"), 1, home, "local")
    assert {k: one_rank[k] for k in rendezvous} == ONE_RANK_RENDEZVOUS  # torchrun sets the same for its rank
    assert ENV_TORCHRUN_SHUTDOWN in one_rank
    assert not set(rendezvous) & set(job_environment(group_of(2), 1, home, "local"))  # torchrun's own, per rank
    own = job_environment(spec_of(env={"MASTER_PORT": "29555"}), 1, home, "local")
    assert own["MASTER_PORT"] == "29555"  # the spec's env wins
    script = (
        "import os, torch.distributed as d; d.init_process_group('gloo'); "
        "print(os.environ['LOCAL_RANK'], d.get_world_size())"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, **plain}, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.split() == ["0", "1"], out.stderr


def test_a_submitted_one_rank_group_needs_the_flag() -> None:
    with pytest.raises(SpecError, match=r"or set distributed.one_rank: true"):
        spec_of(distributed={"strategy": "ddp"})
    assert spec_of(distributed={"strategy": "ddp", "one_rank": True}).world_size == 1


@pytest.mark.parametrize(
    ("gpus", "nodes", "match"),
    [
        (-1, None, r"^gpus=-1 is invalid: give the GPUs per node, from 0 to 1024$"),
        (2000, None, r"^gpus=2000 is invalid"),
        (1, 0, r"^nodes=0 is invalid: give the number of nodes, from 1 to 1024$"),
        (1, 2, r"^nodes=2: this job is one process \(it has no `distributed` block\), which runs on one node"),
    ],
)
def test_bad_sizes_are_refused_naming_the_value(gpus: int, nodes: int | None, match: str) -> None:
    with pytest.raises(UsageError, match=match) as err:
        resized_spec(spec_of(), gpus=gpus, nodes=nodes, source="job 1 resized")
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


# ---- the refusals ---------------------------------------------------------------------------------


def test_a_queued_group_resized_to_one_gpu_is_stored_with_a_resized_event(slots4: LocalBackend, home: Path) -> None:
    job = slots4.submit(group_of(2))
    done = slots4.resize(job, 1)
    assert done.changed and done.one_rank_group and not done.distributed_dropped and done.state == "queued"
    stored = slots4.store.job(job).spec
    assert stored == done.after and stored.distributed is not None and stored.total_gpus == 1
    (event,) = slots4.store.events(job, kinds=("resized",))
    assert event.data == {
        "old_gpus": 2,
        "new_gpus": 1,
        "old_world_size": 2,
        "new_world_size": 1,
        "distributed_dropped": False,
        "one_rank_group": True,
    }
    # The attempt's copy follows when the attempt starts, not before (a running attempt's ranks read it).
    assert spec_file(home, job).total_gpus == 2
    again = slots4.resize(job, 1)
    assert not again.changed and len(slots4.store.events(job, kinds=("resized",))) == 1


def test_an_ended_job_is_refused(slots4: LocalBackend) -> None:
    job = slots4.submit(spec_of())
    slots4.store.set_job_state(job, "completed")
    with pytest.raises(UsageError, match=rf"^job {job} is already completed$"):
        slots4.resize(job, 2)
    assert slots4.store.job(job).spec.total_gpus == 1 and slots4.store.events(job, kinds=("resized",)) == []


def test_a_job_that_ends_or_changes_meanwhile_is_not_resized(slots4: LocalBackend) -> None:
    """The store writes the new spec only over the one the resize read, on a job that has not ended."""
    job = slots4.submit(spec_of())
    old = slots4.store.job(job).spec
    slots4.resize(job, 2)
    with pytest.raises(UsageError, match=rf"^job {job} was resized by another command meanwhile"):
        slots4.store.replace_spec(job, old, old.copy_with(resources={"gpus": 3}), "resized")
    slots4.store.set_job_state(job, "cancelled")
    current = slots4.store.job(job).spec
    with pytest.raises(UsageError, match=rf"^job {job} is already cancelled: an ended job keeps the spec"):
        slots4.store.replace_spec(job, current, current.copy_with(resources={"gpus": 4}), "resized")
    assert slots4.store.job(job).spec.total_gpus == 2


def test_more_gpus_than_the_local_slots_are_refused(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    backend = LocalBackend(home, spawn=False)
    job = backend.submit(group_of(2))
    with pytest.raises(UsageError, match=r"^gpus=3 exceeds the local backend's 2 virtual GPU slot\(s\): give 2"):
        backend.resize(job, 3)
    with pytest.raises(UsageError, match=r"does not support jobs over more than one node"):
        backend.resize(job, 1, nodes=2)
    assert backend.store.job(job).spec.total_gpus == 2 and backend.store.events(job, kinds=("resized",)) == []


def test_a_backend_without_the_feature_refuses(home: Path) -> None:
    class Fixed(LocalBackend):
        features = frozenset({Feature.PREEMPT_GRACE, Feature.MULTI_RANK})

    backend = Fixed(home, spawn=False)
    job = backend.submit(spec_of())
    with pytest.raises(UsageError, match=r"^the local backend does not support changing a job's GPUs"):
        backend.resize(job, 2)
    assert backend.store.events(job, kinds=("resized",)) == []


@pytest.mark.parametrize("name", ["slurm", "ray"])
def test_slurm_and_ray_refuse_before_asking_their_scheduler(home: Path, name: str) -> None:
    """Their request (sbatch's, the actor's placement group) is fixed at submission: cancel and resubmit."""

    def unreachable(argv: Any) -> subprocess.CompletedProcess[str]:
        raise AssertionError(f"{argv} was run")

    backend = SlurmBackend(home, runner=unreachable) if name == "slurm" else RayBackend(home)  # no cluster: never used
    job = backend.store.add_job(group_of(2), name)
    with pytest.raises(UsageError, match=rf"^the {name} backend does not support changing a job's GPUs") as err:
        backend.resize(job, 4)
    assert "cancel the job and submit its spec again" in str(err.value) and err.value.exit_code == 2
    assert backend.store.job(job).spec.total_gpus == 2


def test_the_cli_resizes_and_refuses_in_one_line(slots4: LocalBackend, home: Path) -> None:
    job = slots4.submit(group_of(2))
    env = {**os.environ, "GPUFLEET_HOME": str(home), "GPUFLEET_LOCAL_SLOTS": "4", "COLUMNS": "200"}
    cli = [sys.executable, "-m", "gpufleet.cli", "resize", str(job)]
    bad = subprocess.run([*cli, "--gpus", "-3"], capture_output=True, text=True, env=env, timeout=120)
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "error: --gpus -3 is invalid: give the GPUs per node, from 0 to 1024"
    )
    ok = subprocess.run([*cli, "--gpus", "1", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert (result["before"]["world_size"], result["after"]["world_size"]) == (2, 1)
    assert result["after"]["launcher"] == "torchrun" and result["one_rank_group"] is True
    assert result["distributed_dropped"] is False and result["state"] == "queued" and result["preempted"] is False
    bad = subprocess.run([*cli, "--gpus", "2", "--one-process"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --gpus 2 on 1 node(s) is a world of 2 ranks")
    assert "--one-process runs the job as one process" in bad.stderr
    plain = subprocess.run([*cli, "--gpus", "1", "--one-process"], capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert f"job {job}: 1 GPU (one rank, torchrun) -> 1 GPU (one process)" in plain.stdout
    assert "without torchrun" in " ".join(plain.stdout.split())
    slots4.store.set_job_state(job, "running")
    text = subprocess.run([*cli, "--gpus", "2"], capture_output=True, text=True, env=env, timeout=120)
    assert text.returncode == 0, text.stderr
    assert f"job {job}: 1 GPU (one process) -> 2 GPUs (one process)" in text.stdout
    assert f"`gpufleet preempt {job}` applies the change now" in " ".join(text.stdout.split())
    assert not (home / "scheduler.pid").exists()  # a resize starts no scheduler


# ---- the ledger -----------------------------------------------------------------------------------


def test_each_attempt_is_priced_at_the_gpus_it_started_with(home: Path) -> None:
    """From the backend's own attempt_start; older records: the GPUs in force when they started, else the spec."""
    store = Store(home / "state.db")
    job = store.job(store.add_job(spec_of(resources={"gpus": 8}), "local"))

    def attempt(n: int, started_at: float) -> Attempt:
        return Attempt(job.id, n, "ended", 1, started_at, started_at + 5, 75, Outcome.PREEMPTED, None, None)

    def event(kind: str, n: int | None, ts: float, source: str = "backend", **data: Any) -> Event:
        return Event(job.id, n, ts, kind, source, data)

    events = [
        event("attempt_start", 1, 100.0, pid=1, gpus=2, world_size=2),
        event("attempt_start", 2, 200.0, source="runtime", gpus=0),  # user code writes the runtime's log
        event("resized", None, 250.0, old_gpus=4, new_gpus=8),
        event("attempt_start", 3, 300.0, pid=3),  # written before attempts carried their GPUs
    ]
    assert attempt_gpus(job, attempt(1, 100.0), events) == 2
    assert attempt_gpus(job, attempt(2, 200.0), events) == 4  # in force until the resize at 250
    assert attempt_gpus(job, attempt(3, 300.0), events) == 8
    assert attempt_gpus(job, attempt(3, 300.0), []) == 8


# ---- end to end on the local backend --------------------------------------------------------------


@pytest.mark.timeout(900)
def test_a_2_rank_fsdp_job_resized_to_4_resumes_on_4_ranks_and_each_attempt_is_priced_at_its_own(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "4")
    assert TINY["batch_size"] % 4 == 0  # every rank of 2 and of 4 gets its rows of the same global batch
    spec = parse_spec(
        {
            "name": "grow",
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": {**TINY, "steps": 20},
            "resources": {"nodes": 1, "gpus": 2, "cpus": 2},
            "distributed": {"strategy": "fsdp", "timeout_seconds": 120},
            "checkpoint": {"every_steps": 4, "grace_seconds": 60},
        }
    )
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=4, poll_s=0.05)
    try:
        job = backend.submit(spec)

        def saved() -> bool:
            return any(e.attempt == 1 for e in backend.store.events(job, kinds=("checkpoint",)))

        drive(scheduler, saved, timeout=600)
        done = backend.resize(job, 4)
        assert done.state == "running" and not done.distributed_dropped
        assert scheduler.running[job].job.spec.total_gpus == 2  # the attempt keeps the GPUs it started on
        assert spec_file(home, job).total_gpus == 2
        backend.preempt(job)
        drive(scheduler, lambda: backend.store.job(job).state in ("completed", "failed"), timeout=600)
    finally:
        scheduler.shutdown(grace_s=30)
    stored = backend.store.job(job)
    assert stored.state == "completed", stored.reason
    assert [a.outcome for a in backend.store.attempts(job)] == ["preempted", "completed"]
    starts = backend.store.events(job, kinds=("attempt_start",))
    assert [(e.attempt, e.data["gpus"], e.data["world_size"]) for e in starts] == [(1, 2, 2), (2, 4, 4)]
    assert [u.gpus for u in store_usages(backend.store, job_ids=[job])] == [2, 4]
    saved_steps = [e.data["step"] for e in backend.store.events(job, kinds=("checkpoint",)) if e.attempt == 1]
    (restore,) = [e for e in backend.store.events(job, kinds=("restore",)) if e.attempt == 2]
    assert restore.data["step"] == max(saved_steps) < 20  # from the 2-rank checkpoint attempt 1 saved last
    assert [e.attempt for e in backend.store.events(job, kinds=("rng_reseeded",))] == [2]  # another world size
    assert spec_file(home, job) == stored.spec and stored.spec.world_size == 4
    final_dcp_state(home, job, step=20, world_size=4, strategy="fsdp")
    # Steps the ranks close together at one agreement are each logged at their own throughput.
    rates = [e.data["tokens_per_s"] for e in backend.store.events(job, kinds=("step",))]
    assert len(rates) >= 20 and max(rates) < 100 * min(rates), rates
