"""A model's performance on a window whose labels have not arrived: estimated from its outputs.

Both methods assume covariate shift only: the inputs' distribution moves, P(y | X) does not. A
concept shift (the same inputs now meaning other labels) is invisible to them.

- Classification, CBPE (confidence-based performance estimation, NannyML's method): a calibrated
  probability ``p`` is the chance the row is positive, so every confusion-matrix cell has an
  expected count (TP = the sum of ``p`` over the rows predicted positive, FP = the sum of ``1 - p``
  there, ...) and every metric an expected value. ROC AUC is the Mann-Whitney statistic with each
  row counted as ``p`` of a positive and ``1 - p`` of a negative, rows ranked by the raw score.
  The reference's scores are calibrated by isotonic regression where five-fold cross-fitting shows
  it lowers the expected calibration error (10 equal-count bins of the raw score); otherwise they
  are used as they are. Multiclass: one-vs-rest per class (each class calibrated on its own, rows
  renormalised to sum to 1), macro-averaged; accuracy is the mean probability of the predicted class.
- Regression, DLE (direct loss estimation): a "nanny" model learns the reference's per-row loss
  (``|y - prediction|`` for MAE, its square for MSE and RMSE) from the features and the
  prediction; a chunk's estimate is the mean of its predicted losses (RMSE: the square root of the
  mean). The nanny is :class:`_Nanny`, gradient-boosted trees like NannyML's LightGBM.

Realised metrics are computed on the raw scores, never the calibrated ones (NannyML issue #98 did
the latter). Each chunk's sampling band is the estimate +- 3 standard errors of the metric on a
chunk of its size (Hanley and McNeil 1982 for ROC AUC, binomial for the ratios, the delta method
for F1 and RMSE, the reference's loss spread for MAE and MSE); its threshold is the reference's
realised metric over chunks of the same size, mean -+ 3 standard deviations, on the side where
performance is worse (below for a score, above for a loss).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufleet.errors import ParameterError

if TYPE_CHECKING:
    import pandas as pd
    from numpy.typing import NDArray

    Floats = NDArray[np.float64]
    Ints = NDArray[np.intp]

METRICS_CLASSIFICATION = ("roc_auc", "f1", "precision", "recall", "accuracy")
METRICS_REGRESSION = ("mae", "mse", "rmse")
BAND_ERRORS = 3.0
"""The sampling band is the estimate +- this many standard errors (NannyML's width, ~99.7% if normal)."""
THRESHOLD_STDS = 3.0
"""The alert threshold: the reference chunks' realised mean, this many standard deviations towards worse."""
DEFAULT_CHUNKS = 10
"""Without a chunk size, the current window is cut into this many chunks (NannyML's default)."""
CALIBRATION_FOLDS = 5
MAX_CLASSES = 100


@dataclass(frozen=True)
class ChunkEstimate:
    """One chunk of the current window: rows ``start`` to ``end`` (exclusive), its estimate and band."""

    start: int
    end: int
    estimated: float
    lower: float
    upper: float
    alert: bool
    realised: float | None
    """The metric on the chunk's labels, where the current window carries them."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PerformanceEstimate:
    """The estimate over the whole current window, per chunk, and what it is judged against.

    ``alert`` is true when the whole window's estimate or any chunk's crosses ``threshold``.
    ``calibrated`` says whether isotonic calibration was applied (to any class); ``None`` for regression.
    """

    metric: str
    kind: str
    estimated: float
    lower: float
    upper: float
    reference: float
    threshold: float
    alert: bool
    chunks: list[ChunkEstimate]
    realised: float | None
    calibrated: bool | None = None
    chunk_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object (NaN stays NaN here: the CLI writes it as ``null``)."""
        data = asdict(self)
        data["chunks"] = [c.to_dict() for c in self.chunks]
        return data


# --- metrics on soft or hard labels ---------------------------------------------------------------------------
#
# One formula serves the realised metric and the expected one: ``w`` holds the labels as one column per class,
# 0/1 when they are known, the calibrated probabilities when they are estimated.


def _auc(score: Floats, w: Floats) -> float:
    """Mann-Whitney ROC AUC of rows sorted by ``score``, each ``w`` of a positive and ``1 - w`` of a negative.

    Rows of equal score form one group; pairs within it count half.
    """
    new_group = np.empty(len(score), dtype=bool)
    new_group[:1] = True
    np.not_equal(score[1:], score[:-1], out=new_group[1:])
    starts = np.flatnonzero(new_group)
    group_pos = np.add.reduceat(w, starts)
    group_neg = np.diff(np.append(starts, len(score))) - group_pos
    below = np.cumsum(group_neg) - group_neg
    total_pos = float(group_pos.sum())
    total_neg = len(score) - total_pos
    if len(score) == 0 or total_pos <= 0 or total_neg <= 0:
        return math.nan
    return float((group_pos * (below + 0.5 * group_neg)).sum() / (total_pos * total_neg))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


def _auc_error(a: float, n_pos: float, n_neg: float) -> float:
    """Hanley and McNeil's (1982) standard error of a ROC AUC on ``n_pos`` positives and ``n_neg`` negatives."""
    if not (math.isfinite(a) and n_pos > 0 and n_neg > 0):
        return math.nan
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))


