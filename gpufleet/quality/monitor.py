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

**False alarms under control** (:class:`AlarmControl`, the standing monitor's default): Evidently's
verdict on a large reference is a distance against a fixed threshold, which sampling noise
crosses on small windows, and its tests flag any trivial change on large ones. A controlled window
instead gives every column a two-sample test (``drift_report(method="test")``: KS, a two-sample
chi-squared, MMD), corrects the columns' p-values by Benjamini-Hochberg at ``alpha`` and counts a
column as drifted only when it is a discovery *and* its scale-free effect reaches a floor (normed
Wasserstein 0.1, Jensen-Shannon distance 0.1: Evidently's own large-data thresholds). The window
alerts when at least one column drifts (:func:`window_alerts`). With no drift in any column every
p-value is uniform (or larger), so the window alerts only when Simes' test rejects, which happens
with probability at most ``alpha`` for independent or positively dependent columns
(Benjamini & Hochberg 1995, Sarkar 2008; ``correction="by"`` holds under any dependence); the floor
only removes discoveries, so it keeps that bound and adds one of its own: a shift below the floor
never alerts, however large the sample.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from gpufleet.errors import UsageError

if TYPE_CHECKING:
    from gpufleet.quality.drift import DriftReport

Window = Mapping[str, NDArray[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class AlarmControl:
    """When a window's drift report alerts: at most ``alpha`` of the windows with no drift, none for a tiny shift.

    Defaults and why: ``alpha`` 0.01, one false alert per hundred windows on average, since a standing
    monitor sees a window every few minutes to every day and an alert wakes someone (the policy's
    persistence then asks for two windows in a row before a retrain). The floors are the thresholds
    Evidently applies on references above 1,000 rows: a tenth of the reference's standard deviation
    (normed Wasserstein, for KS columns), a Jensen-Shannon distance of 0.1 (for chi-squared
    columns: about a 14-point move of a 50/50 share, a PSI near 0.08), so a controlled column is one
    ``gpufleet drift`` would also call drifted on a large sample, and the test adds that it is
    beyond noise. MMD^2 has no scale-free floor (it depends on the dimension and the geometry: a
    10 % topic move in 384-D gives 2e-4, a 0.3-sigma shift in 1-D 2e-2), so ``mmd_floor`` is 0
    unless set from a shift that matters on the data at hand.
    """

    control: bool = True
    """``False``: the window's verdict is ``gpufleet drift``'s (Evidently's choice per column, no bound)."""
    alpha: float = 0.01
    """The nominal false-alarm rate per window with no drift, and the level of the correction."""
    correction: Literal["bh", "by"] = "bh"
    """``bh``: Benjamini-Hochberg (independent or positively dependent columns); ``by``: any dependence."""
    wasserstein_floor: float = 0.1
    """KS columns: the shift, in reference standard deviations (normed Wasserstein), that matters."""
    jensenshannon_floor: float = 0.1
    """Chi-squared columns (categories, numbers with <= 5 values): the Jensen-Shannon distance that matters."""
    mmd_floor: float = 0.0
    """Embedding columns: the MMD^2 (median-bandwidth RBF kernel) that matters."""

    def __post_init__(self) -> None:
        if isinstance(self.alpha, bool) or not 0 < self.alpha < 1:
            raise UsageError(f"alpha {self.alpha!r} is a false-alarm rate per window: give one in (0, 1), e.g. 0.01")
        if self.correction not in ("bh", "by"):
            raise UsageError(f"correction {self.correction!r}: use bh (Benjamini-Hochberg) or by (any dependence)")
        for name in ("wasserstein_floor", "jensenshannon_floor", "mmd_floor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (math.isfinite(value) and value >= 0):
                raise UsageError(f"{name} {value!r} is an effect size: give a number >= 0, e.g. 0.1")

    @property
    def floors(self) -> dict[str, float]:
        """The floors by effect measure, as ``drift_report(effect_floor=...)`` takes them."""
        return {"wasserstein": self.wasserstein_floor, "jensenshannon": self.jensenshannon_floor, "mmd": self.mmd_floor}


def controlled_report(
    reference: Any, current: Any, control: AlarmControl | None = None, *, columns: Sequence[str] | None = None
) -> DriftReport:
    """The window's drift report under ``control`` (default :class:`AlarmControl`): tests, correction, floors.

    A column's ``drift`` is then the controlled verdict, so whatever reads the report (the policy's
    shares, :func:`window_alerts`) inherits the bound; with ``control=False`` it is ``gpufleet drift``'s report.
    """
    from gpufleet.quality.drift import drift_report

    control = control or AlarmControl()
    if not control.control:
        return drift_report(reference, current, columns=columns)
    return drift_report(
        reference,
        current,
        columns=columns,
        method="test",
        threshold=control.alpha,
        correction=control.correction,
        effect_floor=control.floors,
    )


def window_alerts(report: DriftReport) -> bool:
    """Whether the window alerts: at least one column drifted (under control: a discovery above its floor)."""
    return any(c.drift is True for c in report.columns)


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
    from gpufleet.quality.drift import drift_report

    verdicts = []
    for i in range(max(start, 1), len(windows)):
        report = drift_report(windows[i - 1], windows[i], method=method, drift_share=drift_share)
        flagged = tuple(c.column for c in report.columns if c.drift)
        verdicts.append(WindowVerdict(i, (i - 1,), report, report.dataset_drift, flagged))
    return verdicts


def seasonal_reports(windows: Sequence[Window], config: SeasonalConfig) -> dict[int, DriftReport]:
    """Every window with enough history against its season-matched, pooled reference."""
    from gpufleet.quality.drift import drift_report

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
    "AlarmControl",
    "SeasonalConfig",
    "Window",
    "WindowVerdict",
    "controlled_report",
    "naive_monitor",
    "placebo_band",
    "seasonal_monitor",
    "seasonal_reports",
    "split_windows",
    "window_alerts",
]
