"""`gpufleet bench stage`: a cold staging against the source read rate and fio's write (real fio, real S3 server)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import S3, assert_refused, run_cli, service_missing, shards


def test_bench_stage_reports_the_three_rates_and_leaves_nothing(
    s3: S3, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("fio") is None:
        service_missing("fio is not installed: `make tools` (apt-get install fio)")
    s3.client.create_bucket(Bucket="bench-corpus")
    for name, body in shards(6, 400_000, seed=5).items():
        s3.put("bench-corpus", f"s/{name}", body)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: b\nentrypoint: m:f\n"
        f"data: {{sources: [{{source: 's3://bench-corpus/s', dest: s, endpoint_url: '{s3.endpoint}'}}]}}\n"
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    args = ("bench", "stage", str(spec), "--dir", str(scratch), "--disk-size", "8MiB", "--disk-runtime", "0.5")
    code, out, err = run_cli(capsys, monkeypatch, *args, "--json")
    assert code == 0, err
    found: dict[str, Any] = json.loads(out)
    assert found["stage"]["files_copied"] == 6 and found["stage"]["bytes_copied"] == 6 * 400_000
    assert found["source_read_bytes_per_s"] > 0 and found["disk_write_bytes_per_s"] > 0
    slower = min(found["source_read_bytes_per_s"], found["disk_write_bytes_per_s"])
    assert found["ratio_to_slower_path"] == pytest.approx(found["stage_bytes_per_s"] / slower)
    assert list(scratch.iterdir()) == []  # the staged copy and fio's file are gone

    code, out, err = run_cli(capsys, monkeypatch, *args)
    assert code == 0, err
    assert "stage-in ran at" in out and "of the source's read rate" in out


def test_bench_stage_refuses_a_spec_without_data(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: b\nentrypoint: m:f\n")
    code, _, err = run_cli(capsys, monkeypatch, "bench", "stage", str(spec))
    assert_refused(code, err, home, "no `data` block")
