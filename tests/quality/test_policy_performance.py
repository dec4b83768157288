"""The policy on estimated performance: drift that does not move the estimate passes; the estimate retrains.

Pure ``decide`` cases over hand-made evidence: an estimate (with its band, threshold and reference
value) beside or instead of the drift report, and the realised metric once the labels arrive.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import run_cli

from gpufleet.errors import UsageError
from gpufleet.quality.policy import Evidence, PolicyConfig, PolicyState, decide, replay

CFG = PolicyConfig(persistence=1, cooldown_s=0, max_model_age_s=None)


def window(n: int = 1, *, drift: bool = False, share: float | None = None, **more: Any) -> Evidence:
    """A window with its drift verdict and, by default, a healthy AUC estimate: 0.90 (0.88 to 0.92), reference 0.90."""
    estimate: dict[str, Any] = {
        "estimate_metric": "roc_auc",
        "estimated": 0.90,
        "estimated_lower": 0.88,
        "estimated_upper": 0.92,
        "estimate_threshold": 0.85,
        "estimate_reference": 0.90,
    }
    drift_fields: dict[str, Any] = {
        "dataset_drift": drift,
        "share_drifted": share if share is not None else (0.6 if drift else 0.0),
        "drift_share_threshold": 0.5,
        "drifted_columns": ("x0", "x1", "x2") if drift else (),
    }
    return Evidence(window=f"w{n}", at=1_000_000.0 + n * 3600, **{**drift_fields, **estimate, **more})


def test_drift_that_does_not_move_the_estimate_passes() -> None:
    decision = decide(CFG, PolicyState(), window(drift=True))
    assert decision.action == "pass" and decision.triggers == ()
    drift, estimate = decision.reasons
    assert drift.startswith("dataset drift (x0, x1, x2) does not move the estimated roc_auc 0.9")
    assert estimate == "estimated roc_auc 0.9 (band 0.88 to 0.92) is not below its threshold 0.85"
    assert decision.evidence["estimated"] == 0.90 and decision.evidence["estimate_reference"] == 0.90


def test_drift_alone_never_retrains_with_an_estimate_however_long_it_persists() -> None:
    decisions = replay(PolicyConfig(persistence=2, cooldown_s=0), [window(n, drift=True) for n in range(6)])
    assert {d.action for d in decisions} == {"pass"}
    assert [d.evidence["drift_streak"] for d in decisions] == [1, 2, 3, 4, 5, 6]  # drift is still counted
    without = replay(PolicyConfig(persistence=2, cooldown_s=0), [window(n, drift=True, estimated=None) for n in (1, 2)])
    assert [d.action for d in without] == ["alert", "retrain"]  # the same drift, no estimate: unchanged


def test_drift_that_moves_the_estimate_alerts() -> None:
    moved = window(drift=True, estimated=0.87, estimated_lower=0.86, estimated_upper=0.88)
    decision = decide(CFG, PolicyState(), moved)
    assert decision.action == "alert" and decision.triggers == ("drift",)
    assert "moves the estimated roc_auc 0.87" in decision.reasons[0] and "outside the band" in decision.reasons[0]


def test_partial_drift_is_judged_on_the_estimate_too() -> None:
    partial = window(share=0.3)
    assert decide(CFG, PolicyState(), partial).action == "pass"
    assert "30% of columns drifted does not move the estimated" in decide(CFG, PolicyState(), partial).reasons[0]


def test_estimate_below_threshold_beyond_band_retrains() -> None:
    low = window(estimated=0.80, estimated_lower=0.78, estimated_upper=0.82)
    decision = decide(CFG, PolicyState(), low)
    assert decision.action == "retrain" and "estimate" in decision.triggers
    assert any(
        "estimated roc_auc 0.8 (band 0.78 to 0.82) is below its threshold 0.85 beyond its band" in r
        for r in decision.reasons
    )


def test_estimate_below_threshold_within_band_alerts() -> None:
    near = window(estimated=0.84, estimated_lower=0.82, estimated_upper=0.86)
    decision = decide(CFG, PolicyState(), near)
    assert decision.action == "alert" and decision.triggers == ("estimate",)
    assert "is below its threshold 0.85 within its band" in decision.reasons[0]


def test_a_retrain_on_the_estimate_keeps_the_cool_down() -> None:
    low: dict[str, Any] = {"estimated": 0.80, "estimated_lower": 0.78, "estimated_upper": 0.82}
    decisions = replay(PolicyConfig(cooldown_s=7200, max_model_age_s=None), [window(1, **low), window(2, **low)])
    assert [d.action for d in decisions] == ["retrain", "alert"]
    assert "cool-down" in decisions[1].reasons[-1]


def test_an_error_metric_reads_the_band_the_other_way() -> None:
    mae: dict[str, Any] = {"estimate_metric": "mae", "estimate_threshold": 2.0, "estimate_reference": 1.5}
    mae["higher_is_better"] = False
    high = window(estimated=2.6, estimated_lower=2.3, estimated_upper=2.9, **mae)
    assert decide(CFG, PolicyState(), high).action == "retrain"
    assert "is above its threshold 2 beyond its band" in decide(CFG, PolicyState(), high).reasons[0]
    near = window(estimated=2.1, estimated_lower=1.9, estimated_upper=2.3, **mae)
    assert decide(CFG, PolicyState(), near).action == "alert"
    fine = window(drift=True, estimated=1.6, estimated_lower=1.4, estimated_upper=1.8, **mae)
    assert decide(CFG, PolicyState(), fine).action == "pass"


def test_a_healthy_estimate_passes_and_says_it_used_the_estimate() -> None:
    decision = decide(CFG, PolicyState(), window())
    assert decision.action == "pass"
    assert decision.reasons == ("estimated roc_auc 0.9 (band 0.88 to 0.92) is not below its threshold 0.85",)


def test_a_non_finite_estimate_alerts() -> None:
    decision = decide(CFG, PolicyState(), window(estimated=float("nan")))
    assert decision.action == "alert" and "not finite" in decision.reasons[0]
    assert decision.evidence["estimated"] is None  # kept JSON-safe


def late_labels(n: int, realised: float, **more: Any) -> Evidence:
    """The labels of window ``n``, arrived: the realised AUC beside the estimate recorded for it."""
    fields = {"kind": "labels", "dataset_drift": None, "share_drifted": None, "drifted_columns": ()}
    return window(n, metric_name="roc_auc", metric=realised, baseline_metric=0.90, **{**fields, **more})


def test_gap_alerts_as_a_possible_concept_shift() -> None:
    decision = decide(CFG, PolicyState(), late_labels(1, 0.86))  # estimated 0.90, realised 0.86: drop 0.04, gap 0.04
    assert decision.action == "alert" and decision.triggers == ("performance",)
    wide = decide(PolicyConfig(persistence=1, cooldown_s=0, max_gap=0.03), PolicyState(), late_labels(1, 0.86))
    assert wide.action == "alert" and wide.triggers == ("performance", "gap")
    assert "gap 0.04 > max_gap 0.03, a possible concept shift" in wide.reasons[1]
    assert "realised roc_auc 0.86 vs estimated roc_auc 0.9" in wide.reasons[1]
    assert wide.evidence["realised_gap"] == pytest.approx(0.04) and wide.evidence["kind"] == "labels"


def test_a_realised_drop_retrains_and_a_small_gap_does_not_alert() -> None:
    drop = decide(CFG, PolicyState(), late_labels(1, 0.80, estimated=0.81, estimated_lower=0.80, estimated_upper=0.82))
    assert drop.action == "retrain" and "performance" in drop.triggers and "gap" not in drop.triggers
    fine = decide(CFG, PolicyState(), late_labels(1, 0.91))
    assert fine.action == "pass" and fine.evidence["realised_gap"] == pytest.approx(0.01)


def test_labels_leave_the_drift_streak_as_it_was() -> None:
    cfg = PolicyConfig(persistence=2, cooldown_s=0)
    plain = {"estimated": None}
    decisions = replay(cfg, [window(1, drift=True, **plain), late_labels(0, 0.9), window(2, drift=True, **plain)])
    assert [d.action for d in decisions] == ["alert", "pass", "retrain"]
    assert [d.evidence["drift_streak"] for d in decisions] == [1, 1, 2]


def test_max_gap_is_checked() -> None:
    with pytest.raises(UsageError, match=r"max_gap=-0\.1"):
        PolicyConfig(max_gap=-0.1)
    assert PolicyConfig().max_gap == 0.05 and PolicyConfig().to_dict()["max_gap"] == 0.05


def test_the_lab_drift_policy_retrains_on_a_handled_shift_the_performance_policy_on_the_harmful_one() -> None:
    from gpufleet.demos.policy_lab import covariate_stream, run_policy

    stream = covariate_stream(0, windows=7, rows=1500, handled_at=2, harmful_at=4)
    drift = run_policy(stream, "drift", label_delay=2)
    performance = run_policy(stream, "performance", label_delay=2)
    assert drift.retrained_after == [3]  # two windows of drift in inputs the label ignores
    assert drift.actions[4:] == ["alert"] * 3  # two of five inputs move: no dataset drift, no retrain
    assert performance.actions[:4] == ["pass"] * 4 and performance.retrained_after == [4]
    assert "does not move the estimated roc_auc" in performance.reasons[2][0]
    assert any("below its threshold" in r for r in performance.reasons[4])
    assert performance.labels_actions[:2] == ["pass", "pass"]  # labels two windows late, realised near the estimate
    assert min(performance.realised[5:]) > max(drift.realised[5:]) + 0.1  # the retrain on the new rows repairs it


def test_lab_policy_prints_both_policies_per_stream(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpufleet.demos.policy_lab as lab

    def small(seed: int = 0, *, label_delay: int = 3) -> lab.PolicyLab:
        stream = lab.covariate_stream(seed, windows=5, rows=800, handled_at=2, harmful_at=4)
        runs: dict[lab.Mode, lab.PolicyRun] = {
            m: lab.run_policy(stream, m, label_delay=label_delay) for m in ("drift", "performance")
        }
        return lab.PolicyLab({"covariate": (stream, runs)}, label_delay)

    monkeypatch.setattr(lab, "policy_lab", small)
    code, out, err = run_cli(capsys, monkeypatch, "quality", "lab-policy", "--json", "--label-delay", "2")
    assert code == 0, err
    result = json.loads(out)
    policies = result["streams"]["covariate"]["policies"]
    assert set(policies) == {"drift", "performance"} and result["label_delay"] == 2
    assert {"retrains", "alerts", "realised_mean", "realised_min", "actions"} <= set(policies["drift"])
    code, out, _ = run_cli(capsys, monkeypatch, "quality", "lab-policy")
    assert code == 0 and "realised AUC mean" in out and "performance" in out
