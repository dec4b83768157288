"""The fleet page's API: who preempted whom, each job's progress and parameters, GPUs in use, cost over
time per team, the sweeps, and the API's own docs page.

The home is written as the backends and the runtime write it (a store with jobs, attempts and their
events; a sweep's Optuna study where ``gpufleet sweep run`` keeps it), at known times, so every
figure is known; the server is the real app under uvicorn (``served``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import http, served

from gpufleet.cost.ledger import AttemptUsage
from gpufleet.cost.rates import load_rates
from gpufleet.errors import ParameterError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store
from gpufleet.paths import state_db
from gpufleet.serve.app import ServeConfig, create_app
from gpufleet.serve.timeline import cost_timeline
from gpufleet.spec import parse_spec

HOUR = 3600.0


def spec(name: str, team: str, **more: Any) -> Any:
    return parse_spec(
        {
            "name": name,
            "team": team,
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": 100, "lr": 0.00125},
            "resources": {"gpus": 1, "gpu_type": "H100", "cpus": 1},
            **more,
        }
    )


def run_steps(store: Store, job: int, attempt: int, start: float, steps: range, total: int = 100) -> None:
    """An attempt's runtime events: its session (``total`` steps), then one step a second from ``start``."""
    store.add_event(job, EventKind.ATTEMPT_START, attempt=attempt, ts=start, gpus=1, world_size=1)
    store.add_event(job, EventKind.SESSION_START, attempt=attempt, ts=start, total_steps=total)
    for i, step in enumerate(steps):
        store.add_event(
            job, EventKind.STEP, attempt=attempt, ts=start + 1 + i, step=step, loss=2.0 / step, tokens_per_s=1500.0
        )


def seed_fleet(home: Path, now: float) -> dict[str, int]:
    """Four jobs: ``victim`` (vision) preempted by ``urgent`` (nlp) an hour ago and running again at one step
    a second, at step 50 of 100; ``urgent`` completed; ``broken`` (nlp) failed; ``waiting`` (vision) queued."""
    store = Store(state_db(home))
    ids = {
        name: store.add_job(spec(name, team, priority=priority), "local")
        for name, team, priority in (
            ("victim", "vision", 0),
            ("urgent", "nlp", 10),
            ("broken", "nlp", 0),
            ("waiting", "vision", 0),
        )
    }
    victim, urgent, broken = ids["victim"], ids["urgent"], ids["broken"]
    t0 = now - HOUR
    store.begin_attempt(victim, 1, t0)
    run_steps(store, victim, 1, t0, range(1, 21))
    store.add_event(victim, EventKind.PREEMPTED_BY, attempt=1, ts=t0 + 30, job=urgent)
    store.end_attempt(
        victim, 1, ended_at=t0 + 31, exit_code=75, outcome="preempted", job_state="queued", reason=None, restarts=1
    )
    store.begin_attempt(urgent, 1, t0 + 31)
    run_steps(store, urgent, 1, t0 + 31, range(1, 101))
    store.end_attempt(
        urgent,
        1,
        ended_at=t0 + 140,
        exit_code=0,
        outcome="completed",
        job_state="completed",
        reason=None,
        restarts=None,
    )
    store.begin_attempt(broken, 1, t0 + 140)
    run_steps(store, broken, 1, t0 + 140, range(1, 6))
    store.end_attempt(
        broken,
        1,
        ended_at=t0 + 150,
        exit_code=1,
        outcome="failed",
        job_state="failed",
        reason="exit code 1",
        restarts=None,
    )
    store.begin_attempt(victim, 2, now - 40)
    run_steps(store, victim, 2, now - 40, range(21, 51))
    store.close()
    return ids


