"""False alarms of the standing monitor's drift verdict: windows with no drift, then real shifts.

    .venv/bin/python bench/false_alarms.py [--json] [--windows 1000] [--alpha 0.01] [--seed 0]

Seven columns of several types (normal and log-normal numbers, Poisson counts, a 1-5 rating, a
binary flag, a 4-level and a 30-level category with rare levels), one reference per stream, as a
standing monitor has. Every window is judged by ``monitor.controlled_report`` (tests,
Benjamini-Hochberg at ``alpha``, effect floors: the monitor's default); a window alerts when a
column drifts. From the same reports, the monitors without part of the control:

- ``bh, no floor``: a column drifts on its BH-adjusted p-value alone;
- ``floor, no bh``: on its raw p-value and the floor (no correction across columns);
- ``raw tests``: on its raw p-value alone (the per-column test most monitors run);
- ``evidently``: on the effect alone against 0.1, which is Evidently's verdict on a reference above
  1,000 rows (normed Wasserstein, Jensen-Shannon; checked equal to ``drift_report``'s default
  verdict on the first windows of each stream).

Streams:

1. ``null, small``: ``--windows`` windows of 300 rows against a 20,000-row reference, no drift;
2. ``null, large``: ``--windows`` windows of 10,000 rows against 50,000, with a negligible but real
   shift (latency +0.03 standard deviations, a third of the floor; 2 points of the device share
   moved, a Jensen-Shannon distance near 0.02), which the raw tests flag and which must never alert;
3. ``abrupt shift``: 100 small windows; from window 50, latency +0.5 standard deviations and 10
   points of the device share;
4. ``gradual shift``: 40 large windows with the negligible shift; from window 10 latency moves a
   further 0.01 standard deviations per window (0.1 in all, the floor, at window 16).

Targets: on streams 1 and 2 the controlled count of alerting windows is within the binomial band of
``alpha`` (at most the 99th percentile of Binomial(windows, alpha): a one-sided test at 1 % does not
reject "rate <= alpha"); the negligible shift makes no column drift in stream 2; stream 3 is
detected within 1 window of its start and stream 4 within 10 (the shift is below the floor for
its first 6 windows: not detecting those is the point).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import _common as common
import numpy as np
from scipy import stats

from gpufleet.quality.drift import DriftReport, drift_report
from gpufleet.quality.monitor import AlarmControl, controlled_report, window_alerts

VARIANTS = ("controlled", "bh, no floor", "floor, no bh", "raw tests", "evidently")
DEVICES = np.array(["web", "ios", "android", "tablet"])
COUNTRIES = np.array([f"c{k:02d}" for k in range(30)])
COUNTRY_P = 1 / np.arange(1, 31) ** 1.2
COUNTRY_P /= COUNTRY_P.sum()
EVIDENTLY_THRESHOLD = 0.1
CHECKED_AGAINST_DRIFT_REPORT = 5
"""Windows per stream whose ``evidently`` verdict is checked against ``drift_report``'s default one."""


@dataclass(frozen=True, slots=True)
class Shift:
    latency: float = 0.0
    """Mean shift of ``latency``, in its standard deviations."""
    device: float = 0.0
    """Share of rows moved from ``web`` to ``android``."""


NEGLIGIBLE = Shift(latency=0.03, device=0.02)
NEGLIGIBLE_COLUMNS = {"latency_ms", "device"}
"""The columns the negligible shift moves: under control they must never drift in ``null, large``."""


def draw(rng: np.random.Generator, rows: int, shift: Shift = Shift()) -> dict[str, np.ndarray]:
    device_p = np.array([0.5 - shift.device, 0.25, 0.2 + shift.device, 0.05])
    return {
        "latency_ms": 200 + 40 * (rng.normal(size=rows) + shift.latency),
        "amount_eur": rng.lognormal(3.0, 1.0, rows),
        "items": rng.poisson(3.0, rows).astype(np.float64),
        "rating": rng.choice(np.arange(1.0, 6.0), rows, p=[0.05, 0.1, 0.2, 0.35, 0.3]),
        "returning": (rng.uniform(size=rows) < 0.3).astype(np.float64),
        "device": rng.choice(DEVICES, rows, p=device_p),
        "country": rng.choice(COUNTRIES, rows, p=COUNTRY_P),
    }


