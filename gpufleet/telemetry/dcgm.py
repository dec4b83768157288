"""dcgm-exporter's metrics as data, and a tolerant reader of Prometheus text exposition.

The catalogue holds the DCGM fields gpufleet reads, under the names dcgm-exporter gives them
(``DCGM_FI_<field>``), with the unit and Prometheus type. Units and meanings follow the DCGM user
guide (field identifiers, and "Profiling Metrics" for the ``DCGM_FI_PROF_*`` ratios) and
dcgm-exporter's ``default-counters.csv``.

``parse_exposition`` reads the text format (``# HELP``/``# TYPE`` lines, then
``name{label="value",...} value [timestamp_ms]``) written by hand rather than with
prometheus-client, because a scrape is untrusted input: a line that does not parse is skipped
with a warning, never an exception, and the rest of the scrape is still ingested. Metric and
label names go through ``METRIC_ALIASES`` and ``LABEL_ALIASES`` so that older and newer exporters
land on one schema.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

MetricKind = Literal["gauge", "counter"]
WarningKind = Literal["broken_line", "unknown_metric", "missing_label", "counter_reset", "source_error", "unavailable"]


@dataclass(frozen=True, slots=True)
class DcgmField:
    """One DCGM field as dcgm-exporter exposes it."""

    name: str
    kind: MetricKind
    unit: str
    help: str


CATALOGUE: Mapping[str, DcgmField] = {
    f.name: f
    for f in (
        DcgmField("DCGM_FI_PROF_SM_ACTIVE", "gauge", "ratio", "Ratio of cycles an SM has at least one warp assigned."),
        DcgmField("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "ratio", "Ratio of warps resident on an SM to its maximum."),
        DcgmField(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "ratio", "Ratio of cycles the tensor (HMMA) pipe is active."
        ),
        DcgmField(
            "DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "ratio", "Ratio of cycles the device memory interface is active."
        ),
        # DCGM reports the PCIe/NVLink fields as rates (bytes per second over the sampling interval), so
        # they are gauges here even though some dcgm-exporter CSVs declare them "counter".
        DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "bytes/s", "PCIe transmit rate, headers and payload."),
        DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "bytes/s", "PCIe receive rate, headers and payload."),
        DcgmField("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "bytes/s", "NVLink transmit rate, all links."),
        DcgmField("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "bytes/s", "NVLink receive rate, all links."),
        DcgmField("DCGM_FI_DEV_GPU_UTIL", "gauge", "%", "Percent of time a kernel was running on the GPU."),
        DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "%", "Percent of time device memory was read or written."),
        DcgmField("DCGM_FI_DEV_SM_CLOCK", "gauge", "MHz", "SM clock frequency."),
        DcgmField("DCGM_FI_DEV_FB_USED", "gauge", "MiB", "Framebuffer memory used."),
        DcgmField("DCGM_FI_DEV_FB_FREE", "gauge", "MiB", "Framebuffer memory free."),
        DcgmField("DCGM_FI_DEV_POWER_USAGE", "gauge", "W", "Power draw."),
        DcgmField("DCGM_FI_DEV_GPU_TEMP", "gauge", "C", "GPU temperature."),
        DcgmField(
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "bitmask", "Why clocks are below their maximum (NVML bits)."
        ),
        DcgmField("DCGM_FI_DEV_XID_ERRORS", "gauge", "xid", "Value of the last XID error encountered."),
        DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "mJ", "Energy used since the driver loaded."),
    )
}

METRIC_ALIASES: Mapping[str, str] = {
    # DCGM 3.2 renamed "clock throttle reasons" to "clocks event reasons"; the bits are unchanged.
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    # Newer DCGM (4.x) names as the task lists them; not checked against a DCGM 4.6 field header.
    "DCGM_FI_PROF_SM_UTIL_RATIO": "DCGM_FI_PROF_SM_ACTIVE",
}
"""Old or new metric name -> the catalogue's name."""

LABEL_ALIASES: Mapping[str, str] = {
    "Hostname": "hostname",
    "uuid": "UUID",
    "exported_pod": "pod",
    "exported_namespace": "namespace",
    "exported_container": "container",
}
"""Label renames. ``exported_*`` labels are the exporter's own (Prometheus prefixes them when the
scrape target carries a label of the same name), so their value wins over the target's label."""


class ClocksEventReason(enum.IntFlag):
    """Bits of ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``, as NVML's ``nvmlClocksEventReasons`` defines them.

    ``HW_SLOWDOWN`` is the umbrella bit the hardware sets when it at least halves the clocks, for
    heat, an external power brake, or power draw tripping the fast trigger; ``HW_THERMAL_SLOWDOWN``
    and ``HW_POWER_BRAKE_SLOWDOWN`` say which.
    """

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100


