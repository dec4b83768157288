"""The fleet report over a hand-built state database, every figure worked out by hand."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpufleet.cli.observe import report_command
from gpufleet.cost.fleet import (
    WASTE_PARTS,
    FleetReport,
    build_fleet_report,
    classify_gpu_time,
    parse_since,
)
from gpufleet.cost.fleet_page import write_report
from gpufleet.cost.rates import Rate, RateCard
from gpufleet.errors import UsageError
from gpufleet.jobs.store import Attempt, Outcome, Store
from gpufleet.spec import parse_spec
from gpufleet.telemetry import Sample, SyntheticJobConfig, generate_samples
from gpufleet.telemetry.slo import SloConfig
from gpufleet.telemetry.synthetic import Pattern

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
NOW = T0 + 10_000.0
H = 3600.0
CARD = RateCard(
    currency="USD",
    as_of="2026-01-01",
    rates=[
        Rate(gpu_type="H100", provider="lambda", on_demand=4.0, spot=2.0),
        Rate(gpu_type="A100", provider="*", on_demand=2.0),
    ],
)
SLO = SloConfig(tokens_per_s_per_job=1500.0, tokens_per_gpu_hour=4e6)


# --- GPU time classes --------------------------------------------------------------------------


def synthetic(pattern: Pattern, gpus: int = 1, duration_s: float = 600.0) -> list[Sample]:
    return generate_samples(SyntheticJobConfig(pattern=pattern, gpus=gpus, duration_s=duration_s))


def shares(classes: dict[str, float]) -> dict[str, float]:
    total = sum(classes.values())
    return {k: v / total for k, v in classes.items()}


def test_synthetic_patterns_classify_as_their_bottleneck() -> None:
    idle = classify_gpu_time(synthetic("idle", gpus=2))
    assert sum(idle.values()) == pytest.approx(2 * 600.0)  # GPU-seconds: 2 GPUs x 600 s
    assert shares(idle)["idle"] > 0.95
    host = shares(classify_gpu_time(synthetic("host_bound")))
    assert host["host_bound"] == pytest.approx(0.5, abs=0.03) and host["busy"] == pytest.approx(0.5, abs=0.03)
    comm = shares(classify_gpu_time(synthetic("comm_bound", gpus=4)))
    assert comm["comm_bound"] == pytest.approx(0.6, abs=0.02) and comm["idle"] == comm["host_bound"] == 0.0
    healthy = shares(classify_gpu_time(synthetic("healthy", gpus=8)))
    assert healthy["busy"] > 0.99
    others: tuple[Pattern, ...] = ("memory_bound", "tensor_idle", "thermal_throttle")
    for pattern in others:
        assert shares(classify_gpu_time(synthetic(pattern)))["busy"] > 0.99, pattern


def util_series(values: Sequence[float], step_ms: int = 1000) -> list[Sample]:
    return [Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, v, i * step_ms) for i, v in enumerate(values)]


def test_short_gaps_are_host_bound_long_or_edge_gaps_idle() -> None:
    # 2 s idle at the start (edge), 10 busy, 3 s gap, 10 busy, 70 s gap (>= 60 s), 5 busy.
    values = [0.0] * 2 + [99.0] * 10 + [0.0] * 3 + [99.0] * 10 + [0.0] * 70 + [99.0] * 5
    assert classify_gpu_time(util_series(values)) == {"busy": 25.0, "comm_bound": 0.0, "host_bound": 3.0, "idle": 72.0}
    # The same samples declared 0.5 s apart: the 70-sample gap lasts 35 s, a stall, not idle.
    half = classify_gpu_time(util_series(values), sample_seconds=0.5)
    assert half == {"busy": 12.5, "comm_bound": 0.0, "host_bound": 36.5, "idle": 1.0}
    assert classify_gpu_time([]) == {"busy": 0.0, "comm_bound": 0.0, "host_bound": 0.0, "idle": 0.0}


# --- the state database --------------------------------------------------------------------------


def add_job(
    store: Store,
    name: str,
    team: str,
    *,
    state: str,
    submitted: float,
    gpu_type: str = "H100",
    gpus: int = 1,
    provider: str = "lambda",
    spot: bool = False,
) -> int:
    spec = parse_spec(
        {
            "name": name,
            "team": team,
            "entrypoint": "gpufleet.workloads.toy:train",
            "resources": {"gpu_type": gpu_type, "gpus": gpus},
            "provider": provider,
            "spot": spot,
        }
    )
    job_id = store.add_job(spec, "local")
    with store.transaction() as db:
        db.execute(
            "UPDATE jobs SET state=?, submitted_at=?, updated_at=? WHERE id=?", (state, submitted, submitted, job_id)
        )
    return job_id


def add_attempt(store: Store, job_id: int, n: int, start: float, end: float, outcome: str) -> None:
    store.upsert_attempt(Attempt(job_id, n, "ended", 1000 + n, start, end, 0 if outcome == "completed" else 1,
                                 Outcome(outcome), None, None))  # fmt: skip


def runtime(store: Store, job_id: int, *events: dict[str, Any]) -> None:
    store.add_runtime_events(job_id, list(events), offset=0)


def build_fleet(home: Path) -> Store:
    """Seven jobs; the comments give each one's ledger buckets (seconds per GPU)."""
    store = Store(home / "state.db")
    # 1 nlp/done: 2x H100 lambda on-demand (4.0/h). Waited 100 s. 3600 s: startup 60, checkpoint 30,
    # useful 3510. 2 GPU-h, 8.00. Tokens: 1000/s for 1000 s then 2000/s for 2500 s.
    j = add_job(store, "done", "nlp", state="completed", submitted=T0, gpus=2)
    add_attempt(store, j, 1, T0 + 100, T0 + 3700, "completed")
    runtime(store, j,
            {"ts": T0 + 160, "attempt": 1, "kind": "train_start", "step": 0},
            {"ts": T0 + 1000, "attempt": 1, "kind": "checkpoint", "step": 50, "seconds": 30.0},
            {"ts": T0 + 1160, "attempt": 1, "kind": "step", "step": 60, "tokens_per_s": 1000.0},
            {"ts": T0 + 3660, "attempt": 1, "kind": "step", "step": 200, "tokens_per_s": 2000.0},
            {"ts": T0 + 3690, "attempt": 1, "kind": "session_end", "status": "completed", "step": 200})  # fmt: skip
    store.add_event(j, "completed", attempt=1, ts=T0 + 3700)
    # 2 nlp/oom: 1x A100 (wildcard 2.0/h). Waited 300 s. 900 s: startup 30 + 10 of shut-down,
    # then lost 860 (no checkpoint). 0.25 GPU-h, 0.50. Died of OOM (session_end error).
    j = add_job(store, "oom", "nlp", state="failed", submitted=T0 + 200, gpu_type="A100", provider="local")
    add_attempt(store, j, 1, T0 + 500, T0 + 1400, "failed")
    runtime(store, j,
            {"ts": T0 + 530, "attempt": 1, "kind": "train_start", "step": 0},
            {"ts": T0 + 1390, "attempt": 1, "kind": "session_end", "status": "failed", "step": 40,
             "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"})  # fmt: skip
    store.add_event(j, "failed", attempt=1, ts=T0 + 1400)
    # 3 vision/spot: 1x H100 lambda spot (2.0/h; 4.0 on demand). Waited 100 s, then 600 s after the
    # requeue. a1 1800 s preempted: startup 20 + 10, checkpoint 10, lost 890, useful 870.
    # a2 1800 s: restore 15, startup 25, useful 1760. 1 GPU-h, 2.00, one preemption.
    j = add_job(store, "spot", "vision", state="completed", submitted=T0 + 1000, spot=True)
    add_attempt(store, j, 1, T0 + 1100, T0 + 2900, "preempted")
    add_attempt(store, j, 2, T0 + 3500, T0 + 5300, "completed")
    runtime(store, j,
            {"ts": T0 + 1120, "attempt": 1, "kind": "train_start", "step": 0},
            {"ts": T0 + 2000, "attempt": 1, "kind": "checkpoint", "step": 100, "seconds": 10.0},
            {"ts": T0 + 2890, "attempt": 1, "kind": "session_end", "status": "requeue", "step": 190},
            {"ts": T0 + 3515, "attempt": 2, "kind": "restore", "step": 100, "seconds": 15.0},
            {"ts": T0 + 3540, "attempt": 2, "kind": "train_start", "step": 100})  # fmt: skip
    store.add_event(j, "completed", attempt=2, ts=T0 + 5300)
    # 4 vision/cancel: 1x H100 on-demand, cancelled after 300 s (startup 10, lost 290). Waited 100 s.
    j = add_job(store, "cancel", "vision", state="cancelled", submitted=T0 + 4000)
    add_attempt(store, j, 1, T0 + 4100, T0 + 4400, "cancelled")
    runtime(store, j, {"ts": T0 + 4110, "attempt": 1, "kind": "train_start", "step": 0})
    store.add_event(j, "cancelled", attempt=1, ts=T0 + 4400)
    # 5 nlp/waiting: still queued at NOW, submitted 1000 s before.
    add_job(store, "waiting", "nlp", state="queued", submitted=T0 + 9000)
    # 6 vision/old: completed a day before T0, outside a window starting at T0.
    j = add_job(store, "old", "vision", state="completed", submitted=T0 - 100_000)
    add_attempt(store, j, 1, T0 - 99_000, T0 - 95_400, "completed")
    store.add_event(j, "completed", attempt=1, ts=T0 - 95_400)
    # 7 vision/crash: 1x A100, failed (not OOM) after 600 s: startup 10 + 10, checkpoint 20,
    # lost 340, useful 220. Waited 50 s.
    j = add_job(store, "crash", "vision", state="failed", submitted=T0 + 6000, gpu_type="A100", provider="local")
    add_attempt(store, j, 1, T0 + 6050, T0 + 6650, "failed")
    runtime(store, j,
            {"ts": T0 + 6060, "attempt": 1, "kind": "train_start", "step": 0},
            {"ts": T0 + 6300, "attempt": 1, "kind": "checkpoint", "step": 30, "seconds": 20.0},
            {"ts": T0 + 6640, "attempt": 1, "kind": "session_end", "status": "failed", "step": 50,
             "error": "ValueError: bad batch"})  # fmt: skip
    store.add_event(j, "failed", attempt=1, ts=T0 + 6650)
    (home / "jobs" / str(j) / "logs").mkdir(parents=True)
    (home / "jobs" / str(j) / "logs" / "attempt-1.log").write_text("Traceback ...\nValueError: bad batch\n")
    return store


