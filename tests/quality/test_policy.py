"""The retraining policy: persistence, cool-down, performance and calendar triggers, the decision log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpufleet.errors import UsageError
from gpufleet.quality.drift import drift_report
from gpufleet.quality.policy import (
    DecisionLog,
    Evidence,
    PolicyConfig,
    PolicyState,
    decide,
    evidence_from_report,
    replay,
)

DAY = 86400.0


def window(n: int, *, drift: bool = False, share: float | None = None, **more: Any) -> Evidence:
    return Evidence(
        window=f"w{n}",
        at=1_000_000.0 + n * 3600,
        dataset_drift=drift,
        share_drifted=share if share is not None else (0.6 if drift else 0.0),
        drift_share_threshold=0.5,
        drifted_columns=("x0", "x1", "x2") if drift else (),
        **more,
    )


def actions(cfg: PolicyConfig, windows: list[Evidence]) -> list[str]:
    return [d.action for d in replay(cfg, windows)]


def test_drift_must_persist_k_windows_before_a_retrain() -> None:
    cfg = PolicyConfig(persistence=3, cooldown_s=0)
    assert actions(cfg, [window(1, drift=True), window(2, drift=True), window(3, drift=True)]) == [
        "alert",
        "alert",
        "retrain",
    ]


def test_a_clean_window_resets_the_streak() -> None:
    cfg = PolicyConfig(persistence=2, cooldown_s=0)
    decisions = replay(cfg, [window(1, drift=True), window(2), window(3, drift=True), window(4, drift=True)])
    assert [d.action for d in decisions] == ["alert", "pass", "alert", "retrain"]
    assert [d.evidence["drift_streak"] for d in decisions] == [1, 0, 1, 2]


def test_partial_drift_alerts_but_never_retrains() -> None:
    cfg = PolicyConfig(persistence=1, alert_share=0.2, cooldown_s=0)
    decisions = replay(cfg, [window(n, share=0.4) for n in range(1, 6)])
    assert {d.action for d in decisions} == {"alert"}
    assert "40% of columns drifted" in decisions[0].reasons[0]
    assert actions(cfg, [window(1, share=0.1)]) == ["pass"]


def test_cool_down_downgrades_retrains_until_it_expires() -> None:
    cfg = PolicyConfig(persistence=1, cooldown_s=2 * 3600)
    decisions = replay(cfg, [window(n, drift=True) for n in (1, 2, 3, 4)])
    # w1 (+1h) retrains: cool-down until +3h; w2 falls inside it; w3 (+3h) is at its end and retrains
    assert [d.action for d in decisions] == ["retrain", "alert", "retrain", "alert"]
    held = decisions[1]
    assert any("cool-down" in r for r in held.reasons)
    assert held.evidence["cooldown_until"] == pytest.approx(decisions[0].at + 2 * 3600)
    assert decisions[2].state.last_retrain_at == decisions[2].at


def test_performance_drop_retrains_at_once_and_small_drops_alert() -> None:
    cfg = PolicyConfig(persistence=5, alert_drop=0.02, retrain_drop=0.05, cooldown_s=0)
    perf: dict[str, Any] = {"metric_name": "auc", "baseline_metric": 0.90}
    assert actions(cfg, [window(1, metric=0.80, **perf)]) == ["retrain"]
    assert actions(cfg, [window(1, metric=0.87, **perf)]) == ["alert"]
    assert actions(cfg, [window(1, metric=0.89, **perf)]) == ["pass"]
    decision = decide(cfg, PolicyState(), window(1, metric=0.80, **perf))
    assert decision.triggers == ("performance",)
    assert decision.evidence["metric_drop"] == pytest.approx(0.10)


def test_non_finite_metric_alerts_instead_of_passing() -> None:
    decision = decide(PolicyConfig(), PolicyState(), window(1, metric=float("nan"), baseline_metric=0.9))
    assert decision.action == "alert"
    assert decision.evidence["metric"] is None  # kept JSON-safe


def test_calendar_retrains_an_old_model_and_respects_the_cool_down() -> None:
    cfg = PolicyConfig(max_model_age_s=30 * DAY, cooldown_s=DAY)
    young = window(1, model_trained_at=1_000_000.0 - 10 * DAY)
    old = window(1, model_trained_at=1_000_000.0 - 40 * DAY)
    assert decide(cfg, PolicyState(), young).action == "pass"
    first = decide(cfg, PolicyState(), old)
    assert first.action == "retrain" and first.triggers == ("calendar",)
    assert first.evidence["model_age_s"] > 30 * DAY
    again = decide(cfg, first.state, window(2, model_trained_at=1_000_000.0 - 40 * DAY))
    assert again.action == "alert"
    never = PolicyConfig(max_model_age_s=None)
    assert decide(never, PolicyState(), old).action == "pass"


def test_the_strongest_trigger_wins_and_every_reason_is_kept() -> None:
    cfg = PolicyConfig(persistence=2, cooldown_s=0)
    decision = decide(cfg, PolicyState(), window(1, drift=True, metric=0.885, baseline_metric=0.9, metric_name="auc"))
    assert decision.action == "alert"
    assert decision.triggers == ("drift",)
    decision = decide(cfg, PolicyState(), window(1, drift=True, metric=0.5, baseline_metric=0.9, metric_name="auc"))
    assert decision.action == "retrain" and set(decision.triggers) == {"drift", "performance"}
    assert len(decision.reasons) == 2


def test_a_retrain_resets_the_drift_streak() -> None:
    cfg = PolicyConfig(persistence=2, cooldown_s=0)
    decisions = replay(cfg, [window(n, drift=True) for n in (1, 2, 3, 4)])
    assert [d.action for d in decisions] == ["alert", "retrain", "alert", "retrain"]


def test_decision_log_is_append_only_and_rebuilds_the_state(tmp_path: Path) -> None:
    cfg = PolicyConfig(persistence=2, cooldown_s=3600)
    log = DecisionLog(tmp_path / "decisions.jsonl")
    state = log.state()
    for n in (1, 2, 3):
        decision = decide(cfg, state, window(n, drift=True))
        log.append(decision)
        state = log.state()
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    assert len(lines) == 3
    first = json.loads(lines[0])
    assert first["action"] == "alert" and first["thresholds"]["persistence"] == 2
    assert first["evidence"]["share_drifted"] == 0.6 and first["evidence"]["drifted_columns"] == ["x0", "x1", "x2"]
    read = log.read()
    assert [d.action for d in read] == ["alert", "retrain", "alert"]
    assert state.last_retrain_at == read[1].at and state.drift_streak == 1
    (tmp_path / "decisions.jsonl").write_text("not json\n")
    with pytest.raises(UsageError, match=r"decisions\.jsonl:1"):
        log.read()


def test_evidence_from_a_real_drift_report() -> None:
    rng = np.random.default_rng(0)
    ref = {"a": rng.normal(0, 1, 2000), "b": rng.normal(0, 1, 2000)}
    cur = {"a": rng.normal(1.0, 1, 2000), "b": rng.normal(0, 1, 2000)}
    report = drift_report(ref, cur)
    ev = evidence_from_report(report, window="w", at=1.0)
    assert ev.dataset_drift is True and ev.share_drifted == 0.5 and ev.drifted_columns == ("a",)
    assert decide(PolicyConfig(persistence=1, cooldown_s=0), PolicyState(), ev).action == "retrain"


@pytest.mark.parametrize(
    "kwargs",
    [{"persistence": 0}, {"alert_share": 0}, {"alert_drop": 0.1, "retrain_drop": 0.05}, {"max_model_age_s": 0}],
)
def test_bad_config_is_a_usage_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        PolicyConfig(**kwargs)


def test_a_column_that_could_not_be_measured_alerts_instead_of_passing() -> None:
    """Half of one column is +inf: the report cannot clear it, so the policy alerts (and never retrains on it)."""
    rng = np.random.default_rng(0)
    ref = {"x": rng.normal(size=400), "y": rng.normal(size=400)}
    cur_y = rng.normal(size=400)
    cur_y[:200] = np.inf
    report = drift_report(ref, {"x": rng.normal(size=400), "y": cur_y})
    evidence = evidence_from_report(report, window="w1", at=1_000_000.0)
    assert evidence.unmeasured_columns == ("y",) and evidence.dataset_drift is False
    decision = decide(PolicyConfig(persistence=1, cooldown_s=0), PolicyState(), evidence)
    assert decision.action == "alert" and "drift not ruled out: y could not be measured" in decision.reasons[0]