def _count_metric(metric: str, w: Floats, predicted: NDArray[np.bool_]) -> tuple[float, float]:
    """One class (one-vs-rest) from its expected confusion counts: the metric and its standard error."""
    tp = float(w[predicted].sum())
    n_pred = int(predicted.sum())
    fp, fn = n_pred - tp, float(w.sum()) - tp
    if metric == "precision":
        p = _ratio(tp, n_pred)
        return p, math.sqrt(_ratio(p * (1 - p), n_pred))
    if metric == "recall":
        r = _ratio(tp, tp + fn)
        return r, math.sqrt(_ratio(r * (1 - r), tp + fn))
    # F1 = 2q / (1 + q), q = TP / (TP + FP + FN): a binomial q over the m rows that count, by the delta method
    m = tp + fp + fn
    q = _ratio(tp, m)
    return 2 * q / (1 + q), 2 / (1 + q) ** 2 * math.sqrt(_ratio(q * (1 - q), m))


class _Side:
    """One side's classifier outputs: labels as weights per class (0/1; zero rows where unlabelled), raw scores,
    predicted classes, and each class's rows sorted by score: sorted once, then regrouped by chunk with a
    stable sort on the chunk number (a radix sort), so that every chunk's rows are a slice, still in order."""

    def __init__(self, weights: Floats, scores: Floats, predicted: Ints, labelled: NDArray[np.bool_]) -> None:
        self.weights, self.scores, self.predicted, self.labelled = weights, scores, predicted, labelled
        self.chunk_size = len(predicted)
        self._orders: dict[tuple[int, int], Ints] = {}

    def order(self, k: int) -> Ints:
        """All rows, by class ``k``'s score."""
        if (k, 0) not in self._orders:
            self._orders[(k, 0)] = np.argsort(self.scores[:, k], kind="stable")
        return self._orders[(k, 0)]

    def sorted_rows(self, k: int, a: int, b: int) -> Ints:
        """Rows ``a:b`` (the whole side, or one chunk of ``chunk_size``) by class ``k``'s score."""
        full = self.order(k)
        if a == 0 and b == len(full):
            return full
        key = (k, self.chunk_size)
        if key not in self._orders:
            chunk = full // self.chunk_size
            small = chunk.astype(np.int16) if len(full) // self.chunk_size < 2**15 else chunk
            self._orders[key] = full[np.argsort(small, kind="stable")]
        return self._orders[key][a:b]


def _metric(
    metric: str, side: _Side, w: Floats, classes: Sequence[int], a: int, b: int, *, labelled: bool = False
) -> tuple[float, float]:
    """The metric on rows ``a:b`` of ``side`` with labels ``w`` (the side's own, or calibrated probabilities),
    and its standard error; averaged over ``classes`` (``[1]`` for binary, every class for macro).

    ``labelled`` keeps only the rows with a label (a realised value on a partly labelled window).
    """
    labelled = labelled and not side.labelled[a:b].all()
    rows: slice | Ints = a + np.flatnonzero(side.labelled[a:b]) if labelled else slice(a, b)
    n = len(rows) if labelled else b - a  # type: ignore[arg-type]
    if n == 0:
        return math.nan, math.nan
    if metric == "accuracy":
        acc = float(np.take_along_axis(w[rows], side.predicted[rows][:, None], axis=1).mean())
        return acc, math.sqrt(acc * (1 - acc) / n)
    parts = []
    for k in classes:
        if metric == "roc_auc":
            order = side.sorted_rows(k, a, b)
            if labelled:
                order = order[side.labelled[order]]
            pos = w[order, k]
            auc = _auc(side.scores[order, k], pos)
            n_pos = float(pos.sum())
            parts.append((auc, _auc_error(auc, n_pos, len(order) - n_pos)))
        else:
            parts.append(_count_metric(metric, w[rows, k], side.predicted[rows] == k))
    value = float(np.mean([v for v, _ in parts]))
    return value, math.sqrt(sum(e * e for _, e in parts)) / len(parts)


# --- calibration --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Isotonic:
    """A fitted isotonic map: the distinct reference scores and their calibrated probabilities."""

    x: Floats
    y: Floats

    @classmethod
    def fit(cls, sorted_score: Floats, sorted_label: Floats) -> _Isotonic:
        """Pool-adjacent-violators (scipy's) on the distinct scores, each weighted by its count."""
        from scipy.optimize import isotonic_regression

        new = np.empty(len(sorted_score), dtype=bool)
        new[:1] = True
        np.not_equal(sorted_score[1:], sorted_score[:-1], out=new[1:])
        if new.all():  # distinct scores (the usual case): nothing to pool before the fit
            x, y = sorted_score, isotonic_regression(sorted_label).x
        else:
            starts = np.flatnonzero(new)
            counts = np.diff(np.append(starts, len(sorted_score))).astype(float)
            means = np.add.reduceat(sorted_label, starts) / counts
            x, y = sorted_score[starts], isotonic_regression(means, weights=counts).x
        # The fit is a staircase: its first and last point per step define the same interpolation, in a table
        # a hundred times shorter to search.
        edge = np.ones(len(y), dtype=bool)
        edge[1:-1] = (y[1:-1] != y[:-2]) | (y[1:-1] != y[2:])
        return cls(x[edge], np.asarray(y[edge], dtype=float))

    def __call__(self, score: Floats) -> Floats:
        """Linear between the fitted points, clipped to the ends (as scikit-learn's ``out_of_bounds="clip"``)."""
        return np.interp(score, self.x, self.y)