SERIES: dict[int, list[Sample]] = {}


def gpu_samples(job_id: int) -> list[Sample]:
    """Job 1 ran comm-bound (60 % of samples), job 3 host-bound; the others have no series."""
    if not SERIES:
        SERIES[1] = synthetic("comm_bound", gpus=2)
        SERIES[3] = synthetic("host_bound")
    return SERIES.get(job_id, [])


@pytest.fixture
def fleet(home: Path) -> Iterator[Store]:
    store = build_fleet(home)
    yield store
    store.close()


def report_of(store: Store, home: Path, since: float | None = T0, **kw: Any) -> FleetReport:
    return build_fleet_report(store, home, since=since, now=NOW, rates=CARD, gpu_samples=gpu_samples, slo=SLO, **kw)


def slo_map(report: FleetReport) -> dict[str, Any]:
    return {s.name: s for s in report.slos}


def test_slos_against_hand_computed_values(fleet: Store, home: Path) -> None:
    slos = slo_map(report_of(fleet, home))
    # Ended jobs in the window: done, spot completed; oom, crash failed; cancel excluded.
    a = slos["availability"]
    assert (a.measured, a.count, a.met) == (pytest.approx(0.5), 4, False)
    assert a.error_budget_remaining == pytest.approx(1 - 0.5 / 0.01)
    # Ended attempts, cancelled excluded: done, oom, spot a1 (preempted: not a failure), spot a2, crash.
    f = slos["failure_rate"]
    assert (f.measured, f.count, f.met) == (pytest.approx(2 / 5), 5, False)
    assert f.error_budget_remaining == pytest.approx(1 - 0.4 / 0.05)
    o = slos["oom_rate"]
    assert (o.measured, o.count, o.met) == (pytest.approx(1 / 5), 5, False)
    # Waits: 100, 300, 100, 600 (requeue), 100, 50, and 1000 so far for the queued job.
    # Sorted 50 100 100 100 300 600 1000: p50 = 100; p95 at rank 5.7 = 600 + 0.7 x 400 = 880.
    p50, p95 = slos["queue_wait_p50"], slos["queue_wait_p95"]
    assert (p50.measured, p50.count, p50.met) == (pytest.approx(100.0), 7, True)
    assert p50.error_budget_remaining == pytest.approx(1 - (3 / 7) / 0.5)
    assert (p95.measured, p95.met) == (pytest.approx(880.0), False)
    assert p95.error_budget_remaining == pytest.approx(1 - (1 / 7) / 0.05)
    # Tokens: job 1 only, 1000 x 1000 + 2000 x 2500 = 6e6 tokens in 3500 s, over 2 GPU-hours.
    t = slos["tokens_per_s_per_job"]
    assert (t.measured, t.count, t.met) == (pytest.approx(6e6 / 3500), 1, True)
    g = slos["tokens_per_gpu_hour"]
    assert (g.measured, g.met) == (pytest.approx(3e6), False)


