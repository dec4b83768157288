"""``gpufleet cost`` on a real local job: the goodput buckets in the JSON, the column and ``--buckets`` tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import drive, run_cli

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.cost.ledger import GOODPUT_BUCKETS
from gpufleet.spec import parse_spec

SPEC = {
    "name": "toy",
    "team": "vision",
    "entrypoint": "gpufleet.workloads.toy:train",
    "args": {"steps": 30, "step_seconds": 0.01},
    "resources": {"gpu_type": "L4"},
    "spot": True,
}


def check_row(row: dict[str, Any]) -> None:
    """One ledger row: the buckets add up to its GPU-seconds, which are its billed GPU time."""
    buckets = row["buckets"]
    assert list(buckets) == list(GOODPUT_BUCKETS) and min(buckets.values()) >= 0.0
    assert math.fsum(buckets.values()) == pytest.approx(row["gpu_seconds"], abs=1e-6)
    assert row["gpu_seconds"] == pytest.approx(row["gpu_hours"] * 3600.0, rel=1e-5)
    assert buckets["compute"] > 0 and row["goodput"] == pytest.approx(buckets["compute"] / row["gpu_seconds"], abs=1e-6)
    top = row["badput_top"]
    assert 0 < len(top) <= 3 and all(t["bucket"] != "compute" and t["gpu_seconds"] > 0 for t in top)
    assert [t["gpu_seconds"] for t in top] == sorted((t["gpu_seconds"] for t in top), reverse=True)


def test_cost_json_and_buckets_on_a_real_job(
    local: tuple[LocalBackend, LocalScheduler],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    backend, scheduler = local
    job = backend.submit(parse_spec(SPEC))
    drive(scheduler, lambda: backend.store.job(job).state == "completed")

    code, out, _ = run_cli(capsys, monkeypatch, "cost", "--json")
    assert code == 0
    report = json.loads(out)
    (row,) = report["jobs"]
    for each in (row, report["teams"]["vision"], report["total"]):
        check_row(each)
    assert row["buckets"]["startup"] > 0  # a real process imports torch before its first step
    code, with_buckets, _ = run_cli(capsys, monkeypatch, "cost", "--json", "--buckets")
    assert code == 0 and json.loads(with_buckets) == report

    monkeypatch.setenv("COLUMNS", "200")
    code, text, _ = run_cli(capsys, monkeypatch, "cost")
    assert code == 0 and "goodput" in text and f"{row['goodput']:.0%}" in text and "straggler_wait" not in text
    code, text, _ = run_cli(capsys, monkeypatch, "cost", "--buckets")
    assert code == 0
    assert f"#{job} toy: goodput {row['goodput']:.1%}" in text and "team vision: goodput" in text
    for bucket in GOODPUT_BUCKETS:
        assert text.count(f" {bucket} ") >= 2, bucket  # a row in the job's table and in the team's