def _ece(prob: Floats, label: Floats, bins: int = 10) -> float:
    """Expected calibration error over ``bins`` equal-count bins of the rows in their given order."""
    edges = np.linspace(0, len(prob), bins + 1).astype(int)
    return float(
        sum(
            abs(float(prob[i:j].mean()) - float(label[i:j].mean())) * (j - i)
            for i, j in itertools.pairwise(edges)
            if j > i
        )
        / len(prob)
    )


def _calibrator(score: Floats, label: Floats, order: Ints, seed: int = 0) -> _Isotonic | None:
    """An isotonic map when cross-fitting says it helps (lower ECE out of fold), else ``None``.

    ``order`` sorts ``score``. Folds are stratified: each class's rows are dealt round-robin in a random order.
    Every fit reuses the one sort (a subset of a sorted array stays sorted), and both ECEs bin the rows by
    their raw score, so that the two errors are measured on the same bins.
    """
    if label.min() == label.max():
        return None
    rng = np.random.default_rng(seed)
    fold = np.empty(len(label), dtype=np.int64)
    for value in (0.0, 1.0):
        members = np.flatnonzero(label == value)
        fold[rng.permutation(members)] = np.arange(len(members)) % CALIBRATION_FOLDS
    s, y, f = score[order], label[order], fold[order]
    out_of_fold = np.empty(len(s))
    for k in range(CALIBRATION_FOLDS):
        held = f == k
        out_of_fold[held] = _Isotonic.fit(s[~held], y[~held])(s[held])
    if _ece(out_of_fold, y) >= _ece(s, y):
        return None
    return _Isotonic.fit(s, y)


# --- the nanny model (DLE) ------------------------------------------------------------------------------------


BINS = 256
"""Histogram bins per feature: up to 255 for values, the last for missing (or, categorical, rare or unseen)."""


def _bin_codes(reference: Any, current: Any) -> tuple[NDArray[np.uint8], NDArray[np.uint8], bool]:
    """One column of each side as bin codes (quantile bins of the reference), and whether it is categorical."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(reference) and pd.api.types.is_numeric_dtype(current):
        ref = reference.to_numpy(dtype=float, na_value=np.nan)
        cur = current.to_numpy(dtype=float, na_value=np.nan)
        finite = np.sort(ref[np.isfinite(ref)])
        distinct = finite[np.r_[True, finite[1:] != finite[:-1]]] if len(finite) else finite
        if len(distinct) <= BINS - 1:
            edges = (distinct[1:] + distinct[:-1]) / 2
        else:
            edges = np.unique(finite[np.linspace(0, len(finite) - 1, BINS)[1:-1].astype(int)])

        def code(x: Floats) -> NDArray[np.uint8]:
            c = np.searchsorted(edges, x, side="right")
            c[~np.isfinite(x)] = BINS - 1
            return c.astype(np.uint8)

        return code(ref), code(cur), False
    ref_s = reference.astype(str).where(reference.notna(), "")
    cur_s = current.astype(str).where(current.notna(), "")
    top = ref_s.value_counts().index[: BINS - 1]
    lookup = {v: i for i, v in enumerate(top)}
    return (
        ref_s.map(lookup).fillna(BINS - 1).to_numpy(dtype=np.uint8),
        cur_s.map(lookup).fillna(BINS - 1).to_numpy(dtype=np.uint8),
        True,
    )


@dataclass
class _Leaf:
    """A leaf while a tree grows: its rows, their residuals' histogram (sum and count per feature and bin)."""

    rows: Ints
    grad: Floats
    count: Floats
    gain: float = -math.inf
    feature: int = -1
    goes_left: NDArray[np.bool_] | None = None
    """Which bins of ``feature`` go to the left child, for the best split found; ``None``: no split gains."""


_Tree = tuple["Ints", "NDArray[np.bool_]", "Ints", "Ints", "Floats"]
"""A grown tree as arrays over its nodes: feature, left-going bins, left child, right child (-1 at a leaf), value."""


