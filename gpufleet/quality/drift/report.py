"""From two data sets to a drift report: a method per column, its verdict, the dataset's, the JSON.

Apart from the statistics (``columns``, ``mmd``) because this is the policy around them: which
method a column gets, when a column cannot be tested, how p-values are corrected and how the
columns' verdicts add up to the dataset's.

The automatic choice per column is Evidently 0.7's (``_get_default_stattest``): tests on small
references (<= 1,000 rows), distances on large ones, so the same inputs give the same verdicts::

    numeric,     reference <= 1,000 rows: ks (p <= 0.05); chi2 (p < 0.05) if <= 5 distinct values, z if <= 2
    numeric,     reference  > 1,000 rows: wasserstein normed (>= 0.1); jensenshannon (>= 0.1) if <= 5 values
    categorical, reference <= 1,000 rows: chi2, or z when there are <= 2 distinct values
    categorical, reference  > 1,000 rows: jensenshannon (>= 0.1)
    embedding:                            mmd (permutation p < 0.05)

and the dataset drifts when at least ``drift_share`` (0.5) of the tested columns drift.

Beyond Evidently: Benjamini-Hochberg across the columns' p-values (``correction="bh"``, by
``scipy.stats.false_discovery_control``; ``"by"``, Benjamini-Yekutieli, holds under any dependence
between columns), and the PSI's noise floor (a PSI drifts only above ``psi_null_quantile`` too,
see ``columns``).

Opt-in, for monitors that must bound their false alarms (``monitor.AlarmControl``):
``method="test"`` gives every column a two-sample test whatever the reference's size, the one
Evidently uses on small references, with a two-sample chi-squared::

    numeric, > 5 distinct values: ks;  numeric <= 5 values, categorical: chi2_homogeneity;  embedding: mmd

and ``effect_floor`` makes a significant column drift only when its effect, scale-free and
measured beside the test, reaches the floor of its measure (``EFFECT_OF``): the normed
Wasserstein distance for ``ks``, the Jensen-Shannon distance for the chi-squared and z tests,
MMD^2 for ``mmd``. The effect and its floor are in the column's ``extra`` (``effect``,
``effect_floor``).

Bad input never crashes and never reads as "no drift". Each column comes back with a ``status``:

- ``"ok"``: measured; ``drift`` is ``True`` or ``False``;
- ``"skipped"``: the column does not fit a test (empty, all missing, absent from one side, of
  another type on each side, constant in the reference, too few rows for the method):
  ``drift=None`` and the reason. Skipped columns are listed in the verdict;
- ``"untestable"``: the column has values but no number could be trusted: nothing finite is left
  on a side once ``+inf``/``-inf`` are dropped, the statistic (or, for a test, its p-value) came
  out NaN, or a distance overflows float64 (a raw Wasserstein distance above 1.8e308), or the
  computation failed. ``drift=None``, ``statistic=None`` and the reason. Overflow is avoided where
  it can be (``columns.power_of_two_scale``: columns near +-1e308 are measured correctly), so
  only what truly cannot be measured is untestable.

Non-finite values (NaN or missing, ``+inf``, ``-inf``) are dropped before the statistics but
never silently: each column reports, per side, their counts and share (``non_finite``), and a
share above ``max_non_finite`` (default 5 %) on either side is an ``alert`` for that column,
whatever its statistic says (the statistic only saw the finite rest).

The dataset's ``status``: ``"drift"`` when at least ``drift_share`` of the tested columns drift;
otherwise ``"untestable"`` when no column could be tested, ``"incomplete"`` when a column is
untestable or alerts on non-finite values (the verdict then says "incomplete, drift not ruled
out", never "no dataset drift"), and ``"no_drift"`` only when neither happened. ``dataset_drift``
keeps its meaning (the share rule over tested columns) for the callers that weigh it
(``policy``, ``monitor``); ``gpufleet drift --fail-on-drift`` exits 1 on any status but
``"no_drift"``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import stats

from gpufleet.errors import ParameterError, UsageError
from gpufleet.fmt import finite_or_none
from gpufleet.quality.drift.clean import NonFinite, Side, columns_of, distinct_at_most, is_constant, side_of
from gpufleet.quality.drift.columns import (
    FEW_VALUES,
    METHODS,
    SMALL_REFERENCE_ROWS,
    Kind,
    Method,
    chi2,
    chi2_homogeneity,
    jensen_shannon,
    ks,
    psi_null_quantile,
    psi_proportions,
    psi_value,
    resolve_method,
    wasserstein_parts,
    z_test,
)
from gpufleet.quality.drift.mmd import mmd_test

Status = Literal["ok", "skipped", "untestable"]
DatasetStatus = Literal["drift", "no_drift", "incomplete", "untestable"]

MAX_NON_FINITE = 0.05
"""Default alert line: more than this share of non-finite values on either side of a column."""

Correction = Literal["none", "bh", "by"]
EFFECT_OF = {
    "ks": "wasserstein",
    "chi2": "jensenshannon",
    "chi2_homogeneity": "jensenshannon",
    "z": "jensenshannon",
    "mmd": "mmd",
}
"""The scale-free effect measured beside each test, which ``effect_floor`` is keyed by."""


def _percent(share: float) -> str:
    return f"{share * 100:.3g}%"


def _names(columns: Sequence[ColumnDrift], most: int = 5) -> str:
    names = [c.column for c in columns]
    more = f" +{len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


@dataclass(frozen=True)
class ColumnDrift:
    """The verdict on one column; ``drift`` is ``None`` when the column was skipped or is untestable.

    ``non_finite`` has each side's tally of dropped values (``None`` for a side without the
    column); ``alert`` says why the column alerts beyond its statistic (too many non-finite
    values), ``None`` when it does not.
    """

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
    non_finite: dict[str, NonFinite | None] = field(default_factory=dict)
    alert: str | None = None

    @property
    def non_finite_share(self) -> float | None:
        """The larger side's share of non-finite values (``None`` when no side was seen)."""
        shares = [t.share for t in self.non_finite.values() if t is not None]
        return max(shares) if shares else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "kind": self.kind,
            "method": self.method,
            "statistic": finite_or_none(self.statistic),
            "p_value": finite_or_none(self.p_value),
            "threshold": finite_or_none(self.threshold),
            "drift": self.drift,
            "status": self.status,
            "reason": self.reason,
            "extra": {k: finite_or_none(v) for k, v in self.extra.items()},
            "non_finite": {s: (t.to_dict() if t is not None else None) for s, t in self.non_finite.items()},
            "alert": self.alert,
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
    max_non_finite: float = MAX_NON_FINITE
    """A column alerts when either side has more than this share of non-finite values."""

    @property
    def tested(self) -> int:
        return sum(c.status == "ok" for c in self.columns)

    @property
    def skipped(self) -> int:
        return sum(c.status == "skipped" for c in self.columns)

    @property
    def untestable(self) -> int:
        return sum(c.status == "untestable" for c in self.columns)

    @property
    def alerted(self) -> int:
        """Columns with an ``alert`` (too many non-finite values), whatever their status."""
        return sum(c.alert is not None for c in self.columns)

    @property
    def drifted(self) -> int:
        return sum(c.drift is True for c in self.columns)

    @property
    def status(self) -> DatasetStatus:
        """``drift``, else ``untestable`` (no column tested), ``incomplete`` (a column untestable or
        alerting), ``no_drift``: only the last one clears the data."""
        if self.dataset_drift:
            return "drift"
        if not self.tested:
            return "untestable"
        if self.untestable or self.alerted:
            return "incomplete"
        return "no_drift"

    @property
    def verdict(self) -> str:
        notes = [f"{self.skipped} skipped"] if self.skipped else []
        if self.untestable:
            bad = [c for c in self.columns if c.status == "untestable"]
            notes.append(f"{self.untestable} untestable ({_names(bad)})")
        if self.alerted:
            alerting = [c for c in self.columns if c.alert is not None]
            notes.append(f"{self.alerted} over {_percent(self.max_non_finite)} non-finite ({_names(alerting)})")
        if not self.tested:
            return f"no column could be tested ({', '.join(notes) or 'no columns'}): no verdict"
        head = {"drift": "dataset drift", "incomplete": "incomplete, drift not ruled out"}.get(
            self.status, "no dataset drift"
        )
        return (
            f"{head}: {self.drifted} of {self.tested} tested columns drifted "
            f"({self.share_drifted:.0%}, threshold {self.drift_share_threshold:.0%})"
            + "".join(f", {note}" for note in notes)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "dataset_drift": self.dataset_drift,
            "share_drifted": finite_or_none(self.share_drifted),
            "drift_share_threshold": self.drift_share_threshold,
            "tested": self.tested,
            "skipped": self.skipped,
            "untestable": self.untestable,
            "drifted": self.drifted,
            "alerts": self.alerted,
            "max_non_finite": self.max_non_finite,
            "correction": self.correction,
            "verdict": self.verdict,
            "columns": {c.column: c.to_dict() for c in self.columns},
        }


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float | np.floating) else repr(str(value))


