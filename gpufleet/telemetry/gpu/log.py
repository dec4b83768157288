"""The per-attempt GPU log: ``jobs/<id>/gpu/attempt-<N>.jsonl``, its writer and its readers.

Apart from the sources because the format outlives them: the log is read back long after the
job (``gpufleet observe``, ``gpufleet report``) by code that never opens a source. A
``GpuRecorder`` appends each round a sampler hands it::

    {"gpufleet_gpu_log":1,"source":"nvml","started_ms":1700000000000}      header, per writer
    {"series":[[0,"DCGM_FI_DEV_GPU_UTIL",{"gpu":"0","UUID":"GPU-..."}],...]} new series, once each
    {"t":1700000005000,"v":[[0,97.0],[1,41234.0],...]}                     one round
    {"t":1700000010000,"v":[[0,98.0],...],"w":[["source_error","..."]]}    a round with warnings

A round is one ``write`` plus ``flush``, so a crash loses at most the line being written, and the
reader skips a line that does not parse (the truncated last one). Values that JSON cannot hold
are written as the strings ``"NaN"``, ``"+Inf"`` and ``"-Inf"``; a value whose own timestamp
differs from the round's is ``[id, value, timestamp_ms]``.

The log is written by the job's own process, so the reader trusts none of it: a line longer than
``MAX_LINE_BYTES``, one that does not parse (a number beyond Python's digit limit, nesting deeper
than its recursion limit), a time out of range, a bare non-finite number (which the writer never
writes) or text that is not valid Unicode is skipped like a torn line, and a log that is not a
regular file (a FIFO, a link to a device) reads as empty.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from gpufleet.errors import UsageError
from gpufleet.telemetry.dcgm import Sample, ScrapeResult
from gpufleet.telemetry.gpu.sources import now_ms

_NON_FINITE = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}
MAX_LINE_BYTES = 1 << 20
"""The longest line the reader parses: a round of every field of a thousand GPUs fits many times over."""
MAX_TIMESTAMP_MS = 10**14
"""Times are Unix milliseconds: anything past the year 5000 is a broken line."""


def _json_value(v: float) -> float | str:
    if math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")


def gpu_log_path(job_folder: Path, attempt: int) -> Path:
    """``<job folder>/gpu/attempt-<N>.jsonl``."""
    if attempt < 1:
        raise UsageError(f"attempt {attempt} is not a positive attempt number")
    return job_folder / "gpu" / f"attempt-{attempt}.jsonl"


class GpuRecorder:
    """Appends rounds to one attempt's GPU log (format in this module's docstring)."""

    def __init__(self, path: Path, description: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torn = False
        if path.exists() and path.stat().st_size > 0:
            with path.open("rb") as f:  # a writer that crashed mid-line: start ours on a fresh line
                f.seek(-1, 2)
                torn = f.read(1) != b"\n"
        self.path = path
        self._file: IO[str] | None = path.open("a", encoding="utf-8")
        self._ids: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        header = {"gpufleet_gpu_log": 1, "source": description, "started_ms": now_ms()}
        self._append(("\n" if torn else "") + json.dumps(header, separators=(",", ":")) + "\n")

    def _append(self, text: str) -> None:
        if self._file is None:
            raise ValueError(f"GPU log {self.path} is closed")
        self._file.write(text)
        self._file.flush()

    def write(self, result: ScrapeResult) -> None:
        """One round: new series declared first, then the values, in one write."""
        if not result.samples and not result.warnings:
            return
        new: list[list[Any]] = []
        values: list[list[Any]] = []
        t = next((s.timestamp_ms for s in result.samples if s.timestamp_ms is not None), None)
        t = now_ms() if t is None else t
        for s in result.samples:
            key = s.series_key
            sid = self._ids.get(key)
            if sid is None:
                sid = self._ids[key] = len(self._ids)
                new.append([sid, s.name, s.labels])
            entry = [sid, _json_value(s.value)]
            if s.timestamp_ms is not None and s.timestamp_ms != t:
                entry.append(s.timestamp_ms)
            values.append(entry)
        round_: dict[str, Any] = {"t": t, "v": values}
        if result.warnings:
            round_["w"] = [[w.kind, w.message] for w in result.warnings]
        lines = [{"series": new}] if new else []
        self._append("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in [*lines, round_]))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _value(raw: Any) -> float:
    """A value as the writer spells it: a finite number, or ``"NaN"``, ``"+Inf"``, ``"-Inf"``."""
    if isinstance(raw, str):
        return _NON_FINITE[raw]
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)  # OverflowError: an integer beyond any float
        if math.isfinite(value):
            return value
    raise ValueError(f"{raw!r} is not a value")


def _is_time(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TIMESTAMP_MS


def _is_text(value: str) -> bool:
    """Valid Unicode: JSON's ``\\ud800`` escape decodes to a lone surrogate, which no output can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _series_entry(entry: Any) -> tuple[int, str, dict[str, str]]:
    sid, name, labels = entry
    if not (isinstance(sid, int) and isinstance(name, str) and isinstance(labels, dict)):
        raise ValueError("bad series entry")
    labels = {str(k): str(v) for k, v in labels.items()}
    if not all(_is_text(text) for text in (name, *labels, *labels.values())):
        raise ValueError("series entry with text that is not valid Unicode")
    return sid, name, labels


