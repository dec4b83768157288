"""Multi-rank jobs on the Ray backend without Ray: bundles, rank environments, outcomes, the rank group.

``InProcessPlacement`` stands for the job's placement group: each rank is a :class:`RankProcess`
object in this process (the body Ray runs as the rank's actor), so the job's actor runs real rank
processes through its real code paths.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends.base import Feature
from gpufleet.backends.ray.backend import RayBackend, actor_options, placement_bundles
from gpufleet.backends.ray.ranks import (
    RankGone,
    RankGroup,
    RankProcess,
    RankSlot,
    group_exit,
    rank_environments,
    rank_order,
)
from gpufleet.backends.ray.runner import JobRunner, RunnerArgs, read_status, status_path
from gpufleet.cost.usage import store_usages
from gpufleet.errors import UsageError
from gpufleet.runtime.group import lost_marker
from gpufleet.spec import JobSpec, parse_spec

# Each rank records its environment; in attempt 1 it waits for SIGTERM, counts the SIGTERMs it
# gets for a while, and exits 75 ("requeue me"); later attempts exit 0 at once.
RANK = """
import os, signal, sys, time
n, rank, folder = os.environ["GPUFLEET_ATTEMPT"], os.environ["RANK"], os.environ["GPUFLEET_JOB_DIR"]
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
with open(os.path.join(folder, f"env-a{n}-r{rank}"), "w") as fh:
    fh.write(" ".join(os.environ[k] for k in names))
sys.stdout.write(f"rank {rank} attempt {n}\\n")  # one write: the ranks share the log, unbuffered
sys.stdout.flush()
if n != "1":
    sys.exit(0)
hits = []
signal.signal(signal.SIGTERM, lambda *_: hits.append(1))
open(os.path.join(folder, f"ready-r{rank}"), "w").close()
while not hits:
    time.sleep(0.01)
time.sleep(0.5)
with open(os.path.join(folder, f"sigterms-r{rank}"), "w") as fh:
    fh.write(str(len(hits)))
