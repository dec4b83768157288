"""``gpufleet estimate``: JSON keys, tables, and one-line errors (exit 2) for bad input."""

from __future__ import annotations

import json
import pickle

import pytest
import typer
from typer.testing import CliRunner

from gpufleet.cli.estimate import estimate_app, parse_count
from gpufleet.errors import GpufleetError, ParameterError, UsageError
from gpufleet.estimate.layout import usable_bytes
from gpufleet.estimate.memory import estimate_memory
from gpufleet.estimate.peak import gpu_peak

app = typer.Typer(pretty_exceptions_enable=False)
app.add_typer(estimate_app, name="estimate")

MODEL = ["--params", "6.74e9", "--layers", "32", "--heads", "32"]
TP8_BAD = ["--layers", "32", "--hidden", "4104", "--heads", "12", "--seq", "4096", "--micro-batch", "1"]
SHAPE = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "4096", "--micro-batch", "1"]


def _run(*args: str) -> tuple[int, str]:
    """Exit code and output as ``gpufleet.cli.app:main`` gives them: a GpufleetError is one line and its code."""
    result = CliRunner().invoke(app, ["estimate", *args], env={"COLUMNS": "200"})
    if isinstance(result.exception, GpufleetError):
        return result.exception.exit_code, f"error: {result.exception}"
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


def test_mfu_json() -> None:
    code, out = _run(
        "mfu", *MODEL, "--head-dim", "128", "--seq", "4096", "--tokens-per-second", "3200", "--gpu", "H100", "--json"
    )
    data = json.loads(out)
    assert code == 0 and {"flops_per_token", "achieved_flops", "peak_flops", "mfu", "hfu"} <= set(data)
    assert data["flops_per_token"] == 6 * 6_740_000_000 + 12 * 32 * 32 * 128 * 4096
    assert data["mfu"] == pytest.approx(3200 * data["flops_per_token"] / 989.5e12)


def test_mfu_step_time_form_and_table() -> None:
    args = ["mfu", *MODEL, "--head-dim", "128", "--seq", "4096", "--gpu", "h100", "--num-gpus", "8"]
    code, out = _run(*args, "--step-time", "4", "--tokens-per-step", "1M", "--recompute", "full")
    assert code == 0 and "MFU" in out and "HFU" in out and "8 x h100-sxm" in out
    code, out = _run(*args, "--step-time", "4", "--tokens-per-step", "1M", "--json")
    assert json.loads(out)["tokens_per_second"] == 250_000


def test_memory_json_breakdown() -> None:
    code, out = _run("memory", "--params", "7.5B", "--gpus", "64", "--strategy", "zero2", "--json")
    data = json.loads(out)
    assert code == 0 and data["total_bytes"] == 16_640_625_000  # ZeRO figure 1, P_os+g
    keys = {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "total_bytes"}
    assert keys <= set(data) and sum(data[k] for k in keys - {"total_bytes"}) == data["total_bytes"]
    assert [item["name"] for item in data["breakdown"]] == ["parameters", "gradients", "optimizer states"]


def test_memory_table_in_gib() -> None:
    args = ["memory", "--params", "6.74e9", "--gpus", "8", "--strategy", "fsdp", *SHAPE, "--gpu", "h100"]
    code, out = _run(*args, "--recompute", "selective")
    assert code == 0 and "GiB" in out and "total on GPU" in out and "\nfits: 30.34 GiB of 71.00 GiB usable" in out
    code, out = _run(*args)
    assert code == 0 and "does not fit: 110.34 GiB" in out


