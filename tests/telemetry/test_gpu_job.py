"""A job's own GPU series: sampled while it trains, served beside its metrics, recorded, diagnosed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpufleet.runtime import TrainSession
from gpufleet.telemetry import parse_exposition
from gpufleet.telemetry.gpu import job_gpu_samples
from gpufleet.workloads import tinylm
from gpufleet.workloads.tinylm import TINY

GPUFLEET = [sys.executable, "-m", "gpufleet.cli"]


def test_a_training_job_serves_and_records_its_synthetic_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = {
        "name": "lm",
        "team": "vision",
        "entrypoint": "gpufleet.workloads.tinylm:train",
        "resources": {"gpus": 2, "gpu_type": "H100"},
        "telemetry": {"gpu_source": "synthetic:tensor_idle", "sample_seconds": 0.05},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    for key, value in {
        "GPUFLEET_SPEC": str(tmp_path / "spec.json"),
        "GPUFLEET_CKPT_DIR": str(tmp_path / "ckpt"),
        "GPUFLEET_JOB_DIR": str(tmp_path),
        "GPUFLEET_EVENTS": str(tmp_path / "events.jsonl"),
        "GPUFLEET_JOB_ID": "7",
        "GPUFLEET_METRICS_PORT": "0",
    }.items():
        monkeypatch.setenv(key, value)
    seen: dict[str, Any] = {}

    def on_step(sess: TrainSession) -> None:
        if sess.step == 6:
            port = (tmp_path / "metrics.port").read_text()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                seen["page"] = resp.read().decode()

    tinylm.train(**{**TINY, "steps": 8}, on_step=on_step)
    scrape = parse_exposition(seen["page"])
    tensor = [s for s in scrape.samples if s.name == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
    assert sorted(s.labels["gpu"] for s in tensor) == ["0", "1"]
    assert all(s.labels["hpc_job"] == "7" and s.value < 0.1 for s in tensor)  # tensor cores idle
    assert any(s.name == "gpufleet_job_step" for s in scrape.samples)
    held = [s for s in scrape.samples if s.name == "gpufleet_job_gpus"]
    assert [s.value for s in held] == [2.0]
    recorded = job_gpu_samples(tmp_path)
    assert recorded and {s.labels["attempt"] for s in recorded} == {"1"}
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "gpu_source" and e["source"] == "synthetic:tensor_idle" for e in events)


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFLEET_HOME": str(home), "GPUFLEET_SCHEDULER_IDLE_S": "1", "COLUMNS": "200"}
    return subprocess.run([*GPUFLEET, *args], capture_output=True, text=True, env=env, timeout=180)


def test_gpufleet_diagnose_job_finds_the_pattern_the_job_ran_with(home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: toy\nentrypoint: gpufleet.workloads.toy:train\nargs: {steps: 40, step_seconds: 0.05}\n"
        "resources: {gpus: 1, gpu_type: H100}\ntelemetry: {sample_seconds: 0.1, precision: bf16}\n"
    )
    done = run(home, "submit", str(spec), "--gpu-source", "synthetic:memory_bound", "--wait")
    assert done.returncode == 0, done.stderr
    proc = run(home, "diagnose", "1", "--window", "0.5", "--min-duration", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert [f["rule_id"] for f in found["findings"]] == ["memory_bandwidth_bound"]
    assert found["findings"][0]["observed"] >= 0.8
    # With the default 5-minute spans a 2-second job has no finding, and the command says why.
    proc = run(home, "diagnose", "1")
    assert proc.returncode == 0 and "no finding" in proc.stdout and "--min-duration" in proc.stdout


def test_gpufleet_diagnose_a_job_without_gpu_series_has_nothing_to_diagnose(home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: toy\nentrypoint: gpufleet.workloads.toy:train\nargs: {steps: 3}\nresources: {gpus: 0}\n")
    assert run(home, "submit", str(spec), "--wait").returncode == 0
    proc = run(home, "diagnose", "1")
    assert proc.returncode == 0 and proc.stdout.startswith("nothing to diagnose: job 1 has no GPU series (")
    assert "Traceback" not in proc.stderr
    proc = run(home, "submit", str(spec), "--gpu-source", "synthetic:nope")
    assert proc.returncode == 2 and "unknown synthetic GPU pattern 'nope'" in proc.stderr
