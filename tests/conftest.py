from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.backends.slurm import slurm_env


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private $GPUFLEET_HOME for one test."""
    path = tmp_path / "home"
    monkeypatch.setenv("GPUFLEET_HOME", str(path))
    monkeypatch.delenv("GPUFLEET_LOCAL_SLOTS", raising=False)
    yield path


def slurm_is_up() -> str | None:
    """``None`` when a Slurm controller answers, else why not."""
    env = slurm_env()
    if "SLURM_CONF" not in env:
        return "no SLURM_CONF and no .dev/slurm/slurm.conf"
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"sinfo failed: {err}"
    if proc.returncode != 0:
        return proc.stderr.strip() or "sinfo failed"
    return None


@pytest.fixture(scope="session")
def slurm() -> dict[str, str]:
    """The environment of a running Slurm cluster; fails under CI, skips elsewhere, when there is none."""
    problem = slurm_is_up()
    if problem is not None:
        message = f"Slurm is not running ({problem}); start it with `scripts/dev-slurm up`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return slurm_env()