def test_states_teams_and_money(fleet: Store, home: Path) -> None:
    report = report_of(fleet, home)
    assert report.jobs_by_state == {"queued": 1, "completed": 2, "failed": 2, "cancelled": 1}
    assert report.waiting_now == 1
    nlp, vision = report.teams
    assert (nlp.team, nlp.jobs, nlp.attempts, nlp.failed_attempts, nlp.preemptions) == ("nlp", 3, 2, 1, 0)
    assert nlp.failure_rate == pytest.approx(0.5)
    assert nlp.gpu_hours == pytest.approx(2.0 + 0.25)
    assert nlp.money == pytest.approx(2.0 * 4.0 + 0.25 * 2.0)
    assert nlp.lost_to_preemption_gpu_hours == pytest.approx(860 / H)  # the OOM job's lost work
    assert (vision.team, vision.jobs, vision.attempts, vision.failed_attempts, vision.preemptions) == (
        "vision", 3, 4, 1, 1)  # fmt: skip
    assert vision.failure_rate == pytest.approx(1 / 3)
    assert vision.gpu_hours == pytest.approx(1.0 + 300 / H + 600 / H)
    assert vision.money == pytest.approx(1.0 * 2.0 + 300 / H * 4.0 + 600 / H * 2.0)
    assert vision.on_demand_money == pytest.approx(1.0 * 4.0 + 300 / H * 4.0 + 600 / H * 2.0)
    assert vision.lost_to_preemption_gpu_hours == pytest.approx((890 + 290 + 340) / H)
    assert report.total.money == pytest.approx(nlp.money + vision.money)
    assert {(r.gpu_type, r.provider, r.spot): r.price_per_gpu_hour for r in report.rates_used} == {
        ("A100", "local", False): 2.0,
        ("H100", "lambda", False): 4.0,
        ("H100", "lambda", True): 2.0,
    }
    hours = {(r.gpu_type, r.spot): r.gpu_hours for r in report.rates_used}
    assert hours == pytest.approx(
        {("A100", False): 0.25 + 600 / H, ("H100", False): 2.0 + 300 / H, ("H100", True): 1.0}
    )


