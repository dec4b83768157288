"""The planner, the quota book and the Young/Daly advisor, on small hand-made catalogues."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from gpufleet.errors import UsageError
from gpufleet.placement.advisor import advise, expected_hours, loss_fraction, young_daly_interval
from gpufleet.placement.catalog import Catalog, Quota, parse_catalog
from gpufleet.placement.planner import Allocation, Plan, plan
from gpufleet.placement.quota import NO_QUOTA, UNGOVERNED, QuotaBook
from gpufleet.spec import JobSpec, parse_spec


def offer(provider: str, region: str = "r1", gpu_type: str = "H100", **kw: Any) -> dict[str, Any]:
    row = {"provider": provider, "region": region, "gpu_type": gpu_type, "gpus_per_node": 8}
    row.update(on_demand_per_gpu_hour=4.0, capacity_gpus=64)
    row.update(kw)
    return row


def catalog(offers: list[dict[str, Any]], quotas: list[dict[str, Any]] | None = None) -> Catalog:
    return parse_catalog(
        {
            "as_of": "2026-12-01",
            "gpu_types": {
                "H100": {"memory_gib": 80, "throughput": {"training": 1.0, "finetune": 1.0}},
                "L40S": {"memory_gib": 48, "throughput": {"training": 0.4, "finetune": 0.5}},
            },
            "offers": offers,
            "quotas": quotas or [],
        }
    )


def job(name: str, gpus: int = 8, gpu_type: str = "H100", **kw: Any) -> JobSpec:
    placement = kw.pop("placement", {})
    return parse_spec(
        {
            "name": name,
            "entrypoint": "m.n:f",
            "resources": {"gpu_type": gpu_type, "gpus": gpus},
            "placement": {"gpu_hours": 80, **placement},
            **kw,
        }
    )


def reasons(p: Plan, name: str) -> dict[tuple[str, bool], str]:
    return {(c.offer, c.spot): c.reason for c in p.decision(name).rejected}


# -- quota book (Kueue semantics) -------------------------------------------------------------


def _quota(team: str, nominal: int, **kw: Any) -> Quota:
    return Quota(team=team, gpu_type="H100", nominal=nominal, cohort=kw.pop("cohort", "c"), **kw)


def test_nominal_then_borrowing_limit() -> None:
    book = QuotaBook([_quota("a", 8, borrowing_limit=4), _quota("b", 16)])
    a = book.resource("a", "H100", "aws")
    assert book.why_not(a, 8) is None
    first = book.admit(a, 8)
    assert (first.nominal_gpus, first.borrowed_gpus) == (8, 0)
    assert book.headroom(a) == 4, "the cohort has 16 to lend but a may borrow only 4"
    second = book.admit(a, 4)
    assert (second.nominal_gpus, second.borrowed_gpus) == (0, 4)
    reason = book.why_not(a, 1)
    assert reason is not None and "borrowing limit 4" in reason


def test_lender_never_lends_more_than_its_lending_limit() -> None:
    book = QuotaBook([_quota("a", 0), _quota("b", 16, lending_limit=6)])
    a, b = book.resource("a", "H100", "gcp"), book.resource("b", "H100", "gcp")
    assert book.headroom(a) == 6
    book.admit(a, 6)
    reason = book.why_not(a, 1)
    assert reason is not None and "cohort c" in reason
    assert book.headroom(b) == 10, "b keeps its guaranteed 10 GPUs"
    book.admit(b, 10)
    assert book.headroom(b) == 0
    book.release(a, 6)
    assert book.headroom(b) == 6, "what a gave back is b's again"


def test_no_cohort_no_borrowing_and_unknown_flavors() -> None:
    book = QuotaBook([_quota("a", 8, cohort=None), _quota("b", 16, cohort=None)])
    a = book.resource("a", "H100", "aws")
    assert book.headroom(a) == 8
    reason = book.why_not(a, 9)
    assert reason is not None and "no cohort" in reason
    assert book.resource("c", "H100", "aws") == NO_QUOTA
    assert book.resource("a", "L40S", "aws") == UNGOVERNED
    specific = QuotaBook([Quota(team="a", gpu_type="H100", provider="aws", nominal=8)])
    assert specific.resource("a", "H100", "gcp") == UNGOVERNED
    assert specific.resource("b", "H100", "aws") == NO_QUOTA


# -- planner ----------------------------------------------------------------------------------


def test_overflow_own_nominal_then_cohort_then_next_provider() -> None:
    quotas = [
        {"team": "x", "gpu_type": "H100", "provider": "cheap", "nominal": 8, "cohort": "lab"},
        {"team": "y", "gpu_type": "H100", "provider": "cheap", "nominal": 8, "lending_limit": 4, "cohort": "lab"},
    ]
    offers = [offer("cheap", on_demand_per_gpu_hour=2.0, gpus_per_node=4, capacity_gpus=16), offer("dear")]
    cat = catalog(offers, quotas)
    jobs = [job("x1", 8, team="x"), job("x2", 4, team="x"), job("x3", 4, team="x")]
    p = plan(jobs, cat)
    one, two, three = (p.decision(n).choice for n in ("x1", "x2", "x3"))
    assert one is not None and one.offer == "cheap/r1/H100" and one.admission is not None
    assert one.admission.borrowed_gpus == 0
    assert two is not None and two.offer == "cheap/r1/H100" and two.admission is not None
    assert two.admission.borrowed_gpus == 4, "x's nominal is used up: it borrows y's lendable 4"
    assert three is not None and three.offer == "dear/r1/H100", "y lends no more: spill to the next provider"
    assert reasons(p, "x3")[("cheap/r1/H100", False)] == "quota_exhausted"
    assert p.ok


def test_ordered_first_feasible_choice_wins_any_of_takes_cheapest() -> None:
    cat = catalog([offer("dear", on_demand_per_gpu_hour=6.0, capacity_gpus=8), offer("cheap")])
    choices = [{"provider": "dear"}, {"provider": "cheap"}]
    ordered = plan([job("o", placement={"ordered": choices})], cat)
    chosen = ordered.decision("o").choice
    assert chosen is not None and chosen.offer == "dear/r1/H100" and chosen.preference == 0
    assert reasons(ordered, "o")[("cheap/r1/H100", False)] == "preference_order"
    any_of = plan([job("a", placement={"any_of": choices})], cat)
    chosen = any_of.decision("a").choice
    assert chosen is not None and chosen.offer == "cheap/r1/H100"
    assert reasons(any_of, "a")[("dear/r1/H100", False)] == "costlier"
    # the first choice is full: the second wins, and the first says why
    full = plan([job("first", placement={"ordered": choices}), job("second", placement={"ordered": choices})], cat)
    chosen = full.decision("second").choice
    assert chosen is not None and chosen.offer == "cheap/r1/H100" and chosen.preference == 1
    assert reasons(full, "second")[("dear/r1/H100", False)] == "over_capacity"


def test_deadline_picks_the_faster_type_and_reports_the_impossible() -> None:
    cat = catalog([offer("p", on_demand_per_gpu_hour=4.0), offer("p", gpu_type="L40S", on_demand_per_gpu_hour=1.0)])
    both = [{"gpu_type": "H100"}, {"gpu_type": "L40S"}]
    # 80 GPU-hours on 8 GPUs: 10 h on H100 ($320), 25 h on L40S ($200)
    relaxed = plan([job("j", placement={"any_of": both})], cat).decision("j").choice
    assert relaxed is not None and relaxed.gpu_type == "L40S"
    assert relaxed.expected_hours == pytest.approx(80 / (0.4 * 8))
    tight = plan([job("j", placement={"any_of": both, "deadline_hours": 12})], cat)
    chosen = tight.decision("j").choice
    assert chosen is not None and chosen.gpu_type == "H100"
    assert reasons(tight, "j")[("p/r1/L40S", False)] == "deadline"
    impossible = plan([job("j", placement={"any_of": both, "deadline_hours": 5})], cat)
    assert not impossible.ok and impossible.decision("j").choice is None
    assert any("deadline" in r for r in impossible.decision("j").reasons)


def _spot_choice(rate: float) -> tuple[bool, float]:
    cat = catalog([offer("p", spot_per_gpu_hour=2.0, spot_preemptions_per_hour=rate)])
    spec = job("j", spot=True, placement={"save_seconds": 120, "restore_seconds": 300})
    d = plan([spec], cat).decision("j")
    assert d.choice is not None and d.expected_cost is not None
    return d.choice.spot, d.expected_cost


def test_spot_wins_until_preemptions_make_it_dearer() -> None:
    rates = [0.0, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0]
    picks = [_spot_choice(r)[0] for r in rates]
    assert picks[0] and not picks[-1]
    flip = picks.index(False)
    assert all(picks[:flip]) and not any(picks[flip:]), f"one flip from spot to on-demand: {picks}"
    # the spot cost is the formula, computed here independently
    rate = 1.0
    tau = math.sqrt(2 * 120 * 3600 / rate)
    f = rate * (tau / 2 + 300) / 3600
    cat = catalog([offer("p", spot_per_gpu_hour=2.0, spot_preemptions_per_hour=rate)])
    d = plan([job("j", spot=True, placement={"save_seconds": 120, "restore_seconds": 300})], cat).decision("j")
    assert d.choice is not None and d.choice.spot, "at 1 preemption an hour spot still wins"
    assert d.expected_cost == pytest.approx(2.0 * 8 * 10 / (1 - f))
    assert d.choice.cost.preemption_loss == pytest.approx(2.0 * 8 * 10 / (1 - f) - 2.0 * 8 * 10)


def test_spot_needs_permission_and_a_market() -> None:
    cat = catalog([offer("p", spot_per_gpu_hour=1.0), offer("q", on_demand_per_gpu_hour=3.0)])
    choice = plan([job("j")], cat).decision("j").choice
    assert choice is not None and not choice.spot, "spec.spot is false"
    d = plan([job("j", spot=True)], cat).decision("j")
    assert d.choice is not None and d.choice.spot and d.choice.offer == "p/r1/H100"
    assert ("q/r1/H100", True) not in reasons(plan([job("j", spot=True)], cat), "j"), "q has no spot market"


def test_capacity_is_consumed_in_priority_order() -> None:
    cat = catalog([offer("p", capacity_gpus=16)])
    jobs = [job("low1"), job("low2"), job("high", priority=5)]
    p = plan(jobs, cat)
    assert [d.job for d in p.decisions] == ["low1", "low2", "high"], "submission order is kept in the plan"
    assert p.decision("high").placed and p.decision("high").order == 0
    assert p.decision("low1").placed and not p.decision("low2").placed
    assert reasons(p, "low2") == {("p/r1/H100", False): "over_capacity"}
    assert "needs 8 GPUs, 0 left" in p.decision("low2").reasons[0]
    held = plan([job("a")], cat, running=[Allocation(team="default", offer="p/r1/H100", gpus=16)])
    assert not held.decision("a").placed


def test_infeasible_jobs_stay_in_the_plan_with_reasons() -> None:
    cat = catalog([offer("p", gpu_type="L40S")])
    jobs = [
        job("no-offer", placement={"any_of": [{"gpu_type": "H100"}]}),
        job("too-big", gpu_type="L40S", placement={"memory_gib": 64}),
        job("fits", gpu_type="L40S"),
    ]
    p = plan(jobs, cat)
    assert len(p.decisions) == 3 and [d.job for d in p.infeasible] == ["no-offer", "too-big"]
    assert p.decision("no-offer").reasons == ("no offer of H100 matches the job's choices",)
    assert "memory" in p.decision("too-big").reasons[0] and "64 GiB" in p.decision("too-big").reasons[0]
    out = p.to_dict()
    json.dumps(out, allow_nan=False)
    assert out["infeasible"] == 2 and out["decisions"][1]["rejected"][0]["reason"] == "memory"


def test_blocked_and_egress_when_leaving_the_current_provider() -> None:
    offers = [offer("home", on_demand_per_gpu_hour=4.0, egress_per_gb=0.5), offer("away", on_demand_per_gpu_hour=3.9)]
    cat = catalog(offers)
    stay = job("j", provider="home", placement={"checkpoint_gb": 100})
    chosen = plan([stay], cat).decision("j").choice
    assert chosen is not None and chosen.offer == "home/r1/H100", "moving costs $50 egress, saves $8"
    moved = plan([stay], cat, blocked=["home"]).decision("j").choice
    assert moved is not None and moved.offer == "away/r1/H100"
    assert moved.cost.egress == pytest.approx(100 * 0.5)
    assert reasons(plan([stay], cat, blocked=["home/r1"]), "j")[("home/r1/H100", False)] == "blocked"
    light = job("j", provider="home", placement={"checkpoint_gb": 1})
    chosen = plan([light], cat).decision("j").choice
    assert chosen is not None and chosen.offer == "away/r1/H100"
    with pytest.raises(UsageError, match="block target"):
        plan([stay], cat, blocked=["no such place"])


def test_team_without_quota_on_a_governed_flavor() -> None:
    cat = catalog([offer("p")], [{"team": "owners", "gpu_type": "H100", "nominal": 8}])
    p = plan([job("j", team="guests")], cat)
    assert not p.ok and "team guests has no quota for H100 at p" in p.decision("j").reasons[0]


# -- Young/Daly -------------------------------------------------------------------------------


@pytest.mark.parametrize(("save", "rate"), [(30.0, 0.1), (120.0, 1.0), (5.0, 4.0)])
def test_young_daly_matches_the_formula(save: float, rate: float) -> None:
    mtbf = 3600 / rate
    advice = advise(save, rate, step_seconds=2.0)
    assert advice is not None
    assert advice.interval_seconds == pytest.approx(math.sqrt(2 * save * mtbf))
    assert advice.interval_steps == max(1, round(math.sqrt(2 * save * mtbf) / 2.0))
    assert young_daly_interval(save, mtbf) == advice.interval_seconds
    assert advise(save, 0.0) is None
    assert loss_fraction(rate, 100.0, 10.0) == pytest.approx(rate * 60 / 3600)
    assert expected_hours(10.0, 1.0) == math.inf
    with pytest.raises(UsageError):
        young_daly_interval(0.0, mtbf)


def test_plan_shows_the_interval_per_job() -> None:
    cat = catalog([offer("p", spot_per_gpu_hour=1.0, spot_preemptions_per_hour=0.5)])
    spec = job("j", spot=True, placement={"save_seconds": 60, "step_seconds": 0.5})
    choice = plan([spec], cat).decision("j").choice
    assert choice is not None and choice.spot and choice.advice is not None
    assert choice.interval_seconds == pytest.approx(math.sqrt(2 * 60 * 3600 / 0.5))
    assert choice.advice.interval_steps == round(math.sqrt(2 * 60 * 7200) / 0.5)
    assert choice.to_dict()["young_daly"]["interval_seconds"] == pytest.approx(choice.interval_seconds)


def test_empty_batch_and_spot_without_preemptions() -> None:
    cat = catalog([offer("p", spot_per_gpu_hour=1.0)])
    empty = plan([], cat)
    assert empty.ok and empty.decisions == () and empty.to_dict()["placed"] == 0
    d = plan([job("j", spot=True, placement={"save_seconds": 60})], cat).decision("j")
    assert d.choice is not None and d.choice.spot
    assert d.choice.expected_hours == d.choice.compute_hours, "no preemptions, no loss"
    assert d.choice.advice is None and d.choice.interval_seconds is None
    json.dumps(d.to_dict(), allow_nan=False)
    with pytest.raises(KeyError):
        empty.decision("j")


def test_package_exports_resolve() -> None:
    import gpufleet.placement as placement

    assert sorted(placement.__all__) == placement.__all__
    for name in placement.__all__:
        assert getattr(placement, name) is not None
    assert placement.plan is plan
    with pytest.raises(AttributeError):
        _ = placement.no_such_name
