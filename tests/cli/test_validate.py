"""``gpufleet validate`` and ``submit --dry-run``: a spec checked as submit would, nothing written; and the
entrypoint checks submit now runs (a misspelled script is refused before it is queued)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.jobs.preflight import entrypoint_problem, entrypoint_warning
from gpufleet.spec import load_spec

GPUFLEET = [sys.executable, "-m", "gpufleet.cli"]


def run(home: Path, *args: str, check: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFLEET_HOME": str(home), "COLUMNS": "200"}
    proc = subprocess.run([*GPUFLEET, *args], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def spec(folder: Path, entrypoint: str, **extra: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text("print('training')\n")
    path = folder / "job.yaml"
    path.write_text(f"name: job\nentrypoint: {entrypoint}\n" + "".join(f"{k}: {v}\n" for k, v in extra.items()))
    return path


def test_a_valid_spec_prints_what_would_run_and_writes_nothing(home: Path, tmp_path: Path) -> None:
    path = spec(tmp_path / "w", "python train.py --lr 0.1")
    plan = json.loads(run(home, "validate", str(path), "--json", check=0).stdout)
    assert plan["valid"] is True and plan["name"] == "job" and plan["backend"] == "local"
    assert plan["command"].endswith("train.py --lr 0.1") and plan["workdir"] == str(tmp_path / "w")
    assert plan["checks"] == ["spec", "entrypoint", "local backend"] and plan["warnings"] == []
    text = run(home, "submit", "--dry-run", str(path), check=0).stdout
    assert "valid: job (team default) would run on the local backend" in text
    assert "checks passed: spec, entrypoint, local backend" in text
    assert not home.exists()  # neither command created the home, let alone a store


def test_a_misspelled_script_is_refused_with_the_close_name(home: Path, tmp_path: Path) -> None:
    path = spec(tmp_path / "w", "python trian.py")
    for args in (("validate", str(path)), ("submit", str(path)), ("submit", "--dry-run", str(path))):
        proc = run(home, *args, check=2)
        assert proc.stderr.strip().splitlines() == [
            f"error: {path}: entrypoint: script 'trian.py' not found in {tmp_path / 'w'} (did you mean 'train.py'?)"
        ]
    assert not home.exists()


def test_on_a_cluster_backend_a_missing_script_is_only_a_warning(home: Path, tmp_path: Path) -> None:
    path = spec(tmp_path / "w", "python trian.py")
    proc = run(home, "validate", str(path), "--backend", "slurm", check=0)
    assert "warning: entrypoint: script 'trian.py' not found" in proc.stderr
    assert "the job runs where the slurm backend starts it" in proc.stderr


@pytest.mark.parametrize(
    ("entrypoint", "problem"),
    [
        ("python train.py", None),
        ("python -u -W ignore train.py", None),
        ("python -u -W ignore tran.py", "script 'tran.py' not found"),
        ("python -c 'print(1)'", None),
        ("python -m train", None),
        ("python -m trainer.main", "module 'trainer' not found"),
        ("gpufleet.workloads.toy:train", None),
        ("nosuchpkg.mod:train", "module 'nosuchpkg' not found"),
        ("train.py", "run as a program, looked up on PATH: write 'python train.py'"),
        ("./train.py", "not executable: write 'python ./train.py', or chmod +x it"),
        ("./nope.sh", "script './nope.sh' not found"),
        ("sh -c true", None),
        ("no-such-program-here --x", "program 'no-such-program-here' is not on PATH"),
    ],
)
def test_entrypoint_checks(tmp_path: Path, entrypoint: str, problem: str | None) -> None:
    found = entrypoint_problem(load_spec(spec(tmp_path, f'"{entrypoint}"')))
    assert (found is None) if problem is None else (found is not None and problem in found), found


def test_an_executable_script_runs_as_a_program(tmp_path: Path) -> None:
    path = spec(tmp_path, '"./train.py"')
    (tmp_path / "train.py").chmod(0o755)
    assert entrypoint_problem(load_spec(path)) is None


def test_a_module_is_found_without_importing_it(tmp_path: Path) -> None:
    """A package whose ``__init__`` would fail is still found: nothing of the user's runs at submission."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("raise SystemExit('imported at submission')\n")
    path = spec(tmp_path, "mypkg.train:main", workdir=str(tmp_path))
    assert entrypoint_problem(load_spec(path)) is None
    assert "mypkg" not in sys.modules


def test_a_module_in_the_current_folder_alone_is_a_warning_to_set_workdir(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a workdir a ``module:function`` runs in the scheduler's folder, not necessarily this one."""
    (tmp_path / "mymod.py").write_text("def main():\n    pass\n")
    path = spec(tmp_path, "mymod:main")
    monkeypatch.chdir(tmp_path)
    loaded = load_spec(path)
    assert entrypoint_problem(loaded) is None  # it starts when this shell starts the scheduler
    warning = entrypoint_warning(loaded)
    assert warning is not None and f"module 'mymod' is in {tmp_path}" in warning and "set workdir" in warning
    proc = subprocess.run(
        [*GPUFLEET, "validate", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "GPUFLEET_HOME": str(home), "COLUMNS": "200"},
        timeout=120,
    )
    assert proc.returncode == 0 and "checks passed: spec, entrypoint (warning), local backend" in proc.stdout
    assert proc.stderr.startswith("warning: entrypoint: module 'mymod' is in ")
    assert entrypoint_warning(load_spec(spec(tmp_path, "mymod:main", workdir="."))) is None
    assert entrypoint_warning(load_spec(spec(tmp_path, "gpufleet.workloads.toy:train"))) is None


class _EditableFinder(importlib.abc.MetaPathFinder):
    """What ``pip install -e`` with setuptools puts on ``sys.meta_path``: a finder outside every folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "editablepkg":
            return None
        return importlib.util.spec_from_file_location(fullname, self.folder / "editablepkg" / "__init__.py")


def test_a_package_installed_in_editable_mode_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "src"
    (source / "editablepkg").mkdir(parents=True)
    (source / "editablepkg" / "__init__.py").write_text("raise SystemExit('imported at submission')\n")
    path = spec(tmp_path / "job", "editablepkg.train:main")
    assert entrypoint_problem(load_spec(path)) is not None  # not on any folder of the path
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, _EditableFinder(source)])
    assert entrypoint_problem(load_spec(path)) is None
    assert "editablepkg" not in sys.modules
