"""Failover: blocking a failing target for a cool-down, and re-planning its jobs elsewhere."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.errors import UsageError
from gpufleet.placement.catalog import Catalog, parse_catalog
from gpufleet.placement.failover import Failover, FailoverPolicy, replan
from gpufleet.placement.planner import Allocation, plan
from gpufleet.spec import JobSpec, parse_spec


def _catalog() -> Catalog:
    def offer(provider: str, region: str, price: float, **kw: Any) -> dict[str, Any]:
        row = {"provider": provider, "region": region, "gpu_type": "H100", "gpus_per_node": 8, "capacity_gpus": 16}
        return {**row, "on_demand_per_gpu_hour": price, **kw}

    return parse_catalog(
        {
            "as_of": "2026-12-01",
            "gpu_types": {"H100": {"memory_gib": 80, "throughput": {"training": 1.0}}},
            "offers": [
                offer("aws", "us-east-1", 4.0, egress_per_gb=0.09),
                offer("aws", "us-west-2", 4.5, egress_per_gb=0.09),
                offer("lambda", "us-south-1", 3.0),
            ],
        }
    )


def _job(name: str, provider: str = "aws") -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "entrypoint": "m.n:f",
            "provider": provider,
            "resources": {"gpu_type": "H100", "gpus": 8},
            "placement": {"gpu_hours": 80, "checkpoint_gb": 100},
        }
    )


def test_failure_blocks_for_the_cooldown() -> None:
    state = Failover(FailoverPolicy(cooldown_hours=2.0)).record_failure("aws/us-east-1", at_hours=1.0)
    assert state.blocked(1.5) == {"aws/us-east-1"}
    assert state.blocked(2.99) == {"aws/us-east-1"}
    assert state.blocked(3.0) == frozenset()
    assert state.blocked(0.5) == frozenset(), "not blocked before it failed"
    with pytest.raises(UsageError, match="block target"):
        state.record_failure("aws east", at_hours=1.0)


def test_repeated_preemptions_within_the_window_block() -> None:
    state = Failover(FailoverPolicy(preemptions=3, window_hours=1.0, cooldown_hours=4.0))
    for hour in (0.0, 0.5):
        state = state.record_preemption("gcp/us-central1", hour)
    assert state.blocked(0.6) == frozenset()
    spread = state.record_preemption("gcp/us-central1", 1.2)  # the one at 0.0 has left the window
    assert spread.blocked(1.2) == frozenset()
    burst = state.record_preemption("gcp/us-central1", 0.9)
    assert burst.blocked(1.0) == {"gcp/us-central1"}
    assert "3 preemptions" in burst.active(1.0)[0].why
    assert burst.blocked(4.9) == frozenset()
    other = state.record_preemption("gcp/europe-west4", 0.9)
    assert other.blocked(1.0) == frozenset(), "preemptions count per target"
    with pytest.raises(UsageError):
        FailoverPolicy(preemptions=0)


def test_replan_goes_to_the_next_region_first() -> None:
    cat = _catalog()
    state = Failover().record_failure("aws/us-east-1", at_hours=0.0)
    p = replan([_job("a")], cat, blocked=state.blocked(0.1), now_hours=0.1)
    chosen = p.decision("a").choice
    assert chosen is not None and chosen.offer == "aws/us-west-2/H100", "same provider, next region, before lambda"
    assert chosen.cost.egress == 0.0
    assert chosen.finish_at_hours == pytest.approx(0.1 + 10.0)
    lost = {c.offer: c.reason for c in p.decision("a").rejected}
    assert lost == {"aws/us-east-1/H100": "blocked", "lambda/us-south-1/H100": "preference_order"}


def test_replan_moves_to_the_next_provider_and_pays_egress() -> None:
    cat = _catalog()
    state = Failover().record_failure("aws", at_hours=0.0)
    p = replan([_job("a"), _job("b")], cat, blocked=state.blocked(0.0))
    for name in ("a", "b"):
        chosen = p.decision(name).choice
        assert chosen is not None and chosen.provider == "lambda"
        assert chosen.cost.egress == pytest.approx(100 * 0.09)
    # only one region fails, and the next one is full: then the next provider
    held = [Allocation(team="default", offer="aws/us-west-2/H100", gpus=16)]
    p = replan([_job("a")], cat, blocked={"aws/us-east-1"}, running=held)
    chosen = p.decision("a").choice
    assert chosen is not None and chosen.offer == "lambda/us-south-1/H100"
    assert {c.offer: c.reason for c in p.decision("a").rejected}["aws/us-west-2/H100"] == "over_capacity"


def test_without_failover_the_cheapest_provider_wins() -> None:
    chosen = plan([_job("a")], _catalog(), blocked={"aws/us-east-1"}).decision("a").choice
    assert chosen is not None and chosen.offer == "lambda/us-south-1/H100", "$240 + $9 egress beats $360"
