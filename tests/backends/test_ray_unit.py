"""The Ray backend without Ray: the actor body with real processes, the status file, sync, errors.

``FakeCluster`` runs each job's ``JobRunner`` in this process (the way Ray would run it in an
actor), so submit, preempt, cancel and sync go through the backend's real code paths.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends.lifecycle import attempt_argv
from gpufleet.backends.ray.backend import RayBackend, actor_options, find_cluster, plan_sync
from gpufleet.backends.ray.runner import (
    AttemptRecord,
    JobRunner,
    RunnerArgs,
    RunStatus,
    end_attempt,
    read_status,
    status_path,
    write_status,
)
from gpufleet.cost.ledger import build_ledger
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import store_usages
from gpufleet.errors import ServiceUnavailable, UsageError
from gpufleet.jobs.store import Store
from gpufleet.spec import JobSpec, parse_spec

# Attempt 1 sleeps until SIGTERM, then exits 75 ("requeue me"); later attempts exit 0 at once.
PREEMPTIBLE = """
import os, signal, sys, time
n = int(os.environ["GPUFLEET_ATTEMPT"])
print("attempt", n, os.environ["GPUFLEET_BACKEND"], os.environ["GPUFLEET_JOB_ID"], flush=True)
if n > 1:
    sys.exit(0)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
open(os.path.join(os.environ["GPUFLEET_JOB_DIR"], "ready"), "w").close()
time.sleep(60)
sys.exit(3)
"""


def command_spec(script: str, **overrides: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": "cmd",
        "team": "perception",
        "entrypoint": [sys.executable, "-c", script],
        "resources": {"cpus": 1, "gpus": 0},
        "checkpoint": {"every_steps": 10, "grace_seconds": 10},
    }
    data.update(overrides)
    return parse_spec(data)


def wait_for(until: Callable[[], bool], timeout: float = 30.0, tick: Callable[[], None] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        if tick is not None:
            tick()
        time.sleep(0.02)


class FakeCluster:
    """Runs each job's actor body in this process; ``schedule=False`` leaves actors pending."""

    address = "127.0.0.1:1"

    def __init__(self, cpus: float = 2.0, gpus: float = 0.0, schedule: bool = True) -> None:
        self.totals = {"CPU": cpus, "GPU": gpus}
        self.schedule = schedule
        self.runners: dict[int, JobRunner] = {}
        self.pending: dict[int, RunnerArgs] = {}
        self.exited: set[int] = set()
        self.killed: list[int] = []
        self.options: dict[int, dict[str, Any]] = {}

    def resources(self) -> dict[str, float]:
        return dict(self.totals)

    def start(self, args: RunnerArgs, options: dict[str, Any]) -> str:
        self.options[args.job_id] = options
        if self.schedule:
            self.runners[args.job_id] = JobRunner(args, poll_s=0.02, exit_hook=lambda: self.exited.add(args.job_id))
        else:
            self.pending[args.job_id] = args
        return f"actor{args.job_id:04d}"

    def call(self, job_id: int, method: str, *args: Any, timeout: float) -> Any:
        if job_id in self.pending:
            raise TimeoutError(method)
        if job_id not in self.runners or job_id in self.exited:
            raise LookupError(job_id)
        return getattr(self.runners[job_id], method)(*args)

    def kill(self, job_id: int) -> None:
        self.pending.pop(job_id, None)
        self.killed.append(job_id)

    def alive(self, job_id: int) -> bool:
        return job_id in self.pending or (job_id in self.runners and job_id not in self.exited)

    def join(self) -> None:
        for runner in self.runners.values():
            runner.thread.join(timeout=30)


@pytest.fixture
def fake() -> Any:
    cluster = FakeCluster()
    yield cluster
    for runner in cluster.runners.values():  # stop what a failed test left running
        runner.cancel(0.5)
    cluster.join()


# ---- pure parts ------------------------------------------------------------------------------


def open_status(restarts: int = 0) -> RunStatus:
    return RunStatus(job_id=1, state="running", restarts=restarts, attempts=(AttemptRecord(n=1, started_at=10.0),))