sys.exit(75)
"""


def two_ranks(script: str, **overrides: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": "ranks",
        "team": "perception",
        "entrypoint": [sys.executable, "-c", script],
        "resources": {"nodes": 1, "gpus": 2, "cpus": 4},
        "distributed": {"strategy": "ddp"},
        "checkpoint": {"every_steps": 10, "grace_seconds": 10},
    }
    data.update(overrides)
    return parse_spec(data)


def wait_for(until: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ---- the pure parts ------------------------------------------------------------------------------


def test_one_bundle_per_rank_with_its_share_of_cpus_and_a_gpu_where_there_are_gpus() -> None:
    spec = two_ranks("pass")
    assert placement_bundles(spec, {"CPU": 8.0}) == ({"CPU": 2.0}, {"CPU": 2.0})
    assert placement_bundles(spec, {"CPU": 8.0, "GPU": 4.0}) == ({"CPU": 2.0, "GPU": 1.0},) * 2
    assert placement_bundles(two_ranks("pass", resources={"gpus": 3, "cpus": 2}), {"CPU": 8.0}) == ({"CPU": 1.0},) * 3
    assert placement_bundles(two_ranks("pass", distributed=None), {"CPU": 8.0}) == ()
    # A script that starts its own ranks runs once, holding the node's resources (as on the local backend).
    script = two_ranks("pass", distributed={"strategy": "ddp", "launcher": "script"})
    assert placement_bundles(script, {"CPU": 8.0}) == ()
    assert actor_options(script, {"CPU": 8.0, "GPU": 2.0})["num_cpus"] == 4


def test_a_multi_rank_actor_asks_for_nothing_and_too_big_a_job_is_refused() -> None:
    options = actor_options(two_ranks("pass"), {"CPU": 4.0})
    assert (options["num_cpus"], options["num_gpus"], options["lifetime"]) == (0, 0, "detached")
    with pytest.raises(UsageError, match=r"2 ranks x 2 CPUs .* exceed the Ray cluster's 3 CPUs"):
        actor_options(two_ranks("pass"), {"CPU": 3.0})
    with pytest.raises(UsageError, match=r"one GPU each, more than the Ray cluster's 1 GPUs"):
        actor_options(two_ranks("pass"), {"CPU": 8.0, "GPU": 1.0})
    assert Feature.MULTI_RANK in RayBackend.features and Feature.MULTI_NODE not in RayBackend.features


def test_ranks_of_one_node_without_gpus_keep_the_bundle_order() -> None:
    slots = [RankSlot("10.0.0.5", "a"), RankSlot("10.0.0.5", "a")]
    assert rank_order(slots) == [0, 1]
    first, second = rank_environments(slots, 29500)
    assert first == {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
    }
    assert (second["RANK"], second["LOCAL_RANK"], second["MASTER_ADDR"]) == ("1", "1", "10.0.0.5")


def test_ranks_are_numbered_by_node_then_gpu_and_see_their_nodes_gpus() -> None:
    # Bundles as Ray might place them: two nodes, GPUs handed out in no particular order.
    slots = [
        RankSlot("10.0.0.7", "b", ("3",)),
        RankSlot("10.0.0.9", "c", ("1",)),
        RankSlot("10.0.0.7", "b", ("10",)),
        RankSlot("10.0.0.7", "b", ("2",)),
        RankSlot("10.0.0.9", "c", ("0",)),
    ]
    order = rank_order(slots)
    assert order == [3, 0, 2, 4, 1]
    envs = rank_environments([slots[i] for i in order], 1234)
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3", "4"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "0", "1"]
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["3", "3", "3", "2", "2"]
    assert {e["MASTER_ADDR"] for e in envs} == {"10.0.0.7"}  # rank 0's node
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["2,3,10"] * 3 + ["0,1"] * 2
    # Each rank's own GPU is the one its LOCAL_RANK picks among those it sees.
    for env, i in zip(envs, order, strict=True):
        assert env["CUDA_VISIBLE_DEVICES"].split(",")[int(env["LOCAL_RANK"])] == slots[i].gpu_ids[0]


def session_end(folder: Path, attempt: int, status: str) -> Path:
    events = folder / "events.jsonl"
    with events.open("a") as fh:
        fh.write(json.dumps({"ts": 1.0, "attempt": attempt, "kind": "session_end", "status": status}) + "\n")
    return events


def test_the_attempts_exit_status_over_its_ranks(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    assert group_exit([0, 0], events, 1) == 0
    assert group_exit([75, 75], events, 1) == 75
    assert group_exit([0, 3, -15], events, 1) == 3  # the first to fail speaks for the attempt
    assert group_exit([-9, 0], events, 1) == -9
    assert group_exit([None, -15], events, 1) is None  # a rank vanished with its actor: lost
    lost_marker(tmp_path, 2).write_text("rank 1: connection closed by peer\n")
    assert group_exit([1, -15], events, 2) == 75  # a rank found the group broken: requeue
    assert group_exit([None, 1], events, 2) == 75
    assert group_exit([1, -15], events, 1) == 1  # the marker is per attempt
    session_end(tmp_path, 3, "requeue")
    assert group_exit([-9, -9], events, 3) == 75  # saved and asked to be requeued, killed on the way out


# ---- the rank group and the job's actor, ranks in this process -------------------------------------


class InProcessPlacement:
    """The job's placement group in this process: each rank actor is a plain :class:`RankProcess`."""

    def __init__(self, bundles: Sequence[dict[str, float]]) -> None:
        self.bundles = list(bundles)
        self.ranks: list[list[RankProcess]] = []
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.stopped: list[RankProcess] = []
        self.dead: set[int] = set()
        self.released = False

    def ready(self, timeout: float) -> bool:
        return True

    def start_ranks(self) -> list[Any]:
        self.ranks.append([RankProcess() for _ in self.bundles])
        return list(self.ranks[-1])

    def call(self, ranks: Sequence[Any], method: str, args: Sequence[tuple[Any, ...]], *, timeout: float) -> list[Any]:
        answers: list[Any] = []
        for rank, a in zip(ranks, args, strict=True):
            self.calls.append((method, a))
            answers.append(RankGone() if id(rank) in self.dead else getattr(rank, method)(*a))
        return answers

    def stop(self, ranks: Sequence[Any]) -> None:
        for rank in ranks:
            rank.signal(signal.SIGKILL)
            self.stopped.append(rank)

    def release(self) -> None:
        self.released = True


class FakeRank:
    """A rank that ends with ``code`` once told, and records the signals it gets."""

    def __init__(self) -> None:
        self.code: int | None = None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.code

    def signal(self, signum: int) -> None:
        self.signals.append(signum)


def test_a_failed_rank_stops_the_others_once_then_kills_them_after_the_grace(tmp_path: Path) -> None:
    now = [100.0]
    ranks = [FakeRank(), FakeRank(), FakeRank()]
    placement = InProcessPlacement([{}] * 3)
    group = RankGroup(placement, ranks, [11, 12, 13], events=tmp_path / "e", attempt=1, grace=5, clock=lambda: now[0])
    assert group.pid == 11 and group.poll() is None
    group.signal(signal.SIGTERM)  # a preemption
    group.signal(signal.SIGTERM)  # a cancel right after it: no second SIGTERM
    assert [r.signals for r in ranks] == [[signal.SIGTERM]] * 3
    ranks[1].code = 3
    assert group.poll() is None
    assert [r.signals for r in ranks] == [[signal.SIGTERM]] * 3  # already told: not told again

    fresh = [FakeRank(), FakeRank()]
    group = RankGroup(placement, fresh, [21, 22], events=tmp_path / "e", attempt=1, grace=5, clock=lambda: now[0])
    fresh[0].code = 1
    assert group.poll() is None
    assert fresh[1].signals == [signal.SIGTERM] and fresh[0].signals == []  # only the ranks still running
    now[0] += 6
    assert group.poll() is None and fresh[1].signals == [signal.SIGTERM, signal.SIGKILL]
    fresh[1].code = -9
    ended = group.poll()
    assert ended is not None and ended.code == 1


