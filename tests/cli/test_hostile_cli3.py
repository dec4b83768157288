"""Hostile inputs found by the fuzz suite (third batch): one stderr line, exit 2 or 3, nothing written."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
from conftest import run_cli

from gpufleet.errors import GpufleetError

ROOT = Path(__file__).resolve().parents[2]
MIX = """\
name: our-cluster-2025q3
reference_gpus: 4096
reference_hours: 2208
causes:
  - {name: "GPU (Xid 79, 48, 94)", count: 61, reschedule: true}
  - {name: host, count: 14, reschedule: true}
  - {name: NCCL hang, count: 9, restart_seconds: 240}
  - {name: kernel and firmware rollout, count: 12, planned: true}
"""


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error:"), err
    return lines[0]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _job(home: Path, backend: str = "local", state: str = "queued") -> int:
    from gpufleet.jobs.store import Store
    from gpufleet.paths import state_db
    from gpufleet.spec import load_spec

    store = Store(state_db(home))
    job_id = store.add_job(load_spec(ROOT / "examples" / "toy.yaml"), backend)
    store.set_job_state(job_id, state)
    store.close()
    return job_id


# 1
@pytest.mark.parametrize("kind", ["file", "under-file"])
def test_home_that_is_not_a_folder(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    monkeypatch.setenv("GPUFLEET_HOME", str(plain if kind == "file" else plain / "sub"))
    code, _, err = run_cli(capsys, monkeypatch, "cost")
    assert code == 2
    assert "GPUFLEET_HOME=" in _one_error(err) and "is not a folder" in err
    assert plain.read_text() == "x"


# 2
def test_submit_refused_by_admit_leaves_no_store(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "1")
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(ROOT / "examples" / "tinylm-ddp.yaml"))
    assert code == 2
    assert "GPUFLEET_LOCAL_SLOTS" in _one_error(err)
    assert not home.exists()


def test_submit_refused_by_start_leaves_no_store(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.backends.local import LocalBackend
    from gpufleet.errors import ServiceUnavailable
    from gpufleet.spec import load_spec

    def refuse(self: LocalBackend, job_id: int, folder: Path, spec: object) -> None:
        raise ServiceUnavailable("scheduler unreachable")

    monkeypatch.setattr(LocalBackend, "_start", refuse)
    backend = LocalBackend(home, spawn=False)
    with pytest.raises(ServiceUnavailable):
        backend.submit(load_spec(ROOT / "examples" / "toy.yaml"))
    assert not home.exists()


# 3
@pytest.mark.parametrize("argv", [["show", "1"], ["cancel", "1"], ["diagnose", "1"], ["logs", "1"]])
def test_empty_state_db_is_no_store(
    argv: list[str], home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home.mkdir()
    (home / "state.db").touch()
    code, _, err = run_cli(capsys, monkeypatch, *argv)
    assert code == 2
    assert "no job 1" in _one_error(err)
    assert (home / "state.db").stat().st_size == 0


# 4, 5
def test_stale_warning_only_when_the_command_succeeds(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = _job(home)
    calls: list[int] = []

    def unreachable(home: Path, store: object) -> None:
        calls.append(1)
        raise GpufleetError("ray cluster unreachable")

    monkeypatch.setattr("gpufleet.cli.options.sync_remote", unreachable)
    code, _, err = run_cli(capsys, monkeypatch, "logs", str(job_id))  # queued: no attempt yet
    assert code == 2
    assert "has not started yet" in _one_error(err)
    code, _, err = run_cli(capsys, monkeypatch, "show", str(job_id))
    assert code == 0
    assert "states may be stale" in err
    calls.clear()
    before = _digest(home / "state.db")
    for argv in (["logs", "2"], ["show", "2"], ["advise", "2"]):
        code, _, err = run_cli(capsys, monkeypatch, *argv)
        assert code == 2
        assert "no job 2" in _one_error(err)
    assert calls == []  # an unknown job is refused before the refresh
    assert _digest(home / "state.db") == before


# 6
def test_spikes_window_too_large(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    csv = tmp_path / "loss.csv"
    csv.write_text("step,loss\n1,1.0\n2,1.1\n")
    code, _, err = run_cli(capsys, monkeypatch, "debug", "spikes", str(csv), "--window", "2147483648")
    assert code == 2
    assert "--window" in _one_error(err)


# 7
@pytest.mark.parametrize("verb", ["hold", "release", "preempt"])
@pytest.mark.parametrize("prefix", ["", "slurm:"])
def test_slurm_huge_job_id(
    verb: str, prefix: str, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "slurm", verb, prefix + "9" * 5000)
    assert code == 2
    assert len(_one_error(err)) < 300
    assert not home.exists()


# 8
def test_lab_seasonal_plot_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "quality", "lab-seasonal", "--out", str(tmp_path / "x.yaml"))
    assert code == 2
    assert "--out" in _one_error(err) and ".png" in err
    assert not (tmp_path / "x.yaml").exists()


# 9
def test_cost_out_under_a_file(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plainfile"
    plain.write_text("x")
    code, _, err = run_cli(capsys, monkeypatch, "cost", "--out", str(plain / "note"))
    assert code == 2
    assert "--out" in _one_error(err)
    assert plain.read_text() == "x"


@pytest.mark.parametrize("command", [["cost"], ["observe", "report"]])
def test_an_output_folder_that_is_a_link_to_nothing(
    command: list[str], home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No folder can be made where a link points nowhere: one line naming the flag, not a traceback."""
    dangling = tmp_path / "out"
    dangling.symlink_to(tmp_path / "missing" / "x")
    code, _, err = run_cli(capsys, monkeypatch, *command, "--out", str(dangling))
    assert code == 2
    assert "--out" in _one_error(err) and "link to nothing" in err
    assert dangling.is_symlink() and not (tmp_path / "missing").exists()


