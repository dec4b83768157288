"""A real training job, scraped by the real Prometheus: it registers itself, and PromQL sees its steps."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.runtime import TrainSession
from gpufleet.workloads import tinylm
from gpufleet.workloads.tinylm import TINY


@pytest.mark.timeout(120)
def test_training_job_is_scraped_and_deregistered(
    prometheus_targets: Path,
    promql: Callable[[str], list[dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"promjob{os.getpid()}"
    spec = {"name": name, "team": "vision", "entrypoint": "gpufleet.workloads.tinylm:train"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    targets = prometheus_targets
    for key, value in {
        "GPUFLEET_SPEC": str(tmp_path / "spec.json"),
        "GPUFLEET_CKPT_DIR": str(tmp_path / "ckpt"),
        "GPUFLEET_JOB_DIR": str(tmp_path),
        "GPUFLEET_JOB_ID": "1",
        "GPUFLEET_JOB_NAME": name,
        "GPUFLEET_TEAM": "vision",
        "GPUFLEET_METRICS_PORT": "0",
        "GPUFLEET_PROMETHEUS_TARGETS": str(targets),
        "GPUFLEET_LOG_EVERY_S": "0",
    }.items():
        monkeypatch.setenv(key, value)
    seen: dict[str, Any] = {}

    def on_step(sess: TrainSession) -> None:
        if sess.step != 10:
            return
        assert list(targets.glob(f"gpufleet-job-1-1-{os.getpid()}.json"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # training waits here while Prometheus scrapes it
            found = promql(f'gpufleet_job_step{{job_name="{name}"}}')
            if found and float(found[0]["value"][1]) >= 10:
                seen["series"] = found[0]
                return
            time.sleep(0.5)

    tinylm.train(**{**TINY, "steps": 15}, on_step=on_step)
    assert "series" in seen, "Prometheus never scraped the job"
    labels = seen["series"]["metric"]
    assert labels["team"] == "vision" and labels["job_id"] == "1" and labels["job"] == "gpufleet"
    assert not list(targets.glob(f"gpufleet-job-1-1-{os.getpid()}.json"))  # removed at session end