class _Nanny:
    """Gradient-boosted regression trees on histogram bins, grown leaf-wise (best gain first), squared error.

    LightGBM's defaults where they shape a mean: 31 leaves, at least 20 rows a leaf, 255 bins, boosting from
    the mean. Categories split as LightGBM's do: ordered by their mean residual, then cut like a number.
    Half as many steps, twice as large, as LightGBM's 100 x 0.1 (``rounds`` x ``rate``) halve the time; on
    the data of ``bench/estimate_vs_nannyml.py`` the chunks' estimates stay within 0.002 of NannyML's
    (30 x 0.3: 0.005). Why trees and not an additive model: a regressor's error usually grows with
    interactions (a price error with the product of a car's age and its price); an additive model on binned
    features missed the shifted chunks of NannyML's car-price data badly, where trees followed them.
    """

    def __init__(self, *, rounds: int = 50, rate: float = 0.2, leaves: int = 31, min_rows: int = 20) -> None:
        self.rounds, self.rate, self.leaves, self.min_rows = rounds, rate, leaves, min_rows
        self.base = 0.0
        self.trees: list[_Tree] = []
        self._columns: list[NDArray[np.uint8]] = []
        self._categorical = np.zeros(0, dtype=bool)

    def fit(self, codes: NDArray[np.uint8], target: Floats, categorical: Sequence[bool]) -> _Nanny:
        """Grow ``rounds`` trees on the bin codes (rows x features) to predict ``target``."""
        self._columns = [np.ascontiguousarray(codes[:, j]) for j in range(codes.shape[1])]
        self._categorical = np.asarray(categorical, dtype=bool)
        self.base = float(target.mean())
        fitted = np.full(len(target), self.base)
        everyone = np.arange(len(target))
        root_count = np.stack([np.bincount(c, minlength=BINS) for c in self._columns]).astype(float)
        for _ in range(self.rounds):
            residual = target - fitted
            root_grad = np.stack([np.bincount(c, weights=residual, minlength=BINS) for c in self._columns], dtype=float)
            self.trees.append(self._grow(_Leaf(everyone, root_grad, root_count), residual, fitted))
        self._columns = []
        return self

    def predict(self, codes: NDArray[np.uint8]) -> Floats:
        """The predicted target of each row of ``codes``: its rows routed down every tree."""
        columns = [np.ascontiguousarray(codes[:, j]) for j in range(codes.shape[1])]
        out = np.full(codes.shape[0], self.base)
        for feature, goes_left, left, right, value in self.trees:
            stack = [(0, np.arange(codes.shape[0]))]
            while stack:
                node, rows = stack.pop()
                if left[node] < 0:
                    out[rows] += value[node]
                    continue
                go = goes_left[node][columns[feature[node]][rows]]
                stack += [(int(left[node]), rows[go]), (int(right[node]), rows[~go])]
        return out

    def _histogram(self, rows: Ints, residual: Floats) -> tuple[Floats, Floats]:
        r = residual[rows]
        picked = [c[rows] for c in self._columns]
        grad = np.stack([np.bincount(c, weights=r, minlength=BINS) for c in picked], dtype=float)
        return grad, np.stack([np.bincount(c, minlength=BINS) for c in picked]).astype(float)

    def _find_splits(self, leaves: Sequence[_Leaf], grad: Floats, count: Floats) -> None:
        """Each leaf's split with the largest drop in squared error; categories ordered by mean residual first.

        ``grad`` and ``count`` are the leaves' histograms stacked (leaves x features x bins).
        """
        total_g = grad[:, 0].sum(axis=1)[:, None, None]
        total_n = np.array([len(f.rows) for f in leaves], dtype=float)[:, None, None]
        cat = self._categorical
        order = None
        if cat.any():
            mean = np.where(count[:, cat] > 0, grad[:, cat] / np.maximum(count[:, cat], 1), np.inf)
            order = np.argsort(mean, axis=2, kind="stable")
            grad, count = grad.copy(), count.copy()
            grad[:, cat] = np.take_along_axis(grad[:, cat], order, axis=2)
            count[:, cat] = np.take_along_axis(count[:, cat], order, axis=2)
        g_left, n_left = np.cumsum(grad, axis=2), np.cumsum(count, axis=2)
        n_right = total_n - n_left
        gain = g_left**2 / np.maximum(n_left, 1) + (total_g - g_left) ** 2 / np.maximum(n_right, 1)
        gain[(n_left < self.min_rows) | (n_right < self.min_rows)] = -np.inf
        flat = gain.reshape(len(leaves), -1)
        best = flat.argmax(axis=1)
        for i, leaf in enumerate(leaves):
            feature, cut = divmod(int(best[i]), BINS)
            leaf.gain = float(flat[i, best[i]] - total_g[i, 0, 0] ** 2 / total_n[i, 0, 0])
            if not (math.isfinite(leaf.gain) and leaf.gain > 0):
                continue
            leaf.feature = feature
            if order is not None and cat[feature]:
                leaf.goes_left = np.zeros(BINS, dtype=bool)
                leaf.goes_left[order[i, int(cat[:feature].sum()), : cut + 1]] = True
            else:
                leaf.goes_left = np.arange(BINS) <= cut

    def _grow(self, root: _Leaf, residual: Floats, fitted: Floats) -> _Tree:
        """One tree: split the leaf with the best gain until ``leaves``; add its values to ``fitted``."""
        nodes, children, open_leaves = [root], {}, [0]
        self._find_splits([root], root.grad[None], root.count[None])
        while len(open_leaves) < self.leaves:
            i = max(open_leaves, key=lambda k: nodes[k].gain)
            parent = nodes[i]
            if parent.goes_left is None:
                break
            go = parent.goes_left[self._columns[parent.feature][parent.rows]]
            halves = (parent.rows[go], parent.rows[~go])
            small = 0 if len(halves[0]) <= len(halves[1]) else 1
            grad, count = np.empty((2, *parent.grad.shape)), np.empty((2, *parent.grad.shape))
            grad[small], count[small] = self._histogram(halves[small], residual)  # the larger half by subtraction
            np.subtract(parent.grad, grad[small], out=grad[1 - small])
            np.subtract(parent.count, count[small], out=count[1 - small])
            pair = [_Leaf(halves[h], grad[h], count[h]) for h in (0, 1)]
            self._find_splits(pair, grad, count)
            children[i] = (len(nodes), len(nodes) + 1)
            open_leaves.remove(i)
            open_leaves += children[i]
            nodes += pair
            parent.grad = parent.count = np.empty(0)  # not needed again
        size = len(nodes)
        feature, left, right = (np.full(size, -1, dtype=np.intp) for _ in range(3))
        goes_left, value = np.zeros((size, BINS), dtype=bool), np.zeros(size)
        for i, (a, b) in children.items():
            feature[i], left[i], right[i] = nodes[i].feature, a, b
            goes_left[i] = nodes[i].goes_left
        for i in open_leaves:
            value[i] = self.rate * float(residual[nodes[i].rows].mean())
            fitted[nodes[i].rows] += value[i]
        return feature, goes_left, left, right, value


