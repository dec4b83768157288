"""Sweeps end to end on the local backend: trials are jobs, pruned by ASHA, preempted and resumed, priced."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
import yaml
from conftest import run_cli

from gpufleet.jobs.store import Store
from gpufleet.sweeps.driver import JOB_ID, SweepDriver
from gpufleet.sweeps.spec import load_sweep
from gpufleet.workloads.tinylm import TINY

STEPS = 30
ARGS: dict[str, Any] = {**TINY, "steps": STEPS, "eval_every": 5, "step_seconds": 0.02}


def sweep_file(tmp_path: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "name": "lm",
        "base": {
            "name": "lm",
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": ARGS,
            "resources": {"gpus": 1, "cpus": 1},
            "checkpoint": {"every_steps": 10},
        },
        "space": {"lr": {"low": 1.0e-4, "high": 3.0e-2, "log": True}, "embed": {"choices": [16, 32]}},
        "objective": {"metric": "val_loss", "direction": "minimize"},
        "budget": {"trials": 12},
        "parallelism": 2,
        "sampler": {"kind": "tpe", "seed": 3},
        "pruner": {"kind": "asha", "min_steps": 5, "reduction_factor": 3},
        **changes,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.timeout(900)
def test_a_12_trial_sweep_prunes_resumes_a_preempted_trial_exactly_and_prices_every_trial(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    # Every trial is preempted at step 20 (saved, requeued, resumed). ASHA's rungs are steps 5 and 15
    # (then 45 > 30), so a trial past step 15 is never pruned: those preempted finish.
    monkeypatch.setenv("GPUFLEET_DEBUG_PREEMPT_AT", "20")
    sweep, base = load_sweep(sweep_file(tmp_path))
    driver = SweepDriver(home, sweep, base, poll_s=0.2)
    progress = driver.run()
    assert progress.stop == "12 trials finished or pruned"
    trials = driver.trials()
    states = [t.state for t in trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) + states.count(optuna.trial.TrialState.PRUNED) == 12
    assert optuna.trial.TrialState.PRUNED in states
    store = Store(home / "state.db")
    finished = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    for t in finished:
        job = t.user_attrs[JOB_ID]
        assert [a.outcome for a in store.attempts(job)] == ["requeued", "completed"]  # it saved and exited 75
        assert [e.data["step"] for e in store.events(job, kinds=("restore",)) if e.attempt == 2] == [20]
        # Every eval of both attempts reported at its step (the one due at 20 fell on the preemption).
        evals = [e.data["step"] for e in store.events(job, kinds=("eval",))]
        assert sorted(t.intermediate_values) == evals == [5, 10, 15, 25, 30]
    trial = finished[0]
    monkeypatch.delenv("GPUFLEET_DEBUG_PREEMPT_AT")
    # The same trial without a preemption ends on the very same value.
    from gpufleet.workloads import tinylm

    monkeypatch.delenv("GPUFLEET_SPEC", raising=False)
    torch.set_num_threads(1)
    reference = tinylm.train(**{**ARGS, **trial.params, "step_seconds": 0.0}, ckpt_dir=str(tmp_path / "ref"))
    assert trial.value == reference["val_loss"]
    # Pruned trials' jobs were cancelled, saying so; every trial is priced in the sweep's table.
    for t in trials:
        if t.state == optuna.trial.TrialState.PRUNED:
            assert (store.job(t.user_attrs[JOB_ID]).reason or "").startswith("pruned by sweep lm at step")
    code, out, err = run_cli(capsys, monkeypatch, "sweep", "show", "lm", "--json", "--plot", str(tmp_path / "s.png"))
    assert code == 0, err
    shown = json.loads(out)
    assert shown["finished"] + shown["pruned"] == 12 and all(r["gpu_hours"] > 0 for r in shown["rows"])
    assert (tmp_path / "s.png").stat().st_size > 10_000
    code, out, err = run_cli(capsys, monkeypatch, "sweep", "best", "lm", "--out", str(tmp_path / "best.yaml"))
    assert code == 0, err
    best = yaml.safe_load((tmp_path / "best.yaml").read_text(encoding="utf-8"))
    assert best["args"]["lr"] == driver.study.best_params["lr"] and best["name"] == "lm-best"


def _trials_with_jobs(home: Path) -> int:
    """Trials that recorded their job, read-only: opening the study with Optuna while the driver creates
    it would race it to create the schema."""
    path = home / "sweeps" / "lm" / "study.db"
    if not path.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            row = db.execute("SELECT COUNT(*) FROM trial_user_attributes WHERE key = ?", (JOB_ID,)).fetchone()
    except sqlite3.Error:  # not created yet
        return 0
    return int(row[0])


@pytest.mark.timeout(900)
def test_the_driver_killed_twice_ends_with_exactly_the_budgeted_trials(home: Path, tmp_path: Path) -> None:
    path = sweep_file(tmp_path, budget={"trials": 8}, pruner={"kind": "none"})
    env = {**os.environ, "GPUFLEET_HOME": str(home), "GPUFLEET_LOCAL_SLOTS": "2", "GPUFLEET_LOG_EVERY_S": "0"}
    argv = [sys.executable, "-m", "gpufleet.cli", "sweep", "run", str(path), "--poll", "0.2", "--json"]
    for kill_after in (2, 5):
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while _trials_with_jobs(home) < kill_after:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["finished"] == 8 and result["stop"] == "8 trials finished or pruned"
    jobs = [r["job"] for r in result["rows"] if r["job"] is not None]
    assert len(jobs) == len(set(jobs))  # no job is shared by two trials
    store = Store(home / "state.db")
    assert sorted(jobs) == sorted(j.id for j in store.jobs())  # and no job was left without its trial
    for row in result["rows"]:  # a trial the driver was about to submit when killed is failed, not counted
        if row["job"] is None:
            assert (row["state"], row["reason"]) == ("failed", "the driver stopped before submitting it")
        else:
            assert (row["state"], store.job(row["job"]).state) == ("finished", "completed")


@pytest.mark.timeout(900)
def test_the_scaling_note_measures_the_best_trial_on_1_and_2_ranks(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0.2")
    path = sweep_file(
        tmp_path,
        space={"lr": {"grid": [0.003, 0.01]}},
        sampler={"kind": "grid"},
        pruner={"kind": "none"},
        budget={"trials": 2},
    )
    assert run_cli(capsys, monkeypatch, "sweep", "run", str(path), "--poll", "0.2")[0] == 0
    note = tmp_path / "note.md"
    code, out, err = run_cli(
        capsys, monkeypatch, "sweep", "note", "lm", "--ranks", "1,2", "--steps", "60", "--out", str(note), "--json"
    )
    assert code == 0, err
    figures = json.loads(out)
    one, two = figures["scaling"]
    assert (one["ranks"], two["ranks"]) == (1, 2) and one["tokens_per_s"] > 0 and two["tokens_per_s"] > 0
    assert two["efficiency"] == pytest.approx(two["tokens_per_s"] / (2 * one["tokens_per_s"]))
    store = Store(home / "state.db")
    (start,) = [e for e in store.events(two["job"], kinds=("attempt_start",)) if e.source == "backend"]
    assert start.data["world_size"] == 2  # measured on two DDP ranks
    assert figures["finished"] == 2 and figures["gpu_hours_per_finished_trial"] > 0
    text = note.read_text(encoding="utf-8")
    assert "| 2 |" in text and "more trials at once, or more GPUs per trial?" in text
    code, _, err = run_cli(capsys, monkeypatch, "sweep", "note", "lm", "--ranks", "0,x")
    assert code == 2 and "--ranks" in err
