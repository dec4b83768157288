"""Champion and challenger decisions: the offline gate, the live guards, the alias moves (all pure)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from gpufleet.errors import UsageError
from gpufleet.quality.deploy import (
    AliasMove,
    Gate,
    Guard,
    canary_verdict,
    plan_promotion,
    plan_rejection,
    plan_rollback,
    route,
    shadow_verdict,
    validate,
)


def correct(n: int, rate: float, seed: int) -> NDArray[np.bool_]:
    return np.random.default_rng(seed).uniform(size=n) < rate


# ---- the offline gate ---------------------------------------------------------------------


def test_gate_passes_a_better_or_slightly_worse_challenger() -> None:
    gate = Gate(metric="auc", tolerance=0.01, floor=0.7)
    assert validate({"auc": 0.95}, {"auc": 0.72}, gate).action == "pass"
    assert validate({"auc": 0.795}, {"auc": 0.80}, gate).action == "pass"


def test_gate_rejects_below_champion_minus_tolerance_or_below_floor() -> None:
    gate = Gate(metric="auc", tolerance=0.01, floor=0.7)
    worse = validate({"auc": 0.78}, {"auc": 0.80}, gate)
    assert worse.action == "reject"
    assert [c.name for c in worse.checks if not c.passed] == ["vs_champion"]
    assert "below" in worse.summary
    floor = validate({"auc": 0.65}, {"auc": 0.60}, gate)
    assert floor.action == "reject" and [c.name for c in floor.checks if not c.passed] == ["floor"]
    assert validate({"auc": float("nan")}, None, gate).action == "reject"


def test_gate_without_champion_checks_the_floor_only() -> None:
    verdict = validate({"auc": 0.75}, None, Gate(floor=0.7))
    assert verdict.action == "pass" and [c.name for c in verdict.checks] == ["floor"]


def test_gate_for_a_lower_is_better_metric() -> None:
    gate = Gate(metric="log_loss", tolerance=0.02, floor=0.5, higher_is_better=False)
    assert validate({"log_loss": 0.31}, {"log_loss": 0.30}, gate).action == "pass"
    assert validate({"log_loss": 0.33}, {"log_loss": 0.30}, gate).action == "reject"
    assert validate({"log_loss": 0.6}, None, gate).action == "reject"


def test_gate_names_a_missing_metric() -> None:
    with pytest.raises(UsageError, match="no 'auc' metric"):
        validate({"accuracy": 0.9}, None, Gate())


# ---- routing ----------------------------------------------------------------------------


def test_route_is_sticky_and_close_to_the_share() -> None:
    ids = [f"user-{i}" for i in range(20_000)]
    first = route(ids, 0.2, salt="v2")
    assert first.dtype == np.bool_
    assert abs(first.mean() - 0.2) < 0.015
    assert np.array_equal(first, route(ids, 0.2, salt="v2"))
    reversed_ids = route(ids[::-1], 0.2, salt="v2")[::-1]
    assert np.array_equal(first, reversed_ids)  # independent of order
    other = route(ids, 0.2, salt="v3")
    assert not np.array_equal(first, other)  # a new rollout reshuffles
    wider = route(ids, 0.5, salt="v2")
    assert np.all(wider[first])  # raising the share only adds requests
    assert not route(ids, 0.0, salt="x").any() and route(ids, 1.0, salt="x").all()
    with pytest.raises(UsageError):
        route(ids, 1.5, salt="x")


# ---- live guards ------------------------------------------------------------------------


def test_paired_canary_promotes_a_better_version() -> None:
    old = correct(600, 0.70, 1)
    new = old | correct(600, 0.5, 2)  # right wherever the old one was, and on half the rest
    verdict = canary_verdict(new, old, Guard())
    assert verdict.action == "promote"
    assert verdict.numbers["diff"] == pytest.approx(new.mean() - old.mean())


def test_paired_canary_rolls_back_a_clearly_worse_version() -> None:
    old = correct(600, 0.75, 3)
    new = old & correct(600, 0.85, 4)  # loses 15% of the old version's right answers
    verdict = canary_verdict(new, old, Guard(floor=0.5))
    assert verdict.action == "rollback"
    margin = next(c for c in verdict.checks if c.name == "non_inferior")
    assert not margin.passed


def test_canary_under_the_floor_rolls_back_whatever_the_difference() -> None:
    old = correct(600, 0.55, 5)
    verdict = canary_verdict(old.copy(), old, Guard(floor=0.6))
    assert verdict.action == "rollback"
    assert [c.name for c in verdict.checks if not c.passed] == ["floor"]


def test_too_few_requests_extends_the_canary() -> None:
    old = correct(50, 0.7, 6)
    assert canary_verdict(old | correct(50, 0.9, 7), old, Guard(min_requests=200)).action == "extend"


def test_inconclusive_difference_extends() -> None:
    old = np.zeros(400, dtype=bool)
    old[:300] = True
    new = old.copy()
    new[:20] = False  # 20 new errors
    new[300:316] = True  # 16 fixes: new - old = -0.01, interval about +-0.025
    verdict = canary_verdict(new, old, Guard(tolerance=0.02, floor=0.5))
    low, high = verdict.numbers["low"], verdict.numbers["high"]
    assert verdict.numbers["diff"] == pytest.approx(-0.01)
    assert low is not None and high is not None and low < -0.02 < high
    assert verdict.action == "extend"


def test_unpaired_canary_uses_the_binomial_error() -> None:
    new, old = correct(500, 0.9, 10), correct(2000, 0.7, 11)
    verdict = canary_verdict(new, old, Guard(), paired=False)
    p1, p0 = new.mean(), old.mean()
    expected = np.sqrt(p1 * (1 - p1) / 500 + p0 * (1 - p0) / 2000)
    assert verdict.numbers["se"] == pytest.approx(expected)
    assert verdict.action == "promote"
    with pytest.raises(UsageError, match="same requests"):
        canary_verdict(new, old, Guard())


def test_shadow_rejects_instead_of_rolling_back() -> None:
    old = correct(1000, 0.8, 12)
    new = old & correct(1000, 0.8, 13)
    verdict = shadow_verdict(new, old, Guard(floor=0.5))
    assert verdict.stage == "shadow" and verdict.action == "reject"
    assert shadow_verdict(old | correct(1000, 0.3, 14), old, Guard()).action == "promote"


@pytest.mark.parametrize("kwargs", [{"share": 0}, {"share": 1}, {"tolerance": -0.1}, {"min_requests": 0}])
def test_bad_guard_is_a_usage_error(kwargs: dict[str, float]) -> None:
    with pytest.raises(UsageError):
        Guard(**kwargs)  # type: ignore[arg-type]


# ---- alias moves ------------------------------------------------------------------------


def test_first_promotion_sets_champion_only() -> None:
    assert plan_promotion({}, "1") == [AliasMove("champion", None, "1")]


def test_promotion_keeps_the_old_champion_as_previous_and_drops_the_challenger() -> None:
    moves = plan_promotion({"champion": "1", "previous": "0", "challenger": "2"}, "2")
    assert moves == [
        AliasMove("champion", "1", "2"),
        AliasMove("previous", "0", "1"),
        AliasMove("challenger", "2", None),
    ]
    with pytest.raises(UsageError, match="already @champion"):
        plan_promotion({"champion": "2"}, "2")


def test_rollback_returns_to_previous_and_cannot_be_repeated() -> None:
    aliases = {"champion": "2", "previous": "1"}
    moves = plan_rollback(aliases, "m")
    assert moves == [AliasMove("champion", "2", "1"), AliasMove("previous", "1", None)]
    after = {"champion": "1"}
    with pytest.raises(UsageError, match="no @previous"):
        plan_rollback(after, "m")


def test_rejection_drops_only_its_own_challenger() -> None:
    assert plan_rejection({"challenger": "3"}, "3") == [AliasMove("challenger", "3", None)]
    assert plan_rejection({"challenger": "4"}, "3") == []
