"""``gpufleet advise JOB``: the checkpoint interval from what a job measured (placement/advisor.py, cli/advise.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import attempt_events, drive, run_cli

from gpufleet.cli.advise import advise_command
from gpufleet.estimate.goodput import daly_interval
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Attempt, Outcome, Store, latest_step
from gpufleet.paths import state_db
from gpufleet.placement.advisor import PreemptionRate, advise_job, lost_share
from gpufleet.spec import parse_spec

SPEC = parse_spec({"name": "lm", "team": "nlp", "entrypoint": "gpufleet.workloads.toy:train"})


def synthetic(store: Store, outcomes: tuple[str, ...], spec: Any = SPEC) -> int:
    """A job whose attempts ended with ``outcomes``, written through the Store API as a backend would."""
    job_id = store.add_job(spec, "local")
    events: list[dict[str, Any]] = []
    for n, outcome in enumerate(outcomes, start=1):
        start = 1000.0 * n
        end = start + (91.0 if outcome == "completed" else 63.0)
        store.upsert_attempt(Attempt(job_id, n, "ended", None, start, end, 0, Outcome(outcome), None, None))
        events += attempt_events(n, start, outcome)
    store.add_runtime_events(job_id, events, offset=1)
    return job_id


def daly_loss(tau: float, save: float, restart: float, mtbf: float) -> float:
    """Daly (2006), written out: the share of ``M e^(R/M) (e^((τ+δ)/M) - 1) / τ`` that is not work."""
    return 1 - tau / (mtbf * math.exp(restart / mtbf) * (math.exp((tau + save) / mtbf) - 1))


def test_the_advice_is_the_formulas_of_the_measured_numbers(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    job_id = synthetic(store, ("preempted", "preempted", "completed"))
    a = advise_job(store, job_id)
    m = a.measured
    # five saves: two 0.4 + 0.7 attempts and the last one's 0.4
    assert m.saves == 5 and m.save_seconds == pytest.approx(2.6 / 5)
    assert m.restores == 2 and m.restore_seconds == pytest.approx(0.5)  # the two restarts
    assert m.startups == 2 and m.startup_seconds == pytest.approx(7.5) and m.startup_of_restarts
    # training seconds (wall - start-up - restore - saves) per step run: 50.93 + 50.93 + 82.6 over 100
    assert m.steps == 100 and m.step_seconds == pytest.approx(184.46 / 100)
    assert m.preemptions == 2 and m.run_hours == pytest.approx(217 / 3600)
    rate, save, restart = 2 / (217 / 3600), 2.6 / 5, 7.5 + 0.5
    mtbf = 3600 / rate  # 108.5 s
    assert a.rate.per_hour == pytest.approx(rate) and a.rate.source == "observed"
    assert a.restart_seconds == pytest.approx(restart) and a.notes == ()

    young = math.sqrt(2 * save * mtbf)
    x = save / (2 * mtbf)
    daly = young * (1 + math.sqrt(x) / 3 + x / 9) - save
    step = 184.46 / 100
    assert a.young is not None and a.daly is not None and a.current is not None
    assert a.young.seconds == pytest.approx(young) and a.young.steps == round(young / step)
    assert a.daly.seconds == pytest.approx(daly) and a.daly.steps == max(1, round(daly / step))
    assert a.current.seconds == pytest.approx(50 * step) and a.current.steps == 50  # every_steps 50 by default
    assert "every_steps 50" in a.current_source
    for interval in (a.current, a.young, a.daly):
        assert interval.lost_share == pytest.approx(daly_loss(interval.seconds, save, restart, mtbf))
    # Daly's interval is (near) the closed form's optimum, and beats today's and Young's
    best = min(daly_loss(t / 10, save, restart, mtbf) for t in range(10, 1000))
    shares = [i.lost_share or 0.0 for i in (a.daly, a.young, a.current)]
    assert shares[0] == pytest.approx(best, abs=1e-4)
    assert 0 < shares[0] < shares[1] < shares[2]

    out = a.to_dict()
    assert json.loads(json.dumps(out)) == out  # plain JSON
    assert out["recommended"] == "daly" and out["mtbf_seconds"] == pytest.approx(mtbf)


def test_no_preemption_yet_reports_zero_and_uses_a_prior_only_when_given(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    job_id = synthetic(store, ("completed",))
    a = advise_job(store, job_id)
    assert a.rate == PreemptionRate(0.0, "observed") and a.young is None and a.daly is None
    assert any("no preemptions measured: no interval to recommend" in n for n in a.notes)
    assert any("save time stands in for the restore" in n for n in a.notes)
    assert any("first attempt" in n for n in a.notes)
    assert a.current is not None and a.current.lost_share == pytest.approx(0.4 / (a.current.seconds + 0.4))

    prior = advise_job(store, job_id, prior=PreemptionRate(0.5, "catalogue rate of aws/x/H100"))
    assert prior.rate.per_hour == 0.5 and prior.daly is not None
    assert prior.daly.seconds == pytest.approx(daly_interval(0.4, 7200.0))
    assert any("no preemption observed" in n and "catalogue" in n for n in prior.notes)
    # the restore stands in as the save (0.4 s), the start-up is the first attempt's (8 s)
    assert prior.restart_seconds == pytest.approx(8.0 + 0.4)


def test_a_given_rate_replaces_the_observed_one(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    job_id = synthetic(store, ("preempted", "completed"))
    given = advise_job(store, job_id, rate=PreemptionRate(1.0, "--preemptions-per-hour"), prior=PreemptionRate(9, "x"))
    assert given.rate.per_hour == 1.0 and given.daly is not None
    assert given.daly.seconds == pytest.approx(daly_interval(given.measured.save_seconds or 0, 3600.0))
    assert any("not the" in n and "observed" in n for n in given.notes)


def test_missing_measurements_are_named_and_the_spec_stands_in(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    bare = store.add_job(SPEC, "local")
    a = advise_job(store, bare, rate=PreemptionRate(2.0, "given"))
    assert a.measured.saves == 0 and a.save_seconds is None and a.daly is None and a.current is None
    assert any("no checkpoint save measured: no interval to recommend" in n for n in a.notes)
    assert any("no step time" in n for n in a.notes)
    spec = SPEC.copy_with(placement={"save_seconds": 30.0}, checkpoint={"every_seconds": 600.0})
    planned = advise_job(store, store.add_job(spec, "local"), rate=PreemptionRate(2.0, "given"))
    assert planned.save_seconds == 30.0 and planned.daly is not None
    assert planned.daly.seconds == pytest.approx(daly_interval(30.0, 1800.0)) and planned.daly.steps is None
    assert planned.current is not None and planned.current.seconds == 600.0
    assert any("placement.save_seconds" in n for n in planned.notes)


def test_lost_share_edges() -> None:
    assert lost_share(100.0, 10.0, 5.0, 0.0) == pytest.approx(10 / 110)
    assert lost_share(100.0, 10.0, 1e6, 3600.0) == 1.0  # e^(R/M) overflows: never finishes
    assert 0 < lost_share(100.0, 10.0, 5.0, 1.0) < 1


# ---- the command ---------------------------------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``advise`` on the app (until cli/app.py registers it itself)."""
    from typer.models import CommandInfo

    from gpufleet.cli import app as app_module

    if not any(c.name == "advise" for c in app_module.app.registered_commands):
        commands = [*app_module.app.registered_commands, CommandInfo(name="advise", callback=advise_command)]
        monkeypatch.setattr(app_module.app, "registered_commands", commands)
    yield


