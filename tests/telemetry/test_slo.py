"""SLO targets (YAML, defaults), their judgement and error budgets, and OOM detection end to end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from conftest import drive

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.cost.fleet import build_fleet_report
from gpufleet.cost.rates import load_rates
from gpufleet.errors import UsageError
from gpufleet.jobs.store import Event
from gpufleet.spec import parse_spec
from gpufleet.telemetry.slo import SloConfig, SloInputs, died_of_oom, evaluate_slos, load_slo, percentile

# --- the targets ---------------------------------------------------------------------------------


def test_defaults_and_yaml_overrides(tmp_path: Path) -> None:
    assert load_slo(None) == SloConfig()
    assert SloConfig().availability == 0.99 and SloConfig().oom_rate == 0.01
    assert SloConfig().queue_wait_p95_s == 600.0 and SloConfig().tokens_per_gpu_hour is None
    path = tmp_path / "slo.yaml"
    path.write_text("availability: 0.995\nqueue_wait_p95_s: 300\ntokens_per_gpu_hour: 1.0e6\noom_rate: null\n")
    slo = load_slo(path)
    assert (slo.availability, slo.queue_wait_p95_s, slo.tokens_per_gpu_hour, slo.oom_rate) == (0.995, 300, 1e6, None)
    assert slo.failure_rate == SloConfig().failure_rate  # untouched fields keep their defaults
    path.write_text("")
    assert load_slo(path) == SloConfig()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("availabilty: 0.99\n", "availabilty: unknown field"),
        ("availability: 1.5\n", "availability: Input should be less than 1"),
        ("queue_wait_p95_s: -1\n", "queue_wait_p95_s: Input should be greater than or equal to 0"),
        ("oom_rate: .nan\n", "oom_rate"),
        ("- availability\n", "an SLO file must be a YAML mapping"),
        ("availability: [\n", "malformed YAML at line"),
    ],
)
def test_bad_slo_files_are_usage_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as err:
        load_slo(path)
    assert str(path) in str(err.value)
    with pytest.raises(UsageError, match="cannot read SLO file"):
        load_slo(tmp_path / "missing.yaml")


# --- judgement -----------------------------------------------------------------------------------


def test_percentile_interpolates_between_order_statistics() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([40.0, 10.0, 30.0, 20.0], 50) == pytest.approx(25.0)  # rank 1.5 of 10 20 30 40
    assert percentile([10.0, 20.0, 30.0, 40.0, 50.0], 95) == pytest.approx(48.0)  # rank 3.8


def test_budgets_and_verdicts() -> None:
    inputs = SloInputs(
        jobs_completed=199,
        jobs_failed=1,
        attempts_ended=400,
        attempts_failed=10,
        attempts_oom=2,
        queue_waits_s=(10.0,) * 18 + (700.0, 900.0),
        job_tokens_per_s=(100.0, 300.0, 200.0),
        tokens=9e6,
        token_gpu_hours=3.0,
    )
    config = SloConfig(availability=0.99, failure_rate=0.05, oom_rate=0.01, tokens_per_s_per_job=250.0)
    r = {s.name: s for s in evaluate_slos(inputs, config)}
    # 1 failure in 200 ended jobs against a 1 % budget: half of it spent.
    assert r["availability"].measured == pytest.approx(0.995) and r["availability"].met is True
    assert r["availability"].error_budget_remaining == pytest.approx(0.5)
    assert r["failure_rate"].measured == pytest.approx(0.025)
    assert r["failure_rate"].error_budget_remaining == pytest.approx(0.5)
    assert r["oom_rate"].measured == pytest.approx(0.005) and r["oom_rate"].met is True
    assert r["oom_rate"].error_budget_remaining == pytest.approx(0.5)
    # 2 of 20 waits above 600 s; p95 allows 5 % of them: 10 % is twice the budget.
    p95 = r["queue_wait_p95"]
    assert p95.measured == pytest.approx(700.0 + 0.05 * 200.0)  # rank 18.05
    assert (p95.met, p95.count) == (False, 20)
    assert p95.error_budget_remaining == pytest.approx(1 - 0.10 / 0.05)
    assert (r["queue_wait_p50"].measured, r["queue_wait_p50"].met) == (10.0, True)
    assert r["queue_wait_p50"].error_budget_remaining == pytest.approx(1 - 0.10 / 0.5)
    # Median of 100, 300, 200 tokens/s = 200 < 250; fleet-wide 3e6 tokens/GPU-h, no target.
    assert (r["tokens_per_s_per_job"].measured, r["tokens_per_s_per_job"].met) == (200.0, False)
    assert r["tokens_per_gpu_hour"].measured == pytest.approx(3e6) and r["tokens_per_gpu_hour"].met is None
    assert r["tokens_per_gpu_hour"].error_budget_remaining is None
    assert r["tokens_per_s_per_job"].to_dict()["comparison"] == ">="


def test_no_data_is_not_judged() -> None:
    for result in evaluate_slos(SloInputs(), SloConfig()):
        assert (result.measured, result.met, result.error_budget_remaining, result.count) == (None, None, None, 0)
    lone = {s.name: s for s in evaluate_slos(SloInputs(jobs_completed=3), SloConfig(availability=None))}
    assert (lone["availability"].measured, lone["availability"].met) == (1.0, None)


# --- OOM detection -------------------------------------------------------------------------------


def end(error: str | None) -> Event:
    data: dict[str, Any] = {"status": "failed", "step": 3} | ({"error": error} if error else {})
    return Event(1, 1, 0.0, "session_end", "runtime", data)


def no_log() -> str:
    raise AssertionError("the log was read although the events already told")


@pytest.mark.parametrize(
    "error", ["OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "RuntimeError: out of memory"]
)
def test_oom_from_the_session_end_error(error: str) -> None:
    assert died_of_oom("failed", [end(error)], no_log)
    for outcome in ("completed", "cancelled", "running", None):
        assert not died_of_oom(outcome, [end(error)], no_log)


def test_oom_from_the_log_tail() -> None:
    assert died_of_oom("failed", [end("ValueError: x")], lambda: "torch.OutOfMemoryError: CUDA out of memory.")
    assert died_of_oom("lost", [], lambda: "RuntimeError: CUDA out of memory. Tried to allocate")
    assert not died_of_oom("failed", [end("ValueError: x")], lambda: "ValueError: x\n")
    assert not died_of_oom("failed", [], lambda: "host out of memory")  # not PyTorch's allocator


# --- end to end: oom@N through the local backend -------------------------------------------------


def test_oom_fault_counts_as_an_oom_attempt(local: tuple[LocalBackend, LocalScheduler], home: Path) -> None:
    backend, scheduler = local
    spec = {
        "name": "oomer",
        "team": "t",
        "entrypoint": "gpufleet.workloads.toy:train",
        "args": {"steps": 30, "step_seconds": 0.0},
        "checkpoint": {"every_steps": 10},
    }
    oomer = backend.submit(parse_spec(spec), env={"GPUFLEET_FAULT": "oom@15"})
    fine = backend.submit(parse_spec({**spec, "name": "fine"}))
    drive(scheduler, lambda: {backend.store.job(j).state for j in (oomer, fine)} == {"failed", "completed"})
    assert backend.store.job(oomer).state == "failed"
    ended = backend.store.last_event(oomer, "session_end")
    assert ended is not None and ended.data["step"] == 15
    assert ended.data["error"].startswith("OutOfMemoryError: CUDA out of memory")
    log = (home / "jobs" / str(oomer) / "logs" / "attempt-1.log").read_text()
    assert "torch.OutOfMemoryError: CUDA out of memory" in log
    report = build_fleet_report(
        backend.store,
        home,
        since=None,
        now=time.time(),
        rates=load_rates(),
        gpu_samples=lambda job_id: [],
        slo=SloConfig(),
    )
    oom = next(s for s in report.slos if s.name == "oom_rate")
    assert oom.measured == pytest.approx(0.5) and (oom.count, oom.met) == (2, False)
    assert {j.name: j.oom_attempts for j in report.jobs} == {"oomer": 1, "fine": 0}