def seed_sweep(home: Path, name: str = "lr-sweep") -> None:
    """A finished sweep as ``gpufleet sweep run`` leaves it: three finished trials (the second best) and a
    pruned one, in the Optuna study under ``$GPUFLEET_HOME/sweeps/NAME``."""
    import optuna
    from optuna.distributions import BaseDistribution, FloatDistribution
    from optuna.trial import TrialState, create_trial

    from gpufleet.sweeps.driver import PRUNED_AT, sweep_dir

    folder = sweep_dir(home, name)
    folder.mkdir(parents=True)
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{folder / 'study.db'}", direction="minimize")
    study.set_user_attr("sweep", {"objective": {"metric": "val_loss"}, "space": {"lr": {"low": 1e-4, "high": 0.1}}})
    lr: dict[str, BaseDistribution] = {"lr": FloatDistribution(1e-4, 0.1, log=True)}
    for value, rate in ((3.2, 0.001), (2.9, 0.0123), (3.05, 0.05)):
        study.add_trial(create_trial(params={"lr": rate}, distributions=lr, value=value))
    study.add_trial(
        create_trial(
            params={"lr": 0.09},
            distributions=lr,
            state=TrialState.PRUNED,
            intermediate_values={10: 4.4},
            user_attrs={PRUNED_AT: 10},
        )
    )


@pytest.fixture
def url(home: Path) -> Any:
    with served(create_app(ServeConfig(home=home, token=None, sync_remote=False, cache_s=0))) as base:
        yield base


def test_a_preempted_by_event_names_the_preempted_job_and_the_preemptor_apart(home: Path, url: str) -> None:
    ids = seed_fleet(home, now=time.time())
    status, fleet = http("GET", f"{url}/api/fleet")
    assert status == 200
    [row] = [e for e in fleet["recent"] if e["kind"] == "preempted_by"]
    assert (row["job"], row["name"]) == (ids["victim"], "victim")
    assert (row["by"], row["by_name"]) == (ids["urgent"], "urgent")


def test_a_running_job_shows_its_progress_rate_eta_params_and_gpus(home: Path, url: str) -> None:
    ids = seed_fleet(home, now=time.time())
    fleet = http("GET", f"{url}/api/fleet")[1]
    jobs = {j["name"]: j for j in fleet["jobs"]}
    victim = jobs["victim"]
    assert victim["state"] == "running" and victim["step"] == 50 and victim["gpus_in_use"] == 1
    progress = victim["progress"]
    assert progress["total_steps"] == 100
    assert progress["steps_per_s"] == pytest.approx(1.0)  # the latest attempt's steps only, one a second
    assert progress["eta_s"] == pytest.approx(50.0)
    assert progress["elapsed_s"] >= HOUR  # from the first attempt's start
    assert progress["loss"] == pytest.approx(2.0 / 50) and progress["tokens_per_s"] == 1500.0
    assert victim["args"] == {"steps": 100, "lr": 0.00125}
    done = jobs["urgent"]
    assert done["gpus_in_use"] == 0 and done["progress"]["eta_s"] is None
    assert done["progress"]["elapsed_s"] == pytest.approx(109.0)
    assert jobs["waiting"]["progress"] == {k: None for k in progress}
    assert fleet["capacity"] == {"in_use": 1, "total": 1, "source": "local", "elsewhere": 0}
    assert fleet["teams"] == {"nlp": {"completed": 1, "failed": 1}, "vision": {"running": 1, "queued": 1}}
    assert ids["broken"] in [j["id"] for j in fleet["jobs"] if j["state"] == "failed"]


def test_cost_over_time_splits_each_teams_ledger_into_buckets_that_sum_to_it(home: Path, url: str) -> None:
    seed_fleet(home, now=time.time())
    cost = http("GET", f"{url}/api/cost")[1]
    for bucket in ("hour", "day", "auto"):
        status, timeline = http("GET", f"{url}/api/cost/timeline?bucket={bucket}")
        assert status == 200, timeline
        assert timeline["bucket"] == ("hour" if bucket == "auto" else bucket)  # an hour's span: by the hour
        assert set(timeline["teams"]) == {"nlp", "vision"}
        for team, points in timeline["teams"].items():
            assert [p["start"] % timeline["bucket_s"] for p in points] == [0.0] * len(points)
            # the running attempt's end is now, a moment later than the ledger's: 10 GPU-seconds of slack
            assert sum(p["gpu_hours"] for p in points) == pytest.approx(cost["teams"][team]["gpu_hours"], abs=10 / HOUR)
            assert sum(p["money"] for p in points) == pytest.approx(cost["teams"][team]["money"], rel=0.01)
        assert len({len(p) for p in timeline["teams"].values()}) == 1  # one bucket list for every team
    assert http("GET", f"{url}/api/cost/timeline?bucket=week")[0] == 422
    assert http("GET", f"{url}/api/cost/timeline?period=forever")[0] == 422
    assert http("GET", f"{url}/api/cost/timeline?team=nobody")[1]["teams"] == {}


