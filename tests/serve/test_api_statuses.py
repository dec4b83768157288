"""The API answers by what happened: 404 for an unknown job, 409 for a job in the wrong state, 503 for a
service that does not answer, and whatever status the error's class carries.

The server is the real app under uvicorn on a loopback port (``served`` in conftest); the jobs are
written straight into the store, so no scheduler runs.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import http, served

from gpufleet.errors import GpufleetError, Timeout
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import Store
from gpufleet.paths import state_db
from gpufleet.serve.app import ServeConfig, create_app
from gpufleet.spec import parse_spec

TOKEN = "s" * 40
BEARER = {"Authorization": f"Bearer {TOKEN}"}
JSON_BEARER = {**BEARER, "Content-Type": "application/json"}


def stored_job(home: Path, state: JobState) -> int:
    """A local job recorded straight into the store in ``state``."""
    spec = parse_spec(
        {
            "name": "toy",
            "team": "vision",
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": 10},
            "resources": {"gpus": 0, "cpus": 1},
        }
    )
    store = Store(state_db(home))
    job_id = store.add_job(spec, "local", None)
    store.set_job_state(job_id, state)
    store.close()
    return job_id


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening, for as long as the test runs: a connection is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_an_unknown_job_is_404(home: Path) -> None:
    stored_job(home, JobState.QUEUED)
    with served(create_app(ServeConfig(home=home, token=TOKEN, sync_remote=False))) as url:
        for path in ("/api/jobs/99", "/api/jobs/99/series", "/api/jobs/99/logs"):
            status, reply = http("GET", url + path)
            assert status == 404 and "no job 99" in reply["detail"], (path, status, reply)
        for verb in ("cancel", "preempt", "hold", "release"):
            status, reply = http("POST", f"{url}/api/jobs/99/{verb}", headers=BEARER)
            assert status == 404 and "no job 99" in reply["detail"], (verb, status, reply)


def test_a_job_in_the_wrong_state_is_409(home: Path) -> None:
    done = stored_job(home, JobState.COMPLETED)
    queued = stored_job(home, JobState.QUEUED)
    with served(create_app(ServeConfig(home=home, token=TOKEN, sync_remote=False))) as url:
        status, reply = http("POST", f"{url}/api/jobs/{done}/cancel", headers=BEARER)
        assert (status, reply) == (409, {"detail": f"job {done} is already completed"})
        status, reply = http("POST", f"{url}/api/jobs/{queued}/release", headers=BEARER)
        assert (status, reply) == (409, {"detail": f"job {queued} is not held: nothing to release"})
        status, reply = http("POST", f"{url}/api/jobs/{queued}/preempt", headers=BEARER)
        assert status == 409 and "not running" in reply["detail"]
        status, reply = http("GET", f"{url}/api/jobs/{queued}/logs")
        assert status == 409 and "has not started yet" in reply["detail"]
    assert Store(state_db(home)).job(done).state == JobState.COMPLETED


def test_a_registry_server_that_does_not_answer_is_503(
    home: Path, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"http://127.0.0.1:{closed_port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with served(create_app(ServeConfig(home=home, token=TOKEN, sync_remote=False))) as url:
        body = b'{"version": "2", "reason": "canary passed"}'
        status, reply = http("POST", f"{url}/api/registry/churn/promote", body, JSON_BEARER)
        assert status == 503 and f"no MLflow server answers at {uri}" in reply["detail"], (status, reply)
        status, reply = http("POST", f"{url}/api/registry/churn/rollback", b'{"reason": "worse"}', JSON_BEARER)
        assert status == 503 and f"no MLflow server answers at {uri}" in reply["detail"], (status, reply)


class Teapot(GpufleetError):
    """An error whose status only its class knows."""

    http_status = 418


@pytest.mark.parametrize(("error", "status"), [(Timeout("the actor did not answer"), 504), (Teapot("short"), 418)])
def test_the_status_is_the_errors_own(home: Path, error: GpufleetError, status: int) -> None:
    app = create_app(ServeConfig(home=home, token=TOKEN, sync_remote=False))

    @app.get("/api/raises")
    def raises() -> None:
        raise error

    with served(app) as url:
        assert http("GET", f"{url}/api/raises") == (status, {"detail": str(error)})