@pytest.mark.parametrize(
    ("code", "stop", "restarts", "expect"),
    [
        (0, None, 0, ("completed", "completed", 0)),
        (0, "preempted", 0, ("completed", "completed", 0)),
        (75, None, 0, ("requeued", "queued", 1)),
        (-15, "preempted", 2, ("preempted", "queued", 3)),
        (None, "lost", 0, ("lost", "queued", 1)),
        (75, None, 3, ("requeued", "failed", 3)),
        (1, None, 0, ("failed", "failed", 0)),
        (-9, None, 0, ("failed", "failed", 0)),
        (75, "cancelled", 0, ("cancelled", "cancelled", 0)),
    ],
)
def test_end_attempt_follows_the_local_requeue_rule(
    code: int | None, stop: str | None, restarts: int, expect: tuple[str, str, int]
) -> None:
    status = end_attempt(open_status(restarts), code, stop, 20.0, max_restarts=3)
    last = status.attempts[-1]
    assert (last.outcome, status.state, status.restarts) == expect
    assert last.ended_at == 20.0 and last.exit_code == code and status.open_attempt() is None
    if expect[1] == "failed" and code == -9:
        assert status.reason == "killed by SIGKILL"


def test_status_file_round_trip_and_garbled_file(tmp_path: Path) -> None:
    path = tmp_path / "ray-status.json"
    assert read_status(path) is None
    status = open_status().model_copy(update={"actor_id": "abc", "node": "n1"})
    write_status(path, status)
    assert read_status(path) == status
    assert [p.name for p in tmp_path.iterdir()] == ["ray-status.json"]  # no temp file left
    path.write_text('{"job_id": 1, "state": "exploded"}')
    with pytest.raises(UsageError, match=r"ray-status.json is not a valid Ray status file \(state"):
        read_status(path)
    path.write_bytes(b"\xff\xfe not json")
    with pytest.raises(UsageError, match="not a valid Ray status file"):
        read_status(path)
    path.write_text('{"job_id": 1, "schema_version": 9}')
    with pytest.raises(UsageError, match="newer gpufleet"):
        read_status(path)


def test_actor_options_ask_for_gpus_only_where_there_are_gpus() -> None:
    spec = command_spec("pass", resources={"cpus": 2, "gpus": 1}, max_restarts=4)
    cpu_only = actor_options(spec, {"CPU": 4.0})
    assert cpu_only["num_cpus"] == 2 and cpu_only["num_gpus"] == 0 and cpu_only["max_restarts"] == 4
    assert cpu_only["lifetime"] == "detached"
    assert actor_options(spec, {"CPU": 4.0, "GPU": 8.0})["num_gpus"] == 1
    with pytest.raises(UsageError, match=r"resources\.cpus=2 exceeds the Ray cluster's 1 CPUs"):
        actor_options(spec, {"CPU": 1.0})
    with pytest.raises(UsageError, match=r"resources\.gpus=4 exceeds"):
        actor_options(spec.copy_with(resources={"cpus": 1, "gpus": 4}), {"CPU": 4.0, "GPU": 2.0})


def test_cluster_address_order(tmp_path: Path) -> None:
    home, dev = tmp_path / "home", tmp_path / "dev"
    env = {"GPUFLEET_RAY_DIR": str(dev)}
    assert find_cluster(home, env) is None
    dev.mkdir()
    (dev / "address").write_text("127.0.0.1:6001\n")
    (dev / "auth_token").write_text("t")
    found = find_cluster(home, env)
    assert found is not None and found.address == "127.0.0.1:6001" and found.token == dev / "auth_token"
    home.mkdir()
    (home / "ray-address").write_text("10.0.0.5:6379")
    found = find_cluster(home, env)
    assert found is not None and found.address == "10.0.0.5:6379" and found.token is None
    found = find_cluster(home, {**env, "GPUFLEET_RAY_ADDRESS": " 10.0.0.9:6379 "})
    assert found is not None and (found.address, found.source) == ("10.0.0.9:6379", "GPUFLEET_RAY_ADDRESS")