# --- reading the frames ---------------------------------------------------------------------------------------


def _names(frame: pd.DataFrame) -> str:
    names = [str(c) for c in frame.columns]
    return ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")


def _require(frame: pd.DataFrame, side: str, param: str, column: str) -> pd.Series:
    if column not in frame.columns:
        raise ParameterError(
            f"{{{param}:name}} {{{param}!r}} is not a column of the {side} data: its columns are {{columns!s}}",
            **{param: column},
            columns=_names(frame),
        )
    return frame[column]


def _numbers(series: pd.Series, side: str, param: str, *, unit: bool = False) -> Floats:
    """A column as finite floats; missing or non-numeric values are refused, naming the column and the fix."""
    import pandas as pd

    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    bad = ~np.isfinite(values)
    if bad.any():
        raise ParameterError(
            f"{{{param}:name}} {{{param}!r}} has {{bad!s}} missing or non-numeric value(s) in the {side} data "
            f"(row {{row!s}} first): drop or fill those rows",
            **{param: str(series.name)},
            bad=int(bad.sum()),
            row=int(np.flatnonzero(bad)[0]),
        )
    if unit and ((values < 0) | (values > 1)).any():
        raise ParameterError(
            f"{{{param}:name}} {{{param}!r}} has values outside [0, 1] in the {side} data: give the model's "
            "probabilities (apply the sigmoid or softmax to raw margins)",
            **{param: str(series.name)},
        )
    return values


def _chunk_bounds(rows: int, size: int) -> list[tuple[int, int]]:
    """Consecutive chunks of ``size`` rows; the last one keeps the remainder."""
    return [(start, min(start + size, rows)) for start in range(0, rows, size)]


