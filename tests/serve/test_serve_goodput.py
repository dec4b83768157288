"""Where a job's GPU time went, served: ``GET /api/jobs/{id}/goodput``, ``GET /metrics``, and the pages.

The jobs are written by hand into a real store (attempts, and the runtime's events as its event log
would hold them: phase times per rank, stragglers, a hang report), then served by the real app under
uvicorn and read over HTTP, as a browser or Prometheus would.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from conftest import attempt_events, http, screenshot, served
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.cost.gather import cost_report
from gpufleet.cost.ledger import GOODPUT_BUCKETS
from gpufleet.cost.usage import store_usages
from gpufleet.jobs.store import Attempt, Event, Outcome, Store
from gpufleet.paths import state_db
from gpufleet.serve.app import ServeConfig, create_app
from gpufleet.serve.goodput import MAX_RANKS, hangs, phase_lists
from gpufleet.spec import parse_spec

WAIT_MS = 120_000
"""How long a page may take to show a state: only a safety net on a loaded machine."""
PHASES = {"data_wait": [0.01, 0.20], "compute": [0.30, 0.31], "collective": [0.25, 0.02], "optimizer": [0.02, 0.02]}
PHASES_S = {**PHASES, "checkpoint": [0.0, 0.0], "straggler_wait": [0.21, 0.0]}
"""Rank 1 waits for its data (0.2 s a step); rank 0 waits 0.21 s of its collective for rank 1."""


def spec(name: str, team: str, gpus: int = 2, spot: bool = False) -> Any:
    return parse_spec(
        {
            "name": name,
            "team": team,
            "entrypoint": "gpufleet.workloads.toy:train",
            "resources": {"gpus": gpus, "gpu_type": "H100", "cpus": 1},
            "spot": spot,
        }
    )


def step(ts: float, n: int, phases: Any, totals: Any = None) -> dict[str, Any]:
    event: dict[str, Any] = {"ts": ts, "kind": "step", "step": n, "loss": 1.0, "rank_phase_s": phases}
    if totals is not None:
        event["phase_totals_s"] = totals
    return event


def straggler(ts: float, status: str, tax_s: float, **more: Any) -> dict[str, Any]:
    return {
        "ts": ts,
        "kind": "straggler",
        "step": 40,
        "rank": 1,
        "host": "node-b",
        "phase": "data_wait",
        "factor": 20.0,
        "first_step": 31,
        "last_step": 40 if status == "ended" else None,
        "tax_s": tax_s,
        "gpus_per_rank": 1,
        "status": status,
        **more,
    }


def two_rank_job(store: Store) -> int:
    """A two-rank job preempted once, then completed; rank 1 a data-loading straggler, one hang report."""
    job = store.add_job(spec("lm", "nlp"), "local")
    events: list[dict[str, Any]] = []
    for n, outcome in ((1, "preempted"), (2, "completed")):
        start = 1000.0 * n
        end = start + (91.0 if outcome == "completed" else 63.0)
        store.upsert_attempt(Attempt(job, n, "ended", None, start, end, 0, Outcome(outcome), None, None))
        events += attempt_events(n, start, outcome)
    totals = {k: [v[0] * 80, v[1] * 80] for k, v in PHASES_S.items()}
    events += [
        {**step(2020.0, 30, PHASES_S, totals), "attempt": 2},
        {**straggler(2030.0, "named", 3.0), "attempt": 2},
        {**straggler(2080.0, "ended", 8.4), "attempt": 2},  # the latest of (attempt, rank, phase, first step)
        {**straggler(2081.0, "named", 1.0, phase="optimizer"), "attempt": 2},  # no such straggler phase
        {**straggler(2082.0, "named", float("nan")), "attempt": 2},
        {**step(2085.0, 90, {"compute": [0.3, "slow"]}), "attempt": 2},  # malformed: the one before stands
        {**step(2086.0, 91, {"compute": [0.3, 0.3], "data_wait": [0.1]}), "attempt": 2},  # lengths differ
        {
            "ts": 2050.0,
            "kind": "rank_stalled",
            "attempt": 2,
            "step": 55,
            "ranks": [1],
            "hosts": ["node-b"],
            "seconds": 41.0,
            "timeout_s": 600,
            "threshold_s": 30.0,
            "median_step_s": 0.55,
            "phases": {"1": "data_wait"},
            "hung": True,
            "action": "reported",
        },
        {"ts": 2051.0, "kind": "rank_stalled", "attempt": 2, "step": 56, "ranks": [0], "seconds": 9.0},  # no hang
    ]
    store.add_runtime_events(job, events, offset=1)
    return job


def plain_job(store: Store) -> int:
    """A single-GPU job whose steps carry no phase times (an older runtime), on spot."""
    job = store.add_job(spec("resnet", "vision", gpus=1, spot=True), "local")
    store.upsert_attempt(Attempt(job, 1, "ended", None, 5000.0, 5091.0, 0, Outcome.COMPLETED, None, None))
    store.add_runtime_events(
        job, [*attempt_events(1, 5000.0, "completed"), {"ts": 5050.0, "kind": "step", "step": 50, "attempt": 1}], 1
    )
    return job


@pytest.fixture
def jobs(home: Path) -> tuple[Path, int, int]:
    store = Store(state_db(home))
    first, second = two_rank_job(store), plain_job(store)
    store.close()
    return home, first, second


def billed_gpu_seconds(home: Path, job: int) -> float:
    store = Store(state_db(home))
    return sum(u.wall_s * u.gpus for u in store_usages(store, job_ids=[job]))


def test_the_goodput_api_gives_buckets_phases_stragglers_and_hangs(jobs: tuple[Path, int, int]) -> None:
    home, job, plain = jobs
    with served(create_app(ServeConfig(home=home, token=None, sync_remote=False, cache_s=0))) as url:
        status, view = http("GET", f"{url}/api/jobs/{job}/goodput")
        assert status == 200, view
        status_plain, bare = http("GET", f"{url}/api/jobs/{plain}/goodput")
        assert http("GET", f"{url}/api/jobs/99/goodput")[0] == 404

    assert [b["bucket"] for b in view["buckets"]] == list(GOODPUT_BUCKETS)
    billed = billed_gpu_seconds(home, job)
    assert billed == pytest.approx(2 * (63.0 + 91.0))
    assert math.fsum(b["gpu_seconds"] for b in view["buckets"]) == pytest.approx(billed, abs=1e-6)
    assert view["gpu_seconds"] == pytest.approx(billed)
    compute = next(b["gpu_seconds"] for b in view["buckets"] if b["bucket"] == "compute")
    assert view["goodput"] == pytest.approx(compute / billed)
    assert view["money"] == pytest.approx(billed / 3600 * 2.99)  # on-demand H100 on the default card
    assert math.fsum(b["money"] for b in view["buckets"]) == pytest.approx(view["money"])

    ranks = view["ranks"]
    assert ranks["step"] == 30 and ranks["attempt"] == 2 and ranks["ranks"] == 2  # the malformed later ones skipped
    assert ranks["rank_phase_s"] == PHASES_S
    assert view["phases"] == ["data_wait", "compute", "collective", "optimizer", "checkpoint", "straggler_wait"]

    (lagging,) = view["stragglers"]  # named then ended: one straggler; the bad phase and the NaN tax skipped
    assert {k: lagging[k] for k in ("attempt", "rank", "host", "phase", "factor", "first_step", "status")} == {
        "attempt": 2,
        "rank": 1,
        "host": "node-b",
        "phase": "data_wait",
        "factor": 20.0,
        "first_step": 31,
        "status": "ended",
    }
    assert lagging["tax_gpu_seconds"] == pytest.approx(8.4)
    assert lagging["tax_money"] == pytest.approx(8.4 / 3600 * 2.99)

    (hang,) = view["hangs"]  # the stall without `hung` is the older report, not a hang
    assert hang["ranks"] == [1] and hang["hosts"] == ["node-b"] and hang["phases"] == {"1": "data_wait"}
    assert hang["threshold_s"] == 30.0 and hang["median_step_s"] == 0.55 and hang["action"] == "reported"

    assert status_plain == 200
    assert bare["ranks"] is None and bare["stragglers"] == [] and bare["hangs"] == []
    assert bare["money"] == pytest.approx(91.0 / 3600 * 1.49)  # spot
    assert math.fsum(b["gpu_seconds"] for b in bare["buckets"]) == pytest.approx(91.0, abs=1e-6)


def test_metrics_are_the_ledgers_buckets_per_job_for_prometheus(jobs: tuple[Path, int, int]) -> None:
    home, job, plain = jobs
    with served(create_app(ServeConfig(home=home, token="m" * 32, sync_remote=False))) as url:
        status, text = http("GET", f"{url}/metrics")  # a read: no token needed, as for /api/*
        assert status == 200
        assert http("GET", f"{url}/metrics", headers={"Host": "attacker.example"})[0] == 400
        assert http("POST", f"{url}/metrics", body=b"x")[0] == 405

    families = {f.name: f for f in text_string_to_metric_families(text)}
    seconds, money = families["gpufleet_goodput_gpu_seconds"], families["gpufleet_goodput_money"]
    assert seconds.type == "counter" and money.type == "counter"
    assert {s.name for s in seconds.samples} == {"gpufleet_goodput_gpu_seconds_total"}
    store = Store(state_db(home))
    report = cost_report(store)
    for job_id, team in ((job, "nlp"), (plain, "vision")):
        mine = [s for s in seconds.samples if s.labels["job_id"] == str(job_id)]
        assert [s.labels["bucket"] for s in mine] == list(GOODPUT_BUCKETS)
        assert {s.labels["team"] for s in mine} == {team}
        assert math.fsum(s.value for s in mine) == pytest.approx(billed_gpu_seconds(home, job_id), abs=1e-6)
        spent = [s for s in money.samples if s.labels["job_id"] == str(job_id)]
        assert {s.labels["currency"] for s in spent} == {"USD"}
        assert math.fsum(s.value for s in spent) == pytest.approx(report.ledger.jobs[job_id].money)


def test_a_home_without_jobs_serves_empty_metrics(home: Path) -> None:
    with served(create_app(ServeConfig(home=home, token=None, sync_remote=False))) as url:
        status, text = http("GET", f"{url}/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["gpufleet_goodput_gpu_seconds"].samples == []


@pytest.mark.timeout(600)
def test_the_job_and_cost_pages_show_where_the_time_went(
    jobs: tuple[Path, int, int], browser_page: Any, tmp_path: Path
) -> None:
    home, job, plain = jobs
    page = browser_page
    with served(create_app(ServeConfig(home=home, token=None, refresh_s=5.0, sync_remote=False))) as url:
        page.goto(f"{url}/jobs/{job}")
        page.locator('#goodput-bar rect[data-key="compute"]').wait_for(timeout=WAIT_MS)
        assert page.locator("#goodput-legend tbody tr").count() == len(GOODPUT_BUCKETS)
        assert page.locator('#rank-phase-bars g[data-rank="1"] rect[data-key="data_wait"]').count() == 1
        row = page.locator('#straggler-table tr[data-rank="1"]').inner_text()
        assert "node-b" in row and "data_wait" in row and "x20.00" in row and "8.4" in row, row
        assert "rank 1 on node-b (data_wait)" in page.locator("#hang-table").inner_text()
        page.locator('#goodput-bar rect[data-key="compute"]').hover()
        tip = page.locator("#tip")
        tip.wait_for(state="visible", timeout=WAIT_MS)
        assert tip.inner_text().startswith("compute:") and "GPU-s" in tip.inner_text() and "$" in tip.inner_text()
        screenshot(page, "serve-goodput", tmp_path)

        page.goto(f"{url}/jobs/{plain}")
        page.locator('#goodput-bar rect[data-key="compute"]').wait_for(timeout=WAIT_MS)
        assert "no phase times reported" in page.locator("#rank-phases").inner_text()

        page.goto(f"{url}/cost")
        page.locator('#team-buckets g[data-team="nlp"] rect').first.wait_for(timeout=WAIT_MS)
        assert page.locator('#team-buckets g[data-team="vision"]').count() == 1
        assert "goodput" in (page.locator('#team-buckets g[data-team="nlp"]').text_content() or "")
        screenshot(page, "serve-cost-goodput", tmp_path)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "compute",
        [0.1, 0.2],
        {},
        {"compute": []},
        {"compute": [0.1, -0.2]},
        {"compute": [0.1, float("inf")]},
        {"compute": [True, 0.2]},
        {"compute": [0.1] * (MAX_RANKS + 1)},
        {"compute": [0.1, 0.2], "data_wait": [0.1, "x"]},
        {"compute": [0.1, 0.2], "optimizer": [0.1]},
    ],
)
def test_a_malformed_rank_phase_field_is_not_read(value: Any) -> None:
    assert phase_lists(value) is None


def test_a_hang_report_of_the_wrong_shape_is_skipped_or_cut_to_its_known_parts() -> None:
    def stalled(**data: Any) -> Event:
        return Event(job_id=1, attempt=1, ts=1.0, kind="rank_stalled", source="runtime", data={"hung": True, **data})

    reports = hangs(
        [
            stalled(ranks="1"),
            stalled(ranks=[-1, True]),
            stalled(ranks=[2], hosts="h", phases={"2": "lunch"}, action="rebooted", threshold_s=float("nan")),
        ]
    )
    assert reports == [
        {
            "attempt": 1,
            "ts": 1.0,
            "step": None,
            "ranks": [2],
            "hosts": ["?"],
            "phases": {"2": "unknown"},
            "seconds": None,
            "threshold_s": None,
            "median_step_s": None,
            "action": None,
        }
    ]