def test_plan_sync_derives_events_once(home: Path) -> None:
    store = Store(home / "state.db")
    spec = command_spec("pass")
    job_id = store.add_job(spec, "ray")
    first = AttemptRecord(
        n=1, pid=11, node="n", started_at=100.0, sigterm_at=110.0, stop="preempted", grace=10.0, kill_at=120.0
    )
    first = first.model_copy(update={"ended_at": 120.5, "exit_code": -9, "outcome": "preempted"})
    status = RunStatus(
        job_id=job_id, state="running", restarts=1, attempts=(first, AttemptRecord(n=2, pid=12, started_at=121.0))
    )
    plan = plan_sync(store.job(job_id), store.attempts(job_id), status, gone=False, now=130.0)
    assert [(e.kind, e.attempt) for e in plan.events] == [
        ("attempt_start", 1),
        ("sigterm", 1),
        ("sigkill", 1),
        ("attempt_end", 1),
        ("requeued", 1),
        ("attempt_start", 2),
    ]
    assert (plan.state, plan.restarts) == ("running", 1)
    for attempt in plan.attempts:
        store.upsert_attempt(attempt)
    again = plan_sync(store.job(job_id), store.attempts(job_id), status, gone=False, now=131.0)
    assert again.events == () and again.attempts == ()
    done = status.model_copy(update={"state": "completed"}).with_last(ended_at=140.0, exit_code=0, outcome="completed")
    final = plan_sync(store.job(job_id), store.attempts(job_id), done, gone=False, now=141.0)
    assert [(e.kind, e.attempt, e.ts) for e in final.events] == [("attempt_end", 2, 140.0), ("completed", 2, 140.0)]


def test_plan_sync_fails_a_job_whose_actor_is_gone(home: Path) -> None:
    store = Store(home / "state.db")
    job_id = store.add_job(command_spec("pass"), "ray")
    status = RunStatus(job_id=job_id, state="running", attempts=(AttemptRecord(n=1, started_at=5.0),))
    plan = plan_sync(store.job(job_id), [], status, gone=True, now=9.0)
    assert plan.state == "failed" and plan.reason is not None and "gpufleet-job-1 is gone" in plan.reason
    assert plan.attempts[0].outcome == "lost" and plan.attempts[0].ended_at == 9.0
    assert plan.events[-1].kind == "failed"
    finished = status.model_copy(update={"state": "completed"}).with_last(ended_at=8.0, outcome="completed")
    assert plan_sync(store.job(job_id), [], finished, gone=True, now=9.0).state == "completed"


# ---- the actor body with real processes --------------------------------------------------------


def runner_args(home: Path, spec: JobSpec, job_id: int = 1) -> RunnerArgs:
    folder = home / "jobs" / str(job_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.json").write_text(spec.model_dump_json())
    return RunnerArgs(str(home), job_id, spec.model_dump_json(), str(home))


def test_runner_requeues_on_exit_75_then_completes(home: Path) -> None:
    script = "import os, sys; sys.exit(75 if os.environ['GPUFLEET_ATTEMPT'] == '1' else 0)"
    exited = threading.Event()
    runner = JobRunner(runner_args(home, command_spec(script)), poll_s=0.01, exit_hook=exited.set)
    assert exited.wait(30)
    status = read_status(status_path(home, 1))
    assert status is not None and status.state == "completed" and status.restarts == 1
    assert [(a.n, a.exit_code, a.outcome) for a in status.attempts] == [(1, 75, "requeued"), (2, 0, "completed")]
    assert all(a.pid and a.node == socket.gethostname() for a in status.attempts)
    assert (home / "jobs" / "1" / "logs" / "attempt-2.log").exists()
    assert runner.preempt() is None  # nothing runs any more


# PREEMPTIBLE, but on SIGTERM attempt 1 waits for a `release` file before it exits 75 (it is "stopping" until then).
HELD_ON_SIGTERM = PREEMPTIBLE.replace(
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))",
    "release = os.path.join(os.environ['GPUFLEET_JOB_DIR'], 'release')\n"
    "def held(*_):\n"
    "    while not os.path.exists(release):\n"
    "        time.sleep(0.01)\n"
    "    sys.exit(75)\n"
    "signal.signal(signal.SIGTERM, held)",
)


def test_runner_preempt_then_next_attempt(home: Path) -> None:
    exited = threading.Event()
    runner = JobRunner(runner_args(home, command_spec(HELD_ON_SIGTERM)), poll_s=0.01, exit_hook=exited.set)
    wait_for(lambda: (home / "jobs" / "1" / "ready").exists())
    assert runner.preempt(5.0) == 1
    assert runner.preempt(5.0) is None  # already stopping
    (home / "jobs" / "1" / "release").touch()
    assert exited.wait(30)
    status = read_status(status_path(home, 1))
    assert status is not None and status.state == "completed"
    first = status.attempts[0]
    assert (first.outcome, first.exit_code, first.stop, first.grace) == ("preempted", 75, "preempted", 5.0)
    assert first.sigterm_at is not None and first.kill_at is None
    log = (home / "jobs" / "1" / "logs" / "attempt-1.log").read_text()
    assert log.startswith("attempt 1 ray 1")


