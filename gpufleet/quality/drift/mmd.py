"""Maximum mean discrepancy: a two-sample test for embeddings and other multivariate rows. No I/O.

Apart from the 1-D statistics (``columns``) because it compares whole rows, not one value per row:
an RBF kernel with the median-heuristic bandwidth (Gretton et al., JMLR 2012), its unbiased MMD^2,
and a permutation p-value. Three estimators trade exactness for memory: the full kernel matrix
(O(N^2)), random Fourier features (O(N * D)) and the linear-time estimator with a normal
approximation. The drift report uses it for embedding columns; ``quality.embeddings`` puts a
sentence encoder in front of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from gpufleet.errors import UsageError
from gpufleet.quality.drift.columns import Floats, power_of_two_scale

MmdEstimator = Literal["auto", "exact", "linear", "rff"]

EXACT_MMD_MAX_ROWS = 4000
"""Above this many pooled rows ``mmd(method="auto")`` uses random Fourier features."""


@dataclass(frozen=True, slots=True)
class MmdResult:
    """An MMD two-sample test: unbiased MMD^2 with an RBF kernel, and its p-value."""

    statistic: float
    p_value: float
    estimator: str
    bandwidth: float
    permutations: int


def _as_matrix(values: Any) -> Floats:
    arr = np.asarray(values, dtype=np.float64)
    return arr.reshape(-1, 1) if arr.ndim == 1 else arr


def median_bandwidth(x: Floats, y: Floats, rng: np.random.Generator, sample: int = 1000) -> float:
    """Gretton's median heuristic: the median pairwise distance among at most ``sample`` pooled rows."""
    total = x.shape[0] + y.shape[0]
    pick = np.arange(total) if total <= sample else np.sort(rng.choice(total, sample, replace=False))
    rows = np.vstack([x[pick[pick < x.shape[0]]], y[pick[pick >= x.shape[0]] - x.shape[0]]])
    sq = _sq_distances(rows, rows)
    upper = sq[np.triu_indices(rows.shape[0], k=1)]
    positive = upper[upper > 0]
    return float(np.sqrt(np.median(positive))) if positive.size else 1.0


def _sq_distances(a: Floats, b: Floats) -> Floats:
    sq = np.sum(a * a, axis=1)[:, None] + np.sum(b * b, axis=1)[None, :] - 2.0 * (a @ b.T)
    return np.asarray(np.maximum(sq, 0.0), dtype=np.float64)


def _assignments(
    n: int, total: int, permutations: int, rng: np.random.Generator, dtype: type[np.floating[Any]] = np.float64
) -> NDArray[Any]:
    """Row 0: the observed split (first ``n`` rows are the reference); rows 1..: random relabellings."""
    a = np.zeros((permutations + 1, total), dtype=dtype)
    a[0, :n] = 1.0
    for i in range(1, permutations + 1):
        a[i, rng.permutation(total)[:n]] = 1.0
    return a


def _unbiased(sxx: Floats, syy: Floats, sxy: Floats, n: int, m: int) -> Floats:
    return sxx / (n * (n - 1)) + syy / (m * (m - 1)) - 2.0 * sxy / (n * m)


def _permutation_p(stats_: Floats) -> float:
    """``(1 + #{permuted >= observed}) / (1 + permutations)``: never 0, valid at any permutation count."""
    return float((1 + np.sum(stats_[1:] >= stats_[0])) / stats_.size)


def _mmd_exact(x: Floats, y: Floats, bw: float, permutations: int, rng: np.random.Generator) -> tuple[float, float]:
    z = np.vstack([x, y])
    k = np.exp(-_sq_distances(z, z) / (2 * bw * bw))
    np.fill_diagonal(k, 0.0)
    a = _assignments(x.shape[0], z.shape[0], permutations, rng)
    ak = a @ k
    b = 1.0 - a
    sxx, sxy = np.sum(ak * a, axis=1), np.sum(ak * b, axis=1)
    syy = np.sum((k.sum(axis=0)[None, :] - ak) * b, axis=1)
    mmd2 = _unbiased(sxx, syy, sxy, x.shape[0], y.shape[0])
    return float(mmd2[0]), _permutation_p(mmd2)


