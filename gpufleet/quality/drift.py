"""Drift statistics: is the current data distributed like the reference? Pure numpy/scipy, no I/O.

Two kinds of answer, kept apart because they fail differently:

- **tests** give a p-value (Kolmogorov-Smirnov, chi-squared, two-proportion z, MMD with a
  permutation null): "could sampling noise alone explain this?" With 200,000 rows a side they
  call any trivial change significant;
- **distances** give an effect size (PSI, Wasserstein normed by the reference's spread,
  Jensen-Shannon) compared to a fixed threshold: "is the change big enough to matter?" With
  50 rows a side sampling noise alone crosses the threshold.

The automatic choice per column is Evidently 0.7's (``_get_default_stattest``): tests on small
references (<= 1,000 rows), distances on large ones, so the same inputs give the same verdicts::

    numeric,     reference <= 1,000 rows: ks (p <= 0.05); chi2 (p < 0.05) if <= 5 distinct values, z if <= 2
    numeric,     reference  > 1,000 rows: wasserstein normed (>= 0.1); jensenshannon (>= 0.1) if <= 5 values
    categorical, reference <= 1,000 rows: chi2, or z when there are <= 2 distinct values
    categorical, reference  > 1,000 rows: jensenshannon (>= 0.1)
    embedding:                            mmd (permutation p < 0.05)

and the dataset drifts when at least ``drift_share`` (0.5) of the tested columns drift. Where a
method exists in both, the numbers are Evidently's: chi-squared on current counts against
reference counts scaled to the current size, Jensen-Shannon over Sturges bins of the pooled
values (or category frequencies, natural log), Wasserstein divided by ``max(std_ref, 0.001)``
with ``ddof=0``, the KS p-value of ``scipy.stats.ks_2samp``.

Beyond Evidently: Benjamini-Hochberg across the columns' p-values (``correction="bh"``, by
``scipy.stats.false_discovery_control``), and a PSI that reports its own noise floor. Under no
drift, PSI over ``B`` bins is approximately ``(1/N + 1/M) * chi2(B - 1)`` (the PSI is a
symmetrised chi-squared divergence), so its 95th percentile ``psi_null_quantile`` is reported
beside the PSI; a PSI only counts as drift when it crosses both the threshold (material) and that
quantile (beyond noise).

Bad input never crashes and never reads as "no drift": a column that cannot be tested (empty,
all missing, absent from one side, of another type on each side, constant in the reference,
too few rows) comes back ``status="skipped"`` with ``drift=None`` and the reason.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import numpy as np
from numpy.typing import NDArray
from scipy import stats
from scipy.spatial.distance import jensenshannon

from gpufleet.errors import ParameterError, UsageError

Kind = Literal["numeric", "categorical", "embedding"]
Status = Literal["ok", "skipped"]
MmdEstimator = Literal["auto", "exact", "linear", "rff"]
Floats: TypeAlias = NDArray[np.float64]

SMALL_REFERENCE_ROWS = 1000
"""Evidently's switch from tests to distances (reference rows, missing values dropped)."""
FEW_VALUES = 5
"""At most this many distinct values: a numeric column is tested like a categorical one."""
EXACT_MMD_MAX_ROWS = 4000
"""Above this many pooled rows ``mmd(method="auto")`` uses random Fourier features."""


@dataclass(frozen=True, slots=True)
class Method:
    """A drift method as data: the kinds it applies to, its default threshold, how it decides."""

    name: str
    kinds: frozenset[str]
    default_threshold: float | None
    """``None``: no scale-free default exists, the caller must give one."""
    uses_p_value: bool
    """Drift when the p-value is below the threshold; otherwise when the statistic reaches it."""
    inclusive: bool = False
    """``p <= threshold`` (Evidently's KS) instead of ``p < threshold``."""
    min_rows: int = 2
    """Fewest non-missing rows each side needs."""


