"""The command line starts fast and reads well: a command imports what it needs, help is grouped, numbers are plain.

Start-up is kept by what a command imports, never by a timing (``bench/cli_startup.py`` measures the time).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from gpufleet._version import __version__
from gpufleet.cli.commands import COMMANDS, PANELS
from gpufleet.cli.lazy import LazyGroup, unwrapped
from gpufleet.fmt import gpu_time, number

HEAVY = ("torch", "numpy", "pydantic", "fastapi", "starlette", "mlflow", "scipy", "gpufleet.spec")
"""What ``gpufleet --help`` must not import: each is a tenth of a second or more of start-up."""
FOR_JOBS = (
    "torch",
    "numpy",
    "scipy",
    "mlflow",
    "yaml",
    "concurrent.futures",
    "gpufleet.placement.planner",
    "gpufleet.backends.ray.backend",
)
"""What listing the jobs of a store does not need: no job runs, nothing is placed, no YAML file is read."""


def imported_by(home: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``gpufleet ARGS`` in a fresh interpreter, and every module it had imported when it ended."""
    code = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: sys.__stderr__.write('MODULES ' + json.dumps(sorted(sys.modules)) + '\\n'))\n"
        "from gpufleet.cli.app import main\n"
        "main()\n"
    )
    env = {**os.environ, "GPUFLEET_HOME": str(home), "COLUMNS": "120"}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    return proc, set(json.loads(line.removeprefix("MODULES ")))


def one_job_home(home: Path, state: str = "completed") -> int:
    """A home whose store holds one job (completed), written straight into the store."""
    from gpufleet.jobs.store import Store
    from gpufleet.paths import state_db
    from gpufleet.spec import load_spec

    store = Store(state_db(home))
    job_id = store.add_job(load_spec(Path(__file__).parents[2] / "examples" / "toy.yaml"), "local")
    store.set_job_state(job_id, state)
    store.close()
    return job_id


def test_listing_running_jobs_does_not_load_the_local_backend(tmp_path: Path) -> None:
    """The local scheduler writes the store itself: with no dead scheduler's pid file there is nothing to sync."""
    one_job_home(tmp_path, state="running")
    proc, modules = imported_by(tmp_path, "jobs")
    assert proc.returncode == 0 and "running" in proc.stdout, proc.stderr
    assert not {"gpufleet.backends.local", "numpy"} & modules


def test_help_imports_no_command_and_lists_every_one_in_its_panel(tmp_path: Path) -> None:
    proc, modules = imported_by(tmp_path, "--help")
    assert proc.returncode == 0, proc.stderr
    assert not [m for m in HEAVY if m in modules], sorted(m for m in HEAVY if m in modules)
    assert not {"gpufleet.cli.jobs", "gpufleet.cli.ckpt", "gpufleet.cli.sweep"} & modules
    shown = proc.stdout
    assert [p for p in PANELS if f"─ {p} " in shown] == list(PANELS)
    assert all(f" {name} " in shown for name in COMMANDS)
    assert "<bool>" not in shown and "--version" in shown


def test_listing_jobs_and_showing_one_import_no_scheduler_planner_or_torch(tmp_path: Path) -> None:
    job_id = one_job_home(tmp_path)
    for args in (("jobs",), ("show", str(job_id))):
        proc, modules = imported_by(tmp_path, *args)
        assert proc.returncode == 0 and "toy" in proc.stdout, proc.stderr
        assert not [m for m in FOR_JOBS if m in modules], (args, sorted(m for m in FOR_JOBS if m in modules))
    proc, modules = imported_by(tmp_path, "jobs")
    assert not {"gpufleet.runtime.checkpoint", "gpufleet.cost.usage"} & modules  # what show alone reads


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flag: str) -> None:
    assert run_cli(capsys, monkeypatch, flag) == (0, f"gpufleet {__version__}\n", "")


def test_each_listed_help_is_its_commands_own_and_every_panel_holds_commands() -> None:
    import typer

    from gpufleet.cli.app import app

    group = typer.main.get_command(app)
    assert isinstance(group, LazyGroup)
    ctx = group.context_class(group, info_name="gpufleet")
    for name, entry in COMMANDS.items():
        command = group.get_command(ctx, name)
        assert command is not None and command.name == name
        first = inspect.cleandoc(command.help or "").split("\n\n")[0]
        assert first == entry.help, f"{name}: the listing says {entry.help!r}, the command {first!r}"
        assert getattr(command, "rich_help_panel", None) == entry.panel in PANELS
    assert {e.panel for e in COMMANDS.values()} == set(PANELS)


