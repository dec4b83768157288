from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private $GPUFLEET_HOME for one test."""
    path = tmp_path / "home"
    monkeypatch.setenv("GPUFLEET_HOME", str(path))
    monkeypatch.delenv("GPUFLEET_LOCAL_SLOTS", raising=False)
    yield path