NUMERIC, CATEGORICAL, EMBEDDING = frozenset({"numeric"}), frozenset({"categorical"}), frozenset({"embedding"})
METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("ks", NUMERIC, 0.05, uses_p_value=True, inclusive=True, min_rows=1),
        Method("chi2", NUMERIC | CATEGORICAL, 0.05, uses_p_value=True),
        Method("z", NUMERIC | CATEGORICAL, 0.05, uses_p_value=True),
        Method("psi", NUMERIC | CATEGORICAL, 0.1, uses_p_value=False),
        Method("wasserstein", NUMERIC, 0.1, uses_p_value=False),
        Method("wasserstein_raw", NUMERIC, None, uses_p_value=False),
        Method("jensenshannon", NUMERIC | CATEGORICAL, 0.1, uses_p_value=False),
        Method("mmd", NUMERIC | EMBEDDING, 0.05, uses_p_value=True, min_rows=4),
    )
}
ALIASES = {"chisquare": "chi2", "js": "jensenshannon", "wasserstein_norm": "wasserstein", "kolmogorov": "ks"}


def resolve_method(name: str) -> Method:
    """A method by name or alias; a :class:`UsageError` listing the valid names otherwise."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in METHODS:
        raise UsageError(f"unknown drift method {name!r}: use one of {', '.join(METHODS)} (or auto)")
    return METHODS[key]


@dataclass(frozen=True)
class ColumnDrift:
    """The verdict on one column; ``drift`` is ``None`` when the column was skipped."""

    column: str
    kind: Kind
    method: str
    statistic: float | None
    p_value: float | None
    threshold: float
    drift: bool | None
    status: Status
    reason: str | None
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "kind": self.kind,
            "method": self.method,
            "statistic": _finite(self.statistic),
            "p_value": _finite(self.p_value),
            "threshold": _finite(self.threshold),
            "drift": self.drift,
            "status": self.status,
            "reason": self.reason,
            "extra": {k: _finite(v) for k, v in self.extra.items()},
        }


@dataclass(frozen=True)
class DriftReport:
    """Every column's verdict and the dataset's: drift when ``share_drifted >= drift_share_threshold``."""

    columns: list[ColumnDrift]
    dataset_drift: bool
    share_drifted: float
    """Drifted columns over *tested* columns (skipped ones are counted apart, never as "no drift")."""
    drift_share_threshold: float
    correction: str = "none"

    @property
    def tested(self) -> int:
        return sum(c.status == "ok" for c in self.columns)

    @property
    def skipped(self) -> int:
        return sum(c.status == "skipped" for c in self.columns)

    @property
    def drifted(self) -> int:
        return sum(c.drift is True for c in self.columns)

    @property
    def verdict(self) -> str:
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        if not self.tested:
            return f"no column could be tested ({self.skipped} skipped): no verdict"
        head = "dataset drift" if self.dataset_drift else "no dataset drift"
        return (
            f"{head}: {self.drifted} of {self.tested} tested columns drifted "
            f"({self.share_drifted:.0%}, threshold {self.drift_share_threshold:.0%}){skipped}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset_drift": self.dataset_drift,
            "share_drifted": self.share_drifted,
            "drift_share_threshold": self.drift_share_threshold,
            "tested": self.tested,
            "skipped": self.skipped,
            "drifted": self.drifted,
            "correction": self.correction,
            "verdict": self.verdict,
            "columns": {c.column: c.to_dict() for c in self.columns},
        }


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float | np.floating) else repr(str(value))


def _finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity; a chi-squared against a zero expectation is reported as ``None``."""
    return value if value is not None and math.isfinite(value) else None


# ---------------------------------------------------------------- the statistics themselves


def _numeric(values: Any) -> Floats:
    arr = np.asarray(values, dtype=np.float64).ravel()
    return arr[np.isfinite(arr)]


