"""Small text formatters shared by the CLI, the cost note and the trace timeline."""

from __future__ import annotations

import math
from typing import Any


def compact_duration(seconds: float) -> str:
    """``12.3s``, ``4m05s``, ``2h07m``: short enough for a table cell."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def finite_json(value: Any) -> Any:
    """Replace NaN and infinities (an ``.inf`` price, a broken clock) with ``None`` for strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value
