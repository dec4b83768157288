"""Drift statistics: is the current data distributed like the reference? Pure numpy/scipy, no I/O.

Two kinds of answer, kept apart because they fail differently:

- **tests** give a p-value (Kolmogorov-Smirnov, chi-squared, two-proportion z, MMD with a
  permutation null): "could sampling noise alone explain this?" With 200,000 rows a side they
  call any trivial change significant;
- **distances** give an effect size (PSI, Wasserstein normed by the reference's spread,
  Jensen-Shannon) compared to a fixed threshold: "is the change big enough to matter?" With
  50 rows a side sampling noise alone crosses the threshold.

The package is split by concern; every name below is importable from ``gpufleet.quality.drift``:

- ``columns``: the 1-D two-sample statistics (KS, chi-squared, z, PSI, Wasserstein,
  Jensen-Shannon) and the table of methods;
- ``mmd``: maximum mean discrepancy for embeddings and other multivariate rows;
- ``clean``: raw columns (pandas or numpy) classified and cleaned for the statistics, with a
  tally of the non-finite values dropped;
- ``report``: the method chosen per column (Evidently 0.7's defaults), skipped columns, the
  Benjamini-Hochberg correction, the dataset verdict and the report's JSON.

What cannot be measured is never "no drift" (details in ``report``): a column whose statistic
cannot be computed (nothing finite left, a NaN or overflowing statistic) is ``untestable`` with
the reason; non-finite values (NaN, +-inf) are counted per column and side, and a share above
``max_non_finite`` (5 %) is an alert; either makes the dataset's status ``incomplete`` (unless it
drifts), and ``gpufleet drift --fail-on-drift`` exits 1 on it. Huge or tiny values are scaled by a
power of two before the statistics that would overflow (``power_of_two_scale``), so columns near
+-1e308 are measured, not given up on.
"""

from __future__ import annotations

from gpufleet.quality.drift.clean import NonFinite, clean_column, columns_of
from gpufleet.quality.drift.columns import (
    ALIASES,
    METHODS,
    Method,
    chi2,
    jensen_shannon,
    ks,
    power_of_two_scale,
    psi,
    psi_null_quantile,
    resolve_method,
    wasserstein,
    z_test,
)
from gpufleet.quality.drift.mmd import MmdEstimator, MmdResult, median_bandwidth, mmd, mmd_test
from gpufleet.quality.drift.report import MAX_NON_FINITE, ColumnDrift, DatasetStatus, DriftReport, drift_report

__all__ = [
    "ALIASES",
    "MAX_NON_FINITE",
    "METHODS",
    "ColumnDrift",
    "DatasetStatus",
    "DriftReport",
    "Method",
    "MmdEstimator",
    "MmdResult",
    "NonFinite",
    "chi2",
    "clean_column",
    "columns_of",
    "drift_report",
    "jensen_shannon",
    "ks",
    "median_bandwidth",
    "mmd",
    "mmd_test",
    "power_of_two_scale",
    "psi",
    "psi_null_quantile",
    "resolve_method",
    "wasserstein",
    "z_test",
]
