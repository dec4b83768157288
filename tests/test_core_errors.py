"""Library cores name their parameters in errors; the CLI says the same with its flags."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpufleet.cli.app import main
from gpufleet.cost.fleet import parse_since
from gpufleet.devtools.resumecheck import check_resume
from gpufleet.errors import ParameterError
from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.spec import load_spec

TOY = Path(__file__).resolve().parents[1] / "examples" / "toy.yaml"


def gpufleet(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    """Run the CLI in this process through ``main()`` (what renders errors): exit code and stderr."""
    monkeypatch.setattr(sys, "argv", ["gpufleet", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err


def test_parse_since_names_since(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ParameterError) as err:
        parse_since("yesterday", 1_700_000_000.0)
    assert str(err.value).startswith("since='yesterday' is not understood: give a duration")
    assert "--" not in str(err.value)
    code, stderr = gpufleet(capsys, monkeypatch, "observe", "report", "--since", "yesterday")
    assert code == 2 and "--since 'yesterday' is not understood" in stderr


def test_checkpoint_export_names_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ParameterError) as err:
        CheckpointDir(tmp_path).export(tmp_path)
    message = str(err.value)
    assert message.startswith(f"out={str(tmp_path)!r} is a directory") and "--" not in message
    code, stderr = gpufleet(capsys, monkeypatch, "ckpt", "export", str(tmp_path), "--out", str(tmp_path))
    assert code == 2 and f"--out {str(tmp_path)!r} is a directory" in stderr


def test_resume_check_names_at(home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ParameterError) as err:
        check_resume(load_spec(TOY), at=0)
    assert str(err.value) == "at=0 must be a step number of at least 1"
    code, stderr = gpufleet(capsys, monkeypatch, "debug", "resume-check", str(TOY), "--at", "0")
    assert code == 2 and "--at 0 must be a step number of at least 1" in stderr
