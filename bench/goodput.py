"""Speed and accuracy of the goodput Monte Carlo: Llama 3's 54 days on 16,384 GPUs, 1,000 trials.

    .venv/bin/python bench/goodput.py [--json] [--trials 1000] [--repeats 3] [--seed N] [--baseline-trials 20]

The scenario is the worked example of docs/goodput.md: the Llama 3 failure mix (Table 5 of the paper,
466 interruptions in 54 days on 16,384 GPUs), 1,296 hours of work, a 20 s save stall every 10 minutes,
restart 120 s, restore 60 s, reschedule 300 s for a broken node (about 90 % effective, as published).
Timed: ``monte_carlo`` (numpy, vectorised over trials, one step per interruption), the median of
``--repeats`` runs, wall and CPU time. Targets: at most 10 s for 1,000 trials, and the mean wall
time within 1 % of Daly's closed form (``analytic``).

Baseline, in the same run: the same model simulated one trial at a time in plain Python (an event
loop over interruptions, ``random.Random``), for ``--baseline-trials`` trials, its time scaled to the
trial count: the ratio is what vectorising over trials buys. Its mean must agree with the closed form
too (looser: few trials), so a fast wrong Monte Carlo shows.
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from collections.abc import Sequence

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

import _common as common

from gpufleet.estimate.goodput import LLAMA3, Branch, Scenario, analytic, branches, monte_carlo

TARGET_S = 10.0
TARGET_AGREEMENT = 0.01
HOUR = 3600.0


def scenario() -> Scenario:
    return Scenario(
        gpus=16_384,
        gpu_mtbf_hours=LLAMA3.gpu_mtbf_hours() or 0.0,
        planned_per_day=LLAMA3.planned_per_day() or 0.0,
        mix=LLAMA3,
        work_hours=54 * 24.0,
        save_seconds=20.0,
        interval_seconds=600.0,
        restart_seconds=120.0,
        restore_seconds=60.0,
        reschedule_seconds=300.0,
    )


def one_trial(s: Scenario, bs: Sequence[Branch], tau: float, rng: random.Random) -> float:
    """Wall seconds of one run, simulated event by event (exponential interruptions only)."""
    lam = sum(b.rate for b in bs)
    cum, acc = [], 0.0
    for b in bs:
        acc += b.rate / lam
        cum.append(acc)
    work, delta = s.work_hours * HOUR, s.save_seconds
    now, ck, ready = 0.0, 0.0, 0.0
    fail = rng.expovariate(lam)
    while True:
        u = rng.random()
        b = next((x for x, c in zip(bs, cum, strict=True) if u < c), bs[-1])
        if fail < ready:  # interrupted while restarting: restart again
            ready = fail + b.restart
            fail += rng.expovariate(lam)
            continue
        now = ready
        while ck < work:  # compute interval by interval until done or interrupted
            step = min(tau, work - ck)
            if now + step + delta > fail:
                break
            now += step + delta
            ck += step
        if ck >= work - 1e-9:
            return now
        offset = fail - now
        start = fail
        if b.signal:
            ck += min(offset, min(tau, work - ck))
            start += s.signal_save
        ready = start + b.restart
        fail = start + rng.expovariate(lam)


def python_baseline(s: Scenario, trials: int, seed: int) -> list[float]:
    bs, (tau, _) = branches(s), s.interval()
    rng = random.Random(seed)
    return [one_trial(s, bs, tau, rng) for _ in range(trials)]


def main(argv: Sequence[str]) -> int:
    p = common.parser(__doc__.splitlines()[0] if __doc__ else "goodput Monte Carlo")
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline-trials", type=int, default=20)
    args = p.parse_args(argv)
    s = scenario()
    closed = analytic(s)
    common.progress(f"analytic: {closed.effective_fraction:.4%} effective, wall {closed.wall_hours:,.2f} h")
    walls, cpus = [], []
    mc = None
    for i in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        mc = monte_carlo(s, trials=args.trials, seed=args.seed + i)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        common.progress(f"monte carlo {i + 1}/{args.repeats}: {walls[-1]:.3f} s, wall {mc.wall_hours:,.2f} h")
    assert mc is not None and mc.spread is not None
    t0 = time.perf_counter()
    base = python_baseline(s, args.baseline_trials, args.seed)
    base_s = time.perf_counter() - t0
    base_scaled = base_s * args.trials / args.baseline_trials
    base_wall_h = sum(base) / len(base) / HOUR
    common.progress(f"python baseline: {args.baseline_trials} trials in {base_s:.2f} s, wall {base_wall_h:,.2f} h")
    mc_s = common.median(walls)
    agreement = mc.wall_hours / closed.wall_hours - 1.0
    base_agreement = base_wall_h / closed.wall_hours - 1.0
    stderr = mc.spread.wall_hours_stderr / closed.wall_hours
    ok = mc_s <= TARGET_S and abs(agreement) <= TARGET_AGREEMENT and abs(base_agreement) <= 0.02
    rows = [
        ["analytic (Daly, closed form)", "", f"{closed.effective_fraction:.4%}", f"{closed.wall_hours:,.2f}", ""],
        [
            f"numpy Monte Carlo, {args.trials:,} trials",
            f"{mc_s:.3f} (cpu {common.median(cpus):.3f})",
            f"{mc.effective_fraction:.4%}",
            f"{mc.wall_hours:,.2f}",
            f"{agreement:+.4%} (stderr {stderr:.4%})",
        ],
        [
            f"python loop, {args.baseline_trials} trials x {args.trials // args.baseline_trials}",
            f"{base_scaled:.3f}",
            f"{closed.work_hours / base_wall_h:.4%}",
            f"{base_wall_h:,.2f}",
            f"{base_agreement:+.4%}",
        ],
    ]
    head = ["engine", "seconds", "effective", "wall h", "vs analytic"]
    title = (
        f"goodput Monte Carlo: {s.gpus:,} GPUs, {s.work_hours:,.0f} h of work, llama3 mix, "
        f"{mc.interruptions:,.0f} interruptions per run; vectorised is {common.ratio(base_scaled, mc_s):,.1f}x "
        "the Python loop"
    )
    result = {
        "gpus": s.gpus,
        "work_hours": s.work_hours,
        "trials": args.trials,
        "interruptions_per_trial": mc.interruptions,
        "montecarlo_seconds": mc_s,
        "montecarlo_cpu_seconds": common.median(cpus),
        "python_seconds_scaled": base_scaled,
        "speedup": common.ratio(base_scaled, mc_s),
        "analytic_effective_fraction": closed.effective_fraction,
        "montecarlo_effective_fraction": mc.effective_fraction,
        "montecarlo_minus_analytic_wall": agreement,
        "montecarlo_stderr_relative": stderr,
        "python_minus_analytic_wall": base_agreement,
    }
    verdict = (
        f"{args.trials:,} trials in {mc_s:.2f} s (target <= {TARGET_S:g} s); Monte Carlo within "
        f"{abs(agreement):.3%} of the closed form (target <= {TARGET_AGREEMENT:.0%})"
    )
    if not math.isfinite(agreement):
        ok = False
    return common.finish(
        json_mode=args.json, result=result, table=common.format_table(title, head, rows), verdict=verdict, ok=ok
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
