"""Performance estimated without labels: checked against labels held back from it, on data whose truth is known.

The classifiers' scores are a miscalibrated but monotone function of the true probability, so P(y | score)
does not move when the inputs do: the assumption CBPE rests on holds, and the estimate must land near the
realised value on the held-back labels. The shift squeezes the inputs towards the decision boundary, which
lowers ROC AUC and F1 far below the reference's (the estimate has to follow, not repeat the reference).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from gpufleet.cli.quality import estimate_command, split_scores
from gpufleet.errors import GpufleetError, ParameterError, UsageError
from gpufleet.quality.estimate import (
    METRICS_CLASSIFICATION,
    estimate_performance,
    realised_metric,
)

CLASSES = ("cat", "dog", "eel")
SCORES = [f"p_{c}" for c in CLASSES]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-z)))


def binary(rows: int, spread: float, seed: int) -> pd.DataFrame:
    """A 0/1 target, an overconfident score (2x the true logit, shifted); ``spread`` < 1 squeezes the inputs."""
    g = np.random.default_rng(seed)
    x = g.normal(size=(rows, 3)) * spread
    logit = 1.5 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] - 0.5
    y = (g.random(rows) < _sigmoid(logit)).astype(int)
    return pd.DataFrame({"x0": x[:, 0], "x1": x[:, 1], "y": y, "score": _sigmoid(2.0 * logit + 0.4)})


def multiclass(rows: int, spread: float, seed: int) -> pd.DataFrame:
    """Three named classes, softmax truth; the model's probabilities are sharpened (temperature 0.6)."""
    g = np.random.default_rng(seed)
    x = g.normal(size=(rows, 2)) * spread
    logits = np.column_stack([x[:, 0], x[:, 1], -x[:, 0] - x[:, 1]]) * 1.5
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    y = (g.random(rows)[:, None] > np.cumsum(p, axis=1)).sum(axis=1)
    q = np.exp(logits / 0.6)
    q /= q.sum(axis=1, keepdims=True)
    return pd.DataFrame({"y": np.asarray(CLASSES)[y], **{s: q[:, i] for i, s in enumerate(SCORES)}})


def regression(rows: int, shift: float, seed: int) -> pd.DataFrame:
    """A prediction right on average whose error grows with |x0|; ``shift`` moves x0 to where it is larger."""
    g = np.random.default_rng(seed)
    x = g.normal(size=(rows, 3))
    x[:, 0] += shift
    pred = 2 * x[:, 0] - x[:, 1]
    y = pred + (0.3 + 0.5 * np.abs(x[:, 0])) * g.normal(size=rows)
    return pd.DataFrame({"x0": x[:, 0], "x1": x[:, 1], "x2": x[:, 2], "y": y, "pred": pred})


@pytest.fixture(scope="module")
def reference() -> pd.DataFrame:
    return binary(20_000, 1.0, seed=1)


@pytest.fixture(scope="module")
def shifted() -> pd.DataFrame:
    return binary(20_000, 0.5, seed=2)


@pytest.mark.parametrize("metric", ["roc_auc", "f1"])
def test_shifted_window_is_estimated_within_0_03_of_labels_held_back(
    reference: pd.DataFrame, shifted: pd.DataFrame, metric: str
) -> None:
    est = estimate_performance(reference, shifted.drop(columns="y"), target="y", metric=metric, score="score")
    truth = realised_metric(shifted, target="y", metric=metric, score="score")
    assert est.reference - truth > 0.1  # the shift matters: repeating the reference would miss by > 0.1
    assert abs(est.estimated - truth) < 0.03
    assert est.calibrated is True  # the scores are overconfident: isotonic calibration is applied
    assert est.alert and all(c.alert for c in est.chunks)
    assert est.realised is None and all(c.realised is None for c in est.chunks)


def test_an_unshifted_window_raises_no_alert_and_its_labels_fall_in_the_bands(reference: pd.DataFrame) -> None:
    same = binary(20_000, 1.0, seed=3)
    est = estimate_performance(reference, same, target="y", metric="roc_auc", score="score", chunk_size=2_000)
    assert not est.alert and len(est.chunks) == 10
    assert abs(est.estimated - est.reference) < 0.01
    inside = [c.lower <= c.realised <= c.upper for c in est.chunks if c.realised is not None]
    assert len(inside) == 10 and sum(inside) >= 9