def flags(report: DriftReport, alpha: float) -> dict[str, set[str]]:
    """Per variant, the columns it calls drifted, all read off one controlled report."""
    out: dict[str, set[str]] = {v: set() for v in VARIANTS}
    for c in report.columns:
        if c.status != "ok" or c.p_value is None:
            continue
        adjusted = c.extra.get(f"{report.correction}_adjusted_p", c.p_value)
        effect = c.extra["effect"]
        material = not effect < c.extra["effect_floor"]
        checks = {
            "controlled": bool(c.drift),
            "bh, no floor": adjusted <= alpha,
            "floor, no bh": c.p_value <= alpha and material,
            "raw tests": c.p_value <= alpha,
            "evidently": effect >= EVIDENTLY_THRESHOLD,
        }
        for variant, hit in checks.items():
            if hit:
                out[variant].add(c.column)
    return out


def evidently_agrees(reference: dict[str, np.ndarray], window: dict[str, np.ndarray], seen: set[str]) -> bool:
    """``drift_report``'s default verdict (Evidently's methods on a large reference) flags what ``evidently`` did."""
    return {c.column for c in drift_report(reference, window).columns if c.drift} == seen


@dataclass(frozen=True, slots=True)
class Stream:
    name: str
    rows: int
    reference_rows: int
    windows: int
    shift_at: Callable[[int], Shift]
    start: int | None = None
    """First shifted window (``None``: no real shift)."""


