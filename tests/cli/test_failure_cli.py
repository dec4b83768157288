"""Why a job failed, where people look (``submit --wait``, ``show``, ``jobs``), and what a preempted log ends with."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GPUFLEET = [sys.executable, "-m", "gpufleet.cli"]

BOOM = """for step in range(100):
    print(f"step {step} loss 1.0", flush=True)
    if step == 80:
        try:
            raise ValueError("inner")
        except ValueError as err:
            raise RuntimeError("boom at step 80") from err
"""


def run(home: Path, *args: str, check: int = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFLEET_HOME": str(home), "GPUFLEET_SCHEDULER_IDLE_S": "1", "COLUMNS": "200"}
    proc = subprocess.run([*GPUFLEET, *args], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def test_a_failed_job_says_why_in_submit_show_and_jobs(home: Path, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(BOOM)
    spec = tmp_path / "boom.yaml"
    spec.write_text("name: boom\nentrypoint: python train.py\n")
    waited = run(home, "submit", str(spec), "--wait", check=1)
    assert waited.stdout.splitlines()[-1] == (
        "job 1 failed (exit code 1): RuntimeError: boom at step 80 — see `gpufleet logs 1`"
    )
    shown = run(home, "show", "1").stdout.splitlines()
    assert shown[1] == "failed because: RuntimeError: boom at step 80 (attempt 1, exit code 1, see `gpufleet logs 1`)"
    expected = {"attempt": 1, "exit": "exit code 1", "line": "RuntimeError: boom at step 80", "hint": "gpufleet logs 1"}
    assert json.loads(run(home, "show", "1", "--json").stdout)["failure"] == expected
    assert json.loads(run(home, "jobs", "--json").stdout)["jobs"][0]["failure"] == expected
    assert "exit code 1: RuntimeError: boom at step 80" in run(home, "jobs").stdout


def test_an_empty_home_says_how_to_submit(home: Path) -> None:
    assert run(home, "jobs").stdout.strip() == "no jobs yet: submit one with `gpufleet submit SPEC` (see examples/)"
    assert json.loads(run(home, "jobs", "--json").stdout) == {"jobs": [], "total": 0, "limit": 50, "offset": 0}
    assert not home.exists()


def test_a_preempted_attempt_log_ends_with_what_the_sigterm_did(home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "long.yaml"
    spec.write_text(
        "name: long\nentrypoint: gpufleet.workloads.toy:train\nargs: {steps: 5000, step_seconds: 0.02}\n"
        "checkpoint: {every_steps: 1000, grace_seconds: 10}\n"
    )
    run(home, "submit", str(spec))

    def show() -> dict[str, Any]:
        return dict(json.loads(run(home, "show", "1", "--json").stdout))

    deadline = time.monotonic() + 90
    while not (show()["state"] == "running" and (show()["step"] or 0) >= 5):
        assert time.monotonic() < deadline, "the job never ran"
        time.sleep(0.2)
    run(home, "preempt", "1")
    while [a["outcome"] for a in show()["attempts"]][:1] != ["preempted"]:
        assert time.monotonic() < deadline + 60, "the job was never preempted"
        time.sleep(0.2)
    log = json.loads(run(home, "logs", "1", "--attempt", "1", "--json").stdout)["log"]
    said = re.fullmatch(
        r"gpufleet: SIGTERM at step (\d+): saved checkpoint step \1 \((.+)\) in \d+\.\d\d s, exiting 75 \(requeue\)",
        log.strip().splitlines()[-1],
    )
    assert said is not None, log[-500:]
    step = int(said.group(1))
    assert said.group(2) == str(home / "jobs" / "1" / "checkpoints" / f"step-{step:08d}")
    assert (Path(said.group(2)) / "manifest.json").is_file()
    run(home, "cancel", "1")
