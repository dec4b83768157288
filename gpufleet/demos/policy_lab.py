"""Lab: a drift-only retraining policy against one that decides on estimated performance, on two streams.

Both policies are :func:`gpufleet.quality.policy.decide` with the same thresholds (persistence,
cool-down), fed the same standing-monitor drift report per window (:func:`controlled_report`
against the champion's reference). The performance policy also gets the window's CBPE estimate
of ROC AUC (:func:`gpufleet.quality.estimate.estimate_performance`) and, ``label_delay`` windows
later, its realised AUC. The truth is known, so every window's *realised* AUC under whichever
champion served it is measured: what each policy's retrains bought.

The streams, both seeded:

- **seasonal**: the weekly shop of ``gpufleet quality lab-seasonal`` (weekends buy more, on phones;
  from day 38 prices shown 25 % higher and a tablet app), with a label: whether the order is
  returned, drawn from the order's *true* basket, items, session and device. The champion learned
  the weekly cycle from two weeks of orders; each day's mix still differs from that fortnight's.
- **covariate**: five inputs and a calibrated champion. From window 8, two inputs the label does not
  depend on move (a shift the model handles); from window 18, the main input ``x0`` squeezes towards
  the decision boundary and ``x1``, a field left at 0 while the champion was trained (so it never used it),
  starts to vary and to drive the label (a shift that really hurts it, and that a retrain on the new
  rows repairs).

A retrain at window ``i`` fits a new champion (logistic regression) on the last ``train_windows``
windows up to ``i`` with their labels (the retraining job waits for them), half the rows to fit
and half as its reference; it serves from window ``i + 1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from gpufleet.quality.policy import Evidence, PolicyConfig, PolicyState, decide, evidence_from_report

if TYPE_CHECKING:
    import pandas as pd

Mode = Literal["drift", "performance"]
DAY_S = 86_400.0
TARGET = "y"
SCORE = "score"
LAB_POLICY = PolicyConfig(persistence=2, alert_share=0.2, cooldown_s=2 * DAY_S, max_model_age_s=None)
"""Two windows of drift in a row retrain the drift-only policy; a retrain holds the next ones back two windows."""


# ---- the champion -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Champion:
    """A logistic regression on standardised numbers and one-hot categories, fitted by Newton's method."""

    numbers: tuple[str, ...]
    categories: dict[str, tuple[str, ...]]
    mean: NDArray[np.float64]
    std: NDArray[np.float64]
    coef: NDArray[np.float64]

    @classmethod
    def fit(cls, frame: pd.DataFrame, numbers: Sequence[str], categorical: Sequence[str] = ()) -> Champion:
        cats = {c: tuple(sorted(map(str, frame[c].unique())))[1:] for c in categorical}
        raw = frame[list(numbers)].to_numpy(dtype=np.float64)
        mean, std = raw.mean(axis=0), raw.std(axis=0)
        std[std < 1e-9] = 1.0
        model = cls(tuple(numbers), cats, mean, std, np.zeros(0))
        x = model._design(frame)
        y = frame[TARGET].to_numpy(dtype=np.float64)
        coef = np.zeros(x.shape[1])
        ridge = 1e-3 * np.eye(x.shape[1])
        for _ in range(25):  # Newton-Raphson (IRLS) on the log-likelihood, a tiny ridge for separable data
            p = 1.0 / (1.0 + np.exp(-(x @ coef)))
            step = np.linalg.solve(x.T @ (x * (p * (1 - p))[:, None]) + ridge, x.T @ (y - p) - ridge @ coef)
            coef = coef + step
            if float(np.abs(step).max()) < 1e-8:
                break
        return cls(tuple(numbers), cats, mean, std, coef)

    def _design(self, frame: pd.DataFrame) -> NDArray[np.float64]:
        parts = [
            np.ones((len(frame), 1)),
            (frame[list(self.numbers)].to_numpy(dtype=np.float64) - self.mean) / self.std,
        ]
        for column, values in self.categories.items():
            text = frame[column].astype(str).to_numpy()
            parts.append(np.stack([text == v for v in values], axis=1).astype(np.float64).reshape(len(frame), -1))
        return np.hstack(parts)

    def score(self, frame: pd.DataFrame) -> NDArray[np.float64]:
        """The probability that each row is positive."""
        return 1.0 / (1.0 + np.exp(-(self._design(frame) @ self.coef)))


def roc_auc(label: NDArray[Any], score: NDArray[np.float64]) -> float:
    """Mann-Whitney ROC AUC (ties count a half); NaN with one class only."""
    from scipy.stats import mannwhitneyu

    y = np.asarray(label) >= 0.5
    if y.all() or not y.any():
        return math.nan
    return float(mannwhitneyu(score[y], score[~y]).statistic) / (int(y.sum()) * int((~y).sum()))


