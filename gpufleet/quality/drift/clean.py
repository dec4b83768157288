"""Raw columns as the statistics see them: classified, missing values dropped, numbers sorted. No I/O.

Apart because it is the only part that looks at what the caller handed in (a pandas Series, a
numpy array, a list of vectors): everything after it works on a :class:`Side`. A column is
numeric (real numbers), categorical (anything else, compared as strings) or an embedding (a 2-D
array, or a column of equal-width vectors); missing values (``None``, NaN, pandas' ``NA`` and
``NaT``, non-finite numbers, rows of an embedding with a non-finite entry) are dropped and
counted. What cannot be classified (dates, ragged vectors) keeps ``kind=None`` or a ``problem``,
so the report skips the column with a reason instead of guessing.

Dropped never means silently dropped: each side keeps a :class:`NonFinite` tally of what the
statistics did not see (missing or NaN, ``+inf``, ``-inf``; for embeddings, rows with such an
entry), so the report can give its share and alert when it is large.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpufleet.errors import UsageError
from gpufleet.quality.drift.columns import Floats, Kind


@dataclass(frozen=True, slots=True)
class NonFinite:
    """What one side of a column held that the statistics cannot use: missing values or NaN, +inf, -inf.

    For an embedding a row counts once, under its first kind of bad entry (NaN, then +inf, then -inf).
    """

    rows: int
    nan: int = 0
    posinf: int = 0
    neginf: int = 0

    @property
    def count(self) -> int:
        return self.nan + self.posinf + self.neginf

    @property
    def infinite(self) -> int:
        return self.posinf + self.neginf

    @property
    def share(self) -> float:
        """Non-finite rows over all rows (0 for an empty side)."""
        return self.count / self.rows if self.rows else 0.0

    def describe(self) -> str:
        """``"1,000 +inf, 3 NaN or missing"``; ``"none"`` when every value is finite."""
        parts = [
            f"{n:,} {label}"
            for n, label in ((self.posinf, "+inf"), (self.neginf, "-inf"), (self.nan, "NaN or missing"))
            if n
        ]
        return ", ".join(parts) or "none"

    def to_dict(self) -> dict[str, float]:
        return {"rows": self.rows, "nan": self.nan, "posinf": self.posinf, "neginf": self.neginf, "share": self.share}


@dataclass(frozen=True, slots=True)
class Side:
    """One side of one column, ready for the statistics: missing values dropped, numbers sorted."""

    kind: Kind | None
    values: NDArray[Any]
    missing: int
    problem: str | None = None
    non_finite: NonFinite = field(default_factory=lambda: NonFinite(0))
    """Every value the statistics do not see, by kind; ``missing`` is its total."""


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    return type(value).__name__ in {"NAType", "NaTType"}


def _numeric_side(arr: Floats) -> Side:
    ok = np.isfinite(arr)
    missing = int(arr.size - np.count_nonzero(ok))
    tally = NonFinite(arr.size)
    if missing:
        nan, posinf = int(np.count_nonzero(np.isnan(arr))), int(np.count_nonzero(np.isposinf(arr)))
        tally = NonFinite(arr.size, nan, posinf, missing - nan - posinf)
    values = arr[ok] if missing else arr.copy()  # one new array, sorted in place (np.sort would copy again)
    values.sort()
    return Side("numeric", values, missing, None, tally)


def _object_side(values: NDArray[Any], missing: NDArray[np.bool_]) -> Side:
    present = values[~missing]
    first = next((v for v in present[:1]), None)
    if isinstance(first, list | tuple | np.ndarray):
        rows = [np.asarray(v, dtype=np.float64).ravel() for v in present]
        widths = {r.size for r in rows}
        if len(widths) > 1:
            n = int(missing.sum())
            problem = f"embedding rows of widths {sorted(widths)}"
            return Side("embedding", np.empty((0, 0)), n, problem, NonFinite(values.size, n))
        matrix = np.vstack(rows) if rows else np.empty((0, 0))
        return _embedding_side(matrix, int(missing.sum()))
    n = int(missing.sum())
    return Side("categorical", np.asarray([str(v) for v in present], dtype=str), n, None, NonFinite(values.size, n))


def _embedding_side(matrix: Floats, missing: int) -> Side:
    ok = np.all(np.isfinite(matrix), axis=1) if matrix.size else np.zeros(matrix.shape[0], dtype=bool)
    bad = matrix[~ok]
    nan = np.any(np.isnan(bad), axis=1)
    posinf = ~nan & np.any(np.isposinf(bad), axis=1)
    n_nan, n_pos = int(nan.sum()), int(posinf.sum())
    tally = NonFinite(missing + matrix.shape[0], missing + n_nan, n_pos, bad.shape[0] - n_nan - n_pos)
    return Side("embedding", matrix[ok], missing + bad.shape[0], None, tally)


def side_of(raw: Any) -> Side:
    """Classify and clean one column: a pandas Series or anything ``numpy.asarray`` takes."""
    dtype_kind = getattr(getattr(raw, "dtype", None), "kind", None)
    if hasattr(raw, "to_numpy") and hasattr(raw, "isna") and dtype_kind is not None:
        if dtype_kind in "fiu":
            return _numeric_side(np.asarray(raw.to_numpy(dtype=np.float64, na_value=np.nan)))
        if dtype_kind in "Mmc":
            return Side(None, np.empty(0), 0, f"unsupported dtype {raw.dtype}", NonFinite(len(raw)))
        return _object_side(np.asarray(raw.to_numpy(dtype=object)), np.asarray(raw.isna(), dtype=bool))
    arr = np.asarray(raw)
    if arr.dtype.kind in "fiu" and (arr.ndim == 1 or (arr.ndim == 2 and arr.shape[1] == 1)):
        return _numeric_side(arr.astype(np.float64, copy=False).ravel())  # _numeric_side copies it once
    if arr.dtype.kind in "fiu" and arr.ndim == 2:
        return _embedding_side(arr.astype(np.float64), 0)
    if arr.ndim != 1 or arr.dtype.kind in "Mmc":
        problem = f"unsupported dtype {arr.dtype} with shape {arr.shape}"
        return Side(None, np.empty(0), 0, problem, NonFinite(arr.shape[0] if arr.ndim else 1))
    if arr.dtype.kind == "O":
        return _object_side(arr, np.fromiter((_is_missing(v) for v in arr), dtype=bool, count=arr.size))
    return Side("categorical", arr.astype(str), 0, None, NonFinite(arr.size))


def clean_column(raw: Any) -> tuple[Kind | None, NDArray[Any]]:
    """A column as the statistics see it: its kind (``None`` if unsupported) and its non-missing
    values (numbers sorted; a 2-D array for embeddings). For plots and for callers of the
    single statistics."""
    side = side_of(raw)
    return side.kind, side.values


def columns_of(data: Any, side: str) -> dict[str, Any]:
    """Column name -> raw column, for a mapping of arrays or a pandas DataFrame."""
    if isinstance(data, Mapping):
        return {str(k): v for k, v in data.items()}
    if hasattr(data, "columns") and hasattr(data, "__getitem__"):
        return {str(c): data[c] for c in data.columns}
    raise UsageError(f"the {side} data must be a pandas DataFrame or a mapping of column name to array")


def distinct_at_most(ref: Side, cur: Side, limit: int) -> int:
    """Distinct values on both sides together, counted exactly up to ``limit + 1``."""

    def uniques(side: Side) -> NDArray[Any]:
        v = side.values
        if side.kind == "numeric":
            return v[np.concatenate([[True], v[1:] != v[:-1]])] if v.size else v
        return np.unique(v)

    v = ref.values
    if ref.kind == "numeric" and v.size and 1 + np.count_nonzero(v[1:] != v[:-1]) > limit:
        return limit + 1  # sorted: counted without gathering the distinct values of 200,000 rows
    ref_unique = uniques(ref)
    if ref_unique.size > limit:
        return limit + 1
    return min(int(np.unique(np.concatenate([ref_unique, uniques(cur)])).size), limit + 1)


def is_constant(side: Side) -> bool:
    v = side.values
    if side.kind == "numeric":  # sorted: the ends tell
        return bool(v.shape[0] > 0 and v[0] == v[-1])
    return bool(v.shape[0] > 0 and np.all(v == v[0]))


__all__ = ["NonFinite", "Side", "clean_column", "columns_of", "distinct_at_most", "is_constant", "side_of"]