def _test_method(kind: Kind, ref: Side, cur: Side) -> Method:
    """``method="test"``: Evidently's choice for a small reference, at any size, with a two-sample chi-squared."""
    if kind == "embedding":
        return METHODS["mmd"]
    if kind == "numeric" and distinct_at_most(ref, cur, FEW_VALUES) > FEW_VALUES:
        return METHODS["ks"]
    return METHODS["chi2_homogeneity"]


def _auto_method(kind: Kind, ref: Side, cur: Side) -> Method:
    """Evidently 0.7's default test for a column (``_get_default_stattest``)."""
    if kind == "embedding":
        return METHODS["mmd"]
    distinct = distinct_at_most(ref, cur, FEW_VALUES)
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
    untestable: str | None = None
    non_finite: dict[str, NonFinite | None] = field(default_factory=dict)


def _why_untestable(name: str, ref: Side, cur: Side) -> tuple[Status, str] | None:
    """Why the column cannot be measured at all: ``("skipped", why)`` when it does not fit a test,
    ``("untestable", why)`` when a side had values but none finite."""
    for label, side in (("reference", ref), ("current", cur)):
        if side.problem is not None:
            return "skipped", f"{label}: {side.problem}"
    if ref.kind != cur.kind:
        return "skipped", f"type differs: {ref.kind} in the reference, {cur.kind} in the current data"
    if ref.kind == "embedding" and ref.values.shape[1:] != cur.values.shape[1:] and cur.values.size:
        return "skipped", f"embedding width differs: {ref.values.shape[1]} in the reference, {cur.values.shape[1]} now"
    for label, side in (("reference", ref), ("current", cur)):
        if side.values.shape[0] == 0:
            tally = side.non_finite
            if tally.infinite:
                return "untestable", (
                    f"{label}: nothing finite left to measure, all {tally.count:,} values are non-finite "
                    f"({tally.describe()})"
                )
            return "skipped", f"{label}: all {side.missing} values are missing" if side.missing else f"{label}: no rows"
    if is_constant(ref):
        return "skipped", f"reference has a single value ({_show(ref.values[0])}): nothing to measure a change against"
    return None


