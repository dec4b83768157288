"""In-place recovery against the requeue: ``kill -9`` of one rank to the group stepping again.

    .venv/bin/python bench/recovery_wait.py [--json] [--runs N] [--steps N] [--keep DIR] [--no-continue]

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

**continue** (``distributed.recovery: continue``, torchft; skipped without it or with ``--no-continue``):
the same job without the memory tier (``continue`` refuses one), paced at :data:`CONTINUE_STEP_S` a
step so that the replacement heals before the end. Its row is not the time to stepping again (the
survivor never stops) but the survivor's stall: the largest gap between rank 0's consecutive step
ends from the last one before the kill until the replacement healed (``group_reformed``). Target:
<= :data:`STALL_TARGET_S` s, and only rank 1 has a new process. Step ``ts`` are the event log's wall
clock, the kill's too (one host).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common as common
import chaos

TARGET = 0.25
"""The most ``wait``'s median may take of ``requeue``'s."""
VICTIM = 1
STALL_TARGET_S = 3.0
"""The longest a survivor may go without ending a step under ``continue``."""
CONTINUE_STEP_S = 0.05
"""Pacing of the ``continue`` job (``chaos.Setup.step_seconds``): long enough that it outlives the heal."""


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
        """Under ``wait`` and ``continue``, only the killed rank has a new process."""
        return self.recovery not in ("wait", "continue") or self.restarted == [VICTIM]


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


def replica_pids(job_dir: Path) -> dict[int, int]:
    """Each replica's PID under ``continue``: the newest to leave its ready marker (``runtime.elastic``)."""
    folder = job_dir / "ranks" / "attempt-1"
    out: dict[int, int] = {}
    for rank in range(chaos.RANKS):
        try:
            out[rank] = int((folder / f"replica-ready-{rank}").read_text().strip())
        except (OSError, ValueError):
            continue
    return out


def survivor_stall(events: list[dict[str, Any]], fault_ts: float, healed_ts: float) -> float | None:
    """The largest gap between consecutive step ends of rank 0 (it writes the steps) around the fault.

    From the last step before the kill to the first step after the replacement healed; ``None``
    without a step on both sides.
    """
    ends = sorted(float(e["ts"]) for e in events if e["kind"] == "step")
    before = [t for t in ends if t <= fault_ts]
    after = [t for t in ends if t > fault_ts]
    if not before or not after:
        return None
    last = next((t for t in after if t >= healed_ts), after[-1])
    seq = [before[-1], *[t for t in after if t <= last]]
    return max(b - a for a, b in itertools.pairwise(seq))


def one_continue_run(steps: int, keep_dir: Path | None) -> Run:
    """One job under ``continue``, rank 1 killed: the survivor's longest stall until the replacement healed."""
    setup = chaos.Setup(steps=steps, recovery="continue", memory=False, step_seconds=CONTINUE_STEP_S)
    run = Run("continue")
    try:
        with chaos.Harness("recovery-continue") as h:
            try:
                h.submit(chaos.job_spec(setup, name="recovery-continue"))
                h.wait_step(setup.fault_step)
                before = replica_pids(h.job_dir)
                fault_ts = time.time()
                os.kill(before[VICTIM], signal.SIGKILL)
                healed = h.wait_events("the replacement healed", healed_after(fault_ts))
                h.wait_events("a step after the heal", lambda evs: stepped_after(evs, healed["ts"]))
                run.seconds = survivor_stall(h.events(), fault_ts, float(healed["ts"]))
                run.tier = healed.get("tier")
                after = replica_pids(h.job_dir)
                run.restarted = sorted(r for r in before if after.get(r) != before[r])
                run.how = "healed in place"
            finally:
                if keep_dir is not None:
                    keep(h, keep_dir)
    except (RuntimeError, TimeoutError, OSError, KeyError) as err:
        run.error = str(err)
    return run