REQUIRED_LABELS: tuple[str, ...] = ("gpu", "UUID")
"""Labels every DCGM sample needs (after ``LABEL_ALIASES``) to be attributed to one GPU."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample: canonical metric name, canonical labels, value, optional timestamp (ms)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None

    @property
    def series_key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """Identity of the series this sample belongs to."""
        return self.name, tuple(sorted(self.labels.items()))


@dataclass(frozen=True, slots=True)
class ScrapeWarning:
    """Something wrong in a scrape that did not stop the rest of it from being read."""

    kind: WarningKind
    message: str
    line: int | None = None


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """Samples read from one exposition text, the warnings, and the ``# HELP``/``# TYPE`` seen."""

    samples: tuple[Sample, ...]
    warnings: tuple[ScrapeWarning, ...]
    types: dict[str, str] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)


class _BadLine(Exception):
    """One line of exposition text does not follow the grammar; the message says where."""


_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_FLOAT_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INT_RE = re.compile(r"[+-]?\d+")
_SPECIAL = {"NaN": math.nan, "+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf}
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}


def canonical_metric(name: str) -> str:
    """The catalogue name for ``name`` (itself when it has no alias)."""
    return METRIC_ALIASES.get(name, name)


def canonical_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """``labels`` renamed through ``LABEL_ALIASES``; an alias's value wins over the plain label."""
    out = {k: v for k, v in labels.items() if k not in LABEL_ALIASES}
    out.update({LABEL_ALIASES[k]: v for k, v in labels.items() if k in LABEL_ALIASES})
    return out


def _parse_value(token: str) -> float:
    if token in _SPECIAL:
        return _SPECIAL[token]
    if not _FLOAT_RE.fullmatch(token):
        raise _BadLine(f"value {_clip(token)} is not a number (or NaN, +Inf, -Inf)")
    return float(token)


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """Labels starting just after ``{``; returns them and the position after ``}``."""
    labels: dict[str, str] = {}
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_RE.match(line, pos)
        if not m:
            raise _BadLine(f"expected a label name at column {pos + 1}")
        name, pos = m.group(), m.end()
        if line[pos : pos + 2] != '="':
            raise _BadLine(f'expected =" after label {name!r}')
        pos += 2
        chars: list[str] = []
        while True:
            if pos >= len(line):
                raise _BadLine(f"label {name!r} has no closing quote")
            ch = line[pos]
            if ch == '"':
                pos += 1
                break
            if ch == "\\":
                esc = line[pos + 1 : pos + 2]
                if esc not in _UNESCAPE:
                    raise _BadLine(f"label {name!r} has an invalid escape \\{esc}")
                chars.append(_UNESCAPE[esc])
                pos += 2
            else:
                chars.append(ch)
                pos += 1
        if name in labels:
            raise _BadLine(f"label {name!r} appears twice")
        labels[name] = "".join(chars)
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if line[pos : pos + 1] == ",":
            pos += 1
        elif line[pos : pos + 1] != "}":
            raise _BadLine(f"expected , or }} after label {name!r}")


def _parse_sample_line(line: str) -> tuple[str, dict[str, str], float, int | None]:
    """One sample line as (raw name, raw labels, value, timestamp); ``_BadLine`` when it is not one."""
    m = _NAME_RE.match(line)
    if not m:
        raise _BadLine("line does not start with a metric name")
    name, pos = m.group(), m.end()
    labels: dict[str, str] = {}
    if line[pos : pos + 1] == "{":
        labels, pos = _parse_labels(line, pos + 1)
    rest = line[pos:]
    if rest[:1] not in (" ", "\t"):
        raise _BadLine(f"expected whitespace then a value after {name!r}")
    tokens = rest.split()
    if not tokens or len(tokens) > 2:
        raise _BadLine(f"expected a value and an optional timestamp, got {len(tokens)} fields")
    value = _parse_value(tokens[0])
    timestamp = _parse_timestamp(tokens[1]) if len(tokens) == 2 else None
    return name, labels, value, timestamp


def _parse_timestamp(token: str) -> int:
    """Milliseconds since the epoch, as Prometheus keeps them: an integer that fits in 64 bits."""
    if not _INT_RE.fullmatch(token):
        raise _BadLine(f"timestamp {_clip(token)} is not an integer number of milliseconds")
    # Leading zeros go, and the digits are counted, before int() (which refuses over 4300 digits).
    digits = token.lstrip("+-").lstrip("0") or "0"
    stamp = None if len(digits) > 19 else -int(digits) if token.startswith("-") else int(digits)
    if stamp is None or not -(2**63) <= stamp < 2**63:
        raise _BadLine(f"timestamp {_clip(token)} is out of range (a 64-bit number of milliseconds)")
    return stamp


