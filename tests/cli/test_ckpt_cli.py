"""`gpufleet ckpt list | verify | export`: the same restore decision as the runtime, plain exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from gpufleet.runtime.checkpoint import CheckpointDir, model_fingerprint
from gpufleet.units import format_bytes


def model_state(width: int, step: int) -> dict[str, object]:
    torch.manual_seed(step)
    return {
        "model": torch.nn.Linear(width, 3).state_dict(),
        "optimizer": {"state": {}, "param_groups": []},
        "trainer": {"step": step, "objects": ["model", "optimizer", "trainer"]},
    }


@pytest.fixture
def ckdir(tmp_path: Path) -> Path:
    """Steps 10 and 20 healthy, 30 unhealthy, 40 with a flipped byte: a restore uses step 20."""
    ckpts = CheckpointDir(tmp_path / "ck", keep=10)
    for step in (10, 20, 30, 40):
        ckpts.save(step, model_state(4, step), healthy=step != 30, metrics={"val_loss": 1.0 / step}, job="9")
    target = tmp_path / "ck" / "step-00000040" / "model.pt"
    data = bytearray(target.read_bytes())
    data[-30] ^= 0xFF
    target.write_bytes(bytes(data))
    return tmp_path / "ck"


def test_verify_and_restore_make_the_same_decision(
    ckdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "verify", str(ckdir), "--json")
    result = json.loads(out)
    assert code == 1 and result["ok"] is False
    assert [c["status"] for c in result["checkpoints"]] == ["ok", "ok", "unhealthy", "corrupt"]
    info, _, _, skipped = CheckpointDir(ckdir).restore_candidate()
    assert info is not None and result["restore_step"] == info.step == 20
    assert [s.step for s in skipped] == [40, 30]
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "verify", str(ckdir))
    assert code == 1 and "BAD  step-00000040" in out and "unhealthy  step-00000030" in out
    assert "restore would use step 20" in out


def test_verify_with_job_marks_other_jobs_checkpoints_foreign(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpts = CheckpointDir(tmp_path / "ck", keep=10)
    ckpts.save(1, model_state(4, 1), job="9")
    ckpts.save(2, model_state(4, 2), job="7")
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "verify", str(tmp_path / "ck"), "--job", "9", "--json")
    result = json.loads(out)
    assert code == 0 and result["ok"] is True and result["restore_step"] == 1
    assert [c["status"] for c in result["checkpoints"]] == ["ok", "foreign"]
    assert "written by job 7, this is job 9" in result["checkpoints"][1]["problem"]
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "verify", str(tmp_path / "ck"), "--job", "9")
    assert code == 0 and "foreign  step-00000002" in out and "restore would use step 1" in out
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "verify", str(tmp_path / "ck"), "--json")
    assert json.loads(out)["restore_step"] == 2


def test_list_shows_metrics(ckdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "list", str(ckdir), "--json")
    rows = json.loads(out)["checkpoints"]
    assert code == 0 and rows[0]["metrics"] == {"val_loss": 0.1} and rows[0]["job"] == "9"
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "list", str(ckdir))
    assert code == 0 and "val_loss=0.05" in out
    assert format_bytes(rows[0]["bytes"]) in out and " yes " in out  # a size and a flag as people read them


def test_export_writes_a_plain_state_dict_of_the_restore_choice(ckdir: Path, tmp_path: Path) -> None:
    """Through the installed entry point, as a user runs it; the file loads with plain torch."""
    out = tmp_path / "model.pt"
    env = {**os.environ, "GPUFLEET_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "gpufleet.cli", "ckpt", "export", str(ckdir), "--out", str(out), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["step"] == 20 and result["entry"] == "model" and result["tensors"] == 2
    loaded = torch.load(out, weights_only=True)
    model = torch.nn.Linear(4, 3)
    model.load_state_dict(loaded)
    assert torch.equal(model.weight, model_state(4, 20)["model"]["weight"])  # type: ignore[index]
    assert result["fingerprint"] == model_fingerprint(model.state_dict())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model.pt.tmp")]


def test_export_a_chosen_step_and_entry(
    ckdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "opt.pt"
    args = ("ckpt", "export", str(ckdir), "--step", "10", "--entry", "optimizer", "--out", str(out))
    code, stdout, _ = run_cli(capsys, monkeypatch, *args)
    assert code == 0 and "step-00000010" in stdout
    assert torch.load(out, weights_only=True) == {"state": {}, "param_groups": []}


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (("--step", "25"), ["--step 25", "10, 20, 30, 40"]),
        (("--entry", "weights"), ["--entry 'weights'", "model, optimizer, trainer"]),
        (("--out", "{tmp}/missing/model.pt"), ["missing", "create it first"]),
        (("--out", "{tmp}"), ["is a directory", "model.pt"]),
    ],
)
def test_export_bad_values_exit_2_with_one_line(
    ckdir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    names: list[str],
) -> None:
    given = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = [] if "--out" in given else ["--out", str(tmp_path / "model.pt")]
    code, _, err = run_cli(capsys, monkeypatch, "ckpt", "export", str(ckdir), *given, *out)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    assert all(name in lines[0] for name in names), lines[0]
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize(("step", "expected"), [("40", "sha256"), ("30", "marked unhealthy")])
def test_export_refuses_a_corrupt_or_unhealthy_step(
    ckdir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    expected: str,
) -> None:
    args = ("ckpt", "export", str(ckdir), "--step", step, "--out", str(tmp_path / "model.pt"))
    code, _, err = run_cli(capsys, monkeypatch, *args)
    assert code == 1 and expected in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize("command", [("verify",), ("list",), ("export", "--out", "model.pt")])
def test_an_empty_checkpoint_directory_is_refused_not_taken_for_the_current_folder(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: tuple[str, ...],
) -> None:
    monkeypatch.chdir(tmp_path)
    CheckpointDir(tmp_path).save(1, model_state(4, 1))  # what "" would have found, were it "."
    code, out, err = run_cli(capsys, monkeypatch, "ckpt", command[0], "", *command[1:])
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and "checkpoint directory is empty" in lines[0], err
    assert not (tmp_path / "model.pt").exists()


def test_verify_says_plainly_when_no_checkpoint_can_be_restored(
    ckdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (10, 20):
        (ckdir / f"step-{step:08d}" / "model.pt").write_bytes(b"not a model")
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "verify", str(ckdir))
    assert code == 1 and "no healthy checkpoint: restore would start from scratch" in out
    assert "None" not in out
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "verify", str(ckdir), "--json")
    assert json.loads(out)["restore_step"] is None


def test_verify_and_export_print_no_warning_of_torch(tmp_path: Path) -> None:
    """A quantized tensor makes torch.load warn about deprecated storages; the commands print none of it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns here too
        quantized = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
        CheckpointDir(tmp_path / "ck").save(1, {"model": {"w": quantized}, "trainer": {"step": 1}})
    env = {**os.environ, "GPUFLEET_HOME": str(tmp_path / "home"), "COLUMNS": "200", "PYTHONWARNINGS": "always"}
    out = tmp_path / "model.pt"
    for args in (("verify",), ("export", "--out", str(out))):
        cmd = [sys.executable, "-m", "gpufleet.cli", "ckpt", args[0], str(tmp_path / "ck"), *args[1:]]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(torch.load(out, weights_only=True)["w"].dequantize(), quantized.dequantize())