def _unmeasured(method: Method, statistic: float, p: float | None) -> str | None:
    """Why a computed statistic cannot decide: NaN, or the number the decision rests on is infinite.

    A chi-squared of ``inf`` with p = 0 (a category new in the current data) is a valid answer:
    tests decide on their p-value, distances on their statistic."""
    if math.isnan(statistic) or (p is not None and math.isnan(p)):
        return f"{method.name} gave NaN on these values: they could not be measured"
    decisive = p if method.uses_p_value else statistic
    if decisive is None or not math.isfinite(decisive):
        hint = " (the normed wasserstein, scale-free, stays finite)" if method.name == "wasserstein_raw" else ""
        return f"{method.name} overflows float64 on these values: the distance exceeds 1.8e308{hint}"
    return None


TEST_PERMUTATIONS = 1000
"""MMD permutations under ``method="test"``: p-values down to 1/1001, small enough for BH at 0.01 over 10 columns."""


def _measure(
    ref: Side, cur: Side, method: Method, threshold: float, permutations: int = 200
) -> tuple[float, float | None, dict[str, float]]:
    """Statistic, p-value (tests only) and extras of one method on one cleaned column."""
    r, c = ref.values, cur.values
    sizes = {"n_reference": float(r.shape[0]), "n_current": float(c.shape[0])}
    if method.name == "ks":
        statistic, p = ks(r, c)
        return statistic, p, sizes
    if method.name == "chi2":
        statistic, p = chi2(r, c)
        return statistic, p, sizes
    if method.name == "chi2_homogeneity":
        statistic, p = chi2_homogeneity(r, c)
        return statistic, p, sizes
    if method.name == "z":
        statistic, p = z_test(r, c)
        return statistic, p, sizes
    if method.name == "psi":
        rp, cp = psi_proportions(r, c, 10)
        value = psi_value(rp, cp, 1e-4)
        quantile = psi_null_quantile(r.shape[0], c.shape[0], rp.size)
        return value, None, {**sizes, "psi_null_quantile": quantile, "bins": float(rp.size)}
    if method.name in ("wasserstein", "wasserstein_raw"):
        distance, normed, std = wasserstein_parts(r, c)
        extra = {**sizes, "wasserstein_raw": distance, "reference_std": std}
        return (normed if method.name == "wasserstein" else distance), None, extra
    if method.name == "jensenshannon":
        return jensen_shannon(r, c), None, sizes
    res = mmd_test(r, c, permutations=permutations)
    extra = {**sizes, "bandwidth": res.bandwidth, "permutations": float(res.permutations)}
    return res.statistic, res.p_value, extra


