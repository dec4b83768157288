"""The retraining policy: from one window's evidence to ``pass``, ``alert`` or ``retrain``.

Three triggers, as in Module 2's retraining strategy (drift, performance, calendar):

- **drift**: the window's drift report. Dataset drift (the share of drifted columns reached the
  report's threshold) must *persist* over ``persistence`` consecutive windows before it asks for
  a retrain; until then, and whenever at least ``alert_share`` of the columns drift, it alerts.
  One drifted window is often seasonality or a bad batch; k in a row rarely is.
- **performance**, once labels arrive: the drop of the champion's metric below the value it had
  at validation. Labels are ground truth, so a drop past ``retrain_drop`` retrains at once (no
  persistence); past ``alert_drop`` it alerts. The metric is higher-is-better (AUC, accuracy).
- **calendar**: a model older than ``max_model_age_s`` is retrained whatever the data say.

**With an estimate** of the metric (CBPE or DLE, :mod:`gpufleet.quality.estimate`: the champion's
performance estimated from its scores, before any label arrives), the policy decides on performance,
not on drift, as NannyML's workflow does: the estimate retrains when its band's upper bound is below
the threshold (for a lower-is-better metric, its lower bound above it) and alerts when the estimate
itself is past the threshold within its band. Drift then only alerts when the estimate *moved*: the
metric's reference value is outside the window's band; drift that leaves the reference inside the
band passes, and says so, because a shift the model handles costs nothing to ignore and a retrain to
chase. Drift alone never retrains when an estimate is present. When the window's labels arrive later
(``kind="labels"``: the drift streak is left as it was), the realised metric (``metric``) meets the
drop-vs-baseline trigger, and a gap ``|realised - estimated|`` above ``max_gap`` alerts as a possible
concept shift: estimation assumes P(y | x) did not change, so a change of it shows only in this gap.

A retrain starts a **cool-down** of ``cooldown_s``: a retrain asked for inside it is downgraded
to an alert (the evidence says until when), so a slow retraining job or a persistent drift does
not submit a retrain every window. Every decision carries its evidence (the numbers and the
thresholds that led to it) and is appended to a JSONL log, from which the state is rebuilt.

``decide`` is pure: it takes the policy, the state and the evidence and returns the decision and
the next state; the caller passes the clock (``evidence.at``) and owns the log file.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpufleet.errors import UsageError
from gpufleet.fmt import finite_or_none

if TYPE_CHECKING:
    from gpufleet.quality.drift import DriftReport

Action = Literal["pass", "alert", "retrain"]
EvidenceKind = Literal["window", "labels"]
SCHEMA_VERSION = 1
_RANK: dict[str, int] = {"pass": 0, "alert": 1, "retrain": 2}


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyConfig:
    """Thresholds of the three triggers, persistence and cool-down."""

    persistence: int = 2
    """Consecutive windows with dataset drift before drift asks for a retrain."""
    alert_share: float = 0.2
    """Share of drifted columns from which a window alerts even without dataset drift."""
    alert_drop: float = 0.02
    """Metric drop (champion's validation value minus the window's) that alerts."""
    retrain_drop: float = 0.05
    """Metric drop that retrains at once."""
    max_model_age_s: float | None = 30 * 86400.0
    """Calendar trigger: retrain a champion older than this (``None``: never)."""
    cooldown_s: float = 86400.0
    """After a retrain, further retrains are downgraded to alerts for this long."""
    max_gap: float = 0.05
    """Realised minus estimated metric, in absolute value, that alerts as a possible concept shift.

    In the metric's own units: 0.05 of AUC or accuracy is about three times the error of a CBPE estimate
    on chunks of a few thousand rows; a regression metric (MAE, RMSE) needs a gap in its own scale."""

    def __post_init__(self) -> None:
        if self.persistence < 1:
            raise UsageError(f"persistence={self.persistence}: give at least 1 window")
        if not 0 < self.alert_share <= 1:
            raise UsageError(f"alert_share={self.alert_share}: give a share in (0, 1]")
        if not 0 <= self.alert_drop <= self.retrain_drop:
            raise UsageError(
                f"alert_drop={self.alert_drop}, retrain_drop={self.retrain_drop}: need 0 <= alert <= retrain"
            )
        if self.max_model_age_s is not None and self.max_model_age_s <= 0:
            raise UsageError(f"max_model_age_s={self.max_model_age_s}: give a positive age or None")
        if self.cooldown_s < 0:
            raise UsageError(f"cooldown_s={self.cooldown_s}: give 0 or more seconds")
        if not (math.isfinite(self.max_gap) and self.max_gap >= 0):
            raise UsageError(f"max_gap={self.max_gap}: give a gap >= 0 in the metric's units, e.g. 0.05")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Evidence:
    """What is known about one window when it closes."""

    window: str
    at: float
    """Unix time the window closed (the decision's clock)."""
    dataset_drift: bool | None = None
    """The drift report's verdict; ``None`` when no report was run."""
    share_drifted: float | None = None
    drift_share_threshold: float | None = None
    drifted_columns: tuple[str, ...] = ()
    unmeasured_columns: tuple[str, ...] = ()
    """Columns the report could not measure: untestable, or too many non-finite values."""
    metric_name: str | None = None
    metric: float | None = None
    """The champion's metric on this window's labels, once they have arrived."""
    baseline_metric: float | None = None
    """The champion's metric at validation, the reference for the drop."""
    model_trained_at: float | None = None
    kind: EvidenceKind = "window"
    """``window``: the window as it closed; ``labels``: its labels arrived later (drift is not judged again)."""
    estimate_metric: str | None = None
    """The estimated metric's name (``roc_auc``, ``mae``); ``metric`` is its realised value when they match."""
    estimated: float | None = None
    """The champion's metric on this window estimated without labels (CBPE, DLE)."""
    estimated_lower: float | None = None
    estimated_upper: float | None = None
    """The estimate's band: the estimate plus or minus its sampling error (three standard errors)."""
    estimate_threshold: float | None = None
    """The value past which the estimated metric is too poor (from the reference's chunks)."""
    estimate_reference: float | None = None
    """The metric on the reference data: outside the window's band, the estimate moved."""
    higher_is_better: bool = True
    """``False`` for error metrics (MAE, RMSE): drops, thresholds and bands are read the other way round."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyState:
    """What the policy remembers between windows."""

    drift_streak: int = 0
    """Consecutive windows with dataset drift, up to and including the last one."""
    last_retrain_at: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """One window's verdict, its reasons, and everything it was computed from."""

    window: str
    at: float
    action: Action
    reasons: tuple[str, ...]
    evidence: dict[str, Any]
    thresholds: dict[str, Any]
    state: PolicyState
    """The state after this decision."""
    triggers: tuple[str, ...] = field(default=())
    """Which triggers asked for more than ``pass`` (``drift``, ``performance``, ``calendar``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "window": self.window,
            "at": self.at,
            "action": self.action,
            "triggers": list(self.triggers),
            "reasons": list(self.reasons),
            "evidence": self.evidence,
            "thresholds": self.thresholds,
            "state": asdict(self.state),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        state = data.get("state") or {}
        return cls(
            window=str(data["window"]),
            at=float(data["at"]),
            action=data["action"],
            reasons=tuple(data.get("reasons", ())),
            evidence=dict(data.get("evidence", {})),
            thresholds=dict(data.get("thresholds", {})),
            state=PolicyState(
                drift_streak=int(state.get("drift_streak", 0)), last_retrain_at=state.get("last_retrain_at")
            ),
            triggers=tuple(data.get("triggers", ())),
        )


def evidence_from_report(report: DriftReport, *, window: str, at: float, **more: Any) -> Evidence:
    """Evidence from a drift report (``more``: the performance and calendar fields)."""
    drifted = tuple(c.column for c in report.columns if c.drift is True)
    tested = sum(c.status == "ok" for c in report.columns)
    return Evidence(
        window=window,
        at=at,
        dataset_drift=report.dataset_drift if tested else None,
        share_drifted=report.share_drifted if tested else None,
        drift_share_threshold=report.drift_share_threshold,
        drifted_columns=drifted,
        unmeasured_columns=tuple(c.column for c in report.columns if c.status == "untestable" or c.alert is not None),
        **more,
    )


def _drift(cfg: PolicyConfig, ev: Evidence, streak: int) -> tuple[Action, str | None]:
    unmeasured = ", ".join(ev.unmeasured_columns)
    if ev.kind == "labels":
        return "pass", None  # the window's drift was judged when it closed
    if ev.dataset_drift is None:
        return ("alert", f"drift could not be measured ({unmeasured})") if unmeasured else ("pass", None)
    share = ev.share_drifted or 0.0
    cols = f" ({', '.join(ev.drifted_columns)})" if ev.drifted_columns else ""
    if ev.estimated is not None and (ev.dataset_drift or share >= cfg.alert_share):
        return _drift_on_estimate(ev, "dataset drift" if ev.dataset_drift else f"{share:.0%} of columns drifted", cols)
    if ev.dataset_drift and streak >= cfg.persistence:
        return "retrain", f"dataset drift in {streak} consecutive windows (persistence {cfg.persistence}){cols}"
    if ev.dataset_drift:
        return "alert", f"dataset drift{cols}, {streak} of {cfg.persistence} windows needed to retrain"
    if share >= cfg.alert_share:
        return "alert", f"{share:.0%} of columns drifted (alert at {cfg.alert_share:.0%}){cols}"
    if unmeasured:  # a clean verdict on the rest does not clear what could not be measured
        return "alert", f"drift not ruled out: {unmeasured} could not be measured"
    return "pass", None


def _band(ev: Evidence) -> tuple[float, float, float]:
    """The estimate and its band, ``(estimated, lower, upper)``; a missing bound is the estimate itself."""
    est = float(ev.estimated) if ev.estimated is not None else math.nan
    lower = ev.estimated_lower if ev.estimated_lower is not None else est
    upper = ev.estimated_upper if ev.estimated_upper is not None else est
    return est, min(lower, upper), max(lower, upper)


def _estimate_text(ev: Evidence) -> str:
    est, lower, upper = _band(ev)
    return f"estimated {ev.estimate_metric or 'metric'} {est:.4g} (band {lower:.4g} to {upper:.4g})"


def _drift_on_estimate(ev: Evidence, what: str, cols: str) -> tuple[Action, str]:
    """Drift with an estimate present: an alert if the estimate moved (the reference is outside its band), else pass."""
    est, lower, upper = _band(ev)
    ref = ev.estimate_reference
    if ref is None or not all(math.isfinite(v) for v in (est, lower, upper, ref)):
        return "alert", f"{what}{cols}; {_estimate_text(ev)} has no finite reference to tell whether it moved"
    if lower <= ref <= upper:
        return "pass", (
            f"{what}{cols} does not move the {_estimate_text(ev)}: its reference value {ref:.4g} is inside the band"
        )
    return "alert", f"{what}{cols} moves the {_estimate_text(ev)}: its reference value {ref:.4g} is outside the band"


def _estimate(ev: Evidence) -> tuple[Action, str | None]:
    """The estimated metric against its threshold: beyond the band retrains, within it alerts."""
    if ev.estimated is None:
        return "pass", None
    est, lower, upper = _band(ev)
    text, thr = _estimate_text(ev), ev.estimate_threshold
    if not all(math.isfinite(v) for v in (est, lower, upper)):
        return "alert", f"{text} is not finite: check the champion's scores in this window"
    if thr is None or not math.isfinite(thr):
        return "pass", f"{text}, no threshold to compare it with"
    worse = "below" if ev.higher_is_better else "above"
    edge = upper if ev.higher_is_better else lower
    if (edge < thr) if ev.higher_is_better else (edge > thr):
        return "retrain", f"{text} is {worse} its threshold {thr:.4g} beyond its band"
    if (est < thr) if ev.higher_is_better else (est > thr):
        return "alert", f"{text} is {worse} its threshold {thr:.4g} within its band"
    return "pass", f"{text} is not {worse} its threshold {thr:.4g}"


def _gap(cfg: PolicyConfig, ev: Evidence) -> tuple[Action, str | None, float | None]:
    """Realised against estimated: a gap the estimate's assumptions cannot explain alerts (concept shift)."""
    same = ev.metric_name is None or ev.estimate_metric is None or ev.metric_name == ev.estimate_metric
    if ev.metric is None or ev.estimated is None or not same:
        return "pass", None, None
    if not (math.isfinite(ev.metric) and math.isfinite(ev.estimated)):
        return "pass", None, None  # a non-finite side is reported by its own trigger
    gap = abs(ev.metric - ev.estimated)
    what = f"realised {ev.estimate_metric or ev.metric_name or 'metric'} {ev.metric:.4g} vs {_estimate_text(ev)}"
    if gap > cfg.max_gap:
        return "alert", f"{what}: gap {gap:.4g} > max_gap {cfg.max_gap:g}, a possible concept shift", gap
    return "pass", None, gap


def _performance(cfg: PolicyConfig, ev: Evidence) -> tuple[Action, str | None, float | None]:
    if ev.metric is None or ev.baseline_metric is None:
        return "pass", None, None
    if not (math.isfinite(ev.metric) and math.isfinite(ev.baseline_metric)):
        return "alert", f"{ev.metric_name or 'metric'} is not finite ({ev.metric}): check the labels", None
    drop = ev.baseline_metric - ev.metric if ev.higher_is_better else ev.metric - ev.baseline_metric
    name = ev.metric_name or "metric"
    what = f"{name} {ev.metric:.4g} vs {ev.baseline_metric:.4g} at validation (drop {drop:.4g})"
    if drop > cfg.retrain_drop:
        return "retrain", f"{what} > {cfg.retrain_drop:g}", drop
    if drop > cfg.alert_drop:
        return "alert", f"{what} > {cfg.alert_drop:g}", drop
    return "pass", None, drop


def _calendar(cfg: PolicyConfig, ev: Evidence) -> tuple[Action, str | None, float | None]:
    if ev.model_trained_at is None:
        return "pass", None, None
    age = ev.at - ev.model_trained_at
    if cfg.max_model_age_s is not None and age > cfg.max_model_age_s:
        return "retrain", f"model is {age / 86400:.1f} days old (max {cfg.max_model_age_s / 86400:.1f})", age
    return "pass", None, age


def decide(cfg: PolicyConfig, state: PolicyState, ev: Evidence) -> Decision:
    """The window's action and the next state (pure: same inputs, same decision)."""
    streak = state.drift_streak if ev.kind == "labels" else state.drift_streak + 1 if ev.dataset_drift else 0
    verdicts: list[tuple[str, Action, str | None]] = []
    drift_action, drift_reason = _drift(cfg, ev, streak)
    verdicts.append(("drift", drift_action, drift_reason))
    verdicts.append(("estimate", *_estimate(ev)))
    perf_action, perf_reason, drop = _performance(cfg, ev)
    verdicts.append(("performance", perf_action, perf_reason))
    gap_action, gap_reason, gap = _gap(cfg, ev)
    verdicts.append(("gap", gap_action, gap_reason))
    cal_action, cal_reason, age = _calendar(cfg, ev)
    verdicts.append(("calendar", cal_action, cal_reason))

    action: Action = max((a for _, a, _ in verdicts), key=_RANK.__getitem__)
    reasons = [r for _, a, r in verdicts if r and a != "pass"]
    notes = [r for _, a, r in verdicts if r and a == "pass"]  # why a trigger that looked did not fire
    triggers = tuple(name for name, a, _ in verdicts if a != "pass")
    cooldown_until = state.last_retrain_at + cfg.cooldown_s if state.last_retrain_at is not None else None
    if action == "retrain" and cooldown_until is not None and ev.at < cooldown_until:
        action = "alert"
        reasons.append(f"retrain held back: cool-down after the last retrain runs {cooldown_until - ev.at:.0f}s more")
    reasons += notes
    if action == "pass" and not notes:
        reasons.append("no trigger fired")
    retrained = action == "retrain"
    next_state = PolicyState(
        drift_streak=0 if retrained else streak,
        last_retrain_at=ev.at if retrained else state.last_retrain_at,
    )
    evidence = {
        "dataset_drift": ev.dataset_drift,
        "share_drifted": ev.share_drifted,
        "drift_share_threshold": ev.drift_share_threshold,
        "drifted_columns": list(ev.drifted_columns),
        "drift_streak": streak,
        "metric_name": ev.metric_name,
        "metric": finite_or_none(ev.metric),
        "baseline_metric": finite_or_none(ev.baseline_metric),
        "metric_drop": drop,
        "model_age_s": age,
        "cooldown_until": cooldown_until,
        **_estimate_evidence(ev, gap),
    }
    return Decision(
        window=ev.window,
        at=ev.at,
        action=action,
        reasons=tuple(reasons),
        evidence=evidence,
        thresholds=cfg.to_dict(),
        state=next_state,
        triggers=triggers,
    )


def _estimate_evidence(ev: Evidence, gap: float | None) -> dict[str, Any]:
    """The estimate's part of a decision's evidence (all ``None`` without an estimate), JSON-safe."""
    return {
        "kind": ev.kind,
        "estimate_metric": ev.estimate_metric,
        "estimated": finite_or_none(ev.estimated),
        "estimated_lower": finite_or_none(ev.estimated_lower),
        "estimated_upper": finite_or_none(ev.estimated_upper),
        "estimate_threshold": finite_or_none(ev.estimate_threshold),
        "estimate_reference": finite_or_none(ev.estimate_reference),
        "realised_gap": gap,
        "higher_is_better": ev.higher_is_better,
    }


def replay(cfg: PolicyConfig, windows: Iterable[Evidence], state: PolicyState | None = None) -> list[Decision]:
    """Decide a sequence of windows in order, threading the state through."""
    out: list[Decision] = []
    current = state or PolicyState()
    for ev in windows:
        decision = decide(cfg, current, ev)
        out.append(decision)
        current = decision.state
    return out


class DecisionLog:
    """Append-only JSONL of decisions; the policy's state is the last line's ``state``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, decision: Decision) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(decision.to_dict(), sort_keys=True, allow_nan=False, default=str) + "\n"
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def read(self) -> list[Decision]:
        if not self.path.exists():
            return []
        out = []
        for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append(Decision.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError) as err:
                raise UsageError(f"{self.path}:{n}: not a policy decision ({err}); the log is append-only") from None
        return out

    def state(self) -> PolicyState:
        decisions = self.read()
        return decisions[-1].state if decisions else PolicyState()


__all__ = [
    "SCHEMA_VERSION",
    "Action",
    "Decision",
    "DecisionLog",
    "Evidence",
    "EvidenceKind",
    "PolicyConfig",
    "PolicyState",
    "decide",
    "evidence_from_report",
    "replay",
]
