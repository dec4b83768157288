"""Shared output helpers for the CLI: one JSON object on stdout, or Rich tables."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        t.add_column(col, justify="right" if col.endswith(("s", "h", "$", "#")) and col != "state" else "left")
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    return t


def money(value: float, currency: str) -> str:
    symbol = {"USD": "$", "EUR": "€", "GBP": "£"}.get(currency, currency + " ")
    if value == 0:
        return f"{symbol}0"
    if abs(value) >= 1:
        return f"{symbol}{value:,.2f}"
    return f"{symbol}{value:.2g}" if abs(value) >= 0.01 else f"{symbol}{value:.3g}"


def hours(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:.3f}" if value >= 0.1 else f"{value:.3g}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    h, m = divmod(minutes, 60)
    return f"{h}h{m:02d}m"