@pytest.mark.parametrize("metric", ["precision", "recall", "accuracy"])
def test_the_other_binary_metrics_follow_the_labels(
    reference: pd.DataFrame, shifted: pd.DataFrame, metric: str
) -> None:
    est = estimate_performance(reference, shifted.drop(columns="y"), target="y", metric=metric, score="score")
    assert abs(est.estimated - realised_metric(shifted, target="y", metric=metric, score="score")) < 0.03


def test_realised_values_are_on_the_raw_scores_chunk_by_chunk(reference: pd.DataFrame, shifted: pd.DataFrame) -> None:
    """The labels of the current window fill ``realised``: ROC AUC of the raw scores, not the calibrated ones."""
    est = estimate_performance(reference, shifted, target="y", metric="roc_auc", score="score", chunk_size=5_000)
    for c in est.chunks:
        part = shifted.iloc[c.start : c.end]
        assert c.realised == pytest.approx(realised_metric(part, target="y", metric="roc_auc", score="score"))
    assert est.realised == pytest.approx(realised_metric(shifted, target="y", metric="roc_auc", score="score"))


def test_rank_statistic_matches_the_pairwise_definition() -> None:
    g = np.random.default_rng(0)
    frame = pd.DataFrame({"y": g.integers(0, 2, 300), "score": np.round(g.random(300), 1)})  # many ties
    pos, neg = frame.score[frame.y == 1].to_numpy(), frame.score[frame.y == 0].to_numpy()
    pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert realised_metric(frame, target="y", metric="roc_auc", score="score") == pytest.approx(pairs)


def test_partly_labelled_window_reports_realised_on_the_labelled_rows(
    reference: pd.DataFrame, shifted: pd.DataFrame
) -> None:
    partly = shifted.astype({"y": float})
    partly.loc[partly.index[::2], "y"] = np.nan
    est = estimate_performance(reference, partly, target="y", metric="f1", score="score")
    labelled = shifted.iloc[1::2]
    assert est.realised == pytest.approx(realised_metric(labelled, target="y", metric="f1", score="score"))


@pytest.mark.parametrize("metric", ["roc_auc", "f1", "accuracy"])
def test_multiclass_shifted_window_within_0_03(metric: str) -> None:
    ref, cur = multiclass(15_000, 1.0, seed=4), multiclass(15_000, 0.5, seed=5)
    est = estimate_performance(ref, cur.drop(columns="y"), target="y", metric=metric, score=SCORES)
    truth = realised_metric(cur, target="y", metric=metric, score=SCORES)
    assert est.reference - truth > 0.08
    assert abs(est.estimated - truth) < 0.03


def test_multiclass_columns_by_name_or_in_label_order_agree() -> None:
    ref, cur = multiclass(6_000, 1.0, seed=6), multiclass(4_000, 0.7, seed=7)
    ordered = estimate_performance(ref, cur, target="y", metric="roc_auc", score=SCORES)
    named = dict(zip(reversed(CLASSES), reversed(SCORES), strict=True))
    by_name = estimate_performance(ref, cur, target="y", metric="roc_auc", score=named)
    assert by_name.estimated == pytest.approx(ordered.estimated)
    assert by_name.realised == pytest.approx(ordered.realised)


@pytest.mark.parametrize("metric", ["mae", "rmse"])
def test_regression_loss_is_estimated_within_5_percent_of_held_back_labels(metric: str) -> None:
    ref, cur = regression(6_000, 0.0, seed=8), regression(6_000, 1.0, seed=9)
    est = estimate_performance(ref, cur.drop(columns="y"), target="y", metric=metric, prediction="pred")
    truth = realised_metric(cur, target="y", metric=metric, prediction="pred")
    assert truth / est.reference > 1.2  # the loss grew by a fifth: the estimate must see it
    assert abs(est.estimated - truth) / truth < 0.05
    assert est.alert and est.kind == "regression" and est.calibrated is None
    assert all(c.lower <= c.estimated <= c.upper for c in est.chunks)