def test_runner_sigkills_after_the_grace_time(home: Path) -> None:
    stubborn = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)"
    )
    exited = threading.Event()
    runner = JobRunner(runner_args(home, command_spec(stubborn)), poll_s=0.01, exit_hook=exited.set)
    log = home / "jobs" / "1" / "logs" / "attempt-1.log"
    wait_for(lambda: log.exists() and "up" in log.read_text())
    assert runner.cancel(0.2) == "stopping"
    assert exited.wait(30)
    status = read_status(status_path(home, 1))
    assert status is not None and status.state == "cancelled" and len(status.attempts) == 1
    last = status.attempts[0]
    assert last.exit_code == -signal.SIGKILL and last.kill_at is not None and last.outcome == "cancelled"


def test_restarted_runner_records_the_open_attempt_lost_and_kills_it(home: Path) -> None:
    spec = command_spec("import sys; sys.exit(0)", max_restarts=2)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        record = AttemptRecord(n=1, pid=orphan.pid, node=socket.gethostname(), started_at=time.time())
        (home / "jobs" / "1").mkdir(parents=True)
        write_status(status_path(home, 1), RunStatus(job_id=1, state="running", attempts=(record,)))
        runner = JobRunner(runner_args(home, spec), start=False)
        assert orphan.wait(timeout=10) == -signal.SIGKILL
    finally:
        orphan.kill()
        orphan.wait()
    assert runner.status.state == "queued" and runner.status.restarts == 1
    assert runner.status.attempts[0].outcome == "lost" and runner.status.actor_pid == os.getpid()
    assert read_status(status_path(home, 1)) == runner.status


def test_runner_that_cannot_start_fails_the_job(home: Path) -> None:
    exited = threading.Event()
    spec = command_spec("x").copy_with(entrypoint=[str(home / "no-such-program")])
    JobRunner(runner_args(home, spec), exit_hook=exited.set)
    assert exited.wait(30)
    status = read_status(status_path(home, 1))
    assert status is not None and status.state == "failed" and status.attempts[0].exit_code == 127
    assert status.reason is not None and "could not be started" in status.reason
    log = (home / "jobs" / "1" / "logs" / "attempt-1.log").read_text()
    assert f"cannot start {str(home / 'no-such-program')!r}: No such file or directory" in log


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_attempt_dies_with_the_thread_that_started_it(tmp_path: Path) -> None:
    """What keeps a dead actor's attempt from training on beside its successor."""
    started: list[subprocess.Popen[bytes]] = []
    ready = tmp_path / "ready"
    child = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"

    def parent() -> None:
        started.append(subprocess.Popen(attempt_argv([sys.executable, "-c", child])))
        wait_for(ready.exists)

    thread = threading.Thread(target=parent)
    thread.start()
    thread.join()
    try:
        assert started[0].wait(timeout=10) == -signal.SIGKILL
    finally:
        started[0].kill()
        started[0].wait()


# ---- the backend with a fake cluster -----------------------------------------------------------


def test_submit_preempt_resume_finish_account(home: Path, fake: FakeCluster) -> None:
    backend = RayBackend(home, cluster=fake)
    job_id = backend.submit(command_spec(PREEMPTIBLE), env={"EXTRA": "1"})
    assert backend.store.job(job_id).backend_ref == f"actor{job_id:04d}"
    assert fake.options[job_id]["num_cpus"] == 1 and fake.options[job_id]["num_gpus"] == 0
    wait_for(lambda: backend.store.job(job_id).state == "running", tick=backend.sync)
    wait_for(lambda: (home / "jobs" / str(job_id) / "ready").exists())
    backend.preempt(job_id, grace=5)
    wait_for(lambda: backend.store.job(job_id).state == "completed", tick=backend.sync)
    job = backend.store.job(job_id)
    assert job.restarts == 1
    assert [a.outcome for a in backend.store.attempts(job_id)] == ["preempted", "completed"]
    kinds = [e.kind for e in backend.store.events(job_id) if e.source == "backend"]
    assert kinds.count("attempt_start") == 2 and kinds.count("completed") == 1 and "sigterm" in kinds
    assert "requeued" in kinds and kinds.index("requeued") < kinds.index("completed")
    ledger = build_ledger(store_usages(backend.store), load_rates())
    assert ledger.jobs[job_id].attempts == 2 and ledger.jobs[job_id].preemptions == 1
    with pytest.raises(UsageError, match="already completed"):
        backend.preempt(job_id)
    with pytest.raises(UsageError, match="already completed"):
        backend.cancel(job_id)


