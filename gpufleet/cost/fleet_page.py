"""The fleet report written out: a Markdown page, its JSON twin and four PNG charts.

``write_report`` renders what :func:`~gpufleet.cost.fleet.build_fleet_report` computed; it
does no accounting of its own. ``report.json`` is :meth:`FleetReport.to_dict` (finite floats or
``null``); ``report.md`` (``report_markdown``) is for people and embeds the charts: GPU time and
money per team, where each job's GPU time went, the queue waits and the SLO attainment
(matplotlib, Agg backend, imported on first use). It is apart from the report, as
:mod:`gpufleet.cost.note` is from the ledger: the figures are worked out in one module and laid
out in the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.cost.fleet import WASTE_PARTS, FleetReport, iso_utc
from gpufleet.errors import ParameterError
from gpufleet.fmt import markdown_table, money
from gpufleet.telemetry.slo import SloResult

_COLORS = {
    "useful": "#3c9d6b",
    "idle": "#b0b0b0",
    "host_bound": "#f2a541",
    "comm_bound": "#7b5ea7",
    "checkpoint": "#1b2f5e",
    "startup": "#8c8c5a",
    "lost_to_preemption": "#d62728",
}
_HOW_TO_READ = """\
Each job's GPU-hours add up to its parts: **lost to preemption** (work redone after a preemption or \
rollback), **startup** (process start-up and checkpoint restore, the first start included), **checkpoint** \
(saving), and the rest split in the proportions its recorded GPU series shows: **idle** (no work for \
60 s or more), **host-bound** (shorter stalls between busy samples: the GPU waits for data), \
**comm-bound** (NVLink/PCIe busy while the SMs are not) and **useful**. Jobs marked `no series` had no \
recorded GPU series: all of their rest counts as useful. Attempts are counted whole when they overlap \
the window. Error budget left: 100 % untouched, 0 % spent, negative overspent.

**Goodput** is the share of a job's GPU time spent computing, from the cost ledger's twelve buckets \
(queued, startup, staging, data wait, compute, straggler wait, checkpoint, restore, lost, rollback, \
resize, idle; `gpufleet cost --buckets` prints them all); the top badput are its three largest other \
buckets, priced at the job's average rate."""


