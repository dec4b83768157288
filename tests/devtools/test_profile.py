"""``gpufleet profile``: shares that add up, the operators that matter, and a checklist with Nsight commands."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import typer
from typer.testing import CliRunner

from gpufleet.cli.profile import profile_command
from gpufleet.devtools.profile import BUCKETS, OpStat, checklist, profile_job
from gpufleet.errors import SpecError, UsageError
from gpufleet.spec import parse_spec

TINY: dict[str, Any] = {
    "name": "tiny",
    "entrypoint": "gpufleet.workloads.tinylm:train",
    "args": {"embed": 32, "context": 16, "batch_size": 8, "layers": 1, "heads": 2, "eval_batches": 1},
}


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("profile")(profile_command)
    app.command("noop")(lambda: None)  # two commands, so `profile` stays a subcommand
    return app


def gpufleet_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("GPUFLEET_")}


def takes_nothing() -> None:
    """An entrypoint that cannot be cut short."""


def test_profile_tiny_lm_shares_ops_and_checklist(tmp_path: Path) -> None:
    before = (gpufleet_env(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    summary = profile_job(parse_spec(TINY), steps=3, warmup=1)
    assert (gpufleet_env(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == before
    assert summary.scope == "steps" and summary.steps == 3 and summary.wall_s > 0
    assert set(summary.shares) == set(BUCKETS)
    assert sum(summary.shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert all(0.0 <= v <= 1.0 for v in summary.shares.values())
    assert summary.shares["compute"] > 0
    assert summary.shares["communication"] == 0.0  # one process, no collectives
    assert any(op.name in ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul") for op in summary.top_ops)
    assert not any(op.name.startswith("ProfilerStep") for op in summary.top_ops)
    text = "\n".join(summary.checklist)
    assert "nsys profile -t cuda,nvtx,osrt,cudnn,cublas" in text and "GPUFLEET_SPEC=" in text
    assert "ncu --set full -k 'regex:" in text and "-c 20" in text
    assert any("record_function('data')" in n for n in summary.notes)  # tinylm's batches are not instrumented
    json.dumps(summary.to_dict())


def test_profile_cli_json_and_text(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(TINY))  # JSON is YAML
    out = CliRunner().invoke(cli(), ["profile", str(spec), "--steps", "2", "--warmup", "0", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["steps"] == 2 and sum(data["shares"].values()) == pytest.approx(1.0)
    out = CliRunner().invoke(cli(), ["profile", str(spec), "--steps", "1", "--warmup", "0", "--top", "3"])
    assert out.exit_code == 0, out.output
    assert "Where the time goes" in out.output and "Next steps" in out.output and "ncu --set full" in out.output


def test_checklist_follows_the_shares() -> None:
    shares = {"compute": 0.1, "communication": 0.4, "data_loading": 0.3, "host_overhead": 0.05, "idle": 0.15}
    items = checklist(shares, [OpStat("aten::native_layer_norm", 10, 5.0, 0.1)], cuda=True, small_ops=False)
    text = "\n".join(items)
    assert "num_workers" in text and "pin_memory" in text
    assert "NCCL_DEBUG=INFO" in text and "bucket_cap_mb" in text
    assert "set_sync_debug_mode" in text
    assert "Triton" in text
    assert "nsys profile" in items[-2] and "regex:aten::native_layer_norm" in items[-1]
    matmul = checklist(
        {**dict.fromkeys(BUCKETS, 0.0), "compute": 0.9, "host_overhead": 0.1},
        [OpStat("ampere_bf16_s16816gemm", 4, 9.0, 0.8)],
        cuda=True,
        small_ops=True,
    )
    assert any("tensor cores" in i and "MFU" in i for i in matmul)
    assert any("CUDA graphs" in i and "torch.compile" in i for i in matmul)


def test_profile_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="steps=0"):
        profile_job(parse_spec(TINY), steps=0)
    with pytest.raises(SpecError, match="command"):
        profile_job(parse_spec({"name": "c", "entrypoint": ["python", "train.py"]}))
    with pytest.raises(SpecError, match=r"cannot import entrypoint 'gpufleet\.nowhere:train'"):
        profile_job(parse_spec({"name": "c", "entrypoint": "gpufleet.nowhere:train"}))
    with pytest.raises(UsageError, match="neither `steps` nor `on_step`"):
        profile_job(parse_spec({"name": "c", "entrypoint": f"{__name__}:takes_nothing"}))
    out = CliRunner().invoke(cli(), ["profile", str(tmp_path / "missing.yaml")])
    assert isinstance(out.exception, SpecError) and "missing.yaml" in str(out.exception)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(TINY))
    out = CliRunner().invoke(cli(), ["profile", str(spec), "--steps", "-1"])
    assert isinstance(out.exception, UsageError) and "--steps -1" in str(out.exception)