class _Classification:
    """The reference and current sides of a classifier: classes, raw scores, predicted classes, labels."""

    def __init__(
        self,
        reference: pd.DataFrame,
        current: pd.DataFrame | None,
        target: str,
        score: str | Sequence[str] | Mapping[Any, str],
        prediction: str | None,
    ) -> None:
        ref_target = _require(reference, "reference", "target", target)
        if ref_target.isna().any():
            raise ParameterError(
                "{target:name} {target!r} has missing labels in the reference data: the reference needs every "
                "label; drop those rows",
                target=target,
            )
        self.binary = isinstance(score, str)
        self.classes, columns = self._classes(ref_target, target, score)
        self.reference = self._side(reference, "reference", columns, prediction, ref_target)
        self.current = self.reference
        if current is not None:
            cur_target = current[target] if target in current.columns else None
            self.current = self._side(current, "current", columns, prediction, cur_target)
        self.calibrators: list[_Isotonic | None] = []

    def _classes(self, labels: pd.Series, target: str, score: Any) -> tuple[list[str], list[str]]:
        found = sorted(labels.unique().tolist(), key=_label_key)
        if isinstance(score, str):
            if not set(found) <= {0, 1}:
                shown = ", ".join(map(str, found[:5])) + (", ..." if len(found) > 5 else "")
                fix = (
                    "give one probability column per class in {score:name} for a multiclass model"
                    if len(found) > 2
                    else "map the positive class to 1 and the other to 0"
                )
                raise ParameterError(
                    f"{{target:name}} {{target!r}} has labels {shown}: a binary metric needs labels 0 and 1; {fix}",
                    target=target,
                    score=score,
                )
            return ["0", "1"], [score]
        if isinstance(score, Mapping):
            classes, columns = [str(k) for k in score], [str(v) for v in score.values()]
        else:
            columns = list(score)
            classes = [_label_text(v) for v in found]
            if len(columns) != len(classes):
                raise ParameterError(
                    "{score:name} names {given!s} columns but {target:name} {target!r} has {n!s} classes "
                    "({shown!s}): give one probability column per class, in that order, or CLASS=COLUMN",
                    score=",".join(columns),
                    given=len(columns),
                    target=target,
                    n=len(classes),
                    shown=", ".join(classes[:10]),
                )
        if len(classes) < 2 or len(classes) > MAX_CLASSES or len(set(classes)) != len(classes):
            raise ParameterError(
                "{score:name} gives {n!s} classes: give 2 to {most!s} distinct ones",
                score=",".join(columns),
                n=len(classes),
                most=MAX_CLASSES,
            )
        unknown = sorted({_label_text(v) for v in found} - set(classes))
        if unknown:
            raise ParameterError(
                "{target:name} {target!r} has label {label!r} in the reference data, which no {score:name} "
                "column is for: the classes are {shown!s}",
                target=target,
                label=unknown[0],
                score=",".join(columns),
                shown=", ".join(classes),
            )
        return classes, columns

    def _codes(self, labels: pd.Series, side: str, param: str) -> Ints:
        """Class indices of ``labels``; -1 where missing (only the current side may lack labels)."""
        if self.binary:
            import pandas as pd

            values = pd.to_numeric(labels, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            known = np.isfinite(values)
            bad = known & ~np.isin(values, (0.0, 1.0))
            codes = np.where(known, values, -1).astype(np.intp)
            unknown_text = labels[~known & labels.notna()]
            odd = bad.any() or len(unknown_text) > 0
        else:
            import pandas as pd

            index = {c: i for i, c in enumerate(self.classes)}
            found, distinct = pd.factorize(labels)  # missing -> -1, which indexes the -1 appended last
            lookup = np.array([index.get(_label_text(v), -2) for v in distinct] + [-1], dtype=np.intp)
            codes = lookup[found]
            odd = bool((codes == -2).any())
        if odd:
            raise ParameterError(
                f"{{{param}:name}} {{{param}!r}} has a label in the {side} data that is not a class "
                f"({', '.join(self.classes[:10])}): fix the column or the class list",
                **{param: str(labels.name)},
            )
        return codes

    def _side(
        self, frame: pd.DataFrame, side: str, columns: list[str], prediction: str | None, labels: pd.Series | None
    ) -> _Side:
        raw = np.column_stack(
            [_numbers(_require(frame, side, "score", c), side, "score", unit=self.binary) for c in columns]
        )
        if self.binary:
            raw = np.column_stack([1.0 - raw[:, 0], raw[:, 0]])
        if prediction is None:
            predicted = np.argmax(raw, axis=1) if not self.binary else (raw[:, 1] >= 0.5).astype(np.intp)
        else:
            predicted = self._codes(_require(frame, side, "prediction", prediction), side, "prediction")
            if (predicted < 0).any():
                raise ParameterError(
                    "{prediction:name} {prediction!r} has missing values in the " + side + " data: drop those rows",
                    prediction=prediction,
                )
        codes = np.full(len(frame), -1, dtype=np.intp) if labels is None else self._codes(labels, side, "target")
        labelled = codes >= 0
        weights = np.zeros_like(raw)
        weights[np.flatnonzero(labelled), codes[labelled]] = 1.0
        return _Side(weights, raw, predicted, labelled)

    def calibrate(self) -> Floats:
        """The current side's calibrated probabilities (one column per class; rows sum to 1)."""
        ref = self.reference
        wanted = [1] if self.binary else range(len(self.classes))
        self.calibrators = [None] * len(self.classes)
        probs = self.current.scores.copy()
        for k in wanted:
            self.calibrators[k] = _calibrator(ref.scores[:, k], ref.weights[:, k], ref.order(k))
            if self.calibrators[k] is not None:
                probs[:, k] = self.calibrators[k](self.current.scores[:, k])  # type: ignore[misc]
        if self.binary:
            probs[:, 0] = 1.0 - probs[:, 1]
        else:
            total = probs.sum(axis=1, keepdims=True)
            probs = np.divide(probs, total, out=np.full_like(probs, 1 / len(self.classes)), where=total > 0)
        return probs

    @property
    def averaged(self) -> list[int]:
        return [1] if self.binary else list(range(len(self.classes)))


def _label_key(value: Any) -> tuple[int, Any]:
    """Numbers before text, each in its own order, so mixed labels still sort."""
    if isinstance(value, bool | int | float | np.integer | np.floating):
        return (0, float(value))
    return (1, str(value))


def _label_text(value: Any) -> str:
    """A label as text, the same whatever the column's type: ``1``, ``1.0`` (a column with gaps) -> ``"1"``."""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


# --- the estimate ---------------------------------------------------------------------------------------------


def _check_metric(metric: str, score: Any, prediction: str | None) -> str:
    if metric in METRICS_CLASSIFICATION:
        if score is None or (not isinstance(score, str) and len(score) == 0):
            raise ParameterError(
                "{metric!s} estimates a classifier: name its probability column(s) with {score:name}",
                metric=metric,
                score=None,
            )
        return "classification"
    if metric in METRICS_REGRESSION:
        if prediction is None:
            raise ParameterError(
                "{metric!s} estimates a regressor: name its prediction column with {prediction:name}",
                metric=metric,
                prediction=None,
            )
        return "regression"
    raise ParameterError(
        "{metric:name} {metric!r} is not a metric: use one of {known!s}",
        metric=metric,
        known=", ".join(METRICS_CLASSIFICATION + METRICS_REGRESSION),
    )


def _chunk_size(chunk_size: int | None, reference_rows: int, current_rows: int) -> int:
    if current_rows == 0:
        raise ParameterError("the current data has no rows: give a window with rows to estimate")
    size = math.ceil(current_rows / DEFAULT_CHUNKS) if chunk_size is None else chunk_size
    if size < 1:
        raise ParameterError("{chunk_size:name} {chunk_size!s}: give a positive number of rows", chunk_size=size)
    if size > current_rows:
        raise ParameterError(
            "{chunk_size:name} {chunk_size!s} is larger than the current data ({rows!s} rows): give at most {rows!s}",
            chunk_size=size,
            rows=current_rows,
        )
    if reference_rows < 2 * size:
        raise ParameterError(
            "the reference data has {rows!s} rows, fewer than two chunks of {chunk_size!s} to set the threshold "
            "on: give {chunk_size:name} {most!s} or less, or a larger reference",
            rows=reference_rows,
            chunk_size=size,
            most=max(reference_rows // 2, 1),
        )
    return size


def _threshold(values: list[float], lower_is_worse: bool, bounds: tuple[float, float]) -> float:
    finite = np.asarray([v for v in values if math.isfinite(v)])
    if len(finite) == 0:
        return math.nan
    shift = THRESHOLD_STDS * float(finite.std())
    edge = float(finite.mean()) - shift if lower_is_worse else float(finite.mean()) + shift
    return min(max(edge, bounds[0]), bounds[1])


def _finish(
    metric: str,
    kind: str,
    overall: tuple[float, float, float | None],
    chunks: list[tuple[int, int, float, float, float | None]],
    reference: float,
    threshold: float,
    bounds: tuple[float, float],
    calibrated: bool | None,
    chunk_size: int,
) -> PerformanceEstimate:
    lower_is_worse = kind == "classification"

    def crosses(value: float) -> bool:
        if not (math.isfinite(value) and math.isfinite(threshold)):
            return False
        return value < threshold if lower_is_worse else value > threshold

    def band(value: float, error: float) -> tuple[float, float]:
        if not (math.isfinite(value) and math.isfinite(error)):
            return math.nan, math.nan
        return max(value - BAND_ERRORS * error, bounds[0]), min(value + BAND_ERRORS * error, bounds[1])

    made = []
    for start, end, value, error, realised in chunks:
        lo, hi = band(value, error)
        made.append(ChunkEstimate(start, end, value, lo, hi, crosses(value), realised))
    value, error, realised = overall
    lo, hi = band(value, error)
    alert = crosses(value) or any(c.alert for c in made)
    return PerformanceEstimate(
        metric, kind, value, lo, hi, reference, threshold, alert, made, realised, calibrated, chunk_size
    )


def _estimate_classification(
    reference: pd.DataFrame,
    current: pd.DataFrame,
    target: str,
    metric: str,
    score: Any,
    prediction: str | None,
    chunk_size: int | None,
) -> PerformanceEstimate:
    size = _chunk_size(chunk_size, len(reference), len(current))
    problem = _Classification(reference, current, target, score, prediction)
    absent = [c for c, n in zip(problem.classes, problem.reference.weights.sum(axis=0), strict=True) if n == 0]
    if absent:
        raise ParameterError(
            "{target:name} {target!r} has no row of class {absent!s} in the reference data: calibration and the "
            "threshold need rows of every class; give a reference with all of them",
            target=target,
            absent=absent[0],
        )
    probs = problem.calibrate()
    ref, cur, averaged = problem.reference, problem.current, problem.averaged
    ref.chunk_size = cur.chunk_size = size

    def estimate(a: int, b: int) -> tuple[float, float]:
        return _metric(metric, cur, probs, averaged, a, b)

    def realised(side: _Side, a: int, b: int) -> float | None:
        value = _metric(metric, side, side.weights, averaged, a, b, labelled=True)[0]
        return value if math.isfinite(value) else None

    ref_chunks = [realised(ref, a, b) for a, b in _chunk_bounds(len(reference), size) if b - a == size]
    chunks = [(a, b, *estimate(a, b), realised(cur, a, b)) for a, b in _chunk_bounds(len(current), size)]
    reference_value = realised(ref, 0, len(reference))
    return _finish(
        metric,
        "classification",
        (*estimate(0, len(current)), realised(cur, 0, len(current))),
        chunks,
        math.nan if reference_value is None else reference_value,
        _threshold([math.nan if v is None else v for v in ref_chunks], True, (0.0, 1.0)),
        (0.0, 1.0),
        any(c is not None for c in problem.calibrators),
        size,
    )


def _losses(metric: str, truth: Floats, predicted: Floats) -> Floats:
    error = truth - predicted
    return np.abs(error) if metric == "mae" else error * error


def _from_mean_loss(metric: str, mean: float, error: float) -> tuple[float, float]:
    """MAE and MSE are the mean loss; RMSE its root, whose error follows by the delta method."""
    if metric != "rmse":
        return mean, error
    root = math.sqrt(max(mean, 0.0))
    return root, _ratio(error, 2 * root)


def _estimate_regression(
    reference: pd.DataFrame,
    current: pd.DataFrame,
    target: str,
    metric: str,
    prediction: str,
    chunk_size: int | None,
    features: Sequence[str] | None,
) -> PerformanceEstimate:
    truth = _numbers(_require(reference, "reference", "target", target), "reference", "target")
    ref_pred = _numbers(_require(reference, "reference", "prediction", prediction), "reference", "prediction")
    cur_pred = _numbers(_require(current, "current", "prediction", prediction), "current", "prediction")
    size = _chunk_size(chunk_size, len(reference), len(current))
    if features is None:
        features = [c for c in reference.columns if c in current.columns and c not in (target, prediction)]
    for name in features:
        _require(reference, "reference", "features", name)
        _require(current, "current", "features", name)
    ref_losses = _losses(metric, truth, ref_pred)
    binned = [_bin_codes(reference[name], current[name]) for name in features]
    binned.append(_bin_codes(reference[prediction], current[prediction]))
    ref_codes = np.column_stack([b[0] for b in binned])
    cur_codes = np.column_stack([b[1] for b in binned])
    nanny = _Nanny().fit(ref_codes, ref_losses, [b[2] for b in binned])
    predicted_loss = np.maximum(nanny.predict(cur_codes), 0.0)
    spread = float(ref_losses.std())

    cur_truth = None
    if target in current.columns:
        import pandas as pd

        cur_truth = pd.to_numeric(current[target], errors="coerce").to_numpy(dtype=float, na_value=np.nan)

    def realised(truth_: Floats | None, pred: Floats, a: int, b: int) -> float | None:
        if truth_ is None:
            return None
        known = np.isfinite(truth_[a:b])
        if not known.any():
            return None
        return _from_mean_loss(metric, float(_losses(metric, truth_[a:b][known], pred[a:b][known]).mean()), 0.0)[0]

    def estimate(a: int, b: int) -> tuple[float, float]:
        return _from_mean_loss(metric, float(predicted_loss[a:b].mean()), spread / math.sqrt(b - a))

    ref_chunks = [realised(truth, ref_pred, a, b) for a, b in _chunk_bounds(len(reference), size) if b - a == size]
    chunks = [
        (a, b, *estimate(a, b), realised(cur_truth, cur_pred, a, b)) for a, b in _chunk_bounds(len(current), size)
    ]
    reference_value = realised(truth, ref_pred, 0, len(reference))
    return _finish(
        metric,
        "regression",
        (*estimate(0, len(current)), realised(cur_truth, cur_pred, 0, len(current))),
        chunks,
        math.nan if reference_value is None else reference_value,
        _threshold([math.nan if v is None else v for v in ref_chunks], False, (0.0, math.inf)),
        (0.0, math.inf),
        None,
        size,
    )


def estimate_performance(
    reference: pd.DataFrame,
    current: pd.DataFrame,
    *,
    target: str,
    metric: str,
    score: str | Sequence[str] | Mapping[Any, str] | None = None,
    prediction: str | None = None,
    chunk_size: int | None = None,
    features: Sequence[str] | None = None,
) -> PerformanceEstimate:
    """Estimate ``metric`` on ``current`` without its labels, from a labelled ``reference``.

    Classification: ``score`` is the probability column of class 1 (binary, labels 0/1), or one column per
    class: a list in the sorted order of the reference's labels, or a mapping label -> column. ``prediction``
    (optional) holds the predicted classes; without it, a score of 0.5 or more (binary) or the largest one
    (multiclass) is the prediction. Regression: ``prediction`` is the model's output; the nanny learns from
    ``features`` (default: every column both sides share but the target and the prediction) and the
    prediction. ``chunk_size`` defaults to a tenth of ``current``. Labels ``current`` carries fill the
    realised values. Bad columns or values raise :class:`~gpufleet.errors.ParameterError` naming the fix.
    """
    kind = _check_metric(metric, score, prediction)
    if kind == "classification":
        return _estimate_classification(reference, current, target, metric, score, prediction, chunk_size)
    assert prediction is not None  # _check_metric refused a regression metric without it
    return _estimate_regression(reference, current, target, metric, prediction, chunk_size, features)


def realised_metric(
    frame: pd.DataFrame,
    *,
    target: str,
    metric: str,
    score: str | Sequence[str] | Mapping[Any, str] | None = None,
    prediction: str | None = None,
) -> float:
    """``metric`` on the labels of ``frame``, on the raw scores (never calibrated ones); NaN when undefined.

    The columns mean what they mean for :func:`estimate_performance`; rows without a label are left out.
    """
    kind = _check_metric(metric, score, prediction)
    labelled = frame[_require(frame, "given", "target", target).notna()]
    if kind == "regression":
        assert prediction is not None
        truth = _numbers(labelled[target], "given", "target")
        pred = _numbers(_require(labelled, "given", "prediction", prediction), "given", "prediction")
        return _from_mean_loss(metric, float(_losses(metric, truth, pred).mean()) if len(truth) else math.nan, 0.0)[0]
    problem = _Classification(labelled, None, target, score, prediction)  # type: ignore[arg-type]
    side = problem.reference
    return _metric(metric, side, side.weights, problem.averaged, 0, len(side.predicted))[0]


def plot_performance(estimate: PerformanceEstimate, path: Path, *, title: str | None = None) -> str:
    """Estimated (with its band) and, where labels came, realised performance per chunk; threshold and reference."""
    from gpufleet.plotting import figure, save_figure

    fig, ax = figure(size=(9, 4.5))
    x = np.arange(1, len(estimate.chunks) + 1)
    est = [c.estimated for c in estimate.chunks]
    ax.fill_between(
        x,
        [c.lower for c in estimate.chunks],
        [c.upper for c in estimate.chunks],
        color="#4C72B0",
        alpha=0.18,
        label=f"sampling band (+-{BAND_ERRORS:g} SE)",
    )
    ax.plot(x, est, marker="o", color="#4C72B0", label="estimated")
    real = [(i, c.realised) for i, c in zip(x, estimate.chunks, strict=True) if c.realised is not None]
    if real:
        ax.plot(*zip(*real, strict=True), marker="s", ls="--", color="#55A868", label="realised")
    alerts = [(i, c.estimated) for i, c in zip(x, estimate.chunks, strict=True) if c.alert]
    if alerts:
        ax.scatter(*zip(*alerts, strict=True), s=110, facecolors="none", edgecolors="#C44E52", lw=2, label="alert")
    if math.isfinite(estimate.threshold):
        ax.axhline(estimate.threshold, color="#C44E52", ls=":", lw=1.2, label="threshold")
    if math.isfinite(estimate.reference):
        ax.axhline(estimate.reference, color="#888", ls="--", lw=1, label="reference")
    ax.set_xlabel(f"chunk ({estimate.chunk_size:,} rows)")
    ax.set_ylabel(estimate.metric)
    ax.set_xticks(x)
    ax.set_title(title or f"estimated {estimate.metric} per chunk", fontsize=10, loc="left")
    ax.legend(loc="best", fontsize=8)
    return save_figure(fig, path)


__all__ = [
    "METRICS_CLASSIFICATION",
    "METRICS_REGRESSION",
    "ChunkEstimate",
    "PerformanceEstimate",
    "estimate_performance",
    "plot_performance",
    "realised_metric",
]
