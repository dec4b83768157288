"""Small text formatters shared by the CLI, the cost note, the fleet page and the reports.

- ``money(amount, currency)``: an amount with its currency symbol or code, rounded one way in the
  cost note, the fleet page, the sweep note and CLI tables alike; ``CURRENCY_SYMBOLS`` maps the codes
  that get a symbol.
- ``number(value, digits)``: a number to ``digits`` significant figures for people: thousands
  separators, never e-notation (``1,230,000``, ``0.0000123``).
- ``gpu_time(hours)``: GPU time in GPU-seconds below 0.01 GPU-h (a laptop demo), GPU-hours above.
- ``markdown_table(headers, rows, right_from=...)``: the lines of a Markdown table.
- ``compact_duration(seconds)``: ``12.3s``, ``4m05s``, ``2h07m`` for a table cell.
- ``short_duration(seconds)``: ``0.07 ms``, ``58 ms``, ``1.4 s``, ``4m05s``: a measured duration that may be
  far below a second (a restore, a save).
- ``finite_or_none(value)``: a float, or ``None`` for NaN, infinities and ``None``.
- ``finite_json(value)``: the same through dicts, lists and tuples, for strict JSON.
- ``shown_path(path)``: a path quoted for a one-line message, a long one cut in the middle.

Kept elsewhere on purpose: the cost note's prose durations (``4 min 05 s``, ``n/a``) and the AI
documentation's policy periods (``30 days``), the NaN-as-string encoders of the event log and the
GPU log (a NaN loss must survive the round trip), and the checkpoint manifest's
``finite_or_none``, which also turns untrusted non-numbers into ``None`` and ints into floats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from os import PathLike
from typing import Any, Final

__all__ = [
    "CURRENCY_SYMBOLS",
    "GPU_SECONDS_BELOW_HOURS",
    "compact_duration",
    "finite_json",
    "finite_or_none",
    "gpu_time",
    "markdown_table",
    "money",
    "number",
    "short_duration",
    "shown_path",
]

CURRENCY_SYMBOLS: Final = {"USD": "$", "EUR": "€", "GBP": "£"}
"""Currency codes written as a symbol; other codes are written out beside the amount."""


def money(amount: float, currency: str) -> str:
    """``amount`` in ``currency``: whole cents from one unit up (``$1,234.57``), three significant figures below.

    Never fewer than cents (``$0.50``, ``$0.0123``, ``$0.0000123``) and ``$0.00`` for nothing, so a
    figure reads the same in every document; the sign before the symbol (``-$1.00``); ``n/a`` for NaN
    and infinities; codes without a symbol after the amount (``12.35 CHF``), the code matched
    case-insensitively.
    """
    if not math.isfinite(amount):
        return "n/a"
    sign, x = ("-" if amount < 0 else ""), abs(amount)
    if x >= 1 or x == 0:
        text = f"{x:,.2f}"
    else:
        text = f"{x:.{min(8, 2 - math.floor(math.log10(x)))}f}".rstrip("0")
        text = text if len(text.split(".")[1]) >= 2 else f"{x:.2f}"
    symbol = CURRENCY_SYMBOLS.get(currency.upper())
    return f"{sign}{symbol}{text}" if symbol else f"{sign}{text} {currency}"


def number(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant figures as people write it: ``1,230,000``, ``12.3``, ``0.0000123``.

    What ``f"{value:,.{digits}g}"`` gives, minus its e-notation (``1.23e+06``, ``1.23e-05``): a
    reader compares figures by their length, not by an exponent. Trailing zeros are dropped (``2.5``),
    ``n/a`` stands for NaN and infinities, and a figure below 10**-12 is ``0``.
    """
    if not math.isfinite(value):
        return "n/a"
    if abs(value) < 1e-12:
        return "0"
    mantissa, _, exponent = f"{abs(value):.{digits - 1}e}".partition("e")  # rounded once, as :g rounds
    sign, shift = ("-" if value < 0 else ""), int(exponent)
    significant = mantissa.replace(".", "")
    if shift >= digits - 1:  # a whole number: the significant digits, then zeros
        return f"{sign}{int(significant + '0' * (shift - digits + 1)):,}"
    if shift >= 0:
        whole, fraction = significant[: shift + 1], significant[shift + 1 :]
    else:
        whole, fraction = "0", "0" * (-shift - 1) + significant
    fraction = fraction.rstrip("0")
    return f"{sign}{int(whole):,}" + (f".{fraction}" if fraction else "")


GPU_SECONDS_BELOW_HOURS: Final = 0.01
"""GPU time under this many GPU-hours (36 GPU-seconds) is written in GPU-seconds."""


def gpu_time(hours: float) -> str:
    """GPU time in the unit that reads best: ``12.3 GPU-s`` below 0.01 GPU-h, ``1,234.57 GPU-h`` above."""
    if not math.isfinite(hours):
        return "n/a"
    if abs(hours) < GPU_SECONDS_BELOW_HOURS:
        return f"{number(hours * 3600)} GPU-s"
    return f"{hours:,.2f} GPU-h"


def markdown_table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], *, right_from: int | None = None
) -> list[str]:
    """The lines of a Markdown table, cells written as given (escaping ``|`` is the caller's).

    Without ``right_from`` the rule is the compact ``|---|---|`` and every column left-aligned
    (the simulation report, the AI documentation); with it the rule is spaced,
    ``| --- | ---: |``, the columns before ``right_from`` left-aligned and the figures from
    ``right_from`` on right-aligned (the cost note, the fleet page).
    """
    if right_from is None:
        rule = "|" + "---|" * len(headers)
    else:
        rule = "| " + " | ".join("---" if i < right_from else "---:" for i in range(len(headers))) + " |"
    return ["| " + " | ".join(headers) + " |", rule, *("| " + " | ".join(row) + " |" for row in rows)]


def compact_duration(seconds: float) -> str:
    """``12.3s``, ``4m05s``, ``2h07m``: short enough for a table cell (minutes and hours truncated)."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def short_duration(seconds: float) -> str:
    """A measured duration to two significant figures in the unit that keeps it readable.

    ``0.07 ms`` and ``58 ms`` below a second (a restore of a small model takes microseconds: in seconds
    it would read ``0.00007``), ``1.4 s`` and ``30 s`` below a minute, :func:`compact_duration` above.
    """
    if not math.isfinite(seconds):
        return "n/a"
    if abs(seconds) < 0.995:  # 0.996 s would round to "1,000 ms"
        return f"{number(seconds * 1000, 2)} ms"
    if abs(seconds) < 60:
        return f"{number(seconds, 2)} s"
    return compact_duration(seconds)


def finite_or_none(value: float | None) -> float | None:
    """``value``, or ``None`` for NaN and infinities: JSON has neither (a chi-squared against a zero expectation)."""
    return value if value is not None and math.isfinite(value) else None


def finite_json(value: Any) -> Any:
    """Replace NaN and infinities (an ``.inf`` price, a broken clock) with ``None`` for strict JSON."""
    if isinstance(value, float):
        return finite_or_none(value)
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def shown_path(path: PathLike[str] | str, limit: int = 160) -> str:
    """``path`` quoted for a one-line message; a longer one is cut in the middle, with its length."""
    text = repr(str(path))
    if len(text) <= limit:
        return text
    return f"{text[: limit - 50]}...{text[-40:]} ({len(str(path)):,} characters)"