def write_report(report: FleetReport, out_dir: Path) -> list[Path]:
    """Write ``report.md``, ``report.json`` and the charts into ``out_dir``; the paths written."""
    import json

    if out_dir.exists() and not out_dir.is_dir():
        raise ParameterError("{out_dir} is a file: give a folder for the report", out_dir=str(out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    charts = {
        "teams.png": _chart_teams,
        "waste.png": _chart_waste,
        "queue_wait.png": _chart_queue,
        "slo.png": _chart_slo,
    }
    paths = [out_dir / "report.md", out_dir / "report.json"]
    paths[1].write_text(json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    for name, draw in charts.items():
        draw(report, out_dir / name)
        paths.append(out_dir / name)
    paths[0].write_text(report_markdown(report, list(charts)), encoding="utf-8")
    return paths


def report_markdown(report: FleetReport, charts: Sequence[str] = ()) -> str:
    """The report as a Markdown page embedding ``charts`` (file names next to it)."""
    cur, scale, unit = report.currency, *_gpu_unit(report.total.total_gpu_hours)
    window = f"since {iso_utc(report.since)}" if report.since is not None else "all history"
    who = f"team {report.team}" if report.team else "all teams"
    states = ", ".join(f"{n} {s}" for s, n in report.jobs_by_state.items()) or "none"
    out = [
        "# Fleet report",
        "",
        f"_{window} until {iso_utc(report.generated_at)}, {who}; prices in {cur}"
        + (f" (rate card as of {report.rate_card_as_of})_" if report.rate_card_as_of else "_"),
        "",
        f"Jobs: {states}. GPU time **{_num(report.total.total_gpu_hours * scale)} {unit}** over "
        f"{report.total.attempts} attempts, **{money(report.total.money, cur)}**; "
        f"{len(report.breached)} of {len(report.slos)} objectives breached.",
        "",
    ]
    if report.unpriced:
        out += [f"> **Unpriced:** {', '.join(report.unpriced)}: counted in hours but not in money.", ""]
    rows = [
        [
            s.name,
            _slo_value(s.measured, s.unit),
            f"{s.comparison} {_slo_value(s.target, s.unit)}" if s.target is not None else "-",
            {True: "met", False: "**BREACHED**", None: "no data" if s.measured is None else "no target"}[s.met],
            "-" if s.error_budget_remaining is None else f"{s.error_budget_remaining:.0%}",
            str(s.count),
        ]
        for s in report.slos
    ]
    out += ["## Objectives", "", *_md_table(["SLO", "Measured", "Target", "Status", "Budget left", "Based on"], rows)]
    out += ["", *(f"![{Path(c).stem}]({c})" for c in charts), ""]
    rows = [
        [
            t.team,
            str(t.jobs),
            str(t.attempts),
            "-" if t.failure_rate is None else f"{t.failure_rate:.1%}",
            str(t.preemptions),
            _num(t.gpu_hours * scale),
            _num(t.lost_to_preemption_gpu_hours * scale),
            money(t.money, cur),
        ]
        for t in report.teams
    ]
    head = ["Team", "Jobs", "Attempts", "Failure rate", "Preemptions", unit, f"Lost ({unit})", "Money"]
    out += ["## Teams", "", *_md_table(head, rows), ""]
    rows = [
        [
            f"#{j.job_id} {j.name}",
            j.team,
            j.state,
            _num(j.gpu_hours * scale),
            *(_num(j.breakdown[p] * scale) for p in WASTE_PARTS),
            "yes" if j.gpu_series else "no series",
        ]
        for j in report.jobs
    ]
    head = ["Job", "Team", "State", unit, *(p.replace("_", " ") for p in WASTE_PARTS), "GPU series"]
    out += [f"## Jobs, most waste first ({unit})", "", *_md_table(head, rows, text_columns=3), ""]
    out += ["## Goodput per job", "", *_goodput_table(report, scale, unit), ""]
    out += ["## How to read this", "", _HOW_TO_READ, ""]
    return "\n".join(out)


def _goodput_table(report: FleetReport, scale: float, unit: str) -> list[str]:
    """Each job's goodput and its three largest badput buckets, with their money."""
    cur, rows = report.currency, []
    for j in report.jobs:
        goodput = "-" if j.goodput is None else f"{j.goodput:.1%}"
        top = [
            f"{str(t['bucket']).replace('_', ' ')}: {_num(t['gpu_seconds'] / 3600.0 * scale)} {unit}, "
            f"{money(t['money'], cur)}"
            for t in j.badput_top
        ]
        rows.append([f"#{j.job_id} {j.name}", j.team, goodput, *(top + ["-"] * 3)[:3]])
    return _md_table(["Job", "Team", "Goodput", "Top badput", "Second", "Third"], rows, text_columns=2)


def _md_table(head: list[str], rows: list[list[str]], text_columns: int = 1) -> list[str]:
    """A Markdown table: the first ``text_columns`` left-aligned, figures right-aligned.

    Cells are put on one line and their ``|`` escaped; the headers are written as given.
    """

    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    return markdown_table(head, ([cell(c) for c in r] for r in rows), right_from=text_columns)


def _gpu_unit(hours: float) -> tuple[float, str]:
    """GPU-seconds below 0.1 GPU-hour (laptop demos), GPU-hours above."""
    return (3600.0, "GPU-s") if hours < 0.1 else (1.0, "GPU-h")


def _num(x: float) -> str:
    """Three significant figures, thousands separators from 100 on."""
    if not math.isfinite(x):
        return "n/a"
    x = float(f"{x:.3g}")
    if x == 0 or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def _slo_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ratio":
        return f"{value:.2%}"
    return f"{_num(value)} {unit}"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    plt = _pyplot()
    try:
        fig.savefig(path, dpi=110, format="png")
    finally:
        plt.close(fig)


def _chart_teams(report: FleetReport, path: Path) -> None:
    plt = _pyplot()
    scale, unit = _gpu_unit(max((t.gpu_hours for t in report.teams), default=0.0))
    teams = [t.team for t in report.teams]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 1.6 + 0.45 * max(1, len(teams))), layout="constrained")
    lost = [t.lost_to_preemption_gpu_hours * scale for t in report.teams]
    rest = [t.gpu_hours * scale - x for t, x in zip(report.teams, lost, strict=True)]
    left.barh(teams, rest, color=_COLORS["useful"], label="rest")
    left.barh(teams, lost, left=rest, color=_COLORS["lost_to_preemption"], label="lost to preemption")
    left.set(title=f"GPU time per team ({unit})", xlabel=unit)
    left.legend(fontsize=8, frameon=False)
    right.barh(teams, [t.money for t in report.teams], color="#1b2f5e")
    right.set(title=f"Money per team ({report.currency})", xlabel=report.currency)
    for ax in (left, right):
        ax.invert_yaxis()
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
    if not teams:
        left.text(0.5, 0.5, "no jobs in the window", ha="center", transform=left.transAxes)
    _save(fig, path)


def _chart_waste(report: FleetReport, path: Path) -> None:
    plt = _pyplot()
    jobs = list(report.jobs[:30])
    scale, unit = _gpu_unit(max((j.gpu_hours for j in jobs), default=0.0))
    fig, ax = plt.subplots(figsize=(10, 1.8 + 0.4 * max(1, len(jobs))), layout="constrained")
    labels = [f"#{j.job_id} {j.name} ({j.team})" + ("" if j.gpu_series else " *") for j in jobs]
    left = np.zeros(len(jobs))
    for part in WASTE_PARTS:
        width = np.array([j.breakdown[part] * scale for j in jobs])
        ax.barh(labels, width, left=left, color=_COLORS[part], label=part.replace("_", " "))
        left += width
    ax.invert_yaxis()
    ax.set(title=f"Where each job's GPU time went ({unit}), most waste first", xlabel=unit)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    note = "  (* no GPU series: the rest counts as useful)" if any(not j.gpu_series for j in jobs) else ""
    fig.legend(loc="outside lower center", ncols=len(WASTE_PARTS), fontsize=8, frameon=False, title=note or None)
    if not jobs:
        ax.text(0.5, 0.5, "no job ran in the window", ha="center", transform=ax.transAxes)
    _save(fig, path)


def _chart_queue(report: FleetReport, path: Path) -> None:
    plt = _pyplot()
    waits = np.asarray(report.queue_waits_s, dtype=np.float64)
    minutes = waits.size > 0 and float(waits.max()) >= 600
    scale, unit = (1 / 60, "min") if minutes else (1.0, "s")
    fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
    if waits.size:
        ax.hist(waits * scale, bins=min(30, max(5, waits.size)), color="#7aa6c2", edgecolor="white")
        for s in (r for r in report.slos if r.name.startswith("queue_wait_")):
            style = "--" if s.name.endswith("p50") else "-"
            if s.measured is not None:
                label = f"{s.name.removeprefix('queue_wait_')} = {_num(s.measured * scale)} {unit}"
                ax.axvline(s.measured * scale, color="#d62728", linestyle=style, label=label)
            if s.target is not None:
                label = f"{s.name.removeprefix('queue_wait_')} target <= {_num(s.target * scale)} {unit}"
                ax.axvline(s.target * scale, color="#333333", linestyle=":", linewidth=1, label=label)
        ax.legend(fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "no queue waits in the window", ha="center", transform=ax.transAxes)
    ax.set(title=f"Queue wait: submission or requeue to start ({unit})", xlabel=f"wait ({unit})")
    ax.set_ylabel("number of waits")
    ax.yaxis.get_major_locator().set_params(integer=True)
    _save(fig, path)


def _attainment(s: SloResult) -> float | None:
    """Measured over target (``>=``) or target over measured (``<=``): 1 is exactly on target."""
    if s.measured is None or s.target is None:
        return None
    if s.comparison == ">=":
        return s.measured / s.target if s.target else None
    return s.target / s.measured if s.measured > 0 else math.inf


def _chart_slo(report: FleetReport, path: Path) -> None:
    plt = _pyplot()
    names = [s.name for s in report.slos]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.45 * max(1, len(names))), layout="constrained")
    for y, s in enumerate(report.slos):
        value = _attainment(s)
        shown = 0.0 if value is None else min(value, 2.0)
        color = {True: "#3c9d6b", False: "#d62728", None: "#b0b0b0"}[s.met]
        ax.barh(y, shown, color=color)
        text = "no data" if s.measured is None else _slo_value(s.measured, s.unit)
        text += f" (target {s.comparison} {_slo_value(s.target, s.unit)})" if s.target is not None else " (no target)"
        ax.text(shown + 0.03, y, text, va="center", fontsize=8, bbox={"facecolor": "white", "edgecolor": "none"})
    ax.axvline(1.0, color="#333333", linewidth=1, zorder=0)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, 3.2)
    ax.set(title="SLO attainment (1 = on target; green met, red breached, grey not judged)", xlabel="attainment")
    _save(fig, path)


__all__ = ["report_markdown", "write_report"]
