"""Sweep files refused with the field named; the driver's bookkeeping against a real study and store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from conftest import run_cli

from gpufleet.errors import SpecError, UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store
from gpufleet.spec import parse_spec
from gpufleet.sweeps.driver import JOB_ID, SweepDriver, open_study
from gpufleet.sweeps.spec import SweepSpec, load_sweep
from gpufleet.workloads.tinylm import TINY

BASE: dict[str, Any] = {
    "name": "lm",
    "entrypoint": "gpufleet.workloads.tinylm:train",
    "args": {**TINY, "steps": 6},
    "resources": {"gpus": 0, "cpus": 1},
}
SWEEP: dict[str, Any] = {
    "name": "s",
    "base": BASE,
    "space": {"lr": {"grid": [0.001, 0.002]}, "embed": {"grid": [16, 32]}},
    "objective": {"metric": "val_loss"},
    "budget": {"trials": 10},
    "sampler": {"kind": "grid"},
}


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"space": {}}, "space: Dictionary should have at least 1 item"),
        ({"space": {"lr": {"grid": 0.1}}}, "space.lr.grid: Input should be a valid list"),
        ({"budget": {"trials": 0}}, "budget.trials: Input should be greater than or equal to 1"),
        ({"pruner": {"kind": "hyperband"}}, "pruner.kind: Input should be 'none', 'median' or 'asha'"),
        ({"space": {"lr": {"low": 0.1, "high": 0.01}}}, "low 0.1 is not below high 0.01"),
        ({"space": {"lr": {"low": 0.0, "high": 1.0, "log": True}}}, "a log range needs low > 0"),
        ({"space": {"lr": {"low": 0.0, "high": 1.0}}}, "parameter 'lr' is not a grid"),
        ({"space": {"lr": {"grid": [1], "low": 1, "high": 2}}}, "give exactly one of"),
        ({"name": "../x"}, "is not a valid name"),
        ({"space": {"not-an-arg": {"grid": [1]}}}, "is not a Python identifier"),
        ({"base": {**BASE, "entrypoint": ["python", "train.py"]}}, "is not module:function"),
        ({"objective": {"metric": "val loss"}}, "objective.metric"),
    ],
)
def test_bad_sweep_files_exit_2_naming_the_field(
    tmp_path: Path,
    home: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    change: dict[str, Any],
    message: str,
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "sweep", "run", str(write(tmp_path, {**SWEEP, **change})))
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (home / "sweeps").exists() and not (home / "state.db").exists()  # nothing half-recorded


def test_a_grid_sweep_asks_each_point_once(tmp_path: Path) -> None:
    sweep, _ = load_sweep(write(tmp_path, SWEEP))
    assert sweep.grid_size == 4


def test_a_study_of_the_same_name_with_another_space_is_refused(home: Path) -> None:
    sweep = SweepSpec.model_validate(SWEEP)
    base = parse_spec(BASE)
    open_study(home, sweep, base)
    other = SweepSpec.model_validate({**SWEEP, "space": {"lr": {"grid": [0.5]}}})
    with pytest.raises(UsageError, match="exists with another space or objective"):
        open_study(home, other, base)
    open_study(home, SweepSpec.model_validate({**SWEEP, "budget": {"trials": 3}}), base)  # a new budget is fine


def test_values_logged_again_by_a_resumed_attempt_are_reported_once(home: Path) -> None:
    sweep = SweepSpec.model_validate({**SWEEP, "pruner": {"kind": "median"}})
    driver = SweepDriver(home, sweep, parse_spec(BASE))
    store: Store = driver.store
    trial = driver.study.ask()
    job = store.add_job(parse_spec(BASE), "local")
    trial.set_user_attr(JOB_ID, job)
    for attempt, step, value in ((1, 5, 4.0), (1, 10, 3.5), (2, 10, 3.5), (2, 15, 3.2)):  # 2 redoes 6..10
        store.add_event(job, EventKind.EVAL, attempt=attempt, step=step, val_loss=value)
    driver.follow()
    driver.follow()
    (frozen,) = driver.trials()
    assert frozen.intermediate_values == {5: 4.0, 10: 3.5, 15: 3.2}
    assert frozen.state == optuna.trial.TrialState.RUNNING


@pytest.mark.timeout(600)
def test_an_objective_the_trials_never_log_stops_the_sweep_after_max_failures(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = {**SWEEP, "objective": {"metric": "accuracy"}, "max_failures": 2, "parallelism": 1}
    code, out, err = run_cli(capsys, monkeypatch, "sweep", "run", str(write(tmp_path, data)), "--poll", "0.1", "--json")
    assert code == 1, err
    result = json.loads(out)
    assert result["stop"] == "2 trials failed (max_failures 2)" and result["failed"] == 2
    assert all("never logged 'accuracy'" in r["reason"] for r in result["rows"])


def test_show_and_best_name_a_missing_sweep(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "sweep", "show", "nope")
    assert code == 2 and "no sweep named 'nope'" in err
    code, _, err = run_cli(capsys, monkeypatch, "sweep", "best", "../etc", "--out", str(tmp_path / "b.yaml"))
    assert code == 2 and "invalid sweep" in err
    code, _, err = run_cli(capsys, monkeypatch, "sweep", "show", "nope", "--plot", str(tmp_path / "p.txt"))
    assert code == 2 and "--plot" in err


def test_spec_errors_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"budget\.trials"):
        load_sweep(write(tmp_path, {**SWEEP, "budget": {"trials": -1}}))


@pytest.mark.timeout(600)
def test_a_grid_sweep_runs_every_point_once_and_stops(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optuna's grid sampler stops the study when its last point is told; the driver ends there too."""
    data = {**SWEEP, "space": {"lr": {"grid": [0.001, 0.002]}}, "parallelism": 2}
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    code, out, err = run_cli(capsys, monkeypatch, "sweep", "run", str(write(tmp_path, data)), "--poll", "0.1", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["stop"] == "2 trials finished or pruned" and result["trials"] == 2
    assert sorted(r["params"]["lr"] for r in result["rows"]) == [0.001, 0.002]
