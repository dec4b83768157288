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
    # The restart paid a start-up that lost work alone would hide; the job never preempted paid nothing.
    assert perception["preemption_overhead_gpu_seconds_by_bucket"]["startup"] > 0
    assert perception["preemption_overhead_money"] > 0 and 0 < perception["preemption_overhead_share"] < 1
    assert result["teams"]["planning"]["preemption_overhead_gpu_seconds"] == 0
    note = result["note"]
    markdown = Path(note["markdown"]).read_text()
    assert "preempted" in markdown and "perception" in markdown and "planning" in markdown
    assert Path(note["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(Path(note["json"]).read_text())["total"]["money"] == result["total"]["money"]


def follow_a_job(tmp_path: Path, *, terminal: bool) -> str:
    """Run the watcher over a job whose steps advance 12 at a time, once per round, until 240 of 240."""
    from io import StringIO

    from rich.console import Console

    from gpufleet.cli.watch import JobWatcher, make_progress
    from gpufleet.jobs.store import Store
    from gpufleet.spec import parse_spec

    store = Store(tmp_path / "state.db")
    job = store.add_job(
        parse_spec({"name": "lm", "team": "nlp", "entrypoint": "gpufleet.workloads.toy:train"}), "local"
    )
    store.set_job_state(job, "running")
    store.add_runtime_events(job, [{"ts": 1.0, "attempt": 1, "kind": "session_start", "total_steps": 240}], 1)
    out = StringIO()
    progress = make_progress(to=Console(file=out, force_terminal=terminal, width=200))
    step = iter(range(12, 241, 12))

    def advance() -> None:
        n = next(step, None)
        if n is None:
            store.set_job_state(job, "completed")
        else:
            store.add_runtime_events(job, [{"ts": 1.0 + n, "attempt": 1, "kind": "step", "step": n}], n + 1)

    with progress:
        JobWatcher(store, progress).follow([job], tick=advance, poll_s=0.0)
    return out.getvalue()


@pytest.mark.slow  # make soak: 95 s of a real-time scenario; tests/backends/test_local_fleet.py covers its parts
@pytest.mark.timeout(600)
def test_fleet_demo_borrows_reclaims_fails_over_and_prices_the_move(home: Path) -> None:
    env = {**os.environ, "GPUFLEET_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "demo", "--fleet", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=580,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] is True, result["events"]
    assert {j["state"] for j in result["jobs"]} == {"completed"}
    story = [line["text"] for line in result["story"]]
    assert any("borrowing 1 GPU" in line for line in story)
    assert any("is reclaimed" in line for line in story) and any("fails over: aws/us-east-1" in line for line in story)
    moved = [line for line in story if "checkpoint step" in line and "-> gcp/us-central1" in line]
    assert moved and all("verified" in line for line in moved)
    total = result["total"]
    assert total["egress_bytes"] > 0 and total["egress_money"] > 0
    markdown = Path(result["note"]["markdown"]).read_text()
    assert "checkpoint_moved" in markdown and "egress" in markdown and "gcp/us-central1/H100" in markdown


def test_watch_without_a_terminal_prints_a_line_every_tenth(tmp_path: Path) -> None:
    text = follow_a_job(tmp_path, terminal=False)
    lines = [line.strip() for line in text.splitlines() if ": step " in line]
    assert lines[0] == "#1 lm: step 24/240 (10%), running (nlp)"
    assert [line.split()[3] for line in lines] == [f"{24 * k}/240" for k in range(1, 11)]
    assert lines[-1].startswith("#1 lm: step 240/240 (100%)")


def test_watch_on_a_terminal_keeps_its_bars_only(tmp_path: Path) -> None:
    text = follow_a_job(tmp_path / "tty", terminal=True)
    assert ": step " not in text and "240/240" in text
