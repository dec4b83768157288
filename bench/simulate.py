"""Speed of the fleet simulator: 100,000 jobs over 3 providers x 2 GPU types, one policy at a time.

    .venv/bin/python bench/simulate.py [--json] [--jobs 100000] [--days 20] [--policy cheapest ...] [--trace-memory]

Target: the whole run of one policy (drawing the jobs and outages, simulating, computing the
metrics) in at most 30 s on 2 cores. The simulator is one Python thread, so the figure judged is
the run's CPU time, which is its wall time on an idle machine and stays meaningful on a shared one;
the wall time is printed beside it. The catalogue below has 12 offers (3 providers x 2 regions x
H100/L40S, 1,344 GPUs) and three teams in one cohort; 100,000 default-mix jobs over 20 days load it
to about 70 % with daily peaks above capacity, so queues, quotas, preemptions and outages all work.
The baseline, measured in the same run, is a bare ``heapq`` push and pop of as many tuples as the
simulation has jobs times four (arrival, start, end, requeue): the ratio is the simulator's cost per
job in units of the cheapest possible event loop.

Memory: the process's peak RSS (``ru_maxrss``) and its rise over the RSS before the first policy
ran; with ``--trace-memory``, each policy runs once more under ``tracemalloc`` (not timed), which
gives the peak that policy's run allocated (the drawn scenario, the simulation and its metrics).
"""

from __future__ import annotations

import heapq
import sys
import time
from typing import Any

import _common as common

from gpufleet.placement.catalog import Catalog, parse_catalog
from gpufleet.placement.policies import POLICIES
from gpufleet.placement.simulate import build_scenario, simulate
from gpufleet.placement.workload import WorkloadModel

TARGET_S = 30.0
PROVIDERS = {  # on-demand and spot USD per GPU-hour for an H100, spot preemptions per hour, egress per GB
    "aws": (6.88, 2.60, 0.10, 0.09),
    "gcp": (11.06, 3.70, 0.08, 0.12),
    "azure": (6.98, 3.10, 0.15, 0.087),
}


def bench_catalog() -> Catalog:
    offers = []
    for provider, (od, spot, rate, egress) in PROVIDERS.items():
        for region in ("east", "west"):
            row = {"provider": provider, "region": region, "gpus_per_node": 8, "egress_per_gb": egress}
            offers.append(
                {
                    **row,
                    "gpu_type": "H100",
                    "on_demand_per_gpu_hour": od,
                    "spot_per_gpu_hour": spot,
                    "capacity_gpus": 128,
                    "spot_preemptions_per_hour": rate,
                }
            )
            offers.append(
                {
                    **row,
                    "gpu_type": "L40S",
                    "on_demand_per_gpu_hour": round(od / 2.7, 2),
                    "spot_per_gpu_hour": round(spot / 2.5, 2),
                    "capacity_gpus": 96,
                    "spot_preemptions_per_hour": rate / 2,
                }
            )
    quotas = [
        {"team": team, "gpu_type": gpu, "nominal": nominal, "borrowing_limit": borrow, "cohort": "research"}
        for team, gpu, nominal, borrow in (
            ("perception", "H100", 300, 200),
            ("language", "H100", 300, 200),
            ("robotics", "H100", 168, 100),
            ("perception", "L40S", 200, 100),
            ("language", "L40S", 200, 100),
            ("robotics", "L40S", 176, 100),
        )
    ]
    return parse_catalog(
        {
            "as_of": "2026-12-01",
            "gpu_types": {
                "H100": {"memory_gib": 80, "throughput": {"training": 1.0, "finetune": 1.0}},
                "L40S": {"memory_gib": 48, "throughput": {"training": 0.35, "finetune": 0.5}},
            },
            "offers": offers,
            "quotas": quotas,
        }
    )


