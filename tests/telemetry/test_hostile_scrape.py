"""Scrapes shaped to blow up the dense series x time arrays the diagnosis rules work on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from gpufleet.errors import UsageError
from gpufleet.telemetry.dcgm import Sample
from gpufleet.telemetry.diagnose import (
    GPU_UTIL,
    MAX_GPU_SERIES,
    MAX_SERIES_CELLS,
    _longest_runs,
    series_from_samples,
)


def staggered(n: int) -> list[Sample]:
    """``n`` GPUs, each scraped once at its own millisecond: n x n cells if aligned densely."""
    return [Sample(GPU_UTIL, {"gpu": str(i), "UUID": f"u{i}"}, 1.0, 1_796_000_000_000 + i) for i in range(n)]


def test_twenty_thousand_staggered_gpus_are_refused_not_allocated() -> None:
    with pytest.raises(UsageError, match=f"more than {MAX_GPU_SERIES} GPU series"):
        series_from_samples(staggered(20_000))


def test_too_many_cells_are_refused_before_allocating() -> None:
    n = int(MAX_SERIES_CELLS**0.5) + 1
    assert n <= MAX_GPU_SERIES
    with pytest.raises(UsageError, match=r"sample times is .* values, more than"):
        series_from_samples(staggered(n))


def test_an_ordinary_scrape_still_makes_series() -> None:
    series = series_from_samples(staggered(100))
    assert series.metrics[GPU_UTIL].shape == (100, 100)


def test_the_cli_exits_2_on_the_staggered_scrape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "scrape.prom"
    path.write_text("".join(f'{GPU_UTIL}{{gpu="{i}",UUID="u{i}"}} 1 {1_796_000_000_000 + i}\n' for i in range(20_000)))
    code, _, err = run_cli(capsys, monkeypatch, "observe", "diagnose", str(path))
    assert code == 2, err
    assert f"more than {MAX_GPU_SERIES} GPU series" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("seed", range(5))
def test_longest_runs_matches_a_plain_loop(seed: int) -> None:
    mask = np.random.default_rng(seed).random((4, 50)) < 0.6
    expected = []
    for row in mask:
        best = run = 0
        for v in row:
            run = run + 1 if v else 0
            best = max(best, run)
        expected.append(best)
    assert _longest_runs(mask).tolist() == expected
    assert _longest_runs(np.zeros((3, 0), dtype=bool)).tolist() == [0, 0, 0]
