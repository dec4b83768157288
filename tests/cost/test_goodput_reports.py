"""Goodput and the top badput in the cost note and the fleet report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpufleet.cost.fleet import build_fleet_report
from gpufleet.cost.fleet_page import report_markdown
from gpufleet.cost.ledger import GOODPUT_BUCKETS, AttemptUsage, PhaseShares, build_ledger
from gpufleet.cost.note import write_cost_note
from gpufleet.cost.rates import Rate, RateCard
from gpufleet.jobs.store import Attempt, Outcome, Store
from gpufleet.spec import parse_spec
from gpufleet.telemetry.slo import SloConfig

T0 = 1_800_000_000.0
CARD = RateCard(currency="USD", rates=[Rate(gpu_type="H100", provider="*", on_demand=3.6)])


def straggling_job() -> AttemptUsage:
    """1000 s on 2 GPUs at 3.6/GPU-h (0.001 a GPU-second): 100 s start-up, 50 s idle, a straggler."""
    return AttemptUsage(job_id=7, job_name="llm", team="nlp", attempt=1, gpu_type="H100", provider="aws",
                        spot=False, gpus=2, start=T0, end=T0 + 1000, outcome="completed", startup_s=100.0,
                        checkpoint_s=30.0, idle_s=50.0, first_step=0, last_step=100,
                        phases=PhaseShares(data_wait_s=10.0, straggler_wait_s=20.0, busy_s=100.0))  # fmt: skip


def test_cost_note_shows_goodput_and_top_badput_with_money(tmp_path: Path) -> None:
    usage = straggling_job()
    ledger = build_ledger([usage], CARD)
    paths = write_cost_note(tmp_path, [usage], ledger, generated_at=T0 + 2000)
    # T = 1000 - 100 - 30 - 50 = 820 s: straggler wait 164 s, data wait 82 s, compute 574 s.
    markdown = paths.markdown.read_text()
    assert "## Goodput by job" in markdown
    section = markdown.split("## Goodput by job", 1)[1]
    row = next(line for line in section.splitlines() if line.startswith("| #7 llm"))
    assert row.startswith("| #7 llm | 57.4 % | straggler wait: 328 GPU-s, $0.328 | startup: 200 GPU-s, $0.20 |")
    assert row.endswith("| data wait: 164 GPU-s, $0.164 |")
    data = json.loads(paths.json.read_text())
    (job,) = data["jobs"]
    assert job["goodput"] == pytest.approx(0.574) and job["gpu_seconds"] == pytest.approx(2000.0)
    assert math.fsum(job["buckets"].values()) == pytest.approx(job["gpu_seconds"], abs=1e-6)
    assert [t["bucket"] for t in job["badput_top"]] == ["straggler_wait", "startup", "data_wait"]
    assert job["badput_top"][0]["money"] == pytest.approx(0.328)
    assert job["attempts"][0]["goodput_seconds"]["idle"] == pytest.approx(50.0)
    assert list(job["attempts"][0]["goodput_seconds"]) == list(GOODPUT_BUCKETS)


def test_fleet_report_carries_each_jobs_goodput(home: Path) -> None:
    store = Store(home / "state.db")
    spec = parse_spec({"name": "llm", "team": "nlp", "entrypoint": "m:f", "resources": {"gpus": 2, "gpu_type": "H100"}})
    job = store.add_job(spec, "local")
    store.upsert_attempt(Attempt(job, 1, "ended", None, T0, T0 + 100, 0, Outcome.COMPLETED, None, None))
    phases = {k: [1.0, 1.0] for k in ("data_wait", "compute", "collective", "optimizer", "checkpoint")}
    events = [
        {"ts": T0 + 10, "attempt": 1, "kind": "train_start", "step": 0},
        {"ts": T0 + 90, "attempt": 1, "kind": "session_end", "status": "completed", "step": 50,
         "phase_totals_s": {**phases, "straggler_wait": [0.0, 0.0]}},
    ]  # fmt: skip
    store.add_runtime_events(job, events, offset=1)
    report = build_fleet_report(
        store, home, since=None, now=T0 + 200, rates=CARD, gpu_samples=lambda _: [], slo=SloConfig()
    )
    (waste,) = report.jobs
    # 100 s on 2 GPUs: 10 s start-up, 10 s idle, T = 80 s of which a quarter waited for data.
    assert waste.buckets == pytest.approx({**dict.fromkeys(GOODPUT_BUCKETS, 0.0), "startup": 20.0,
                                           "idle": 20.0, "data_wait": 40.0, "compute": 120.0})  # fmt: skip
    assert waste.goodput == pytest.approx(0.6)
    assert [t["bucket"] for t in waste.badput_top] == ["data_wait", "startup", "idle"]
    dumped = report.to_dict()["jobs"][0]
    assert dumped["goodput"] == pytest.approx(0.6) and dumped["badput_top"][0]["money"] == pytest.approx(0.04)
    markdown = report_markdown(report)
    assert "## Goodput per job" in markdown and "| #1 llm | nlp | 60.0% | data wait: 40.0 GPU-s, $0.04 |" in markdown
