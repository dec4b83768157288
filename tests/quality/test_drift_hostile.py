"""Hostile numbers in a drift report: what cannot be measured is "untestable", never "no drift".

Found by an attack: columns near +-1e308 gave a NaN Wasserstein read as "no drift", a crash under
Jensen-Shannon and a NaN MMD read as drift; +inf values were dropped without a word. Each case
goes through the core (``drift_report``) and the command line (``gpufleet drift``, in process).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

from gpufleet.errors import ParameterError
from gpufleet.quality.drift import (
    DriftReport,
    MmdResult,
    drift_report,
    jensen_shannon,
    mmd_test,
    power_of_two_scale,
    psi,
    wasserstein,
)
from gpufleet.quality.html import render_html

N = 2000


def strict_json(text: str) -> Any:
    """``json.loads`` that refuses NaN and Infinity (Python's json would accept them)."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def dumps(report: DriftReport) -> str:
    return json.dumps(report.to_dict(), allow_nan=False)


def huge_pair(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """2,000 values near +1e308 and 2,000 near -1e308: every difference and square overflows."""
    g = np.random.default_rng(seed)
    return 1e308 * (1 - 0.5 * g.random(N)), -1e308 * (1 - 0.5 * g.random(N))


def healthy(seed: int, n: int = N, shift: float = 0.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(shift, 1.0, n)


def drift_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", "200")
    return run_cli(capsys, monkeypatch, "drift", *args)


def write(tmp_path: Path, name: str, frame: pd.DataFrame) -> str:
    path = tmp_path / name
    if name.endswith(".csv"):
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    return str(path)


# ---------------------------------------------------------------- +-1e308: measured, not given up on


@pytest.mark.parametrize("method", ["auto", "wasserstein", "jensenshannon", "mmd", "psi", "ks"])
def test_columns_near_float_max_are_measured_and_drift(method: str) -> None:
    ref, cur = huge_pair()
    report = drift_report({"x": ref}, {"x": cur}, method=method)
    col = report.columns[0]
    assert col.status == "ok" and col.drift is True, col
    assert col.statistic is not None and math.isfinite(col.statistic)
    assert report.status == "drift" and report.dataset_drift
    dumps(report)


def test_the_normed_wasserstein_of_huge_columns_is_the_right_number() -> None:
    """Uniform on [0.5, 1] x 1e308 against its mirror: W1 = 1.5e308, std = 0.5e308 / sqrt(12)."""
    ref, cur = huge_pair()
    col = drift_report({"x": ref}, {"x": cur}).columns[0]
    assert col.method == "wasserstein" and col.statistic == pytest.approx(1.5 / (0.5 / math.sqrt(12)), rel=0.02)
    assert col.extra["reference_std"] == pytest.approx(0.5e308 / math.sqrt(12), rel=0.02)
    assert col.extra["wasserstein_raw"] == pytest.approx(1.5e308, rel=0.02)  # fits in float64; 2e308 would not


@pytest.mark.parametrize("power", [900, -900])
def test_scaled_statistics_equal_the_ordinary_ones(power: int) -> None:
    """Multiplying by a power of two is exact: huge and tiny columns get the statistics of ordinary ones."""
    a, b = healthy(1), healthy(2, shift=0.3)
    k = 2.0**power
    assert wasserstein(a * k, b * k, normed=False) == pytest.approx(wasserstein(a, b, normed=False) * k, rel=1e-12)
    if power > 0:  # the normed distance floors the spread at 0.001 in the data's units: tiny columns never drift
        assert wasserstein(a * k, b * k, normed=True) == pytest.approx(wasserstein(a, b, normed=True), rel=1e-12)
    assert jensen_shannon(a * k, b * k) == pytest.approx(jensen_shannon(a, b), rel=1e-12)
    assert psi(a * k, b * k) == pytest.approx(psi(a, b), rel=1e-12)
    small, moved = a[:300], b[:300]
    scaled = mmd_test(small * k, moved * k)
    plain = mmd_test(small, moved)
    assert scaled.statistic == pytest.approx(plain.statistic, rel=1e-9) and scaled.p_value == plain.p_value
    assert scaled.bandwidth == pytest.approx(plain.bandwidth * k, rel=1e-12)


def test_ordinary_values_are_not_rescaled() -> None:
    assert power_of_two_scale(healthy(3) * 1e100, healthy(4)) == 1.0
    assert power_of_two_scale(np.zeros(3), np.empty(0)) == 1.0
    assert power_of_two_scale(np.array([1e308])) < 1 < power_of_two_scale(np.array([1e-300]))


def test_a_raw_distance_beyond_float64_is_untestable_not_no_drift() -> None:
    ref, cur = huge_pair()
    ref, cur = ref / 0.75, cur / 0.75  # W1 = 2e308: no float64 holds it
    report = drift_report({"x": ref}, {"x": cur}, method="wasserstein_raw", threshold=1.0)
    col = report.columns[0]
    assert (col.status, col.drift, col.statistic) == ("untestable", None, None)
    assert "overflows float64" in (col.reason or "") and "normed" in (col.reason or "")
    assert report.status == "untestable" and not report.dataset_drift and "no verdict" in report.verdict
    assert strict_json(dumps(report))["columns"]["x"]["status"] == "untestable"
    # the normed distance of the same columns is finite and decides
    assert drift_report({"x": ref}, {"x": cur}).columns[0].drift is True


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_distance_is_untestable(monkeypatch: pytest.MonkeyPatch, bad: float) -> None:
    """Whatever slips past the scaling: a distance that comes out NaN or inf decides nothing."""
    from gpufleet.quality.drift import report as report_module

    monkeypatch.setattr(report_module, "jensen_shannon", lambda *_: bad)
    report = drift_report({"x": healthy(5)}, {"x": healthy(6)}, method="jensenshannon")
    col = report.columns[0]
    assert (col.status, col.drift, col.statistic) == ("untestable", None, None)
    assert ("NaN" if math.isnan(bad) else "overflows") in (col.reason or "")
    dumps(report)


def test_a_nan_mmd_is_untestable_not_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack's MMD: NaN statistic, permutation p-value 1/201 < 0.05, read as drift."""
    from gpufleet.quality.drift import report as report_module

    monkeypatch.setattr(report_module, "mmd_test", lambda *_a, **_k: MmdResult(math.nan, 1 / 201, "exact", 1.0, 200))
    report = drift_report({"x": healthy(7, 300)}, {"x": healthy(8, 300)}, method="mmd")
    assert (report.columns[0].status, report.columns[0].drift) == ("untestable", None)
    assert report.status == "untestable" and not report.dataset_drift


def test_a_statistic_that_raises_is_untestable_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.quality.drift import report as report_module

    def boom(*_: Any) -> float:
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(report_module, "jensen_shannon", boom)
    col = drift_report({"x": healthy(9)}, {"x": healthy(10)}, method="jensenshannon").columns[0]
    assert col.status == "untestable" and "could not be computed" in (col.reason or "")


def test_chi2_infinity_with_a_zero_p_value_is_still_a_verdict() -> None:
    """A category new in the current data: chi2 = inf, p = 0. Tests decide on the p-value: drift."""
    ref, cur = np.array(["a", "b"] * 100), np.array(["a", "b", "c"] * 60)
    col = drift_report({"c": ref}, {"c": cur}, method="chi2").columns[0]
    assert (col.status, col.drift, col.p_value) == ("ok", True, 0.0)


# ---------------------------------------------------------------- non-finite values: counted, shown, alerting


def test_half_the_current_column_inf_alerts_and_is_not_no_drift() -> None:
    ref, cur = healthy(11), healthy(12)
    cur[: N // 2] = np.inf
    report = drift_report({"x": ref}, {"x": cur})
    col = report.columns[0]
    assert col.status == "ok" and col.drift is False  # the finite half alone looks fine...
    assert col.alert is not None and "current 50.0% (1,000 +inf)" in col.alert  # ...but half is inf
    assert report.status == "incomplete" and "no dataset drift" not in report.verdict
    assert "drift not ruled out" in report.verdict and "1 over 5% non-finite (x)" in report.verdict
    tally = strict_json(dumps(report))["columns"]["x"]["non_finite"]
    assert tally["current"] == {"rows": N, "nan": 0, "posinf": N // 2, "neginf": 0, "share": 0.5}
    assert tally["reference"]["share"] == 0.0


@pytest.mark.parametrize(("bad_rows", "line", "alerts"), [(80, 0.05, False), (120, 0.05, True), (120, 0.1, False)])
def test_the_non_finite_share_alert_line(bad_rows: int, line: float, alerts: bool) -> None:
    """More than ``max_non_finite`` of a side's rows non-finite (NaN, +inf and -inf all count)."""
    ref, cur = healthy(13), healthy(14)
    cur[: bad_rows // 3] = np.nan
    cur[bad_rows // 3 : 2 * bad_rows // 3] = -np.inf
    cur[2 * bad_rows // 3 : bad_rows] = np.inf
    report = drift_report({"x": ref}, {"x": cur}, max_non_finite=line)
    col = report.columns[0]
    assert col.non_finite_share == pytest.approx(bad_rows / N)
    assert (col.alert is not None) == alerts and report.alerted == int(alerts)
    assert report.status == ("incomplete" if alerts else "no_drift")


def test_the_alert_watches_the_reference_too_and_can_be_turned_off() -> None:
    ref, cur = healthy(15), healthy(16)
    ref[:500] = np.nan
    col = drift_report({"x": ref}, {"x": cur}).columns[0]
    assert col.alert is not None and col.alert.startswith("non-finite values above 5%: reference 25.0%")
    assert drift_report({"x": ref}, {"x": cur}, max_non_finite=1.0).status == "no_drift"


@pytest.mark.parametrize("value", [-0.1, 1.5, math.nan])
def test_a_bad_alert_line_is_refused_by_parameter_name(value: float) -> None:
    with pytest.raises(ParameterError, match=r"^max_non_finite=.* is a share of rows"):
        drift_report({"x": healthy(17)}, {"x": healthy(18)}, max_non_finite=value)


@pytest.mark.parametrize("side", ["current", "reference"])
def test_a_column_entirely_inf_is_untestable(side: str) -> None:
    ok, bad = healthy(19), np.where(np.arange(N) % 2 == 0, np.inf, -np.inf)
    ref, cur = (ok, bad) if side == "current" else (bad, ok)
    report = drift_report({"x": ref}, {"x": cur})
    col = report.columns[0]
    assert (col.status, col.drift, col.statistic) == ("untestable", None, None)
    assert (
        col.reason
        == f"{side}: nothing finite left to measure, all 2,000 values are non-finite (1,000 +inf, 1,000 -inf)"
    )
    assert col.alert is not None and report.status == "untestable" and "no column could be tested" in report.verdict
    dumps(report)


def test_all_nan_stays_skipped_as_missing_but_alerts() -> None:
    """NaN is a missing value (skipped, as before); only +-inf makes an empty side untestable."""
    report = drift_report({"x": healthy(20), "y": healthy(21)}, {"x": np.full(N, np.nan), "y": healthy(22)})
    col = report.columns[0]
    assert col.status == "skipped" and "missing" in (col.reason or "") and col.alert is not None
    assert report.status == "incomplete"


def test_one_untestable_column_among_healthy_ones() -> None:
    ref = {"a": healthy(23), "b": healthy(24), "c": healthy(25), "bad": healthy(26)}
    cur = {"a": healthy(27), "b": healthy(28), "c": healthy(29), "bad": np.full(N, np.inf)}
    report = drift_report(ref, cur, correction="bh")
    assert [c.status for c in report.columns] == ["ok", "ok", "ok", "untestable"]
    assert report.tested == 3 and report.untestable == 1 and report.drifted == 0 and not report.dataset_drift
    assert report.status == "incomplete"
    assert report.verdict.startswith("incomplete, drift not ruled out: 0 of 3 tested columns drifted")
    assert "1 untestable (bad)" in report.verdict and "no dataset drift" not in report.verdict
    data = strict_json(dumps(report))
    assert (data["status"], data["untestable"], data["alerts"], data["max_non_finite"]) == ("incomplete", 1, 1, 0.05)
    # drift among the tested columns still wins: the verdict is drift, the untestable column listed
    cur.update(a=healthy(30, shift=2.0), b=healthy(31, shift=2.0))
    drifted = drift_report(ref, cur)
    assert drifted.status == "drift" and drifted.verdict.startswith("dataset drift: 2 of 3")
    assert "1 untestable (bad)" in drifted.verdict


def test_embeddings_keep_their_path_and_count_bad_rows() -> None:
    g = np.random.default_rng(32)
    ref, cur = g.normal(size=(200, 8)), g.normal(0.5, size=(150, 8))
    col = drift_report({"emb": ref}, {"emb": cur}).columns[0]
    expected = mmd_test(ref, cur)
    assert (col.kind, col.method, col.status, col.drift, col.alert) == ("embedding", "mmd", "ok", True, None)
    assert (col.statistic, col.p_value, col.extra["bandwidth"]) == (
        expected.statistic,
        expected.p_value,
        expected.bandwidth,
    )
    bad = cur.copy()
    bad[0, 3], bad[1, 0], bad[2, 5] = np.nan, np.inf, -np.inf
    tally = drift_report({"emb": ref}, {"emb": bad}).columns[0].non_finite["current"]
    assert tally is not None and (tally.rows, tally.nan, tally.posinf, tally.neginf) == (150, 1, 1, 1)


# ---------------------------------------------------------------- the same through the command line


def test_cli_huge_columns_are_drift_in_strict_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ref, cur = huge_pair()
    a, b = (
        write(tmp_path, "ref.parquet", pd.DataFrame({"x": ref})),
        write(tmp_path, "cur.parquet", pd.DataFrame({"x": cur})),
    )
    for method in ("auto", "jensenshannon", "mmd"):
        code, out, err = drift_cli(capsys, monkeypatch, a, b, "--method", method, "--json")
        data = strict_json(out)
        col = data["columns"]["x"]
        assert code == 0 and err == "", err
        assert (data["status"], col["status"], col["drift"]) == ("drift", "ok", True), method
        assert col["statistic"] is not None and math.isfinite(col["statistic"])
    assert drift_cli(capsys, monkeypatch, a, b, "--fail-on-drift")[0] == 1


def test_cli_raw_overflow_is_untestable_and_fails_the_gate(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ref, cur = huge_pair()
    a = write(tmp_path, "ref.parquet", pd.DataFrame({"x": ref / 0.75}))
    b = write(tmp_path, "cur.parquet", pd.DataFrame({"x": cur / 0.75}))
    args = (a, b, "--method", "wasserstein_raw", "--threshold", "1")
    code, out, _ = drift_cli(capsys, monkeypatch, *args, "--json")
    col = strict_json(out)["columns"]["x"]
    assert code == 0 and (col["status"], col["statistic"], col["drift"]) == ("untestable", None, None)
    code, out, err = drift_cli(capsys, monkeypatch, *args, "--fail-on-drift")
    assert code == 1 and "untestable" in out and "overflows float64" in out and "no column could be tested" in err


def test_cli_inf_in_a_csv_is_counted_shown_and_alerts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ref, cur = healthy(33), healthy(34)
    cur[: N // 2] = np.inf
    a = write(tmp_path, "ref.csv", pd.DataFrame({"x": ref, "y": healthy(35)}))
    b = write(tmp_path, "cur.csv", pd.DataFrame({"x": cur, "y": healthy(36)}))
    assert "inf" in Path(b).read_text(encoding="utf-8")
    code, out, _ = drift_cli(capsys, monkeypatch, a, b, "--json")
    data = strict_json(out)
    assert code == 0 and data["status"] == "incomplete" and data["alerts"] == 1
    assert data["columns"]["x"]["non_finite"]["current"]["posinf"] == N // 2 and data["columns"]["y"]["alert"] is None
    code, out, err = drift_cli(capsys, monkeypatch, a, b, "--fail-on-drift")
    assert code == 1 and "0% / 50.0%" in out and "alert x: non-finite values above 5%" in out
    assert (
        "incomplete, drift not ruled out" in out and "no dataset drift" not in out and "drift is not ruled out" in err
    )
    code, out, _ = drift_cli(capsys, monkeypatch, a, b, "--fail-on-drift", "--max-non-finite", "0.6")
    assert code == 0 and "no dataset drift" in out


def test_cli_entirely_inf_column_among_healthy_ones(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a = write(tmp_path, "ref.csv", pd.DataFrame({"a": healthy(37), "b": healthy(38), "bad": healthy(39)}))
    b = write(tmp_path, "cur.csv", pd.DataFrame({"a": healthy(40), "b": healthy(41), "bad": np.full(N, np.inf)}))
    code, out, _ = drift_cli(capsys, monkeypatch, a, b, "--json")
    data = strict_json(out)
    assert code == 0 and data["status"] == "incomplete" and data["untestable"] == 1 and data["tested"] == 2
    assert data["columns"]["bad"]["status"] == "untestable" and data["columns"]["bad"]["drift"] is None
    page = tmp_path / "r.html"
    code, out, err = drift_cli(capsys, monkeypatch, a, b, "--fail-on-drift", "--html", str(page))
    assert code == 1 and "untestable bad: current: nothing finite left" in out and "1 column(s) untestable" in err
    text = page.read_text(encoding="utf-8")
    assert 'class="verdict incomplete"' in text and ">untestable<" in text and "100.0%" in text


def test_cli_refuses_a_bad_alert_line_by_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a = write(tmp_path, "ref.csv", pd.DataFrame({"x": healthy(42)}))
    code, _, err = drift_cli(capsys, monkeypatch, a, a, "--max-non-finite", "5")
    assert code == 2 and "--max-non-finite 5.0 is a share of rows" in err


def test_html_draws_huge_columns() -> None:
    ref, cur = huge_pair()
    data_ref, data_cur = {"x": ref}, {"x": cur}
    page = render_html(drift_report(data_ref, data_cur), data_ref, data_cur, title="t")
    assert page.count("<svg") == 1 and "nan to" not in page and "inf to" not in page and "e+307" in page
