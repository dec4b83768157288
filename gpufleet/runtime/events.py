"""Event log: what a training process reports, one JSON object a line.

The runtime appends to ``jobs/<id>/events.jsonl`` (flushed, not fsynced: losing the last lines
on a crash loses detail, never state); the backend ingests the file into the state database.
Lines are ``{"ts": <unix time>, "attempt": <n>, "kind": <str>, ...}``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any


def _clean(value: Any) -> Any:
    """JSON has no NaN or inf: encode them as strings so a NaN loss survives the trip."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class EventLog:
    """Append-only JSONL sink; without a path it keeps events in memory (tests, plain scripts)."""

    def __init__(self, path: Path | None, attempt: int = 1) -> None:
        self.path = path
        self.attempt = attempt
        self.memory: list[dict[str, Any]] = []
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        """Called with every event after it is written (metrics exporters)."""
        self._fh: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", encoding="utf-8")

    def emit(self, kind: str, **data: Any) -> dict[str, Any]:
        event = {"ts": time.time(), "attempt": self.attempt, "kind": kind, **_clean(data)}
        if self._fh is None:
            self.memory.append(event)
        else:
            self._fh.write(json.dumps(event, separators=(",", ":")) + "\n")
            self._fh.flush()
        for listener in self.listeners:
            listener(event)
        return event

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Read complete lines from ``offset``; return them and the offset after the last one.

    A torn last line (the writer was killed mid-write) is left for a later read, and a line that
    is not a JSON object is skipped: the file is written by user processes, so it is untrusted.
    """
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events: list[dict[str, Any]] = []
    for line in data[:end].splitlines():
        try:
            event = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(event, dict) and isinstance(event.get("kind"), str) and isinstance(event.get("ts"), (int, float)):
            events.append(event)
    return events, offset + end


def iter_events(path: Path) -> Iterator[dict[str, Any]]:
    events, _ = read_events(path)
    yield from events
