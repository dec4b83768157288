"""A job of several ranks: the group launcher over torchrun, and the local backend running one.

The ranks are tiny scripts (no training): each writes its PID, what it saw, and on a preemption
signal a file and rank 0 the ``session_end`` event the runtime would, then exits 75.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import drive

from gpufleet.backends.base import Feature
from gpufleet.backends.lifecycle import alive
from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.ray.backend import RayBackend
from gpufleet.backends.slurm.backend import SlurmBackend
from gpufleet.errors import UsageError
from gpufleet.jobs.protocol import ENV_TORCHRUN_SHUTDOWN, REQUEUE_EXIT_CODE, entry_argv, job_environment
from gpufleet.spec import JobSpec, parse_spec

RANK = """
import json, os, signal, sys, time

out, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("GPUFLEET_ATTEMPT", "1"))


def put(name, text):
    path = os.path.join(out, f"{name}-a{attempt}-r{rank}")
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def end(status, code):
    if rank == 0:
        with open(os.environ["GPUFLEET_EVENTS"], "a") as fh:
            event = {"ts": time.time(), "attempt": attempt, "kind": "session_end", "status": status}
            fh.write(json.dumps(event) + "\\n")
    sys.exit(code)


def preempted(signum, frame):
    put("signal", signal.Signals(signum).name)
    end("requeue", 75)


signal.signal(signal.SIGTERM, preempted)
signal.signal(signal.SIGUSR1, preempted)
names = ("RANK", "WORLD_SIZE", "GPUFLEET_WORLD_SIZE", "OMP_NUM_THREADS")
put("seen", json.dumps({k: os.environ.get(k) for k in names}))
put("pid", json.dumps([os.getpid(), os.getppid()]))
if mode == "wait" and attempt == 1:
    while True:
        time.sleep(1)
if mode == "requeue":
    end("requeue", 75)
if mode == "fail":
    sys.exit(3 if rank == 1 else 0)
end("completed", 0)
"""


@pytest.fixture
def rank_script(tmp_path: Path) -> Path:
    path = tmp_path / "rank.py"
    path.write_text(RANK)
    (tmp_path / "out").mkdir()
    return path


def wait_for(until: Callable[[], bool], timeout: float = 120.0) -> None:
    """Poll until ``until()`` holds (the timeout is only a safety net)."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def pids(out: Path, attempt: int = 1) -> list[int]:
    """The PIDs of the ranks of ``attempt`` and of their parent (torchrun), from the files they wrote."""
    import json

    found: set[int] = set()
    for rank in (0, 1):
        found.update(json.loads((out / f"pid-a{attempt}-r{rank}").read_text()))
    return sorted(found)


