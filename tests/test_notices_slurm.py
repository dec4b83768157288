"""Slurm's warning signal (``--signal=B:USR1@N``): the batch script records it and passes it on; the job saves."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import follow_home

from gpufleet.backends.slurm.backend import SlurmBackend, batch_script, notice_lead_s, sbatch_argv
from gpufleet.backends.slurm.rank import BatchSignals
from gpufleet.cost.usage import store_usages
from gpufleet.jobs.store import latest_step
from gpufleet.spec import JobSpec, parse_spec


def toy(grace: float = 45, **over: object) -> JobSpec:
    spec = {
        "name": "warned",
        "team": "perception",
        "entrypoint": "gpufleet.workloads.toy:train",
        "args": {"steps": 400, "step_seconds": 0.05},
        "resources": {"cpus": 1, "gpus": 0, "gpu_type": "cpu"},
        "checkpoint": {"every_steps": 1000, "grace_seconds": grace},
        **over,
    }
    return parse_spec(spec)


def test_sbatch_asks_for_the_warning_signal_the_grace_time_ahead(tmp_path: Path) -> None:
    assert "--signal=B:USR1@45" in sbatch_argv(toy(), 7, tmp_path, tmp_path / "job.sbatch")
    assert "--signal=B:USR1@3" in sbatch_argv(toy(grace=2.5), 7, tmp_path, tmp_path / "job.sbatch")
    assert notice_lead_s(toy(grace=0.1)) == 1


def test_batch_script_records_the_warning_and_passes_it_to_the_attempt(tmp_path: Path) -> None:
    """The single-process script run by hand: SIGUSR1 to it reaches its child, which exits 75."""
    script = batch_script(toy(), 7, tmp_path / "home")
    ast.parse(script)
    child = tmp_path / "child.py"
    ready = tmp_path / "ready"
    child.write_text(
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75))\n"
        f"pathlib.Path({str(ready)!r}).write_text('x')\n"
        "while True: time.sleep(0.05)\n"
    )
    spec = toy(entrypoint=[sys.executable, str(child)])
    path = tmp_path / "job.sbatch"
    path.write_text(batch_script(spec, 7, tmp_path / "home"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen([sys.executable, str(path)], env=env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the attempt never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == 75
    lines = [json.loads(x) for x in (tmp_path / "home" / "jobs" / "7" / "events.jsonl").read_text().splitlines()]
    notice = next(x for x in lines if x["kind"] == "preemption_notice")
    assert (notice["attempt"], notice["source"], notice["lead_s"]) == (1, "slurm", 45)


def test_batch_script_dies_of_the_signal_that_killed_the_attempt(tmp_path: Path) -> None:
    spec = toy(entrypoint=[sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    path = tmp_path / "job.sbatch"
    path.write_text(batch_script(spec, 7, tmp_path / "home"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    assert subprocess.run([sys.executable, str(path)], env=env, timeout=60).returncode == -signal.SIGKILL


def test_a_warning_before_the_attempt_starts_is_passed_on_when_it_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[int, int]] = []
    signals = BatchSignals(str(tmp_path / "events.jsonl"), 2, 30)
    signals.on_signal(signal.SIGUSR1, None)
    signals.on_signal(signal.SIGTERM, None)
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    signals.adopt(4242)
    assert sent == [(4242, signal.SIGUSR1)] and signals.stops == [signal.SIGUSR1, signal.SIGTERM]
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 1


@pytest.mark.timeout(400)
def test_real_slurm_warning_saves_requeues_and_is_in_the_ledger(
    slurm: dict[str, str], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``scancel --signal=USR1 --batch`` sends what ``--signal=B:USR1@N`` sends ahead of the end."""
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    backend = SlurmBackend(home)
    store = backend.store
    job = backend.submit(toy())
    follow_home(home, lambda: (latest_step(store, job) or 0) >= 10)
    ref = store.job(job).backend_ref
    assert ref is not None
    subprocess.run(["scancel", "--signal=USR1", "--batch", ref], check=True, env=slurm, timeout=60)
    follow_home(home, lambda: store.job(job).state == "completed")
    attempts = store.attempts(job)
    assert len(attempts) == 2 and attempts[0].outcome in ("requeued", "preempted") and attempts[0].exit_code == 75
    notice = store.events(job, kinds=("preemption_notice",))[0]
    assert (notice.attempt, notice.data["source"], notice.data["lead_s"]) == (1, "slurm", 45)
    signalled = store.events(job, kinds=("preempt_signal",))[0]
    restored = next(e for e in store.events(job, kinds=("restore",)) if e.attempt == 2)
    assert signalled.data["signal"] == "SIGUSR1" and restored.data["step"] == signalled.data["step"]
    first = next(u for u in store_usages(store, job_ids=[job]) if u.attempt == 1)
    assert (first.notice_source, first.notice_lead_s) == ("slurm", 45.0) and first.preempt_save_s > 0
