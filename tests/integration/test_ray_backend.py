"""The Ray backend on a real Ray cluster: node loss, cancel of queued and running jobs, dev-ray itself.

The cluster is the one `scripts/dev-ray up` started (the `ray` fixture: fails under CI, skips
elsewhere, when none answers). The submit/preempt/resume/finish/account scenario is the backend
contract test in test_slurm_backend.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import follow, process_gone

from gpufleet.backends.ray.backend import RayBackend
from gpufleet.backends.ray.runner import read_status, status_path
from gpufleet.cost.ledger import build_ledger
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import store_usages
from gpufleet.jobs.store import latest_step
from gpufleet.spec import JobSpec, parse_spec

REPO = Path(__file__).resolve().parents[2]


def toy(name: str, cpus: int = 1, steps: int = 150) -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "team": "perception",
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": steps, "step_seconds": 0.05},
            "resources": {"cpus": cpus, "gpus": 0},
            "checkpoint": {"every_steps": 10, "grace_seconds": 10},
        }
    )


@pytest.fixture
def backend(ray_backend: RayBackend) -> RayBackend:
    return ray_backend


@pytest.mark.timeout(240)
def test_actor_lost_with_its_node_is_restarted_and_resumes_from_the_checkpoint(backend: RayBackend) -> None:
    store = backend.store
    job = backend.submit(toy("lost"))
    follow(backend, lambda: store.job(job).state == "running" and (latest_step(store, job) or 0) >= 25)
    before = read_status(status_path(backend.home, job))
    assert before is not None and before.actor_pid and before.attempts[-1].pid
    environ = Path(f"/proc/{before.attempts[-1].pid}/environ").read_bytes().split(b"\0")
    assert f"GPUFLEET_BACKEND_JOB_ID={store.job(job).backend_ref}".encode() in environ
    assert b"GPUFLEET_BACKEND=ray" in environ and b"GPUFLEET_ATTEMPT=1" in environ
    os.kill(before.actor_pid, signal.SIGKILL)  # the actor's process dies as with its node
    follow(backend, lambda: store.job(job).state == "completed", timeout=180)
    after = read_status(status_path(backend.home, job))
    assert after is not None and after.actor_pid != before.actor_pid
    assert after.actor_id == before.actor_id  # the same actor, restarted by Ray
    assert [a.outcome for a in store.attempts(job)] == ["lost", "completed"]
    assert process_gone(before.attempts[-1].pid), "the lost actor's attempt outlived it"
    saved = [e.data["step"] for e in store.events(job, kinds=("checkpoint",)) if e.attempt == 1]
    restored = [e for e in store.events(job, kinds=("restore",)) if e.attempt == 2]
    assert saved and restored and restored[0].data["step"] == max(saved)
    ledger = build_ledger(store_usages(store), load_rates())
    assert ledger.jobs[job].attempts == 2 and ledger.jobs[job].preemptions == 0  # a lost actor is no preemption:
    assert ledger.jobs[job].killed == 1  # the ledger counts it apart, its restart priced alike


@pytest.mark.timeout(240)
def test_cancel_a_queued_job_then_a_running_one(backend: RayBackend) -> None:
    import ray as ray_api

    store = backend.store
    cpus = int(ray_api.cluster_resources()["CPU"])  # type: ignore[no-untyped-call]
    running = backend.submit(toy("holds-every-cpu", cpus=cpus, steps=2000))
    follow(backend, lambda: store.job(running).state == "running")
    queued = backend.submit(toy("waits", cpus=1))
    time.sleep(2)
    backend.sync()
    assert store.job(queued).state == "queued" and not status_path(backend.home, queued).exists()
    backend.cancel(queued)
    assert (store.job(queued).state, store.job(queued).reason) == ("cancelled", "cancelled while queued")
    backend.cancel(running)
    follow(backend, lambda: store.job(running).state == "cancelled", timeout=60)
    assert [a.outcome for a in store.attempts(running)] == ["cancelled"]
    follow(backend, lambda: ray_api.available_resources().get("CPU", 0) == cpus, timeout=60)  # type: ignore[no-untyped-call]
    assert store.attempts(queued) == []


def process_tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def listening_addresses(pids: set[int]) -> set[str]:
    """Local addresses of the TCP sockets these processes listen on (from /proc/net/tcp and tcp6)."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add(fields[1].rsplit(":", 1)[0])
    return found


LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


@pytest.mark.timeout(200)
def test_dev_ray_up_status_down(tmp_path: Path) -> None:
    """A second, private cluster: it listens on loopback only, and down leaves no process of it behind."""
    state = tmp_path / "ray"
    env = {**os.environ, "GPUFLEET_RAY_DIR": str(state), "GPUFLEET_RAY_CPUS": "1"}

    def dev_ray(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(REPO / "scripts" / "dev-ray"), command],
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )

    up = dev_ray("up")
    tree: set[int] = set()
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        address = (state / "address").read_text().strip()
        assert address.startswith("127.0.0.1:")
        tree = process_tree(int((state / "pid").read_text()))
        listening = listening_addresses(tree)
        assert listening and listening <= LOOPBACK_HEX, listening
        status = dev_ray("status")
        assert status.returncode == 0 and address in status.stdout and "answers" in status.stdout
        assert (state / "auth_token").stat().st_mode & 0o077 == 0
        assert dev_ray("up").returncode == 0  # idempotent
    finally:
        down = dev_ray("down")
    assert down.returncode == 0, down.stdout + down.stderr
    left = sorted(pid for pid in tree if not process_gone(pid))
    assert left == [], f"processes of the stopped cluster still run: {left}"
    assert dev_ray("status").returncode == 1 and not (state / "address").exists()
    assert not any(Path("/tmp").glob(f"gpufleet-ray-{hashlib.sha256(str(state).encode()).hexdigest()[:10]}"))
