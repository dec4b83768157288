"""Library cores name their parameters in errors; the CLI says the same with its flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

from gpufleet.cost.fleet import parse_since
from gpufleet.devtools.debug import check_determinism
from gpufleet.devtools.profile import profile_job
from gpufleet.devtools.resumecheck import check_resume
from gpufleet.errors import ParameterError
from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.spec import load_spec

TOY = Path(__file__).resolve().parents[1] / "examples" / "toy.yaml"


def test_parse_since_names_since(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ParameterError) as err:
        parse_since("yesterday", 1_700_000_000.0)
    assert str(err.value).startswith("since='yesterday' is not understood: give a duration")
    assert "--" not in str(err.value)
    code, _, stderr = run_cli(capsys, monkeypatch, "observe", "report", "--since", "yesterday")
    assert code == 2 and "--since 'yesterday' is not understood" in stderr


def test_checkpoint_export_names_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ParameterError) as err:
        CheckpointDir(tmp_path).export(tmp_path)
    message = str(err.value)
    assert message.startswith(f"out={str(tmp_path)!r} is a directory") and "--" not in message
    code, _, stderr = run_cli(capsys, monkeypatch, "ckpt", "export", str(tmp_path), "--out", str(tmp_path))
    assert code == 2 and f"--out {str(tmp_path)!r} is a directory" in stderr


def test_resume_check_names_at(home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ParameterError) as err:
        check_resume(load_spec(TOY), at=0)
    assert str(err.value) == "at=0 must be a step number of at least 1"
    code, _, stderr = run_cli(capsys, monkeypatch, "debug", "resume-check", str(TOY), "--at", "0")
    assert code == 2 and "--at 0 must be a step number of at least 1" in stderr


def test_determinism_check_names_its_seeds(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ParameterError) as err:
        check_determinism(load_spec(TOY), steps=2, seeds=(3, 3))
    assert str(err.value) == "seeds 3,3: give two different non-negative seeds, e.g. seeds 0,1"
    code, _, stderr = run_cli(capsys, monkeypatch, "debug", "determinism", str(TOY), "--seeds", "3,3")
    assert code == 2 and "--seeds 3,3: give two different non-negative seeds, e.g. --seeds 0,1" in stderr


def test_profiler_names_steps_and_warmup(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ParameterError) as err:
        profile_job(load_spec(TOY), steps=0, warmup=1)
    assert "--" not in str(err.value) and str(err.value).startswith("steps=0, warmup=1: ")