def _effect(method: Method, ref: Side, cur: Side, statistic: float) -> float:
    """The test's scale-free effect (``EFFECT_OF``): what ``effect_floor`` compares."""
    measure = EFFECT_OF[method.name]
    if measure == "wasserstein":
        return wasserstein_parts(ref.values, cur.values)[1]  # numeric sides are sorted
    if measure == "jensenshannon":
        return jensen_shannon(ref.values, cur.values)
    return statistic


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


def _evaluate(
    name: str,
    ref_raw: Any,
    cur_raw: Any,
    method_name: str | None,
    threshold: float | None,
    floors: Mapping[str, float] | None = None,
) -> _Outcome:
    choose = _test_method if method_name == "test" else _auto_method
    requested = None if method_name in (None, "auto", "test") else resolve_method(str(method_name))
    if ref_raw is None or cur_raw is None:
        side = side_of(cur_raw if ref_raw is None else ref_raw)
        where = "reference" if ref_raw is None else "current data"
        seen: dict[str, NonFinite | None] = {"reference": side.non_finite, "current": None}
        if ref_raw is None:
            seen = {"reference": None, "current": side.non_finite}
        skip = f"missing from the {where}"
        return _Outcome(name, side.kind or "categorical", _label(requested), math.nan, skip=skip, non_finite=seen)
    ref, cur = side_of(ref_raw), side_of(cur_raw)
    tallies: dict[str, NonFinite | None] = {"reference": ref.non_finite, "current": cur.non_finite}
    kind: Kind = ref.kind or cur.kind or "categorical"
    status, problem = _why_untestable(name, ref, cur) or ("ok", None)
    method = requested
    if method is None and problem is None:
        method = choose(kind, ref, cur)
    thr = math.nan if method is None else _threshold_for(method, threshold)
    if problem is None and method is not None:
        problem = _why_not_method(method, kind, ref, cur)
    if status == "untestable":
        return _Outcome(name, kind, _label(method), thr, untestable=problem, non_finite=tallies)
    if problem is not None or method is None:
        return _Outcome(name, kind, _label(method), thr, skip=problem, non_finite=tallies)
    try:
        with np.errstate(all="ignore"):  # overflow and NaN are judged below, from the numbers
            permutations = TEST_PERMUTATIONS if method_name == "test" else 200
            statistic, p, extra = _measure(ref, cur, method, thr, permutations)
    except (ArithmeticError, ValueError) as err:
        why = f"{method.name} could not be computed on these values: {err}"
        return _Outcome(name, kind, method.name, thr, untestable=why, non_finite=tallies)
    if ref.missing or cur.missing:
        extra = {**extra, "missing_reference": float(ref.missing), "missing_current": float(cur.missing)}
    why_not = _unmeasured(method, statistic, p)
    if why_not is not None:
        return _Outcome(name, kind, method.name, thr, extra=extra, untestable=why_not, non_finite=tallies)
    if floors is not None and method.name in EFFECT_OF:
        with np.errstate(all="ignore"):
            effect = _effect(method, ref, cur, statistic)
        extra = {**extra, "effect": effect, "effect_floor": floors.get(EFFECT_OF[method.name], 0.0)}
    return _Outcome(
        name, kind, method.name, thr, statistic, p, extra, None, method.uses_p_value, method.inclusive, None, tallies
    )


