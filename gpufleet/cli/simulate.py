"""``gpufleet simulate``: replay a synthetic workload on the catalogue under each placement policy.

Parse, call :mod:`gpufleet.placement.simulate`, render. Every policy sees the same jobs, outages
and preemption seed, so the table compares policies, not luck. ``--out DIR`` writes the JSON, a
Markdown report and four charts (matplotlib, Agg backend) for a cost note or a design review.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufleet.cli.options import check_path_name
from gpufleet.cli.render import console, emit_json, err_console, money, table
from gpufleet.errors import UsageError, parameters_as_flags
from gpufleet.fmt import finite_json, markdown_table, number

if TYPE_CHECKING:
    from gpufleet.placement.simulate import SimResult

_HOW_TO_READ = (
    "*Wasted* GPU-hours are the work lost since the last checkpoint when a job was preempted or killed by an "
    "outage, plus the time spent restoring; *saving* is the time spent writing checkpoints; *idle* counts the "
    "unused GPUs of whole nodes rented for smaller jobs (workload `whole_nodes: true`). *Killed* counts jobs "
    "killed by an outage; *moves* counts restarts in another region (a move to another provider pays checkpoint "
    "egress). The queue wait adds up every wait of a job (the first and one after each interruption), censored "
    "at the horizon; *missed* counts jobs with a deadline that finished late or were still unfinished past it."
)
LONG_RUN_JOBS = 20_000
"""Jobs times policies above which a progress bar is shown."""
CHARTS = {
    "cost_by_team.png": "Cost per team",
    "wasted_gpu_hours.png": "Wasted GPU-hours (lost to interruptions + restore)",
    "queue_wait_p95.png": "Queue wait, 95th percentile (hours)",
    "deadline_misses.png": "Deadline misses",
}


def _hours(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.2f} h" if value < 10 else f"{value:,.0f} h"


def _cash(value: float, currency: str) -> str:
    """Money without cents above 100: the tables compare policies, not invoices."""
    return money(value, currency) if abs(value) < 100 else money(round(value), currency).removesuffix(".00")


def _share(part: float, whole: float) -> str:
    return f"{part:,.0f} ({part / whole:.0%})" if whole else f"{part:,.0f}"


def _money_rows(results: Sequence[SimResult]) -> tuple[list[str], list[list[str]]]:
    head = ["policy", "done", "cost", "egress", "GPU-h", "useful", "wasted", "saving"]
    idle = any(r.overall.idle_gpu_hours for r in results)
    rows = [
        [
            r.policy,
            f"{r.overall.completed}/{r.overall.jobs}",
            _cash(r.overall.cost, r.currency),
            _cash(r.overall.egress_cost, r.currency),
            f"{r.overall.gpu_hours:,.0f}",
            f"{r.overall.useful_gpu_hours:,.0f}",
            _share(r.overall.wasted_gpu_hours, r.overall.gpu_hours),
            f"{r.overall.checkpoint_gpu_hours:,.0f}",
            *([_share(r.overall.idle_gpu_hours, r.overall.gpu_hours)] if idle else []),
        ]
        for r in results
    ]
    return head + ["idle"] * idle, rows


def _time_rows(results: Sequence[SimResult]) -> tuple[list[str], list[list[str]]]:
    head = ["policy", "wait p50", "wait p95", "missed", "preempted", "killed", "moves", "makespan"]
    rows = [
        [
            r.policy,
            _hours(r.overall.queue_wait_p50_h),
            _hours(r.overall.queue_wait_p95_h),
            f"{r.overall.deadline_misses}/{r.overall.deadline_jobs}",
            str(r.overall.preemptions),
            str(r.overall.outage_kills),
            str(r.overall.moves),
            _hours(r.overall.makespan_h),
        ]
        for r in results
    ]
    return head, rows


def _team_rows(results: Sequence[SimResult]) -> tuple[list[str], list[list[str]]]:
    teams = list(dict.fromkeys(t for r in results for t in r.teams))
    rows = [[r.policy, *(_cash(r.teams[t].cost, r.currency) if t in r.teams else "" for t in teams)] for r in results]
    return ["policy", *teams], rows


def _markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(markdown_table(head, rows))


def _markdown(report: dict[str, Any], results: Sequence[SimResult]) -> str:
    inputs = report["inputs"]
    return (
        "\n\n".join(
            [
                "# Fleet simulation",
                f"{inputs['jobs']} jobs over {number(inputs['days'], 6)} days "
                f"(simulated for {number(report['horizon_hours'], 6)} h), "
                f"seed {inputs['seed']}, catalogue `{inputs['catalog']}` as of {report['as_of']}, "
                f"{report['outages']} outages. Every policy saw the same jobs, outages and preemption seed.",
                "## Cost and GPU-hours",
                _markdown_table(*_money_rows(results)),
                "## Waits, deadlines, interruptions",
                _markdown_table(*_time_rows(results)),
                "## Cost per team",
                _markdown_table(*_team_rows(results)),
                _HOW_TO_READ,
                *(f"![{title}]({name})" for name, title in CHARTS.items()),
            ]
        )
        + "\n"
    )


def _charts(out: Path, results: Sequence[SimResult]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [r.policy for r in results]
    teams = list(dict.fromkeys(t for r in results for t in r.teams))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(teams))
    for i, team in enumerate(teams):
        costs = [r.teams[team].cost if team in r.teams else 0.0 for r in results]
        ax.bar(np.arange(len(results)) + i * width, costs, width, label=team)
    ax.set_xticks(np.arange(len(results)) + width * (len(teams) - 1) / 2, names)
    ax.set_ylabel(results[0].currency)
    ax.legend()
    _save(fig, ax, out / "cost_by_team.png", CHARTS["cost_by_team.png"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    lost = [r.overall.lost_gpu_hours for r in results]
    ax.bar(names, lost, label="lost since last checkpoint", color="#d62728")
    ax.bar(names, [r.overall.restore_gpu_hours for r in results], bottom=lost, label="restore", color="#f2a541")
    ax.set_ylabel("GPU-hours")
    ax.legend()
    _save(fig, ax, out / "wasted_gpu_hours.png", CHARTS["wasted_gpu_hours.png"])
    for name, values in (
        ("queue_wait_p95.png", [r.overall.queue_wait_p95_h or 0.0 for r in results]),
        ("deadline_misses.png", [float(r.overall.deadline_misses) for r in results]),
    ):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.bar(names, values, color="#1b2f5e")
        _save(fig, ax, out / name, CHARTS[name])


def _save(fig: Any, ax: Any, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(out: Path, report: dict[str, Any], results: Sequence[SimResult]) -> dict[str, str]:
    try:
        out.mkdir(parents=True, exist_ok=True)
        text = json.dumps(finite_json(report), indent=2, allow_nan=False)  # standard JSON: no NaN or Infinity
        (out / "simulation.json").write_text(text + "\n", encoding="utf-8")
        (out / "simulation.md").write_text(_markdown(report, results), encoding="utf-8")
        _charts(out, results)
    except OSError as err:
        raise UsageError(f"cannot write the simulation report to --out {str(out)!r}: {err}") from None
    return {name: str(out / name) for name in ("simulation.json", "simulation.md", *CHARTS)}


def _run_with_progress(
    run: Callable[[Callable[[str, float], None] | None], list[SimResult]], show: bool
) -> list[SimResult]:
    if not show:
        return run(None)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def report(policy: str, fraction: float) -> None:
            if policy not in tasks:
                tasks[policy] = bar.add_task(f"simulating {policy}", total=1.0)
            bar.update(tasks[policy], completed=fraction)

        return run(report)


@parameters_as_flags({"jobs": "--jobs", "days": "--days", "seed": "--seed"})
def simulate_command(
    catalog: Annotated[Path, typer.Option("--catalog", help="Offer catalogue YAML (see examples/catalog.yaml).")],
    jobs: Annotated[int, typer.Option("--jobs", help="Jobs to simulate.")] = 5000,
    days: Annotated[float, typer.Option("--days", help="Days over which the jobs arrive.")] = 30.0,
    policies: Annotated[
        list[str] | None,
        typer.Option("--policy", help="A placement policy to compare (repeat it); default: all of them."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of every random draw.")] = 0,
    workload: Annotated[
        Path | None, typer.Option("--workload", help="Workload model YAML (arrivals, job mix, outages).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write simulation.json, simulation.md and PNG charts here.")
    ] = None,
) -> None:
    """Simulate a fleet under each placement policy: cost, wasted GPU-hours, queue waits, deadline misses."""
    from gpufleet.placement.catalog import load_catalog
    from gpufleet.placement.policies import POLICIES, make_policy
    from gpufleet.placement.simulate import build_scenario, compare_policies
    from gpufleet.placement.workload import WorkloadModel, load_workload

    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: simulate at least 1 job")
    if out is not None:
        check_path_name(out, "--out")
    if not days > 0:
        raise UsageError(f"--days {days:g}: the arrival window must be more than 0 days")
    names = list(dict.fromkeys(policies or POLICIES))
    for name in names:
        make_policy(name)
    cat = load_catalog(catalog)
    model = load_workload(workload) if workload is not None else WorkloadModel()
    scenario = build_scenario(cat, model, jobs=jobs, days=days, seed=seed)
    show = not json_out and jobs * len(names) >= LONG_RUN_JOBS
    results = _run_with_progress(lambda report: compare_policies(cat, scenario, names, progress=report), show)
    report = {
        "inputs": {
            "catalog": str(catalog),
            "jobs": jobs,
            "days": days,
            "seed": seed,
            "workload": str(workload) if workload else None,
            "policies": names,
        },
        "as_of": cat.as_of.isoformat(),
        "currency": cat.currency,
        "horizon_hours": scenario.horizon_h,
        "outages": len(scenario.outages),
        "workload": model.model_dump(mode="json"),
        "results": [r.to_dict() for r in results],
    }
    files = _write(out, report, results) if out is not None else {}
    if json_out:
        emit_json({**report, "files": files})
        return
    console.print(table(f"{jobs} jobs over {number(days, 6)} days, seed {seed}: cost", *_money_rows(results)))
    console.print(table("waits, deadlines, interruptions", *_time_rows(results)))
    console.print(table("cost per team", *_team_rows(results)))
    for path in files.values():
        console.print(f"wrote {path}", markup=False)


__all__ = ["CHARTS", "LONG_RUN_JOBS", "simulate_command"]
