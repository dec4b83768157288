"""Holding a queued job back and releasing it, on the local backend; refused on Ray and for other states.

Slurm holds through ``scontrol hold``: the contract scenario ``hold_and_release`` runs it on FakeSlurm and on
the real cluster, and ``test_slurm_unit.py`` covers its refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import drive

from gpufleet.backends.base import Feature
from gpufleet.backends.ray.backend import RayBackend
from gpufleet.backends.slurm.backend import SlurmBackend
from gpufleet.errors import UsageError
from gpufleet.spec import parse_spec


def toy(name: str, priority: int = 0) -> Any:
    return parse_spec(
        {
            "name": name,
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": 20, "step_seconds": 0.01},
            "resources": {"gpus": 0, "cpus": 1},
            "priority": priority,
        }
    )


def test_a_held_job_waits_while_the_ones_behind_it_run_and_starts_once_released(local: Any) -> None:
    backend, scheduler = local
    held = backend.submit(toy("held", priority=5))  # first in line: priority 5
    behind = backend.submit(toy("behind"))
    backend.hold(held)
    job = backend.store.job(held)
    assert job.state == "queued" and job.reason is not None and "held" in job.reason
    drive(scheduler, lambda: backend.store.job(behind).state == "completed")
    assert backend.store.job(held).state == "queued" and backend.store.attempts(held) == []
    with pytest.raises(UsageError, match="is already completed"):
        backend.hold(behind)
    backend.release(held)
    assert backend.store.job(held).reason is None
    drive(scheduler, lambda: backend.store.job(held).state == "completed")
    kinds = [e.kind for e in backend.store.events(held)]
    assert kinds.index("held") < kinds.index("released") < kinds.index("attempt_start")
    with pytest.raises(UsageError, match="already completed"):
        backend.release(held)


def test_release_of_a_job_not_held_and_hold_of_a_running_one_are_refused(local: Any) -> None:
    backend, scheduler = local
    job = backend.submit(toy("slow").copy_with(args={"steps": 100_000, "step_seconds": 0.01}))
    with pytest.raises(UsageError, match="is not held: nothing to release"):
        backend.release(job)
    drive(scheduler, lambda: backend.store.job(job).state == "running")
    with pytest.raises(UsageError, match="is running, not queued: only a queued job can be held"):
        backend.hold(job)
    backend.cancel(job)
    drive(scheduler, lambda: backend.store.job(job).state == "cancelled")


def test_slurm_declares_hold() -> None:
    assert Feature.HOLD in SlurmBackend.features


@pytest.mark.parametrize("backend_class", [RayBackend])
def test_backends_without_a_queue_of_ours_refuse_hold_naming_the_feature(backend_class: Any, home: Path) -> None:
    assert Feature.HOLD not in backend_class.features
    backend = backend_class.__new__(backend_class)  # the refusal comes before any service is reached
    backend.name = backend_class.name
    with pytest.raises(UsageError, match=f"the {backend_class.name} backend does not support holding a queued job"):
        backend.hold(1)
