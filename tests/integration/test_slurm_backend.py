"""The spine's scenario on a real Slurm: preempted by a higher tier, requeued, resumed, bit-exact, priced."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import follow_home

from gpufleet.backends import get_backend
from gpufleet.backends.slurm.backend import SlurmBackend, allocated_cpus, slurm_usage
from gpufleet.cost.ledger import build_ledger
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import store_usages
from gpufleet.errors import UsageError
from gpufleet.jobs.store import Store, latest_step
from gpufleet.runtime import CheckpointDir
from gpufleet.spec import parse_spec
from gpufleet.workloads.tinylm import TINY

LM: dict[str, Any] = {**TINY, "steps": 400}


def lm_spec(name: str, team: str, priority: int, args: dict[str, Any]) -> Any:
    return parse_spec(
        {
            "name": name,
            "team": team,
            "priority": priority,
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": args,
            "resources": {"cpus": 2, "gpus": 0, "gpu_type": "cpu"},
            "checkpoint": {"every_steps": 13},
        }
    )


@pytest.mark.timeout(400)
def test_preempted_by_high_tier_requeued_resumed_bit_exact(
    slurm: dict[str, str], home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    backend = SlurmBackend(home)
    store = backend.store
    # Paced (a pace changes no number) so the high-tier job preempts it mid-run on a loaded machine too.
    low = backend.submit(lm_spec("lm-low", "perception", 0, {**LM, "step_seconds": 0.05}))
    follow_home(home, lambda: (latest_step(store, low) or 0) >= 15, timeout=180)
    high = backend.submit(lm_spec("lm-high", "planning", 10, {**LM, "steps": 20}))
    follow_home(home, lambda: all(store.job(j).state == "completed" for j in (low, high)), timeout=300)
    attempts = store.attempts(low)
    assert [a.outcome for a in attempts][-1] == "completed" and len(attempts) == 2, attempts
    assert attempts[0].outcome in ("preempted", "requeued")
    signalled = [e for e in store.events(low, kinds=("preempt_signal",))]
    restored = [e for e in store.events(low, kinds=("restore",)) if e.attempt == 2]
    assert signalled and restored and restored[0].data["step"] == signalled[0].data["step"]

    ckpt = home / "jobs" / str(low) / "checkpoints"
    _, resumed = CheckpointDir(ckpt).load(ckpt / f"step-{LM['steps']:08d}")
    from gpufleet.workloads import tinylm

    monkeypatch.delenv("GPUFLEET_SPEC", raising=False)
    torch.set_num_threads(2)
    tinylm.train(**LM, ckpt_dir=str(tmp_path / "reference"))
    _, reference = CheckpointDir(tmp_path / "reference").load(tmp_path / "reference" / f"step-{LM['steps']:08d}")
    for key, value in reference["model"].items():
        assert torch.equal(value, resumed["model"][key]), key

    ledger = build_ledger(store_usages(store), load_rates())
    assert ledger.jobs[low].attempts == 2 and ledger.jobs[low].preemptions == 1
    report = slurm_usage(store)
    assert report["ok"], report
    assert {a["account"] for a in report["accounts"]} == {"perception", "planning"}
    for row in report["accounts"]:  # every run ended: the ledger counts sacct's own seconds, however loaded the host
        assert row["ledger_seconds"] == row["sacct_seconds"] and row["allowed_seconds"] == 0, row
    # The goodput buckets are the billed time: each attempt's add up to its wall, the seconds sacct bills.
    buckets = [math.fsum(u.goodput_seconds().values()) for u in store_usages(store, job_ids=[low])]
    (billed,) = [r["sacct_seconds"] for r in report["accounts"] if r["account"] == "perception"]
    assert math.fsum(buckets) * allocated_cpus(store.job(low).spec) == pytest.approx(billed, rel=0.01)
    first = attempts[0]
    start_event = next(e for e in store.events(low, kinds=("attempt_start",)) if e.attempt == 1)
    assert first.started_at == int(first.started_at) <= start_event.ts  # sacct's whole-second Start, before Python ran


def test_unknown_account_is_a_clear_error(slurm: dict[str, str], home: Path) -> None:
    backend = SlurmBackend(home)
    spec = lm_spec("lm", "nosuchteam", 0, LM)
    with pytest.raises(UsageError, match="sbatch refused"):
        backend.submit(spec)
    assert backend.store.jobs() == []


CONTRACT_BACKENDS = ["local", "slurm", "ray"]


@pytest.mark.parametrize("name", CONTRACT_BACKENDS)
@pytest.mark.timeout(300)
def test_backend_contract_submit_preempt_resume_finish_account(
    name: str, home: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """One scenario, every backend: the same spec is preempted, resumes where it stopped, and is priced."""
    if name in ("slurm", "ray"):
        request.getfixturevalue(name)  # the real service, or fail under CI / skip elsewhere
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    monkeypatch.setenv("GPUFLEET_SCHEDULER_IDLE_S", "2")
    backend = get_backend(name, home)
    spec = parse_spec(
        {
            "name": "toy",
            "team": "perception",
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": 120, "step_seconds": 0.05},
            "resources": {"cpus": 1, "gpus": 0},
            "checkpoint": {"every_steps": 10, "grace_seconds": 10},
        }
    )
    job = backend.submit(spec)
    store = Store(home / "state.db")
    follow_home(home, lambda: store.job(job).state == "running" and (latest_step(store, job) or 0) >= 20, timeout=180)
    backend.preempt(job)
    follow_home(home, lambda: store.job(job).state == "completed", timeout=200)
    attempts = store.attempts(job)
    assert len(attempts) == 2 and attempts[0].outcome in ("preempted", "requeued")
    signalled = store.events(job, kinds=("preempt_signal",))
    restored = [e for e in store.events(job, kinds=("restore",)) if e.attempt == 2]
    assert signalled and restored and restored[0].data["step"] == signalled[0].data["step"]
    ledger = build_ledger(store_usages(store), load_rates())
    assert ledger.teams["perception"].attempts == 2 and ledger.teams["perception"].preemptions == 1
