"""The sweep driver's overhead: a sweep of N trials against the same N jobs submitted in a loop.

    .venv/bin/python bench/sweep_overhead.py [--json] [--trials 8] [--parallelism 2] [--repeats 2] [--steps 10]

Both sides run the same N tiny-LM jobs (one learning rate each, a grid) on the local backend with
``parallelism`` slots, in fresh homes, polling every 0.2 s:

- baseline: a loop over ``LocalBackend.submit`` (what ``gpufleet submit`` calls) that keeps
  ``parallelism`` jobs in flight, submitting the next one when one ends;
- sweep: ``SweepDriver`` over the same grid (no pruner): Optuna's ask and tell in SQLite, the
  trial's bookkeeping, then the same submit.

Measured, interleaved rounds, medians: the whole wall time, and per job the seconds from its submit to
its attempt's start ("submit to running"). Target: the sweep's wall time at most 10 % over the loop's
(the issue's "driver overhead per trial at most 10 % more").
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import _common as common

TARGET_RATIO = 1.10
POLL_S = 0.2


def base(steps: int) -> dict[str, Any]:
    from gpufleet.workloads.tinylm import TINY

    return {
        "name": "lm",
        "entrypoint": "gpufleet.workloads.tinylm:train",
        "args": {**TINY, "steps": steps},
        "resources": {"gpus": 1, "cpus": 1},
    }


def rates(n: int) -> list[float]:
    return [round(1e-3 * (1 + i), 6) for i in range(n)]


def latencies(home: Path) -> list[float]:
    from gpufleet.jobs.store import Store

    store = Store(home / "state.db")
    out = []
    for job in store.jobs():
        attempts = store.attempts(job.id)
        if attempts:
            out.append(attempts[0].started_at - job.submitted_at)
    return out


def run_loop(home: Path, n: int, parallelism: int, steps: int) -> tuple[float, list[float]]:
    from gpufleet.backends.local import LocalBackend
    from gpufleet.jobs.store import TERMINAL
    from gpufleet.spec import parse_spec

    backend = LocalBackend(home)
    spec = parse_spec(base(steps))
    todo = list(rates(n))
    live: list[int] = []
    t0 = time.perf_counter()
    while todo or live:
        live = [j for j in live if backend.store.job(j).state not in TERMINAL]
        while todo and len(live) < parallelism:
            lr = todo.pop(0)
            live.append(
                backend.submit(spec.copy_with(name=f"loop-{lr:g}".replace(".", "-"), args={**spec.args, "lr": lr}))
            )
        time.sleep(POLL_S)
    return time.perf_counter() - t0, latencies(home)


def run_sweep(home: Path, n: int, parallelism: int, steps: int) -> tuple[float, list[float]]:
    from gpufleet.spec import parse_spec
    from gpufleet.sweeps.driver import SweepDriver
    from gpufleet.sweeps.spec import SweepSpec

    sweep = SweepSpec.model_validate(
        {
            "name": "bench",
            "base": base(steps),
            "space": {"lr": {"grid": rates(n)}},
            "objective": {"metric": "val_loss"},
            "budget": {"trials": n},
            "parallelism": parallelism,
            "sampler": {"kind": "grid"},
        }
    )
    t0 = time.perf_counter()
    progress = SweepDriver(home, sweep, parse_spec(base(steps)), poll_s=POLL_S).run()
    wall = time.perf_counter() - t0
    if progress.finished != n:
        raise SystemExit(f"the sweep finished {progress.finished} of {n} trials: {progress.stop}")
    return wall, latencies(home)


def main(argv: Sequence[str]) -> int:
    p = common.parser(__doc__.splitlines()[0] if __doc__ else "sweep overhead")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    os.environ["GPUFLEET_LOCAL_SLOTS"] = str(args.parallelism)
    walls: dict[str, list[float]] = {"loop": [], "sweep": []}
    lat: dict[str, list[float]] = {"loop": [], "sweep": []}
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-sweep-") as tmp:
        for i in range(args.repeats):
            for side, fn in (("loop", run_loop), ("sweep", run_sweep)):
                home = Path(tmp) / f"{side}-{i}"
                os.environ["GPUFLEET_HOME"] = str(home)
                wall, seconds = fn(home, args.trials, args.parallelism, args.steps)
                walls[side].append(wall)
                lat[side].extend(seconds)
                common.progress(f"round {i + 1}/{args.repeats} {side}: {wall:.2f} s for {args.trials} jobs")
    loop_s, sweep_s = common.median(walls["loop"]), common.median(walls["sweep"])
    ratio = common.ratio(sweep_s, loop_s)
    per_trial = (sweep_s - loop_s) / args.trials
    rows = [
        [side, f"{common.median(walls[side]):.2f}", f"{common.median(lat[side]):.3f}", f"{max(lat[side]):.3f}"]
        for side in ("loop", "sweep")
    ]
    title = (
        f"sweep driver vs a submit loop: {args.trials} tiny-LM jobs of {args.steps} steps, "
        f"{args.parallelism} at a time, {args.repeats} interleaved rounds (medians)"
    )
    head = ["driver", "wall s", "submit->running s (median)", "(max)"]
    ok = ratio <= TARGET_RATIO
    result = {
        "trials": args.trials,
        "parallelism": args.parallelism,
        "loop_seconds": loop_s,
        "sweep_seconds": sweep_s,
        "ratio": ratio,
        "overhead_seconds_per_trial": per_trial,
        "loop_submit_to_running_seconds": common.median(lat["loop"]),
        "sweep_submit_to_running_seconds": common.median(lat["sweep"]),
    }
    verdict = (
        f"the sweep took {ratio:.3f}x the loop's wall time ({per_trial:+.3f} s a trial; target <= {TARGET_RATIO:g}x)"
    )
    return common.finish(
        json_mode=args.json, result=result, table=common.format_table(title, head, rows), verdict=verdict, ok=ok
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
