"""The standing monitor on estimated performance: each window's estimate decides; late labels give the realised one.

Real tables, the real CBPE estimate and policy. The champion's score is calibrated on the reference
(``p = sigmoid(2.5 x0)``, the label drawn from it), so a shift of ``x1``, which the model ignores, is
drift that does not move the estimate, and a squeeze of ``x0`` towards the decision boundary is one
that does. Labels arrive later in a folder, keyed by ``id``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import http, run_cli, served

from gpufleet.errors import SpecError
from gpufleet.quality.standing import StandingMonitor, load_monitor_config, model_dir, read_history

SPEC = "name: retrain\nentrypoint: gpufleet.workloads.toy:train\nargs: {steps: 3}\nresources: {gpus: 0}\n"


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """A submission queues the job in the store; no scheduler process is started to run it."""
    monkeypatch.setattr("gpufleet.backends.local.process.ensure_scheduler", lambda home: None)


def scored(rows: int, *, seed: int, first_id: int, x0_sd: float = 1.0, x1_mean: float = 0.0) -> pd.DataFrame:
    """Rows with an id, two inputs, the champion's calibrated score ``p`` and the label ``y`` drawn from it."""
    rng = np.random.default_rng(seed)
    x0 = rng.normal(0.0, x0_sd, rows)
    p = 1.0 / (1.0 + np.exp(-2.5 * x0))
    return pd.DataFrame(
        {
            "id": np.arange(first_id, first_id + rows),
            "x0": x0,
            "x1": rng.normal(x1_mean, 1.0, rows),
            "p": p,
            "y": (rng.uniform(size=rows) < p).astype(int),
        }
    )


@pytest.fixture
def lab(tmp_path: Path) -> dict[str, Any]:
    """A labelled reference, three windows without labels (unchanged, x1 shifted, x0 squeezed), no labels yet."""
    scored(4000, seed=1, first_id=0).to_csv(tmp_path / "reference.csv", index=False)
    (tmp_path / "windows").mkdir()
    (tmp_path / "labels").mkdir()
    (tmp_path / "retrain.yaml").write_text(SPEC)
    truth = {
        "w1": scored(1000, seed=2, first_id=10_000),
        "w2": scored(1000, seed=3, first_id=20_000, x1_mean=1.5),
        "w3": scored(1000, seed=4, first_id=30_000, x0_sd=0.3),
    }
    for name, frame in truth.items():
        frame.drop(columns=["y"]).to_csv(tmp_path / "windows" / f"{name}.csv", index=False)
    model = {
        "name": "m",
        "reference": "reference.csv",
        "current": "windows",
        "estimate": {"metric": "roc_auc", "target": "y", "score": "p", "chunk_size": 500},
        "labels": "labels",
        "policy": {"persistence": 2, "cooldown_s": 86400},
        "retrain": "retrain.yaml",
    }
    config = tmp_path / "monitor.yaml"
    config.write_text(json.dumps({"every": "10m", "models": [model]}))
    return {"config": config, "truth": truth, "labels": tmp_path / "labels"}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_estimate_decides_and_late_labels_give_the_realised_metric(lab: dict[str, Any], home: Path) -> None:
    monitor = StandingMonitor(load_monitor_config(lab["config"]), home)
    w1, w2, w3 = monitor.run_round(now=1000.0)
    assert w1["action"] == "pass" and w1["kind"] == "window" and w1["realised"] is None
    assert 0.85 < w1["estimated"] < 0.92 and w1["reasons"][0].startswith("estimated roc_auc")
    assert w2["share"] > 0.2 and w2["action"] == "pass"  # x1 drifted (an alert without the estimate); p ignores it
    assert w2["reasons"][0].startswith("33% of columns drifted (x1) does not move the estimated roc_auc")
    assert w3["action"] == "retrain" and w3["retrain_submitted"] is True
    assert any("below its threshold" in r and "beyond its band" in r for r in w3["reasons"])

    # Labels arrive: all of w1's, w2's drawn from another concept (the label no longer follows p), half of w3's.
    truth = lab["truth"]
    truth["w1"][["id", "y"]].to_csv(lab["labels"] / "batch-1.csv", index=False)
    flipped = truth["w2"].assign(y=1 - truth["w2"]["y"])
    flipped[["id", "y"]].to_csv(lab["labels"] / "batch-2.csv", index=False)
    truth["w3"][["id", "y"]].iloc[:500].to_csv(lab["labels"] / "batch-3.csv", index=False)
    l1, l2 = StandingMonitor(load_monitor_config(lab["config"]), home).run_round(now=2000.0)
    assert (l1["window"], l1["kind"], l1["action"]) == ("w1.csv", "labels", "pass")
    assert abs(l1["realised"] - l1["estimated"]) < 0.05
    assert (l2["window"], l2["kind"]) == ("w2.csv", "labels") and l2["realised"] < 0.3
    assert any("possible concept shift" in r for r in l2["reasons"])
    assert l2["action"] == "alert" and any("cool-down" in r for r in l2["reasons"])  # w3's retrain holds it back

    assert monitor.run_round(now=3000.0) == []  # decided once, across monitors: w3 still waits for labels
    truth["w3"][["id", "y"]].iloc[500:].to_csv(lab["labels"] / "batch-4.csv", index=False)
    [l3] = monitor.run_round(now=4000.0)
    assert (l3["window"], l3["kind"]) == ("w3.csv", "labels") and l3["realised"] < 0.8
    assert monitor.run_round(now=5000.0) == []

    folder = model_dir(home, "m")
    records = lines(folder / "performance.jsonl")
    assert [(r["window"], r["record"]) for r in records] == [
        ("w1.csv", "estimate"),
        ("w2.csv", "estimate"),
        ("w3.csv", "estimate"),
        ("w1.csv", "realised"),
        ("w2.csv", "realised"),
        ("w3.csv", "realised"),
    ]
    assert records[3]["labelled_rows"] == 1000 and records[0]["method"] == "classification"
    decisions = read_history(home)["m"]["decisions"]
    assert [d["evidence"]["kind"] for d in decisions] == ["window"] * 3 + ["labels"] * 3
    assert [d["evidence"]["drift_streak"] for d in decisions] == [0, 0, 1, 0, 0, 0]  # w3's retrain reset it
    series = read_history(home)["m"]["performance"]
    assert [s["window"] for s in series] == ["w1.csv", "w2.csv", "w3.csv"]
    assert all(s["lower"] <= s["estimated"] <= s["upper"] and s["realised"] is not None for s in series)