def _label(method: Method | None) -> str:
    return "auto" if method is None else method.name


def _why_not_method(method: Method, kind: Kind, ref: Side, cur: Side) -> str | None:
    if kind not in method.kinds:
        return f"{method.name} applies to {' or '.join(sorted(method.kinds))} columns, this one is {kind}"
    fewest = min(ref.values.shape[0], cur.values.shape[0])
    if fewest < method.min_rows:
        return f"{method.name} needs at least {method.min_rows} non-missing rows a side, found {fewest}"
    if method.name == "z" and distinct_at_most(ref, cur, 2) > 2:
        return "z compares two proportions: the column has more than two distinct values (use chi2)"
    return None


def _alert(tallies: Mapping[str, NonFinite | None], line: float) -> str | None:
    """Why a column alerts on its non-finite values (more than ``line`` of a side), or ``None``."""
    over = [f"{side} {t.share:.1%} ({t.describe()})" for side, t in tallies.items() if t is not None and t.share > line]
    return f"non-finite values above {_percent(line)}: " + "; ".join(over) if over else None


def _decide(
    o: _Outcome, adjusted_p: float | None, max_non_finite: float = MAX_NON_FINITE, correction: Correction = "bh"
) -> ColumnDrift:
    alert = _alert(o.non_finite, max_non_finite)
    if o.skip is not None:
        return ColumnDrift(
            o.column, o.kind, o.method, None, None, o.threshold, None, "skipped", o.skip, {}, o.non_finite, alert
        )
    if o.untestable is not None:
        return ColumnDrift(
            o.column,
            o.kind,
            o.method,
            None,
            None,
            o.threshold,
            None,
            "untestable",
            o.untestable,
            dict(o.extra),
            o.non_finite,
            alert,
        )
    extra = dict(o.extra)
    if o.uses_p_value:
        p = o.p_value if adjusted_p is None else adjusted_p
        if adjusted_p is not None:
            extra[f"{correction}_adjusted_p"] = adjusted_p
        assert p is not None
        drift = p <= o.threshold if o.inclusive else p < o.threshold
        drift = drift and not extra.get("effect", math.inf) < extra.get("effect_floor", 0.0)  # NaN effect: no floor
    else:
        assert o.statistic is not None
        drift = o.statistic >= o.threshold and o.statistic > extra.get("psi_null_quantile", -math.inf)
    return ColumnDrift(
        o.column,
        o.kind,
        o.method,
        o.statistic,
        o.p_value,
        o.threshold,
        bool(drift),
        "ok",
        None,
        extra,
        o.non_finite,
        alert,
    )


PARALLEL_MIN_VALUES = 200_000
"""Above this many values in all, columns are measured on a thread per core (sorting releases the GIL)."""


def _evaluate_all(
    jobs: Sequence[tuple[str, Any, Any, str | None, float | None, Mapping[str, float] | None]],
) -> list[_Outcome]:
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