def usage(team: str, start: float, end: float) -> AttemptUsage:
    return AttemptUsage(
        job_id=1,
        job_name="j",
        team=team,
        attempt=1,
        gpu_type="H100",
        provider="aws",
        spot=False,
        gpus=2,
        start=start,
        end=end,
        outcome="completed",
    )


def test_an_attempt_is_spread_over_the_buckets_it_ran_in_by_the_time_in_each() -> None:
    rates = load_rates()
    price = rates.price("H100", "aws", spot=False)
    assert price is not None
    out = cost_timeline([usage("a", 10 * HOUR + 1800, 12 * HOUR)], rates, "hour")
    hours = [(p["start"] / HOUR, p["gpu_hours"]) for p in out["teams"]["a"]]
    assert hours == [(10, pytest.approx(1.0)), (11, pytest.approx(2.0))]  # 2 GPUs: half an hour, then an hour
    assert out["teams"]["a"][1]["money"] == pytest.approx(2.0 * price)
    since = cost_timeline([usage("a", 10 * HOUR, 12 * HOUR)], rates, "hour", since=11 * HOUR)
    assert [p["start"] / HOUR for p in since["teams"]["a"]] == [11]
    assert cost_timeline([usage("a", 0, 3 * 86_400)], rates)["bucket"] == "day"
    with pytest.raises(ParameterError, match="bucket='hour' gives 2400 buckets"):
        cost_timeline([usage("a", 0, 100 * 86_400)], rates, "hour")
    assert not math.isnan(cost_timeline([usage("a", HOUR, HOUR)], rates)["teams"]["a"][0]["gpu_hours"])


def test_the_sweeps_api_lists_each_sweep_and_its_trials_with_the_best(home: Path, url: str) -> None:
    assert http("GET", f"{url}/api/sweeps") == (200, {"sweeps": []})
    seed_sweep(home)
    status, listed = http("GET", f"{url}/api/sweeps")
    assert status == 200
    [entry] = listed["sweeps"]
    assert entry["sweep"] == "lr-sweep" and "rows" not in entry
    assert (entry["trials"], entry["finished"], entry["pruned"]) == (4, 3, 1)
    status, sweep = http("GET", f"{url}/api/sweeps/lr-sweep")
    assert status == 200 and sweep["best"]["trial"] == 1 and sweep["best"]["value"] == 2.9
    assert sweep["params"] == ["lr"] and sweep["metric"] == "val_loss" and sweep["currency"]
    pruned = [r for r in sweep["rows"] if r["state"] == "pruned"]
    assert [(r["trial"], r["pruned_at"], r["last_value"]) for r in pruned] == [(3, 10, 4.4)]
    assert http("GET", f"{url}/api/sweeps/no-such")[0] == 404
    assert http("GET", f"{url}/api/sweeps/Bad%20Name")[0] == 400
    assert http("GET", f"{url}/api/sweeps/{'x' * 64}")[0] == 422


def test_the_api_docs_are_a_page_of_this_server_and_docs_leads_there(url: str) -> None:
    status, page = http("GET", f"{url}/api/docs")
    assert status == 200 and '<script src="/static/apidocs.js">' in page and "cdn" not in page.lower()
    status, script = http("GET", f"{url}/static/apidocs.js")
    assert status == 200 and "/api/openapi.json" in script
    status, _ = http("GET", f"{url}/docs")  # urllib follows the redirect
    assert status == 200
