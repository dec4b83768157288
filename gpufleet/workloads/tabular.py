"""A small tabular classifier, the model the quality loop retrains: a fleet job like any other.

``gpufleet.workloads.tabular:train`` reads one table (CSV or Parquet, through the bounded reader of
:mod:`gpufleet.tables` that the quality loop uses too), holds out a seeded share
of its rows, fits a one-hidden-layer network on the rest under a :class:`TrainSession` (so it
checkpoints, survives preemption and resumes bit-exactly: a batch is a pure function of the seed
and the data cursor), scores the holdout and writes the model and its metrics to the job folder::

    output/model/model.pt      the network's state_dict (loaded with ``weights_only=True``)
    output/model/model.json    the encoder (columns, categories, means, stds), metrics, data digest
    output/metrics.json        the holdout metrics and the data lineage, for the registry

The training process never talks to MLflow: the registry logs the finished job from that folder,
so a preempted attempt leaves no half-logged run and a node without access to the tracking store
can still train. This module is also the MLflow ``loader_module`` of the logged model
(``_load_pyfunc``): ``mlflow.pyfunc.load_model(uri).predict(frame)`` returns probabilities from
raw rows, with no pickled code in the artifact.

``make_dataset`` draws the synthetic data of ``gpufleet quality demo``: four numeric features and
a categorical ``segment``; ``drift=1`` shifts the covariates (x0's mean, x1's spread, the segment
mix) and changes the concept (x2's effect flips sign), so the drift report sees the first and only
the labels reveal the second.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from gpufleet.errors import UsageError
from gpufleet.runtime import TrainSession
from gpufleet.tables import read_table
from gpufleet.workloads import check_seed

if TYPE_CHECKING:
    import pandas as pd

MODEL_FORMAT = "gpufleet-tabular/1"
SEGMENTS = ("north", "south", "east")


# ---- data ------------------------------------------------------------------------------------


def make_dataset(rows: int, *, seed: int, drift: float = 0.0) -> pd.DataFrame:
    """Synthetic labelled rows; ``drift`` in [0, 1] moves covariates and concept together."""
    import pandas as pd

    if rows < 1 or not 0.0 <= drift <= 1.0:
        raise UsageError(f"make_dataset(rows={rows}, drift={drift}): give rows >= 1 and drift in [0, 1]")
    rng = np.random.default_rng(seed)
    x0 = rng.normal(1.0 * drift, 1.0, rows)
    x1 = rng.normal(0.0, 1.0 + 0.6 * drift, rows)
    x2 = rng.normal(0.0, 1.0, rows)
    x3 = rng.uniform(-1.7, 1.7, rows)
    mix = (1 - drift) * np.array([0.5, 0.3, 0.2]) + drift * np.array([0.2, 0.3, 0.5])
    segment = rng.choice(np.array(SEGMENTS), size=rows, p=mix)
    seg_effect = {"north": 0.4, "south": 0.0, "east": -0.4 + 1.2 * drift}
    logit = (
        1.4 * (x0 - 1.0 * drift)
        - 0.9 * x1
        + (1.2 - 2.4 * drift) * x2
        + 0.5 * x3
        + np.vectorize(seg_effect.get)(segment)
    )
    label = (rng.uniform(size=rows) < 1 / (1 + np.exp(-2.0 * logit))).astype(np.int64)
    return pd.DataFrame({"x0": x0, "x1": x1, "x2": x2, "x3": x3, "segment": segment, "label": label})


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes: the digest the lineage records for a dataset."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Encoder:
    """Raw rows to model inputs: standardised numeric columns, then one-hot categories.

    Fitted on the training rows only; a category unseen in training encodes as all zeros and a
    missing numeric value as the training mean, so a drifted table never crashes the model.
    """

    numeric: tuple[str, ...]
    categorical: tuple[tuple[str, tuple[str, ...]], ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def fit(cls, frame: pd.DataFrame, target: str) -> Encoder:
        numeric, categorical, mean, std = [], [], [], []
        for name in frame.columns:
            if name == target:
                continue
            col = frame[name]
            if col.dtype.kind in "biuf":
                values = col.to_numpy(dtype=np.float64)
                numeric.append(str(name))
                mean.append(float(np.nanmean(values)))
                std.append(float(max(np.nanstd(values), 1e-6)))
            else:
                categorical.append((str(name), tuple(sorted(str(v) for v in col.dropna().unique()))))
        if not numeric and not categorical:
            raise UsageError(f"the table has no feature column besides the target {target!r}")
        return cls(tuple(numeric), tuple(categorical), tuple(mean), tuple(std))

    @property
    def features(self) -> tuple[str, ...]:
        return self.numeric + tuple(name for name, _ in self.categorical)

    @property
    def width(self) -> int:
        return len(self.numeric) + sum(len(cats) for _, cats in self.categorical)

    def transform(self, frame: pd.DataFrame) -> NDArray[np.float32]:
        missing = [name for name in self.features if name not in frame.columns]
        if missing:
            raise UsageError(f"input rows lack the feature column(s) {', '.join(missing)}")
        parts = []
        for name, mu, sd in zip(self.numeric, self.mean, self.std, strict=True):
            values = frame[name].to_numpy(dtype=np.float64)
            parts.append(np.nan_to_num((values - mu) / sd, nan=0.0)[:, None])
        for name, cats in self.categorical:
            values = frame[name].astype(str).to_numpy()
            parts.append(np.stack([values == c for c in cats], axis=1).astype(np.float64))
        return np.concatenate(parts, axis=1).astype(np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {
            "numeric": list(self.numeric),
            "categorical": {name: list(cats) for name, cats in self.categorical},
            "mean": list(self.mean),
            "std": list(self.std),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Encoder:
        cats = tuple((str(k), tuple(str(c) for c in v)) for k, v in data["categorical"].items())
        return cls(tuple(data["numeric"]), cats, tuple(data["mean"]), tuple(data["std"]))


# ---- model and metrics -----------------------------------------------------------------------


class TabularNet(nn.Module):
    """Inputs -> ``hidden`` ReLU units -> one logit."""

    def __init__(self, width: int, hidden: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x).squeeze(-1)
        return out


def auc(labels: NDArray[Any], scores: NDArray[Any]) -> float:
    """ROC AUC as the Mann-Whitney U statistic over average ranks (ties count one half)."""
    y = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(np.asarray(scores, dtype=np.float64), return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # 1-based ranks, ties averaged
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def classification_metrics(labels: NDArray[Any], probs: NDArray[Any], threshold: float = 0.5) -> dict[str, float]:
    """AUC (ranking), accuracy at the serving threshold, log loss and Brier score (calibration)."""
    y = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probs, dtype=np.float64), 1e-7, 1 - 1e-7)
    if y.size == 0:
        raise UsageError("no labelled rows to score")
    return {
        "auc": auc(y, p),
        "accuracy": float(((p >= threshold) == (y >= 0.5)).mean()),
        "log_loss": float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()),
        "brier": float(((p - y) ** 2).mean()),
        "positive_rate": float((p >= threshold).mean()),
        "rows": float(y.size),
    }


class TabularModel:
    """A trained network with its encoder: ``predict`` maps raw rows to probabilities."""

    def __init__(self, net: TabularNet, encoder: Encoder, meta: Mapping[str, Any]) -> None:
        self.net = net.eval()
        self.encoder = encoder
        self.meta = dict(meta)

    def predict(self, model_input: Any, params: Mapping[str, Any] | None = None) -> NDArray[np.float64]:
        import pandas as pd

        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        with torch.no_grad():
            logits = self.net(torch.from_numpy(self.encoder.transform(frame)))
        return torch.sigmoid(logits).double().numpy()


def save_model(folder: Path, net: TabularNet, encoder: Encoder, meta: Mapping[str, Any]) -> None:
    """Write ``model.pt`` and ``model.json`` (the JSON last: a folder without it is incomplete)."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), folder / "model.pt")
    body = {"format": MODEL_FORMAT, "encoder": encoder.to_dict(), **meta}
    _write_json(folder / "model.json", body)