def test_an_unknown_command_suggests_one_not_loaded_yet(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli(capsys, monkeypatch, "registy")
    assert code == 2 and out == "" and "Did you mean 'registry'?" in err and err.count("\n") == 1


def test_a_command_loaded_on_demand_still_refuses_text_that_is_not_utf8(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "jobs", "--team", "a\udcff")
    assert code == 2 and "--team" in err and "is not UTF-8 text" in err


def test_help_paragraphs_are_unwrapped_and_lists_kept() -> None:
    text = "First line\nwraps here.\n\nSecond\nparagraph.\n\n- item one\n- item two\n\n\bkept\nas is"
    assert unwrapped(text) == "First line wraps here.\n\nSecond paragraph.\n\n- item one\n- item two\n\n\bkept\nas is"


@pytest.mark.parametrize(
    ("value", "digits", "expected"),
    [(6.63e-05, 3, "0.0000663"), (1234567.0, 3, "1,230,000"), (1234567.0, 6, "1,234,570"), (12.34, 3, "12.3"),
     (2.5, 3, "2.5"), (9.9996, 3, "10"), (-1234.5, 6, "-1,234.5"), (0.0, 3, "0"), (1e-300, 3, "0"),
     (float("nan"), 3, "n/a"), (1e20, 3, "100,000,000,000,000,000,000")],
)  # fmt: skip
def test_numbers_for_people_have_no_e_notation(value: float, digits: int, expected: str) -> None:
    assert number(value, digits) == expected


@pytest.mark.parametrize(
    ("hours", "expected"),
    [(0.0, "0 GPU-s"), (1e-9, "0.0000036 GPU-s"), (0.005, "18 GPU-s"), (0.01, "0.01 GPU-h"),
     (1234.5, "1,234.50 GPU-h")],
)  # fmt: skip
def test_gpu_time_is_in_gpu_seconds_below_a_hundredth_of_a_gpu_hour(hours: float, expected: str) -> None:
    assert gpu_time(hours) == expected


def test_ckpt_takes_a_job_instead_of_a_folder(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path
) -> None:
    from gpufleet.paths import checkpoints_dir
    from gpufleet.runtime.checkpoint import CheckpointDir

    saved, empty = one_job_home(home), one_job_home(home)
    CheckpointDir(checkpoints_dir(home, saved), keep=2).save(10, {"model": {"w": torch.ones(2)}}, loss=0.5)
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "list", "--job", str(saved), "--json")
    assert code == 0 and [c["step"] for c in json.loads(out)["checkpoints"]] == [10]
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "verify", "--job", str(saved), "--json")
    assert code == 0 and json.loads(out)["restore_step"] == 10
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "export", "--job", str(saved), "--out", str(tmp_path / "m.pt"))
    assert code == 0 and (tmp_path / "m.pt").stat().st_size > 0
    for args, needle in (
        (("list", "--job", str(empty)), f"job {empty} has no checkpoint yet"),
        (("verify", "--job", "99"), "no job 99"),
        (("list",), "give a checkpoint directory or --job ID"),
        (("list", str(tmp_path), "--job", str(saved)), "not both"),
    ):
        code, out, err = run_cli(capsys, monkeypatch, "ckpt", *args)
        assert code == 2 and out == "" and needle in err and err.count("\n") == 1, (args, err)