def test_layout_json_and_table() -> None:
    args = ["layout", "--params", "6.74e9", "--gpus", "8", "--gpu", "h100", *SHAPE, "--recompute", "selective"]
    code, out = _run(*args, "--json")
    data = json.loads(out)
    assert code == 0 and data["gpu"] == "h100-sxm" and data["fits"] and data["rejected"]
    assert all(o["memory"]["total_bytes"] <= o["usable_bytes"] for o in data["fits"])
    assert data["rejected"][0]["reason"].startswith("needs ")
    code, out = _run(*args)
    assert code == 0 and "least communication first" in out and "rejected" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["memory", "--params", "0", "--gpus", "8"], "--params must be positive, got 0"),
        (["memory", "--params", "-7B", "--gpus", "8"], "--params '-7B' is not a count"),
        (["memory", "--params", "7B", "--gpus", "8", "--tp", "3"], "--gpus 8 is not divisible by --tp 3"),
        (["memory", "--params", "7B", "--gpus", "8", "--tp", "8", "--heads", "12"], "activations need --layers"),
        (["memory", "--params", "7B", "--gpus", "8", "--tp", "8", *TP8_BAD], "--heads 12 is not divisible by --tp 8"),
        (
            ["memory", "--params", "7B", "--gpus", "8", "--pp", "3", *SHAPE],
            "--gpus 8 is not divisible by --tp 1 * --pp 3",
        ),
        (["memory", "--params", "7B", "--gpus", "8", "--pp", "8", *SHAPE[2:], "--layers", "12"], "--layers 12"),
        (["layout", "--params", "7B", "--gpus", "8", "--gpu", "V100"], "unknown GPU 'V100': use one of a100-40gb"),
        (["mfu", *MODEL, "--head-dim", "128", "--seq", "0", "--gpu", "h100", "--tokens-per-second", "1"], "--seq"),
        (["mfu", *MODEL, "--head-dim", "128", "--seq", "8", "--gpu", "h100"], "give --tokens-per-second"),
        (["mfu", *MODEL, "--head-dim", "1", "--seq", "8", "--gpu", "x", "--tokens-per-second", "1"], "unknown GPU"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    code, out = _run(*args)
    assert code == 2 and message in out and len(out.strip().splitlines()) == 1 and "Traceback" not in out


def test_parse_count() -> None:
    assert [parse_count(t, "params") for t in ("6.74e9", "7B", "350M", "125k", "1.5T", "42")] == [
        6_740_000_000,
        7_000_000_000,
        350_000_000,
        125_000,
        1_500_000_000_000,
        42,
    ]
    with pytest.raises(UsageError, match="--params 'seven'"):
        parse_count("seven", "params")


def test_the_core_names_parameters_and_the_command_line_names_flags() -> None:
    """One bad input said twice: in the library's parameter names, and in the options the user typed."""
    why = "is not divisible by {} * {}: pick degrees whose product divides it"
    with pytest.raises(ParameterError) as core:
        estimate_memory(7_000_000_000, 8, tp=3)
    assert str(core.value) == "gpus=8 " + why.format("tp=3", "pp=1")
    assert _run("memory", "--params", "7B", "--gpus", "8", "--tp", "3") == (
        2,
        "error: --gpus 8 " + why.format("--tp 3", "--pp 1"),
    )
    with pytest.raises(ParameterError, match=r"^headroom=1\.5 must be in \[0, 1\): "):
        usable_bytes(gpu_peak("h100"), headroom=1.5)
    code, out = _run("layout", "--params", "7B", "--gpus", "8", "--gpu", "h100", "--headroom", "1.5")
    assert code == 2 and out.startswith("error: --headroom 1.5 must be in [0, 1): ")
    code, out = _run(
        "mfu", *MODEL, "--head-dim", "128", "--seq", "8", "--gpu", "h100", "--step-time", "0", "--tokens-per-step", "1M"
    )
    assert code == 2 and out.startswith("error: --step-time must be positive, got 0.0: ")


def test_a_parameter_without_a_flag_keeps_its_name() -> None:
    err = ParameterError("{gpus} is not divisible by {tp}: see {note!s}", gpus=8, tp=3, note="{x}")
    assert str(err.as_flags({"gpus": "--gpus"})) == "--gpus 8 is not divisible by tp=3: see {x}"
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, ParameterError) and str(again) == str(err) == "gpus=8 is not divisible by tp=3: see {x}"
