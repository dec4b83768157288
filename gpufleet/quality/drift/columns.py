"""One column, two samples: the 1-D statistics and the table of drift methods. No I/O.

Each function here takes the reference and current values of one column and returns a number (a
distance) or a statistic and its p-value (a test); ``METHODS`` says, per method, which column
kinds it applies to, its default threshold and whether it decides on a p-value. Choosing a
method for a column and deciding the verdict is ``report``'s job; MMD, which also takes
multivariate rows, is in ``mmd``.

Where a method exists in both, the numbers are Evidently's: chi-squared on current counts against
reference counts scaled to the current size, Jensen-Shannon over Sturges bins of the pooled
values (or category frequencies, natural log), Wasserstein divided by ``max(std_ref, 0.001)``
with ``ddof=0``, the KS p-value of ``scipy.stats.ks_2samp``.

Beyond Evidently, a PSI that reports its own noise floor. Under no drift, PSI over ``B`` bins is
approximately ``(1/N + 1/M) * chi2(B - 1)`` (the PSI is a symmetrised chi-squared divergence), so
its 95th percentile ``psi_null_quantile`` is reported beside the PSI; a PSI only counts as drift
when it crosses both the threshold (material) and that quantile (beyond noise). And a two-sample
chi-squared (``chi2_homogeneity``) for monitors that need calibrated p-values: Evidently's ``chi2``
treats the reference's shares as exact, which makes its false-alarm rate exceed its level.

Huge and tiny numbers: values near the ends of float64 (``1e308``, ``1e-300``) overflow when
subtracted or squared (a Wasserstein distance of ``inf / inf = NaN``, Jensen-Shannon bins over an
infinite range) or underflow (squared distances of 0 in MMD). ``power_of_two_scale`` finds a power
of two that brings such values to a safe magnitude; multiplying by it is exact, so the scale-free
statistics (normed Wasserstein, PSI, Jensen-Shannon, MMD with the median bandwidth) are those of
the original values, and values in ordinary ranges are not touched at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
from numpy.typing import NDArray
from scipy import stats
from scipy.spatial.distance import jensenshannon

from gpufleet.errors import UsageError

Kind = Literal["numeric", "categorical", "embedding"]
Floats: TypeAlias = NDArray[np.float64]

SMALL_REFERENCE_ROWS = 1000
"""Evidently's switch from tests to distances (reference rows, missing values dropped)."""
FEW_VALUES = 5
"""At most this many distinct values: a numeric column is tested like a categorical one."""


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
        Method("chi2_homogeneity", NUMERIC | CATEGORICAL, 0.05, uses_p_value=True),
        Method("z", NUMERIC | CATEGORICAL, 0.05, uses_p_value=True),
        Method("psi", NUMERIC | CATEGORICAL, 0.1, uses_p_value=False),
        Method("wasserstein", NUMERIC, 0.1, uses_p_value=False),
        Method("wasserstein_raw", NUMERIC, None, uses_p_value=False),
        Method("jensenshannon", NUMERIC | CATEGORICAL, 0.1, uses_p_value=False),
        Method("mmd", NUMERIC | EMBEDDING, 0.05, uses_p_value=True, min_rows=4),
    )
}
ALIASES = {"chisquare": "chi2", "js": "jensenshannon", "wasserstein_norm": "wasserstein", "kolmogorov": "ks"}


SCALE_ABOVE = 2.0**450
"""Above this magnitude, values are scaled down before a statistic subtracts or squares them."""
SCALE_BELOW = 2.0**-450
"""Below this magnitude (all values), they are scaled up: their squares would underflow to 0."""


def power_of_two_scale(*arrays: NDArray[Any]) -> float:
    """``1.0``, or the power of two that brings the largest magnitude in ``arrays`` to about ``2**400``
    (from above ``SCALE_ABOVE``) or about 1 (from below ``SCALE_BELOW``). Finite values only."""
    top = 0.0
    for a in arrays:
        if a.size:
            top = max(top, abs(float(np.min(a))), abs(float(np.max(a))))
    if top == 0 or not math.isfinite(top) or SCALE_BELOW <= top <= SCALE_ABOVE:
        return 1.0
    target = 400 if top > SCALE_ABOVE else 0
    return math.ldexp(1.0, min(max(target - math.frexp(top)[1], -1022), 1023))