def test_per_job_waste_adds_up_and_follows_the_gpu_series(fleet: Store, home: Path) -> None:
    report = report_of(fleet, home)
    assert [j.name for j in report.jobs] == ["done", "spot", "oom", "crash", "cancel"]  # most waste first
    jobs = {j.name: j for j in report.jobs}
    for j in report.jobs:
        assert sum(j.breakdown.values()) == pytest.approx(j.gpu_hours)
        assert list(j.breakdown) == list(WASTE_PARTS)
    done = jobs["done"]  # useful 3510 s x 2 GPUs, 60 % comm-bound
    assert done.gpu_series is True
    assert done.breakdown == pytest.approx({
        "useful": 3510 * 2 / H * 0.4, "idle": 0.0, "host_bound": 0.0, "comm_bound": 3510 * 2 / H * 0.6,
        "checkpoint": 30 * 2 / H, "startup": 60 * 2 / H, "lost_to_preemption": 0.0})  # fmt: skip
    spot = jobs["spot"]  # useful 870 + 1760 s; host-bound series: 300 busy, 295 stalled, 5 idle at the start
    rest = (870 + 1760) / H
    assert spot.breakdown == pytest.approx({
        "useful": rest * 300 / 600, "idle": rest * 5 / 600, "host_bound": rest * 295 / 600, "comm_bound": 0.0,
        "checkpoint": 10 / H, "startup": (20 + 10 + 15 + 25) / H, "lost_to_preemption": 890 / H})  # fmt: skip
    assert (spot.preemptions, spot.attempts) == (1, 2) and spot.money == pytest.approx(2.0)
    oom = jobs["oom"]
    assert (oom.gpu_series, oom.oom_attempts) == (False, 1)
    assert oom.breakdown["lost_to_preemption"] + oom.breakdown["startup"] == pytest.approx(0.25)
    assert oom.breakdown["startup"] == pytest.approx(40 / H) and oom.breakdown["useful"] == 0.0
    crash = jobs["crash"]
    assert crash.breakdown["useful"] == pytest.approx(220 / H) and crash.oom_attempts == 0
    assert crash.waste_gpu_hours == pytest.approx(380 / H)