def test_cancel_a_queued_job_removes_its_actor(home: Path) -> None:
    fake = FakeCluster(schedule=False)
    backend = RayBackend(home, cluster=fake)
    job_id = backend.submit(command_spec("pass"))
    with pytest.raises(UsageError, match="job 1 is queued, not running"):
        backend.preempt(job_id)
    backend.cancel(job_id)
    job = backend.store.job(job_id)
    assert (job.state, job.reason) == ("cancelled", "cancelled while queued") and fake.killed == [job_id]
    assert backend.store.events(job_id, kinds=("cancelled",))


def test_cancel_a_running_job(home: Path, fake: FakeCluster) -> None:
    backend = RayBackend(home, cluster=fake)
    job_id = backend.submit(command_spec(PREEMPTIBLE))
    wait_for(lambda: (home / "jobs" / str(job_id) / "ready").exists())
    backend.cancel(job_id)
    wait_for(lambda: backend.store.job(job_id).state == "cancelled", tick=backend.sync)
    assert [a.outcome for a in backend.store.attempts(job_id)] == ["cancelled"] and fake.killed == []


def test_preempt_needs_a_running_attempt_and_a_positive_grace(home: Path, fake: FakeCluster) -> None:
    backend = RayBackend(home, cluster=fake)
    job_id = backend.submit(command_spec(PREEMPTIBLE))
    with pytest.raises(UsageError, match="grace=0 is invalid"):
        backend.preempt(job_id, grace=0)
    wait_for(lambda: (home / "jobs" / str(job_id) / "ready").exists())
    fake.exited.add(job_id)  # as if its actor had died for good
    with pytest.raises(UsageError, match="no live Ray actor gpufleet-job-1"):
        backend.preempt(job_id)
    fake.exited.discard(job_id)


def test_no_cluster_is_a_clear_error_and_leaves_nothing(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUFLEET_RAY_ADDRESS", raising=False)
    monkeypatch.setenv("GPUFLEET_RAY_DIR", str(tmp_path / "no-dev-ray"))
    with pytest.raises(ServiceUnavailable, match=r"no Ray cluster configured; start .*scripts/dev-ray up"):
        RayBackend(home).submit(command_spec("pass"))
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("GPUFLEET_RAY_ADDRESS", f"127.0.0.1:{port}")
    answers = rf"no Ray cluster answers at 127.0.0.1:{port} \(from GPUFLEET_RAY_ADDRESS"
    with pytest.raises(ServiceUnavailable, match=answers):
        RayBackend(home).submit(command_spec("pass"))
    monkeypatch.setenv("GPUFLEET_RAY_ADDRESS", "nonsense")
    with pytest.raises(UsageError, match="is not host:port"):
        RayBackend(home).submit(command_spec("pass"))
    monkeypatch.setenv("GPUFLEET_RAY_ADDRESS", "ray://head:10001")
    with pytest.raises(UsageError, match="GCS address host:port"):
        RayBackend(home).submit(command_spec("pass"))
    assert Store(home / "state.db").jobs() == []


def test_sync_reads_status_files_even_without_a_cluster(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUFLEET_RAY_ADDRESS", raising=False)
    monkeypatch.setenv("GPUFLEET_RAY_DIR", str(tmp_path / "no-dev-ray"))
    store = Store(home / "state.db")
    job_id = store.add_job(command_spec("pass"), "ray")
    (home / "jobs" / str(job_id)).mkdir(parents=True)
    done = AttemptRecord(n=1, pid=5, started_at=1.0, ended_at=2.0, exit_code=0, outcome="completed")
    write_status(status_path(home, job_id), RunStatus(job_id=job_id, state="completed", attempts=(done,)))
    with pytest.raises(ServiceUnavailable, match="no Ray cluster configured"):
        RayBackend(home).sync()
    assert store.job(job_id).state == "completed" and store.attempts(job_id)[0].outcome == "completed"
    RayBackend(home).sync()  # nothing active any more: no cluster needed