def test_regression_handles_categories_and_missing_values() -> None:
    ref, cur = regression(4_000, 0.0, seed=10), regression(4_000, 0.5, seed=11)
    for frame in (ref, cur):
        frame["segment"] = np.where(frame.x1 > 0, "high", "low")
        frame.loc[frame.index[::50], "x2"] = np.nan
    est = estimate_performance(
        ref, cur.drop(columns="y"), target="y", metric="mae", prediction="pred", features=["x0", "x2", "segment"]
    )
    truth = realised_metric(cur, target="y", metric="mae", prediction="pred")
    assert abs(est.estimated - truth) / truth < 0.05


def _bad(reference: pd.DataFrame, current: pd.DataFrame, **kwargs: object) -> str:
    with pytest.raises(ParameterError) as err:
        estimate_performance(reference, current, **kwargs)  # type: ignore[arg-type]
    return str(err.value)


def test_bad_arguments_name_the_parameter_and_the_fix(reference: pd.DataFrame) -> None:
    cur = reference.iloc[:1_000]
    assert "target 'label' is not a column of the reference" in _bad(
        reference, cur, target="label", metric="f1", score="score"
    )
    assert "metric 'auc' is not a metric: use one of roc_auc" in _bad(reference, cur, target="y", metric="auc")
    assert "chunk_size 5000 is larger than the current data (1000 rows)" in _bad(
        reference, cur, target="y", metric="f1", score="score", chunk_size=5_000
    )
    assert "estimates a classifier: name its probability column(s) with score" in _bad(
        reference, cur, target="y", metric="f1"
    )
    assert "fewer than two chunks of 1000 to set the threshold on: give chunk_size 750 or less" in _bad(
        reference.iloc[:1_500], cur, target="y", metric="f1", score="score", chunk_size=1_000
    )
    assert "has no row of class 1 in the reference data" in _bad(
        reference.assign(y=0), cur, target="y", metric="roc_auc", score="score"
    )
    assert "the current data has no rows" in _bad(reference, cur.iloc[:0], target="y", metric="f1", score="score")
    assert "name its prediction column with prediction" in _bad(reference, cur, target="y", metric="mae")


def test_realised_metric_on_a_whole_labelled_table(reference: pd.DataFrame) -> None:
    assert realised_metric(reference, target="y", metric="accuracy", score="score") == pytest.approx(
        float(((reference.score >= 0.5) == reference.y).mean())
    )
    assert math.isnan(realised_metric(reference.assign(y=1), target="y", metric="roc_auc", score="score"))
    reg = regression(100, 0.0, seed=17)
    errors = (reg.y - reg.pred).abs()
    reg.loc[reg.index[:10], "y"] = np.nan  # unlabelled rows are left out
    assert realised_metric(reg, target="y", metric="mae", prediction="pred") == pytest.approx(errors[10:].mean())
    mse = realised_metric(reg, target="y", metric="mse", prediction="pred")
    assert realised_metric(reg, target="y", metric="rmse", prediction="pred") == pytest.approx(math.sqrt(mse))


# --- the command --------------------------------------------------------------------------------------------

app = typer.Typer(pretty_exceptions_enable=False)
app.command("estimate")(estimate_command)
app.command("noop")(lambda: None)  # two commands, so `estimate` stays a subcommand as in the real app


def _run(*args: str) -> tuple[int, str]:
    """Exit code and output as ``gpufleet.cli.app:main`` gives them: a GpufleetError is one line and its code."""
    result = CliRunner().invoke(app, ["estimate", *args], env={"COLUMNS": "200"})
    if isinstance(result.exception, GpufleetError):
        return result.exception.exit_code, f"error: {result.exception}"
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("estimate")
    ref, cur = folder / "ref.csv", folder / "cur.csv"
    binary(6_000, 1.0, seed=12).to_csv(ref, index=False)
    binary(3_000, 0.5, seed=13).drop(columns="y").to_csv(cur, index=False)
    return ref, cur