def judge(stream: Stream, control: AlarmControl, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    reference = draw(rng, stream.reference_rows)
    per_window: list[dict[str, set[str]]] = []
    agrees = True
    started = time.perf_counter()
    for i, window in enumerate(_windows(stream, rng)):
        report = controlled_report(reference, window, control)
        seen = flags(report, control.alpha)
        assert bool(seen["controlled"]) == window_alerts(report)
        if i < CHECKED_AGAINST_DRIFT_REPORT:
            agrees = agrees and evidently_agrees(reference, window, seen["evidently"])
        per_window.append(seen)
    seconds = time.perf_counter() - started
    common.progress(f"{stream.name}: {stream.windows} windows in {seconds:.1f} s")
    return summarise(stream, per_window, control.alpha) | {"seconds": seconds, "evidently_checked": agrees}


def _windows(stream: Stream, rng: np.random.Generator) -> Iterator[dict[str, np.ndarray]]:
    for i in range(stream.windows):
        yield draw(rng, stream.rows, stream.shift_at(i))


def summarise(stream: Stream, per_window: list[dict[str, set[str]]], alpha: float) -> dict[str, Any]:
    before = per_window if stream.start is None else per_window[: stream.start]
    alerts = {v: sum(bool(w[v]) for w in before) for v in VARIANTS}
    out: dict[str, Any] = {
        "name": stream.name,
        "windows": stream.windows,
        "rows": stream.rows,
        "reference_rows": stream.reference_rows,
        "windows_without_shift": len(before),
        "alerting_windows": alerts,
        "band": binomial_band(len(before), alpha),
        "controlled_ci95": clopper_pearson(alerts["controlled"], len(before)),
        "negligible_columns_drifted": sum(bool(w["controlled"] & NEGLIGIBLE_COLUMNS) for w in before),
    }
    if stream.start is not None:
        out["start"] = stream.start
        out["windows_to_detect"] = {v: _delay(per_window, stream.start, v) for v in VARIANTS}
    return out


def _delay(per_window: list[dict[str, set[str]]], start: int, variant: str) -> int | None:
    """Windows from the first shifted one to the first alert (0: caught at once); ``None``: never."""
    return next((i - start for i in range(start, len(per_window)) if per_window[i][variant]), None)


def binomial_band(windows: int, alpha: float) -> int:
    """The 99th percentile of Binomial(windows, alpha): more alerts than this reject "rate <= alpha" at 1 %."""
    return int(stats.binom.ppf(0.99, windows, alpha)) if windows else 0


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """The exact 95 % interval of a rate seen ``k`` times in ``n``."""
    if n == 0:
        return 0.0, 1.0
    lo = float(stats.beta.ppf(0.025, k, n - k + 1)) if k else 0.0
    hi = float(stats.beta.ppf(0.975, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def streams(windows: int) -> list[Stream]:
    def ramp(i: int) -> Shift:
        return Shift(latency=NEGLIGIBLE.latency + 0.01 * max(i - 9, 0), device=NEGLIGIBLE.device)

    return [
        Stream("null, small", 300, 20_000, windows, lambda i: Shift()),
        Stream("null, large", 10_000, 50_000, windows, lambda i: NEGLIGIBLE),
        Stream("abrupt shift", 300, 20_000, 100, lambda i: Shift(0.5, 0.1) if i >= 50 else Shift(), start=50),
        Stream("gradual shift", 10_000, 50_000, 40, ramp, start=10),
    ]


MAX_DELAY = {"abrupt shift": 1, "gradual shift": 10}


def verdict(results: list[dict[str, Any]]) -> tuple[bool, list[str]]:
    misses = []
    for r in results:
        if r["alerting_windows"]["controlled"] > r["band"]:
            misses.append(f"{r['name']}: {r['alerting_windows']['controlled']} alerts > band {r['band']}")
        if r["negligible_columns_drifted"] and r["name"] == "null, large":
            misses.append(f"{r['name']}: the negligible shift drifted in {r['negligible_columns_drifted']} windows")
        if not r["evidently_checked"]:
            misses.append(f"{r['name']}: the evidently variant differs from drift_report's default verdict")
        if r["name"] in MAX_DELAY:
            delay = r["windows_to_detect"]["controlled"]
            if delay is None or delay > MAX_DELAY[r["name"]]:
                misses.append(f"{r['name']}: detected after {delay} windows (target {MAX_DELAY[r['name']]})")
    return not misses, misses


def table(results: list[dict[str, Any]], control: AlarmControl) -> str:
    rows = []
    for r in results:
        n = r["windows_without_shift"]
        cells = [f"{r['alerting_windows'][v]}/{n}" for v in VARIANTS]
        lo, hi = r["controlled_ci95"]
        rows.append(
            [r["name"], f"{r['rows']:,} vs {r['reference_rows']:,}", *cells, f"<= {r['band']}", f"{lo:.3f}-{hi:.3f}"]
        )
        if "windows_to_detect" in r:
            delays = ["never" if d is None else str(d) for d in r["windows_to_detect"].values()]
            rows.append([f"  windows to detect (from {r['start']})", "", *delays, f"<= {MAX_DELAY[r['name']]}", ""])
    title = (
        f"windows that alert (before any real shift), alpha {control.alpha:g}, {control.correction}, floors "
        f"wasserstein {control.wasserstein_floor:g}, jensenshannon {control.jensenshannon_floor:g}"
    )
    return common.format_table(title, ["stream", "rows vs ref", *VARIANTS, "target", "95% CI"], rows)


def main() -> int:
    p = common.parser(__doc__ or "")
    p.add_argument("--windows", type=int, default=1000, help="windows in each null stream")
    p.add_argument("--alpha", type=float, default=AlarmControl().alpha)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    control = AlarmControl(alpha=args.alpha)
    results = [judge(s, control, args.seed + k) for k, s in enumerate(streams(args.windows))]
    ok, misses = verdict(results)
    result = {"alpha": control.alpha, "correction": control.correction, "floors": control.floors, "streams": results}
    text = "all targets met" if ok else "; ".join(misses)
    return common.finish(json_mode=args.json, result=result, table=table(results, control), verdict=text, ok=ok)


if __name__ == "__main__":
    raise SystemExit(main())