def test_a_vanished_rank_makes_the_attempt_lost(tmp_path: Path) -> None:
    ranks = [FakeRank(), FakeRank()]
    placement = InProcessPlacement([{}] * 2)
    group = RankGroup(placement, ranks, [0, 7], events=tmp_path / "e", attempt=1, grace=5)
    assert group.pid is None  # rank 0 never started
    placement.dead.add(id(ranks[0]))
    assert group.poll() is None and ranks[1].signals == [signal.SIGTERM]
    ranks[1].code = -15
    ended = group.poll()
    assert ended is not None and ended.code is None


def test_the_jobs_actor_runs_every_rank_preempts_them_once_and_resumes(home: Path) -> None:
    spec = two_ranks(RANK)
    placement = InProcessPlacement(placement_bundles(spec, {"CPU": 4.0}))
    exited = threading.Event()
    (home / "jobs" / "1").mkdir(parents=True)
    args = RunnerArgs(str(home), 1, spec.model_dump_json(), str(home), bundles=tuple(placement.bundles))
    runner = JobRunner(args, poll_s=0.01, exit_hook=exited.set, placement=placement)
    folder = home / "jobs" / "1"
    wait_for(lambda: all((folder / f"ready-r{r}").exists() for r in (0, 1)))
    assert runner.preempt() == 1
    assert runner.preempt() is None  # already stopping: nothing more is sent
    assert exited.wait(60)
    status = read_status(status_path(home, 1))
    assert status is not None and status.state == "completed", status
    assert [(a.outcome, a.exit_code) for a in status.attempts] == [("preempted", 75), ("completed", 0)]
    assert [[r.rank for r in a.ranks] for a in status.attempts] == [[0, 1], [0, 1]]
    assert status.attempts[0].pid == status.attempts[0].ranks[0].pid
    assert [(folder / f"sigterms-r{r}").read_text() for r in (0, 1)] == ["1", "1"]
    for n in (1, 2):
        envs = [(folder / f"env-a{n}-r{r}").read_text().split() for r in (0, 1)]
        assert [e[:4] for e in envs] == [["0", "2", "0", "2"], ["1", "2", "1", "2"]]
        assert envs[0][4:] == envs[1][4:] and envs[0][4] == "127.0.0.1" and int(envs[0][5]) > 0
        assert envs[0][6] == "2"  # OMP_NUM_THREADS: resources.cpus shared by the node's ranks
    log = (folder / "logs" / "attempt-1.log").read_text()
    assert "rank 0 attempt 1" in log and "rank 1 attempt 1" in log  # every rank writes the attempt's log
    assert len(placement.ranks) == 2 and all(r in placement.stopped for rs in placement.ranks for r in rs)
    assert placement.released


def test_a_two_rank_job_through_the_backend_is_priced_for_both_ranks(home: Path) -> None:
    class FakeCluster:
        address = "127.0.0.1:1"

        def __init__(self) -> None:
            self.options: dict[str, Any] = {}
            self.runners: dict[int, JobRunner] = {}
            self.exited: set[int] = set()
            self.killed: list[int] = []

        def resources(self) -> dict[str, float]:
            return {"CPU": 4.0}

        def start(self, args: RunnerArgs, options: dict[str, Any]) -> str:
            self.options = options
            done = self.exited.add
            placement = InProcessPlacement(args.bundles)
            self.runners[args.job_id] = JobRunner(
                args, poll_s=0.01, exit_hook=lambda: done(args.job_id), placement=placement
            )
            return "actor0001"

        def call(self, job_id: int, method: str, *args: Any, timeout: float) -> Any:
            return getattr(self.runners[job_id], method)(*args)

        def kill(self, job_id: int) -> None:
            self.killed.append(job_id)

        def alive(self, job_id: int) -> bool:
            return job_id not in self.exited

    cluster = FakeCluster()
    backend = RayBackend(home, cluster=cluster)
    job = backend.submit(two_ranks(RANK))
    assert cluster.options["num_cpus"] == 0
    folder = home / "jobs" / str(job)
    wait_for(lambda: all((folder / f"ready-r{r}").exists() for r in (0, 1)))
    backend.sync()
    backend.preempt(job)
    wait_for(lambda: job in cluster.exited)
    backend.sync()
    assert backend.store.job(job).state == "completed"
    starts = backend.store.events(job, kinds=("attempt_start",))
    assert [[r["rank"] for r in e.data["ranks"]] for e in starts] == [[0, 1], [0, 1]]
    usages = store_usages(backend.store, job_ids=[job])
    assert [u.gpus for u in usages] == [2, 2]  # GPU-hours = wall x 2 ranks
    assert cluster.killed == [job]  # the gone actor's placement group is given back (the actor already did)
