"""Hostile inputs (fourth batch): sweep files, seeds and the fleet report; one stderr line, exit 2, nothing written."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_cli

from gpufleet.errors import ParameterError, SpecError
from gpufleet.sweeps.spec import MAX_STEP_VALUES, MAX_TRIALS, SweepSpec

ROOT = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = {
    "name": "toy",
    "entrypoint": "gpufleet.workloads.toy:train",
    "args": {"steps": 2, "step_seconds": 0},
    "resources": {"gpu_type": "cpu", "gpus": 0, "cpus": 1},
}
SWEEP: dict[str, Any] = {
    "name": "s",
    "base": BASE,
    "space": {"x": {"low": 0.0, "high": 1.0}},
    "objective": {"metric": "loss"},
    "budget": {"trials": 2},
    "sampler": {"kind": "random"},
}


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error:") and "Traceback" not in err, err
    return lines[0]


def _sweep_file(tmp_path: Path, **change: Any) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, **change}), encoding="utf-8")
    return path


# 1
def test_a_grid_over_the_trial_ceiling_is_refused_before_anything_is_built(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the grid sampler was built")

    monkeypatch.setattr("optuna.samplers.GridSampler", never)
    space = {name: {"grid": list(range(10_000))} for name in ("a", "b", "c")}
    path = _sweep_file(tmp_path, space=space, sampler={"kind": "grid"})
    code, _, err = run_cli(capsys, monkeypatch, "sweep", "run", str(path))
    assert code == 2
    assert f"grid of 10000 x 10000 x 10000 = 1e+12 trials exceeds the ceiling of {MAX_TRIALS:,}" in _one_error(err)
    assert not home.exists()  # no state.db, no study, no sweep folder


def test_the_grid_ceiling_is_the_trial_ceiling() -> None:
    def grid(*lengths: int) -> dict[str, Any]:
        space = {f"p{i}": {"grid": list(range(n))} for i, n in enumerate(lengths)}
        return {**SWEEP, "space": space, "sampler": {"kind": "grid"}}

    assert SweepSpec.model_validate(grid(100, 1000)).grid_size == MAX_TRIALS
    with pytest.raises(ValueError, match="grid of 100 x 1001 = 1e\\+05 trials exceeds"):
        SweepSpec.model_validate(grid(100, 1001))
    with pytest.raises(ValueError, match=r"x \.\.\. \(64 parameters\)"):
        SweepSpec.model_validate(grid(*[2] * 64))


# 2
@pytest.mark.parametrize(
    ("param", "message"),
    [
        ({"low": -1e308, "high": 1e308}, "float range low -1e+308 is out of range: give -1e+150 to 1e+150"),
        ({"low": -1e308, "high": 1e308, "type": "int"}, "int range low -1e+308 is out of range"),
        ({"low": 0, "high": 2**63 - 1, "type": "int"}, "int range high 9.22337e+18 is out of range"),
        ({"low": 0.0, "high": 1.0, "step": 1e-300}, "step 1e-300 leaves 1e+300 values between 0 and 1"),
        ({"low": -1e150, "high": 1e150, "step": 5e-324}, "leaves more than 1e308 values"),
        ({"low": 0, "high": 4, "step": 0.5, "type": "int"}, "an int range needs a whole step of at least 1"),
        ({"low": 1.0, "high": 4.0, "step": 0.5, "log": True}, "a log range takes no step"),
    ],
)
def test_ranges_the_samplers_cannot_draw_from_are_refused_at_validation(
    param: dict[str, Any],
    message: str,
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "sweep", "run", str(_sweep_file(tmp_path, space={"x": param})))
    assert code == 2
    line = _one_error(err)
    assert "space.x" in line and message in line
    assert not home.exists()  # no state.db, no study with a trial left running


def test_ranges_within_the_bounds_validate() -> None:
    for param in (
        {"low": -1e150, "high": 1e150},
        {"low": -(2**53), "high": 2**53, "type": "int"},
        {"low": 0.0, "high": float(MAX_STEP_VALUES - 1), "step": 1.0},
        {"low": 1e-300, "high": 1e150, "log": True},
    ):
        SweepSpec.model_validate({**SWEEP, "space": {"x": param}})


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ("bogus://x", "Can't load plugin"),
        ("not a url", "Could not parse"),
        ("sqlite:///{tmp}/missing/study.db", "no folder"),
        ("sqlite:////proc/self/study.db", "unable to open"),  # a folder that takes no file
    ],
)
def test_a_storage_that_cannot_work_is_refused_before_the_home_is_touched(
    storage: str,
    message: str,
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = _sweep_file(tmp_path, storage=storage.format(tmp=tmp_path))
    code, _, err = run_cli(capsys, monkeypatch, "sweep", "run", str(path))
    assert code == 2
    line = _one_error(err)
    assert "sweep storage" in line and message in line and "give an SQLAlchemy URL" in line
    assert not home.exists()
    assert not (tmp_path / "missing").exists()


def test_a_readable_storage_still_runs(home: Path, tmp_path: Path) -> None:
    from gpufleet.sweeps.driver import check_storage

    check_storage(f"sqlite:///{tmp_path / 'study.db'}")
    check_storage("sqlite://")  # in memory
    assert not (tmp_path / "study.db").exists()  # looked at, not created


# 3
@pytest.mark.parametrize(
    ("seeds", "shown"),
    [
        ("18446744073709551616,1", "seed 18446744073709551616 is out of range"),
        ("0,4294967296", "seed 4294967296 is out of range"),
        ("9" * 5000 + ",1", "seed 99999999999999999999... (5000 digits) is out of range"),
    ],
)
def test_determinism_seeds_beyond_what_every_generator_takes(
    seeds: str, shown: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = str(ROOT / "examples" / "toy.yaml")
    code, _, err = run_cli(capsys, monkeypatch, "debug", "determinism", spec, "--steps", "2", "--seeds", seeds)
    assert code == 2
    line = _one_error(err)
    assert shown in line and "0 to 2**32-1" in line


def test_determinism_refuses_a_spec_seed_beyond_the_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({**BASE, "args": {**BASE["args"], "seed": 2**64}}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, monkeypatch, "debug", "determinism", str(spec), "--steps", "2")
    assert code == 2
    assert "args.seed 18446744073709551616 of the spec is out of range" in _one_error(err)


@pytest.mark.parametrize("pace", [-1, 1e9])  # NaN is refused by the spec itself
def test_determinism_refuses_a_toy_step_time_it_cannot_sleep(
    pace: float, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({**BASE, "args": {**BASE["args"], "step_seconds": pace}}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, monkeypatch, "debug", "determinism", str(spec), "--steps", "2")
    assert code == 2
    assert "step_seconds=" in _one_error(err) and "give seconds from 0 to 3600" in err


def test_seed_bounds_of_the_library_and_the_workloads() -> None:
    from gpufleet.cli.debug import _seeds
    from gpufleet.devtools.debug import check_determinism
    from gpufleet.spec import parse_spec
    from gpufleet.workloads import MAX_SEED, check_seed
    from gpufleet.workloads.toy import train

    assert MAX_SEED == 2**32 - 1
    assert _seeds("0, 4294967295", {}) == (0, MAX_SEED)
    assert _seeds(None, {"seed": MAX_SEED}) == (MAX_SEED, MAX_SEED - 1)
    assert check_seed(MAX_SEED) == MAX_SEED
    with pytest.raises(ParameterError, match=r"seed=18446744073709551616 is out of range"):
        train(steps=1, seed=2**64)  # refused before torch sees it
    with pytest.raises(ParameterError, match=r"seeds 1,4294967296: seed 4294967296 is out of range"):
        check_determinism(parse_spec(BASE, source="test"), steps=1, seeds=(1, 2**32))


# 4
def test_the_fleet_report_of_a_home_without_a_store_creates_none(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli(capsys, monkeypatch, "observe", "report", "--json")
    assert code == 0, err
    assert json.loads(out)["jobs_by_state"] == {}
    assert not home.exists()
    home.mkdir()
    (home / "state.db").touch()  # never initialised: no store either
    code, _, err = run_cli(capsys, monkeypatch, "observe", "report")
    assert code == 0, err
    assert (home / "state.db").stat().st_size == 0
    assert sorted(p.name for p in home.iterdir()) == ["state.db"]


def test_the_fleet_report_reads_an_attempt_without_a_start_and_writes_nothing(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row a hand edit or an older schema left (``started_at`` NULL) reads as a harmless value."""
    from gpufleet.jobs.store import Store
    from gpufleet.paths import state_db
    from gpufleet.spec import load_spec

    store = Store(state_db(home))
    job_id = store.add_job(load_spec(ROOT / "examples" / "toy.yaml"), "local")
    store.add_attempt(job_id, 1, 4242, 1_700_000_000.0)
    store.close()
    db = sqlite3.connect(state_db(home), isolation_level=None)
    try:
        (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name='attempts'").fetchone()
        db.execute("PRAGMA writable_schema=ON")
        db.execute(
            "UPDATE sqlite_master SET sql=? WHERE name='attempts'",
            (sql.replace("started_at REAL NOT NULL", "started_at REAL"),),
        )
        db.execute("PRAGMA writable_schema=OFF")
    finally:
        db.close()
    db = sqlite3.connect(state_db(home), isolation_level=None)
    try:
        db.execute(
            "UPDATE attempts SET started_at=NULL, state='ended', ended_at=?, outcome='completed'", (1_700_000_060.0,)
        )
        db.execute("UPDATE jobs SET state='completed'")
    finally:
        db.close()
    before = hashlib.sha256(state_db(home).read_bytes()).hexdigest()
    code, out, err = run_cli(capsys, monkeypatch, "observe", "report", "--json")
    assert code == 0, err
    assert json.loads(out)["jobs_by_state"] == {"completed": 1}
    assert hashlib.sha256(state_db(home).read_bytes()).hexdigest() == before


def test_sweep_spec_errors_stay_spec_errors(tmp_path: Path) -> None:
    from gpufleet.sweeps.spec import load_sweep

    with pytest.raises(SpecError):
        load_sweep(_sweep_file(tmp_path, space={"x": {"low": 0.0, "high": 1e300}}))
