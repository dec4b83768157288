"""False alarms under control: windows with no drift alert at most ``alpha`` of the time, tiny shifts never.

Fixed seeds and bounds with a binomial margin: the counts below are what these seeds give, and the
bounds are what a calibrated monitor gives with probability 0.999, so a broken control fails them.
The 1,000-window measurement is ``bench/false_alarms.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_refused, run_cli
from scipy import stats

from gpufleet.errors import SpecError, UsageError
from gpufleet.quality.drift import drift_report
from gpufleet.quality.drift.columns import chi2, chi2_homogeneity
from gpufleet.quality.monitor import AlarmControl, controlled_report, window_alerts
from gpufleet.quality.standing import load_monitor_config

LEVELS = np.array([f"k{i:02d}" for i in range(12)])
LEVEL_P = 1 / np.arange(1, 13) ** 1.5  # rare levels: a few expected rows a window, new ones now and then
LEVEL_P /= LEVEL_P.sum()


def draw(rng: np.random.Generator, rows: int, *, shift: float = 0.0, mix: float = 0.0) -> dict[str, np.ndarray]:
    """Five column types; ``shift`` moves ``x``'s mean (in standard deviations), ``mix`` moves level share to k01."""
    p = LEVEL_P.copy()
    p[0] -= mix
    p[1] += mix
    return {
        "x": rng.normal(shift, 1.0, rows),
        "amount": rng.lognormal(3.0, 1.0, rows),
        "rating": rng.choice(np.arange(1.0, 6.0), rows, p=[0.05, 0.1, 0.2, 0.35, 0.3]),
        "flag": (rng.uniform(size=rows) < 0.3).astype(np.float64),
        "level": rng.choice(LEVELS, rows, p=p),
    }


def test_the_control_tests_every_column_and_records_its_effect() -> None:
    rng = np.random.default_rng(0)
    report = controlled_report(draw(rng, 3000), draw(rng, 300))
    methods = {c.column: c.method for c in report.columns}
    assert methods == {
        "x": "ks",
        "amount": "ks",
        "rating": "chi2_homogeneity",
        "flag": "chi2_homogeneity",
        "level": "chi2_homogeneity",
    }
    assert report.correction == "bh" and all(c.threshold == 0.01 for c in report.columns)
    for c in report.columns:
        assert {"effect", "effect_floor", "bh_adjusted_p"} <= set(c.extra)
        assert c.extra["effect_floor"] == 0.1 and 0 <= c.extra["effect"] < 0.2
    # control off: the verdict of `gpufleet drift` (Evidently's distances on a reference above 1,000 rows)
    plain = controlled_report(draw(rng, 3000), draw(rng, 300), AlarmControl(control=False))
    assert {c.method for c in plain.columns} == {"wasserstein", "jensenshannon"} and plain.correction == "none"


def bh_by_hand(p: np.ndarray, alpha: float) -> np.ndarray:
    """Benjamini-Hochberg's step-up rule as written in the 1995 paper: reject the k smallest, k the largest i
    with p_(i) <= i * alpha / m."""
    order = np.sort(p)
    passing = np.nonzero(order <= np.arange(1, p.size + 1) * alpha / p.size)[0]
    return p <= order[passing[-1]] if passing.size else np.zeros(p.size, dtype=bool)


def test_bh_in_the_report_is_scipys_and_the_step_up_rule() -> None:
    rng = np.random.default_rng(8)
    reference = {f"c{i}": rng.normal(size=2000) for i in range(8)}
    current = {f"c{i}": rng.normal(0.02 * i, 1.0, 400) for i in range(8)}  # from no shift to a small one
    alpha = 0.05
    for correction in ("bh", "by"):
        report = drift_report(
            reference, current, method="test", threshold=alpha, correction=correction, effect_floor={}
        )
        raw = np.array([c.p_value for c in report.columns])
        adjusted = np.array([c.extra[f"{correction}_adjusted_p"] for c in report.columns])
        assert adjusted == pytest.approx(stats.false_discovery_control(raw, method=correction), rel=1e-12)
        if correction == "bh":
            flagged = np.array([c.drift for c in report.columns])
            assert (flagged == bh_by_hand(raw, alpha)).all()
            assert flagged.any() and ((raw <= alpha) & ~flagged).any()  # the correction held some back
    # step-up: 0.013 misses its own line (0.0125) but is rejected with 0.02, which makes its line (0.025)
    assert bh_by_hand(np.array([0.013, 0.02, 0.6, 0.9]), 0.05).tolist() == [True, True, False, False]
    assert bh_by_hand(np.array([0.01, 0.04, 0.03, 0.5]), 0.05).tolist() == [True, False, False, False]


def test_windows_without_drift_alert_at_most_alpha_within_a_binomial_margin() -> None:
    rng = np.random.default_rng(7)
    reference, windows, alpha = draw(rng, 4000), 200, 0.05
    control = AlarmControl(alpha=alpha)
    controlled = raw = 0
    for _ in range(windows):
        report = controlled_report(reference, draw(rng, 150), control)
        controlled += window_alerts(report)
        raw += any(c.p_value is not None and c.p_value <= alpha for c in report.columns)
    band = int(stats.binom.ppf(0.999, windows, alpha))  # 20 of 200: exceeded by chance once in a thousand
    assert controlled <= band, (controlled, band)
    assert raw > band  # the same tests, uncorrected: 1 - 0.95**5, about 23 % of the windows


