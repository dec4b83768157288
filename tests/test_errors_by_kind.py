"""Errors named by what happened: each class's exit code and HTTP status, and where each kind is raised.

An unknown job is :class:`NotFound`, a job in the wrong state :class:`Conflict` (both still a
:class:`UsageError`, exit 2), an actor that does not answer :class:`Timeout` (exit 3, like a service
that is down). The CLI ends each with its class's ``exit_code``.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_refused, run_cli

import gpufleet.errors as errors_module
from gpufleet.backends.local import LocalBackend
from gpufleet.backends.ray.backend import RayBackend
from gpufleet.backends.ray.runner import RunnerArgs, RunStatus, start_attempt, status_path, write_status
from gpufleet.errors import (
    CheckpointError,
    Conflict,
    GpufleetError,
    HealthError,
    NotFound,
    ParameterError,
    ServiceUnavailable,
    SpecError,
    StoreError,
    Timeout,
    UsageError,
)
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import Store
from gpufleet.paths import state_db
from gpufleet.quality.deploy import plan_promotion, plan_rollback
from gpufleet.spec import JobSpec, parse_spec

SPEC = {
    "name": "toy",
    "team": "vision",
    "entrypoint": "gpufleet.workloads.toy:train",
    "args": {"steps": 10},
    "resources": {"gpus": 0, "cpus": 1},
}


def toy() -> JobSpec:
    return parse_spec(SPEC)


def stored_job(home: Path, state: JobState, backend: str = "local") -> int:
    """A job recorded straight into the store in ``state`` (no scheduler runs)."""
    store = Store(state_db(home))
    job_id = store.add_job(toy(), backend, None)
    store.set_job_state(job_id, state)
    store.close()
    return job_id


# ---- the classes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "exit_code", "http_status"),
    [
        (GpufleetError, 2, 400),
        (SpecError, 2, 400),
        (UsageError, 2, 400),
        (ParameterError, 2, 422),
        (NotFound, 2, 404),
        (Conflict, 2, 409),
        (CheckpointError, 1, 400),
        (HealthError, 1, 400),
        (StoreError, 2, 400),
        (ServiceUnavailable, 3, 503),
        (Timeout, 3, 504),
    ],
)
def test_each_class_says_its_exit_code_and_http_status(
    cls: type[GpufleetError], exit_code: int, http_status: int
) -> None:
    assert (cls.exit_code, cls.http_status) == (exit_code, http_status)


def test_not_found_and_conflict_are_usage_errors_and_a_timeout_is_a_service_unavailable() -> None:
    assert issubclass(NotFound, UsageError) and issubclass(Conflict, UsageError)
    assert not issubclass(NotFound, Conflict) and not issubclass(Conflict, NotFound)
    assert issubclass(Timeout, ServiceUnavailable) and not issubclass(Timeout, UsageError)
    with pytest.raises(UsageError, match="no job 5"):
        raise NotFound("no job 5")


def test_every_exported_error_carries_both_attributes() -> None:
    exported = [getattr(errors_module, name) for name in errors_module.__all__]
    classes = [c for c in exported if isinstance(c, type) and issubclass(c, GpufleetError)]
    assert {NotFound, Conflict, Timeout} <= set(classes)
    for cls in classes:
        assert isinstance(cls.exit_code, int) and isinstance(cls.http_status, int), cls


# ---- where each kind is raised ------------------------------------------------------------------


def test_an_unknown_job_is_not_found(home: Path) -> None:
    stored_job(home, JobState.QUEUED)
    with pytest.raises(NotFound, match="no job 99"):
        Store(state_db(home)).job(99)
    with pytest.raises(NotFound, match="no job 99"):
        LocalBackend(home, spawn=False).cancel(99)


def test_a_job_in_the_wrong_state_is_a_conflict(home: Path) -> None:
    backend = LocalBackend(home, spawn=False)
    done = stored_job(home, JobState.COMPLETED)
    queued = stored_job(home, JobState.QUEUED)
    with pytest.raises(Conflict, match=f"job {done} is already completed"):
        backend.cancel(done)
    with pytest.raises(Conflict, match=f"job {queued} is queued, not running"):
        backend.preempt(queued)
    with pytest.raises(Conflict, match=f"job {queued} is not held"):
        backend.release(queued)


def test_alias_moves_the_aliases_refuse_are_conflicts() -> None:
    with pytest.raises(Conflict, match="already @champion"):
        plan_promotion({"champion": "2"}, "2")
    with pytest.raises(Conflict, match="no @previous version"):
        plan_rollback({"champion": "2"}, "'churn'")


class SilentCluster:
    """A Ray cluster whose actors start (their status file says running) but never answer a call."""

    address = "127.0.0.1:1"

    def __init__(self, home: Path) -> None:
        self.home = home

    def resources(self) -> dict[str, float]:
        return {"CPU": 2.0, "GPU": 0.0}

    def start(self, args: RunnerArgs, options: dict[str, Any]) -> str:
        status = start_attempt(RunStatus(job_id=args.job_id), pid=None, node="n1", now=time.time())
        write_status(status_path(self.home, args.job_id), status)
        return f"actor{args.job_id}"

    def call(self, job_id: int, method: str, *args: Any, timeout: float) -> Any:
        raise TimeoutError(method)

    def kill(self, job_id: int) -> None:
        return None

    def alive(self, job_id: int) -> bool:
        return True


def test_an_actor_that_does_not_answer_is_a_timeout(home: Path) -> None:
    backend = RayBackend(home, cluster=SilentCluster(home))
    job_id = backend.submit(toy())
    backend.sync()
    assert backend.store.job(job_id).state == JobState.RUNNING
    with pytest.raises(Timeout, match=f"job {job_id}'s actor did not answer") as caught:
        backend.preempt(job_id)
    assert caught.value.exit_code == 3 and caught.value.http_status == 504


def test_a_submit_with_a_bad_job_variable_is_refused_before_the_store_is_opened(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "soon")
    with pytest.raises(UsageError, match="GPUFLEET_LOG_EVERY_S='soon' is invalid"):
        LocalBackend(home, spawn=False).submit(toy())
    assert not home.exists()


# ---- the command line ---------------------------------------------------------------------------


def test_the_cli_exits_2_for_an_unknown_job_and_for_a_wrong_state(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli(capsys, monkeypatch, "cancel", "7")
    assert_refused(code, err, home, "no job 7")
    done = stored_job(home, JobState.COMPLETED)
    code, out, err = run_cli(capsys, monkeypatch, "cancel", str(done))
    lines = err.strip().splitlines()
    assert (code, out, len(lines)) == (2, "", 1) and f"job {done} is already completed" in lines[0], err
    assert "Traceback" not in err


def test_the_cli_exits_with_the_errors_own_exit_code(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Slow:
        def cancel(self, job_id: int) -> None:
            raise Timeout(f"job {job_id}'s actor did not answer in 30s; try again")

    monkeypatch.setattr(importlib.import_module("gpufleet.cli.jobs"), "_backend_of", lambda job_id: Slow())
    code, out, err = run_cli(capsys, monkeypatch, "cancel", "3")
    assert (code, out) == (3, "") and err.strip() == "error: job 3's actor did not answer in 30s; try again"
