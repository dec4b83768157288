"""The planner costs jobs a block at a time and replays capacity from snapshots: neither may change a plan."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

import gpufleet.placement.capacity as capacity
import gpufleet.placement.planner as planner
from gpufleet.placement.catalog import Catalog, parse_catalog
from gpufleet.placement.choosing import choose_among
from gpufleet.placement.planner import Allocation, Plan, plan
from gpufleet.spec import JobSpec, parse_spec

TYPES = {"H100": {"training": 1.0, "eval": 1.0}, "A100": {"training": 0.5, "eval": 0.6}, "L4": {"eval": 0.3}}
PROVIDERS = ["aws", "gcp", "lambda", "nebius"]
TEAMS = ["vision", "speech", "infra"]


def _catalog(rng: random.Random) -> Catalog:
    offers = []
    for i, (provider, gpu_type) in enumerate((p, t) for p in PROVIDERS for t in TYPES):
        price = round(rng.choice([1.0, 2.0, 2.5, 4.0]), 1)  # few prices: ties happen
        offers.append(
            {
                "provider": provider,
                "region": f"r{i % 2}",
                "gpu_type": gpu_type,
                "gpus_per_node": rng.choice([1, 4, 8]),
                "on_demand_per_gpu_hour": price,
                "spot_per_gpu_hour": round(price / 2, 2) if rng.random() < 0.7 else None,
                "capacity_gpus": rng.choice([8, 16, 32, 64]),
                "spot_preemptions_per_hour": rng.choice([0.0, 0.1, 0.5]),
                "egress_per_gb": rng.choice([0.0, 0.05]),
            }
        )
    quotas = [
        {"team": team, "gpu_type": "H100", "nominal": 24, "borrowing_limit": 16, "lending_limit": 8, "cohort": "lab"}
        for team in TEAMS[:2]
    ]
    return parse_catalog(
        {
            "as_of": "2026-12-01",
            "gpu_types": {name: {"memory_gib": 80, "throughput": tp} for name, tp in TYPES.items()},
            "offers": offers,
            "quotas": quotas,
        }
    )


def _jobs(rng: random.Random, n: int) -> list[JobSpec]:
    jobs = []
    for i in range(n):
        placement: dict[str, Any] = {"workload": rng.choice(["training", "eval"]), "gpu_hours": rng.choice([8, 40])}
        kind = rng.random()
        if kind < 0.25:
            placement["any_of"] = [{"gpu_type": "H100"}, {"gpu_type": "A100"}]
        elif kind < 0.45:
            placement["ordered"] = [{"provider": p} for p in rng.sample(PROVIDERS, 2)]
        if rng.random() < 0.3:
            placement["deadline_hours"] = rng.choice([4, 20])
        if rng.random() < 0.5:
            placement["save_seconds"] = 30
            placement["checkpoint_gb"] = 10
        spec = {
            "name": f"j{i}",
            "entrypoint": "m.n:f",
            "team": rng.choice(TEAMS),
            "priority": rng.choice([0, 0, 5]),
            "spot": rng.random() < 0.5,
            "provider": rng.choice(["aws", "local"]),
            "resources": {"gpu_type": rng.choice(["H100", "A100"]), "gpus": rng.choice([1, 4, 8, 16])},
            "placement": placement,
        }
        jobs.append(parse_spec(spec))
    return jobs


def _plan(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    cat = _catalog(rng)
    jobs = _jobs(rng, 120)
    p: Plan = plan(
        jobs,
        cat,
        blocked=["nebius/r1"],
        running=[Allocation(team="vision", offer=cat.offers[0].key, gpus=8)],
        prefer_provider={j.name: "gcp" for j in jobs[::5]},
    )
    return p.to_dict(explain=True)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_plan_is_the_same_whatever_the_block_and_snapshot_sizes(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _plan(seed)
    assert 0 < whole["placed"] < len(whole["decisions"]), "capacity and quota must bind for the test to mean much"
    for cells, every in [(1, 1), (64, 3), (10**9, 10**9)]:  # one job a block .. every job in one block
        monkeypatch.setattr(planner, "BLOCK_CELLS", cells)
        monkeypatch.setattr(capacity, "SNAPSHOT_EVERY", every)
        assert _plan(seed) == whole, f"block of {cells} cells, a snapshot every {every} jobs"


def test_the_shortcut_for_the_cheapest_candidate_decides_as_the_full_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _plan(4)

    def full_rule(t: Any, j: int, group: Any, key: Any, first: int, left: Any, book: Any) -> Any:
        return choose_among(t, j, group, key, left, book, [])

    monkeypatch.setattr(planner, "choose", full_rule)
    assert _plan(4) == fast


@pytest.mark.parametrize("every", [1, 3, 256])
def test_the_capacity_log_replays_what_each_job_saw(every: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capacity, "SNAPSHOT_EVERY", every)
    rng = random.Random(every)
    log = capacity.CapacityLog(np.full(8, 100, dtype=np.int64))
    seen = []
    for position in range(40):
        log.turn(position)
        seen.append(log.left.copy())
        if rng.random() < 0.6:
            log.take(position, rng.randrange(8), rng.choice([1, 4, 8]))
    for position, left in enumerate(seen):
        assert log.before(position).tolist() == left.tolist(), f"position {position}"