def test_drift_columns_leave_out_the_row_id_and_the_target(lab: dict[str, Any], home: Path) -> None:
    StandingMonitor(load_monitor_config(lab["config"]), home).run_round(now=1000.0)
    [first, *_] = lines(model_dir(home, "m") / "drift.jsonl")
    assert [c["column"] for c in first["columns"]] == ["x0", "x1", "p"]


def test_a_window_without_the_score_is_judged_on_drift_and_says_why(lab: dict[str, Any], home: Path) -> None:
    windows = lab["config"].parent / "windows"
    for name in ("w1", "w2", "w3"):
        (windows / f"{name}.csv").unlink()
    lab["truth"]["w1"].drop(columns=["y", "p"]).to_csv(windows / "w0.csv", index=False)
    [check] = StandingMonitor(load_monitor_config(lab["config"]), home).run_round(now=1000.0)
    assert check["action"] == "pass" and check["estimated"] is None
    assert check["error"].startswith("no estimate:") and "'p'" in check["error"]
    [record] = lines(model_dir(home, "m") / "performance.jsonl")
    assert record["record"] == "estimate" and "error" in record


def test_the_dashboard_serves_estimated_and_realised_per_window(lab: dict[str, Any], home: Path) -> None:
    from gpufleet.serve.app import ServeConfig, create_app

    monitor = StandingMonitor(load_monitor_config(lab["config"]), home)
    monitor.run_round(now=1000.0)
    lab["truth"]["w1"][["id", "y"]].to_csv(lab["labels"] / "batch-1.csv", index=False)
    monitor.run_round(now=2000.0)
    with served(create_app(ServeConfig(home=home, token=None, sync_remote=False))) as url:
        status, body = http("GET", url + "/api/quality")
    assert status == 200
    series = body["homes"][0]["monitor"]["m"]["performance"]
    assert [(s["window"], s["metric"]) for s in series] == [
        ("w1.csv", "roc_auc"),
        ("w2.csv", "roc_auc"),
        ("w3.csv", "roc_auc"),
    ]
    assert {"estimated", "lower", "upper", "threshold", "reference", "realised"} <= set(series[0])
    assert series[0]["realised"] is not None and series[1]["realised"] is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"estimate": None}, "labels needs estimate"),
        ({"estimate": {"metric": "mae", "target": "y", "score": "p"}}, "name its output column with prediction"),
        ({"estimate": {"metric": "auc", "target": "y", "score": "p"}}, "models.0.estimate.metric"),
        ({"labels": "nowhere"}, "models.0.labels"),
    ],
)
def test_a_bad_estimate_or_labels_entry_is_refused_in_one_line(
    lab: dict[str, Any],
    change: dict[str, Any],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = json.loads(lab["config"].read_text())
    config["models"][0].update({k: v for k, v in change.items() if v is not None})
    for key in [k for k, v in change.items() if v is None]:
        del config["models"][0][key]
    lab["config"].write_text(json.dumps(config))
    with pytest.raises(SpecError, match=message):
        load_monitor_config(lab["config"])
    code, _, err = run_cli(capsys, monkeypatch, "quality", "monitor", "run", str(lab["config"]), "--once")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
