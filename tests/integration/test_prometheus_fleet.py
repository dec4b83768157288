"""The preemption scenario under a real Prometheus: PromQL and gpufleet agree on GPU-hours, money and tensor use.

A two-GPU job with synthetic DCGM series (``telemetry.gpu_source: synthetic:healthy``) runs on the
local backend, is preempted by the scheduler, resumes and finishes. Each attempt serves its job
metrics and its GPU series on one endpoint that registers itself with Prometheus (``file_sd``).
Afterwards the test asks Prometheus, over its HTTP API, for the job's GPU-hours and its mean
tensor-pipe activity, and compares them with gpufleet's own figures: the cost ledger's GPU-hours
and the mean of the GPU series the job recorded.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends import get_backend
from gpufleet.cost.ledger import build_ledger
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import store_usages
from gpufleet.jobs.store import Store, latest_step
from gpufleet.paths import job_dir
from gpufleet.spec import parse_spec
from gpufleet.telemetry.gpu import job_gpu_samples

SCRAPE_S = 1.0  # scripts/dev-prometheus scrapes every second
GPUS = 2


def wait_for(until: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


@pytest.mark.timeout(240)
def test_promql_gpu_hours_and_tensor_activity_match_gpufleet(
    home: Path,
    prometheus_targets: Path,
    promql: Callable[[str], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"fleet{os.getpid()}x{int(time.time())}"
    for key, value in {
        "GPUFLEET_METRICS_PORT": "0",
        "GPUFLEET_PROMETHEUS_TARGETS": str(prometheus_targets),
        "GPUFLEET_LOG_EVERY_S": "0",
        "GPUFLEET_SCHEDULER_IDLE_S": "2",
        "GPUFLEET_LOCAL_SLOTS": str(GPUS),
    }.items():
        monkeypatch.setenv(key, value)
    spec = parse_spec(
        {
            "name": name,
            "team": "perception",
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": 400, "step_seconds": 0.05},
            "resources": {"cpus": 1, "gpus": GPUS, "gpu_type": "H100"},
            "spot": True,
            "checkpoint": {"every_steps": 20, "grace_seconds": 10},
            "telemetry": {"gpu_source": "synthetic:healthy", "sample_seconds": 1, "precision": "bf16"},
        }
    )
    backend = get_backend("local", home)
    job = backend.submit(spec)
    store = Store(home / "state.db")
    selector = f'job_name="{name}"'

    def scraped(attempt: int) -> bool:
        return bool(promql(f'DCGM_FI_DEV_GPU_UTIL{{{selector},attempt="{attempt}"}}'))

    # Prometheus's discovery hands new file_sd targets to the scrapers every 5 s: preempt only once
    # the first attempt has been scraped, so that both attempts are in Prometheus's figures.
    wait_for(lambda: store.job(job).state == "running" and (latest_step(store, job) or 0) >= 90, 90)
    try:
        wait_for(lambda: scraped(1), 60)
    except AssertionError:
        raise AssertionError(f"attempt 1 never scraped; up: {promql(f'up{{{selector}}}')}") from None
    assert store.job(job).state == "running", "the job ended before Prometheus scraped it"
    backend.preempt(job)
    wait_for(lambda: store.job(job).state == "completed" or scraped(2), 120)
    wait_for(lambda: store.job(job).state == "completed", 120)
    assert len(store.attempts(job)) == 2

    # gpufleet's figures: the ledger's GPU-hours, and the mean of the series the job recorded.
    cost = build_ledger(store_usages(store, job_ids=[job]), load_rates()).jobs[job]
    samples = job_gpu_samples(job_dir(home, job))
    tensor = [s.value for s in samples if s.name == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
    assert {s.labels["attempt"] for s in samples} == {"1", "2"} and tensor
    ours_tensor = sum(tensor) / len(tensor)

    # Prometheus's figures; its last scrapes of the second attempt may lag the job's end a little.
    window = f"[{math.ceil(time.time() - store.job(job).submitted_at) + 60}s]"

    def prom_value(expr: str) -> float:
        found = promql(expr)
        return float(found[0]["value"][1]) if found else math.nan

    gpu_hours = math.nan
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        gpu_hours = prom_value(f"sum(count_over_time(DCGM_FI_DEV_GPU_UTIL{{{selector}}}{window})) * {SCRAPE_S} / 3600")
        if gpu_hours > 0:
            break
        time.sleep(1)
    prom_gpu_seconds = prom_value(f"sum(max_over_time(gpufleet_job_gpu_seconds_total{{{selector}}}{window}))")
    prom_money = prom_value(f"sum(max_over_time(gpufleet_job_cost_total{{{selector}}}{window}))")
    prom_tensor = prom_value(f"avg(avg_over_time(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{selector}}}{window}))")
    per_gpu = promql(f"count by (gpu, attempt) (count_over_time(DCGM_FI_DEV_GPU_UTIL{{{selector}}}{window}))")

    # Every GPU of both attempts was scraped, with dcgm-exporter's labels and gpufleet's target labels.
    assert sorted((r["metric"]["attempt"], r["metric"]["gpu"]) for r in per_gpu) == [
        ("1", "0"),
        ("1", "1"),
        ("2", "0"),
        ("2", "1"),
    ]
    # GPU-hours. The exporter's counter (GPUs x seconds since the session started) is read at each
    # attempt's last scrape: it misses the start-up before the session and the tail after that scrape
    # (allow five seconds a GPU an attempt), and never counts more than the ledger does.
    startup = cost.gpu_hours["startup"] + cost.gpu_hours["restore"]
    tail = GPUS * 2 * 5.0 / 3600
    hours = prom_gpu_seconds / 3600
    assert cost.total_gpu_hours - startup - tail <= hours <= cost.total_gpu_hours, (hours, cost, startup)
    # Money: the same GPU time at the rate card's price, as the ledger prices it.
    assert prom_money == pytest.approx(hours * cost.money / cost.total_gpu_hours, rel=1e-6)
    # The DCGM series, one sample a scrape, can only count the time Prometheus saw.
    assert 0 < gpu_hours <= cost.total_gpu_hours + GPUS * 2 * SCRAPE_S / 3600, (gpu_hours, cost.total_gpu_hours)
    # Mean tensor-pipe activity: Prometheus scraped (almost) the same rounds gpufleet recorded.
    assert 0.3 < ours_tensor < 0.6
    assert abs(prom_tensor - ours_tensor) < 0.02, (prom_tensor, ours_tensor)
