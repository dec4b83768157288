"""Drift over time: windows, season-matched references, and a placebo band against false alarms.

A naive monitor compares each window with the one before. On data with a weekly cycle that
raises an alarm every Saturday (against a Friday) and every Monday (against a Sunday): the
detector works, the reference is wrong. Two fixes, both from the practice of seasonal
monitoring:

1. **season-matched references**: window ``i`` is compared with the pooled windows ``i - P``,
   ``i - 2P``, ... (``P`` windows per period: the same weekday, or weekday and hour, in past
   weeks), so the weekly cycle is on both sides of the comparison;
2. **a placebo null band**: the same detector, run on recent windows against *their* own
   season-matched references, shows how large a statistic gets when nothing happened (daily
   noise, promotions, weather). A column only counts when its statistic exceeds the band's
   ``band_quantile`` (95th percentile) *and* its method's threshold: placebo-in-time, as in
   the synthetic-control literature (Abadie et al. 2010).

The window alarms when the share of such columns reaches ``drift_share``, as a drift report's
dataset drift does. Windows are plain mappings of column name to array; :func:`split_windows`
cuts a time-stamped table into them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpufleet.errors import UsageError
from gpufleet.quality.drift import DriftReport, drift_report

Window = Mapping[str, NDArray[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class SeasonalConfig:
    """How the seasonal monitor picks references and sets its band."""

    windows_per_period: int = 7
    """``P``: daily windows with a weekly cycle -> 7; hourly windows -> 168."""
    reference_periods: int = 2
    """Past periods pooled into the reference (the same season each)."""
    placebo_periods: int = 2
    """Past periods whose windows (every season) make the placebo band."""
    band_quantile: float = 0.95
    drift_share: float = 0.5
    method: str | Mapping[str, str] | None = None
    """Per column or for all; keep one method per column across windows so statistics compare."""

    def __post_init__(self) -> None:
        if self.windows_per_period < 1 or self.reference_periods < 1 or self.placebo_periods < 1:
            raise UsageError("windows_per_period, reference_periods and placebo_periods must be at least 1")
        if not 0 < self.band_quantile < 1:
            raise UsageError(f"band_quantile {self.band_quantile!r} must be in (0, 1), e.g. 0.95")

    @property
    def history(self) -> int:
        """Windows needed before the first one can be judged (references of the placebo windows)."""
        return (self.reference_periods + self.placebo_periods) * self.windows_per_period


@dataclass(frozen=True, slots=True)
class WindowVerdict:
    """One window judged by one monitor."""

    index: int
    references: tuple[int, ...]
    report: DriftReport
    alarm: bool
    flagged: tuple[str, ...]
    """Columns that counted towards the alarm."""
    band: dict[str, float] = field(default_factory=dict)
    """Per column: the placebo quantile a statistic had to exceed (seasonal monitor only)."""

    @property
    def score(self) -> float:
        """The largest ``statistic / max(threshold, band)`` over tested columns: above 1 means that column counted."""
        ratios = [
            (c.statistic or 0.0) / max(c.threshold, self.band.get(c.column, 0.0))
            for c in self.report.columns
            if c.status == "ok" and c.p_value is None
        ]
        return max(ratios, default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "references": list(self.references),
            "alarm": self.alarm,
            "flagged": list(self.flagged),
            "score": self.score,
            "band": self.band,
            "share_drifted": self.report.share_drifted,
            "statistics": {c.column: c.statistic for c in self.report.columns},
        }


def split_windows(columns: Mapping[str, NDArray[Any]], time_column: str, window_s: float) -> list[dict[str, Any]]:
    """Cut a table (column -> array) into consecutive windows of ``window_s`` seconds from time 0."""
    if time_column not in columns:
        raise UsageError(f"no time column {time_column!r}: columns are {', '.join(columns)}")
    if window_s <= 0:
        raise UsageError(f"window length {window_s!r} s must be positive")
    ts = np.asarray(columns[time_column], dtype=np.float64)
    index = np.floor(ts / window_s).astype(np.int64)
    if index.size and index.min() < 0:
        raise UsageError(f"{time_column} has times before 0: give seconds since the start of the first window")
    count = int(index.max()) + 1 if index.size else 0
    order = np.argsort(index, kind="stable")
    bounds = np.searchsorted(index[order], np.arange(count + 1))
    data = {k: np.asarray(v)[order] for k, v in columns.items() if k != time_column}
    return [{k: v[bounds[i] : bounds[i + 1]] for k, v in data.items()} for i in range(count)]


def _pool(windows: Sequence[Window], indices: Sequence[int]) -> dict[str, NDArray[Any]]:
    return {k: np.concatenate([np.asarray(windows[i][k]) for i in indices]) for k in windows[indices[0]]}


def naive_monitor(
    windows: Sequence[Window],
    *,
    method: str | Mapping[str, str] | None = None,
    drift_share: float = 0.5,
    start: int = 1,
) -> list[WindowVerdict]:
    """Each window against the one before it: the detector most dashboards start with."""
    verdicts = []
    for i in range(max(start, 1), len(windows)):
        report = drift_report(windows[i - 1], windows[i], method=method, drift_share=drift_share)
        flagged = tuple(c.column for c in report.columns if c.drift)
        verdicts.append(WindowVerdict(i, (i - 1,), report, report.dataset_drift, flagged))
    return verdicts


def seasonal_reports(windows: Sequence[Window], config: SeasonalConfig) -> dict[int, DriftReport]:
    """Every window with enough history against its season-matched, pooled reference."""
    p, r = config.windows_per_period, config.reference_periods
    reports = {}
    for i in range(r * p, len(windows)):
        refs = [i - k * p for k in range(1, r + 1)]
        reports[i] = drift_report(
            _pool(windows, refs), windows[i], method=config.method, drift_share=config.drift_share
        )
    return reports


def placebo_band(reports: Mapping[int, DriftReport], indices: Sequence[int], quantile: float) -> dict[str, float]:
    """Per column, the ``quantile`` of its statistic over the placebo windows' own seasonal reports."""
    values: dict[str, list[float]] = {}
    for i in indices:
        for c in reports[i].columns:
            if c.status == "ok" and c.statistic is not None and np.isfinite(c.statistic):
                values.setdefault(c.column, []).append(c.statistic)
    return {k: float(np.quantile(v, quantile)) for k, v in values.items()}


