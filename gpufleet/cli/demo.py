"""``gpufleet demo``: the headline job, in one command on a laptop.

1. A low-priority tiny-LM job (team ``perception``, spot) starts on the only virtual GPU slot.
2. Once it has checkpointed a few times, a high-priority job (team ``planning``) arrives: the
   scheduler sends SIGTERM to the first, which saves at its next step boundary and exits with the
   requeue code; it goes back to the queue.
3. The high-priority job finishes; the first restarts, restores its last healthy checkpoint
   (with ``--fault nan@STEP`` it also meets a poisoned batch, rolls back and skips it) and ends.
4. A cost note (Markdown, JSON, PNG timeline) is written and summarised.

The scheduler runs inside this process (no daemon is left behind) on a fresh state folder under
``$GPUFLEET_HOME/demo/``, so the user's own jobs are never touched.
"""

from __future__ import annotations

import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.cli.options import JsonOpt
from gpufleet.cli.render import console, emit_json, gpu_time, money, print_cost
from gpufleet.cli.watch import JobWatcher, make_progress
from gpufleet.cost.gather import cost_report
from gpufleet.cost.ledger import Cost
from gpufleet.errors import UsageError
from gpufleet.jobs.faults import FaultPlan
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import latest_step
from gpufleet.paths import gpufleet_home, notes_dir
from gpufleet.spec import JobSpec, parse_spec

LOW_STEPS, HIGH_STEPS, PREEMPT_AFTER = 240, 100, 60


def demo_specs() -> tuple[JobSpec, JobSpec]:
    common = {
        "entrypoint": "gpufleet.workloads.tinylm:train",
        "resources": {"gpu_type": "A100", "gpus": 1, "cpus": 2},
        "checkpoint": {"every_steps": 20, "keep": 3, "grace_seconds": 30},
    }
    low = parse_spec(
        {
            **common,
            "name": "tinylm-perception",
            "team": "perception",
            "priority": 0,
            "spot": True,
            "args": {"steps": LOW_STEPS},
        },
        source="demo",
    )
    high = parse_spec(
        {
            **common,
            "name": "tinylm-planning",
            "team": "planning",
            "priority": 100,
            "spot": False,
            "args": {"steps": HIGH_STEPS, "seed": 7},
        },
        source="demo",
    )
    return low, high


def closing_lines(job_id: int, attempts: int, cost: Cost, currency: str) -> tuple[str, str]:
    """What preemption cost the preempted job, in full (lost work is the smallest part), then the redone work."""
    parts = {k: gpu_time(v) for k, v in cost.preemption_gpu_hours.items()}
    overhead = (
        f"job #{job_id} ran {attempts} attempts; preemption cost it {gpu_time(cost.preemption_overhead_gpu_hours)} "
        f"of GPU time ({cost.preemption_share:.1%} of the job, {money(cost.preemption_money, currency)}): "
        f"{parts['lost']} lost work, {parts['startup']} restart start-up and shut-down, "
        f"{parts['restore']} restore, {parts['checkpoint']} save at the signal."
    )
    redone = (
        f"{gpu_time(cost.gpu_hours['lost'])} of GPU time went to work redone after preemption and rollback "
        f"({cost.steps_redone} steps)."
    )
    return overhead, redone


def run_demo(*, fault: str | None = None, json_out: bool = False, home: Path | None = None) -> bool:
    plan = FaultPlan.parse(fault or "")
    for position in plan.faults:
        if not 0 < position < LOW_STEPS:
            raise UsageError(f"--fault step {position} is outside the demo job's 1..{LOW_STEPS - 1} steps")
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    home = home or gpufleet_home() / "demo" / stamp
    home.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=1, poll_s=0.05)
    scheduler.prepare()  # the warm server imports torch while the first job is submitted
    store = backend.store
    low_spec, high_spec = demo_specs()
    quiet = json_out

    def say(text: str) -> None:
        if not quiet:
            console.print(text)

    say(f"[bold]gpufleet demo[/]  state: {escape(str(home))}  (1 virtual GPU slot, local backend)")
    progress = make_progress(quiet)
    progress.start()
    try:
        low = backend.submit(low_spec, env={"GPUFLEET_FAULT": fault} if fault else None)
        say(f"submitted #{low} {low_spec.name}: team perception, priority 0, spot, {LOW_STEPS} steps")
        watcher = JobWatcher(store, progress, quiet=quiet)
        watcher.follow(
            [low], tick=scheduler.tick, poll_s=0.05, until=lambda: (latest_step(store, low) or 0) >= PREEMPT_AFTER
        )
        high = backend.submit(high_spec)
        say(f"submitted #{high} {high_spec.name}: team planning, priority 100, on-demand: it preempts #{low}")
        watcher.follow([low, high], tick=scheduler.tick, poll_s=0.05)
    finally:
        progress.stop()
        scheduler.shutdown()
    note_dir = notes_dir(home) / stamp
    report = cost_report(store, out=note_dir, title="gpufleet demo: cost note")
    jobs = {j.id: j for j in store.jobs()}
    low_attempts = store.attempts(low)
    ok = all(j.state == JobState.COMPLETED for j in jobs.values()) and len(low_attempts) >= 2
    if json_out:
        emit_json(
            {
                "ok": ok,
                "home": str(home),
                "seconds": round(time.monotonic() - started, 1),
                "jobs": [
                    {
                        "id": j.id,
                        "name": j.name,
                        "team": j.team,
                        "state": j.state,
                        "attempts": len(store.attempts(j.id)),
                    }
                    for j in jobs.values()
                ],
                **report.to_dict(),
            }
        )
        return ok
    print_cost(report)
    overhead, redone = closing_lines(low, len(low_attempts), report.ledger.jobs[low], report.ledger.currency)
    console.print(overhead, soft_wrap=True)
    console.print(f"{redone} Demo took {time.monotonic() - started:.0f}s.", soft_wrap=True)
    prog = "gpufleet" if shutil.which("gpufleet") else sys.argv[0]
    console.print(
        f"explore it:  export GPUFLEET_HOME={home}; {prog} jobs; {prog} show {low}; {prog} cost", markup=False
    )
    if not ok:
        console.print("[red]the demo did not end as expected: see `gpufleet show` for each job[/]")
    return ok


