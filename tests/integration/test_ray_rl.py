"""The DQN actor-learner on a real Ray cluster: environment actors and the buffer are Ray actors.

The cluster is the one `scripts/dev-ray up` started (the `ray` fixture: fails under CI, skips
elsewhere, when none answers). One job: an environment actor is killed with SIGKILL and started
again by the learner, then the job is preempted and its next attempt restores the buffer the
checkpoint holds, and the job completes; the actors of each attempt die with it.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import follow, process_gone
from typer.testing import CliRunner

from gpufleet.backends.ray.backend import RayBackend
from gpufleet.cli.app import app
from gpufleet.jobs.store import latest_step
from gpufleet.rl.replay import Experience, ReplayBuffer
from gpufleet.runtime import CheckpointDir
from gpufleet.spec import parse_spec

UPDATES = 6_000


@pytest.fixture
def backend(ray_backend: RayBackend) -> RayBackend:
    return ray_backend


@pytest.mark.timeout(600)
def test_ray_actors_restart_after_kill9_and_a_preempted_learner_resumes_with_its_buffer(
    backend: RayBackend, home: Path
) -> None:
    store = backend.store
    spec = parse_spec(
        {
            "name": "rl-on-ray",
            "team": "research",
            "entrypoint": "gpufleet.rl.dqn:train",
            "args": {"actors": 2, "updates": UPDATES, "learning_starts": 500, "stop_at_return": None, "seed": 0},
            "resources": {"gpus": 0, "cpus": 1},
            "checkpoint": {"every_steps": 700, "keep": 1000, "grace_seconds": 60},  # the last save at exit
            "health": {"spike_zscore": None},
        }
    )
    job = backend.submit(spec)

    def rl(attempt: int, key: str) -> list[dict[str, Any]]:
        return [e.data for e in store.events(job) if e.kind == "rl" and e.attempt == attempt and key in e.data]

    follow(backend, lambda: bool(rl(1, "actor_pids")), timeout=180)
    first = rl(1, "actor_pids")[0]
    assert first["actor_kind"] == "ray"
    pids = [int(p) for p in first["actor_pids"]]
    attempt_pid = store.attempts(job)[0].pid
    for pid in pids:  # Ray's worker processes, named after the actor class: not the learner's children
        assert pid != attempt_pid
        assert b"EnvWorker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    os.kill(pids[0], signal.SIGKILL)
    follow(backend, lambda: any(e["actor_restarts"] >= 1 for e in rl(1, "actor_restarts")), timeout=180)
    restarted = next(e for e in rl(1, "actor_restarts") if e["actor_restarts"] >= 1 and "actor_pids" in e)
    assert restarted["actor_pids"][0] != pids[0] and restarted["actor_pids"][1] == pids[1]

    follow(backend, lambda: (latest_step(store, job) or 0) >= 1_400, timeout=300)
    backend.preempt(job)
    follow(backend, lambda: any(e.kind == "rl_restored" for e in store.events(job)), timeout=300)
    follow(backend, lambda: store.job(job).state in ("completed", "failed"), timeout=400)
    assert [a.outcome for a in store.attempts(job)] == ["preempted", "completed"]
    events = store.events(job)
    restored = next(e for e in events if e.kind == "restore" and e.attempt == 2)
    said = next(e for e in events if e.kind == "rl_restored")
    _, state = CheckpointDir(home / "jobs" / str(job) / "checkpoints").load(Path(restored.data["path"]))
    saved = Experience(ReplayBuffer(50_000, 4))
    saved.load_state_dict(state["replay"])
    assert said.data["buffer_sha256"] == saved.digest()
    assert said.data["buffer_size"] == len(saved) >= 1_000 and said.data["env_steps"] == saved.env_steps
    (done,) = [e for e in events if e.kind == "rl_done"]
    assert done.data["env_steps"] >= UPDATES
    shown = CliRunner().invoke(app, ["show", str(job), "--json"])
    assert shown.exit_code == 0, shown.output
    summary = json.loads(shown.stdout)["rl"]
    assert summary["actor_kind"] == "ray" and summary["actor_restarts"] >= 1 and summary["env_steps"] >= UPDATES
    second = [int(p) for p in rl(2, "actor_pids")[0]["actor_pids"]]
    # Ray stops an owner's actors when it exits: wait for that (the timeout is only a safety net)
    follow(backend, lambda: all(process_gone(pid) for pid in [*restarted["actor_pids"], *second]), timeout=60)
