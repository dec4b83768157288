"""The straggler alert fires on a rank whose compute or data wait is far over its job's median, and only then.

``promtool test rules`` evaluates the generated rules over hand-made series of
``gpufleet_rank_phase_seconds``: one job with a slow rank (fires once it has lasted 5 minutes), and
series that must not fire (even ranks; a 5x data wait too small to cost anything).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from conftest import service_missing

from gpufleet.telemetry.metrics import LABELS
from gpufleet.telemetry.rules import RANK_PHASE, rules_yaml

SUMMARY = (
    "Rank {rank} on {host} holds job {job} up: its {phase} takes over 1.5x the median of the job's ranks a step "
    "(gpufleet diagnose JOB names the tax)"
)


def labels(job: str, rank: int, phase: str) -> dict[str, str]:
    base = dict.fromkeys(LABELS, "")
    base.update(job_id=job, job_name=f"job{job}", team="ml", attempt="1", backend="local", gpu_type="H100")
    base.update(backend_job_id=f"local-{job}", provider="local")
    return {**base, "rank": str(rank), "host": f"node-{rank}", "phase": phase}


def series(job: str, rank: int, phase: str, value: float) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in labels(job, rank, phase).items())
    return {"series": f"{RANK_PHASE}{{{text}}}", "values": f"{value}x20"}


def unit_test() -> dict[str, Any]:
    inputs = [
        # job 7: rank 1 computes 4x slower than ranks 0 and 2; their data waits are even
        *(series("7", r, "compute", 0.4 if r == 1 else 0.1) for r in range(3)),
        *(series("7", r, "data_wait", 0.02) for r in range(3)),
        # job 8: ranks within 1.2x of each other, and a data wait 5x the others' but of 0.5 ms a step
        *(series("8", r, "compute", v) for r, v in enumerate((0.10, 0.12, 0.11))),
        *(series("8", r, "data_wait", 0.0005 if r == 2 else 0.0001) for r in range(3)),
    ]
    fired = {
        "exp_labels": {**labels("7", 1, "compute"), "severity": "warning"},
        "exp_annotations": {
            "summary": SUMMARY.format(rank=1, host="node-1", job=7, phase="compute"),
            "source": "gpufleet runtime: per-rank phase times",
        },
    }
    return {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": [
                    {"eval_time": "3m", "alertname": "JobRankStraggler", "exp_alerts": []},  # pending, not 5 min yet
                    {"eval_time": "10m", "alertname": "JobRankStraggler", "exp_alerts": [fired]},
                ],
            }
        ],
    }


def test_the_straggler_alert_fires_for_the_slow_rank_only(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        service_missing("promtool is missing: `scripts/dev-prometheus up` installs Prometheus")
    (tmp_path / "rules.yml").write_text(rules_yaml())
    (tmp_path / "test.yml").write_text(yaml.safe_dump(unit_test(), sort_keys=False))
    proc = subprocess.run(
        [promtool, "test", "rules", "test.yml"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_rule_that_never_fires_fails_the_test(tmp_path: Path) -> None:
    """The check above can fail: with the slow rank as fast as the others, promtool reports the missing alert."""
    promtool = shutil.which("promtool")
    if promtool is None:
        service_missing("promtool is missing: `scripts/dev-prometheus up` installs Prometheus")
    doc = unit_test()
    for item in doc["tests"][0]["input_series"]:
        item["values"] = item["values"].replace("0.4x", "0.1x")
    (tmp_path / "rules.yml").write_text(rules_yaml())
    (tmp_path / "test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run(
        [promtool, "test", "rules", "test.yml"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode != 0 and "JobRankStraggler" in proc.stdout + proc.stderr