# ---- the streams --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stream:
    """A labelled history to train the first champion on, and the windows that follow (labels known to the lab)."""

    name: str
    train: pd.DataFrame
    reference: pd.DataFrame
    windows: list[pd.DataFrame]
    labels: list[str]
    phases: list[str]
    """Per window: what the data did (``before``, ``handled shift``, ``harmful shift``, ``weekly cycle`` ...)."""
    numbers: tuple[str, ...]
    categorical: tuple[str, ...] = ()
    train_windows: int = 1
    drift_columns: tuple[str, ...] = field(default=())


def _sigmoid(x: NDArray[np.float64]) -> NDArray[np.float64]:
    return 1.0 / (1.0 + np.exp(-x))


def seasonal_stream(seed: int = 0) -> Stream:
    """The weekly shop with a return label; two weeks train the champion, the next four are watched."""
    import pandas as pd

    from gpufleet.demos.quality_labs import DAY_S as SHOP_DAY_S
    from gpufleet.demos.quality_labs import day_label, weekly_shop

    shift_day = 38
    data = weekly_shop(seed, days=42, shift_day=shift_day)
    frame = pd.DataFrame(data.columns)
    day = (frame["ts"] // SHOP_DAY_S).astype(int)
    shown = frame["basket_eur"].to_numpy(dtype=np.float64)
    paid = shown / np.where(day >= shift_day, 1.25, 1.0)  # the label follows what was paid, not the bug's figure
    tablet = (frame["device"] == "tablet").to_numpy(dtype=np.float64)
    logit = (
        -1.6
        + 1.1 * (np.log(paid) - 3.35)
        + 0.35 * (frame["items"].to_numpy() - 2.5)
        - 0.08 * (frame["session_min"].to_numpy() - 6.0)
        + 0.6 * tablet
    )
    rng = np.random.default_rng(seed + 1)
    frame[TARGET] = (rng.uniform(size=len(frame)) < _sigmoid(logit)).astype(int)
    frame["log_basket"] = np.log(frame["basket_eur"])
    frame = frame.drop(columns=["ts"])
    history = frame[day < 14]
    days = list(range(14, 42))
    return Stream(
        name="seasonal",
        train=history.iloc[0::2],
        reference=history.iloc[1::2],
        windows=[frame[day == d].reset_index(drop=True) for d in days],
        labels=[day_label(d) for d in days],
        phases=["prices +25%, tablet app" if d >= shift_day else "weekly cycle" for d in days],
        numbers=("log_basket", "items", "session_min"),
        categorical=("device",),
        train_windows=7,
        drift_columns=("basket_eur", "items", "session_min", "device"),
    )


def covariate_stream(
    seed: int = 0, *, windows: int = 28, rows: int = 2000, handled_at: int = 8, harmful_at: int = 18
) -> Stream:
    """Inputs that move in ways the champion handles (from ``handled_at``), then in a way that hurts it."""
    import pandas as pd

    rng = np.random.default_rng(seed)

    def draw(n: int, phase: str) -> pd.DataFrame:
        handled = phase != "before"
        harmful = phase == "harmful shift"
        x0 = rng.normal(0.0, 0.35 if harmful else 1.0, n)
        x1 = rng.normal(0.0, 1.0, n) if harmful else np.zeros(n)  # a field left empty (0) until then
        x2 = rng.normal(1.0 if handled else 0.0, 1.0, n)
        x3 = rng.gamma(2.0, 1.6 if handled else 1.0, n)
        x4 = rng.normal(0.8 if handled else 0.0, 1.0, n)
        logit = 2.5 * x0 + 2.0 * x1 + 0.5 * x4
        y = (rng.uniform(size=n) < _sigmoid(logit)).astype(int)
        return pd.DataFrame({"x0": x0, "x1": x1, "x2": x2, "x3": x3, "x4": x4, TARGET: y})

    history = draw(8000, "before")
    phases = [
        "before" if i < handled_at else "handled shift" if i < harmful_at else "harmful shift" for i in range(windows)
    ]
    return Stream(
        name="covariate",
        train=history.iloc[0::2],
        reference=history.iloc[1::2],
        windows=[draw(rows, phase) for phase in phases],
        labels=[f"window {i}" for i in range(windows)],
        phases=phases,
        numbers=("x0", "x1", "x2", "x3", "x4"),
        train_windows=2,
        drift_columns=("x0", "x1", "x2", "x3", "x4"),
    )


# ---- one policy over one stream -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """What one policy did over one stream, and what the served champions achieved."""

    mode: Mode
    actions: list[str]
    """Per window: the window's decision (``pass``, ``alert``, ``retrain``)."""
    reasons: list[list[str]]
    labels_actions: list[str | None]
    """Per window: the decision on its labels when they arrived (performance policy), else ``None``."""
    realised: list[float]
    """Per window: the served champion's realised ROC AUC."""
    estimated: list[float | None]
    retrained_after: list[int]
    """Windows after which a new champion was trained (it served from the next one)."""

    @property
    def retrains(self) -> int:
        return len(self.retrained_after)

    def to_dict(self) -> dict[str, Any]:
        finite = [r for r in self.realised if math.isfinite(r)]
        return {
            "mode": self.mode,
            "retrains": self.retrains,
            "retrained_after": self.retrained_after,
            "alerts": sum(a == "alert" for a in self.actions) + sum(a == "alert" for a in self.labels_actions),
            "realised_mean": float(np.mean(finite)) if finite else None,
            "realised_min": float(np.min(finite)) if finite else None,
            "actions": self.actions,
            "labels_actions": self.labels_actions,
            "reasons": self.reasons,
            "realised": [r if math.isfinite(r) else None for r in self.realised],
            "estimated": self.estimated,
        }


@dataclass
class _Serving:
    """The champion in service, its reference (scored, labelled) and its generation."""

    champion: Champion
    reference: pd.DataFrame
    generation: int = 0


def _serve(stream: Stream, fit: pd.DataFrame, reference: pd.DataFrame, generation: int) -> _Serving:
    champion = Champion.fit(fit, stream.numbers, stream.categorical)
    return _Serving(champion, reference.assign(**{SCORE: champion.score(reference)}), generation)


def _estimate_fields(serving: _Serving, window: pd.DataFrame) -> dict[str, Any]:
    from gpufleet.quality.estimate import estimate_performance

    est = estimate_performance(
        serving.reference, window.drop(columns=[TARGET]), target=TARGET, metric="roc_auc", score=SCORE
    )
    return {
        "estimate_metric": "roc_auc",
        "estimated": est.estimated,
        "estimated_lower": est.lower,
        "estimated_upper": est.upper,
        "estimate_threshold": est.threshold,
        "estimate_reference": est.reference,
    }


def run_policy(stream: Stream, mode: Mode, *, cfg: PolicyConfig = LAB_POLICY, label_delay: int = 3) -> PolicyRun:
    """Replay ``stream`` under one policy: decide each window, retrain when told, measure the served champion."""
    import pandas as pd

    from gpufleet.quality.monitor import controlled_report

    serving = _serve(stream, stream.train, stream.reference, 0)
    state = PolicyState()
    n = len(stream.windows)
    run = PolicyRun(mode, [], [], [None] * n, [], [], [])
    waiting: dict[int, tuple[int, dict[str, Any], float, int]] = {}
    for i, raw in enumerate(stream.windows):
        at = (i + 1) * DAY_S
        window = raw.assign(**{SCORE: serving.champion.score(raw)})
        realised = roc_auc(window[TARGET].to_numpy(), window[SCORE].to_numpy())
        cols = list(stream.drift_columns)
        report = controlled_report(serving.reference[cols], window[cols])
        fields = _estimate_fields(serving, window) if mode == "performance" else {}
        decision = decide(cfg, state, evidence_from_report(report, window=stream.labels[i], at=at, **fields))
        state = decision.state
        retrain = decision.action == "retrain"
        if mode == "performance":
            waiting[i + label_delay] = (i, fields, realised, serving.generation)
        if i in waiting and not retrain:  # labels of an earlier window, served by the champion still in service
            j, earlier, value, generation = waiting.pop(i)
            if generation == serving.generation:
                labels = Evidence(
                    window=stream.labels[j],
                    at=at,
                    kind="labels",
                    metric_name="roc_auc",
                    metric=value,
                    baseline_metric=earlier["estimate_reference"],
                    **earlier,
                )
                late = decide(cfg, state, labels)
                state = late.state
                run.labels_actions[j] = late.action
                retrain = late.action == "retrain"
        run.actions.append(decision.action)
        run.reasons.append(list(decision.reasons))
        run.realised.append(realised)
        run.estimated.append(fields.get("estimated"))
        if retrain and i + 1 < n:
            recent = pd.concat(stream.windows[max(0, i + 1 - stream.train_windows) : i + 1], ignore_index=True)
            serving = _serve(stream, recent.iloc[0::2], recent.iloc[1::2], serving.generation + 1)
            run.retrained_after.append(i)
    return run


# ---- the lab ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyLab:
    """Both policies over both streams."""

    streams: dict[str, tuple[Stream, dict[Mode, PolicyRun]]]
    label_delay: int

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label_delay": self.label_delay, "policy": LAB_POLICY.to_dict(), "streams": {}}
        for name, (stream, runs) in self.streams.items():
            out["streams"][name] = {
                "windows": stream.labels,
                "phases": stream.phases,
                "policies": {mode: run.to_dict() for mode, run in runs.items()},
            }
        return out


def policy_lab(seed: int = 0, *, label_delay: int = 3) -> PolicyLab:
    """Run the drift-only and the performance policy over the seasonal and the covariate-shift stream."""
    streams = {}
    for stream in (seasonal_stream(seed), covariate_stream(seed)):
        runs: dict[Mode, PolicyRun] = {
            mode: run_policy(stream, mode, label_delay=label_delay) for mode in ("drift", "performance")
        }
        streams[stream.name] = (stream, runs)
    return PolicyLab(streams, label_delay)


__all__ = [
    "LAB_POLICY",
    "Champion",
    "PolicyLab",
    "PolicyRun",
    "Stream",
    "covariate_stream",
    "policy_lab",
    "roc_auc",
    "run_policy",
    "seasonal_stream",
]