def heap_baseline(events: int) -> float:
    started = time.process_time()
    heap: list[tuple[float, int, int, int, int]] = []
    for i in range(events):
        heapq.heappush(heap, ((i * 7919) % events / events, i, 0, i, 0))
    while heap:
        heapq.heappop(heap)
    return time.process_time() - started


def run_policy(cat: Catalog, model: WorkloadModel, policy: str, jobs: int, days: float) -> dict[str, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    scenario = build_scenario(cat, model, jobs=jobs, days=days, seed=0)
    result = simulate(
        cat,
        scenario.jobs,
        policy,
        horizon_h=scenario.horizon_h,
        outages=scenario.outages,
        seed=scenario.preemption_seed,
        workload=model,
    )
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    capacity = sum(o.capacity_gpus for o in cat.offers) * scenario.horizon_h
    m = result.overall
    return {
        "policy": policy,
        "cpu_s": cpu,
        "wall_s": wall,
        "jobs_per_s": jobs / cpu if cpu else float("inf"),
        "completed": m.completed,
        "utilization": m.gpu_hours / capacity,
        "queue_wait_p95_h": m.queue_wait_p95_h,
        "preemptions": m.preemptions,
        "outage_kills": m.outage_kills,
    }


def main() -> int:
    p = common.parser(__doc__ or "")
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--days", type=float, default=20.0)
    p.add_argument("--policy", action="append", choices=list(POLICIES), help="repeat; default: every policy")
    p.add_argument("--trace-memory", action="store_true", help="run each policy once more under tracemalloc")
    args = p.parse_args()
    cat, model = bench_catalog(), WorkloadModel()
    runs = []
    rss_before = common.peak_rss_mib()
    for policy in args.policy or list(POLICIES):
        common.progress(f"simulating {args.jobs} jobs over {args.days:g} days with {policy} ...")
        runs.append(run_policy(cat, model, policy, args.jobs, args.days))
    rss_peak = common.peak_rss_mib()
    for run in runs if args.trace_memory else ():
        common.progress(f"tracing the memory of {run['policy']} ...")
        policy = str(run["policy"])
        traced = common.traced_mib(lambda: run_policy(cat, model, policy, args.jobs, args.days))  # noqa: B023
        run["traced_peak_mib"] = traced[0]
    baseline = heap_baseline(4 * args.jobs)
    worst = max(r["cpu_s"] for r in runs)
    ok = worst <= TARGET_S
    rows = [
        [
            r["policy"],
            f"{r['cpu_s']:.2f} s",
            f"{r['wall_s']:.2f} s",
            f"{r['jobs_per_s']:,.0f}",
            f"{common.ratio(r['cpu_s'], baseline):.0f}x",
            f"{r['completed']:,}",
            f"{r['utilization']:.0%}",
            f"{r['queue_wait_p95_h'] or 0:.2f} h",
            f"{r['preemptions']:,}",
            f"{r['traced_peak_mib']:.0f} MiB" if "traced_peak_mib" in r else "-",
        ]
        for r in runs
    ]
    rows.append(["bare heapq loop (baseline)", f"{baseline:.2f} s", "", "", "1x", "", "", "", "", ""])
    head = ["policy", "CPU", "wall", "jobs/s", "vs heap", "completed", "GPU use", "wait p95", "preempted"]
    head.append("traced peak")
    title = f"Fleet simulator, {args.jobs:,} jobs over {args.days:g} days, {len(cat.offers)} offers"
    table = common.format_table(title, head, rows)
    table += f"\npeak RSS {rss_peak:.0f} MiB (+{rss_peak - rss_before:.0f} MiB over the RSS before the first policy)"
    result = {
        "jobs": args.jobs,
        "days": args.days,
        "runs": runs,
        "baseline_s": baseline,
        "target_s": TARGET_S,
        "peak_rss_mib": rss_peak,
        "rss_rise_mib": rss_peak - rss_before,
    }
    verdict = f"slowest policy {worst:.2f} s CPU for {args.jobs:,} jobs (target <= {TARGET_S:g} s)"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main())
