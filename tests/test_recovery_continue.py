"""``distributed.recovery: continue`` on the local backend: the survivors step on while a lost rank heals.

A 2-rank tinylm job (each rank a torchft replica of one) loses rank 1 to ``kill -9`` mid-run: rank 0
keeps its process and keeps stepping alone, the supervisor starts a replacement that heals from
rank 0's live state, and the job completes in its first attempt with both replicas holding the same
weights. The steps rank 0 ran alone are recorded. Not bit-exact, by design: those steps averaged
one share of the batch, not two.

The spec's rules and the pure parts (the short-handed count, each replica's variables) need no
torchft; the end-to-end case does, and fails (not skips) under ``CI`` without it.
"""

from __future__ import annotations

import importlib.util
import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import drive, service_missing
from test_recovery_wait import events, finish, stepped_past
from test_recovery_wait import local2 as local2  # a fixture, found by its name in this module

from gpufleet.backends.base import Feature
from gpufleet.backends.group_launch.elastic import (
    SHARED_REPLICA_ENVIRONMENT,
    replica_ckpt_dir,
    replica_environment,
)
from gpufleet.backends.local import LocalBackend
from gpufleet.backends.ray.backend import RayBackend
from gpufleet.backends.slurm.backend import SlurmBackend
from gpufleet.cost.usage import job_usages
from gpufleet.errors import SpecError, UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.protocol import (
    ENV_CKPT_DIR,
    ENV_ELASTIC_EVENTS,
    ENV_EVENTS,
    ENV_RECOVERY,
    ENV_REPLICA_RANK,
    ENV_REPLICAS,
    recovery_environment,
)
from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.runtime.elastic import EVENT_EVERY, ShortHanded, replica_place
from gpufleet.spec import parse_spec
from gpufleet.workloads.tinylm import TINY

STEPS = 80


def need_torchft() -> None:
    if importlib.util.find_spec("torchft") is None:
        service_missing("torchft is not installed: pip install 'gpufleet[elastic]'")


def continue_spec(name: str, **overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": name,
        "entrypoint": "gpufleet.workloads.tinylm:train",
        "args": {**TINY, "steps": STEPS, "step_seconds": 0.1},
        "resources": {"nodes": 1, "gpus": 2, "cpus": 2},
        "distributed": {"strategy": "ddp", "timeout_seconds": 30, "recovery": "continue"},
        "checkpoint": {"every_steps": 10, "grace_seconds": 60},
        "health": {"action": "mark"},
        "max_restarts": 3,
    }
    for key, value in overrides.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and isinstance(raw.get(key), dict) else value
    return raw


# ---- the spec ------------------------------------------------------------------------------------


def test_continue_is_accepted_for_ddp_under_torchrun_on_one_node() -> None:
    spec = parse_spec(continue_spec("ok"))
    assert spec.distributed is not None and spec.distributed.recovery == "continue"
    env = recovery_environment(spec)
    assert env[ENV_RECOVERY] == "continue" and float(env["GPUFLEET_RECOVERY_TIMEOUT_S"]) == 120.0