def load_model(folder: str | Path) -> TabularModel:
    """A model written by :func:`save_model` (weights only: no code is unpickled)."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / "model.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"{folder} holds no readable model.json ({err}); is it a tabular model folder?") from None
    if meta.get("format") != MODEL_FORMAT:
        raise UsageError(f"{folder}/model.json has format {meta.get('format')!r}, expected {MODEL_FORMAT!r}")
    encoder = Encoder.from_dict(meta["encoder"])
    net = TabularNet(encoder.width, int(meta["hidden"]))
    net.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
    return TabularModel(net, encoder, meta)


def _load_pyfunc(data_path: str) -> TabularModel:
    """MLflow's ``loader_module`` hook: ``data_path`` is the logged model folder."""
    return load_model(data_path)


def _write_json(path: Path, body: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


# ---- the job ---------------------------------------------------------------------------------


def _split(rows: int, holdout: float, seed: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    order = np.random.default_rng(seed).permutation(rows)
    n_hold = max(1, round(rows * holdout))
    return np.sort(order[n_hold:]), np.sort(order[:n_hold])


def output_dir(out: str | None) -> Path:
    """``out``, else ``$GPUFLEET_JOB_DIR/output`` under gpufleet, else ``./tabular-output``."""
    if out:
        return Path(out)
    job_dir = os.environ.get("GPUFLEET_JOB_DIR")
    return Path(job_dir) / "output" if job_dir else Path("tabular-output")


def train(
    data: str,
    target: str = "label",
    steps: int = 300,
    batch_size: int = 256,
    lr: float = 0.01,
    hidden: int = 32,
    seed: int = 0,
    holdout: float = 0.2,
    flip_negatives: float = 0.0,
    step_seconds: float = 0.0,
    out: str | None = None,
) -> dict[str, Any]:
    """Fit the classifier on ``data`` and write model and holdout metrics to the output folder.

    ``flip_negatives`` turns that share of negative *training* labels positive, as a broken label
    join does: the ranking survives (the noisy posterior ``p + q(1 - p)`` is monotone in ``p``),
    so AUC barely moves, but the decisions at the serving threshold go wrong. ``step_seconds``
    slows each step down so that a demo can preempt the job mid-run.
    """
    import pandas as pd

    if not 0 < holdout < 1 or not 0 <= flip_negatives < 1 or steps < 1 or batch_size < 1:
        raise UsageError("tabular.train: give 0 < holdout < 1, 0 <= flip_negatives < 1, steps >= 1, batch_size >= 1")
    check_seed(seed)
    path = Path(data)
    frame = read_table(path)
    if target not in frame.columns:
        raise UsageError(f"{path}: no target column {target!r}; columns are {', '.join(map(str, frame.columns))}")
    if len(frame) < 10:
        raise UsageError(f"{path}: {len(frame)} rows are too few to train and hold out (need 10 or more)")
    labels = pd.to_numeric(frame[target], errors="coerce")
    bad = (labels.isna() | ~labels.isin([0, 1])).to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = frame[target].iloc[row]
        shown = repr(value) if isinstance(value, str) else str(value)
        raise UsageError(
            f"{path}: target column {target!r} must hold 0/1 labels, none missing; row {row} has "
            f"{shown} ({int(bad.sum())} such row(s))"
        )
    train_idx, hold_idx = _split(len(frame), holdout, seed)
    train_rows, hold_rows = frame.iloc[train_idx], frame.iloc[hold_idx]
    encoder = Encoder.fit(train_rows, target)
    x = torch.from_numpy(encoder.transform(train_rows))
    y_np = train_rows[target].to_numpy(dtype=np.float64)
    if flip_negatives:
        noise = np.random.default_rng(seed + 1).uniform(size=y_np.size) < flip_negatives
        y_np = np.where((y_np < 0.5) & noise, 1.0, y_np)
    y = torch.from_numpy(y_np.astype(np.float32))

    torch.manual_seed(seed)
    net = TabularNet(encoder.width, hidden)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    started = time.time()
    with TrainSession.from_env(model=net, optimizer=optimizer, total_steps=steps) as sess:
        for _ in sess.steps():
            g = torch.Generator().manual_seed(seed * 100_003 + sess.data_position)
            idx = torch.randint(0, len(x), (min(batch_size, len(x)),), generator=g)
            loss = nn.functional.binary_cross_entropy_with_logits(net(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            if step_seconds:
                time.sleep(step_seconds)
            sess.report(loss)
        model = TabularModel(net, encoder, {})
        metrics = classification_metrics(hold_rows[target].to_numpy(), model.predict(hold_rows))
        sess.log("metrics", **metrics)
    folder = output_dir(out)
    lineage = {
        "data": str(path.resolve()),
        "data_sha256": file_sha256(path),
        "rows": len(frame),
        "train_rows": len(train_idx),
        "holdout_rows": len(hold_idx),
    }
    params = {
        "target": target,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "hidden": hidden,
        "seed": seed,
        "holdout": holdout,
        "flip_negatives": flip_negatives,
    }
    meta = {"hidden": hidden, "target": target, "threshold": 0.5, "metrics": metrics, "params": params, **lineage}
    save_model(folder / "model", net, encoder, meta)
    result = {
        "metrics": metrics,
        "params": params,
        "lineage": lineage,
        "final_loss": sess.last_loss,
        "steps": sess.step,
        "attempt_seconds": time.time() - started,
        "features": list(encoder.features),
    }
    _write_json(folder / "metrics.json", result)
    return result


__all__ = [
    "MODEL_FORMAT",
    "SEGMENTS",
    "Encoder",
    "TabularModel",
    "TabularNet",
    "auc",
    "classification_metrics",
    "file_sha256",
    "load_model",
    "make_dataset",
    "output_dir",
    "save_model",
    "train",
]