def _check_floors(floors: Mapping[str, float] | None) -> None:
    measures = sorted(set(EFFECT_OF.values()))
    for measure, floor in (floors or {}).items():
        if measure not in measures:
            raise UsageError(f"effect floor for {measure!r}: the effect measures are {', '.join(measures)}")
        if isinstance(floor, bool) or not isinstance(floor, int | float) or not (math.isfinite(floor) and floor >= 0):
            raise UsageError(f"effect floor {floor!r} for {measure}: give a number >= 0, e.g. 0.1")


def drift_report(
    reference: Any,
    current: Any,
    *,
    columns: Sequence[str] | None = None,
    method: str | Mapping[str, str] | None = None,
    threshold: float | Mapping[str, float] | None = None,
    drift_share: float = 0.5,
    correction: Correction = "none",
    max_non_finite: float = MAX_NON_FINITE,
    effect_floor: Mapping[str, float] | None = None,
) -> DriftReport:
    """Compare every column (or ``columns``) of ``current`` against ``reference``.

    ``reference`` and ``current`` are pandas DataFrames or mappings of column name to array (a
    2-D array or a column of vectors is an embedding). ``method`` and ``threshold`` are one value
    for every column or a mapping per column; unset columns get Evidently's automatic choice.
    A column with more than ``max_non_finite`` of its rows non-finite (NaN or missing, +-inf) on
    either side alerts (``1`` turns the alert off). ``method="test"`` tests every column (see the
    module's docstring); ``effect_floor`` (by measure: ``wasserstein``, ``jensenshannon``, ``mmd``)
    makes a test's column drift only when its effect reaches the floor too.
    """
    if correction not in ("none", "bh", "by"):
        raise UsageError(f"correction {correction!r}: use none, bh or by")
    _check_floors(effect_floor)
    if not 0 < drift_share <= 1:
        raise UsageError(f"drift share {drift_share!r} must be in (0, 1]")
    if not 0 <= max_non_finite <= 1:
        raise ParameterError(
            "{max_non_finite} is a share of rows: give one from 0 to 1, e.g. {default}",
            max_non_finite=max_non_finite,
            default=MAX_NON_FINITE,
        )
    ref_cols, cur_cols = columns_of(reference, "reference"), columns_of(current, "current")
    names = list(columns) if columns is not None else [*ref_cols, *(c for c in cur_cols if c not in ref_cols)]
    absent = [n for n in names if n not in ref_cols and n not in cur_cols]
    if absent:
        raise UsageError(f"no column {absent[0]!r} in either data set: columns are {', '.join(ref_cols) or 'none'}")
    methods, thresholds = _per_column(method, names, "method"), _per_column(threshold, names, "threshold")
    jobs = [(n, ref_cols.get(n), cur_cols.get(n), methods[n], thresholds[n], effect_floor) for n in names]
    outcomes = _evaluate_all(jobs)
    adjusted: dict[int, float] = {}
    if correction != "none":
        tested = [
            i
            for i, o in enumerate(outcomes)
            if o.skip is None and o.untestable is None and o.uses_p_value and o.p_value is not None
        ]
        fdr = stats.false_discovery_control([outcomes[i].p_value or 0.0 for i in tested], method=correction)
        adjusted = {i: float(p) for i, p in zip(tested, np.atleast_1d(fdr), strict=True)}
    verdicts = [_decide(o, adjusted.get(i), max_non_finite, correction) for i, o in enumerate(outcomes)]
    tested_n = sum(v.status == "ok" for v in verdicts)
    share = sum(v.drift is True for v in verdicts) / tested_n if tested_n else 0.0
    dataset_drift = bool(tested_n and share >= drift_share)
    return DriftReport(verdicts, dataset_drift, share, drift_share, correction, max_non_finite)


__all__ = [
    "EFFECT_OF",
    "MAX_NON_FINITE",
    "PARALLEL_MIN_VALUES",
    "TEST_PERMUTATIONS",
    "ColumnDrift",
    "Correction",
    "DatasetStatus",
    "DriftReport",
    "Status",
    "drift_report",
]