def test_unknown_job_and_bad_rates_exit_2_in_one_line(
    cli: None, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli(capsys, monkeypatch, "advise", "7")
    assert code == 2 and out == "" and err.count("\n") == 1 and "no job 7" in err, err
    assert not state_db(home).exists() and not home.exists()  # asking creates nothing
    job_id = synthetic(Store(state_db(home)), ("preempted", "completed"))
    code, out, err = run_cli(capsys, monkeypatch, "advise", str(job_id + 1))
    assert code == 2 and f"no job {job_id + 1}" in err and err.count("\n") == 1
    for bad in ("nan", "inf", "-1", "1e9", "fast"):
        code, out, err = run_cli(capsys, monkeypatch, "advise", str(job_id), "--preemptions-per-hour", bad)
        assert code == 2 and out == "" and err.count("\n") == 1 and "--preemptions-per-hour" in err, (bad, err)


def test_the_command_prints_and_emits_the_advice(
    cli: None, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(state_db(home))
    job_id = synthetic(store, ("preempted", "preempted", "completed"))
    code, out, err = run_cli(capsys, monkeypatch, "advise", str(job_id), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data == json.loads(json.dumps(advise_job(store, job_id).to_dict()))
    assert data["measured"]["preemptions"] == 2 and data["rate_source"] == "observed"
    code, out, err = run_cli(capsys, monkeypatch, "advise", str(job_id))
    assert code == 0, err
    for text in ("save", "restore", "start-up", "preempted   2 times", "Young", "Daly (recommended)", "every: auto"):
        assert text in out, (text, out)
    code, out, _ = run_cli(capsys, monkeypatch, "advise", str(job_id), "--preemptions-per-hour", "0", "--json")
    assert code == 0 and json.loads(out)["daly"] is None


# ---- a real job ----------------------------------------------------------------------------------------------


def test_a_real_job_preempted_twice_then_advised(
    cli: None, local: Any, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The toy job under the in-process local scheduler, with ``every: auto``, preempted at two steps."""
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    backend, scheduler = local
    spec = parse_spec(
        {
            "name": "toy",
            "team": "t",
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": 120, "step_seconds": 0.01},
            "checkpoint": {"every": "auto", "preemptions_per_hour": 3600, "grace_seconds": 20},
        }
    )
    job_id = backend.submit(spec)
    for n, target in ((1, 30), (2, 70)):

        def reached(n: int = n, target: int = target) -> bool:
            return len(backend.store.attempts(job_id)) == n and (latest_step(backend.store, job_id) or 0) >= target

        drive(scheduler, reached)
        backend.preempt(job_id)
    drive(scheduler, lambda: backend.store.job(job_id).state in ("completed", "failed"))
    assert backend.store.job(job_id).state == "completed", backend.store.job(job_id).reason

    code, out, err = run_cli(capsys, monkeypatch, "advise", str(job_id), "--json")
    assert code == 0, err
    data = json.loads(out)
    measured = data["measured"]
    attempts = backend.store.attempts(job_id)
    saves = backend.store.events(job_id, [EventKind.CHECKPOINT])
    assert measured["preemptions"] == 2 and measured["restores"] == 2 and measured["startup_of_restarts"]
    assert measured["saves"] == len(saves) > 3  # every: auto saved between the preemptions
    assert measured["save_seconds"] == pytest.approx(sum(e.data["seconds"] for e in saves) / len(saves))
    hours = sum((a.ended_at or 0) - a.started_at for a in attempts) / 3600
    assert measured["run_hours"] == pytest.approx(hours)
    assert data["preemptions_per_hour"] == pytest.approx(2 / hours) and data["rate_source"] == "observed"
    mtbf = 3600 / data["preemptions_per_hour"]
    assert data["daly"]["seconds"] == pytest.approx(daly_interval(measured["save_seconds"], mtbf))
    last = backend.store.last_event(job_id, EventKind.CHECKPOINT_INTERVAL)
    assert last is not None and data["current"]["seconds"] == pytest.approx(last.data["seconds"])
    assert data["current"]["source"] == "every: auto, as last logged"
    assert 0 < data["daly"]["lost_share"] <= data["current"]["lost_share"] < 1


FLEET = """\
as_of: 2026-12-01
currency: USD
gpu_types:
  H100: {memory_gib: 80, throughput: {training: 1.0}}
offers:
  - {provider: aws, region: us-east-1, gpu_type: H100, gpus_per_node: 1, on_demand_per_gpu_hour: 6.88,
     spot_per_gpu_hour: 2.60, capacity_gpus: 2, spot_preemptions_per_hour: 0.10}
pools:
  - offer: aws/us-east-1/H100
"""
"""One spot pool preempted 0.1 times an hour, as its catalogue says."""


def test_the_catalogue_rate_of_the_pool_is_the_prior_until_a_preemption(
    cli: None, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufleet.backends.pools import fleet_file

    store = Store(state_db(home))
    calm = synthetic(store, ("completed",))
    fleet_file(home).parent.mkdir(parents=True, exist_ok=True)
    fleet_file(home).write_text(FLEET)
    store.add_event(calm, EventKind.PLACED, offer="aws/us-east-1/H100", spot=True)
    code, out, err = run_cli(capsys, monkeypatch, "advise", str(calm), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["preemptions_per_hour"], data["rate_source"]) == (0.1, "catalogue rate of aws/us-east-1/H100")
    assert data["daly"]["seconds"] == pytest.approx(daly_interval(0.4, 36_000.0))
    on_demand = synthetic(store, ("completed",))
    store.add_event(on_demand, EventKind.PLACED, offer="aws/us-east-1/H100", spot=False)
    code, out, _ = run_cli(capsys, monkeypatch, "advise", str(on_demand), "--json")
    assert code == 0 and json.loads(out)["rate_source"] == "observed"  # on demand: no spot rate