@pytest.mark.parametrize(
    ("overrides", "needs"),
    [
        ({"distributed": {"strategy": "fsdp"}}, "distributed.strategy: ddp (not fsdp)"),
        ({"distributed": {"strategy": "none"}}, "distributed.strategy: ddp (not none)"),
        ({"distributed": {"launcher": "script"}}, "distributed.launcher: torchrun (not script)"),
        ({"resources": {"nodes": 2}}, "resources.nodes: 1 (not 2)"),
        ({"checkpoint": {"memory": {"every_steps": 1}}}, "no checkpoint.memory"),
        ({"health": {"action": "rollback"}}, "health.action: mark (not rollback"),
    ],
)
def test_continue_is_refused_in_one_line_where_it_cannot_run(overrides: dict[str, Any], needs: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(continue_spec("refused", **overrides))
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 2
    assert f"continue (elastic: survivors step short-handed) needs {needs}" in message
    assert "use wait (exact: survivors keep their processes) or requeue" in message


def test_wait_and_requeue_are_unchanged() -> None:
    wait = parse_spec(continue_spec("wait", distributed={"recovery": "wait"}))
    assert recovery_environment(wait)[ENV_RECOVERY] == "wait"
    assert recovery_environment(parse_spec(continue_spec("requeue", distributed={"recovery": "requeue"}))) == {}


# ---- the pure parts ------------------------------------------------------------------------------


def test_short_handed_steps_are_counted_in_runs_and_emitted_when_the_group_is_whole_again() -> None:
    count = ShortHanded(replicas=3, samples_per_replica=4)
    assert count.note(1, 3) is None
    assert count.note(2, 2) is None and count.note(3, 1) is None
    assert count.note(4, 3) == {
        "steps": 2,
        "samples_skipped": 4 + 8,
        "participants": 1,
        "replicas": 3,
        "first_step": 2,
        "last_step": 3,
    }
    assert count.flush() is None


def test_a_replica_that_stops_counting_records_what_it_counted_at_once() -> None:
    count = ShortHanded(replicas=2, samples_per_replica=4)
    assert count.note(5, 1) is None and count.note(6, 1) is None
    assert count.flush() == {
        "steps": 2,
        "samples_skipped": 8,
        "participants": 1,
        "replicas": 2,
        "first_step": 5,
        "last_step": 6,
    }
    assert count.flush() is None  # nothing is recorded twice


def test_a_long_run_of_short_handed_steps_is_emitted_in_batches() -> None:
    count = ShortHanded(replicas=2, samples_per_replica=1)
    emitted = [e for e in (count.note(step, 1) for step in range(1, EVENT_EVERY * 2 + 4)) if e is not None]
    assert [e["steps"] for e in emitted] == [EVENT_EVERY, EVENT_EVERY]
    assert count.flush() == {
        "steps": 3,
        "samples_skipped": 3,
        "participants": 1,
        "replicas": 2,
        "first_step": 2 * EVENT_EVERY + 1,
        "last_step": 2 * EVENT_EVERY + 3,
    }


def test_each_replica_is_a_world_of_one_and_only_replica_0_writes_the_jobs_events_and_checkpoints() -> None:
    base = {ENV_EVENTS: "/h/jobs/7/events.jsonl", ENV_CKPT_DIR: "/h/jobs/7/checkpoints", "PATH": "/bin"}
    first = replica_environment(base, 0, 2, "http://127.0.0.1:9", SHARED_REPLICA_ENVIRONMENT)
    second = replica_environment(base, 1, 2, "http://127.0.0.1:9", SHARED_REPLICA_ENVIRONMENT)
    for env in (first, second):
        assert env["WORLD_SIZE"] == "1" and env["RANK"] == "0" and "TORCHELASTIC_RUN_ID" not in env
        assert env[ENV_ELASTIC_EVENTS] == base[ENV_EVENTS] and env[ENV_REPLICAS] == "2"
    assert (first["LOCAL_RANK"], second["LOCAL_RANK"]) == ("0", "1")  # each replica's own device
    assert first[ENV_EVENTS] == base[ENV_EVENTS] and first[ENV_CKPT_DIR] == base[ENV_CKPT_DIR]
    assert ENV_EVENTS not in second and second[ENV_CKPT_DIR] == "/h/jobs/7/replicas/replica-1/checkpoints"
    assert replica_place(second) == (1, 2) and replica_place({}) == (0, 1)
    assert replica_place({ENV_REPLICA_RANK: "2", ENV_REPLICAS: "2"}) == (0, 1)


# ---- end to end ----------------------------------------------------------------------------------


def final_model(folder: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """The step and model weights of the newest checkpoint in ``folder``."""
    checkpoints = CheckpointDir(folder)
    newest = checkpoints.scan()[-1]
    _, state = checkpoints.load(newest.path)
    return newest.step, state["model"]


@pytest.mark.timeout(900)
def test_a_killed_rank_heals_while_the_survivor_steps_on_and_the_job_completes_in_its_first_attempt(
    home: Path, local2: Any
) -> None:
    need_torchft()
    backend: LocalBackend
    backend, scheduler = local2
    job = backend.submit(parse_spec(continue_spec("elastic")))
    drive(scheduler, lambda: stepped_past(backend, job, 8), timeout=600)
    live = home / "jobs" / str(job) / "ranks" / "attempt-1"
    pids = {rank: int((live / f"replica-ready-{rank}").read_text()) for rank in (0, 1)}
    os.kill(pids[1], signal.SIGKILL)
    finish(backend, scheduler, job)
    done = backend.store.job(job)
    log = (home / "jobs" / str(job) / "logs" / "attempt-1.log").read_text()
    assert done.state == "completed" and done.restarts == 0, (done.reason, log[-4000:])
    assert [a.outcome for a in backend.store.attempts(job)] == ["completed"]
    starts = events(backend, job, EventKind.SESSION_START)
    assert {e["pid"] for e in starts} == {pids[0]}, starts  # rank 0 kept its process, and started once
    short = events(backend, job, EventKind.SHORT_HANDED)
    assert short and sum(e["steps"] for e in short) > 0, log[-4000:]
    assert all(e["samples_skipped"] == e["steps"] * TINY["batch_size"] // 2 for e in short)
    reformed = events(backend, job, EventKind.GROUP_REFORMED)
    assert len(reformed) == 1 and reformed[0]["replaced"] == [1] and reformed[0]["tier"] == "peer", reformed
    assert reformed[0]["pids"]["0"] == pids[0] and reformed[0]["pids"]["1"] != pids[1]
    ckpts = home / "jobs" / str(job) / "checkpoints"
    step0, weights0 = final_model(ckpts)
    step1, weights1 = final_model(Path(replica_ckpt_dir(str(ckpts), 1)))
    assert step0 == step1 == STEPS
    assert weights0.keys() == weights1.keys()
    for name, tensor in weights0.items():
        assert torch.equal(tensor, weights1[name]), f"replicas disagree on {name}"
    losses = [e["loss"] for e in events(backend, job, EventKind.STEP)]
    assert losses and all(math.isfinite(v) for v in losses)
    (usage,) = job_usages(backend.store, backend.store.job(job))
    assert usage.short_handed_steps == sum(e["steps"] for e in short)
    assert usage.samples_skipped == sum(e["samples_skipped"] for e in short)
    assert "[INFO] [torchft::" not in log  # torchft's per-step notes stay out of the job's log


def test_the_local_backend_refuses_continue_without_torchft_and_names_the_extra(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else real(name, *a))
    backend = LocalBackend(home, spawn=False)
    with pytest.raises(UsageError) as caught:
        backend.submit(parse_spec(continue_spec("no-torchft")))
    assert str(caught.value) == "distributed.recovery: continue needs torchft: pip install 'gpufleet[elastic]'"
    assert caught.value.exit_code == 2 and backend.store.jobs() == []


@pytest.mark.parametrize("backend_class", [SlurmBackend, RayBackend])
def test_schedulers_whose_ranks_gpufleet_does_not_launch_refuse_continue_naming_the_feature(
    backend_class: Any,
) -> None:
    assert Feature.ELASTIC not in backend_class.features and Feature.ELASTIC in LocalBackend.features
    backend = backend_class.__new__(backend_class)  # the refusal comes before any service is reached
    backend.name = backend_class.name
    with pytest.raises(UsageError) as caught:
        backend.submit(parse_spec(continue_spec("elsewhere")))
    assert str(caught.value) == (
        f"the {backend_class.name} backend does not support elastic recovery (distributed.recovery: continue, "
        "survivors stepping short-handed): use recovery: wait or requeue"
    )