def test_place_takes_one_jobspec_and_the_shipped_catalogue(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = tmp_path / "one.yaml"
    spec.write_text("name: pretrain\nteam: perception\nentrypoint: m:f\nresources: {gpus: 8, gpu_type: H100}\n")
    code, out, err = run_cli(capsys, monkeypatch, "place", str(spec), "--json")
    assert code == 0, err
    assert [d["job"] for d in json.loads(out)["decisions"]] == ["pretrain"]


def test_the_shipped_catalogue_is_the_example() -> None:
    root = Path(__file__).parents[2]
    shipped = root / "gpufleet" / "placement" / "default_catalog.yaml"
    assert shipped.read_text() == (root / "examples" / "catalog.yaml").read_text()


def test_the_scheduler_log_has_no_runtime_warning(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.backends.local.process import ensure_scheduler, scheduler_pid
    from gpufleet.paths import scheduler_log

    monkeypatch.setenv("GPUFLEET_SCHEDULER_IDLE_S", "1")
    monkeypatch.setenv("PYTHONWARNINGS", "default")  # every warning printed, none hidden by a filter
    ensure_scheduler(home)
    deadline = time.monotonic() + 60
    while scheduler_pid(home) is not None and time.monotonic() < deadline:  # idle, it exits
        time.sleep(0.1)
    assert scheduler_pid(home) is None
    assert "RuntimeWarning" not in scheduler_log(home).read_text()


def test_a_table_cell_is_never_a_python_repr() -> None:
    from gpufleet.cli.render import fmt
    from gpufleet.jobs.states import Outcome

    assert fmt([Outcome.PREEMPTED, Outcome.LOST]) == "preempted, lost"
    assert fmt({"lr": 0.026512345, "batch": 32}) == "lr=0.02651 batch=32"
    assert fmt(6.63e-05) == "0.0000663" and fmt(None) == "" and fmt(True) == "yes" and fmt(False) == "no"


def test_show_writes_event_durations_and_moments_for_people(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufleet.jobs.store import Store
    from gpufleet.paths import state_db

    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path))
    job_id = one_job_home(tmp_path)
    store = Store(state_db(tmp_path))
    t0 = store.job(job_id).submitted_at
    store.add_event(job_id, "restore", attempt=1, ts=t0 + 1, step=None, seconds=6.976e-05, cause="start")
    store.add_event(job_id, "sigterm", attempt=1, ts=t0 + 2, reason="preempted", grace=30)
    store.add_event(job_id, "preemption_notice", attempt=1, ts=t0 + 3, source="aws", deadline=t0 + 123.4, lead_s=120.4)
    store.add_event(job_id, "restore", attempt=2, ts=t0 + 4, step=959, seconds=1.43, cause="start", tier="disk")
    store.add_event(job_id, "data_staged", attempt=2, ts=t0 + 5, seconds=0.05806, copy_bytes_per_s=2.5e9)
    store.add_event(job_id, "group_reformed", attempt=2, ts=t0 + 6, replaced=[1, 2], pids={"0": 4242, "1": 4343})
    store.close()

    code, out, err = run_cli(capsys, monkeypatch, "show", str(job_id))
    assert code == 0, err
    assert " seconds=0.07 ms cause=start " in out  # not 6.976e-05, no step=None
    assert "reason=preempted grace=30 s" in out
    assert "source=aws deadline=+123.4s lead_s=2m00s" in out  # a moment since submission, not a Unix time
    assert "step=959 seconds=1.4 s cause=start tier=disk" in out
    assert "seconds=58 ms copy_bytes_per_s=2,500,000,000" in out  # a rate is not a duration
    assert "replaced=1,2 pids=0:4242,1:4343" in out
    assert "None" not in out and "e-0" not in out


@pytest.mark.parametrize(("args", "named"), [(["--runs", "0"], "--runs 0"), (["--target", "nan"], "--target nan")])
def test_the_startup_bench_refuses_what_it_cannot_measure(args: list[str], named: str) -> None:
    bench = Path(__file__).parents[2] / "bench" / "cli_startup.py"
    proc = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].startswith(f"cli_startup.py: error: {named}: ")
    assert "Traceback" not in proc.stderr


def test_a_read_still_restarts_a_local_scheduler_that_died_with_jobs_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its pid file left behind is what says it died: then the local backend's sync starts a new one."""
    from gpufleet.backends import sync_remote
    from gpufleet.backends.local import process
    from gpufleet.errors import UsageError
    from gpufleet.jobs.store import Store
    from gpufleet.paths import scheduler_pid, state_db

    one_job_home(tmp_path, state="queued")
    started: list[Path] = []
    monkeypatch.setattr(process, "ensure_scheduler", started.append)
    monkeypatch.setattr(process, "scheduler_pid", lambda home: None)
    store = Store(state_db(tmp_path))
    sync_remote(tmp_path, store)  # no pid file: a scheduler that exited cleanly, or none yet
    assert started == []
    scheduler_pid(tmp_path).write_text("999999\n")
    with pytest.raises(UsageError, match="was not running"):
        sync_remote(tmp_path, store)
    assert started == [tmp_path]
