"""``gpufleet serve``'s JSON API against the CLI's ``--json``, its token and origin checks, its OpenAPI file.

The server is the real app under uvicorn on a loopback port (``served`` in conftest); requests go
through urllib, as any client's would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import drive, follow, http, run_cli, served
from typer.testing import CliRunner

from gpufleet.backends.local import LocalBackend
from gpufleet.cli.app import app as cli_app
from gpufleet.errors import UsageError
from gpufleet.jobs.store import latest_step
from gpufleet.serve import app as serve_app
from gpufleet.serve.app import ServeConfig, create_app, openapi_document
from gpufleet.serve.auth import load_token
from gpufleet.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
TOKEN = "t" * 40


def toy(name: str, team: str, steps: int = 40, pace: float = 0.0, **more: Any) -> Any:
    return parse_spec(
        {
            "name": name,
            "team": team,
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": steps, "step_seconds": pace},
            "resources": {"gpus": 0, "cpus": 1},
            "checkpoint": {"every_steps": 5, "grace_seconds": 30},
            **more,
        }
    )


def cli(*args: str) -> Any:
    result = CliRunner().invoke(cli_app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def as_served(value: Any, home: Path) -> Any:
    """The CLI's ``value`` as the server sends it: the home's absolute path written ``$GPUFLEET_HOME``."""
    return json.loads(json.dumps(value).replace(json.dumps(str(home))[1:-1], "$GPUFLEET_HOME"))


@pytest.fixture
def fleet(local: Any, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home with a completed job and one preempted once then completed."""
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    backend, scheduler = local
    first = backend.submit(toy("straight", "vision"))
    drive(scheduler, lambda: backend.store.job(first).state == "completed")
    gpu = {"resources": {"gpus": 1, "gpu_type": "H100", "cpus": 1}}
    telemetry = {"telemetry": {"gpu_source": "synthetic:tensor_idle", "sample_seconds": 0.05}}
    cut = backend.submit(toy("cut", "nlp", steps=60, pace=0.02, **gpu, **telemetry))
    drive(scheduler, lambda: (latest_step(backend.store, cut) or 0) >= 10)
    backend.preempt(cut)
    drive(scheduler, lambda: backend.store.job(cut).state == "completed", timeout=240)
    return home


def test_every_api_object_equals_the_clis_json(fleet: Path) -> None:
    with served(create_app(ServeConfig(home=fleet, token=TOKEN, sync_remote=False))) as url:
        assert http("GET", f"{url}/api/jobs") == (200, cli("jobs", "--json"))
        assert http("GET", f"{url}/api/jobs?team=nlp") == (200, cli("jobs", "--team", "nlp", "--json"))
        for job in (1, 2):
            shown = as_served(cli("show", str(job), "--json"), fleet)
            assert http("GET", f"{url}/api/jobs/{job}") == (200, shown)  # a small job: on the event loop
            with pytest.MonkeyPatch.context() as patch:  # over the bound: built in a thread, the same answer
                patch.setattr(serve_app, "LOOP_JOB_EVENTS", 0)
                assert http("GET", f"{url}/api/jobs/{job}") == (200, shown)
            status, logs = http("GET", f"{url}/api/jobs/{job}/logs?attempt=1")
            assert status == 200 and {k: v for k, v in logs.items() if k != "size"} == as_served(
                cli("logs", str(job), "--attempt", "1", "--json"), fleet
            )
        status, cost = http("GET", f"{url}/api/cost")
        assert status == 200 and cost.pop("period") == "all" and cost == cli("cost", "--json")
        status, fleet_view = http("GET", f"{url}/api/fleet")
        rows = cli("jobs", "--json")["jobs"]  # the fleet page's rows add each job's args, GPUs held and progress
        assert status == 200
        assert [{k: j[k] for k in row} for j, row in zip(fleet_view["jobs"], rows, strict=True)] == rows
        assert fleet_view["fleet"] == as_served(cli("fleet", "show", "--json"), fleet)
        assert fleet_view["states"] == {"completed": 2} and fleet_view["teams"]["nlp"] == {"completed": 1}
        assert any(e["kind"] == "sigterm" and e["job"] == 2 for e in fleet_view["recent"])
        status, series = http("GET", f"{url}/api/jobs/2/series")
        assert status == 200 and {p["attempt"] for p in series["points"]} == {1, 2}
        assert all(c["step"] % 5 == 0 or c["reason"] != "periodic" for c in series["checkpoints"])
        assert http("GET", f"{url}/api/jobs/99")[0] == 404
        assert http("GET", f"{url}/api/cost?period=2y")[0] == 422
        assert http("GET", f"{url}/api/jobs/2/diagnosis?min_duration=0.5&window=0.2") == (
            200,
            cli("diagnose", "2", "--min-duration", "0.5", "--window", "0.2", "--json"),
        )
        status, refused = http("GET", f"{url}/api/jobs/1/diagnosis")
        assert status == 409 and "job 1 has no GPU series" in refused["detail"]
        status, trace = http("GET", f"{url}/api/jobs/2/trace")
        assert status == 200 and trace["spans"][0]["name"].startswith("job 2")