def test_cost_note_never_renames_over_a_fifo(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "note"
    out.mkdir()
    os.mkfifo(out / "cost-note.md")
    code, _, err = run_cli(capsys, monkeypatch, "cost", "--out", str(out))
    assert code == 2
    assert "--out" in _one_error(err) and "FIFO" in err
    assert (out / "cost-note.md").is_fifo()


def test_replace_output_writes_a_char_device_in_place(tmp_path: Path) -> None:
    from gpufleet.outfiles import check_output_file, replace_output

    tmp = tmp_path / "x.tmp"
    tmp.write_text("hello")
    replace_output(tmp, Path("/dev/null"))
    assert Path("/dev/null").is_char_device()
    assert not tmp.exists()
    check_output_file(Path("/dev/null"), "--out")
    with pytest.raises(GpufleetError, match="--html"):
        check_output_file(tmp_path, "--html")


@pytest.mark.parametrize("flag", ["--plot-interval", "--plot-fleet"])
def test_goodput_plot_into_a_folder(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "p.png"
    folder.mkdir()
    argv = ["goodput", "--gpus", "8", "--work-hours", "10", "--gpu-mtbf-hours", "50000", "--save-seconds", "10"]
    code, _, err = run_cli(capsys, monkeypatch, *argv, "--restart-seconds", "60", flag, str(folder))
    assert code == 2
    assert flag in _one_error(err)
    assert folder.is_dir()


# 10
@pytest.mark.parametrize(
    "argv", [["--step-seconds", "5e-324"], ["--step-seconds", "nan"], ["--nodes", "9" * 30], ["--nodes", "1000"]]
)
def test_exporter_bounds(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "observe", "exporter", "--port", "0", *argv)
    assert code == 2
    assert argv[0] in _one_error(err)


# 11
def test_goodput_montecarlo_step_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mix = tmp_path / "mix.yaml"
    mix.write_text(MIX)
    argv = ["goodput", "--gpus", "10000000", "--work-hours", "1296", "--save-seconds", "2", "--restart-seconds", "120"]
    argv += ["--mix", str(mix), "--restore-seconds", "0", "--engine", "montecarlo", "--trials", "2"]
    start = time.monotonic()
    code, _, err = run_cli(capsys, monkeypatch, *argv)
    assert code == 2
    assert "--trials" in _one_error(err) and "analytic" in err
    assert time.monotonic() - start < 30


# 12
def test_logs_of_a_device_or_fifo(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufleet.jobs.store import Store
    from gpufleet.paths import attempt_log, state_db

    job_id = _job(home, state="running")
    store = Store(state_db(home))
    store.add_attempt(job_id, 1, 0, time.time())
    store.close()
    log = attempt_log(home, job_id, 1)
    log.parent.mkdir(parents=True)
    log.symlink_to("/dev/zero")
    code, _, err = run_cli(capsys, monkeypatch, "logs", str(job_id))
    assert code == 2
    assert "not a regular file" in _one_error(err)
    log.unlink()
    os.mkfifo(log)
    code, _, err = run_cli(capsys, monkeypatch, "logs", str(job_id))
    assert code == 2
    assert "not a regular file" in _one_error(err)


def test_read_tail_is_bounded(tmp_path: Path) -> None:
    from gpufleet.outfiles import read_tail

    assert read_tail(Path("/dev/zero"), 10) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_tail(fifo, 10) is None
    big = tmp_path / "big.log"
    big.write_bytes(b"a" * 100 + b"0123456789")
    assert read_tail(big, 10) == (b"0123456789", 110)


# 13
def test_determinism_unknown_arg(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "s.yaml"
    text = (ROOT / "examples" / "toy.yaml").read_text()
    spec.write_text(text.replace("args: {steps: 100, step_seconds: 0.05}", "args: {step_seconds: 0, bogus: 1}"))
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, monkeypatch, "debug", "determinism", str(spec))
    assert code == 2
    assert "bogus" in _one_error(err)


# 14
def test_registry_unreachable_http_is_quick(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    start = time.monotonic()
    code, _, err = run_cli(capsys, monkeypatch, "registry", "rollback", "tabular-demo", "--reason", "x")
    assert code == 3
    assert "mlflow server" in _one_error(err)
    assert time.monotonic() - start < 20


def test_advise_refuses_a_rate_too_rare_to_plan_for() -> None:
    from gpufleet.errors import UsageError
    from gpufleet.placement.advisor import advise

    with pytest.raises(UsageError, match="too rare to plan an interval"):
        advise(20.0, 5e-324, step_seconds=1.0)  # 3600 / 5e-324 overflows to an infinite MTBF


def test_export_prints_no_warning_before_a_write_that_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    def full(self: Path, *args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    spec = Path(__file__).resolve().parents[2] / "examples" / "toy.yaml"
    monkeypatch.setattr(Path, "write_text", full)  # a disk that fills as --out is written (like /dev/full)
    code, _, err = run_cli(capsys, monkeypatch, "export", "skypilot", str(spec), "--out", str(tmp_path / "task.yaml"))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "No space left" in lines[0], err  # the no --bucket warning is not printed


def test_a_huge_category_label_is_drawn_cut(tmp_path: Path) -> None:
    import numpy as np

    from gpufleet.quality.html import LABEL_CHARS, _categorical_plot

    huge = "x" * (1 << 20)
    svg = _categorical_plot(np.array([huge, "a"], dtype=object), np.array(["a", "b"], dtype=object))
    assert "x" * LABEL_CHARS in svg and "x" * (LABEL_CHARS + 1) not in svg


def test_outputs_written_by_a_rename_refuse_a_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "ckpt", "export", str(tmp_path), "--out", "/dev/null")
    assert code == 2 and "is a device" in err and len(err.strip().splitlines()) == 1
    assert Path("/dev/null").is_char_device()
    code, _, err = run_cli(capsys, monkeypatch, "observe", "exporter", "--port-file", "/dev/null", "--port", "0")
    assert code == 2 and "is a device" in err
    assert Path("/dev/null").is_char_device()
