"""Drift statistics against scipy, Evidently's automatic choice, and bad input that must be skipped, not crash."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.spatial.distance import jensenshannon

from gpufleet.errors import UsageError
from gpufleet.quality import drift
from gpufleet.quality.drift import ColumnDrift, DriftReport, drift_report
from gpufleet.quality.drift.columns import BLOCK, mean_abs_difference, population_std


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def by_name(report: DriftReport) -> dict[str, ColumnDrift]:
    return {c.column: c for c in report.columns}


# ---------------------------------------------------------------- the statistics match scipy


@pytest.mark.parametrize(("n", "m"), [(40, 60), (800, 800), (5000, 7000)])
def test_ks_is_scipys(n: int, m: int) -> None:
    a, b = rng(1).normal(size=n), rng(2).normal(0.1, 1.1, size=m)
    statistic, p = drift.ks(a, b)
    ref = stats.ks_2samp(a, b)
    assert statistic == pytest.approx(float(ref.statistic), abs=1e-12)
    assert p == pytest.approx(float(ref.pvalue), abs=1e-12)


@pytest.mark.parametrize(("n", "m"), [(500, 500), (3000, 1700), (7, 13)])
def test_wasserstein_raw_and_normed(n: int, m: int) -> None:
    a, b = rng(3).gamma(2.0, size=n), rng(4).gamma(2.3, size=m)
    raw = drift.wasserstein(a, b, normed=False)
    assert raw == pytest.approx(stats.wasserstein_distance(a, b), abs=1e-12)
    assert drift.wasserstein(a, b, normed=True) == pytest.approx(raw / np.std(a), abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17])
def test_block_sums_equal_numpys_over_several_blocks(n: int) -> None:
    """The sums a block at a time (no temporary of the columns' size) equal numpy's to rounding."""
    a, b = rng(5).gamma(2.0, size=n) + 1e3, rng(6).normal(1e3, 3.0, size=n)
    assert mean_abs_difference(a, b) == pytest.approx(float(np.mean(np.abs(a - b))), rel=1e-12)
    assert population_std(a) == pytest.approx(float(np.std(a)), rel=1e-9, abs=1e-12)
    a.sort()
    b.sort()
    assert drift.wasserstein(a, b, normed=False) == pytest.approx(stats.wasserstein_distance(a, b), rel=1e-12)
    assert math.isnan(population_std(np.empty(0))) and math.isnan(mean_abs_difference(np.empty(0), np.empty(0)))
    for empty in (np.empty(0), np.array([math.nan])):  # nothing to compare: NaN, as scipy's is
        assert math.isnan(drift.wasserstein(empty, empty, normed=True))
        assert math.isnan(drift.wasserstein(empty, empty, normed=False))


def test_normed_wasserstein_floors_the_reference_spread() -> None:
    a, b = np.array([1.0, 1.0, 1.0 + 1e-6]), np.array([2.0, 2.0, 2.0])
    assert drift.wasserstein(a, b, normed=True) == pytest.approx(stats.wasserstein_distance(a, b) / 0.001)


def test_chi2_is_evidently_chisquare() -> None:
    """Current counts against reference counts scaled to the current size, k - 1 degrees of freedom."""
    ref = rng(5).choice(list("abcd"), size=500, p=[0.4, 0.3, 0.2, 0.1])
    cur = rng(6).choice(list("abcd"), size=800, p=[0.3, 0.3, 0.2, 0.2])
    keys = sorted(set(ref) | set(cur))
    f_ref = np.array([np.sum(ref == k) for k in keys])
    f_obs = np.array([np.sum(cur == k) for k in keys])
    expected = stats.chisquare(f_obs, f_ref * len(cur) / len(ref))
    statistic, p = drift.chi2(ref, cur)
    assert statistic == pytest.approx(float(expected.statistic), rel=1e-12)
    assert p == pytest.approx(float(expected.pvalue), rel=1e-9, abs=1e-15)


def test_chi2_on_a_category_the_reference_never_had() -> None:
    statistic, p = drift.chi2(["a"] * 50 + ["b"] * 50, ["a"] * 40 + ["b"] * 40 + ["new"] * 20)
    assert math.isinf(statistic) and p == 0.0


def test_z_test_squared_is_the_uncorrected_2x2_chi2() -> None:
    ref = rng(7).choice(["no", "yes"], size=600, p=[0.7, 0.3])
    cur = rng(8).choice(["no", "yes"], size=400, p=[0.6, 0.4])
    table = [[np.sum(ref == "no"), np.sum(ref == "yes")], [np.sum(cur == "no"), np.sum(cur == "yes")]]
    contingency = stats.chi2_contingency(table, correction=False)
    z, p = drift.z_test(ref, cur)
    assert z * z == pytest.approx(float(contingency.statistic), rel=1e-12)
    assert p == pytest.approx(float(contingency.pvalue), rel=1e-9)


def test_jensen_shannon_on_sturges_bins_is_scipys() -> None:
    a, b = rng(9).normal(size=3000), rng(10).normal(0.3, size=2000)
    edges = np.histogram_bin_edges(np.concatenate([a, b]), bins="sturges")
    p, q = np.histogram(a, edges)[0] / a.size, np.histogram(b, edges)[0] / b.size
    assert drift.jensen_shannon(a, b) == pytest.approx(float(jensenshannon(p, q)), abs=1e-12)


def test_jensen_shannon_on_categories_and_few_numbers_uses_frequencies() -> None:
    ref = rng(11).choice(["x", "y", "z"], size=2000, p=[0.5, 0.3, 0.2])
    cur = rng(12).choice(["x", "y", "w"], size=1500, p=[0.4, 0.4, 0.2])
    keys = sorted(set(ref) | set(cur))
    p = np.array([np.mean(ref == k) for k in keys])
    q = np.array([np.mean(cur == k) for k in keys])
    assert drift.jensen_shannon(ref, cur) == pytest.approx(float(jensenshannon(p, q)), abs=1e-12)
    a, b = rng(13).integers(0, 4, size=3000).astype(float), rng(14).integers(0, 5, size=3000).astype(float)
    p = np.array([np.mean(a == v) for v in range(5)])
    q = np.array([np.mean(b == v) for v in range(5)])
    assert drift.jensen_shannon(a, b) == pytest.approx(float(jensenshannon(p, q)), abs=1e-12)


def test_jensen_shannon_of_near_identical_distributions_is_zero() -> None:
    """Rounding leaves their divergence a hair below zero: scipy's square root of it is NaN, the distance 0."""
    ref, cur = np.repeat(["a", "b"], [1560, 1561]), np.repeat(["a", "b"], [26521, 26538])
    assert drift.jensen_shannon(ref, cur) == 0.0
    column = drift_report({"c": ref}, {"c": cur}, method="jensenshannon").columns[0]
    assert (column.statistic, column.drift) == (0.0, False)


def test_psi_by_hand_and_its_null_quantile() -> None:
    ref = np.arange(1000, dtype=float)
    cur = np.concatenate([np.arange(0, 500, dtype=float), np.arange(500, 1000, 2, dtype=float)])
    # quantile bins of 100 values each: the current puts 100/750 in each of the first five, 50/750 in the rest
    c = np.array([100 / 750] * 5 + [50 / 750] * 5)
    expected = float(np.sum((c - 0.1) * np.log(c / 0.1)))
    assert drift.psi(ref, cur) == pytest.approx(expected, rel=1e-12)
    assert drift.psi(ref, ref) == 0.0
    assert drift.psi_null_quantile(1000, 750, 10) == pytest.approx((1 / 1000 + 1 / 750) * stats.chi2.ppf(0.95, 9))


def test_psi_null_quantile_is_calibrated() -> None:
    """About 5% of no-drift pairs exceed the quantile: the approximation holds at these sizes."""
    g = rng(15)
    values = [drift.psi(g.normal(size=400), g.normal(size=300)) for _ in range(400)]
    exceed = np.mean(np.array(values) > drift.psi_null_quantile(400, 300, 10))
    assert 0.02 <= exceed <= 0.10


def brute_force_unbiased_mmd2(x: np.ndarray, y: np.ndarray, bandwidth: float) -> float:
    def k(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.exp(-np.sum((a - b) ** 2) / (2 * bandwidth**2)))

    n, m = len(x), len(y)
    xx = sum(k(x[i], x[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    yy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    xy = sum(k(x[i], y[j]) for i in range(n) for j in range(m)) / (n * m)
    return xx + yy - 2 * xy


def test_exact_mmd_is_the_unbiased_estimate() -> None:
    x, y = rng(16).normal(size=(30, 3)), rng(17).normal(0.4, size=(25, 3))
    res = drift.mmd_test(x, y, method="exact", permutations=50)
    assert res.statistic == pytest.approx(brute_force_unbiased_mmd2(x, y, res.bandwidth), abs=1e-12)
    pooled = np.vstack([x, y])
    distances = [np.linalg.norm(pooled[i] - pooled[j]) for i in range(55) for j in range(i + 1, 55)]
    assert res.bandwidth == pytest.approx(float(np.median(distances)), rel=1e-9)


def test_rff_approximates_the_exact_statistic() -> None:
    x, y = rng(18).normal(size=(400, 8)), rng(19).normal(0.5, size=(400, 8))
    exact = drift.mmd_test(x, y, method="exact", permutations=20)
    approx = drift.mmd_test(x, y, method="rff", permutations=20, features=4096)
    assert approx.statistic == pytest.approx(exact.statistic, rel=0.15)


@pytest.mark.parametrize("method", ["exact", "rff", "linear"])
def test_mmd_detects_a_shift_and_not_a_resample(method: Any) -> None:
    g = rng(20)
    same = drift.mmd(g.normal(size=(600, 16)), g.normal(size=(600, 16)), method=method, seed=1)
    shifted = drift.mmd(g.normal(size=(600, 16)), g.normal(0.5, size=(600, 16)), method=method, seed=1)
    assert same[1] > 0.05
    assert shifted[1] < 0.01 and shifted[0] > same[0]


def test_mmd_permutation_p_values_are_calibrated() -> None:
    g = rng(21)
    p = [drift.mmd(g.normal(size=(40, 4)), g.normal(size=(40, 4)), permutations=99, seed=s)[1] for s in range(60)]
    assert min(p) >= 0.01  # (1 + k) / (1 + permutations): never 0
    assert 0.0 <= np.mean(np.array(p) < 0.1) <= 0.25


# ---------------------------------------------------------------- Evidently's automatic choice


def _sample(kind: str, rows: int, distinct: int, seed: int) -> np.ndarray:
    g = rng(seed)
    if kind == "categorical":
        return np.array([f"c{v}" for v in g.integers(0, distinct, size=rows)])
    if distinct == 0:
        return g.normal(size=rows)
    return g.integers(0, distinct, size=rows).astype(float)


@pytest.mark.parametrize(
    ("kind", "rows", "distinct", "method", "threshold"),
    [
        ("numeric", 1000, 0, "ks", 0.05),
        ("numeric", 1000, 5, "chi2", 0.05),
        ("numeric", 1000, 2, "z", 0.05),
        ("numeric", 1001, 0, "wasserstein", 0.1),
        ("numeric", 1001, 5, "jensenshannon", 0.1),
        ("categorical", 1000, 4, "chi2", 0.05),
        ("categorical", 1000, 2, "z", 0.05),
        ("categorical", 1001, 30, "jensenshannon", 0.1),
    ],
)
def test_automatic_choice_is_evidentlys(kind: str, rows: int, distinct: int, method: str, threshold: float) -> None:
    ref, cur = _sample(kind, rows, distinct, 1), _sample(kind, 700, distinct, 2)
    col = drift_report({"x": ref}, {"x": cur}).columns[0]
    assert (col.kind, col.method, col.threshold, col.status) == (kind, method, threshold, "ok")
    assert (col.p_value is not None) == (method in {"ks", "chi2", "z"})


def test_embeddings_get_mmd() -> None:
    g = rng(22)
    ref = {"emb": g.normal(size=(200, 8))}
    cur = pd.DataFrame({"emb": list(g.normal(0.5, size=(150, 8)))})
    col = drift_report(ref, cur).columns[0]
    assert (col.kind, col.method, col.drift) == ("embedding", "mmd", True)
    assert col.p_value is not None and col.p_value < 0.05


def test_dataset_drift_at_half_the_tested_columns() -> None:
    g = rng(23)
    ref = {c: g.normal(size=2000) for c in "abcd"}
    cur = {"a": g.normal(1.0, size=2000), "b": g.normal(1.0, size=2000), "c": g.normal(size=2000)}
    cur["d"] = g.normal(size=2000)
    report = drift_report(ref, cur)
    assert [c.drift for c in report.columns] == [True, True, False, False]
    assert report.share_drifted == 0.5 and report.dataset_drift
    assert not drift_report(ref, cur, drift_share=0.6).dataset_drift


def test_per_column_method_and_threshold_override() -> None:
    g = rng(24)
    ref, cur = {"a": g.normal(size=3000), "b": g.normal(size=3000)}, {"a": g.normal(0.05, size=3000)}
    cur["b"] = g.normal(0.05, size=3000)
    report = drift_report(ref, cur, method={"a": "psi"}, threshold={"b": 0.01})
    a, b = by_name(report)["a"], by_name(report)["b"]
    assert (a.method, a.threshold, b.method, b.threshold) == ("psi", 0.1, "wasserstein", 0.01)
    assert a.extra["psi_null_quantile"] == pytest.approx(drift.psi_null_quantile(3000, 3000, 10))
    assert b.drift is True and b.statistic is not None and b.statistic >= 0.01
    assert by_name(drift_report(ref, cur, method="ks"))["b"].method == "ks"


def test_psi_below_its_noise_floor_is_not_drift() -> None:
    """At 100 rows a side PSI >= 0.1 is the rule for two samples of one distribution; the null
    quantile (about 0.34 here) keeps those from being called drift."""
    cols = []
    for seed in range(10):
        g = rng(seed)
        cols.append(drift_report({"x": g.normal(size=100)}, {"x": g.normal(size=100)}, method="psi").columns[0])
    assert sum(c.statistic is not None and c.statistic >= 0.1 for c in cols) >= 5
    assert all(c.drift is False and c.extra["psi_null_quantile"] == pytest.approx(0.3384, abs=1e-4) for c in cols)
    g = rng(10)
    shifted = drift_report({"x": g.normal(size=100)}, {"x": g.normal(1.0, size=100)}, method="psi").columns[0]
    assert shifted.drift is True


def test_benjamini_hochberg_removes_a_false_discovery() -> None:
    g = rng(26)
    ref = {f"c{i}": g.normal(size=300) for i in range(20)}
    cur = {f"c{i}": g.normal(size=300) for i in range(20)}
    plain, corrected = drift_report(ref, cur), drift_report(ref, cur, correction="bh")
    raw = [c.p_value for c in plain.columns]
    assert any(p is not None and p <= 0.05 for p in raw), "the seed should give a chance finding"
    assert corrected.drifted == 0 and corrected.correction == "bh"
    expected = stats.false_discovery_control([p or 0.0 for p in raw])
    assert [c.extra["bh_adjusted_p"] for c in corrected.columns] == pytest.approx(list(expected))


# ---------------------------------------------------------------- bad input: skipped, with a reason


def test_bad_columns_are_skipped_with_reasons() -> None:
    g = rng(27)
    n = 500
    ref = pd.DataFrame(
        {
            "ok": g.normal(size=n),
            "nan": np.full(n, np.nan),
            "const": np.ones(n),
            "types": g.normal(size=n),
            "only_ref": g.normal(size=n),
            "few": np.r_[g.normal(size=3), np.full(n - 3, np.nan)],
        }
    )
    cur = pd.DataFrame(
        {
            "ok": g.normal(size=n),
            "nan": g.normal(size=n),
            "const": g.normal(size=n),
            "types": ["a"] * n,
            "few": g.normal(size=n),
            "only_cur": g.normal(size=n),
        }
    )
    report = drift_report(ref, cur, method={"few": "mmd"})
    cols = by_name(report)
    reasons = {name: c.reason or "" for name, c in cols.items() if c.status == "skipped"}
    assert set(reasons) == {"nan", "const", "types", "only_ref", "only_cur", "few"}
    assert "missing" in reasons["nan"] and "single value" in reasons["const"]
    assert "numeric" in reasons["types"] and "categorical" in reasons["types"]
    assert "reference" in reasons["only_cur"] and "current" in reasons["only_ref"]
    assert "at least 4" in reasons["few"]
    assert all(cols[n].drift is None and cols[n].statistic is None for n in reasons)
    assert report.tested == 1 and report.skipped == 6 and "6 skipped" in report.verdict
    json.dumps(report.to_dict(), allow_nan=False)


def test_empty_frames_give_no_verdict_not_no_drift() -> None:
    empty = pd.DataFrame({"a": pd.Series([], dtype=float), "b": pd.Series([], dtype=str)})
    report = drift_report(empty, empty)
    assert report.tested == 0 and report.skipped == 2 and not report.dataset_drift
    assert "no column could be tested" in report.verdict
    assert drift_report(pd.DataFrame(), pd.DataFrame()).columns == []


def test_method_that_does_not_fit_the_column_is_skipped() -> None:
    ref, cur = {"city": np.array(["a", "b", "c"] * 50)}, {"city": np.array(["a", "b", "c"] * 40)}
    col = drift_report(ref, cur, method="ks").columns[0]
    assert col.status == "skipped" and "numeric" in (col.reason or "")
    col = drift_report(ref, cur, method="z").columns[0]
    assert col.status == "skipped" and "two" in (col.reason or "")


def test_pandas_missing_values_of_every_flavour() -> None:
    ref = pd.DataFrame(
        {
            "ints": pd.array([1, 2, None, 4, 5, 6, 7] * 20, dtype="Int64"),
            "text": pd.Series(["a", None, "b", "c"] * 35, dtype="string"),
            "flag": pd.array([True, False, None, True] * 35, dtype="boolean"),
        }
    )
    report = drift_report(ref, ref)
    cols = by_name(report)
    assert cols["ints"].kind == "numeric" and cols["ints"].extra["missing_reference"] == 20
    assert cols["text"].kind == "categorical" and cols["text"].method == "chi2"
    assert cols["flag"].kind == "categorical" and cols["flag"].method == "z"
    assert report.drifted == 0 and report.tested == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "nope"}, "unknown drift method"),
        ({"method": {"zz": "ks"}}, "^method names column 'zz', which is not compared"),
        ({"threshold": -1.0}, "positive"),
        ({"method": "ks", "threshold": 2.0}, "below 1"),
        ({"method": "wasserstein_raw"}, "no scale-free default threshold: give one, e.g. threshold=0.5$"),
        ({"columns": ["zz"]}, "no column 'zz'"),
        ({"correction": "bonferroni"}, "correction"),
        ({"drift_share": 0.0}, "drift share"),
    ],
)
def test_user_errors_name_the_bad_value(kwargs: dict[str, Any], message: str) -> None:
    data = {"a": rng(28).normal(size=100)}
    with pytest.raises(UsageError, match=message):
        drift_report(data, data, **kwargs)