def _lines(path: Path) -> Iterator[str]:
    """The lines of a regular file up to ``MAX_LINE_BYTES`` each (longer ones are skipped whole).

    Opened without blocking, and nothing read unless it is a regular file: a FIFO in its place
    must not hang the reader, nor a link to ``/dev/zero`` feed it forever.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return
    with os.fdopen(fd, "rb") as f:
        while line := f.readline(MAX_LINE_BYTES + 1):
            if len(line) <= MAX_LINE_BYTES:
                yield line.decode("utf-8", "replace")
                continue
            while line and not line.endswith(b"\n"):  # the rest of the long line
                line = f.readline(MAX_LINE_BYTES + 1)


def read_gpu_log(path: Path) -> list[Sample]:
    """Every sample in a GPU log, in order; lines that do not parse (a torn last line) are skipped."""
    samples: list[Sample] = []
    series: dict[int, tuple[str, dict[str, str]]] = {}
    for line in _lines(path):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # also a number past the digit limit, nesting past the recursion one
            continue
        if not isinstance(obj, dict):
            continue
        if "gpufleet_gpu_log" in obj:
            series = {}  # a new writer numbers its series afresh
        for entry in obj.get("series", ()) if isinstance(obj.get("series"), list) else ():
            try:
                sid, name, labels = _series_entry(entry)
            except (TypeError, ValueError):
                continue
            series[sid] = (name, labels)
        if _is_time(obj.get("t")) and isinstance(obj.get("v"), list):
            samples.extend(_round_samples(obj["t"], obj["v"], series))
    return samples


def _round_samples(t: int, values: list[Any], series: Mapping[int, tuple[str, dict[str, str]]]) -> list[Sample]:
    out: list[Sample] = []
    for entry in values:
        try:
            sid, raw = entry[0], entry[1]
            ts = entry[2] if len(entry) > 2 and _is_time(entry[2]) else t
            name, labels = series[sid]
            out.append(Sample(name, dict(labels), _value(raw), ts))
        except (TypeError, ValueError, KeyError, IndexError, OverflowError):
            continue
    return out


def job_gpu_samples(job_folder: Path) -> list[Sample]:
    """All attempts' GPU samples of one job, attempt by attempt, each labelled ``attempt="N"``."""
    found: list[tuple[int, Path]] = []
    for path in (job_folder / "gpu").glob("attempt-*.jsonl"):
        m = re.fullmatch(r"attempt-([1-9][0-9]*)\.jsonl", path.name)
        if m:
            found.append((int(m.group(1)), path))
    return [
        Sample(s.name, {**s.labels, "attempt": str(n)}, s.value, s.timestamp_ms)
        for n, path in sorted(found)
        for s in read_gpu_log(path)
    ]


__all__ = ["MAX_LINE_BYTES", "MAX_TIMESTAMP_MS", "GpuRecorder", "gpu_log_path", "job_gpu_samples", "read_gpu_log"]