def healed_after(fault_ts: float) -> Any:
    def found(events: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((e for e in events if e["kind"] == "group_reformed" and e["ts"] > fault_ts), None)

    return found


def stepped_after(events: list[dict[str, Any]], ts: float) -> bool:
    return any(e["kind"] == "step" and e["ts"] > ts for e in events)


def torchft_installed() -> bool:
    return importlib.util.find_spec("torchft") is not None


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
    if "continue" in stats:
        notes.append(
            f"continue: the survivor's longest stall (median) {cell(stats['continue']['median'])} s "
            f"(target <= {STALL_TARGET_S:g} s), paced {CONTINUE_STEP_S} s a step, no memory tier"
        )
    notes += [f"{r.recovery}: {r.error}" for r in runs if r.error]
    return "\n".join([table, *notes])


def main(argv: list[str]) -> int:
    p = common.parser("kill -9 of one rank: distributed.recovery wait against requeue, from the kill to stepping.")
    p.add_argument("--runs", type=int, default=3, help="runs of each recovery, interleaved (default 3)")
    p.add_argument("--steps", type=int, default=60, help="steps of every job (default 60; the kill lands past a third)")
    p.add_argument("--keep", type=Path, default=None, help="copy each run's events and logs into this folder")
    p.add_argument("--no-continue", action="store_true", help="leave out the continue row (torchft)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs {args.runs}: give at least 1")
    if args.steps < 3 * chaos.CKPT_EVERY:
        p.error(f"--steps {args.steps}: give at least {3 * chaos.CKPT_EVERY}, so the kill lands past a checkpoint")
    runs: list[Run] = []
    kinds = ("wait", "requeue", "continue") if not args.no_continue and torchft_installed() else ("wait", "requeue")
    for n in range(1, args.runs + 1):
        for recovery in kinds:
            common.progress(f"run {n}/{args.runs}: recovery {recovery}")
            folder = args.keep / f"{recovery}-{n}" if args.keep is not None else None
            if recovery == "continue":
                runs.append(one_continue_run(args.steps * 2, folder))
            else:
                runs.append(one_run(recovery, args.steps, folder))
            last = runs[-1]
            common.progress(
                f"  {last.how}: {last.seconds} s, tier {last.tier}, restarted {last.restarted} {last.error or ''}"
            )
    stats = {name: spread([r for r in runs if r.recovery == name]) for name in kinds}
    wait_s, requeue_s = stats["wait"]["median"], stats["requeue"]["median"]
    ratio = common.ratio(wait_s, requeue_s) if wait_s is not None and requeue_s is not None else None
    failed = [r for r in runs if r.error is not None or r.seconds is None]
    changed = [r for r in runs if not r.survivors_kept]
    stall = stats.get("continue", {}).get("median")
    stalled = stall is not None and stall > STALL_TARGET_S
    ok = not failed and not changed and not stalled and ratio is not None and ratio <= TARGET
    result = {
        "benchmark": "recovery_wait",
        "steps": args.steps,
        "runs": [{**asdict(r), "survivors_kept": r.survivors_kept} for r in runs],
        "stats": stats,
        "ratio": None if ratio is None else common.finite_or_none(ratio),
        "target": TARGET,
        "continue_stall_target_s": STALL_TARGET_S,
    }
    if failed:
        verdict = f"{len(failed)} run(s) failed"
    elif changed:
        verdict = "a survivor's PID changed under wait or continue"
    elif stalled:
        verdict = f"the survivor stalled {stall:.2f} s under continue (target <= {STALL_TARGET_S:g} s)"
    else:
        verdict = f"wait is {ratio:.2f} x requeue (target <= {TARGET})"
        verdict += f"; continue stalled the survivor {stall:.2f} s" if stall is not None else ""
    return common.finish(
        json_mode=args.json, result=result, table=render(args.steps, runs, stats, ratio), verdict=verdict, ok=ok
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
