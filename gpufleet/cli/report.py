"""``gpufleet observe report``: SLOs, use and money per team, and the jobs that wasted the most GPU time."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from gpufleet.cost.fleet import FleetReport
    from gpufleet.telemetry.dcgm import Sample

WORST_JOBS = 10


def report_command(
    since: Annotated[
        str | None, typer.Option(help="Window start: 90m, 24h, 7d, or an ISO date/time (UTC). Default: all history.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    out: Annotated[
        Path | None, typer.Option(help="Also write report.md, report.json and PNG charts into this folder.")
    ] = None,
    rates: Annotated[Path | None, typer.Option(help="Rate card YAML (default: the shipped example card).")] = None,
    slo: Annotated[Path | None, typer.Option(help="SLO targets YAML (default: the built-in targets).")] = None,
    team: Annotated[str | None, typer.Option(help="Only this team's jobs.")] = None,
    fail_on_breach: Annotated[
        bool, typer.Option("--fail-on-breach", help="Exit 1 when an objective with data misses its target.")
    ] = False,
) -> None:
    """Fleet report: SLOs with their error budgets, GPU-hours and money per team, waste per job."""
    from gpufleet.cost.fleet import build_fleet_report, parse_since
    from gpufleet.cost.fleet_page import write_report
    from gpufleet.cost.rates import load_rates
    from gpufleet.paths import gpufleet_home
    from gpufleet.telemetry.slo import load_slo

    now = time.time()
    start = parse_since(since, now) if since is not None else None
    card, objectives = load_rates(rates), load_slo(slo)
    home = gpufleet_home()
    store = _open_store(home)
    try:
        report = build_fleet_report(
            store,
            home,
            since=start,
            now=now,
            rates=card,
            gpu_samples=_gpu_samples(home),
            slo=objectives,
            team=team,
        )
    finally:
        store.close()
    written = write_report(report, out) if out is not None else []
    if json_out:
        from gpufleet.cli.render import emit_json

        emit_json({**report.to_dict(), "files": [str(p) for p in written]})
    else:
        print_report(report, written)
    if fail_on_breach and report.breached:
        raise typer.Exit(1)


def _open_store(home: Path) -> Any:
    """The state store, refreshed from remote schedulers first (a warning if one is unreachable)."""
    from gpufleet.backends import sync_remote
    from gpufleet.cli.render import err_console
    from gpufleet.errors import GpufleetError
    from gpufleet.jobs.store import Store

    store = Store(home / "state.db")
    try:
        sync_remote(home, store)
    except GpufleetError as err:
        err_console.print(f"[yellow]warning:[/] states may be stale: {err}", highlight=False, soft_wrap=True)
    return store


def _gpu_samples(home: Path) -> Callable[[int], Sequence[Sample]]:
    """Each job's recorded GPU series, or none where this gpufleet cannot read them."""
    import importlib

    from gpufleet.paths import job_dir

    try:
        reader = getattr(importlib.import_module("gpufleet.telemetry.gpu"), "job_gpu_samples", None)
    except ImportError:
        reader = None
    if reader is None:
        return lambda job_id: []
    return lambda job_id: list(reader(job_dir(home, job_id)))


def print_report(report: FleetReport, written: Sequence[Path] = ()) -> None:
    """The SLO table (met or breached in colour), the team table and the worst jobs by waste."""
    from gpufleet.cli.render import console, gpu_time, money, table
    from gpufleet.cost.fleet import WASTE_PARTS

    window = "all history" if report.since is None else f"since {_iso(report.since)}"
    states = ", ".join(f"{n} {s}" for s, n in report.jobs_by_state.items()) or "no jobs"
    who = f"team {report.team}" if report.team else "all teams"
    console.print(f"[bold]fleet report[/], {window}, {who}: {states}", highlight=False)
    rows = []
    for s in report.slos:
        status = "[dim]no data[/]" if s.measured is None else "[dim]no target[/]"
        if s.met is not None:
            status = "[green]met[/]" if s.met else "[bold red]BREACHED[/]"
        budget = "" if s.error_budget_remaining is None else f"{s.error_budget_remaining:.0%}"
        target = "" if s.target is None else f"{s.comparison} {_value(s.target, s.unit)}"
        rows.append([s.name, _value(s.measured, s.unit), target, status, budget, s.count])
    console.print(table("objectives", ["slo", "measured", "target", "status", "budget left", "based on"], rows))
    cur = report.currency
    rows = [
        [
            t.team,
            t.jobs,
            t.attempts,
            "" if t.failure_rate is None else f"{t.failure_rate:.1%}",
            t.preemptions,
            gpu_time(t.gpu_hours),
            gpu_time(t.lost_to_preemption_gpu_hours),
            money(t.money, cur),
        ]
        for t in report.teams
    ]
    total = report.total
    rows.append(["[bold]total[/]", sum(t.jobs for t in report.teams), total.attempts, "", total.preemptions,
                 gpu_time(total.total_gpu_hours), "", money(total.money, cur)])  # fmt: skip
    head = ["team", "jobs", "attempts", "failure rate", "preempted", "GPU time", "lost", "cost"]
    console.print(table("teams", head, rows))
    job_rows = [
        [f"#{j.job_id} {j.name}", j.team, j.state, gpu_time(j.gpu_hours), gpu_time(j.waste_gpu_hours)]
        + [_share(j.breakdown[p], j.gpu_hours) for p in WASTE_PARTS]
        + ["yes" if j.gpu_series else "[dim]none[/]"]
        for j in report.jobs[:WORST_JOBS]
    ]
    head = ["job", "team", "state", "GPU time", "waste", *(p.replace("_", " ") for p in WASTE_PARTS), "gpu series"]
    console.print(table(f"worst {min(WORST_JOBS, len(report.jobs))} jobs by waste", head, job_rows))
    if report.unpriced:
        console.print(f"[yellow]no rate for {', '.join(report.unpriced)}: counted in hours, not money[/]")
    if written:
        console.print(f"report: {written[0]}")


def _value(value: float | None, unit: str) -> str:
    from gpufleet.cli.render import duration

    if value is None:
        return ""
    if unit == "ratio":
        return f"{value:.2%}"
    return duration(value) if unit == "s" else f"{value:,.0f} {unit}"


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else ""


def _iso(ts: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
