"""The standing monitor's performance evidence: each window's estimated metric, and its realised one once labels arrive.

A model's monitor entry may name an estimate and where labels arrive::

    estimate: {metric: roc_auc, target: y, score: p, chunk_size: 500}   # or prediction: yhat for regression
    labels: data/labels/          # a CSV/Parquet file or a folder of them: id_column and the target
    id_column: id                 # joins a window's rows with their labels (default: id)

Each window's metric is estimated when the window is checked (CBPE for classification, DLE for
regression: :func:`gpufleet.quality.estimate.estimate_performance`, on the reference's labelled rows and
the window's scores), recorded in ``performance.jsonl`` and given to the policy, which then decides on
the estimate rather than on drift. Labels come later, keyed by row id: a later round joins them with
a checked window's rows and, once ``min_labelled`` of the rows have one, computes the realised metric
on those rows, records it beside the estimate and asks the policy once more (``kind="labels"``): the
drop against the reference's value and the gap to the estimate. Each window gets at most one such
decision, across rounds and restarts (:func:`labels_pending`).

The functions here are pure over tables and records; :mod:`gpufleet.quality.standing` reads the
files, holds the lock and appends the lines.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.errors import UsageError
from gpufleet.fmt import finite_or_none

if TYPE_CHECKING:
    import pandas as pd

    from gpufleet.quality.estimate import PerformanceEstimate

MAX_LABEL_FILES = 10_000
"""A labels folder holds at most this many files: more is a folder to compact, not one to read every round."""
_NAME = Field(min_length=1, max_length=256)


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` is a better model (AUC, accuracy) or a worse one (MAE, RMSE)."""
    from gpufleet.quality.estimate import METRICS_REGRESSION

    return metric not in METRICS_REGRESSION


class EstimateConfig(BaseModel):
    """How a window's metric is estimated: the metric, the reference's target, the champion's output columns."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    metric: Literal["roc_auc", "f1", "precision", "recall", "accuracy", "mae", "mse", "rmse"]
    """Classification (CBPE, ``score`` needed) or regression (DLE, ``prediction`` needed)."""
    target: str = _NAME
    """The label column: in the reference (which must be labelled), and in the labels that arrive later."""
    score: str | list[str] | None = None
    """The champion's probability column (a list: one per class)."""
    prediction: str | None = Field(default=None, min_length=1, max_length=256)
    """The champion's predicted value (regression) or class."""
    chunk_size: int | None = Field(default=None, ge=10, le=10_000_000)
    """Rows per chunk of the reference, whose spread sets the threshold and the band."""
    min_labelled: float = Field(default=0.9, gt=0, le=1)
    """Share of a window's rows with a label before its realised metric is computed (once)."""

    @model_validator(mode="after")
    def _output(self) -> EstimateConfig:
        if not higher_is_better(self.metric) and self.prediction is None:
            raise ValueError(f"{self.metric} estimates a regressor: name its output column with prediction")
        if higher_is_better(self.metric) and not self.score:
            raise ValueError(f"{self.metric} estimates a classifier: name its probability column with score")
        return self


def _line_key(line: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return line.get("window"), line.get("size"), line.get("mtime_ns")


def estimate_record(
    cfg: EstimateConfig, reference: pd.DataFrame, frame: pd.DataFrame, *, id_column: str
) -> PerformanceEstimate:
    """The window's estimate (raises :class:`UsageError` when a column is missing or the reference is unlabelled).

    A regressor's nanny model learns from the columns both tables share, never from the row id.
    """
    from gpufleet.quality.estimate import estimate_performance

    skip = {cfg.target, cfg.prediction, id_column}
    features = [str(c) for c in reference.columns if c in frame.columns and c not in skip]
    return estimate_performance(
        reference,
        frame,
        target=cfg.target,
        metric=cfg.metric,
        score=cfg.score,
        prediction=cfg.prediction,
        chunk_size=cfg.chunk_size,
        features=features if id_column in frame.columns else None,
    )


def estimate_line(cfg: EstimateConfig, est: PerformanceEstimate, rows: int) -> dict[str, Any]:
    """What ``performance.jsonl`` records of a window's estimate (the caller adds the window's stamp)."""
    return {
        "record": "estimate",
        "metric": cfg.metric,
        "method": est.kind,
        "estimated": finite_or_none(est.estimated),
        "lower": finite_or_none(est.lower),
        "upper": finite_or_none(est.upper),
        "threshold": finite_or_none(est.threshold),
        "reference": finite_or_none(est.reference),
        "alert": bool(est.alert),
        "realised": finite_or_none(est.realised),
        "rows": rows,
        "chunks": len(est.chunks),
    }


def evidence_fields(cfg: EstimateConfig, line: Mapping[str, Any]) -> dict[str, Any]:
    """The policy's :class:`~gpufleet.quality.policy.Evidence` fields from an estimate line.

    A realised value already in the line (the window carried its labels) is the ``metric``, against the
    reference's value, so the same decision also weighs the drop and the gap.
    """
    fields: dict[str, Any] = {
        "estimate_metric": cfg.metric,
        "estimated": _number(line.get("estimated"), math.nan),
        "estimated_lower": _number(line.get("lower")),
        "estimated_upper": _number(line.get("upper")),
        "estimate_threshold": _number(line.get("threshold")),
        "estimate_reference": _number(line.get("reference")),
        "higher_is_better": higher_is_better(cfg.metric),
    }
    realised = _number(line.get("realised"))
    if realised is not None:
        fields.update(metric_name=cfg.metric, metric=realised, baseline_metric=fields["estimate_reference"])
    return fields


def _number(value: Any, default: float | None = None) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)