def resolve_method(name: str) -> Method:
    """A method by name or alias; a :class:`UsageError` listing the valid names otherwise."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in METHODS:
        raise UsageError(f"unknown drift method {name!r}: use one of {', '.join(METHODS)} (or auto)")
    return METHODS[key]


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


MIN_EXPECTED = 5.0
"""Cochran's rule: the chi-squared approximation wants every expected count at or above this."""


def _pool_rare(table: NDArray[np.int64]) -> NDArray[np.int64]:
    """The 2 x k table with its rarest categories pooled into one until every expected count is >= 5.

    Expected count of a category in a sample: its pooled count times the sample's share of all rows,
    so the smaller sample sets the need. Categories below it are merged, smallest first; when the
    merged ones still fall short, the next smallest joins them.
    """
    totals = table.sum(axis=0)
    need = MIN_EXPECTED * float(totals.sum()) / float(max(int(table.sum(axis=1).min()), 1))
    order = np.argsort(totals, kind="stable")
    small = int(np.searchsorted(totals[order], need))
    if small == 0:
        return table
    if float(totals[order[:small]].sum()) < need and small < order.size:
        small += 1
    pooled = table[:, order[:small]].sum(axis=1, keepdims=True)
    return np.hstack([table[:, order[small:]], pooled])


def chi2_homogeneity(ref: Any, cur: Any) -> tuple[float, float]:
    """Pearson's chi-squared test of homogeneity of the 2 x k table of counts: a two-sample test.

    Evidently's ``chi2`` takes the reference's shares as exact, so the reference's own sampling noise
    is missing from its null: with no drift its statistic runs about ``1 + M/N`` times a chi-squared
    (``M`` current rows, ``N`` reference rows), and its false-alarm rate exceeds its level (1.5x the
    statistic for a window half the reference's size). Here both samples are random
    (``scipy.stats.chi2_contingency``, no continuity correction; equal to the pooled z-test squared
    for two categories), and categories too rare for the approximation, new ones included, are
    pooled (``_pool_rare``). Fewer than two categories left: statistic 0, p-value 1.
    """
    _, ref_counts, cur_counts = _counts(ref, cur)
    table = _pool_rare(np.vstack([ref_counts, cur_counts]))
    if table.shape[1] < 2:
        return 0.0, 1.0
    res = stats.chi2_contingency(table, correction=False)
    return float(res.statistic), float(res.pvalue)


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


def psi_proportions(ref: Any, cur: Any, bins: int) -> tuple[Floats, Floats]:
    r, c = np.asarray(ref), np.asarray(cur)
    if r.dtype.kind in "fiu" and c.dtype.kind in "fiu":
        rf, cf = _numeric(r), _numeric(c)
        scale = power_of_two_scale(rf, cf)  # quantiles interpolate: b - a overflows near 1e308
        if scale != 1.0:
            rf, cf = rf * scale, cf * scale
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
    return psi_value(*psi_proportions(ref, cur, bins), eps)


def psi_value(ref_share: Floats, cur_share: Floats, eps: float) -> float:
    r, c = np.maximum(ref_share, eps), np.maximum(cur_share, eps)
    return float(np.sum((c - r) * np.log(c / r)))


def psi_null_quantile(n_ref: int, n_cur: int, n_bins: int, q: float = 0.95) -> float:
    """The ``q`` quantile of PSI under no drift: ``(1/N + 1/M) * chi2_q(B - 1)``."""
    return float((1 / n_ref + 1 / n_cur) * stats.chi2.ppf(q, max(n_bins - 1, 1)))


BLOCK = 1 << 16
"""Values per block of the sums below: their scratch (512 KiB) stays in cache, where a temporary the
size of a 200,000-row column is new memory, faulted in page by page (a third of a report's time)."""


def _block_sums(values: Floats, fill: Callable[[Floats, int, int], None]) -> float:
    """The sum over ``values``' blocks of what ``fill(scratch, start, stop)`` writes into the scratch."""
    scratch = np.empty(min(values.size, BLOCK))
    total = 0.0
    for start in range(0, values.size, BLOCK):
        stop = min(start + BLOCK, values.size)
        part = scratch[: stop - start]
        fill(part, start, stop)
        total += float(part.sum())
    return total


