"""``scripts/check-python-floor``: code that needs a newer Python than requires-python says fails the check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

SCRIPT = REPO / "scripts" / "check-python-floor"


def project(tmp_path: Path, code: str, floor: str = "3.11", mypy: str | None = None) -> Path:
    """A project whose requires-python is ``>=floor`` and whose package holds ``code``."""
    (tmp_path / "pyproject.toml").write_text(
        f'[project]\nname = "probe"\nrequires-python = ">={floor}"\n\n[tool.mypy]\npython_version = "{mypy or floor}"\n'
    )
    (tmp_path / "gpufleet").mkdir()
    (tmp_path / "gpufleet" / "probe.py").write_text(code)
    return tmp_path


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True, timeout=120
    )


def test_code_within_the_floor_passes(tmp_path: Path) -> None:
    proc = check(project(tmp_path, "import enum\n\n\nclass Kind(enum.StrEnum):\n    A = 'a'\n"))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("code", "named"),
    [
        pytest.param(
            "import itertools\n\nPAIRS = list(itertools.batched([1, 2, 3], 2))\n", "itertools.batched", id="3.12-member"
        ),
        pytest.param("def first[T](items: list[T]) -> T:\n    return items[0]\n", "probe.py:1", id="3.12-syntax"),
    ],
)
def test_code_newer_than_the_floor_fails(tmp_path: Path, code: str, named: str) -> None:
    proc = check(project(tmp_path, code))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert named in proc.stdout + proc.stderr


def test_a_floor_below_what_the_code_needs_fails(tmp_path: Path) -> None:
    """``enum.StrEnum`` (3.11) under ``requires-python = ">=3.10"``: the floor is raised, or the code changed."""
    proc = check(project(tmp_path, "from enum import StrEnum\n", floor="3.10"))
    assert proc.returncode == 1 and "enum.StrEnum" in proc.stdout, (proc.stdout, proc.stderr)


def test_mypy_checking_another_version_than_the_floor_fails(tmp_path: Path) -> None:
    proc = check(project(tmp_path, "X = 1\n", mypy="3.12"))
    assert proc.returncode == 1
    assert "[tool.mypy] python_version is '3.12', requires-python >=3.11" in proc.stderr


def test_a_floor_that_is_not_a_lower_bound_is_refused(tmp_path: Path) -> None:
    root = project(tmp_path, "X = 1\n")
    (root / "pyproject.toml").write_text('[project]\nname = "probe"\nrequires-python = "~=3.11"\n')
    proc = check(root)
    assert proc.returncode == 2 and "write it as '>=3.N'" in proc.stderr, proc.stderr
