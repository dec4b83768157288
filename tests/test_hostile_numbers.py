"""Hostile numbers on the command line and in YAML: out-of-range, infinite and NaN values are refused
with exit 2 and one line naming the value and its bound, nothing is written to $GPUFLEET_HOME, and
``--json`` output is always standard JSON (no NaN, no Infinity)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, run_cli

from gpufleet.cli.render import emit_json
from gpufleet.cost.fleet import parse_since
from gpufleet.errors import ParameterError, UsageError
from gpufleet.estimate import advise_layout, estimate_memory, mfu, tokens_per_second, usable_bytes
from gpufleet.estimate.flops import TransformerShape
from gpufleet.estimate.peak import gpu_peak
from gpufleet.placement.catalog import load_batch, load_catalog, parse_catalog
from gpufleet.placement.planner import plan
from gpufleet.placement.simulate import build_scenario, simulate
from gpufleet.placement.workload import WorkloadModel, jobs_from_specs
from gpufleet.telemetry.diagnose import DiagnosisConfig
from gpufleet.telemetry.synthetic import SyntheticJobConfig, generate_samples

CATALOG = REPO / "examples" / "catalog.yaml"
BATCH = REPO / "examples" / "batch.yaml"
HUGE_ID = "123456789012345678901234567890"
MFU = ["estimate", "mfu", "--params", "7B", "--layers", "32", "--heads", "32", "--head-dim", "128"]
MFU += ["--seq", "4096", "--gpu", "h100"]
LAYOUT = ["estimate", "layout", "--params", "7B", "--gpu", "h100"]


def strict_json(text: str) -> Any:
    """Parse ``text`` as standard JSON: NaN, Infinity and -Infinity are errors."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant} in output")

    return json.loads(text, parse_constant=refuse)


def refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, *argv: str, names: str
) -> str:
    """Run the CLI; assert exit 2, one line on stderr naming ``names``, no traceback, nothing in $GPUFLEET_HOME."""
    code, out, err = run_cli(capsys, monkeypatch, *argv)
    assert code == 2, (argv, code, out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and names in err, err
    assert out == ""
    assert not home.exists(), f"{argv} wrote {list(home.rglob('*'))}"
    return err


def yaml_file(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def example_catalog(**offer_fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(CATALOG.read_text(encoding="utf-8"))
    for row in data["offers"]:
        row.update(offer_fields)
    return data


# --- estimate ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["estimate", "layout", "--params", "1e400", "--gpus", "8", "--gpu", "h100"], "--params '1e400'"),
        (["estimate", "memory", "--params", "2e15", "--gpus", "8"], "1e15"),
        ([*LAYOUT, "--gpus", "8", "--reserve-gib", "inf"], "--reserve-gib inf"),
        ([*LAYOUT, "--gpus", "8", "--reserve-gib", "nan"], "--reserve-gib nan"),
        ([*LAYOUT, "--gpus", "8", "--reserve-gib", "1e308"], "--reserve-gib"),
        ([*LAYOUT, "--gpus", "1000000000000"], "--gpus 1000000000000"),
        ([*MFU, "--tokens-per-second", "inf"], "--tokens-per-second inf"),
        ([*MFU, "--tokens-per-second", "nan"], "--tokens-per-second"),
        ([*MFU, "--tokens-per-second", "1e300", "--json"], "1e15"),
        ([*MFU, "--step-time", "1e-300", "--tokens-per-step", "4M"], "--step-time"),
        ([*MFU, "--step-time", "inf", "--tokens-per-step", "4M"], "--step-time inf"),
        ([*MFU, "--layers", HUGE_ID, "--tokens-per-second", "1000"], "--layers"),
        (
            ["estimate", "memory", "--params", "7B", "--gpus", "8", "--largest-layer-params", "8B"],
            "--largest-layer-params",
        ),
    ],
)
def test_estimate_refuses_absurd_and_non_finite_values(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, argv: list[str], names: str
) -> None:
    refused(capsys, monkeypatch, home, *argv, names=names)


def test_estimate_cores_name_the_bound() -> None:
    h100 = gpu_peak("h100")
    with pytest.raises(ParameterError, match=r"reserve_gib=inf"):
        usable_bytes(h100, reserve_gib=math.inf)
    with pytest.raises(ParameterError, match=r"params=.* at most 1e15"):
        estimate_memory(10**400, 8)
    with pytest.raises(ParameterError, match=r"gpus=10000000 .* at most 1e6"):
        advise_layout(7 * 10**9, 10**7, h100)
    with pytest.raises(ParameterError, match=r"tokens_per_second=inf"):
        mfu(
            TransformerShape(params=10**9, layers=2, heads=2, head_dim=2, seq=2),
            tokens_per_second=math.inf,
            peak_flops_per_gpu=1e15,
            num_gpus=1,
        )
    for step_time in (math.nan, math.inf):
        with pytest.raises(ParameterError, match=r"step_time"):
            tokens_per_second(step_time=step_time, tokens_per_step=1000)
    assert usable_bytes(h100, reserve_gib=1.0) > 0, "ordinary values still work"


def test_mfu_json_is_standard(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    code, out, err = run_cli(capsys, monkeypatch, *MFU, "--tokens-per-second", "1e4", "--json")
    assert code == 0, err
    assert 0 < strict_json(out)["mfu"] < 1


def test_emit_json_turns_non_finite_floats_into_null(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    emit_json({"inf": math.inf, "nan": [math.nan, -math.inf, 1.5], "nested": {"t": (math.nan,)}, "ok": 2})
    got = strict_json(capsys.readouterr().out)
    assert got == {"inf": None, "nan": [None, None, 1.5], "nested": {"t": [None]}, "ok": 2}


# --- placement -----------------------------------------------------------------------------------


def test_place_refuses_absurd_work_and_preemption_rates(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path
) -> None:
    batch = yaml.safe_load(BATCH.read_text(encoding="utf-8"))
    for value, names in ((math.inf, "gpu_hours"), (1e300, "placement.gpu_hours 1e+300")):
        batch["jobs"][0]["placement"]["gpu_hours"] = value
        jobs = yaml_file(tmp_path / "batch.yaml", batch)
        refused(capsys, monkeypatch, home, "place", str(jobs), "--catalog", str(CATALOG), names=names)
    cat = yaml_file(tmp_path / "cat.yaml", example_catalog(spot_preemptions_per_hour=1e4))
    err = refused(
        capsys, monkeypatch, home, "place", str(BATCH), "--catalog", str(cat), names="spot_preemptions_per_hour 10000"
    )
    assert "from 0 to 60" in err, "the bound is named"


def test_planner_refuses_non_finite_work_that_skipped_validation() -> None:
    job = load_batch(BATCH)[0]
    bad = job.model_copy(update={"placement": job.placement.model_copy(update={"gpu_hours": math.inf})})
    with pytest.raises(UsageError, match=r"placement.gpu_hours inf"):
        plan([bad], load_catalog(CATALOG))


def test_an_overflowing_cost_is_a_reason_not_a_crash(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path
) -> None:
    data = example_catalog(on_demand_per_gpu_hour=1e308, spot_per_gpu_hour=1e308)
    data["quotas"] = []
    p = plan(load_batch(BATCH), parse_catalog(data))
    d = p.decisions[0]
    assert not d.placed and any(r.startswith("cost_not_finite") for r in d.reasons), d.reasons
    assert {c.reason for c in d.rejected} >= {"cost_not_finite"}
    cat = yaml_file(tmp_path / "cat.yaml", data)
    code, out, err = run_cli(capsys, monkeypatch, "place", str(BATCH), "--catalog", str(cat), "--json")
    assert code == 1 and err == "", err
    assert strict_json(out)["ok"] is False


# --- simulation ----------------------------------------------------------------------------------


def test_simulate_refuses_absurd_horizons_and_rates(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path
) -> None:
    sim = ["simulate", "--catalog", str(CATALOG), "--jobs", "50"]
    drain = yaml_file(tmp_path / "drain.yaml", {"drain_days": 1e300})
    refused(capsys, monkeypatch, home, *sim, "--workload", str(drain), names="drain_days 1e+300")
    outages = yaml_file(tmp_path / "outages.yaml", {"outages": {"region_per_day": 1e300}})
    refused(capsys, monkeypatch, home, *sim, "--workload", str(outages), names="outages.region_per_day")
    refused(capsys, monkeypatch, home, *sim, "--days", "1e9", names="--days")
    refused(capsys, monkeypatch, home, *sim, "--seed", "-1", names="--seed")
    cat = yaml_file(tmp_path / "cat.yaml", example_catalog(spot_preemptions_per_hour=1e4))
    started = time.monotonic()
    refused(
        capsys, monkeypatch, home, "simulate", "--catalog", str(cat), "--jobs", "50", names="spot_preemptions_per_hour"
    )
    assert time.monotonic() - started < 30, "refused up front, not after replaying the preemptions"


def test_simulation_cores_refuse_what_they_cannot_run() -> None:
    cat = load_catalog(CATALOG)
    with pytest.raises(UsageError, match="drain_days"):
        build_scenario(cat, WorkloadModel(drain_days=1e300), jobs=5, days=1, seed=0)
    with pytest.raises(ParameterError, match="days"):
        build_scenario(cat, WorkloadModel(), jobs=5, days=math.inf, seed=0)
    table = jobs_from_specs(cat, load_batch(BATCH)[:1], [0.0])
    for horizon in (math.inf, math.nan, 1e300):
        with pytest.raises(UsageError, match="horizon"):
            simulate(cat, table, "cheapest", horizon_h=horizon)
    fast = cat.model_copy(
        update={"offers": [o.model_copy(update={"spot_preemptions_per_hour": 1e4}) for o in cat.offers]}
    )
    with pytest.raises(UsageError, match="spot_preemptions_per_hour"):
        simulate(fast, table, "cheapest", horizon_h=24.0)


# --- telemetry -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        (["--minutes", "nan"], "--minutes nan"),
        (["--minutes", "inf"], "--minutes inf"),
        (["--minutes", "1e9"], "--minutes 1e+09"),
        (["--minutes", "0"], "--minutes 0"),
        (["--gpus", "100000"], "--gpus 100000"),
        (["--gpus", "1000", "--minutes", "60"], "--gpus 1000"),
        (["--seed", "-1"], "--seed -1"),
    ],
)
def test_diagnose_bounds_the_synthetic_job(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, extra: list[str], names: str
) -> None:
    refused(capsys, monkeypatch, home, "observe", "diagnose", "--pattern", "healthy", *extra, names=names)


def test_synthetic_and_diagnosis_configs_refuse_non_finite_sizes() -> None:
    for bad in ({"gpus": 100_000}, {"duration_s": math.nan}, {"duration_s": math.inf}, {"step_s": math.nan}):
        with pytest.raises(ParameterError):
            SyntheticJobConfig(**bad)
    with pytest.raises(ParameterError, match="GPU-steps"):
        generate_samples(SyntheticJobConfig(gpus=1024, duration_s=600))
    for value in (math.inf, math.nan, 1e300):
        with pytest.raises(ParameterError, match="window_s"):
            DiagnosisConfig(window_s=value)


def test_job_diagnosis_refuses_an_infinite_window(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    refused(capsys, monkeypatch, home, "diagnose", "1", "--window", "inf", names="--window inf")


# --- cost report ---------------------------------------------------------------------------------


@pytest.mark.parametrize("since", ["99999999999d", "9" * 400 + "d", "0001-01-01T00:00+14:00"])
def test_report_refuses_a_window_before_any_date(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, since: str
) -> None:
    refused(capsys, monkeypatch, home, "observe", "report", "--since", since, names="--since")
    with pytest.raises(ParameterError, match="0002-01-01"):
        parse_since(since, time.time())


# --- job ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["show", HUGE_ID],
        ["show", str(2**63)],
        ["debug", "spikes", HUGE_ID],
        ["debug", "spikes", "9" * 5000],
        ["diagnose", HUGE_ID],
    ],
)
def test_job_ids_beyond_sqlite_are_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, argv: list[str]
) -> None:
    err = refused(capsys, monkeypatch, home, *argv, names="9223372036854775807" if argv[0] != "debug" else "2**63-1")
    assert len(err) < 400, "a 5000-digit id is not echoed whole"
