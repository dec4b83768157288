"""The external programs the I/O benchmarks run (fio, iperf3): finding them, and reading what they print."""

from __future__ import annotations

import json
import shutil
from typing import Any

from gpufleet.errors import UsageError

FIO_HINT = "fio is not installed: apt-get install fio (Debian/Ubuntu) or dnf install fio"
IPERF3_HINT = "iperf3 is not installed: apt-get install iperf3 (Debian/Ubuntu) or dnf install iperf3"


def require_tool(name: str, hint: str) -> str:
    """The full path of the program ``name`` on ``$PATH``, or ``UsageError(hint)``."""
    found = shutil.which(name)
    if found is None:
        raise UsageError(hint)
    return found


def json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text``, or ``None``: fio may print warnings before its report."""
    start = text.find("{")
    while start != -1:
        try:
            value, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        return value if isinstance(value, dict) else None
    return None


def last_line(text: str, limit: int = 200) -> str:
    """The last non-empty line of ``text`` (a program's error), cut to ``limit`` characters; ``""`` if none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= limit else line[:limit] + "..."


__all__ = ["FIO_HINT", "IPERF3_HINT", "json_object", "last_line", "require_tool"]