def test_window_and_team_filter(fleet: Store, home: Path) -> None:
    everything = report_of(fleet, home, since=None)
    assert "old" in {j.name for j in everything.jobs}
    assert slo_map(everything)["availability"].measured == pytest.approx(3 / 5)
    assert "old" not in {j.name for j in report_of(fleet, home).jobs}
    # From T0 + 5000 on: spot's a1 ended before (not counted), a2 ended after and the job too.
    late = report_of(fleet, home, since=T0 + 5000)
    assert {j.name for j in late.jobs} == {"spot", "crash"}
    assert {j.name: j.attempts for j in late.jobs} == {"spot": 1, "crash": 1}
    assert late.jobs_by_state == {"queued": 1, "completed": 1, "failed": 1}
    assert slo_map(late)["queue_wait_p50"].count == 2  # crash's 50 s and the open 1000 s
    vision = report_of(fleet, home, team="vision")
    assert [t.team for t in vision.teams] == ["vision"]
    assert slo_map(vision)["oom_rate"].measured == 0.0


def test_oom_seen_in_the_log_tail(fleet: Store, home: Path) -> None:
    log = home / "jobs" / "7" / "logs" / "attempt-1.log"
    log.write_text("x" * 100_000 + "\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB\n")
    slos = slo_map(report_of(fleet, home))
    assert slos["oom_rate"].measured == pytest.approx(2 / 5)
    log.write_text("torch.OutOfMemoryError: early\n" + "x" * 100_000)  # beyond the tail that is read
    assert slo_map(report_of(fleet, home))["oom_rate"].measured == pytest.approx(1 / 5)


def test_to_dict_is_json_and_write_report(fleet: Store, home: Path, tmp_path: Path) -> None:
    report = report_of(fleet, home)
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["window"]["since"] == "2023-11-14T22:13:20Z"
    assert data["breached"] == ["availability", "failure_rate", "oom_rate", "queue_wait_p95", "tokens_per_gpu_hour"]
    assert data["totals"]["jobs"] == 6 and data["totals"]["attempts"] == 6
    assert data["jobs"][0]["gpu_series"] is True and data["jobs"][2]["gpu_series"] is False
    paths = write_report(report, tmp_path / "out")
    assert sorted(p.name for p in paths) == sorted(
        ["report.md", "report.json", "teams.png", "waste.png", "queue_wait.png", "slo.png"]
    )
    for p in paths:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    assert json.loads((tmp_path / "out" / "report.json").read_text()) == data
    md = (tmp_path / "out" / "report.md").read_text()
    assert "**BREACHED**" in md and "![waste](waste.png)" in md and "#1 done" in md
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is a file"):
        write_report(report, tmp_path / "file")


def test_empty_fleet_report_and_charts(home: Path, tmp_path: Path) -> None:
    store = Store(home / "state.db")
    report = build_fleet_report(store, home, since=None, now=NOW, rates=CARD, gpu_samples=gpu_samples, slo=SloConfig())
    assert all(s.met is None and s.count == 0 for s in report.slos)
    assert report.jobs == () and report.teams == ()
    assert len(write_report(report, tmp_path / "empty")) == 6


# --- --since -------------------------------------------------------------------------------------


def test_parse_since() -> None:
    assert parse_since("24h", NOW) == NOW - 86_400
    assert parse_since("7d", NOW) == NOW - 7 * 86_400
    assert parse_since("90m", NOW) == NOW - 5_400
    assert parse_since("2023-11-14", NOW) == datetime(2023, 11, 14, tzinfo=UTC).timestamp()
    assert parse_since("2023-11-14T22:13:20", NOW) == T0
    assert parse_since("2023-11-15T00:13:20+02:00", NOW) == T0
    for bad in ("yesterday", "24", "5y", "0h", "2023-13-01"):
        with pytest.raises(UsageError, match=f"since='{bad}'.*90m, 24h or 7d.*ISO"):
            parse_since(bad, NOW)
    with pytest.raises(UsageError, match="in the future"):
        parse_since("2030-01-01", NOW)


