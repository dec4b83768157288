"""Job metrics: fed by runtime events, served over HTTP on loopback, or written for a textfile collector."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpufleet.runtime import TrainSession
from gpufleet.telemetry.metrics import JobMetrics
from gpufleet.workloads import tinylm
from gpufleet.workloads.tinylm import TINY

LABELS = {
    "job_id": "7",
    "job_name": "lm",
    "team": "perception",
    "attempt": "2",
    "backend": "slurm",
    "backend_job_id": "4242",
    "gpu_type": "A100",
    "provider": "local",
}


def value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in exposition")


def test_events_update_metrics() -> None:
    metrics = JobMetrics(LABELS)
    metrics({"kind": "restore", "step": 10})
    metrics({"kind": "step", "step": 12, "loss": 2.5, "tokens_per_s": 1000.0, "mfu": 0.42})
    metrics({"kind": "checkpoint", "step": 12, "seconds": 0.2, "bytes": 4096})
    metrics({"kind": "preempt_signal", "step": 12})
    metrics({"kind": "rollback", "from_step": 12, "to_step": 10})
    text = metrics.exposition().decode()
    assert value(text, "gpufleet_job_step") == 12 and value(text, "gpufleet_job_loss") == 2.5
    assert value(text, "gpufleet_job_mfu") == 0.42 and value(text, "gpufleet_job_restarts") == 1
    assert value(text, "gpufleet_job_restores_total") == 1 and value(text, "gpufleet_job_preemptions_total") == 1
    assert value(text, "gpufleet_checkpoint_save_seconds_count") == 1
    assert 'team="perception"' in text and 'backend_job_id="4242"' in text and ' job="' not in text


def test_http_endpoint_on_loopback_during_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = {"name": "lm", "team": "vision", "entrypoint": "gpufleet.workloads.tinylm:train"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    for key, val in {
        "GPUFLEET_SPEC": str(tmp_path / "spec.json"),
        "GPUFLEET_CKPT_DIR": str(tmp_path / "ckpt"),
        "GPUFLEET_JOB_DIR": str(tmp_path),
        "GPUFLEET_TEAM": "vision",
        "GPUFLEET_METRICS_PORT": "0",
        "GPUFLEET_LOG_EVERY_S": "0",
        "GPUFLEET_METRICS_TEXTFILE": str(tmp_path / "job.prom"),
    }.items():
        monkeypatch.setenv(key, val)
    scraped: dict[str, Any] = {}

    def on_step(sess: TrainSession) -> None:
        if sess.step == 5:
            port = int((tmp_path / "metrics.port").read_text())
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                scraped["text"] = response.read().decode()

    tinylm.train(**{**TINY, "steps": 8}, on_step=on_step)
    assert value(scraped["text"], "gpufleet_job_step") == 5
    assert 'team="vision"' in scraped["text"]
    textfile = (tmp_path / "job.prom").read_text()
    assert value(textfile, "gpufleet_job_step") == 8


def test_rl_events_export_rl_gauges_and_other_jobs_export_none() -> None:
    metrics = JobMetrics(LABELS)
    metrics({"kind": "step", "step": 3, "loss": 1.0})
    assert "gpufleet_rl_" not in metrics.exposition().decode()
    metrics({"kind": "rl", "actor_kind": "ray", "actor_pids": [5, 6], "actor_restarts": 0})
    metrics(
        {
            "kind": "rl",
            "env_steps": 4096,
            "env_steps_per_s": 630.5,
            "updates_per_s": 547.0,
            "sample_reuse": 55.5,
            "policy_lag": 424.0,
            "buffer_fill": 0.25,
            "mean_return_100": 21.75,
            "actor_restarts": 1,
        }
    )
    text = metrics.exposition().decode()
    assert value(text, "gpufleet_rl_env_steps_per_second") == 630.5
    assert value(text, "gpufleet_rl_updates_per_second") == 547.0
    assert value(text, "gpufleet_rl_sample_reuse") == 55.5 and value(text, "gpufleet_rl_policy_lag") == 424.0
    assert value(text, "gpufleet_rl_buffer_fill") == 0.25 and value(text, "gpufleet_rl_episode_return") == 21.75
    assert value(text, "gpufleet_rl_env_steps") == 4096 and value(text, "gpufleet_rl_actor_restarts") == 1
