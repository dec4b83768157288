"""``gpufleet advise JOB``: the checkpoint interval a job should use, from what its attempts measured.

Parse, call :func:`gpufleet.placement.advisor.advise_job`, render. The preemption rate is the one the
job showed (preemptions over its hours of run); ``--preemptions-per-hour`` plans for another, and while
none was seen the catalogue rate of the fleet pool it last ran on is the prior. The share of time lost
is Daly's closed form (saves, lost work and restarts; :func:`~gpufleet.estimate.interval.lost_share`).
Below the interval, what would recover the most GPU time: the job's badput buckets, largest first in
GPU-seconds and money, each with its remedy (:func:`gpufleet.cost.recover.recoverable`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from gpufleet.cli.options import JobArg, JsonOpt, job_store
from gpufleet.cli.render import console, duration, emit_json, table
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.fmt import number
from gpufleet.placement.advisor import PreemptionRate, advise_job

if TYPE_CHECKING:
    from gpufleet.jobs.store import Store
    from gpufleet.placement.advisor import Interval, JobAdvice

MAX_RATE = 3600.0
"""Most preemptions an hour ``--preemptions-per-hour`` takes (one a second)."""


def catalogue_rate(store: Store, home: Path, job_id: int) -> PreemptionRate | None:
    """The spot preemption rate of the fleet pool the job was last placed on, or ``None`` (no fleet, on demand)."""
    from gpufleet.backends.pools import active_fleet
    from gpufleet.jobs.events import EventKind

    placed = store.last_event(job_id, EventKind.PLACED)
    offer = placed.data.get("offer") if placed is not None else None
    if placed is None or not isinstance(offer, str) or placed.data.get("spot") is not True:
        return None
    try:
        fleet = active_fleet(home)
        rate = fleet.offer(offer).spot_preemptions_per_hour if fleet is not None else None
    except (GpufleetError, OSError, LookupError):  # the fleet changed since: no prior
        return None
    return PreemptionRate(rate, f"catalogue rate of {offer}") if rate else None


def _share(x: float | None) -> str:
    return "" if x is None else f"{x:.2%}"


def _row(label: str, interval: Interval | None) -> list[object]:
    if interval is None:
        return [label, "", "", ""]
    seconds = f"{interval.seconds:,.1f}" + (f" ({duration(interval.seconds)})" if interval.seconds >= 60 else "")
    steps = "" if interval.steps is None else f"{interval.steps:,}"
    return [label, seconds, steps, _share(interval.lost_share)]


def _secs(x: float | None, count: int, what: str) -> str:
    return "not measured" if x is None else f"{number(x)} s (mean of {count:,} {what}{'' if count == 1 else 's'})"


def _render(a: JobAdvice) -> None:
    m = a.measured
    console.print(f"[bold]job {a.job_id}[/] {escape(a.name)}: checkpoint interval")
    startup = _secs(m.startup_seconds, m.startups, "restart")
    if m.startup_seconds is not None and not m.startup_of_restarts:
        startup = f"{number(m.startup_seconds)} s (the first attempt's)"
    lines = [
        f"save        {_secs(m.save_seconds, m.saves, 'save')}",
        f"restore     {_secs(m.restore_seconds, m.restores, 'restart')}",
        f"start-up    {startup}",
        f"step        {_secs(m.step_seconds, m.steps, 'step')}",
        f"preempted   {m.preemptions} times in {number(m.run_hours)} h of run: "
        f"{number(m.preemptions_per_hour)}/h observed",
    ]
    rate = a.rate
    mtbf = f", MTBF {duration(3600.0 / rate.per_hour)}" if rate.per_hour > 0 else ""
    lines.append(f"planned for {number(rate.per_hour)}/h ({rate.source}){mtbf}; restart {number(a.restart_seconds)} s")
    for line in lines:
        console.print(escape(line), highlight=False)
    rows = [
        _row(f"today ({a.current_source})" if a.current is not None else "today", a.current),
        _row("Young", a.young),
        _row("Daly (recommended)", a.daly),
    ]
    console.print(table(None, ["interval", "seconds", "steps", "time lost"], rows))
    for note in a.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    if a.rate.per_hour == 0:
        console.print("plan for a rate with --preemptions-per-hour R (the pool's catalogue rate)", highlight=False)
    if a.daly is not None:
        console.print(escape("apply it while the job runs with checkpoint: {every: auto}"), highlight=False)
    _render_recover(a)


def _render_recover(a: JobAdvice) -> None:
    """The badput buckets, most GPU time first, each with what would win it back."""
    from gpufleet.telemetry.ranks import money_text

    if not a.recover:
        return
    console.print(f"[bold]what would recover the most GPU time[/] ({a.currency})")
    rows: list[list[object]] = [
        [r.bucket, f"{r.gpu_seconds:,.1f}", "" if r.money is None else money_text(r.money, a.currency), r.action]
        for r in a.recover
    ]
    console.print(table(None, ["bucket", "GPU-s", "money", "what would recover it"], rows))


def advise_command(
    job_id: JobArg,
    preemptions_per_hour: Annotated[
        float | None,
        typer.Option(
            "--preemptions-per-hour",
            help="Plan for this rate instead of the observed one (e.g. the pool the job moves to).",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """The checkpoint interval JOB should use (Young, Daly) from its measured save, restore, start-up and
    preemptions, and the share of time lost at today's interval and at the recommended one."""
    if preemptions_per_hour is not None and not (math.isfinite(preemptions_per_hour) and preemptions_per_hour >= 0):
        raise UsageError(f"--preemptions-per-hour {preemptions_per_hour} must be a finite number, at least 0")
    if preemptions_per_hour is not None and preemptions_per_hour > MAX_RATE:
        raise UsageError(f"--preemptions-per-hour {preemptions_per_hour:g} is over {MAX_RATE:g} (one a second)")
    from gpufleet.paths import gpufleet_home

    store = job_store(job_id)
    store.job(job_id)  # an unknown job is refused before anything is read
    given = None if preemptions_per_hour is None else PreemptionRate(preemptions_per_hour, "--preemptions-per-hour")
    prior = None if given is not None else catalogue_rate(store, gpufleet_home(), job_id)
    advice = advise_job(store, job_id, rate=given, prior=prior)
    if json_out:
        emit_json(advice.to_dict())
        return
    _render(advice)


__all__ = ["advise_command", "catalogue_rate"]
