"""Generated Prometheus rules and Grafana dashboard: well-formed, and accepted by promtool."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml
from conftest import service_missing

from gpufleet.telemetry.rules import CLOCK_BITS, dashboard_json, rules_yaml


def test_rules_cover_the_dcgm_patterns_and_clock_bits() -> None:
    doc = yaml.safe_load(rules_yaml())
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    for name in ("GpuIneffectiveUse", "GpuTensorCoresIdle", "GpuMemoryBandwidthBound", "GpuOomRisk", "GpuIdle"):
        assert name in alerts and alerts[name]["annotations"]["source"]
    for bit, (_, value) in CLOCK_BITS.items():
        assert f"/ {value}) % 2 == 1" in alerts[f"GpuClockEvent{bit}"]["expr"]
    records = [r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r]
    assert len(records) == len(set(records))


def test_dashboard_panels_use_recorded_series() -> None:
    board = json.loads(dashboard_json())
    records = {r["record"] for g in yaml.safe_load(rules_yaml())["groups"] for r in g["rules"] if "record" in r}
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert exprs and all(e in records for e in exprs)
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    assert "gpufleet:rank_phase_seconds:avg5m" in exprs  # where each rank's step time goes


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        service_missing("promtool is missing: `scripts/dev-prometheus up` installs Prometheus")
    path = tmp_path / "rules.yml"
    path.write_text(rules_yaml())
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