@pytest.fixture
def launch(rank_script: Path, tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Start the group launcher over 2 ranks of the rank script in ``mode`` (in a session of its own)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(mode: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "GPUFLEET_EVENTS": str(tmp_path / "events.jsonl"), "GPUFLEET_ATTEMPT": "1"}
        argv = ["-m", "gpufleet.backends.group_launch", "--nproc-per-node=2", "--"]
        log = (tmp_path / "launcher.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, *argv, str(rank_script), str(tmp_path / "out"), mode],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_launcher_maps_exit_codes(launch: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path) -> None:
    assert launch("requeue").wait(timeout=120) == REQUEUE_EXIT_CODE  # torchrun itself exits 1
    (tmp_path / "events.jsonl").unlink()
    assert launch("ok").wait(timeout=120) == 0
    code = launch("fail").wait(timeout=120)
    assert code not in (0, REQUEUE_EXIT_CODE)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_to_launcher_reaches_every_rank(
    launch: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "out"
    proc = launch("wait")
    wait_for(lambda: all((out / f"pid-a1-r{r}").exists() for r in (0, 1)))
    proc.send_signal(sig)  # the launcher alone, as a scheduler's kill of the attempt's group reaches it
    assert proc.wait(timeout=120) == REQUEUE_EXIT_CODE
    assert [(out / f"signal-a1-r{r}").read_text() for r in (0, 1)] == [sig.name, sig.name]
    wait_for(lambda: not any(alive(p) for p in pids(out)))


def test_sigkill_of_launcher_leaves_no_rank_alive(
    launch: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = launch("wait")
    wait_for(lambda: all((out / f"pid-a1-r{r}").exists() for r in (0, 1)))
    ranks_and_torchrun = pids(out)
    assert proc.pid not in ranks_and_torchrun  # torchrun is the launcher's child, not the launcher
    proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    wait_for(lambda: not any(alive(p) for p in ranks_and_torchrun))
    assert not any((out / f"signal-a1-r{r}").exists() for r in (0, 1))  # killed, not asked to stop


# ---- through the local backend ---------------------------------------------------------------


def two_ranks(script: Path, mode: str, **overrides: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": "pair",
        "team": "perception",
        "entrypoint": ["python", str(script), str(script.parent / "out"), mode],
        "resources": {"gpus": 2, "cpus": 2},
        "distributed": {"strategy": "none"},
        "checkpoint": {"every_steps": 10, "grace_seconds": 20},
        "max_restarts": 3,
    }
    data.update(overrides)
    return parse_spec(data)


@pytest.fixture
def local2(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LocalBackend, LocalScheduler]]:
    """A local backend that spawns nothing, and a two-slot scheduler the test ticks itself."""
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=2, poll_s=0.02)
    yield backend, scheduler
    scheduler.shutdown(grace_s=5)


def test_entry_argv_runs_the_group_launcher(rank_script: Path) -> None:
    spec = two_ranks(rank_script, "ok")
    assert entry_argv(spec)[:4] == [sys.executable, "-m", "gpufleet.backends.group_launch", "--nproc-per-node=2"]
    assert entry_argv(spec)[4:] == ["--", str(rank_script), str(rank_script.parent / "out"), "ok"]
    module = spec.copy_with(entrypoint="gpufleet.workloads.toy:train")
    assert entry_argv(module)[-3:] == ["--", "-m", "gpufleet.runtime.launch"]
    script = spec.copy_with(distributed={"launcher": "script"})
    assert entry_argv(script)[0] == sys.executable and entry_argv(script)[1] == str(rank_script)
    assert entry_argv(spec.copy_with(distributed=None))[1] == str(rank_script)


def test_torchrun_gives_the_ranks_the_job_grace_before_its_sigkill(rank_script: Path, tmp_path: Path) -> None:
    """torchrun SIGKILLs its ranks 30 s after its SIGTERM by default: a group gets the job's grace instead."""
    spec = two_ranks(rank_script, "ok").copy_with(checkpoint={"every_steps": 5, "grace_seconds": 45.5})
    assert job_environment(spec, 1, tmp_path, "local")[ENV_TORCHRUN_SHUTDOWN] == "46"
    one = spec.copy_with(resources={"gpus": 1}, distributed=None)
    assert ENV_TORCHRUN_SHUTDOWN not in job_environment(one, 1, tmp_path, "local")


def test_local_two_rank_job_runs_both_ranks_and_completes(local2: Any, rank_script: Path) -> None:
    import json

    backend, scheduler = local2
    job_id = backend.submit(two_ranks(rank_script, "ok"))
    drive(scheduler, lambda: backend.store.job(job_id).state == "completed")
    out = rank_script.parent / "out"
    seen = [json.loads((out / f"seen-a1-r{r}").read_text()) for r in (0, 1)]
    assert [s["RANK"] for s in seen] == ["0", "1"]
    assert {(s["WORLD_SIZE"], s["GPUFLEET_WORLD_SIZE"], s["OMP_NUM_THREADS"]) for s in seen} == {("2", "2", "1")}


def test_local_preempted_two_rank_job_requeues_and_resumes(local2: Any, rank_script: Path) -> None:
    backend, scheduler = local2
    out = rank_script.parent / "out"
    job_id = backend.submit(two_ranks(rank_script, "wait"))
    drive(scheduler, lambda: all((out / f"pid-a1-r{r}").exists() for r in (0, 1)))
    backend.preempt(job_id)
    drive(scheduler, lambda: backend.store.job(job_id).state == "completed")
    first, second = backend.store.attempts(job_id)
    assert (first.outcome, first.exit_code) == ("preempted", REQUEUE_EXIT_CODE)
    assert second.outcome == "completed"
    assert all((out / f"signal-a1-r{r}").read_text() == "SIGTERM" for r in (0, 1))


def test_local_cancelled_two_rank_job_leaves_no_rank_alive(local2: Any, rank_script: Path) -> None:
    backend, scheduler = local2
    out = rank_script.parent / "out"
    # The ranks ignore SIGTERM: only the SIGKILL after the grace time ends them, through the launcher.
    stubborn = rank_script.parent / "stubborn.py"
    stubborn.write_text(RANK.replace("(signal.SIGTERM, preempted)", "(signal.SIGTERM, signal.SIG_IGN)"))
    job_id = backend.submit(two_ranks(stubborn, "wait", checkpoint={"every_steps": 10, "grace_seconds": 1}))
    drive(scheduler, lambda: all((out / f"pid-a1-r{r}").exists() for r in (0, 1)))
    everyone = pids(out)
    backend.cancel(job_id)
    drive(scheduler, lambda: backend.store.job(job_id).state == "cancelled")
    wait_for(lambda: not any(alive(p) for p in everyone))


def test_backend_without_multi_rank_refuses_at_submit(local2: Any, home: Path, rank_script: Path) -> None:
    class OneRank(LocalBackend):
        features = frozenset({Feature.PREEMPT_GRACE})

    backend = OneRank(home, spawn=False)
    with pytest.raises(UsageError, match=r"does not support jobs of more than one rank") as err:
        backend.submit(two_ranks(rank_script, "ok"))
    assert err.value.exit_code == 2
    assert backend.store.jobs() == []
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir())
    assert OneRank(home, spawn=False).submit(two_ranks(rank_script, "ok", distributed=None)) > 0  # one rank: fine


def test_local_refuses_more_than_one_node(local2: Any, rank_script: Path) -> None:
    backend, _ = local2
    with pytest.raises(UsageError, match=r"does not support jobs over more than one node"):
        backend.submit(two_ranks(rank_script, "ok", resources={"gpus": 1, "nodes": 2}))
    assert backend.store.jobs() == []


def test_backends_declare_ranks_and_nodes() -> None:
    assert {Feature.MULTI_RANK, Feature.MULTI_NODE} <= SlurmBackend.features
    assert Feature.MULTI_RANK in RayBackend.features and Feature.MULTI_NODE not in RayBackend.features
    assert Feature.MULTI_RANK in LocalBackend.features and Feature.MULTI_NODE not in LocalBackend.features


def test_no_python_runs_any_command_per_rank(tmp_path: Path) -> None:
    argv = ["-m", "gpufleet.backends.group_launch", "--nproc-per-node=2", "--no-python", "--"]
    script = 'echo "$RANK/$WORLD_SIZE" > "$0/sh-$RANK"'
    proc = subprocess.run(
        [sys.executable, *argv, "/bin/sh", "-c", script, str(tmp_path)], capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert [(tmp_path / f"sh-{r}").read_text().strip() for r in (0, 1)] == ["0/2", "1/2"]


def test_launcher_refuses_bad_usage() -> None:
    for argv in (["--nproc-per-node=0", "--", "x.py"], ["--nproc-per-node=2", "x.py"], ["--nproc-per-node=2", "--"]):
        proc = subprocess.run([sys.executable, "-m", "gpufleet.backends.group_launch", *argv], capture_output=True)
        assert proc.returncode == 2 and b"usage:" in proc.stderr
