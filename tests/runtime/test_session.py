"""The session's promises, in-process: bit-exact resume, rollback past bad batches, signals."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_bitwise_equal

from gpufleet.errors import HealthError
from gpufleet.jobs.events import read_events
from gpufleet.runtime import CheckpointDir, Preempted, TrainSession
from gpufleet.workloads import tinylm
from gpufleet.workloads.tinylm import TINY

SMALL: dict[str, Any] = {**TINY, "steps": 60}


def final_state(ckpt_dir: Path, step: int) -> dict[str, Any]:
    _, state = CheckpointDir(ckpt_dir).load(ckpt_dir / f"step-{step:08d}")
    return state


def run_with_preemptions(preempt_at: set[int], monkeypatch: pytest.MonkeyPatch, attempts: list[int]) -> None:
    """Run to the end, requesting preemption after each step in ``preempt_at`` (once each)."""
    pending = set(preempt_at)

    def on_step(sess: TrainSession) -> None:
        if sess.step in pending:
            pending.discard(sess.step)
            sess.request_preemption()

    attempt = 1
    while True:
        monkeypatch.setenv("GPUFLEET_ATTEMPT", str(attempt))
        try:
            tinylm.train(**SMALL, on_step=on_step)
            attempts.append(attempt)
            return
        except Preempted as stop:
            assert stop.code == 75
            attempt += 1


def test_resume_after_five_random_preemptions_is_bit_exact(
    job_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[int] = []
    run_with_preemptions(set(), monkeypatch, attempts)
    reference = final_state(tmp_path / "ckpt", SMALL["steps"])

    monkeypatch.setenv("GPUFLEET_CKPT_DIR", str(tmp_path / "ckpt2"))
    rng = random.Random(2026)
    # Spaced two apart: a stop requested after step k lands at the boundary of step k + 1.
    stops = {2 * k for k in rng.sample(range(1, SMALL["steps"] // 2 - 1), 6)}
    attempts.clear()
    run_with_preemptions(stops, monkeypatch, attempts)
    assert attempts == [len(stops) + 1]
    resumed = final_state(tmp_path / "ckpt2", SMALL["steps"])
    for name in ("model", "optimizer", "scheduler"):
        assert_bitwise_equal(reference[name], resumed[name], name)
    assert_bitwise_equal(reference["trainer"]["rng"], resumed["trainer"]["rng"], "rng")


def test_nan_rolls_back_to_last_healthy_and_skips_the_batch(
    job_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_FAULT", "nan@17")
    result = tinylm.train(**SMALL)
    assert result["steps"] == SMALL["steps"]
    assert torch.isfinite(torch.tensor(result["val_loss"]))
    events, _ = read_events(tmp_path / "events.jsonl")
    rollback = next(e for e in events if e["kind"] == "rollback")
    assert rollback["from_step"] == 18 and rollback["to_step"] == 14  # the 18th step ran on batch 17
    assert rollback["skip_from"] == 14 and rollback["skip_to"] == 18
    assert rollback["redone_steps"] == 4
    assert [e["kind"] for e in events].count("unhealthy") == 1
    for info in CheckpointDir(tmp_path / "ckpt").scan():
        assert info.manifest is not None and info.manifest.healthy


def test_spike_is_detected(job_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_FAULT", "spike@30")
    tinylm.train(**SMALL)
    events, _ = read_events(tmp_path / "events.jsonl")
    bad = [e for e in events if e["kind"] == "unhealthy"]
    assert len(bad) == 1 and bad[0]["reason"] == "spike" and bad[0]["step"] == 31


def test_repeated_bad_steps_stop_after_max_rollbacks(job_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_FAULT", ",".join(f"nan@{p}" for p in range(8, 40)))
    with pytest.raises(HealthError, match="max_rollbacks"):
        tinylm.train(**SMALL)


def test_nan_before_any_checkpoint_is_a_clear_error(job_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_FAULT", "nan@3")
    with pytest.raises(HealthError, match="no healthy checkpoint precedes it"):
        tinylm.train(**SMALL)


def test_sigterm_saves_at_step_boundary_and_requeues(
    job_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def on_step(sess: TrainSession) -> None:
        if sess.step == 10:
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or a handler another library (Ray) installed
    with pytest.raises(Preempted) as stop:
        tinylm.train(**SMALL, on_step=on_step)
    assert stop.value.step == 11
    info, _ = CheckpointDir(tmp_path / "ckpt").latest()
    assert info is not None and info.step == 11 and info.manifest is not None
    assert info.manifest.reason == "preempt"
    assert signal.getsignal(signal.SIGTERM) is before  # handlers are put back


def test_steps_outside_context_manager_is_an_error(tmp_path: Path) -> None:
    sess = TrainSession(ckpt_dir=tmp_path, model=torch.nn.Linear(1, 1), total_steps=1)
    with pytest.raises(RuntimeError, match="context manager"):
        next(sess.steps())


@pytest.mark.parametrize("nodes", [1, 2])
def test_step_events_carry_live_mfu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: int) -> None:
    """With a known GPU type, the runtime's step events report MFU through the estimator's formula,
    against the peak of all the job's GPUs (every node's)."""
    resources = {"gpu_type": "A100", "gpus": 2, "nodes": nodes}
    spec: dict[str, Any] = {"name": "t", "entrypoint": "gpufleet.workloads.tinylm:train", "resources": resources}
    if nodes > 1:
        spec["distributed"] = {"launcher": "script"}  # the script is run once per node; here, one of them
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    monkeypatch.setenv("GPUFLEET_SPEC", str(tmp_path / "spec.json"))
    monkeypatch.setenv("GPUFLEET_CKPT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("GPUFLEET_EVENTS", str(tmp_path / "events.jsonl"))
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    monkeypatch.delenv("GPUFLEET_FAULT", raising=False)
    tinylm.train(**{**SMALL, "steps": 5})
    from gpufleet.estimate.peak import gpu_peak
    from gpufleet.workloads.charlm import CharCorpus, CharLM, CharLMConfig, load_text

    config = CharLMConfig(vocab_size=CharCorpus(load_text()).vocab_size, context=16, layers=1, heads=2, embed=32)
    fpt = CharLM(config).flops_per_token()
    steps = [e for e in read_events(tmp_path / "events.jsonl")[0] if e["kind"] == "step"]
    assert steps and all(e["mfu"] > 0 for e in steps)
    peak = gpu_peak("A100").peak_flops("bf16") * 2 * nodes
    assert steps[-1]["mfu"] == pytest.approx(steps[-1]["tokens_per_s"] * fpt / peak)