def test_a_period_keeps_the_jobs_that_ran_in_it(fleet: Path) -> None:
    with served(create_app(ServeConfig(home=fleet, token=TOKEN, sync_remote=False))) as url:
        assert len(http("GET", f"{url}/api/cost?period=24h")[1]["jobs"]) == 2
    import sqlite3

    db = sqlite3.connect(fleet / "state.db")  # move job 1's attempt back 40 days
    db.execute("UPDATE attempts SET started_at = started_at - 3456000, ended_at = ended_at - 3456000 WHERE job_id = 1")
    db.commit()
    db.close()
    with served(create_app(ServeConfig(home=fleet, token=TOKEN, sync_remote=False))) as url:
        assert [j["id"] for j in http("GET", f"{url}/api/cost?period=30d")[1]["jobs"]] == [2]
        assert [j["id"] for j in http("GET", f"{url}/api/cost?period=all")[1]["jobs"]] == [1, 2]


def test_actions_need_the_token_and_the_same_origin(local_daemon: LocalBackend, home: Path) -> None:
    backend = local_daemon
    # Each job takes the scheduler's one GPU slot (a job without GPUs takes none and would start at
    # once). All three have priority 5: the scheduler never preempts a job for one of equal priority,
    # so the job held below stays queued until it is held, however late the hold request arrives.
    gpu = {"resources": {"gpus": 1, "gpu_type": "H100", "cpus": 1}}
    job = backend.submit(toy("slow", "vision", steps=100_000, pace=0.01, **gpu).copy_with(priority=5))
    follow(backend, lambda: (latest_step(backend.store, job) or 0) >= 2)
    with served(create_app(ServeConfig(home=home, token=TOKEN, sync_remote=False))) as url:
        preempt = f"{url}/api/jobs/{job}/preempt"
        assert http("POST", preempt)[0] == 401
        assert http("POST", preempt, headers={"Authorization": "Bearer " + "x" * 40})[0] == 401
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert http("POST", preempt, headers={**bearer, "Origin": "http://evil.example"})[0] == 403
        assert http("POST", preempt, headers={**bearer, "Sec-Fetch-Site": "cross-site"})[0] == 403
        assert backend.store.job(job).state == "running"
        host = url.split("://", 1)[1]
        status, reply = http("POST", preempt, headers={**bearer, "Origin": f"http://{host}"})
        assert (status, reply) == (200, {"id": job, "requested": "preempt", "grace": None})
        follow(backend, lambda: len(backend.store.attempts(job)) == 2)
        assert backend.store.attempts(job)[0].outcome == "preempted"
        follow(backend, lambda: backend.store.job(job).state == "running")
        assert http("POST", f"{url}/api/jobs/{job}/hold", headers=bearer)[0] == 409  # refused while it runs
        held = backend.submit(toy("held", "vision", steps=100_000, pace=0.01, **gpu).copy_with(priority=5))
        after = backend.submit(toy("after", "vision", steps=100_000, pace=0.01, **gpu).copy_with(priority=5))
        assert http("POST", f"{url}/api/jobs/{held}/hold")[0] == 401
        assert http("POST", f"{url}/api/jobs/{held}/hold", headers=bearer) == (200, {"id": held, "requested": "hold"})
        status, reply = http("POST", f"{url}/api/jobs/{job}/cancel", headers=bearer)
        assert status == 200
        follow(backend, lambda: backend.store.job(job).state == "cancelled")
        follow(backend, lambda: backend.store.job(after).state == "running")  # the held one, first in line, waits
        assert backend.store.job(held).state == "queued" and "held" in (backend.store.job(held).reason or "")
        assert http("POST", f"{url}/api/jobs/{held}/release", headers=bearer)[0] == 200
        assert http("POST", f"{url}/api/jobs/{held}/release", headers=bearer)[0] == 409  # not held any more
        assert backend.store.job(held).state == "queued"  # released, but the slot is taken
        backend.cancel(after)  # frees the slot: the released job starts
        follow(backend, lambda: backend.store.job(held).state == "running")
        assert http("POST", f"{url}/api/jobs/{job}/cancel", headers=bearer)[0] == 409  # already over: refused
    with served(create_app(ServeConfig(home=home, token=None, sync_remote=False))) as url:
        status, reply = http("POST", f"{url}/api/jobs/{job}/preempt", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 403 and "without a token" in reply["detail"]


def test_the_token_file_is_made_private_and_a_readable_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "serve.token"
    token = load_token(path)
    assert len(token) >= 24 and os.stat(path).st_mode & 0o777 == 0o600
    assert load_token(path) == token
    path.chmod(0o644)
    with pytest.raises(UsageError, match="chmod 600"):
        load_token(path)
    path.chmod(0o600)
    path.write_text("short\n")
    with pytest.raises(UsageError, match="at least 24"):
        load_token(path)


def test_serve_refuses_a_readable_token_file_with_one_line(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "open.token"
    path.write_text("x" * 40 + "\n")
    path.chmod(0o644)
    code, out, err = run_cli(capsys, monkeypatch, "serve", "--token-file", str(path), "--port", "0")
    assert code == 2 and "chmod 600" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "x" * 40 not in out + err


def operations(document: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """Each operation's path, method, summary and parameter names: what a reader of the file relies on
    (the JSON Schema details around them are FastAPI's and pydantic's to word)."""
    return {
        (path, method): (op.get("summary"), sorted(p["name"] for p in op.get("parameters", [])))
        for path, item in document["paths"].items()
        for method, op in item.items()
    }


def test_the_committed_openapi_file_is_the_codes() -> None:
    committed = json.loads((REPO / "docs" / "openapi.json").read_text())
    assert operations(committed) == operations(openapi_document()), (
        "docs/openapi.json is stale: run `gpufleet serve --openapi docs/openapi.json`"
    )
    paths = committed["paths"]
    for path in ("/api/jobs", "/api/jobs/{job_id}", "/api/cost", "/api/fleet", "/api/quality", "/hooks/alerts"):
        assert path in paths, path
    assert "post" in paths["/api/jobs/{job_id}/preempt"] and "post" in paths["/api/jobs/{job_id}/cancel"]


def test_ids_out_of_range_are_refused_not_a_server_error(home: Path) -> None:
    with served(create_app(ServeConfig(home=home, token=TOKEN, sync_remote=False))) as url:
        for path in ("/api/jobs/99999999999999999999", "/api/jobs/0", "/api/jobs/-3/series"):
            assert http("GET", url + path)[0] == 422, path
        for path in ("/jobs/1e3", "/jobs/99999999999999999999"):  # a page: it says there is no such job
            status, page = http("GET", url + path)
            assert status == 404 and "no job" in page, path
        assert http("GET", f"{url}/api/jobs/1/logs?attempt=99999999999999999999")[0] == 422
        assert http("GET", f"{url}/api/jobs/7")[0] == 404  # a home without jobs
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert http("POST", f"{url}/api/jobs/99999999999999999999/cancel", headers=bearer)[0] == 422
        json_bearer = {**bearer, "Content-Type": "application/json"}
        assert http("POST", f"{url}/api/registry/..%2F..%2Fetc/rollback", b'{"reason": "x"}', json_bearer)[0] == 404
        status, reply = http("POST", f"{url}/api/registry/churn/rollback", b'{"reason": "x"}', json_bearer)
        assert status == 404 and "has no registry" in reply["detail"]
    assert not home.exists() or not (home / "mlflow.db").exists()  # a refused action made no registry
