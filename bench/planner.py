"""Time to plan 10,000 jobs over 200 offers: the placement planner must keep up with a real queue.

    .venv/bin/python bench/planner.py [--json] [--jobs 10000] [--offers 200] [--repeats 3] [--seed N]

The script builds a synthetic catalogue (``--offers`` offers: GPU types x providers x regions,
with spot markets, preemption rates, egress prices and team quotas in two cohorts) and a synthetic
batch (``--jobs`` JobSpecs with mixed GPU counts, spot permission, ``any_of``/``ordered``
preferences, deadlines, checkpoint sizes and priorities), then times ``plan()`` (the median of
``--repeats`` runs; building the specs is not timed). Target: <= 1 s with numpy limited to two
threads, as on a two-core runner.

Baseline, in the same run: the same expected-cost arithmetic done candidate by candidate in plain
Python for a sample of jobs, scaled to the whole batch. It also checks that the vectorised costs
agree with it (a wrong fast planner is no use), and the time to read every decision's rejected
candidates is shown for information (explanations are built when read).
"""

from __future__ import annotations

import math
import os
import random
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import _common as common

from gpufleet.placement.catalog import Catalog, Offer, parse_catalog
from gpufleet.placement.planner import plan
from gpufleet.spec import JobSpec, parse_spec

TARGET_S = 1.0
TYPES = {
    "H100": (80, {"training": 1.0, "finetune": 1.0, "eval": 1.0}),
    "A100": (80, {"training": 0.45, "finetune": 0.6, "eval": 0.6}),
    "L40S": (48, {"training": 0.35, "finetune": 0.5, "eval": 0.7}),
    "L4": (24, {"finetune": 0.15, "eval": 0.3}),
}
TEAMS = ["perception", "language", "planning", "speech", "infra", "research"]