def ks(ref: Any, cur: Any) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov: the largest gap between the two empirical CDFs and its p-value.

    The p-value is ``scipy.stats.ks_2samp``'s (exact for small samples, asymptotic otherwise), as in
    Evidently.
    """
    res = stats.ks_2samp(_numeric(ref), _numeric(cur))
    return float(res.statistic), float(res.pvalue)


def _counts(ref: Any, cur: Any) -> tuple[NDArray[Any], NDArray[np.int64], NDArray[np.int64]]:
    """Categories seen on either side (sorted) and their counts in each."""
    r, c = np.asarray(ref).ravel(), np.asarray(cur).ravel()
    keys, inverse = np.unique(np.concatenate([r, c]), return_inverse=True)
    inverse = inverse.ravel()
    ref_counts = np.bincount(inverse[: r.size], minlength=keys.size).astype(np.int64)
    cur_counts = np.bincount(inverse[r.size :], minlength=keys.size).astype(np.int64)
    return keys, ref_counts, cur_counts


def chi2(ref: Any, cur: Any) -> tuple[float, float]:
    """Pearson's chi-squared of the current counts against the reference counts scaled to the current size.

    Evidently's ``chisquare`` test (``scipy.stats.chisquare(f_obs=cur, f_exp=ref * M / N)``), with
    ``k - 1`` degrees of freedom over the ``k`` categories seen on either side. A category absent
    from the reference but present now has an expectation of zero: statistic ``inf``, p-value 0.
    """
    _, ref_counts, cur_counts = _counts(ref, cur)
    if ref_counts.size < 2:
        return 0.0, 1.0
    expected = ref_counts * (cur_counts.sum() / ref_counts.sum())
    observed = cur_counts.astype(np.float64)
    if np.any((expected == 0) & (observed > 0)):
        return math.inf, 0.0
    nonzero = expected > 0
    statistic = float(np.sum((observed[nonzero] - expected[nonzero]) ** 2 / expected[nonzero]))
    return statistic, float(stats.chi2.sf(statistic, ref_counts.size - 1))


def z_test(ref: Any, cur: Any) -> tuple[float, float]:
    """Two-proportion z-test for a column with at most two values (Evidently's default there).

    The first value in sorted order is "0", the other "1"; two-sided p-value ``2 * (1 - Phi(|z|))``.
    """
    keys, ref_counts, cur_counts = _counts(ref, cur)
    if keys.size < 2:
        return 0.0, 1.0
    n, m = int(ref_counts.sum()), int(cur_counts.sum())
    p1, p2 = 1 - ref_counts[0] / n, 1 - cur_counts[0] / m
    pooled = (p1 * n + p2 * m) / (n + m)
    denominator = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / m))
    z = float((p1 - p2) / denominator)
    return z, float(2 * (1 - stats.norm.cdf(abs(z))))


def _quantile_bins(ref: Floats, bins: int) -> Floats:
    """Interior edges of ``bins`` quantile bins of the reference (ties merge bins)."""
    edges = np.quantile(ref, np.linspace(0, 1, bins + 1))
    return np.unique(edges[1:-1])


def _psi_proportions(ref: Any, cur: Any, bins: int) -> tuple[Floats, Floats]:
    r, c = np.asarray(ref), np.asarray(cur)
    if r.dtype.kind in "fiu" and c.dtype.kind in "fiu":
        rf, cf = _numeric(r), _numeric(c)
        interior = _quantile_bins(rf, bins)
        ref_counts = np.bincount(np.searchsorted(interior, rf, side="right"), minlength=interior.size + 1)
        cur_counts = np.bincount(np.searchsorted(interior, cf, side="right"), minlength=interior.size + 1)
    else:
        _, ref_counts, cur_counts = _counts(r, c)
    return ref_counts / ref_counts.sum(), cur_counts / cur_counts.sum()


def psi(ref: Any, cur: Any, bins: int = 10, eps: float = 1e-4) -> float:
    """Population Stability Index ``sum((c - r) * ln(c / r))`` over quantile bins of the reference.

    Numeric columns use ``bins`` bins holding equal shares of the reference (fewer where values
    tie); categorical ones one bin per category. Empty bins count as ``eps`` so the log stays finite.
    """
    return _psi_value(*_psi_proportions(ref, cur, bins), eps)


def _psi_value(ref_share: Floats, cur_share: Floats, eps: float) -> float:
    r, c = np.maximum(ref_share, eps), np.maximum(cur_share, eps)
    return float(np.sum((c - r) * np.log(c / r)))


def psi_null_quantile(n_ref: int, n_cur: int, n_bins: int, q: float = 0.95) -> float:
    """The ``q`` quantile of PSI under no drift: ``(1/N + 1/M) * chi2_q(B - 1)``."""
    return float((1 / n_ref + 1 / n_cur) * stats.chi2.ppf(q, max(n_bins - 1, 1)))


def _wasserstein_sorted(rs: Floats, cs: Floats) -> float:
    """W1 between two empirical distributions given sorted samples: the area between their CDFs."""
    if rs.size == cs.size:
        return float(np.mean(np.abs(rs - cs)))
    pooled = np.sort(np.concatenate([rs, cs]), kind="stable")
    deltas = np.diff(pooled)
    ref_cdf = np.searchsorted(rs, pooled[:-1], side="right") / rs.size
    cur_cdf = np.searchsorted(cs, pooled[:-1], side="right") / cs.size
    return float(np.sum(np.abs(ref_cdf - cur_cdf) * deltas))


def _wasserstein_norm(ref_std: float) -> float:
    return max(ref_std, 0.001)


def wasserstein(ref: Any, cur: Any, normed: bool) -> float:
    """First Wasserstein (earth mover's) distance; ``normed`` divides by ``max(std(ref, ddof=0), 0.001)``.

    The normed form is Evidently's default for numeric columns above 1,000 rows: a shift of a
    tenth of the reference's standard deviation is its drift threshold.
    """
    rs, cs = np.sort(_numeric(ref)), np.sort(_numeric(cur))
    distance = _wasserstein_sorted(rs, cs)
    return distance / _wasserstein_norm(float(np.std(rs))) if normed else distance


def _js_distance(p: Floats, q: Floats) -> float:
    """``scipy.spatial.distance.jensenshannon`` (natural log), but 0 where scipy says NaN for two
    near-identical distributions: rounding leaves their divergence a hair below zero before the root."""
    with np.errstate(invalid="ignore"):
        distance = float(jensenshannon(p, q))
    return 0.0 if math.isnan(distance) and p.sum() > 0 and q.sum() > 0 else distance


def _js_frequencies(ref: Any, cur: Any, bins: int | str) -> tuple[Floats, Floats]:
    """Evidently's binning: Sturges bins over the pooled values when the reference has > 20 distinct
    numbers, otherwise the frequency of each value seen on either side."""
    r, c = np.asarray(ref), np.asarray(cur)
    if r.dtype.kind in "fiu" and c.dtype.kind in "fiu":
        rf, cf = _numeric(r), _numeric(c)
        if np.unique(rf).size > 20:
            edges = np.histogram_bin_edges(np.concatenate([rf, cf]), bins=bins)
            return np.histogram(rf, edges)[0] / rf.size, np.histogram(cf, edges)[0] / cf.size
        r, c = rf, cf
    _, ref_counts, cur_counts = _counts(r, c)
    return ref_counts / ref_counts.sum(), cur_counts / cur_counts.sum()


def jensen_shannon(ref: Any, cur: Any, bins: int | str = "sturges") -> float:
    """Jensen-Shannon distance (natural log, so at most sqrt(ln 2)) between the binned distributions."""
    p, q = _js_frequencies(ref, cur, bins)
    return _js_distance(p, q)


# ---------------------------------------------------------------- MMD


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
    """
    x, y = _as_matrix(ref), _as_matrix(cur)
    if x.shape[1] != y.shape[1]:
        raise UsageError(f"mmd needs rows of one width: reference has {x.shape[1]}, current {y.shape[1]}")
    if min(x.shape[0], y.shape[0]) < 2:
        raise UsageError("mmd needs at least 2 rows on each side")
    rng = np.random.default_rng(seed)
    bw = bandwidth if bandwidth is not None else median_bandwidth(x, y, rng)
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
    return MmdResult(statistic, p, estimator, bw, permutations)


def mmd(
    ref: Any, cur: Any, *, permutations: int = 200, seed: int = 0, method: MmdEstimator = "auto"
) -> tuple[float, float]:
    """Unbiased MMD^2 and its p-value; see :func:`mmd_test`."""
    res = mmd_test(ref, cur, permutations=permutations, seed=seed, method=method)
    return res.statistic, res.p_value


# ---------------------------------------------------------------- columns in, verdicts out


@dataclass(frozen=True, slots=True)
class _Side:
    """One side of one column, ready for the statistics: missing values dropped, numbers sorted."""

    kind: Kind | None
    values: NDArray[Any]
    missing: int
    problem: str | None = None


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    return type(value).__name__ in {"NAType", "NaTType"}


def _numeric_side(arr: Floats) -> _Side:
    ok = np.isfinite(arr)
    missing = int(arr.size - np.count_nonzero(ok))
    return _Side("numeric", np.sort(arr[ok] if missing else arr), missing)


def _object_side(values: NDArray[Any], missing: NDArray[np.bool_]) -> _Side:
    present = values[~missing]
    first = next((v for v in present[:1]), None)
    if isinstance(first, list | tuple | np.ndarray):
        rows = [np.asarray(v, dtype=np.float64).ravel() for v in present]
        widths = {r.size for r in rows}
        if len(widths) > 1:
            return _Side(
                "embedding", np.empty((0, 0)), int(missing.sum()), f"embedding rows of widths {sorted(widths)}"
            )
        matrix = np.vstack(rows) if rows else np.empty((0, 0))
        return _embedding_side(matrix, int(missing.sum()))
    return _Side("categorical", np.asarray([str(v) for v in present], dtype=str), int(missing.sum()))


def _embedding_side(matrix: Floats, missing: int) -> _Side:
    ok = np.all(np.isfinite(matrix), axis=1) if matrix.size else np.zeros(matrix.shape[0], dtype=bool)
    return _Side("embedding", matrix[ok], missing + int(matrix.shape[0] - ok.sum()))


def _side(raw: Any) -> _Side:
    """Classify and clean one column: a pandas Series or anything ``numpy.asarray`` takes."""
    dtype_kind = getattr(getattr(raw, "dtype", None), "kind", None)
    if hasattr(raw, "to_numpy") and hasattr(raw, "isna") and dtype_kind is not None:
        if dtype_kind in "fiu":
            return _numeric_side(np.asarray(raw.to_numpy(dtype=np.float64, na_value=np.nan)))
        if dtype_kind in "Mmc":
            return _Side(None, np.empty(0), 0, f"unsupported dtype {raw.dtype}")
        return _object_side(np.asarray(raw.to_numpy(dtype=object)), np.asarray(raw.isna(), dtype=bool))
    arr = np.asarray(raw)
    if arr.dtype.kind in "fiu" and (arr.ndim == 1 or (arr.ndim == 2 and arr.shape[1] == 1)):
        return _numeric_side(arr.astype(np.float64).ravel())
    if arr.dtype.kind in "fiu" and arr.ndim == 2:
        return _embedding_side(arr.astype(np.float64), 0)
    if arr.ndim != 1 or arr.dtype.kind in "Mmc":
        return _Side(None, np.empty(0), 0, f"unsupported dtype {arr.dtype} with shape {arr.shape}")
    if arr.dtype.kind == "O":
        return _object_side(arr, np.fromiter((_is_missing(v) for v in arr), dtype=bool, count=arr.size))
    return _Side("categorical", arr.astype(str), 0)


def clean_column(raw: Any) -> tuple[Kind | None, NDArray[Any]]:
    """A column as the statistics see it: its kind (``None`` if unsupported) and its non-missing
    values (numbers sorted; a 2-D array for embeddings). For plots and for callers of the
    single statistics."""
    side = _side(raw)
    return side.kind, side.values


def columns_of(data: Any, side: str) -> dict[str, Any]:
    """Column name -> raw column, for a mapping of arrays or a pandas DataFrame."""
    if isinstance(data, Mapping):
        return {str(k): v for k, v in data.items()}
    if hasattr(data, "columns") and hasattr(data, "__getitem__"):
        return {str(c): data[c] for c in data.columns}
    raise UsageError(f"the {side} data must be a pandas DataFrame or a mapping of column name to array")


def _distinct_at_most(ref: _Side, cur: _Side, limit: int) -> int:
    """Distinct values on both sides together, counted exactly up to ``limit + 1``."""

    def uniques(side: _Side) -> NDArray[Any]:
        v = side.values
        if side.kind == "numeric":
            return v[np.concatenate([[True], v[1:] != v[:-1]])] if v.size else v
        return np.unique(v)

    ref_unique = uniques(ref)
    if ref_unique.size > limit:
        return limit + 1
    return min(int(np.unique(np.concatenate([ref_unique, uniques(cur)])).size), limit + 1)


def _auto_method(kind: Kind, ref: _Side, cur: _Side) -> Method:
    """Evidently 0.7's default test for a column (``_get_default_stattest``)."""
    if kind == "embedding":
        return METHODS["mmd"]
    distinct = _distinct_at_most(ref, cur, FEW_VALUES)
    if ref.values.shape[0] <= SMALL_REFERENCE_ROWS:
        if kind == "numeric" and distinct > FEW_VALUES:
            return METHODS["ks"]
        return METHODS["chi2"] if distinct > 2 else METHODS["z"]
    if kind == "categorical" or distinct <= FEW_VALUES:
        return METHODS["jensenshannon"]
    return METHODS["wasserstein"]


@dataclass(frozen=True, slots=True)
class _Outcome:
    """A column's numbers before the decision (which may need every column's p-values)."""

    column: str
    kind: Kind
    method: str
    threshold: float
    statistic: float | None = None
    p_value: float | None = None
    extra: dict[str, float] = field(default_factory=dict)
    skip: str | None = None
    uses_p_value: bool = False
    inclusive: bool = False


def _constant(side: _Side) -> bool:
    v = side.values
    return bool(v.shape[0] > 0 and np.all(v == v[0]))


def _why_untestable(name: str, ref: _Side, cur: _Side) -> str | None:
    for label, side in (("reference", ref), ("current", cur)):
        if side.problem is not None:
            return f"{label}: {side.problem}"
    if ref.kind != cur.kind:
        return f"type differs: {ref.kind} in the reference, {cur.kind} in the current data"
    if ref.kind == "embedding" and ref.values.shape[1:] != cur.values.shape[1:] and cur.values.size:
        return f"embedding width differs: {ref.values.shape[1]} in the reference, {cur.values.shape[1]} now"
    for label, side in (("reference", ref), ("current", cur)):
        if side.values.shape[0] == 0:
            return f"{label}: all {side.missing} values are missing" if side.missing else f"{label}: no rows"
    if _constant(ref):
        return f"reference has a single value ({_show(ref.values[0])}): nothing to measure a change against"
    return None


def _measure(ref: _Side, cur: _Side, method: Method, threshold: float) -> tuple[float, float | None, dict[str, float]]:
    """Statistic, p-value (tests only) and extras of one method on one cleaned column."""
    r, c = ref.values, cur.values
    sizes = {"n_reference": float(r.shape[0]), "n_current": float(c.shape[0])}
    if method.name == "ks":
        statistic, p = ks(r, c)
        return statistic, p, sizes
    if method.name == "chi2":
        statistic, p = chi2(r, c)
        return statistic, p, sizes
    if method.name == "z":
        statistic, p = z_test(r, c)
        return statistic, p, sizes
    if method.name == "psi":
        rp, cp = _psi_proportions(r, c, 10)
        value = _psi_value(rp, cp, 1e-4)
        quantile = psi_null_quantile(r.shape[0], c.shape[0], rp.size)
        return value, None, {**sizes, "psi_null_quantile": quantile, "bins": float(rp.size)}
    if method.name in ("wasserstein", "wasserstein_raw"):
        distance, std = _wasserstein_sorted(r, c), float(np.std(r))
        extra = {**sizes, "wasserstein_raw": distance, "reference_std": std}
        return (distance / _wasserstein_norm(std) if method.name == "wasserstein" else distance), None, extra
    if method.name == "jensenshannon":
        return jensen_shannon(r, c), None, sizes
    res = mmd_test(r, c)
    extra = {**sizes, "bandwidth": res.bandwidth, "permutations": float(res.permutations)}
    return res.statistic, res.p_value, extra


def _threshold_for(method: Method, given: float | None) -> float:
    value = method.default_threshold if given is None else given
    if value is None:
        raise ParameterError(
            "{method!s} has no scale-free default threshold: give one, e.g. {threshold}",
            method=method.name,
            threshold=0.5,
        )
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"threshold {value!r} for {method.name} must be a positive number")
    if method.uses_p_value and value >= 1:
        raise UsageError(f"threshold {value!r} for {method.name} is a p-value level: give one below 1, e.g. 0.05")
    return value


def _evaluate(name: str, ref_raw: Any, cur_raw: Any, method_name: str | None, threshold: float | None) -> _Outcome:
    requested = None if method_name in (None, "auto") else resolve_method(str(method_name))
    if ref_raw is None or cur_raw is None:
        side = _side(cur_raw if ref_raw is None else ref_raw)
        where = "reference" if ref_raw is None else "current data"
        return _Outcome(name, side.kind or "categorical", _label(requested), math.nan, skip=f"missing from the {where}")
    ref, cur = _side(ref_raw), _side(cur_raw)
    kind: Kind = ref.kind or cur.kind or "categorical"
    problem = _why_untestable(name, ref, cur)
    method = requested
    if method is None and problem is None:
        method = _auto_method(kind, ref, cur)
    thr = math.nan if method is None else _threshold_for(method, threshold)
    if problem is None and method is not None:
        problem = _why_not_method(method, kind, ref, cur)
    if problem is not None or method is None:
        return _Outcome(name, kind, _label(method), thr, skip=problem)
    statistic, p, extra = _measure(ref, cur, method, thr)
    if ref.missing or cur.missing:
        extra = {**extra, "missing_reference": float(ref.missing), "missing_current": float(cur.missing)}
    return _Outcome(name, kind, method.name, thr, statistic, p, extra, None, method.uses_p_value, method.inclusive)


def _label(method: Method | None) -> str:
    return "auto" if method is None else method.name


def _why_not_method(method: Method, kind: Kind, ref: _Side, cur: _Side) -> str | None:
    if kind not in method.kinds:
        return f"{method.name} applies to {' or '.join(sorted(method.kinds))} columns, this one is {kind}"
    fewest = min(ref.values.shape[0], cur.values.shape[0])
    if fewest < method.min_rows:
        return f"{method.name} needs at least {method.min_rows} non-missing rows a side, found {fewest}"
    if method.name == "z" and _distinct_at_most(ref, cur, 2) > 2:
        return "z compares two proportions: the column has more than two distinct values (use chi2)"
    return None


def _decide(o: _Outcome, adjusted_p: float | None) -> ColumnDrift:
    if o.skip is not None:
        return ColumnDrift(o.column, o.kind, o.method, None, None, o.threshold, None, "skipped", o.skip, {})
    extra = dict(o.extra)
    if o.uses_p_value:
        p = o.p_value if adjusted_p is None else adjusted_p
        if adjusted_p is not None:
            extra["bh_adjusted_p"] = adjusted_p
        assert p is not None
        drift = p <= o.threshold if o.inclusive else p < o.threshold
    else:
        assert o.statistic is not None
        drift = o.statistic >= o.threshold and o.statistic > extra.get("psi_null_quantile", -math.inf)
    return ColumnDrift(o.column, o.kind, o.method, o.statistic, o.p_value, o.threshold, bool(drift), "ok", None, extra)


PARALLEL_MIN_VALUES = 200_000
"""Above this many values in all, columns are measured on a thread per core (sorting releases the GIL)."""


def _evaluate_all(jobs: Sequence[tuple[str, Any, Any, str | None, float | None]]) -> list[_Outcome]:
    workers = min(len(jobs), os.cpu_count() or 1)
    size = sum(int(getattr(j[1], "size", 0) or 0) + int(getattr(j[2], "size", 0) or 0) for j in jobs)
    if workers < 2 or size < PARALLEL_MIN_VALUES:
        return [_evaluate(*job) for job in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: _evaluate(*job), jobs))


