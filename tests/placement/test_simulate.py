"""The fleet simulator: determinism, conservation of work and GPU-hours, policies, quotas, queue waits, CLI."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from gpufleet.cli.simulate import simulate_command
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.placement.catalog import Catalog, parse_catalog
from gpufleet.placement.policies import POLICIES, Fleet, Need, Policy, make_policy
from gpufleet.placement.quota import QuotaBook
from gpufleet.placement.simulate import SimResult, build_scenario, compare_policies, simulate
from gpufleet.placement.workload import (
    FailoverRule,
    JobTable,
    Outage,
    Outages,
    WorkloadModel,
    generate_jobs,
    jobs_from_specs,
    load_workload,
    parse_workload,
)
from gpufleet.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
H100 = {"memory_gib": 80, "throughput": {"training": 1.0, "finetune": 1.0}}


def offer(provider: str, region: str, gpu_type: str = "H100", **kw: Any) -> dict[str, Any]:
    """An offer sold by the GPU (one per node) unless ``gpus_per_node`` says otherwise."""
    row = {"provider": provider, "region": region, "gpu_type": gpu_type, "gpus_per_node": 1}
    return {**row, "on_demand_per_gpu_hour": 4.0, "capacity_gpus": 16, **kw}


def catalog(offers: list[dict[str, Any]], quotas: tuple[dict[str, Any], ...] = (), **types: Any) -> Catalog:
    gpu_types = types or {"H100": H100}
    return parse_catalog({"as_of": "2026-12-01", "gpu_types": gpu_types, "offers": offers, "quotas": list(quotas)})


def fleet_catalog(rate: float = 0.1) -> Catalog:
    """Three providers x two GPU types on 8- and 4-GPU nodes, spot everywhere, quotas in one cohort."""
    offers = []
    for provider, od, spot in (("aws", 6.9, 2.6), ("gcp", 11.0, 3.7), ("azure", 7.0, 3.1)):
        for region in ("east", "west"):
            offers.append(
                offer(
                    provider,
                    region,
                    gpus_per_node=8,
                    on_demand_per_gpu_hour=od,
                    spot_per_gpu_hour=spot,
                    capacity_gpus=48,
                    spot_preemptions_per_hour=rate,
                    egress_per_gb=0.09,
                )
            )
            offers.append(
                offer(
                    provider,
                    region,
                    "L40S",
                    gpus_per_node=4,
                    on_demand_per_gpu_hour=od / 3,
                    spot_per_gpu_hour=spot / 3,
                    capacity_gpus=32,
                    spot_preemptions_per_hour=rate / 2,
                    egress_per_gb=0.09,
                )
            )
    quotas = (
        {
            "team": "vision",
            "gpu_type": "H100",
            "nominal": 40,
            "borrowing_limit": 20,
            "lending_limit": 20,
            "cohort": "r",
        },
        {"team": "speech", "gpu_type": "H100", "nominal": 40, "cohort": "r"},
        {"team": "speech", "gpu_type": "L40S", "nominal": 60, "borrowing_limit": 0, "cohort": "r"},
    )
    l40s = {"memory_gib": 48, "throughput": {"training": 0.35, "finetune": 0.5}}
    return catalog(offers, quotas, H100=H100, L40S=l40s)


def job(
    name: str, *, gpus: int = 1, gpu_hours: float = 1.0, spot: bool = False, priority: int = 0, **place: Any
) -> Any:
    every, team = place.pop("every_seconds", 36_000.0), place.pop("team", "a")
    placement = {"gpu_hours": gpu_hours, "restore_seconds": place.pop("restore_seconds", 0.0), **place}
    return parse_spec(
        {
            "name": name,
            "team": team,
            "entrypoint": "m:f",
            "resources": {"gpu_type": "H100", "gpus": gpus},
            "spot": spot,
            "priority": priority,
            "checkpoint": {"every_seconds": every},
            "placement": placement,
        }
    )


def segments_by_job(result: SimResult) -> dict[int, list[Any]]:
    assert result.trace is not None
    out: dict[int, list[Any]] = defaultdict(list)
    for s in result.trace.segments:
        out[s.job].append(s)
    return {j: sorted(v, key=lambda s: s.start_h) for j, v in out.items()}


def run_all(cat: Catalog, workload: WorkloadModel, *, jobs: int, days: float, seed: int = 0) -> list[SimResult]:
    scenario = build_scenario(cat, workload, jobs=jobs, days=days, seed=seed)
    return compare_policies(cat, scenario, list(POLICIES), trace=True)


# -- determinism and conservation -------------------------------------------------------------


def test_same_seed_same_results_and_another_seed_differs() -> None:
    cat, model = fleet_catalog(), WorkloadModel()
    first, again, other = (run_all(cat, model, jobs=800, days=2, seed=s) for s in (7, 7, 8))
    assert [r.to_dict() for r in first] == [r.to_dict() for r in again]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.outcomes.finish_h, b.outcomes.finish_h)
        assert a.trace == b.trace
    assert [r.to_dict() for r in first] != [r.to_dict() for r in other]


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_job_completes_and_useful_gpu_hours_equal_the_work(policy: str) -> None:
    unit = {"memory_gib": 48, "throughput": {"training": 1.0, "finetune": 1.0}}
    cat = catalog(fleet_catalog(rate=0.5).model_dump(mode="json")["offers"], H100=H100, L40S=unit)
    rough = WorkloadModel(outages=Outages(region_per_day=2.0, region_hours=1.0), drain_days=30, whole_nodes=True)
    scenario = build_scenario(cat, rough, jobs=600, days=2, seed=1)
    r = simulate(
        cat,
        scenario.jobs,
        policy,
        horizon_h=scenario.horizon_h,
        outages=scenario.outages,
        seed=2,
        workload=rough,
        trace=True,
    )
    out, jobs = r.outcomes, scenario.jobs
    assert r.overall.completed == len(jobs) and np.isfinite(out.finish_h).all()
    np.testing.assert_allclose(out.useful_gpu_hours, jobs.work_gpu_hours, rtol=1e-9)
    np.testing.assert_allclose(out.work_done_gpu_hours, jobs.work_gpu_hours, rtol=1e-9)
    held = price = idle = 0.0
    for seg in r.trace.segments if r.trace else ():
        hours = seg.end_h - seg.start_h
        held += hours * seg.gpus
        idle += hours * (seg.gpus - jobs.gpus[seg.job])
        price += hours * seg.gpus * (cat.offers[seg.offer].price(spot=seg.spot) or math.nan)
    m = r.overall
    assert m.gpu_hours == pytest.approx(held, rel=1e-9) and m.idle_gpu_hours == pytest.approx(idle, rel=1e-9)
    assert idle > 0  # 1- and 2-GPU jobs rent whole 4- and 8-GPU nodes
    assert m.useful_gpu_hours + m.wasted_gpu_hours + m.checkpoint_gpu_hours + idle == pytest.approx(held, rel=1e-9)
    assert m.cost == pytest.approx(price + m.egress_cost, rel=1e-9)
    if policy != "on_demand":
        assert m.preemptions > 0 and m.wasted_gpu_hours > 0
    assert m.outage_kills > 0


def test_a_short_horizon_leaves_jobs_unfinished_but_drops_none() -> None:
    cat = fleet_catalog()
    scenario = build_scenario(cat, WorkloadModel(drain_days=0), jobs=3000, days=1, seed=3)
    r = simulate(cat, scenario.jobs, "cheapest", horizon_h=24.0, outages=scenario.outages, trace=True)
    out, work = r.outcomes, scenario.jobs.work_gpu_hours
    done = np.isfinite(out.finish_h)
    assert 0 < r.overall.unfinished == (~done).sum() and r.overall.completed + r.overall.unfinished == 3000
    np.testing.assert_allclose(out.work_done_gpu_hours[done], work[done])
    assert (out.work_done_gpu_hours[~done] < work[~done]).all()
    running = [s for s in (r.trace.segments if r.trace else ()) if s.end == "horizon"]
    assert running and all(s.end_h == 24.0 and not done[s.job] for s in running)
    never = ~np.isfinite(out.first_start_h)
    np.testing.assert_allclose(out.wait_h[never], 24.0 - scenario.jobs.arrival_h[never])


# -- policies -----------------------------------------------------------------------------------


def test_on_demand_is_never_preempted() -> None:
    by_name = {r.policy: r for r in run_all(fleet_catalog(rate=1.0), WorkloadModel(), jobs=600, days=2)}
    assert by_name["cheapest"].overall.preemptions > 0
    on_demand = by_name["on_demand"]
    assert on_demand.overall.preemptions == 0 and all(m.preemptions == 0 for m in on_demand.teams.values())
    assert on_demand.trace is not None and not any(s.spot for s in on_demand.trace.segments)


def test_spot_failover_wastes_less_than_cheapest_when_the_cheap_region_is_preempted_often() -> None:
    cat = catalog(
        [
            offer(
                "cheap", "r1", spot_per_gpu_hour=1.0, spot_preemptions_per_hour=3.0, capacity_gpus=64, egress_per_gb=0.1
            ),
            offer("cheap", "r2", spot_per_gpu_hour=1.6, spot_preemptions_per_hour=0.02, capacity_gpus=64),
            offer("other", "r1", spot_per_gpu_hour=1.8, spot_preemptions_per_hour=0.02, capacity_gpus=64),
        ]
    )
    model = WorkloadModel(spot_share=1.0, failover=FailoverRule(cooldown_hours=12.0), checkpoint_minutes={60.0: 1.0})
    by_name = {r.policy: r for r in run_all(cat, model, jobs=400, days=2)}
    cheapest, failover = by_name["cheapest"].overall, by_name["spot_failover"].overall
    assert cheapest.preemptions > 100
    assert failover.wasted_gpu_hours < 0.5 * cheapest.wasted_gpu_hours
    assert failover.moves > 0 and failover.egress_cost > 0  # moves to "other" pay egress from "cheap"


def test_an_outage_moves_jobs_to_the_next_region_under_spot_failover() -> None:
    cat = catalog(
        [
            offer("a", "r1", spot_per_gpu_hour=1.0, egress_per_gb=0.1),
            offer("a", "r2", spot_per_gpu_hour=1.5, egress_per_gb=0.1),
            offer("b", "r1", spot_per_gpu_hour=1.2, egress_per_gb=0.1),
        ]
    )
    specs = [job(f"j{i}", gpu_hours=10.0, spot=True, every_seconds=1800, checkpoint_gb=10) for i in range(8)]
    jobs = jobs_from_specs(cat, specs, [0.0] * 8)
    outage = [Outage(2.0, 3.0, "a", "r1")]
    where = {}
    for policy in ("spot_failover", "cheapest"):
        r = simulate(cat, jobs, policy, horizon_h=48.0, outages=outage, trace=True)
        assert r.overall.outage_kills == 8 and r.overall.completed == 8 and r.overall.moves == 8
        leaves_provider = policy == "cheapest"  # egress is paid only when the checkpoint leaves provider a
        assert r.overall.egress_cost == pytest.approx(8 * 10 * 0.1 if leaves_provider else 0.0)
        for segs in segments_by_job(r).values():
            assert [s.end for s in segs] == ["outage", "finished"]
            assert segs[1].start_h == 2.0 and cat.offers[segs[0].offer].key == "a/r1/H100"
        where[policy] = {cat.offers[segs[1].offer].key for segs in segments_by_job(r).values()}
    assert where == {"spot_failover": {"a/r2/H100"}, "cheapest": {"b/r1/H100"}}


def test_spot_failover_keeps_killed_jobs_away_for_the_cool_down() -> None:
    # a/r1 fails from 2 h to 3 h; the 4 GPUs elsewhere are taken, so 4 killed jobs wait. Cheapest
    # returns them to a/r1 when it is back (3 h); spot_failover only after the cool-down (2 + 2.5 h).
    # (A new job would be kept away as long: an outage closes the region to every job.)
    cat = catalog([offer("a", "r1", spot_per_gpu_hour=1.0), offer("a", "r2", spot_per_gpu_hour=1.5, capacity_gpus=4)])
    jobs = jobs_from_specs(cat, [job(f"j{i}", gpu_hours=10.0, spot=True) for i in range(8)], [0.0] * 8)
    model = WorkloadModel(failover=FailoverRule(cooldown_hours=2.5))
    restarts = {}
    for policy in ("spot_failover", "cheapest"):
        r = simulate(
            cat, jobs, policy, horizon_h=48.0, outages=[Outage(2.0, 3.0, "a", "r1")], workload=model, trace=True
        )
        second = [segs[1] for segs in segments_by_job(r).values()]
        restarts[policy] = sorted((s.start_h, cat.offers[s.offer].region) for s in second)
    assert restarts["cheapest"] == [(2.0, "r2")] * 4 + [(3.0, "r1")] * 4
    assert restarts["spot_failover"] == [(2.0, "r2")] * 4 + [(4.5, "r1")] * 4


def test_nothing_runs_in_a_region_while_it_is_down() -> None:
    cat = fleet_catalog()
    scenario = build_scenario(
        cat, WorkloadModel(outages=Outages(region_per_day=3.0, provider_per_day=1.0)), jobs=1000, days=2, seed=5
    )
    assert len(scenario.outages) > 10
    for r in compare_policies(cat, scenario, list(POLICIES), trace=True):
        for seg in r.trace.segments if r.trace else ():
            o = cat.offers[seg.offer]
            for down in scenario.outages:
                if down.provider == o.provider and down.region in (None, o.region):
                    overlap = min(seg.end_h, down.end_h) - max(seg.start_h, down.start_h)
                    assert overlap <= 0, (r.policy, seg, down)


def test_ordered_follows_the_jobs_list_and_cheapest_the_prices() -> None:
    cat = catalog(
        [
            offer("a", "r1", on_demand_per_gpu_hour=1.0, capacity_gpus=1),
            offer("b", "r1", on_demand_per_gpu_hour=5.0, capacity_gpus=1),
        ]
    )
    ordered = [{"provider": "b"}, {"provider": "a"}]
    jobs = jobs_from_specs(cat, [job("x", ordered=ordered), job("y", ordered=ordered)], [0.0, 0.1])
    for policy, first in (("ordered", "b"), ("cheapest", "a")):
        r = simulate(cat, jobs, policy, horizon_h=10.0, trace=True)
        starts = [cat.offers[segs[0].offer].provider for _, segs in sorted(segments_by_job(r).items())]
        assert starts == [first, "a" if first == "b" else "b"]


def test_a_new_policy_is_a_small_subclass() -> None:
    class Priciest(Policy):
        name = "priciest"

        def options(self, fleet: Fleet, need: Need, book: QuotaBook) -> tuple[int, ...]:
            return tuple(sorted((2 * i for i in range(len(fleet.catalog.offers))), key=lambda o: -fleet.price[o]))

    cat = catalog([offer("a", "r1", on_demand_per_gpu_hour=1.0), offer("b", "r1", on_demand_per_gpu_hour=5.0)])
    jobs = jobs_from_specs(cat, [job("x", gpu_hours=2.0)], [0.0])
    costs = {p.name: simulate(cat, jobs, p, horizon_h=10.0).overall.cost for p in (Priciest(), make_policy("cheapest"))}
    assert costs == {"priciest": pytest.approx(10.0), "cheapest": pytest.approx(2.0)}


def test_unknown_policy_is_a_usage_error_listing_the_names() -> None:
    with pytest.raises(UsageError, match=r"unknown policy 'fastest'.*cheapest.*spot_failover"):
        make_policy("fastest")


def test_a_scenario_of_no_jobs_or_days_names_the_parameter() -> None:
    cat = fleet_catalog(rate=1.0)
    with pytest.raises(UsageError, match=r"^days must be > 0, got 0$"):
        build_scenario(cat, WorkloadModel(), jobs=10, days=0, seed=0)
    with pytest.raises(UsageError, match=r"^jobs must be >= 1, got 0$"):
        build_scenario(cat, WorkloadModel(), jobs=0, days=1, seed=0)


# -- quotas and the queue -----------------------------------------------------------------------


def _quota_limits_hold(cat: Catalog, usage: list[int]) -> None:
    """Kueue's invariants: a row within nominal + borrowing limit; a cohort's draws within what it lends."""
    pools: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for q, used in zip(cat.quotas, usage, strict=True):
        lendable = q.nominal if q.lending_limit is None else q.lending_limit
        if q.cohort is None:
            assert used <= q.nominal, q.label
            continue
        assert q.borrowing_limit is None or used <= q.nominal + q.borrowing_limit, q.label
        pool = pools[(q.cohort, q.gpu_type, q.provider)]
        pool[0] += max(0, used - (q.nominal - lendable))
        pool[1] += lendable
    for key, (drawn, lent) in pools.items():
        assert drawn <= lent, key


def test_quotas_are_never_exceeded_and_borrowing_happens() -> None:
    cat = catalog(
        [offer("a", "r1", capacity_gpus=64), offer("b", "r1", capacity_gpus=64), offer("a", "r1", "L40S")],
        (
            {"team": "a", "gpu_type": "H100", "nominal": 8, "borrowing_limit": 4, "lending_limit": 4, "cohort": "c"},
            {"team": "b", "gpu_type": "H100", "nominal": 8, "cohort": "c"},
            {"team": "c", "gpu_type": "H100", "nominal": 6},
            {"team": "c", "gpu_type": "L40S", "nominal": 4},
        ),
        H100=H100,
        L40S={"memory_gib": 48, "throughput": {"training": 0.5, "finetune": 0.5}},
    )
    model = WorkloadModel(teams={"a": 2.0, "b": 1.0, "c": 1.0}, daily_amplitude=0.9)
    for r in run_all(cat, model, jobs=700, days=3):
        assert r.trace is not None
        usage = [0] * len(cat.quotas)
        peak = [0] * len(cat.quotas)
        for _, row, used in r.trace.usage:
            usage[row] = used
            peak[row] = max(peak[row], used)
            _quota_limits_hold(cat, usage)
        assert usage == [0] * len(cat.quotas)
        assert peak[0] > cat.quotas[0].nominal and peak[2] == cat.quotas[2].nominal, (r.policy, peak)
        book, changes = QuotaBook(cat.quotas), []
        for seg in r.trace.segments:
            o, team = cat.offers[seg.offer], r.jobs.teams[r.jobs.team[seg.job]]
            row = book.resource(team, o.gpu_type, o.provider)
            changes += [(seg.start_h, 1, row, seg.gpus), (seg.end_h, 0, row, seg.gpus)]
        for _, starts, row, gpus in sorted(changes):
            book.admit(row, gpus) if starts else book.release(row, gpus)  # admit raises when over quota


def test_queue_wait_percentiles_of_a_hand_built_queue() -> None:
    # One GPU. A, B, C arrive at 0, D (priority 10) at 0.5; each needs 1 GPU-hour.
    # A runs 0-1, D jumps the queue and runs 1-2, B 2-3, C 3-4: waits 0, 2, 3, 0.5.
    # Sorted [0, 0.5, 2, 3]: p50 = 0.5 + 0.5 * 1.5 = 1.25, p95 at rank 2.85 = 2 + 0.85 * 1 = 2.85.
    cat = catalog([offer("a", "r1", capacity_gpus=1)])
    specs = [job("a"), job("b"), job("c"), job("d", priority=10)]
    r = simulate(cat, jobs_from_specs(cat, specs, [0.0, 0.0, 0.0, 0.5]), "cheapest", horizon_h=10.0)
    np.testing.assert_allclose(r.outcomes.wait_h, [0.0, 2.0, 3.0, 0.5])
    assert r.overall.queue_wait_p50_h == pytest.approx(1.25)
    assert r.overall.queue_wait_p95_h == pytest.approx(2.85)
    assert r.overall.makespan_h == pytest.approx(4.0) and r.overall.cost == pytest.approx(4 * 4.0)


def test_a_job_that_fits_starts_behind_one_that_does_not() -> None:
    # Two GPUs: X (0-1) and W (0-3) take both. Y (2 GPUs, priority 5) arrives at 0.1, Z (1 GPU) at 0.2.
    # When X ends at 1, Y still does not fit but Z does and starts (BestEffortFIFO); Y starts at 3.
    cat = catalog([offer("a", "r1", capacity_gpus=2)])
    specs = [job("x"), job("w", gpu_hours=3.0), job("y", gpus=2, gpu_hours=4.0, priority=5), job("z")]
    r = simulate(cat, jobs_from_specs(cat, specs, [0.0, 0.0, 0.1, 0.2]), "cheapest", horizon_h=10.0)
    np.testing.assert_allclose(r.outcomes.first_start_h, [0.0, 0.0, 3.0, 1.0])
    np.testing.assert_allclose(r.outcomes.finish_h, [1.0, 3.0, 5.0, 2.0])


def test_a_job_held_by_its_quota_does_not_hold_up_another_team() -> None:
    # Two GPUs; team q may use one. X (q, 0-3) and W (a, 0-1) run; Y (q, priority 5) arrives at 0.1
    # and waits for q's quota; Z (a) arrives at 0.2 and waits for a GPU. When W ends at 1, Y is first
    # in line but over quota, so Z starts; Y starts when X ends at 3.
    quotas = ({"team": "q", "gpu_type": "H100", "nominal": 1}, {"team": "a", "gpu_type": "H100", "nominal": 2})
    cat = catalog([offer("a", "r1", capacity_gpus=2)], quotas)
    specs = [job("x", team="q", gpu_hours=3.0), job("w"), job("y", team="q", priority=5), job("z")]
    r = simulate(cat, jobs_from_specs(cat, specs, [0.0, 0.0, 0.1, 0.2]), "cheapest", horizon_h=10.0)
    np.testing.assert_allclose(r.outcomes.first_start_h, [0.0, 0.0, 3.0, 1.0])


def test_deadline_misses_count_late_and_unfinished_jobs() -> None:
    cat = catalog([offer("a", "r1", capacity_gpus=1)])
    specs = [job("a", deadline_hours=1.5), job("b", deadline_hours=1.5), job("c", gpu_hours=50.0, deadline_hours=5)]
    r = simulate(cat, jobs_from_specs(cat, specs, [0.0, 0.0, 0.0]), "cheapest", horizon_h=10.0)
    assert (r.overall.deadline_jobs, r.overall.deadline_misses, r.overall.unfinished) == (3, 2, 1)


def test_jobs_that_can_never_start_wait_to_the_horizon_without_blocking_others() -> None:
    # "huge" needs more GPUs than any offer has; team z has no quota row on the governed H100.
    cat = catalog([offer("a", "r1", capacity_gpus=8)], ({"team": "a", "gpu_type": "H100", "nominal": 8},))
    specs = [job("huge", gpus=16), job("noquota", team="z"), job("small")]
    r = simulate(cat, jobs_from_specs(cat, specs, [0.0, 0.0, 1.0]), "spot_failover", horizon_h=10.0)
    assert (r.overall.never_started, r.overall.completed, r.overall.unfinished) == (2, 1, 2)
    np.testing.assert_allclose(r.outcomes.wait_h, [10.0, 10.0, 0.0])
    empty = simulate(cat, jobs_from_specs(cat, [], []), "cheapest", horizon_h=10.0)
    assert empty.overall.jobs == 0 and empty.overall.queue_wait_p95_h is None and empty.overall.cost == 0


def test_jobs_rent_whole_nodes_unless_the_fleet_is_pooled() -> None:
    # Two 1-GPU jobs of 1 GPU-hour, an 8-GPU node at $2/GPU-hour and 8 GPUs of capacity.
    cat = catalog([offer("a", "r1", gpus_per_node=8, capacity_gpus=8, on_demand_per_gpu_hour=2.0)])
    jobs = jobs_from_specs(cat, [job("x"), job("y")], [0.0, 0.0])
    nodes = simulate(cat, jobs, "cheapest", horizon_h=10.0, workload=WorkloadModel(whole_nodes=True))
    np.testing.assert_allclose(nodes.outcomes.first_start_h, [0.0, 1.0])  # one node: one job at a time
    assert nodes.overall.cost == pytest.approx(2 * 8 * 2.0) and nodes.overall.idle_gpu_hours == pytest.approx(14)
    pooled = simulate(cat, jobs, "cheapest", horizon_h=10.0)  # the default: GPUs pooled, jobs packed
    np.testing.assert_allclose(pooled.outcomes.first_start_h, [0.0, 0.0])
    assert pooled.overall.cost == pytest.approx(2 * 2.0) and pooled.overall.idle_gpu_hours == 0


def test_choices_inherit_the_jobs_gpu_type_and_memory_rules_types_out() -> None:
    l40s = {"memory_gib": 48, "throughput": {"training": 0.5}}
    cat = catalog(
        [offer("a", "r1", on_demand_per_gpu_hour=1.0), offer("b", "r1"), offer("a", "r1", "L40S")],
        H100=H100,
        L40S=l40s,
    )
    wide = job("wide", any_of=[{"gpu_type": "L40S"}, {"provider": "b"}])  # b's H100, or any L40S
    big = job("big", any_of=[{"gpu_type": "L40S"}, {}], memory_gib=60)  # any H100 (80 GiB); no L40S
    fleet = Fleet.of(cat)
    for spec, expected in ((wide, {"b/r1/H100", "a/r1/L40S"}), (big, {"a/r1/H100", "b/r1/H100"})):
        table = jobs_from_specs(cat, [spec], [0.0])
        need = Need("a", 1, "training", False, table.choice_sets[0], memory_gib=float(table.memory_gib[0]))
        options = make_policy("cheapest").options(fleet, need, QuotaBook(cat.quotas))
        assert {cat.offers[o >> 1].key for o in options} == expected


def test_a_checkpoint_interval_in_steps_stretches_on_a_slower_gpu() -> None:
    # 4 GPU-hours on an L40S at throughput 0.5: 8 hours. 100 steps of 36 s are 1 h on the reference
    # GPU, 2 h here: 3 saves of 6 min (0.3 GPU-hours); every_seconds=3600 would save 7 times.
    cat = catalog([offer("a", "r1", "L40S")], L40S={"memory_gib": 48, "throughput": {"training": 0.5}})

    def saving(checkpoint: dict[str, Any]) -> float:
        spec = job("x", gpu_hours=4.0, save_seconds=360, step_seconds=36).copy_with(
            checkpoint=checkpoint, resources={"gpu_type": "L40S", "gpus": 1}
        )
        r = simulate(cat, jobs_from_specs(cat, [spec], [0.0]), "cheapest", horizon_h=20.0)
        assert r.overall.completed == 1
        return r.overall.checkpoint_gpu_hours

    assert saving({"every_steps": 100}) == pytest.approx(0.3)
    assert saving({"every_seconds": 3600}) == pytest.approx(0.7)


def test_an_outage_closes_the_region_to_new_jobs_for_the_cool_down() -> None:
    # a/r1 is down from 1 h to 1.5 h; with a 3 h cool-down spot_failover sends a job arriving at 2 h
    # to a/r2 and one arriving at 4.5 h back to a/r1; cheapest sends both to a/r1.
    cat = catalog([offer("a", "r1", spot_per_gpu_hour=1.0), offer("a", "r2", spot_per_gpu_hour=2.0)])
    jobs = jobs_from_specs(cat, [job("new", spot=True), job("later", spot=True)], [2.0, 4.5])
    model = WorkloadModel(failover=FailoverRule(cooldown_hours=3.0))
    for policy, regions in (("spot_failover", ["r2", "r1"]), ("cheapest", ["r1", "r1"])):
        r = simulate(cat, jobs, policy, horizon_h=10, outages=[Outage(1.0, 1.5, "a", "r1")], workload=model, trace=True)
        assert [cat.offers[segs[0].offer].region for _, segs in sorted(segments_by_job(r).items())] == regions


def test_a_burst_of_preemptions_closes_the_spot_market_only_when_the_rule_asks() -> None:
    # a/r1's spot market preempts 50 times an hour; 8 spot jobs start there at 0. A spot job and an
    # on-demand job arrive at 1 h. With the burst rule (2 within an hour), r1's spot market is closed
    # by then: the new spot job goes to r2, the on-demand one still to r1 (on-demand is not preempted).
    cat = catalog(
        [
            offer("a", "r1", on_demand_per_gpu_hour=3.0, spot_per_gpu_hour=1.0, spot_preemptions_per_hour=50.0),
            offer("a", "r2", on_demand_per_gpu_hour=4.0, spot_per_gpu_hour=2.0),
        ]
    )
    specs = [job(f"j{i}", gpu_hours=5.0, spot=True) for i in range(8)] + [job("spot", spot=True), job("od")]
    jobs = jobs_from_specs(cat, specs, [0.0] * 8 + [1.0, 1.0])
    for rule, spot_goes_to in ((FailoverRule(preemptions=2, cooldown_hours=5.0), "r2"), (FailoverRule(), "r1")):
        r = simulate(cat, jobs, "spot_failover", horizon_h=30, workload=WorkloadModel(failover=rule), trace=True)
        first = {j: segs[0] for j, segs in segments_by_job(r).items()}
        assert (cat.offers[first[8].offer].region, first[8].spot) == (spot_goes_to, True)
        assert (cat.offers[first[9].offer].region, first[9].spot) == ("r1", False)


# -- the interruption model ---------------------------------------------------------------------


def test_an_interrupted_job_loses_what_followed_its_last_checkpoint() -> None:
    # Checkpoint every 1 h, no save or restore time, preemptions Exp(0.5/h); the remaining work is a
    # whole number of hours, so the loss is X mod 1 with X ~ Exp(rate) (memoryless), whose mean is
    # 1/rate - exp(-rate) / (1 - exp(-rate)) = 0.4585 h: about half the interval. 2,500 draws: sd 0.006.
    rate = 0.5
    cat = catalog([offer("a", "r1", spot_per_gpu_hour=1.0, spot_preemptions_per_hour=rate, capacity_gpus=64)])
    specs = [job(f"j{i}", gpu_hours=40.0, spot=True, every_seconds=3600) for i in range(100)]
    r = simulate(cat, jobs_from_specs(cat, specs, [0.0] * 100), "cheapest", horizon_h=2000.0, seed=4)
    expected = 1 / rate - math.exp(-rate) / (1 - math.exp(-rate))
    assert r.overall.preemptions > 1500
    assert r.overall.lost_gpu_hours / r.overall.preemptions == pytest.approx(expected, abs=0.02)
    assert r.overall.completed == 100 and r.overall.restore_gpu_hours == 0


def test_lost_restore_and_saving_follow_each_attempts_timeline() -> None:
    cat = catalog([offer("a", "r1", spot_per_gpu_hour=1.0, spot_preemptions_per_hour=0.7, capacity_gpus=64)])
    specs = [
        job(f"j{i}", gpus=2, gpu_hours=12.0, spot=True, every_seconds=1800, save_seconds=180, restore_seconds=360)
        for i in range(30)
    ]
    r = simulate(cat, jobs_from_specs(cat, specs, [0.0] * 30), "cheapest", horizon_h=500.0, seed=1, trace=True)
    c, s, restore = 0.5, 0.05, 0.1
    for j, segs in segments_by_job(r).items():
        lost = restored = 0.0
        for n, seg in enumerate(segs):
            r_h = min(restore if n else 0.0, seg.end_h - seg.start_h)
            restored += r_h
            if seg.end == "preempted":
                lost += (seg.end_h - seg.start_h - r_h) % (c + s)
        assert r.outcomes.lost_gpu_hours[j] == pytest.approx(2 * lost, abs=1e-9)
        assert r.outcomes.restore_gpu_hours[j] == pytest.approx(2 * restored, abs=1e-9)
    assert r.overall.preemptions > 30 and r.overall.checkpoint_gpu_hours > 0


# -- workload model -----------------------------------------------------------------------------


def test_arrivals_follow_the_daily_cycle() -> None:
    cat = fleet_catalog()

    def peak_over_trough(amplitude: float) -> float:
        model = WorkloadModel(daily_amplitude=amplitude, peak_hour=15)
        hours = generate_jobs(cat, model, jobs=20_000, days=10, rng=np.random.default_rng(0)).arrival_h % 24
        return float(((hours >= 12) & (hours < 18)).sum() / ((hours >= 0) & (hours < 6)).sum())

    assert peak_over_trough(0.8) > 3.0
    assert 0.9 < peak_over_trough(0.0) < 1.1


def test_generated_jobs_respect_the_mix_and_team_quotas() -> None:
    cat = fleet_catalog()
    model = WorkloadModel(gpus={2: 1.0, 8: 3.0}, spot_share=0.25, pinned_share=1.0)
    jobs: JobTable = generate_jobs(cat, model, jobs=4000, days=5, rng=np.random.default_rng(1))
    assert set(jobs.teams) == {"vision", "speech"} and set(np.unique(jobs.gpus)) == {2, 8}
    assert 0.7 < (jobs.gpus == 8).mean() < 0.8 and 0.2 < jobs.spot.mean() < 0.3
    vision = jobs.team == jobs.teams.index("vision")
    pinned = {jobs.choice_sets[c].gpu_type for c in np.unique(jobs.choice[vision])}
    assert pinned == {"H100"}  # vision has no L40S quota
    assert np.all(np.diff(jobs.arrival_h) >= 0) and jobs.arrival_h.max() < 5 * 24


def test_workload_yaml_round_trip_and_a_bad_field(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("gpus: {4: 1.0}\nspot_share: 0.0\noutages: {region_per_day: 0}\n", encoding="utf-8")
    model = load_workload(path)
    assert model.gpus == {4: 1.0} and model.spot_share == 0.0 and model.outages.region_per_day == 0
    with pytest.raises(UsageError, match="spot_shar: unknown field"):
        parse_workload({"spot_shar": 0.5}, source="w.yaml")
    with pytest.raises(UsageError, match="deadline_slack"):
        parse_workload({"deadline_slack": [3, 1]})


def test_jobs_from_specs_needs_the_work() -> None:
    cat = catalog([offer("a", "r1")])
    spec = parse_spec({"name": "nowork", "entrypoint": "m:f", "resources": {"gpu_type": "H100"}})
    with pytest.raises(UsageError, match=r"'nowork'.*gpu_hours"):
        jobs_from_specs(cat, [spec], [0.0])


# -- command line ---------------------------------------------------------------------------------

app = typer.Typer(pretty_exceptions_enable=False)
app.command("simulate")(simulate_command)
app.command("version")(lambda: None)


def _run(*args: str) -> tuple[int, str]:
    """Exit code and output as ``gpufleet.cli.app:main`` gives them: a GpufleetError is one line and its code."""
    result = CliRunner().invoke(app, ["simulate", *args], env={"COLUMNS": "200"})
    if isinstance(result.exception, GpufleetError):
        return result.exception.exit_code, f"error: {result.exception}"
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


CATALOG = str(REPO / "examples" / "catalog.yaml")


def test_cli_json_compares_the_chosen_policies() -> None:
    code, out = _run(
        "--catalog", CATALOG, "--jobs", "300", "--days", "3", "--policy", "cheapest", "--policy", "on_demand", "--json"
    )
    data = json.loads(out)
    assert code == 0 and [r["policy"] for r in data["results"]] == ["cheapest", "on_demand"]
    cheapest, on_demand = (r["overall"] for r in data["results"])
    assert cheapest["jobs"] == 300 and on_demand["preemptions"] == 0
    assert cheapest["cost"] < on_demand["cost"]
    assert set(data["results"][0]["teams"]) == {"perception", "language"}


def test_cli_table_and_report_files(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    code, text = _run("--catalog", CATALOG, "--jobs", "200", "--days", "2", "--out", str(out), "--seed", "3")
    assert code == 0 and all(p in text for p in POLICIES) and "cost per team" in text
    names = {"simulation.json", "simulation.md", "cost_by_team.png", "wasted_gpu_hours.png", "queue_wait_p95.png"}
    assert names | {"deadline_misses.png"} == {p.name for p in out.iterdir()}
    assert all((out / n).read_bytes()[:4] == b"\x89PNG" for n in names if n.endswith(".png"))
    saved = json.loads((out / "simulation.json").read_text(encoding="utf-8"))
    code, again = _run("--catalog", CATALOG, "--jobs", "200", "--days", "2", "--seed", "3", "--json")
    assert saved["results"] == json.loads(again)["results"]
    assert "| spot_failover |" in (out / "simulation.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "fastest"], "unknown policy 'fastest'"),
        (["--days", "-1"], "--days -1"),
        (["--jobs", "0"], "--jobs 0"),
        (["--workload", "/nonexistent/w.yaml"], "cannot read workload model"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    code, out = _run("--catalog", CATALOG, *args)
    assert code == 2 and message in out and "\n" not in out.strip()
