"""In-place recovery against the requeue: ``kill -9`` of one rank to the group stepping again.

    .venv/bin/python bench/recovery_wait.py [--json] [--runs N] [--steps N] [--keep DIR]

The job of ``bench/chaos.py`` (tinylm on 2 DDP ranks, gloo on CPU, the local backend run by the
home's own scheduler process, a disk checkpoint every 10 steps and the memory tier every step),
once with ``distributed.recovery: wait`` and once with ``requeue``, ``N`` times each (default 3),
interleaved (wait, requeue, wait, ...) so that the machine's load falls on both alike. Each run
``kill -9``s rank 1 once the job has reported a step past a third of its steps and a checkpoint,
and is timed from the kill to the first ``step`` event after the ``restore`` that follows it
(``chaos.measure``); the run is then stopped, its job is not run to the end.

Prints the median and the spread (lowest, highest) of each, the ratio of the medians, the tier each
restore used, and the ranks whose PID changed. Target: wait <= 0.25 x requeue, and under ``wait`` no
survivor's PID changed (only rank 1 is replaced). Exit 1 otherwise, or when a run failed.
``--keep DIR`` copies each run's events and attempt logs to ``DIR/<recovery>-<n>/``.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common as common
import chaos

TARGET = 0.25
"""The most ``wait``'s median may take of ``requeue``'s."""
VICTIM = 1


@dataclass
class Run:
    """One run: how long from the kill to stepping again, and what the recovery changed."""

    recovery: str
    seconds: float | None = None
    tier: str | None = None
    restarted: list[int] | None = None
    """Ranks whose PID changed across the kill."""
    how: str = "-"
    """How the job went on, as ``chaos.recovery_of`` names it."""
    error: str | None = None

    @property
    def survivors_kept(self) -> bool:
        """Under ``wait``, only the killed rank has a new process."""
        return self.recovery != "wait" or self.restarted == [VICTIM]


def stepping_again(fault_ts: float) -> Any:
    """A test over the events: a ``step`` after the first ``restore`` after the kill."""

    def found(events: list[dict[str, Any]]) -> bool:
        restores = [e["ts"] for e in events if e["kind"] == "restore" and e["ts"] > fault_ts]
        return bool(restores) and any(e["kind"] == "step" and e["ts"] >= restores[0] for e in events)

    return found


def keep(h: chaos.Harness, folder: Path) -> None:
    """Copy the run's events and attempt logs (the harness removes its home)."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in [h.job_dir / "events.jsonl", *sorted((h.job_dir / "logs").glob("*.log"))]:
        if path.is_file():
            shutil.copy2(path, folder / path.name)


def one_run(recovery: str, steps: int, keep_dir: Path | None) -> Run:
    """One job under ``recovery``, rank 1 killed, timed to the first step after the restore."""
    setup = chaos.Setup(steps=steps, recovery=recovery, memory=True)
    run = Run(recovery)
    try:
        with chaos.Harness(f"recovery-{recovery}") as h:
            try:
                h.submit(chaos.job_spec(setup, name=f"recovery-{recovery}"))
                h.wait_step(setup.fault_step)
                fault_ts = chaos.fault_kill9_rank(h)
                h.wait_events("the group stepping again", stepping_again(fault_ts))
                row = chaos.Row("kill9-rank")
                events = h.events()
                chaos.measure(row, events, fault_ts)
                run.seconds, run.tier, run.restarted = row.seconds, row.tier, row.restarted
                run.how = chaos.recovery_of(events, fault_ts)
            finally:
                if keep_dir is not None:
                    keep(h, keep_dir)
    except (RuntimeError, TimeoutError, OSError) as err:
        run.error = str(err)
    return run


def spread(runs: list[Run]) -> dict[str, float | None]:
    """Median, lowest and highest of the runs that measured a time."""
    times = [r.seconds for r in runs if r.seconds is not None]
    if not times:
        return {"median": None, "min": None, "max": None}
    return {"median": common.median(times), "min": min(times), "max": max(times)}


def render(steps: int, runs: list[Run], stats: dict[str, dict[str, float | None]], ratio: float | None) -> str:
    header = ["recovery", "median s", "min s", "max s", "runs (s, tier, PIDs restarted)"]

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    def described(run: Run) -> str:
        if run.error is not None:
            return "failed"
        restarted = ",".join(f"r{r}" for r in run.restarted or []) or "none"
        return f"{cell(run.seconds)} {run.tier or '-'} {restarted}"

    rows = [
        [
            name,
            cell(s["median"]),
            cell(s["min"]),
            cell(s["max"]),
            "; ".join(described(r) for r in runs if r.recovery == name),
        ]
        for name, s in stats.items()
    ]
    title = (
        f"kill -9 of rank {VICTIM} to the group stepping again: tinylm on 2 DDP ranks (gloo, local backend, "
        f"{steps} steps, memory tier every step)"
    )
    table = common.format_table(title, header, rows)
    notes = [f"wait / requeue (medians): {cell(ratio)} (target <= {TARGET})"]
    notes += [f"{r.recovery}: {r.error}" for r in runs if r.error]
    return "\n".join([table, *notes])


def main(argv: list[str]) -> int:
    p = common.parser("kill -9 of one rank: distributed.recovery wait against requeue, from the kill to stepping.")
    p.add_argument("--runs", type=int, default=3, help="runs of each recovery, interleaved (default 3)")
    p.add_argument("--steps", type=int, default=60, help="steps of every job (default 60; the kill lands past a third)")
    p.add_argument("--keep", type=Path, default=None, help="copy each run's events and logs into this folder")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs {args.runs}: give at least 1")
    if args.steps < 3 * chaos.CKPT_EVERY:
        p.error(f"--steps {args.steps}: give at least {3 * chaos.CKPT_EVERY}, so the kill lands past a checkpoint")
    runs: list[Run] = []
    for n in range(1, args.runs + 1):
        for recovery in ("wait", "requeue"):
            common.progress(f"run {n}/{args.runs}: recovery {recovery}")
            folder = args.keep / f"{recovery}-{n}" if args.keep is not None else None
            runs.append(one_run(recovery, args.steps, folder))
            last = runs[-1]
            common.progress(
                f"  {last.how}: {last.seconds} s, tier {last.tier}, restarted {last.restarted} {last.error or ''}"
            )
    stats = {name: spread([r for r in runs if r.recovery == name]) for name in ("wait", "requeue")}
    wait_s, requeue_s = stats["wait"]["median"], stats["requeue"]["median"]
    ratio = common.ratio(wait_s, requeue_s) if wait_s is not None and requeue_s is not None else None
    failed = [r for r in runs if r.error is not None or r.seconds is None]
    changed = [r for r in runs if not r.survivors_kept]
    ok = not failed and not changed and ratio is not None and ratio <= TARGET
    result = {
        "benchmark": "recovery_wait",
        "steps": args.steps,
        "runs": [{**asdict(r), "survivors_kept": r.survivors_kept} for r in runs],
        "stats": stats,
        "ratio": None if ratio is None else common.finite_or_none(ratio),
        "target": TARGET,
    }
    if failed:
        verdict = f"{len(failed)} run(s) failed"
    elif changed:
        verdict = "a survivor's PID changed under wait"
    else:
        verdict = f"wait is {ratio:.2f} x requeue (target <= {TARGET})"
    return common.finish(
        json_mode=args.json, result=result, table=render(args.steps, runs, stats, ratio), verdict=verdict, ok=ok
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