def _per_column(value: Any, names: Sequence[str], param: str) -> dict[str, Any]:
    """A global value applies to every column; a mapping names columns, which must be compared."""
    if not isinstance(value, Mapping):
        return dict.fromkeys(names, value)
    unknown = [k for k in value if k not in names]
    if unknown:
        raise ParameterError(
            f"{{{param}:name}} names column {{column!r}}, which is not compared: columns are {{compared!s}}",
            **{param: value},
            column=unknown[0],
            compared=", ".join(names),
        )
    return {n: value.get(n) for n in names}


def drift_report(
    reference: Any,
    current: Any,
    *,
    columns: Sequence[str] | None = None,
    method: str | Mapping[str, str] | None = None,
    threshold: float | Mapping[str, float] | None = None,
    drift_share: float = 0.5,
    correction: Literal["none", "bh"] = "none",
) -> DriftReport:
    """Compare every column (or ``columns``) of ``current`` against ``reference``.

    ``reference`` and ``current`` are pandas DataFrames or mappings of column name to array (a
    2-D array or a column of vectors is an embedding). ``method`` and ``threshold`` are one value
    for every column or a mapping per column; unset columns get Evidently's automatic choice.
    """
    if correction not in ("none", "bh"):
        raise UsageError(f"correction {correction!r}: use none or bh")
    if not 0 < drift_share <= 1:
        raise UsageError(f"drift share {drift_share!r} must be in (0, 1]")
    ref_cols, cur_cols = columns_of(reference, "reference"), columns_of(current, "current")
    names = list(columns) if columns is not None else [*ref_cols, *(c for c in cur_cols if c not in ref_cols)]
    absent = [n for n in names if n not in ref_cols and n not in cur_cols]
    if absent:
        raise UsageError(f"no column {absent[0]!r} in either data set: columns are {', '.join(ref_cols) or 'none'}")
    methods, thresholds = _per_column(method, names, "method"), _per_column(threshold, names, "threshold")
    jobs = [(n, ref_cols.get(n), cur_cols.get(n), methods[n], thresholds[n]) for n in names]
    outcomes = _evaluate_all(jobs)
    adjusted: dict[int, float] = {}
    if correction == "bh":
        tested = [i for i, o in enumerate(outcomes) if o.skip is None and o.uses_p_value and o.p_value is not None]
        bh = stats.false_discovery_control([outcomes[i].p_value or 0.0 for i in tested], method="bh")
        adjusted = {i: float(p) for i, p in zip(tested, bh, strict=True)}
    verdicts = [_decide(o, adjusted.get(i)) for i, o in enumerate(outcomes)]
    tested_n = sum(v.status == "ok" for v in verdicts)
    share = sum(v.drift is True for v in verdicts) / tested_n if tested_n else 0.0
    return DriftReport(verdicts, bool(tested_n and share >= drift_share), share, drift_share, correction)


__all__ = [
    "ALIASES",
    "METHODS",
    "ColumnDrift",
    "DriftReport",
    "Method",
    "MmdEstimator",
    "MmdResult",
    "chi2",
    "clean_column",
    "columns_of",
    "drift_report",
    "jensen_shannon",
    "ks",
    "median_bandwidth",
    "mmd",
    "mmd_test",
    "psi",
    "psi_null_quantile",
    "resolve_method",
    "wasserstein",
    "z_test",
]
