"""The seasonal lab: a weekly cycle fools the naive monitor, not the seasonal one; a real shift fools neither."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from gpufleet.cli.quality import seasonal_lab_command
from gpufleet.demos import quality_labs as labs
from gpufleet.errors import UsageError
from gpufleet.quality.monitor import SeasonalConfig, naive_monitor, placebo_band, seasonal_monitor, split_windows


def test_split_windows_cuts_by_time() -> None:
    cols = {"ts": np.array([5.0, 0.0, 250.0, 130.0, 99.9]), "v": np.array([1, 2, 3, 4, 5])}
    windows = split_windows(cols, "ts", 100)
    assert [w["v"].tolist() for w in windows] == [[1, 2, 5], [4], [3]]
    assert "ts" not in windows[0]
    with pytest.raises(UsageError, match="no time column"):
        split_windows(cols, "time", 100)
    with pytest.raises(UsageError, match="positive"):
        split_windows(cols, "ts", 0)


def test_shop_data_has_a_weekly_cycle() -> None:
    data = labs.weekly_shop(0, days=14, shift_day=None)
    windows = split_windows(data.columns, "ts", labs.DAY_S)
    baskets = [float(np.median(w["basket_eur"])) for w in windows]
    weekday, weekend = np.mean([baskets[d] for d in range(14) if d % 7 < 5]), np.mean([baskets[5], baskets[6]])
    assert weekend > 1.3 * weekday
    assert labs.day_label(0) == "Mon 2026-01-05" and labs.day_label(12) == "Sat 2026-01-17"


def test_naive_monitor_false_alarms_seasonal_does_not() -> None:
    lab = labs.seasonal_lab(seed=0)
    before = [d for d in lab.days if not d["shifted"]]
    naive_alarm_days = [d["label"][:3] for d in before if d["naive"]["alarm"]]
    assert len(before) == 10 and lab.false_alarms == {"naive": 3, "seasonal": 0}
    assert set(naive_alarm_days) == {"Mon", "Sat"}  # yesterday was the other half of the week


def test_both_monitors_catch_the_real_shift() -> None:
    lab = labs.seasonal_lab(seed=0)
    assert lab.shift_day == 38 and lab.detected == {"naive": True, "seasonal": True}
    first = next(d for d in lab.days if d["day"] == 38)
    assert set(first["seasonal"]["flagged"]) == {"basket_eur", "device"}
    # the naive monitor compares shifted days with shifted days after the first one; the seasonal one keeps alarming
    assert lab.shifted_days_alarmed["seasonal"] == 4


def test_seasonal_false_alarms_stay_rare_across_seeds() -> None:
    naive = seasonal = 0
    for seed in range(1, 6):
        lab = labs.seasonal_lab(seed=seed)
        naive, seasonal = naive + lab.false_alarms["naive"], seasonal + lab.false_alarms["seasonal"]
        assert lab.detected["seasonal"]
    assert naive >= 14 and seasonal <= 2


def test_without_a_shift_nothing_is_detected() -> None:
    lab = labs.seasonal_lab(seed=0, shift_day=None)
    assert lab.detected == {"naive": False, "seasonal": False} and lab.false_alarms["seasonal"] == 0


def test_the_band_comes_from_past_same_season_comparisons() -> None:
    data = labs.weekly_shop(0, days=35, shift_day=None)
    windows = split_windows(data.columns, "ts", labs.DAY_S)
    config = SeasonalConfig(method=labs.SHOP_METHODS, placebo_periods=1, reference_periods=1)
    verdicts = seasonal_monitor(windows, config)
    assert verdicts[0].index == config.history == 14 and verdicts[0].references == (7,)
    first_band = verdicts[0].band
    placebo = [
        naive_monitor([windows[j - 7], windows[j]], method=labs.SHOP_METHODS)[0].report for j in range(7, 14)
    ]  # the same comparisons, one week apart, built by hand
    stats_by_day = [{c.column: c.statistic for c in r.columns} for r in placebo]
    for column, value in first_band.items():
        assert value == pytest.approx(float(np.quantile([s[column] for s in stats_by_day], 0.95)))
    assert placebo_band({}, [], 0.95) == {}


def test_lab_command_json_and_png(tmp_path: Path) -> None:
    app = typer.Typer(pretty_exceptions_enable=False)
    app.command("lab-seasonal")(seasonal_lab_command)
    app.command("noop")(lambda: None)
    png = tmp_path / "lab.png"
    result = CliRunner().invoke(app, ["lab-seasonal", "--json", "--out", str(png)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["false_alarms"] == {"naive": 3, "seasonal": 0} and data["detected_shift"]["seasonal"] is True
    assert len(data["days"]) == 14 and data["png"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = CliRunner().invoke(app, ["lab-seasonal"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "false alarms before the shift: naive 3, seasonal 0" in table.stdout