def seasonal_monitor(windows: Sequence[Window], config: SeasonalConfig | None = None) -> list[WindowVerdict]:
    """Season-matched references plus a placebo band; judges windows from ``config.history`` on.

    Windows that alarmed are left out of later bands: a real shift must not teach the band that
    shifted statistics are normal (it would stop alarming one placebo period later).
    """
    config = config or SeasonalConfig()
    p = config.windows_per_period
    reports = seasonal_reports(windows, config)
    verdicts: list[WindowVerdict] = []
    alarmed: set[int] = set()
    for i in range(config.history, len(windows)):
        report = reports[i]
        placebo = [j for j in range(i - config.placebo_periods * p, i) if j not in alarmed]
        band = placebo_band(reports, placebo, config.band_quantile)
        flagged = tuple(
            c.column
            for c in report.columns
            if c.drift and c.statistic is not None and c.statistic > band.get(c.column, -np.inf)
        )
        share = len(flagged) / report.tested if report.tested else 0.0
        alarm = bool(report.tested and share >= config.drift_share)
        if alarm:
            alarmed.add(i)
        refs = tuple(i - k * p for k in range(1, config.reference_periods + 1))
        verdicts.append(WindowVerdict(i, refs, report, alarm, flagged, band))
    return verdicts


__all__ = [
    "SeasonalConfig",
    "Window",
    "WindowVerdict",
    "naive_monitor",
    "placebo_band",
    "seasonal_monitor",
    "seasonal_reports",
    "split_windows",
]
