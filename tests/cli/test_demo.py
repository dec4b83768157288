"""The headline job, exactly as `make demo` runs it (with an injected NaN)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(400)
def test_demo_preempts_resumes_rolls_back_and_prices(home: Path) -> None:
    env = {**os.environ, "GPUFLEET_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "demo", "--fault", "nan@170", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=380,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] is True
    jobs = {j["name"]: j for j in result["jobs"]}
    assert jobs["tinylm-perception"]["attempts"] == 2 and jobs["tinylm-planning"]["attempts"] == 1
    perception = result["teams"]["perception"]
    assert perception["preemptions"] == 1
    assert perception["steps_redone"] == 11  # NaN on batch 170: back to step 160, steps 161..171 redone
    assert perception["lost_gpu_hours"] > 0 and perception["money"] > 0
    assert result["teams"]["planning"]["preemptions"] == 0
    note = result["note"]
    markdown = Path(note["markdown"]).read_text()
    assert "preempted" in markdown and "perception" in markdown and "planning" in markdown
    assert Path(note["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(Path(note["json"]).read_text())["total"]["money"] == result["total"]["money"]