def test_the_two_sample_chi2_is_calibrated_where_the_goodness_of_fit_one_is_not() -> None:
    rng = np.random.default_rng(11)
    levels, p = np.arange(6.0), [0.3, 0.25, 0.2, 0.15, 0.07, 0.03]
    draws = [(rng.choice(levels, 400, p=p), rng.choice(levels, 400, p=p)) for _ in range(400)]
    homogeneity = sum(chi2_homogeneity(r, c)[1] < 0.05 for r, c in draws)
    goodness_of_fit = sum(chi2(r, c)[1] < 0.05 for r, c in draws)  # Evidently's: reference shares taken as exact
    assert homogeneity <= stats.binom.ppf(0.999, 400, 0.05)  # 35
    assert goodness_of_fit > 2 * stats.binom.ppf(0.999, 400, 0.05)  # a window as large as the reference


def test_rare_and_new_categories_are_pooled_not_alarmed_on() -> None:
    ref = np.array(["a"] * 500 + ["b"] * 480 + ["c"] * 20)
    cur = np.array(["a"] * 49 + ["b"] * 49 + ["new"] * 2)  # a category the reference never had
    statistic, p = chi2_homogeneity(ref, cur)
    assert np.isfinite(statistic) and p > 0.05
    assert chi2(ref, cur) == (np.inf, 0.0)  # the goodness-of-fit test calls it drift outright
    assert chi2_homogeneity(["a"] * 10, ["a"] * 3 + ["b"]) == (0.0, 1.0)  # too few rows left to test


def test_a_negligible_shift_on_a_huge_sample_does_not_alert() -> None:
    rng = np.random.default_rng(5)
    reference, current = draw(rng, 200_000), draw(rng, 200_000, shift=0.03, mix=0.01)
    report = controlled_report(reference, current)
    by = {c.column: c for c in report.columns}
    assert by["x"].p_value is not None and by["x"].p_value < 1e-6  # the test alone calls it drift
    assert by["level"].p_value is not None and by["level"].p_value < 1e-6
    assert by["x"].extra["effect"] < 0.05 and by["level"].extra["effect"] < 0.05  # a third of a floor at most
    assert not window_alerts(report) and report.status == "no_drift"


def test_a_real_shift_alerts_on_the_shifted_columns_only() -> None:
    rng = np.random.default_rng(9)
    reference = draw(rng, 4000)
    report = controlled_report(reference, draw(rng, 300, shift=0.5, mix=0.15))
    assert window_alerts(report)
    assert {c.column for c in report.columns if c.drift} == {"x", "level"}


def test_alarm_control_and_effect_floors_refuse_bad_values() -> None:
    with pytest.raises(UsageError, match=r"alpha 1\.5 is a false-alarm rate"):
        AlarmControl(alpha=1.5)
    with pytest.raises(UsageError, match="correction 'holm'"):
        AlarmControl(correction="holm")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"wasserstein_floor -0\.1"):
        AlarmControl(wasserstein_floor=-0.1)
    with pytest.raises(UsageError, match="mmd_floor nan"):
        AlarmControl(mmd_floor=float("nan"))
    data = {"x": np.arange(50.0)}
    with pytest.raises(UsageError, match="effect measures are jensenshannon, mmd, wasserstein"):
        drift_report(data, data, method="test", effect_floor={"psi": 0.1})
    with pytest.raises(UsageError, match="give a number >= 0"):
        drift_report(data, data, method="test", effect_floor={"wasserstein": -1.0})
    with pytest.raises(UsageError, match="use none, bh or by"):
        drift_report(data, data, correction="holm")  # type: ignore[arg-type]


def monitor_file(tmp_path: Path, alarms: object) -> Path:
    rng = np.random.default_rng(1)
    (tmp_path / "windows").mkdir()
    lines = ["x"] + [f"{v:.4f}" for v in rng.normal(size=50)]
    (tmp_path / "ref.csv").write_text("\n".join(lines) + "\n")
    model = {"name": "m", "reference": "ref.csv", "current": "windows", "alarms": alarms}
    path = tmp_path / "monitor.yaml"
    path.write_text(json.dumps({"models": [model]}))
    return path


def test_the_monitor_file_configures_the_control(tmp_path: Path) -> None:
    config = load_monitor_config(monitor_file(tmp_path, {"alpha": 0.05, "correction": "by", "wasserstein_floor": 0.2}))
    alarms = config.models[0].alarms
    assert (alarms.control, alarms.alpha, alarms.correction, alarms.floors["wasserstein"]) == (True, 0.05, "by", 0.2)
    assert alarms.floors["jensenshannon"] == 0.1  # the others keep their defaults
    (tmp_path / "monitor.yaml").unlink()
    (tmp_path / "windows").rmdir()
    default = load_monitor_config(monitor_file(tmp_path, {})).models[0].alarms
    assert default == AlarmControl() and default.alpha == 0.01 and default.control


@pytest.mark.parametrize(
    ("alarms", "needle"),
    [
        ({"alpha": 0}, "is a false-alarm rate per window"),
        ({"alhpa": 0.01}, "unknown field 'alhpa': the alarms' fields are control, alpha"),
        ({"jensenshannon_floor": -1}, "jensenshannon_floor -1"),
        ({"correction": "none"}, "correction"),
    ],
)
def test_a_bad_alarms_block_is_refused_naming_the_field(tmp_path: Path, alarms: object, needle: str) -> None:
    with pytest.raises(SpecError, match=r"models\.0\.alarms") as err:
        load_monitor_config(monitor_file(tmp_path, alarms))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_cli_refuses_a_bad_alarms_block_with_one_line(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = monitor_file(tmp_path, {"alpha": 2})
    code, _, err = run_cli(capsys, monkeypatch, "quality", "monitor", "run", str(path), "--once")
    assert_refused(code, err, home, "models.0.alarms", "alpha 2")
