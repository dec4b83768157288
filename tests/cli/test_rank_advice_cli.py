"""``gpufleet diagnose ID`` names a straggler with its tax in GPU-seconds and money, and ``gpufleet advise ID``
ranks what would recover the most GPU time, each bucket with its remedy, from a job's own events.

A 3-rank job on H100s (priced by the shipped rate card) whose rank 1 computes slowly on node-1 and
whose rank 2 waits for its data; its event log is ingested as the scheduler ingests it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from gpufleet.backends.base import ingest_events
from gpufleet.cost.ledger import GOODPUT_BUCKETS
from gpufleet.cost.recover import Evidence, recoverable
from gpufleet.jobs.store import Outcome, Store
from gpufleet.spec import parse_spec
from gpufleet.telemetry.ranks import Straggler

T0 = 1_796_000_000.0
RANKS = 3
PER_STEP = {  # seconds a step of each rank in each phase
    "data_wait": [0.01, 0.01, 0.12],
    "compute": [0.2, 0.4, 0.2],
    "collective": [0.25, 0.05, 0.13],
    "optimizer": [0.02, 0.02, 0.02],
    "checkpoint": [0.0, 0.0, 0.0],
    "straggler_wait": [0.2, 0.0, 0.08],
}


def runtime_events(steps: int = 100) -> list[dict[str, Any]]:
    hosts = [{"rank": r, "host": f"node-{r}"} for r in range(RANKS)]
    out: list[dict[str, Any]] = [
        {"ts": T0 + 2, "attempt": 1, "kind": "session_start", "pid": 1001, "total_steps": steps},
        {"ts": T0 + 5, "attempt": 1, "kind": "train_start", "step": 0, "data_position": 0},
        {"ts": T0 + 5.01, "attempt": 1, "kind": "group", "world_size": RANKS, "ranks": hosts},
    ]
    for step in range(10, steps + 1, 10):
        totals = {k: [v * step for v in per] for k, per in PER_STEP.items()}
        out.append(
            {"ts": T0 + 5 + 0.5 * step, "attempt": 1, "kind": "step", "step": step, "loss": 1.0,
             "rank_phase_s": PER_STEP, "phase_totals_s": totals}
        )  # fmt: skip
        if step % 50 == 0:
            out.append({"ts": T0 + 5.5 + 0.5 * step, "attempt": 1, "kind": "checkpoint", "step": step, "seconds": 4.0})
    out.append(
        {"ts": T0 + 50, "attempt": 1, "kind": "straggler", "step": 90, "rank": 1, "host": "node-1",
         "phase": "compute", "factor": 2.0, "first_step": 31, "last_step": 100, "tax_s": 20.5,
         "gpus_per_rank": 1, "status": "ended"}
    )  # fmt: skip
    out.append({"ts": T0 + 60, "attempt": 1, "kind": "session_end", "status": "completed", "step": steps})
    return out


def make_job(home: Path, extra: list[str] | None = None) -> int:
    store = Store(home / "state.db")
    spec = {
        "name": "lm",
        "team": "nlp",
        "entrypoint": "m:f",
        "resources": {"gpus": RANKS, "gpu_type": "H100"},
        "distributed": {"strategy": "ddp"},
    }
    job_id = store.add_job(parse_spec(spec), "local")
    store.add_attempt(job_id, 1, pid=1001, started_at=T0 + 1)
    store.add_event(job_id, "attempt_start", attempt=1, ts=T0 + 1, pid=1001, gpus=RANKS, world_size=RANKS)
    store.update_attempt(job_id, 1, state="ended", ended_at=T0 + 61, exit_code=0, outcome=Outcome.COMPLETED)
    store.set_job_state(job_id, "completed")
    folder = home / "jobs" / str(job_id)
    folder.mkdir(parents=True)
    lines = [*(json.dumps(e) for e in runtime_events()), *(extra or [])]
    (folder / "events.jsonl").write_text("\n".join(lines) + "\n")
    ingest_events(store, home, store.job(job_id))
    store.close()
    return job_id


def test_diagnose_names_the_straggler_and_what_it_cost(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    job = make_job(home)
    code, out, err = run_cli(capsys, monkeypatch, "diagnose", str(job))
    assert code == 0, err
    # 20.5 GPU-s at the shipped card's 2.99 a GPU-hour of an on-demand H100
    assert (
        "rank 1 on node-1 is a straggler in compute (x2.0 from step 31): the other ranks waited 20.5 GPU-s ($0.017)"
        in " ".join(out.split())
    )
    code, out, err = run_cli(capsys, monkeypatch, "diagnose", str(job), "--json")
    (found,) = json.loads(out)["findings"]
    assert code == 0 and found["kind"] == "straggler" and found["rank"] == 1 and found["host"] == "node-1"
    assert found["phase"] == "compute" and found["tax_gpu_seconds"] == 20.5 and found["currency"] == "USD"
    assert found["tax_money"] == pytest.approx(20.5 / 3600 * 2.99)


def test_diagnose_skips_a_malformed_straggler_event(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    bad = {"ts": T0 + 55, "attempt": 1, "kind": "straggler", "rank": 2, "host": ["x"], "phase": "compute"}
    job = make_job(home, [json.dumps(bad)])
    code, out, err = run_cli(capsys, monkeypatch, "diagnose", str(job), "--json")
    assert code == 0 and [f["rank"] for f in json.loads(out)["findings"]] == [1], err


def test_advise_ranks_what_would_recover_the_most_gpu_time(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    job = make_job(home)
    code, out, err = run_cli(capsys, monkeypatch, "advise", str(job), "--json")
    assert code == 0, err
    doc = json.loads(out)
    recover = doc["recover"]
    assert doc["currency"] == "USD" and recover and "compute" not in {r["bucket"] for r in recover}
    assert [r["gpu_seconds"] for r in recover] == sorted((r["gpu_seconds"] for r in recover), reverse=True)
    by = {r["bucket"]: r for r in recover}
    assert {"straggler_wait", "data_wait", "checkpoint", "startup"} <= set(by)
    assert "rank 1's compute on node-1" in by["straggler_wait"]["action"]
    assert "rank 2 waits most for its data" in by["data_wait"]["action"]
    assert "checkpoint.async" in by["checkpoint"]["action"] and "4 s a save" in by["checkpoint"]["action"]
    assert by["checkpoint"]["gpu_seconds"] == pytest.approx(2 * 4.0 * RANKS)
    assert by["checkpoint"]["money"] == pytest.approx(24.0 / 3600 * 2.99)
    assert set(doc) >= {"daly", "young", "measured"}  # the interval advice is still there
    code, out, err = run_cli(capsys, monkeypatch, "advise", str(job))
    text = " ".join(out.split())
    assert code == 0 and "what would recover the most GPU time" in text and "rank 1's compute on node-1" in text


class Attempt:
    """An attempt as :func:`recoverable` reads it: its number, GPUs and goodput buckets."""

    def __init__(self, attempt: int, gpus: int, seconds: dict[str, float]) -> None:
        self.attempt, self.gpus, self._seconds = attempt, gpus, seconds

    def goodput_seconds(self) -> dict[str, float]:
        return {**dict.fromkeys(GOODPUT_BUCKETS, 0.0), **self._seconds}


def test_recoverable_ranks_buckets_by_gpu_seconds_and_prices_each_attempt() -> None:
    usages = [
        Attempt(1, 8, {"compute": 900.0, "lost": 30.0, "idle": 2.0, "straggler_wait": float("nan")}),
        Attempt(2, 4, {"compute": 500.0, "lost": 10.0, "data_wait": 70.0, "idle": -5.0}),
    ]
    slow = Straggler(
        attempt=2, rank=3, host="n3", phase="data_wait", factor=3.0, first_step=5, last_step=9, tax_s=1.0,
        gpus_per_rank=1, status="named", since=0.0, ts=0.0,
    )  # fmt: skip
    found = recoverable(usages, {1: 2.0, 2: 1.0}, Evidence(stragglers=(slow,), recommended_seconds=600.0))
    # lost and data_wait tie in GPU-seconds: lost cost more (its GPU-seconds were on the dearer attempt)
    assert [(r.bucket, r.gpu_seconds) for r in found] == [("lost", 280.0), ("data_wait", 280.0), ("idle", 16.0)]
    assert found[0].money == pytest.approx(240 / 3600 * 2.0 + 40 / 3600 * 1.0)
    assert found[1].money == pytest.approx(280 / 3600 * 1.0)
    assert "Daly's interval (600 s)" in found[0].action
    unpriced = recoverable(usages, {1: 2.0}, Evidence())
    assert {r.bucket: r.money for r in unpriced}["idle"] == pytest.approx(16 / 3600 * 2.0)
    assert {r.bucket: r.money for r in unpriced}["lost"] is None
    named = recoverable([Attempt(1, 1, {"straggler_wait": 5.0})], {}, Evidence(stragglers=(slow,)))
    assert "rank 3's data loader" in named[0].action
