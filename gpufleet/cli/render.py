"""Shared output helpers for the CLI: one JSON object on stdout, or Rich tables."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpufleet.fmt import compact_duration, finite_json, gpu_time, number, short_duration
from gpufleet.fmt import money as _money

if TYPE_CHECKING:
    from gpufleet.cost.gather import CostReport, CostSummary
    from gpufleet.cost.ledger import Cost

# A pipe or a file gets wide tables (Rich would assume 80 columns); a terminal, its own width.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
# No emoji codes: a job name or a log line holding ``:fire:`` is printed as written (and Rich's table of
# codes is not loaded on every start).
console = Console(width=_WIDTH, emoji=False)
err_console = Console(stderr=True, emoji=False)


def emit_json(obj: Any) -> None:
    """``obj`` as standard JSON on stdout: NaN and infinities become ``null`` (JSON has neither)."""
    sys.stdout.write(json.dumps(finite_json(obj), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n")


def fmt(value: Any) -> str:
    """A cell as people read it: floats to 4 significant digits (never in e-notation), ``None`` as empty,
    a list as ``a, b``, a mapping as ``k=v k=v``: never a Python repr (``[<Outcome.PREEMPTED: ...>]``)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return number(value, 4)
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(fmt(v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{k}={fmt(v)}" for k, v in value.items())
    return str(value)


EVENT_FIELDS_LEFT_OUT = frozenset({"ts", "attempt", "kind", "path", "sources"})
"""Fields of an event its detail leaves out: its own columns, and what is too long for a cell."""


def event_detail(event: dict[str, Any], t0: float) -> str:
    """An event's fields as ``key=value`` for people: ``restore step=959 seconds=55 ms cause=start``.

    A duration (``seconds``, ``grace``, ``*_s``, ``*_seconds``) in the unit that keeps it readable
    (``0.07 ms``, ``1.4 s``), a moment (``deadline``, ``*_at``) as the table's ``+12.3s`` since ``t0``,
    a rate (``*_per_s``) as a number, a list or mapping without spaces (``replaced=1,2``); an empty field
    is left out.
    """
    parts = []
    for key, value in event.items():
        if key in EVENT_FIELDS_LEFT_OUT or value is None:
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            if key == "deadline" or key.endswith("_at"):
                parts.append(f"{key}=+{value - t0:.1f}s")
                continue
            if key in ("seconds", "grace") or (key.endswith(("_s", "_seconds")) and not key.endswith("_per_s")):
                parts.append(f"{key}={short_duration(value)}")
                continue
        parts.append(f"{key}={_packed(value)}")
    return " ".join(parts)


def _packed(value: Any) -> str:
    """A value inside ``key=value key=value`` without spaces of its own: ``1,2``, ``0:4242,1:4343``."""
    if isinstance(value, dict):
        return ",".join(f"{k}:{fmt(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ",".join(fmt(v) for v in value)
    return fmt(value)


def styled(markup: str) -> Text:
    """A table cell in Rich markup (``styled("[red]drift[/]")``): :func:`table` shows every other cell as written.

    Interpolate only what gpufleet itself writes; a user's value goes in through ``rich.markup.escape``.
    """
    return Text.from_markup(markup)


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    """A borderless table; cells, title and headers are shown as written (a ``[bold]`` in a value is text),
    except :func:`styled` cells."""
    t = Table(
        title=None if title is None else escape(title),
        title_justify="left",
        header_style="bold underline",
        box=None,
        padding=(0, 1),
    )
    for col in columns:
        t.add_column(escape(col), overflow="fold")
    for row in rows:
        t.add_row(*(v if isinstance(v, Text) else escape(fmt(v)) for v in row))
    return t


def money(value: float, currency: str) -> str:
    """Money in a CLI table cell: ``gpufleet.fmt.money``, as every document writes it."""
    return _money(value, currency)


def duration(seconds: float | None) -> str:
    return "" if seconds is None else compact_duration(seconds)


def _cost_cells(c: Cost, currency: str) -> list[object]:
    share = c.gpu_hours["lost"] / c.total_gpu_hours if c.total_gpu_hours else 0.0
    lost = f"{gpu_time(c.gpu_hours['lost'])} ({share:.0%})"
    overhead = f"{gpu_time(c.preemption_overhead_gpu_hours)} ({c.preemption_share:.0%})"
    return [
        c.preemptions,
        gpu_time(c.total_gpu_hours),
        "" if c.goodput is None else f"{c.goodput:.0%}",
        lost,
        c.steps_redone,
        overhead,
        money(c.preemption_money, currency),
        money(c.money, currency),
        money(c.on_demand_money, currency),
    ]


def _bucket_rows(c: Cost, currency: str) -> list[list[object]]:
    """One row per goodput bucket: GPU-seconds, share of the row's GPU time, money at its average rate."""
    total, rate = c.gpu_seconds, c.rate_per_gpu_second
    rows: list[list[object]] = []
    for bucket, seconds in c.bucket_gpu_seconds().items():
        share = f"{seconds / total:.1%}" if total > 0 else ""
        rows.append([bucket, _gpu_seconds(seconds), share, money(seconds * rate, currency)])
    whole = "100.0%" if total > 0 else ""
    rows.append([styled("[bold]total[/]"), _gpu_seconds(total), whole, money(total * rate, currency)])
    return rows


def _gpu_seconds(seconds: float) -> str:
    """GPU-seconds to six significant figures (a laptop demo's fractions), whole from 100,000 on."""
    return f"{seconds:,.0f}" if seconds >= 1e5 else number(seconds, 6)


def print_cost_buckets(report: CostReport) -> None:
    """Where every GPU-second went, per job then per team (``gpufleet cost --buckets``)."""
    cur = report.ledger.currency
    head = ["bucket", "GPU-s", "share", "money"]
    for j, c in report.ledger.jobs.items():
        console.print(table(f"#{j} {report.names.get(j, '?')}: goodput {_goodput(c)}", head, _bucket_rows(c, cur)))
    for team, c in report.ledger.teams.items():
        console.print(table(f"team {team}: goodput {_goodput(c)}", head, _bucket_rows(c, cur)))


def _goodput(c: Cost) -> str:
    return "n/a" if c.goodput is None else f"{c.goodput:.1%}"


def print_cost(report: CostReport | CostSummary, *, buckets: bool = False, limit: int | None = 20) -> None:
    """The per-team cost table, the costliest jobs, the unpriced warning and the note's path.

    Teams first (every one, and the total), then the ``limit`` costliest jobs (``None``: every one;
    a summary lists the jobs it was read with) and how many more there are: at 100,000 jobs a table
    of all of them is read by nobody (``--json`` lists them all). ``preemption overhead`` sits beside
    ``lost``: lost work alone hides what a preemption costs (the restart's start-up and restore, the
    save at the signal); see ``gpufleet.cost.ledger``. ``goodput`` is the share of GPU time spent
    computing; ``buckets`` adds the full split of it.
    """
    summary = report.summary(limit)
    cur = summary.currency
    head = [
        "preempted",
        "GPU time",
        "goodput",
        "lost",
        "redone steps",
        "preemption overhead",
        "overhead cost",
        "cost",
        "on-demand",
    ]
    rows = [[team, *_cost_cells(c, cur)] for team, c in summary.teams.items()]
    rows.append([styled("[bold]total[/]"), *_cost_cells(summary.total, cur)])
    console.print(table("cost per team", ["team", *head], rows))
    listed, count = len(summary.jobs), summary.job_count
    title = "cost per job" if listed >= count else f"cost per job: the {listed:,} costliest of {count:,}"
    jobs = [[f"#{j} {name}", *_cost_cells(c, cur)] for j, name, c in summary.jobs]
    console.print(table(title, ["job", *head], jobs))
    if listed < count:
        more = count - listed
        console.print(
            f"{more:,} more job{'' if more == 1 else 's'}: --limit N or --all to list them (--json has every one)",
            highlight=False,
            markup=False,
        )
    if buckets:
        print_cost_buckets(summary.as_report())
    if summary.total.unpriced:
        unpriced = escape(", ".join(summary.total.unpriced))
        console.print(f"[yellow]no rate for {unpriced}: counted in hours, not money[/]")
    if summary.note is not None:
        console.print(f"cost note: {escape(str(summary.note.markdown))}")


__all__ = [
    "console",
    "duration",
    "emit_json",
    "err_console",
    "event_detail",
    "fmt",
    "gpu_time",
    "money",
    "print_cost",
    "print_cost_buckets",
    "styled",
    "table",
]