def test_json_has_the_contract_keys(tables: tuple[Path, Path]) -> None:
    ref, cur = tables
    code, out = _run(str(ref), str(cur), "--target", "y", "--score", "score", "--metric", "roc_auc", "--json")
    data = json.loads(out)
    assert code == 0
    assert {"estimated", "lower", "upper", "chunks", "reference", "threshold", "alert", "realised"} <= set(data)
    assert data["metric"] == "roc_auc" and data["kind"] == "classification" and data["chunk_size"] == 300
    assert len(data["chunks"]) == 10
    for chunk in data["chunks"]:
        assert {"start", "end", "estimated", "lower", "upper", "alert", "realised"} <= set(chunk)
        assert chunk["lower"] <= chunk["estimated"] <= chunk["upper"] and chunk["realised"] is None
    assert data["reference"] - data["estimated"] > 0.05 and data["alert"] is True


def test_table_output_plot_and_fail_on_alert(tables: tuple[Path, Path], tmp_path: Path) -> None:
    ref, cur = tables
    plot = tmp_path / "estimate.svg"
    args = (str(ref), str(cur), "--target", "y", "--score", "score", "--metric", "f1", "--chunk-size", "1000")
    code, out = _run(*args, "--out", str(plot))
    assert code == 0 and "estimated f1 per chunk of 1,000 rows" in out and "performance alert" in out
    assert plot.read_text(encoding="utf-8").startswith("<?xml")
    assert _run(*args, "--fail-on-alert")[0] == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--target", "label", "--score", "score"], "--target 'label' is not a column of the reference data"),
        (["--target", "y", "--score", "nope"], "--score 'nope' is not a column of the reference data"),
        (["--target", "y", "--score", "score", "--metric", "auc"], "--metric 'auc' is not a metric"),
        (["--target", "y", "--score", "score", "--chunk-size", "9000"], "--chunk-size 9000 is larger than the"),
        (["--target", "y", "--score", "score", "--chunk-size", "0"], "--chunk-size 0: give a positive number"),
        (["--target", "y", "--score", "x0"], "--score 'x0' has values outside [0, 1] in the reference data"),
        (["--target", "y", "--score", "a=score,x0"], "--score a=score,x0: name every class"),
    ],
)
def test_bad_input_exits_2_with_one_line(tables: tuple[Path, Path], args: list[str], expected: str) -> None:
    ref, cur = tables
    metric = [] if "--metric" in args else ["--metric", "roc_auc"]
    code, out = _run(str(ref), str(cur), *args, *metric)
    assert code == 2 and expected in out and len(out.strip().splitlines()) == 1, out


def test_nan_scores_and_a_non_binary_target_exit_2(tmp_path: Path) -> None:
    ref, cur = tmp_path / "ref.csv", tmp_path / "cur.csv"
    frame = binary(2_000, 1.0, seed=14)
    frame.to_csv(ref, index=False)
    frame.assign(score=frame.score.where(frame.index % 7 != 3)).to_csv(cur, index=False)
    code, out = _run(str(ref), str(cur), "--target", "y", "--score", "score", "--metric", "f1")
    assert code == 2 and "--score 'score' has 286 missing or non-numeric value(s) in the current data" in out
    frame.assign(y=frame.index % 3).to_csv(ref, index=False)
    code, out = _run(str(ref), str(ref), "--target", "y", "--score", "score", "--metric", "f1")
    assert code == 2 and "a binary metric needs labels 0 and 1; give one probability column per class in --score" in out


def test_split_scores() -> None:
    assert split_scores(["p"]) == "p"
    assert split_scores(["p_a,p_b", "p_c"]) == ["p_a", "p_b", "p_c"]
    assert split_scores(["a=p_a", "b=p_b"]) == {"a": "p_a", "b": "p_b"}
    assert split_scores(None) is None
    with pytest.raises(UsageError, match="write CLASS=COLUMN"):
        split_scores(["a="])


def test_every_classification_metric_runs_on_multiclass_data() -> None:
    ref, cur = multiclass(3_000, 1.0, seed=15), multiclass(2_000, 1.0, seed=16)
    for metric in METRICS_CLASSIFICATION:
        est = estimate_performance(ref, cur, target="y", metric=metric, score=SCORES, prediction=None)
        assert abs(est.estimated - est.realised) < 0.05, metric  # type: ignore[operator]
