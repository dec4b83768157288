"""`gpufleet observe diagnose|rules|dashboard` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.telemetry import SyntheticJobConfig, generate_samples, render_exposition


def observe(*args: str, check: int = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "observe", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == check, (proc.stdout, proc.stderr)
    return proc


@pytest.mark.parametrize(("pattern", "rule"), [("healthy", None), ("tensor_idle", "tensor_idle"), ("idle", "gpu_idle")])
def test_diagnose_synthetic_patterns(pattern: str, rule: str | None) -> None:
    out = json.loads(observe("diagnose", "--pattern", pattern, "--gpus", "2", "--minutes", "70", "--json").stdout)
    assert [f["rule_id"] for f in out["findings"]] == ([rule] if rule else [])


def test_diagnose_scrapes_and_tolerates_garbage(tmp_path: Path) -> None:
    samples = generate_samples(SyntheticJobConfig(pattern="memory_bound", gpus=1, duration_s=400))
    (tmp_path / "a.prom").write_text(render_exposition(samples) + "broken{{ line\n")
    out = json.loads(observe("diagnose", str(tmp_path / "a.prom"), "--json").stdout)
    assert [f["rule_id"] for f in out["findings"]] == ["memory_bandwidth_bound"]
    assert any("skipped" in w for w in out["warnings"])


def test_bad_inputs_exit_2() -> None:
    for args in (("diagnose", "--pattern", "nope"), ("diagnose",), ("diagnose", "/nonexistent.prom")):
        proc = observe(*args, check=2)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_rules_and_dashboard_files(tmp_path: Path) -> None:
    observe("rules", "--out", str(tmp_path / "rules.yml"))
    observe("dashboard", "--out", str(tmp_path / "dash.json"))
    assert "groups:" in (tmp_path / "rules.yml").read_text()
    assert json.loads((tmp_path / "dash.json").read_text())["panels"]