# ---- labels -------------------------------------------------------------------------------------


def label_files(path: Path) -> list[Path]:
    """The labels tables at ``path``: the file itself, or each visible CSV/Parquet file of the folder, by name."""
    from gpufleet.tables import CSV_SUFFIXES, PARQUET_SUFFIXES

    if not os.path.isdir(path):
        return [path] if os.path.exists(path) else []
    try:
        with os.scandir(path) as entries:
            names = sorted(
                e.name
                for e in entries
                if not e.name.startswith(".")
                and e.is_file()
                and e.name.lower().endswith(CSV_SUFFIXES + PARQUET_SUFFIXES)
            )
    except OSError as err:
        raise UsageError(f"cannot list the labels folder {path.name!r}: {err.strerror}") from None
    if len(names) > MAX_LABEL_FILES:
        raise UsageError(f"the labels folder {path.name!r} holds {len(names)} files: merge them into fewer")
    return [path / n for n in names]


def read_labels(path: Path, *, id_column: str, target: str) -> pd.DataFrame:
    """Every label that has arrived at ``path``: one row per id (the last file, by name, wins), ids as text.

    Ids are compared as text, so ``7`` in a CSV and ``"7"`` in a Parquet file are the same row.
    """
    import pandas as pd

    from gpufleet.tables import read_table

    parts = []
    for file in label_files(path):
        table = read_table(file)
        missing = [c for c in (id_column, target) if c not in table.columns]
        if missing:
            raise UsageError(f"labels file {file.name!r} has no column {missing[0]!r}: give {id_column} and {target}")
        parts.append(table[[id_column, target]])
    if not parts:
        return pd.DataFrame({id_column: pd.Series(dtype=str), target: pd.Series(dtype=float)})
    labels = pd.concat(parts, ignore_index=True)
    labels[id_column] = labels[id_column].astype(str)
    labels = labels[labels[target].notna()]
    return labels.drop_duplicates(subset=id_column, keep="last")


def realised_line(
    cfg: EstimateConfig, frame: pd.DataFrame, labels: pd.DataFrame, *, id_column: str
) -> dict[str, Any] | None:
    """The realised metric on the window's labelled rows, or ``None`` while fewer than ``min_labelled`` have one.

    A window without the id column can never be joined: its line says so (an ``error``) and ends the wait.
    """
    from gpufleet.quality.estimate import realised_metric

    rows = len(frame)
    if id_column not in frame.columns:
        return {"record": "realised", "metric": cfg.metric, "rows": rows, "error": f"the window has no {id_column!r}"}
    keys = frame[id_column].astype(str)
    joined = frame.drop(columns=[cfg.target], errors="ignore").assign(**{id_column: keys})
    joined = joined.merge(labels, on=id_column, how="inner")
    if not rows or len(joined) < cfg.min_labelled * rows:
        return None
    line: dict[str, Any] = {"record": "realised", "metric": cfg.metric, "rows": rows, "labelled_rows": len(joined)}
    try:
        line["realised"] = finite_or_none(
            realised_metric(joined, target=cfg.target, metric=cfg.metric, score=cfg.score, prediction=cfg.prediction)
        )
    except UsageError as err:
        line["error"] = " ".join(str(err).split())
    return line


def labels_pending(lines: Iterable[Mapping[str, Any]], decided: Mapping[str, float]) -> list[dict[str, Any]]:
    """The estimate lines still waiting for their labels: the latest per window, without a realised line.

    ``decided`` maps a window to the time of its latest labels decision: one at or after the estimate
    means the decision was taken (its realised line may have been lost to a crash), so it is never taken twice.
    """
    latest: dict[Any, dict[str, Any]] = {}
    done: set[tuple[Any, Any, Any]] = set()
    for line in lines:
        if line.get("record") == "estimate":  # the latest version of a window replaces the ones before
            latest[line.get("window")] = dict(line)
        elif line.get("record") == "realised":
            done.add(_line_key(line))
    out = []
    for window, line in latest.items():
        at = _number(line.get("at"), 0.0) or 0.0
        waiting = line.get("estimated") is not None and line.get("realised") is None and not line.get("error")
        if not waiting or _line_key(line) in done or decided.get(str(window), -math.inf) >= at:
            continue
        out.append(line)
    return out


def performance_series(lines: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per window checked, in order: the estimate with its band and threshold, and the realised metric once known."""
    rows: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for line in lines:
        key = _line_key(line)
        if line.get("record") == "estimate":
            rows[key] = {
                "window": line.get("window"),
                "at": line.get("at"),
                "metric": line.get("metric"),
                **{k: line.get(k) for k in ("estimated", "lower", "upper", "threshold", "reference", "alert")},
                "realised": line.get("realised"),
                "labelled_at": None,
                "error": line.get("error"),
            }
        elif line.get("record") == "realised" and key in rows:
            rows[key].update(realised=line.get("realised"), labelled_at=line.get("at"))
            rows[key]["error"] = rows[key]["error"] or line.get("error")
    return list(rows.values())


__all__ = [
    "MAX_LABEL_FILES",
    "EstimateConfig",
    "estimate_line",
    "estimate_record",
    "evidence_fields",
    "higher_is_better",
    "label_files",
    "labels_pending",
    "performance_series",
    "read_labels",
    "realised_line",
]