def _clip(token: str, limit: int = 40) -> str:
    """A token for a warning: quoted, and cut to ``limit`` characters."""
    return f"{token[:limit]!r}... ({len(token)} characters)" if len(token) > limit else repr(token)


def parse_exposition(text: str, *, already_warned: Collection[str] = ()) -> ScrapeResult:
    """Read Prometheus text exposition, tolerating what a real scrape can contain.

    * a line that breaks the grammar is skipped with a ``broken_line`` warning;
    * a metric outside ``CATALOGUE`` is kept, with one ``unknown_metric`` warning per name (names
      in ``already_warned`` are not warned again, so a scrape loop can warn once per process);
    * a DCGM sample without ``gpu`` or ``UUID``/``uuid`` is kept with a ``missing_label`` warning.
    """
    samples: list[Sample] = []
    warnings: list[ScrapeWarning] = []
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    warned = set(already_warned)
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line[1:].split(None, 2)
            if len(parts) >= 2 and parts[0] in ("HELP", "TYPE"):
                target = canonical_metric(parts[1])
                body = parts[2] if len(parts) == 3 else ""
                if parts[0] == "TYPE":
                    types[target] = body
                else:
                    helps[target] = body.replace("\\n", "\n").replace("\\\\", "\\")
            continue
        try:
            raw_name, raw_labels, value, timestamp = _parse_sample_line(line)
        except _BadLine as err:
            warnings.append(ScrapeWarning("broken_line", f"line {lineno} skipped: {err}: {raw[:120]!r}", lineno))
            continue
        name = canonical_metric(raw_name)
        labels = canonical_labels(raw_labels)
        if name not in CATALOGUE and name not in warned:
            warned.add(name)
            warnings.append(ScrapeWarning("unknown_metric", f"metric {name!r} is not a known DCGM field; kept", lineno))
        if name.startswith("DCGM_FI_"):
            missing = [label for label in REQUIRED_LABELS if label not in labels]
            if missing:
                warnings.append(
                    ScrapeWarning(
                        "missing_label",
                        f"line {lineno}: {name} has no {', '.join(missing)} label; it cannot be tied to one GPU",
                        lineno,
                    )
                )
        samples.append(Sample(name, labels, value, timestamp))
    return ScrapeResult(tuple(samples), tuple(warnings), types, helps)


class CounterTracker:
    """Remembers the last value of each counter series and flags one that goes backwards.

    A counter only increases; a lower value means the exporter (or the driver) restarted, so the
    tracker warns, and the caller treats the new value as counting from zero (Prometheus's
    ``rate()`` does the same).
    """

    def __init__(self, counters: Collection[str] | None = None) -> None:
        self._counters = (
            frozenset(counters)
            if counters is not None
            else frozenset(n for n, f in CATALOGUE.items() if f.kind == "counter")
        )
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def observe(self, samples: Iterable[Sample], types: Mapping[str, str] | None = None) -> list[ScrapeWarning]:
        """Record ``samples``; one ``counter_reset`` warning for each counter that went backwards."""
        out: list[ScrapeWarning] = []
        for s in samples:
            is_counter = s.name in self._counters or (types or {}).get(s.name) == "counter"
            if not is_counter or math.isnan(s.value):
                continue
            key = s.series_key
            last = self._last.get(key)
            if last is not None and s.value < last:
                out.append(
                    ScrapeWarning(
                        "counter_reset",
                        f"counter {s.name}{dict(key[1])} went from {last:g} to {s.value:g}; treated as a reset",
                    )
                )
            self._last[key] = s.value
        return out


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_exposition(samples: Iterable[Sample]) -> str:
    """Samples as exposition text, grouped by metric with ``# HELP``/``# TYPE`` from the catalogue.

    ``parse_exposition(render_exposition(s)).samples`` gives back the same samples.
    """
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    lines: list[str] = []
    for name, group in by_name.items():
        known = CATALOGUE.get(name)
        if known is not None:
            lines.append(f"# HELP {name} {known.help.replace(chr(92), chr(92) * 2)}")
            lines.append(f"# TYPE {name} {known.kind}")
        for s in group:
            labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in s.labels.items())
            head = f"{name}{{{labels}}}" if labels else name
            tail = f" {s.timestamp_ms}" if s.timestamp_ms is not None else ""
            lines.append(f"{head} {_format_value(s.value)}{tail}")
    return "\n".join(lines) + "\n"


__all__ = [
    "CATALOGUE",
    "LABEL_ALIASES",
    "METRIC_ALIASES",
    "REQUIRED_LABELS",
    "ClocksEventReason",
    "CounterTracker",
    "DcgmField",
    "MetricKind",
    "Sample",
    "ScrapeResult",
    "ScrapeWarning",
    "WarningKind",
    "canonical_labels",
    "canonical_metric",
    "parse_exposition",
    "render_exposition",
]
