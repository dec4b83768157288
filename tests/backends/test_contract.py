"""The backend contract over every backend, on in-process fakes (the real services: tests/integration).

local: the real scheduler, ticked by the test. slurm: :class:`FakeSlurm` running the real batch
scripts. ray: the real actor body (``JobRunner``) in this process. Each scenario and a crash of
the scheduler side at every store write run on all three.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from backend_contract import SCENARIOS, FakeSlurm, Harness, check_crash_at_write, command_spec
from test_ray_unit import FakeCluster

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.ray.backend import RayBackend
from gpufleet.backends.slurm.backend import SlurmBackend
from gpufleet.spec import JobSpec


class LocalHarness(Harness):
    name = "local"

    def __init__(self, home: Path) -> None:
        self.backend = LocalBackend(home, spawn=False)
        self.schedulers = [LocalScheduler(home, slots=1, poll_s=0.02)]
        self.writer = self.schedulers[0].store

    def advance(self) -> None:
        self.schedulers[-1].tick()

    def refused(self) -> tuple[JobSpec, str]:
        return command_spec("pass", resources={"cpus": 1, "gpus": 4}), "exceeds the local backend's 1 virtual GPU"

    def restart(self) -> None:
        dead = self.schedulers[-1]
        survivor = LocalScheduler(self.backend.home, slots=1, poll_s=0.02)
        survivor.adopt_orphans()
        for run in dead.running.values():  # the dead scheduler's children: reaped for hygiene only
            run.proc.wait(timeout=60)
            run.log.close()
        self.schedulers.append(survivor)

    def close(self) -> None:
        self.schedulers[-1].shutdown(grace_s=5)


class SlurmHarness(Harness):
    name = "slurm"

    def __init__(self, home: Path) -> None:
        self.slurm = FakeSlurm(kill_wait=1.0)
        self.backend = SlurmBackend(home, runner=self.slurm)
        self.writer = self.backend.store

    def advance(self) -> None:
        self.slurm.tick()
        self.backend.sync()

    fill = {"cpus": 2, "gpus": 0}  # the fake node's CPUs
    waits = {"cpus": 1, "gpus": 0}

    def refused(self) -> tuple[JobSpec, str]:
        return command_spec("pass", team="nosuchteam"), "Invalid account"

    def restart(self) -> None:
        self.backend = SlurmBackend(self.backend.home, runner=self.slurm)

    def close(self) -> None:
        self.slurm.close()


class RayHarness(Harness):
    name = "ray"

    def __init__(self, home: Path) -> None:
        self.cluster = FakeCluster()
        self.backend = RayBackend(home, cluster=self.cluster)
        self.writer = self.backend.store

    def advance(self) -> None:
        self.backend.sync()

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        self.cluster.schedule = False
        try:
            yield
        finally:
            self.cluster.schedule = True

    def refused(self) -> tuple[JobSpec, str]:
        return command_spec("pass", resources={"cpus": 64, "gpus": 0}), "exceeds the Ray cluster's 2 CPUs"

    def restart(self) -> None:
        self.backend = RayBackend(self.backend.home, cluster=self.cluster)

    def close(self) -> None:
        for runner in self.cluster.runners.values():
            runner.cancel(0.5)
        self.cluster.join()


HARNESSES = {"local": LocalHarness, "slurm": SlurmHarness, "ray": RayHarness}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest, home: Path) -> Iterator[Harness]:
    made = HARNESSES[request.param](home)
    yield made
    made.close()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_contract(harness: Harness, scenario: str) -> None:
    SCENARIOS[scenario](harness)


@pytest.mark.parametrize("k", range(1, 13))
def test_scheduler_side_killed_at_any_write(harness: Harness, k: int) -> None:
    """11 writes on local (launch, preempt, end, relaunch, end); 3 or 4 syncs that write on the others."""
    killed = check_crash_at_write(harness, k)
    assert killed or k > (11 if harness.name == "local" else 3), "the scenario's writes are always reached"
