"""The DQN actor-learner as a local fleet job: solves CartPole, resumes with its buffer, survives a killed actor."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import drive
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.jobs.store import latest_step
from gpufleet.rl.replay import Experience, ReplayBuffer
from gpufleet.runtime import CheckpointDir
from gpufleet.spec import parse_spec


def dqn_spec(name: str, **args: Any) -> Any:
    return parse_spec(
        {
            "name": name,
            "team": "research",
            "entrypoint": "gpufleet.rl.dqn:train",
            "args": {"seed": 0, **args},
            "resources": {"gpus": 0, "cpus": 1},
            "checkpoint": {"every_steps": 2000, "keep": 1000, "grace_seconds": 60},
            "health": {"spike_zscore": None},
        }
    )


@pytest.mark.slow  # make soak: solving CartPole takes minutes on 2 cores; make test resumes a learner on Ray
@pytest.mark.timeout(900)
def test_cartpole_is_solved_through_two_preemptions_and_each_resume_has_the_saved_buffer(
    local: Any, home: Path
) -> None:
    backend, scheduler = local
    job = backend.submit(dqn_spec("dqn", actors=0, updates=50_000))
    for n, at in ((1, 6_000), (2, 16_000)):

        def reached(n: int = n, at: int = at) -> bool:
            return len(backend.store.attempts(job)) == n and (latest_step(backend.store, job) or 0) >= at

        def ended(n: int = n) -> bool:
            return backend.store.attempts(job)[n - 1].outcome is not None

        drive(scheduler, reached, timeout=600)
        backend.preempt(job)
        drive(scheduler, ended, timeout=300)
    drive(scheduler, lambda: backend.store.job(job).state in ("completed", "failed"), timeout=900)
    assert [a.outcome for a in backend.store.attempts(job)] == ["preempted", "preempted", "completed"]
    events = backend.store.events(job)
    ckpts = CheckpointDir(home / "jobs" / str(job) / "checkpoints")
    for attempt in (2, 3):
        restored = next(e for e in events if e.kind == "restore" and e.attempt == attempt)
        said = next(e for e in events if e.kind == "rl_restored" and e.attempt == attempt)
        _, state = ckpts.load(Path(restored.data["path"]))
        saved = Experience(ReplayBuffer(50_000, 4))
        saved.load_state_dict(state["replay"])
        assert said.data["buffer_sha256"] == saved.digest() and said.data["buffer_size"] == len(saved) > 0
    (done,) = [e for e in events if e.kind == "rl_done"]
    assert done.data["solved_at_env_step"] is not None and done.data["solved_at_env_step"] <= 50_000
    assert done.data["mean_return_100"] >= 195
    print(f"solved at {done.data['solved_at_env_step']} environment steps, through two preemptions")


@pytest.mark.timeout(600)
def test_a_killed_actor_is_restarted_and_the_learner_goes_on(local: Any, home: Path) -> None:
    backend, scheduler = local
    job = backend.submit(dqn_spec("actors", actors=2, updates=3_000, learning_starts=500, stop_at_return=None))

    def pids() -> list[int]:
        found = [e for e in backend.store.events(job) if e.kind == "rl" and e.data.get("actor_pids")]
        return list(found[0].data["actor_pids"]) if found else []

    drive(scheduler, lambda: bool(pids()), timeout=300)
    os.kill(pids()[0], signal.SIGKILL)
    drive(scheduler, lambda: backend.store.job(job).state in ("completed", "failed"), timeout=500)
    assert backend.store.job(job).state == "completed"
    assert len(backend.store.attempts(job)) == 1
    restarts = [e.data.get("actor_restarts", 0) for e in backend.store.events(job) if e.kind == "rl"]
    assert max(restarts) >= 1
    (done,) = [e for e in backend.store.events(job) if e.kind == "rl_done"]
    assert done.data["env_steps"] >= 3_000
    shown = CliRunner().invoke(app, ["show", str(job), "--json"])
    assert shown.exit_code == 0, shown.output
    rl = json.loads(shown.stdout)["rl"]
    assert rl["actor_kind"] == "process" and rl["actor_restarts"] >= 1 and rl["env_steps"] >= 3_000
    text = CliRunner().invoke(app, ["show", str(job)]).stdout
    assert "rl: env steps/s" in text and "actors: process" in text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"env_id": "NoSuchEnv-v9"}, "args.env_id='NoSuchEnv-v9'"),
        ({"buffer_capacity": 32, "batch_size": 64}, "args.buffer_capacity=32 is smaller than args.batch_size=64"),
    ],
)
def test_bad_arguments_fail_the_job_naming_the_value(local: Any, home: Path, args: dict[str, Any], needle: str) -> None:
    backend, scheduler = local
    spec = dqn_spec("bad", actors=0, updates=10, **args).copy_with(max_restarts=0)
    job = backend.submit(spec)
    drive(scheduler, lambda: backend.store.job(job).state in ("completed", "failed"), timeout=120)
    assert backend.store.job(job).state == "failed"
    assert needle in (home / "jobs" / str(job) / "logs" / "attempt-1.log").read_text()