def run_fleet(*, json_out: bool = False, home: Path | None = None) -> bool:
    """``demo --fleet``: quota borrow and reclaim, a spot storm, a failover with the checkpoint moved; priced."""
    from gpufleet.demos.fleet_demo import run_fleet_demo

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    home = home or gpufleet_home() / "demo-fleet" / stamp
    started = time.monotonic()
    story: list[dict[str, object]] = []

    def say(text: str) -> None:
        story.append({"seconds": round(time.monotonic() - started, 1), "text": text})
        if not json_out:
            console.print(f"[dim]{time.monotonic() - started:6.1f}s[/] {escape(text)}", highlight=False)

    if not json_out:
        console.print(
            f"[bold]gpufleet demo --fleet[/]  state: {escape(str(home))}  (2 teams; H100 at aws and gcp, L40S at gcp)",
            highlight=False,
        )
    demo = run_fleet_demo(home, say=say)
    store = LocalBackend(home, spawn=False).store
    report = cost_report(store, out=notes_dir(home) / stamp, title="gpufleet demo --fleet: cost note")
    jobs = [store.job(i) for i in demo.jobs.values()]
    kinds = {k: sum(len(store.events(j.id, kinds=(k,))) for j in jobs) for k in demo_kinds()}
    ok = all(j.state == JobState.COMPLETED for j in jobs) and all(kinds.values())
    if json_out:
        priced = report.to_dict()
        states = {j.id: {"team": j.team, "state": j.state} for j in jobs}
        priced["jobs"] = [{**row, **states.get(row["id"], {})} for row in priced["jobs"]]
        emit_json(
            {
                "ok": ok,
                "home": str(home),
                "seconds": round(time.monotonic() - started, 1),
                "story": story,
                "events": kinds,
                **priced,
            }
        )
        return ok
    print_cost(report)
    total = report.ledger.total
    console.print(
        f"moves: {kinds['checkpoint_moved']} checkpoint(s), {total.egress_bytes:,} bytes, egress "
        f"{money(total.egress_money, report.ledger.currency)}; reclaims: {kinds['reclaimed_by']}; spot preemptions: "
        f"{kinds['spot_preempted']}. Demo took {time.monotonic() - started:.0f}s.",
        soft_wrap=True,
        highlight=False,
    )
    prog = "gpufleet" if shutil.which("gpufleet") else sys.argv[0]
    console.print(
        f"explore it:  export GPUFLEET_HOME={home}; {prog} fleet show; {prog} jobs; {prog} show 1; {prog} cost",
        markup=False,
    )
    if not ok:
        console.print("[red]the fleet demo did not end as expected: see `gpufleet show` for each job[/]")
    return ok


def demo_kinds() -> tuple[str, ...]:
    """What the fleet demo must show at least once."""
    return ("reclaimed_by", "spot_preempted", "failover", "checkpoint_moved")


def demo_command(
    fault: Annotated[str | None, typer.Option(help="Inject a fault in the preempted job, e.g. nan@150.")] = None,
    fleet: Annotated[
        bool,
        typer.Option(
            "--fleet", help="The fleet demo: quotas borrowed and reclaimed, a spot storm, a failover, egress priced."
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """The headline job: a preempted training run resumes at its last healthy step and is priced."""
    if fleet and fault:
        raise UsageError("--fault is for the headline demo, not --fleet: give one or the other")
    ok = run_fleet(json_out=json_out) if fleet else run_demo(fault=fault, json_out=json_out)
    if not ok:
        raise typer.Exit(1)


__all__ = ["closing_lines", "demo_command", "demo_kinds", "demo_specs", "run_demo", "run_fleet"]
