"""What a preemption's restart costs with the local scheduler's warm start, against a cold start.

    .venv/bin/python bench/warm_start.py [--json]

Runs the demo's two jobs (``gpufleet demo``: a low-priority tiny LM preempted by a high-priority
one, then restarted) on a fresh ``GPUFLEET_HOME`` twice, with the warm start on and off
(``GPUFLEET_WARM_START``), and times a cold ``python -c "import torch"`` three times in the same
run. For each run it prints, from the job's cost ledger (the numbers the demo prints), the
preempted job's "restart start-up and shut-down" and its whole preemption cost as a share of the
job, and checks that no step was lost. Target: warm restart start-up and shut-down <= 0.5 x the
cold import (exit 1 otherwise, or when a step was lost or a job did not complete).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as common

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.local.warm import WarmProcess
from gpufleet.cli.demo import PREEMPT_AFTER, demo_specs
from gpufleet.cost.gather import cost_report
from gpufleet.jobs.store import latest_step

TIMEOUT_S = 900.0


def cold_import_s() -> float:
    """The median wall time of a new interpreter importing torch (start to exit)."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - start)
    return common.median(times)


def drive(scheduler: LocalScheduler, until: Any, forked: dict[tuple[int, int], bool]) -> None:
    """Tick as the demo does until ``until()``, noting which attempts were forked warm."""
    deadline = time.monotonic() + TIMEOUT_S
    while not until():
        if time.monotonic() > deadline:
            raise TimeoutError("the demo's jobs did not finish in time")
        scheduler.tick()
        for job_id, run in scheduler.running.items():
            forked.setdefault((job_id, run.n), isinstance(run.proc, WarmProcess))
        time.sleep(0.05)  # the demo's own poll


def demo_run(warm: bool) -> dict[str, Any]:
    """The demo's two jobs on a fresh home; the preempted job's restart cost from its ledger."""
    os.environ["GPUFLEET_WARM_START"] = "1" if warm else "0"
    with tempfile.TemporaryDirectory(prefix="gpufleet-warm-bench-") as tmp:
        home = Path(tmp)
        backend = LocalBackend(home, spawn=False)
        scheduler = LocalScheduler(home, slots=1, poll_s=0.05)
        scheduler.prepare()  # as the demo does: the warm server imports while the first job is submitted
        store = backend.store
        low_spec, high_spec = demo_specs()
        forked: dict[tuple[int, int], bool] = {}
        try:
            low = backend.submit(low_spec)
            drive(scheduler, lambda: (latest_step(store, low) or 0) >= PREEMPT_AFTER, forked)
            high = backend.submit(high_spec)
            drive(scheduler, lambda: all(store.job(j).state in ("completed", "failed") for j in (low, high)), forked)
        finally:
            scheduler.shutdown()
        cost = cost_report(store).ledger.jobs[low]
        saved = [e.data.get("step") for e in store.events(low, kinds=("checkpoint",)) if e.attempt == 1]
        restored = [e.data.get("step") for e in store.events(low, kinds=("restore",)) if e.attempt == 2]
        return {
            "warm": warm,
            "completed": all(store.job(j).state == "completed" for j in (low, high)),
            "attempts": len(store.attempts(low)),
            "restart_forked_warm": forked.get((low, 2), False),
            "restart_to_first_step_s": first_step_s(store, low, 2),
            "restart_startup_shutdown_s": cost.preemption_gpu_hours["startup"] * 3600.0,
            "preemption_overhead_s": cost.preemption_overhead_gpu_hours * 3600.0,
            "preemption_share": cost.preemption_share,
            "steps_lost": (max(s for s in saved if s is not None) - restored[0]) if saved and restored else None,
        }


def first_step_s(store: Any, job: int, n: int) -> float | None:
    """Seconds from the attempt's start to its first training step (restore included)."""
    started = next((a.started_at for a in store.attempts(job) if a.n == n), None)
    first = next((e.ts for e in store.events(job, kinds=("train_start",)) if e.attempt == n), None)
    return None if started is None or first is None else round(first - started, 3)


def main() -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    common.progress("cold `python -c 'import torch'` ...")
    cold = cold_import_s()
    runs = []
    for warm in (True, False):
        common.progress(f"the demo's jobs, warm start {'on' if warm else 'off'} ...")
        runs.append(demo_run(warm))
    warm_run, cold_run = runs
    ok = (
        all(r["completed"] and r["steps_lost"] == 0 and r["attempts"] == 2 for r in runs)
        and warm_run["restart_forked_warm"]
        and warm_run["restart_startup_shutdown_s"] <= 0.5 * cold
    )
    result = {
        "cold_import_torch_s": round(cold, 3),
        "runs": runs,
        "warm_over_cold_import": round(common.ratio(warm_run["restart_startup_shutdown_s"], cold), 3),
        "warm_over_cold_restart": round(
            common.ratio(warm_run["restart_startup_shutdown_s"], cold_run["restart_startup_shutdown_s"]), 3
        ),
    }
    rows = [
        [
            "on" if r["warm"] else "off",
            f"{r['restart_startup_shutdown_s']:.2f}",
            f"{r['preemption_overhead_s']:.2f}",
            f"{r['preemption_share']:.1%}",
            str(r["steps_lost"]),
            str(r["completed"]),
            "warm" if r["restart_forked_warm"] else "cold",
            f"{r['restart_to_first_step_s']}",
        ]
        for r in runs
    ]
    table = common.format_table(
        f"restart of the demo's preempted job; cold `python -c 'import torch'`: {cold:.2f} s (median of 3)",
        [
            "warm start",
            "start-up+shut-down s",
            "preemption s",
            "of job",
            "steps lost",
            "completed",
            "restart",
            "to step s",
        ],
        rows,
    )
    verdict = (
        f"warm restart start-up and shut-down = {result['warm_over_cold_import']:.2f} x cold import "
        f"(target <= 0.5), {result['warm_over_cold_restart']:.2f} x the cold restart; no step lost"
    )
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main())