def build_catalog(n_offers: int, rng: random.Random) -> Catalog:
    types = list(TYPES)
    providers = [f"p{i:02d}" for i in range(max(1, math.ceil(n_offers / (len(types) * 5))))]
    offers = []
    for i in range(n_offers):
        gpu_type = types[i % len(types)]
        provider = providers[(i // len(types)) % len(providers)]
        region = f"r{i // (len(types) * len(providers))}"
        base = {"H100": 4.0, "A100": 2.2, "L40S": 1.5, "L4": 0.8}[gpu_type] * rng.uniform(0.6, 1.6)
        spot = round(base * rng.uniform(0.3, 0.8), 3) if rng.random() < 0.7 else None
        offers.append(
            {
                "provider": provider,
                "region": region,
                "gpu_type": gpu_type,
                "gpus_per_node": rng.choice([1, 4, 8]) if gpu_type in ("L40S", "L4") else 8,
                "on_demand_per_gpu_hour": round(base, 3),
                "spot_per_gpu_hour": spot,
                "capacity_gpus": rng.choice([256, 512, 1024]),
                "spot_preemptions_per_hour": round(rng.uniform(0.0, 0.5), 3),
                "egress_per_gb": round(rng.uniform(0.0, 0.12), 3),
            }
        )
    quotas = [
        {
            "team": team,
            "gpu_type": gpu_type,
            "nominal": 2000,
            "borrowing_limit": 2000,
            "lending_limit": 1000,
            "cohort": "lab" if i % 2 else "prod",
        }
        for i, team in enumerate(TEAMS)
        for gpu_type in ("H100", "A100")
    ]
    gpu_types = {name: {"memory_gib": mem, "throughput": tp} for name, (mem, tp) in TYPES.items()}
    return parse_catalog({"as_of": "2026-12-01", "gpu_types": gpu_types, "offers": offers, "quotas": quotas})


def build_jobs(n_jobs: int, catalog: Catalog, rng: random.Random) -> list[JobSpec]:
    providers = catalog.providers
    jobs = []
    for i in range(n_jobs):
        gpu_type = rng.choice(["H100", "A100", "L40S"])
        placement: dict[str, object] = {
            "workload": rng.choice(["training", "finetune", "eval"]),
            "gpu_hours": round(rng.uniform(1, 500), 1),
            "checkpoint_gb": rng.choice([0, 10, 100]),
            "restore_seconds": 60,
        }
        if rng.random() < 0.5:
            placement["save_seconds"] = rng.choice([10, 30, 90])
        if rng.random() < 0.3:
            placement["deadline_hours"] = rng.choice([24, 72, 168])
        kind = rng.random()
        if kind < 0.3:
            placement["any_of"] = [{"gpu_type": "H100"}, {"gpu_type": "L40S"}]
        elif kind < 0.45:
            placement["ordered"] = [{"provider": p} for p in rng.sample(providers, 3)]
        jobs.append(
            parse_spec(
                {
                    "name": f"job-{i}",
                    "team": rng.choice(TEAMS),
                    "entrypoint": "m.n:f",
                    "resources": {"gpu_type": gpu_type, "gpus": rng.choice([1, 2, 4, 8, 8, 16])},
                    "priority": rng.choice([0, 0, 0, 5, 10]),
                    "spot": rng.random() < 0.6,
                    "provider": rng.choice([*providers[:3], "local"]),
                    "placement": placement,
                }
            )
        )
    return jobs


def python_costs(job: JobSpec, catalog: Catalog) -> dict[tuple[str, bool], float]:
    """Expected cost of every candidate of one job, one candidate at a time (the baseline)."""
    p, egress = job.placement, dict[str, float]()
    for o in catalog.offers:
        egress[o.provider] = max(egress.get(o.provider, 0.0), o.egress_per_gb)
    out: dict[tuple[str, bool], float] = {}
    types = job_types(job)
    for o in catalog.offers:
        r = catalog.throughput(o.gpu_type, p.workload)
        if o.gpu_type not in types or r is None:
            continue
        nodes = math.ceil(job.resources.gpus / o.gpus_per_node)
        alloc = nodes * o.gpus_per_node
        hours = (p.gpu_hours or job.resources.gpus) / (r * job.resources.gpus)
        moving = job.provider in egress and job.provider != o.provider
        move = p.checkpoint_gb * egress[job.provider] if moving else 0.0
        out[(o.key, False)] = o.on_demand_per_gpu_hour * alloc * hours + move
        if job.spot and o.spot_per_gpu_hour is not None:
            out[(o.key, True)] = o.spot_per_gpu_hour * alloc * spot_hours(job, o, hours) + move
    return out


def job_types(job: JobSpec) -> set[str]:
    choices = job.placement.any_of or job.placement.ordered
    return {c.gpu_type or job.resources.gpu_type for c in choices} or {job.resources.gpu_type}


def spot_hours(job: JobSpec, offer: Offer, hours: float) -> float:
    lam, p = offer.spot_preemptions_per_hour, job.placement
    if lam == 0:
        return hours
    if p.save_seconds is not None:
        tau = math.sqrt(2 * p.save_seconds * 3600 / lam)
    elif job.checkpoint.every_seconds is not None:
        tau = job.checkpoint.every_seconds
    else:
        tau = 1800.0
    f = lam * (tau / 2 + p.restore_seconds) / 3600
    return hours / (1 - f) if f < 1 else math.inf


def main() -> int:
    p = common.parser(__doc__ or "")
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--offers", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sample", type=int, default=200, help="jobs costed in plain Python for the baseline")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    rng = random.Random(args.seed)
    common.progress(f"building {args.offers} offers and {args.jobs} jobs ...")
    catalog = build_catalog(args.offers, rng)
    jobs = build_jobs(args.jobs, catalog, rng)
    times, result = [], None
    for i in range(args.repeats):
        started = time.perf_counter()
        result = plan(jobs, catalog)
        times.append(time.perf_counter() - started)
        common.progress(f"plan {i + 1}/{args.repeats}: {times[-1]:.3f} s")
    assert result is not None
    planned = common.median(times)

    sample = jobs[: args.sample]
    started = time.perf_counter()
    reference = [python_costs(job, catalog) for job in sample]
    python_s = (time.perf_counter() - started) / len(sample) * len(jobs)
    mismatches = 0
    for job, costs in zip(sample, reference, strict=True):
        d = result.decision(job.name)
        seen = {(c.offer, c.spot): c.expected_cost for c in d.rejected}
        if d.choice is not None:
            seen[(d.choice.offer, d.choice.spot)] = d.expected_cost
        for key, cost in seen.items():
            want = costs.get(key)
            if cost is None or want is None or not math.isfinite(want):
                continue
            if not math.isclose(cost, want, rel_tol=1e-9):
                mismatches += 1
    started = time.perf_counter()
    explained = sum(len(d.rejected) for d in result.decisions)
    explain_s = time.perf_counter() - started

    ok = planned <= TARGET_S and mismatches == 0
    speedup = common.ratio(python_s, planned)
    rows = [
        [f"plan() {args.jobs} jobs x {args.offers} offers", f"{planned:.3f} s", f"<= {TARGET_S:g} s"],
        ["plain-Python costing, scaled (baseline)", f"{python_s:.3f} s", f"x{speedup:.1f} slower"],
        [f"read all explanations ({explained} candidates)", f"{explain_s:.3f} s", "info"],
        ["placed / infeasible", f"{len(result.placed)} / {len(result.infeasible)}", ""],
        ["cost mismatches vs baseline", str(mismatches), "== 0"],
    ]
    table = common.format_table("placement planner", ["what", "value", "target"], rows)
    out = {
        "jobs": args.jobs,
        "offers": args.offers,
        "plan_s": planned,
        "plan_runs_s": times,
        "python_costing_s": python_s,
        "speedup": common.finite_or_none(speedup),
        "explain_s": explain_s,
        "explained_candidates": explained,
        "placed": len(result.placed),
        "infeasible": len(result.infeasible),
        "mismatches": mismatches,
        "target_s": TARGET_S,
    }
    verdict = f"planned {args.jobs} jobs x {args.offers} offers in {planned:.3f} s (<= {TARGET_S:g} s)"
    return common.finish(json_mode=args.json, result=out, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main())
