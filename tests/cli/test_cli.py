"""The command line as a user meets it: real processes, real exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO

from gpufleet.runtime import CheckpointDir

GPUFLEET = [sys.executable, "-m", "gpufleet.cli"]


def run(home: Path, *args: str, check: int | None = 0, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFLEET_HOME": str(home), "GPUFLEET_SCHEDULER_IDLE_S": "1", "COLUMNS": "200"}
    proc = subprocess.run([*GPUFLEET, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check is not None:
        assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def jobs_in_db(home: Path) -> int:
    db = home / "state.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])


BAD_SPECS = {
    "malformed.yaml": "name: a\nentrypoint: [oops\n",
    "unknown.yaml": "name: a\nentrypoint: m:f\ngpu: 1\n",
    "negative.yaml": "name: a\nentrypoint: m:f\nresources: {gpus: -2}\n",
    "noentry.yaml": "name: a\nteam: x\n",
}


@pytest.mark.parametrize("name", sorted(BAD_SPECS))
def test_bad_spec_exits_2_with_one_line_and_writes_nothing(home: Path, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(BAD_SPECS[name])
    proc = run(home, "submit", str(path), check=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr and str(path) in lines[0]
    assert jobs_in_db(home) == 0


@pytest.mark.parametrize(
    "args",
    [
        ("show", "42"),
        ("preempt", "42"),
        ("cancel", "42"),
        ("logs", "42"),
        ("ckpt", "verify", "/nonexistent/dir"),
        ("ckpt", "list", "/etc/hostname"),
        ("cost", "--rates", "/nonexistent.yaml"),
        ("demo", "--fault", "boom@3"),
    ],
)
def test_bad_values_exit_2(home: Path, args: tuple[str, ...]) -> None:
    proc = run(home, *args, check=2)
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_ckpt_list_and_verify(home: Path, tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path / "ck", keep=5)
    for step in (10, 20):
        ckpts.save(step, {"model": {"w": torch.ones(8) * step}}, loss=1.0 / step)
    listing = json.loads(run(home, "ckpt", "list", str(tmp_path / "ck"), "--json").stdout)
    assert [c["step"] for c in listing["checkpoints"]] == [10, 20]
    assert json.loads(run(home, "ckpt", "verify", str(tmp_path / "ck"), "--json").stdout)["ok"] is True
    target = tmp_path / "ck" / "step-00000020" / "model.pt"
    data = bytearray(target.read_bytes())
    data[-30] ^= 0xFF
    target.write_bytes(bytes(data))
    result = json.loads(run(home, "ckpt", "verify", str(tmp_path / "ck"), "--json", check=1).stdout)
    assert result["ok"] is False and result["restore_step"] == 10
    assert result["corrupt"][0]["step"] == 20 and "sha256" in result["corrupt"][0]["problem"]


def toy_spec(tmp_path: Path, name: str, steps: int, step_seconds: float, priority: int = 0) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nteam: vision\nentrypoint: gpufleet.workloads.toy:train\n"
        f"args: {{steps: {steps}, step_seconds: {step_seconds}}}\npriority: {priority}\n"
        "resources: {gpu_type: L4}\nspot: true\ncheckpoint: {every_steps: 10, grace_seconds: 10}\n"
    )
    return path


def wait_for(predicate: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_submit_preempt_and_cost_through_the_daemon(home: Path, tmp_path: Path) -> None:
    submitted = json.loads(run(home, "submit", str(toy_spec(tmp_path, "long", 300, 0.02)), "--json").stdout)
    job = str(submitted["id"])

    def show() -> dict[str, Any]:
        return dict(json.loads(run(home, "show", job, "--json").stdout))

    wait_for(lambda: show()["state"] == "running" and (show()["step"] or 0) >= 20)
    run(home, "preempt", job, "--grace", "10")
    wait_for(lambda: show()["state"] == "completed", timeout=90)
    detail = show()
    assert [a["outcome"] for a in detail["attempts"]] == ["preempted", "completed"]
    assert any(e["kind"] == "restore" and e.get("step") for e in detail["events"])
    assert "Traceback" not in run(home, "logs", job).stdout
    first = json.loads(run(home, "logs", job, "--attempt", "1", "--json").stdout)
    assert first["attempt"] == 1 and first["path"].endswith("attempt-1.log")

    jobs = json.loads(run(home, "jobs", "--json").stdout)["jobs"]
    assert [j["state"] for j in jobs] == ["completed"]
    report = json.loads(run(home, "cost", "--json", "--out", str(tmp_path / "note")).stdout)
    assert report["teams"]["vision"]["preemptions"] == 1
    assert report["total"]["money"] > 0 and report["total"]["on_demand_money"] > report["total"]["money"]
    assert Path(report["note"]["png"]).stat().st_size > 5000
    table = run(home, "cost").stdout
    assert "vision" in table and "total" in table
    wait_for(lambda: not (home / "scheduler.pid").exists(), timeout=30)  # the daemon exits when idle


def test_submit_wait_exit_code(home: Path, tmp_path: Path) -> None:
    ok = run(home, "submit", str(toy_spec(tmp_path, "short", 5, 0.0)), "--wait", "--json")
    assert json.loads(ok.stdout)["state"] == "completed"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nentrypoint: gpufleet.workloads.toy:train\nargs: {steps: 2, exit_code: 4}\n")
    failed = run(home, "submit", str(bad), "--wait", "--json", check=1)
    assert json.loads(failed.stdout)["reason"] == "exit code 4"


def test_a_job_that_reported_nothing_shows_so(home: Path, tmp_path: Path) -> None:
    """A bare ``python`` command runs gpufleet's own interpreter; a silent job is shown as such."""
    quiet = tmp_path / "quiet.yaml"
    quiet.write_text("name: quiet\nentrypoint: python -c 'import torch'\n")
    run(home, "submit", str(quiet), "--wait")
    shown = run(home, "show", "1")
    assert "no step reported yet" in shown.stdout and "step None" not in shown.stdout
    logs = run(home, "logs", "1")
    assert logs.stdout.startswith("(empty: attempt 1 of job 1")


def test_an_unreachable_service_exits_3_with_how_to_start_it(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input is 2; a cluster that does not answer is 3, one line, nothing left behind."""
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("GPUFLEET_RAY_ADDRESS", f"127.0.0.1:{port}")
    proc = run(home, "submit", str(REPO / "examples" / "toy.yaml"), "--backend", "ray", check=3)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no Ray cluster answers at 127.0.0.1:{port}" in lines[0]
    assert "scripts/dev-ray up" in lines[0] and "Traceback" not in proc.stderr
    assert jobs_in_db(home) == 0
