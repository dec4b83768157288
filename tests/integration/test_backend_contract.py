"""The backend contract (tests/backend_contract.py) on the real things.

local: a real detached scheduler with one slot. slurm: the cluster `scripts/dev-slurm up` started.
ray: the cluster `scripts/dev-ray up` started. Each fails under CI, and skips elsewhere, when its
service is not running. The crash of the scheduler side at every store write runs on the fakes
(tests/backends/test_contract.py): it needs a hook inside the process that writes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from backend_contract import SCENARIOS, Harness, command_spec

from gpufleet.backends.local import LocalBackend, scheduler_pid
from gpufleet.backends.ray.backend import RayBackend
from gpufleet.backends.slurm.backend import SlurmBackend, slurm_env
from gpufleet.spec import JobSpec


class RealLocal(Harness):
    name = "local"

    def __init__(self, home: Path) -> None:
        self.backend = LocalBackend(home)
        self.writer = self.backend.store

    def advance(self) -> None:
        self.backend.sync()

    def refused(self) -> tuple[JobSpec, str]:
        return command_spec("pass", resources={"cpus": 1, "gpus": 4}), "exceeds the local backend's 1 virtual GPU"

    def close(self) -> None:
        pid = scheduler_pid(self.backend.home)
        if pid and pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


class RealRemote(Harness):
    """A cluster the test reaches by syncing; whatever a failed test left there is cancelled."""

    waits = {"cpus": 1, "gpus": 0}

    def advance(self) -> None:
        self.backend.sync()

    def close(self) -> None:
        self.cancel_left()


class RealSlurm(RealRemote):
    name = "slurm"

    def __init__(self, home: Path) -> None:
        self.backend = SlurmBackend(home)
        self.writer = self.backend.store
        out = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, env=slurm_env(), check=True)
        self.fill = {"cpus": max(int(c) for c in out.stdout.split()), "gpus": 0}

    def refused(self) -> tuple[JobSpec, str]:
        return command_spec("pass", team="nosuchteam"), "Invalid account"


class RealRay(RealRemote):
    name = "ray"

    def __init__(self, home: Path) -> None:
        self.backend = RayBackend(home)
        self.writer = self.backend.store
        self.fill = {"cpus": int(self.backend.cluster().resources()["CPU"]), "gpus": 0}

    def refused(self) -> tuple[JobSpec, str]:
        return command_spec("pass", resources={"cpus": 512, "gpus": 0}), "exceeds the Ray cluster's"


@pytest.fixture(params=["local", "slurm", "ray"])
def real(request: pytest.FixtureRequest, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    made: Harness
    if request.param == "local":
        monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "1")
        made = RealLocal(home)
    elif request.param == "slurm":
        request.getfixturevalue("slurm")
        made = RealSlurm(home)
    else:
        request.getfixturevalue("ray")
        made = RealRay(home)
    yield made
    made.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_contract_on_the_real_service(real: Harness, scenario: str) -> None:
    SCENARIOS[scenario](real)