def mean_abs_difference(a: Floats, b: Floats) -> float:
    """``mean(|a - b|)`` of two arrays of one size, without a temporary of their size (NaN when empty)."""
    if not a.size:
        return math.nan

    def fill(part: Floats, start: int, stop: int) -> None:
        np.subtract(a[start:stop], b[start:stop], out=part)
        np.abs(part, out=part)

    return _block_sums(a, fill) / a.size


def population_std(values: Floats) -> float:
    """``np.std(values)`` (ddof 0, two passes), without a temporary of their size."""
    if not values.size:
        return math.nan
    mean = float(np.mean(values))

    def fill(part: Floats, start: int, stop: int) -> None:
        np.subtract(values[start:stop], mean, out=part)
        np.square(part, out=part)

    return math.sqrt(_block_sums(values, fill) / values.size)


def wasserstein_sorted(rs: Floats, cs: Floats) -> float:
    """W1 between two empirical distributions given sorted samples: the area between their CDFs."""
    if rs.size == cs.size:
        return mean_abs_difference(rs, cs)
    pooled = np.sort(np.concatenate([rs, cs]), kind="stable")
    deltas = np.diff(pooled)
    ref_cdf = np.searchsorted(rs, pooled[:-1], side="right") / rs.size
    cur_cdf = np.searchsorted(cs, pooled[:-1], side="right") / cs.size
    return float(np.sum(np.abs(ref_cdf - cur_cdf) * deltas))


def wasserstein_norm(ref_std: float) -> float:
    return max(ref_std, 0.001)


def wasserstein_parts(rs: Floats, cs: Floats) -> tuple[float, float, float]:
    """Raw distance, normed distance and the reference's standard deviation of two sorted samples.

    Huge or tiny values are scaled by a power of two first (``power_of_two_scale``), so the normed
    distance of two columns near +-1e308 is finite and right; the raw distance and the standard
    deviation, back in the data's units, may still overflow to ``inf`` (they exceed float64).
    """
    scale = power_of_two_scale(rs, cs)
    if scale == 1.0:
        distance, std = wasserstein_sorted(rs, cs), population_std(rs)
        return distance, distance / wasserstein_norm(std), std
    distance, std = wasserstein_sorted(rs * scale, cs * scale), population_std(rs * scale)
    with np.errstate(over="ignore"):
        raw, raw_std = float(np.float64(distance) / scale), float(np.float64(std) / scale)
    return raw, distance / max(std, 0.001 * scale), raw_std


def wasserstein(ref: Any, cur: Any, normed: bool) -> float:
    """First Wasserstein (earth mover's) distance; ``normed`` divides by ``max(std(ref, ddof=0), 0.001)``.

    The normed form is Evidently's default for numeric columns above 1,000 rows: a shift of a
    tenth of the reference's standard deviation is its drift threshold.
    """
    raw, normed_distance, _ = wasserstein_parts(np.sort(_numeric(ref)), np.sort(_numeric(cur)))
    return normed_distance if normed else raw


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
            scale = power_of_two_scale(rf, cf)  # bins over +-1e308 would span an infinite range
            if scale != 1.0:
                rf, cf = rf * scale, cf * scale
            edges = np.histogram_bin_edges(np.concatenate([rf, cf]), bins=bins)
            return np.histogram(rf, edges)[0] / rf.size, np.histogram(cf, edges)[0] / cf.size
        r, c = rf, cf
    _, ref_counts, cur_counts = _counts(r, c)
    return ref_counts / ref_counts.sum(), cur_counts / cur_counts.sum()


def jensen_shannon(ref: Any, cur: Any, bins: int | str = "sturges") -> float:
    """Jensen-Shannon distance (natural log, so at most sqrt(ln 2)) between the binned distributions."""
    p, q = _js_frequencies(ref, cur, bins)
    return _js_distance(p, q)


__all__ = [
    "ALIASES",
    "FEW_VALUES",
    "METHODS",
    "MIN_EXPECTED",
    "SCALE_ABOVE",
    "SCALE_BELOW",
    "SMALL_REFERENCE_ROWS",
    "Floats",
    "Kind",
    "Method",
    "chi2",
    "chi2_homogeneity",
    "jensen_shannon",
    "ks",
    "power_of_two_scale",
    "psi",
    "psi_null_quantile",
    "psi_proportions",
    "psi_value",
    "resolve_method",
    "wasserstein",
    "wasserstein_norm",
    "wasserstein_parts",
    "wasserstein_sorted",
    "z_test",
]