# --- the command ---------------------------------------------------------------------------------


def cli() -> Callable[..., Any]:
    app = typer.Typer()
    app.command()(report_command)

    def run(*args: str) -> Any:
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})

    return run


@pytest.fixture
def rates_file(tmp_path: Path) -> Path:
    path = tmp_path / "rates.yaml"
    path.write_text(
        "currency: USD\nrates:\n"
        "  - {gpu_type: H100, provider: lambda, on_demand: 4.0, spot: 2.0}\n"
        "  - {gpu_type: A100, on_demand: 2.0}\n"
    )
    return path


def test_command_json_out_and_fail_on_breach(fleet: Store, home: Path, rates_file: Path, tmp_path: Path) -> None:
    run = cli()
    since = "2023-11-14T22:13:20"
    result = run("--since", since, "--rates", str(rates_file), "--json", "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["window"]["since_ts"] == T0
    assert {t["team"]: t["money"] for t in data["teams"]} == pytest.approx(
        {"nlp": 8.5, "vision": 2.0 + 300 / H * 4.0 + 600 / H * 2.0}
    )
    slos = {s["name"]: s for s in data["slos"]}
    assert slos["availability"]["measured"] == pytest.approx(0.5)
    assert slos["tokens_per_s_per_job"]["met"] is None  # no target by default
    assert (tmp_path / "r" / "report.md").exists() and len(data["files"]) == 6
    assert run("--since", since, "--rates", str(rates_file), "--json", "--fail-on-breach").exit_code == 1
    team = json.loads(run("--team", "nlp", "--rates", str(rates_file), "--json").stdout)
    assert [t["team"] for t in team["teams"]] == ["nlp"]
    text = run("--since", since, "--rates", str(rates_file))
    assert text.exit_code == 0
    assert "BREACHED" in text.stdout and "worst 5 jobs by waste" in text.stdout and "#1 done" in text.stdout


def test_command_slo_file(fleet: Store, home: Path, rates_file: Path, tmp_path: Path) -> None:
    run = cli()
    lenient = tmp_path / "slo.yaml"
    lenient.write_text(
        # The queued job has waited since 2023 by the real clock: no wait target can hold.
        "availability: 0.4\nfailure_rate: 0.5\noom_rate: 0.25\nqueue_wait_p95_s: null\nqueue_wait_p50_s: null\n"
    )
    result = run("--since", "2023-11-14T22:13:20", "--rates", str(rates_file), "--slo", str(lenient), "--json",
                 "--fail-on-breach")  # fmt: skip
    data = json.loads(result.stdout)
    assert data["breached"] == [] and result.exit_code == 0
    met = {s["name"]: s["met"] for s in data["slos"]}
    assert met["queue_wait_p50"] is None and met["availability"] is True and met["oom_rate"] is True
    typo = tmp_path / "typo.yaml"
    typo.write_text("availabilty: 0.99\n")
    bad = run("--slo", str(typo))
    assert isinstance(bad.exception, UsageError) and "availabilty: unknown field" in str(bad.exception)
    bad = run("--since", "last week")
    assert isinstance(bad.exception, UsageError) and "'last week'" in str(bad.exception)


def test_command_reads_recorded_gpu_series(
    fleet: Store, home: Path, rates_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Path] = []

    def job_gpu_samples(job_folder: Path) -> list[Sample]:
        asked.append(job_folder)
        return synthetic("comm_bound", gpus=2) if job_folder.name == "1" else []

    reader = types.ModuleType("gpufleet.telemetry.gpu")
    reader.job_gpu_samples = job_gpu_samples  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpufleet.telemetry.gpu", reader)
    data = json.loads(cli()("--rates", str(rates_file), "--json").stdout)
    assert {j["name"]: j["gpu_series"] for j in data["jobs"]}["done"] is True
    done = next(j for j in data["jobs"] if j["name"] == "done")
    assert done["breakdown"]["comm_bound"] == pytest.approx(3510 * 2 / H * 0.6)
    assert home / "jobs" / "1" in asked
    # A gpufleet without the reader: no job has a series, and the report still runs.
    monkeypatch.setitem(sys.modules, "gpufleet.telemetry.gpu", types.ModuleType("gpufleet.telemetry.gpu"))
    data = json.loads(cli()("--rates", str(rates_file), "--json").stdout)
    assert all(j["gpu_series"] is False for j in data["jobs"])
