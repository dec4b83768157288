"""Optional features behind extras: the core runs without any of their libraries, each feature says which extra.

The end-to-end cases run the real command line in processes where a ``sys.meta_path`` finder refuses every
optional library (a ``sitecustomize`` on ``PYTHONPATH``, so the scheduler daemon and the job's own process
refuse them too), as on a machine where only ``pip install gpufleet`` ran.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO

from gpufleet.errors import UsageError
from gpufleet.extras import EXTRAS, missing_extra, require, required

REFUSED = ("mlflow", "optuna", "gymnasium", "fastapi", "uvicorn", "fsspec", "s3fs", "pyarrow", "ClusterShell")

REFUSER = f"""
import importlib.abc
import sys

REFUSED = {REFUSED!r}


class RefuseOptional(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ImportError(f"{{name}} is not installed here", name=name)
        return None


sys.meta_path.insert(0, RefuseOptional())
"""


# ---- require / required ------------------------------------------------------------------------


def test_require_returns_the_module_when_it_imports() -> None:
    assert require("json", "quality", "anything") is json


def test_require_names_the_extra_in_one_line() -> None:
    with pytest.raises(UsageError) as caught:
        require("gpufleet_absent_library.sub", "sweeps", "gpufleet sweep")
    assert str(caught.value) == "gpufleet sweep needs gpufleet_absent_library: pip install 'gpufleet[sweeps]'"
    assert caught.value.exit_code == 2


def test_required_block_keeps_imports_and_names_the_extra() -> None:
    with required("json", "serve", "gpufleet serve"):
        from json import dumps
    assert dumps([1]) == "[1]"
    with (
        pytest.raises(UsageError, match=r"^gpufleet serve needs gpufleet_absent_web: pip install 'gpufleet\[serve\]'$"),
        required("gpufleet_absent_web", "serve", "gpufleet serve"),
    ):
        import gpufleet_absent_web  # type: ignore[import-not-found]  # noqa: F401


def test_an_installed_library_whose_own_import_fails_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library is there but a dependency of it is not: the line says both, and reinstalling is the fix."""
    package = tmp_path / "gpufleet_half_installed"
    package.mkdir()
    (package / "__init__.py").write_text("import gpufleet_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError) as caught:
        require("gpufleet_half_installed", "data", "staging")
    assert str(caught.value) == (
        "staging needs gpufleet_half_installed: pip install 'gpufleet[data]' (gpufleet_half_installed is installed "
        "but importing it failed: No module named 'gpufleet_missing_dependency')"
    )


def test_missing_extra_without_a_cause() -> None:
    assert (
        str(missing_extra("ClusterShell.NodeSet", "slurm", "x"))
        == "x needs ClusterShell: pip install 'gpufleet[slurm]'"
    )


# ---- pyproject ---------------------------------------------------------------------------------


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def test_every_optional_library_is_in_its_extra_and_not_in_the_core() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = {_requirement_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert sorted(m for mods in EXTRAS.values() for m in mods) == sorted(REFUSED)
    for extra, modules in EXTRAS.items():
        declared = {_requirement_name(r) for r in extras[extra]}
        for module in modules:
            assert module.lower() in declared, f"extra {extra!r} does not install {module}"
            assert module.lower() not in core, f"{module} is a core dependency; it belongs to [{extra}] only"
    everything = extras["all"]
    assert everything == [f"gpufleet[{','.join(EXTRAS)}]"], everything


# ---- the command line without the optional libraries --------------------------------------------


@dataclass(frozen=True)
class Bare:
    """``gpufleet ARGS`` (its ``main``) run where every optional library is refused, in a private home."""

    home: Path
    env: dict[str, str]
    cwd: Path

    def __call__(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", "from gpufleet.cli.app import main; main()", *args]
        proc = subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=300, cwd=self.cwd)
        assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc


@pytest.fixture
def bare(tmp_path: Path) -> Bare:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(REFUSER)
    path = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": path, "GPUFLEET_HOME": str(home), "GPUFLEET_SCHEDULER_IDLE_S": "1"}
    env.update(COLUMNS="200", GPUFLEET_LOCAL_SLOTS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    return Bare(home, env, tmp_path)


def test_the_refuser_is_in_force_in_every_process(bare: Bare) -> None:
    """Without this the other cases would prove nothing: each library really fails to import there."""
    env = bare.env
    for module in REFUSED:
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, env=env)
        assert proc.returncode == 1 and f"{module} is not installed here" in proc.stderr, (module, proc.stderr)


def test_core_commands_run_a_job_without_any_optional_library(bare: Bare, tmp_path: Path) -> None:
    spec = tmp_path / "toy.yaml"
    spec.write_text(
        "name: toy\nteam: vision\nentrypoint: gpufleet.workloads.toy:train\nargs: {steps: 6, step_seconds: 0.0}\n"
        "resources: {gpu_type: cpu, gpus: 0, cpus: 1}\ncheckpoint: {every_steps: 2, grace_seconds: 10}\n"
    )
    done = json.loads(bare("submit", str(spec), "--wait", "--json").stdout)
    assert done["state"] == "completed" and done["step"] == 6, done
    jobs = json.loads(bare("jobs", "--json").stdout)["jobs"]
    assert [(j["id"], j["state"]) for j in jobs] == [(done["id"], "completed")]
    shown = json.loads(bare("show", str(done["id"]), "--json").stdout)
    assert [a["outcome"] for a in shown["attempts"]] == ["completed"]
    bare("logs", str(done["id"]))
    cost = json.loads(bare("cost", "--json").stdout)
    assert cost["teams"]["vision"]["attempts"] == 1
    pid_file = bare.home / "scheduler.pid"
    deadline = time.monotonic() + 60  # a safety net: the idle daemon exits after 1 s
    while pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def _data_spec(folder: Path) -> list[str]:
    (folder / "src").mkdir()
    (folder / "src" / "a.txt").write_text("a")
    spec = folder / "data.yaml"
    spec.write_text(
        "name: staged\nentrypoint: gpufleet.workloads.toy:train\nresources: {gpu_type: cpu, gpus: 0, cpus: 1}\n"
        f"data:\n  sources:\n    - {{source: {folder / 'src'}, dest: corpus}}\n"
    )
    return ["submit", str(spec)]


def _registry(folder: Path) -> list[str]:
    (folder / "home").mkdir()
    (folder / "home" / "mlflow.db").touch()  # a registry exists: the command goes on to open it
    return ["registry", "history", "churn"]


def _parquet(folder: Path) -> list[str]:
    for name in ("ref.parquet", "cur.parquet"):
        (folder / name).write_bytes(b"PAR1")
    return ["drift", str(folder / "ref.parquet"), str(folder / "cur.parquet")]


FEATURES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "sweep": (lambda _: ["sweep", "show", "lr-search"], "gpufleet sweep needs optuna: pip install 'gpufleet[sweeps]'"),
    "serve": (lambda _: ["serve", "--port", "0"], "gpufleet serve needs fastapi: pip install 'gpufleet[serve]'"),
    "registry": (_registry, "gpufleet's model registry needs mlflow: pip install 'gpufleet[quality]'"),
    "parquet": (_parquet, "reading Parquet needs pyarrow: pip install 'gpufleet[quality]'"),
    "data": (_data_spec, "staging a job's data sources needs fsspec: pip install 'gpufleet[data]'"),
    "slurm-hostlist": (
        lambda _: ["slurm", "topology", str(REPO / "examples" / "slurm-fleet.yaml")],
        "reading Slurm hostlists needs ClusterShell: pip install 'gpufleet[slurm]'",
    ),
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_an_optional_feature_names_its_extra_in_one_line(bare: Bare, tmp_path: Path, feature: str) -> None:
    make_args, line = FEATURES[feature]
    proc = bare(*make_args(tmp_path), code=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0].endswith(line), proc.stderr
    assert not (bare.home / "state.db").exists(), "a refused command wrote the state database"