def _mmd_rff(
    x: Floats, y: Floats, bw: float, permutations: int, rng: np.random.Generator, features: int
) -> tuple[float, float]:
    """Random Fourier features (Rahimi & Recht 2007): k(a, b) ~ phi(a) . phi(b), so every sum of
    kernel values is a dot product of feature sums and a permutation costs O(N * D), not O(N^2)."""
    w = rng.normal(scale=1.0 / bw, size=(x.shape[1], features)).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, size=features).astype(np.float32)
    phi = np.vstack([x.astype(np.float32) @ w, y.astype(np.float32) @ w])
    phi += phase
    np.cos(phi, out=phi)
    phi *= np.float32(math.sqrt(2.0 / features))
    phi -= phi.mean(axis=0, dtype=np.float64).astype(np.float32)  # MMD^2 ignores a shift; sums stay small
    norms = np.einsum("ij,ij->i", phi, phi)
    a = _assignments(x.shape[0], phi.shape[0], permutations, rng, np.float32)
    sums = (a @ np.hstack([phi, norms[:, None]])).astype(np.float64)  # one pass: feature sums and norm sums
    sx, in_x = sums[:, :-1], sums[:, -1]
    sy = phi.sum(axis=0, dtype=np.float64)[None, :] - sx
    sxx = np.sum(sx * sx, axis=1) - in_x
    syy = np.sum(sy * sy, axis=1) - (float(norms.sum(dtype=np.float64)) - in_x)
    sxy = np.sum(sx * sy, axis=1)
    mmd2 = _unbiased(sxx, syy, sxy, x.shape[0], y.shape[0])
    return float(mmd2[0]), _permutation_p(mmd2)


def _mmd_linear(x: Floats, y: Floats, bw: float, rng: np.random.Generator) -> tuple[float, float]:
    """Gretton et al. (2012, section 6) linear-time MMD^2 over disjoint pairs, with its normal p-value."""
    pairs = min(x.shape[0], y.shape[0]) // 2
    xs, ys = x[rng.permutation(x.shape[0])[: 2 * pairs]], y[rng.permutation(y.shape[0])[: 2 * pairs]]
    x1, x2, y1, y2 = xs[0::2], xs[1::2], ys[0::2], ys[1::2]

    def k(a: Floats, b: Floats) -> Floats:
        return np.asarray(np.exp(-np.sum((a - b) ** 2, axis=1) / (2 * bw * bw)), dtype=np.float64)

    h = k(x1, x2) + k(y1, y2) - k(x1, y2) - k(x2, y1)
    statistic, spread = float(h.mean()), float(h.std(ddof=1))
    if spread == 0:
        return statistic, 0.0 if statistic > 0 else 1.0
    return statistic, float(stats.norm.sf(statistic / (spread / math.sqrt(pairs))))


def mmd_test(
    ref: Any,
    cur: Any,
    *,
    permutations: int = 200,
    seed: int = 0,
    method: MmdEstimator = "auto",
    features: int = 256,
    bandwidth: float | None = None,
) -> MmdResult:
    """Maximum mean discrepancy (Gretton et al., JMLR 2012) with an RBF kernel, median-heuristic bandwidth.

    ``exact``: unbiased MMD^2 from the full kernel matrix, permutation p-value, O(N^2) memory;
    ``rff``: the same with ``features`` random Fourier features, O(N * D); ``linear``: the
    linear-time estimator with a normal approximation, no permutations. ``auto`` picks ``exact``
    up to 4,000 pooled rows, ``rff`` above.

    Rows with huge (near 1e308) or tiny entries are first scaled by a power of two
    (``columns.power_of_two_scale``): their squared distances would overflow or vanish. The RBF
    kernel with the median bandwidth does not change under that scaling, and ordinary rows are
    left as they are; the bandwidth is reported in the data's units.
    """
    x, y = _as_matrix(ref), _as_matrix(cur)
    if x.shape[1] != y.shape[1]:
        raise UsageError(f"mmd needs rows of one width: reference has {x.shape[1]}, current {y.shape[1]}")
    if min(x.shape[0], y.shape[0]) < 2:
        raise UsageError("mmd needs at least 2 rows on each side")
    rng = np.random.default_rng(seed)
    scale = power_of_two_scale(x, y)
    if scale != 1.0:
        x, y = x * scale, y * scale
    bw = bandwidth * scale if bandwidth is not None else median_bandwidth(x, y, rng)
    estimator = method
    if estimator == "auto":
        estimator = "exact" if x.shape[0] + y.shape[0] <= EXACT_MMD_MAX_ROWS else "rff"
    if estimator == "exact":
        statistic, p = _mmd_exact(x, y, bw, permutations, rng)
    elif estimator == "rff":
        statistic, p = _mmd_rff(x, y, bw, permutations, rng, features)
    elif estimator == "linear":
        statistic, p = _mmd_linear(x, y, bw, rng)
        permutations = 0
    else:
        raise UsageError(f"unknown MMD estimator {method!r}: use auto, exact, linear or rff")
    with np.errstate(over="ignore"):
        bw_units = float(np.float64(bw) / scale)
    return MmdResult(statistic, p, estimator, bw_units, permutations)


def mmd(
    ref: Any, cur: Any, *, permutations: int = 200, seed: int = 0, method: MmdEstimator = "auto"
) -> tuple[float, float]:
    """Unbiased MMD^2 and its p-value; see :func:`mmd_test`."""
    res = mmd_test(ref, cur, permutations=permutations, seed=seed, method=method)
    return res.statistic, res.p_value


__all__ = ["EXACT_MMD_MAX_ROWS", "MmdEstimator", "MmdResult", "median_bandwidth", "mmd", "mmd_test"]
