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
    if ev.dataset_drift is None:
        return ("alert", f"drift could not be measured ({unmeasured})") if unmeasured else ("pass", None)
    share = ev.share_drifted or 0.0
    cols = f" ({', '.join(ev.drifted_columns)})" if ev.drifted_columns else ""
    if ev.dataset_drift and streak >= cfg.persistence:
        return "retrain", f"dataset drift in {streak} consecutive windows (persistence {cfg.persistence}){cols}"
    if ev.dataset_drift:
        return "alert", f"dataset drift{cols}, {streak} of {cfg.persistence} windows needed to retrain"
    if share >= cfg.alert_share:
        return "alert", f"{share:.0%} of columns drifted (alert at {cfg.alert_share:.0%}){cols}"
    if unmeasured:  # a clean verdict on the rest does not clear what could not be measured
        return "alert", f"drift not ruled out: {unmeasured} could not be measured"
    return "pass", None


def _performance(cfg: PolicyConfig, ev: Evidence) -> tuple[Action, str | None, float | None]:
    if ev.metric is None or ev.baseline_metric is None:
        return "pass", None, None
    if not (math.isfinite(ev.metric) and math.isfinite(ev.baseline_metric)):
        return "alert", f"{ev.metric_name or 'metric'} is not finite ({ev.metric}): check the labels", None
    drop = ev.baseline_metric - ev.metric
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
    streak = state.drift_streak + 1 if ev.dataset_drift else 0
    verdicts: list[tuple[str, Action, str | None]] = []
    drift_action, drift_reason = _drift(cfg, ev, streak)
    verdicts.append(("drift", drift_action, drift_reason))
    perf_action, perf_reason, drop = _performance(cfg, ev)
    verdicts.append(("performance", perf_action, perf_reason))
    cal_action, cal_reason, age = _calendar(cfg, ev)
    verdicts.append(("calendar", cal_action, cal_reason))

    action: Action = max((a for _, a, _ in verdicts), key=_RANK.__getitem__)
    reasons = [r for _, a, r in verdicts if r and a != "pass"]
    triggers = tuple(name for name, a, _ in verdicts if a != "pass")
    cooldown_until = state.last_retrain_at + cfg.cooldown_s if state.last_retrain_at is not None else None
    if action == "retrain" and cooldown_until is not None and ev.at < cooldown_until:
        action = "alert"
        reasons.append(f"retrain held back: cool-down after the last retrain runs {cooldown_until - ev.at:.0f}s more")
    if action == "pass":
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
    "PolicyConfig",
    "PolicyState",
    "decide",
    "evidence_from_report",
    "replay",
]
