"""The cost arithmetic (ledger.py) and the rate card loader (rates.py), with numbers worked by hand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cost.ledger import AttemptUsage, attempt_cost, build_ledger
from gpufleet.cost.rates import Rate, RateCard, load_rates
from gpufleet.errors import UsageError

CARD = RateCard(
    currency="USD",
    rates=[
        Rate(gpu_type="H100", provider="lambda", on_demand=3.0, spot=1.5),
        Rate(gpu_type="H100", provider="*", on_demand=4.0, spot=2.0),
        Rate(gpu_type="L4", provider="*", on_demand=0.8),
    ],
)


BASE = AttemptUsage(job_id=1, job_name="job", team="nlp", attempt=1, gpu_type="H100", provider="lambda",
                    spot=False, gpus=1, start=1000.0, end=4600.0, outcome="completed")  # fmt: skip


def usage(**changes: Any) -> AttemptUsage:
    return replace(BASE, **changes)


# --- buckets -----------------------------------------------------------------------------------


def test_seconds_sum_to_wall() -> None:
    u = usage(start=100.0, end=400.0, startup_s=20.0, restore_s=10.0, checkpoint_s=15.0, lost_s=40.0)
    sec = u.seconds()
    assert sec == pytest.approx({"startup": 20.0, "restore": 10.0, "checkpoint": 15.0, "lost": 40.0, "useful": 215.0})
    assert sum(sec.values()) == pytest.approx(u.wall_s) == pytest.approx(300.0)


def test_overhead_larger_than_wall_is_scaled_down() -> None:
    # 200 s of overhead in a 100 s attempt: everything is halved, nothing is left for useful.
    u = usage(start=0.0, end=100.0, startup_s=100.0, restore_s=50.0, checkpoint_s=25.0, lost_s=25.0)
    sec = u.seconds()
    assert sec == pytest.approx({"startup": 50.0, "restore": 25.0, "checkpoint": 12.5, "lost": 12.5, "useful": 0.0})
    assert sum(sec.values()) == pytest.approx(100.0)


def test_end_before_start_is_zero_wall() -> None:
    u = usage(start=10.0, end=5.0, startup_s=3.0)
    assert u.wall_s == 0.0
    assert sum(u.seconds().values()) == 0.0


# --- pricing -----------------------------------------------------------------------------------


def test_exact_provider_price_wins_over_wildcard() -> None:
    # 2 GPUs x 1800 s = 1 GPU-hour at lambda's 3.0 on-demand.
    cost = attempt_cost(usage(gpus=2, start=0.0, end=1800.0), CARD)
    assert cost.total_gpu_hours == pytest.approx(1.0)
    assert cost.money == pytest.approx(3.0)
    assert cost.on_demand_money == pytest.approx(3.0)
    assert cost.unpriced == ()


def test_wildcard_provider_is_the_fallback() -> None:
    cost = attempt_cost(usage(provider="aws", gpus=2, start=0.0, end=1800.0), CARD)
    assert cost.money == pytest.approx(4.0)


def test_spot_price_and_on_demand_comparison() -> None:
    lam = attempt_cost(usage(spot=True, gpus=2, start=0.0, end=1800.0), CARD)
    assert lam.money == pytest.approx(1.5)
    assert lam.on_demand_money == pytest.approx(3.0)
    aws = attempt_cost(usage(provider="aws", spot=True, gpus=2, start=0.0, end=1800.0), CARD)
    assert aws.money == pytest.approx(2.0)
    assert aws.on_demand_money == pytest.approx(4.0)


def test_missing_spot_price_falls_back_to_on_demand() -> None:
    cost = attempt_cost(usage(gpu_type="L4", provider="gcp", spot=True, start=0.0, end=3600.0), CARD)
    assert cost.money == pytest.approx(0.8)
    assert cost.on_demand_money == pytest.approx(0.8)


def test_unpriced_gpu_type_is_counted_in_hours_and_listed() -> None:
    cost = attempt_cost(usage(gpu_type="B200", spot=True, start=0.0, end=7200.0), CARD)
    assert cost.total_gpu_hours == pytest.approx(2.0)
    assert cost.money == 0.0
    assert cost.on_demand_money == 0.0
    assert cost.unpriced == ("B200/lambda/spot",)
    ledger = build_ledger([usage(gpu_type="B200", spot=True), usage(job_id=2)], CARD)
    assert ledger.total.unpriced == ("B200/lambda/spot",)
    assert ledger.jobs[2].unpriced == ()


# --- aggregation -------------------------------------------------------------------------------


def two_jobs() -> list[AttemptUsage]:
    return [
        # Job 1: H100 on lambda, spot (1.5/h; on-demand 3.0/h), 1 GPU.
        # a1: 3600 s = 1 GPU-h, 900 s lost = 0.25 GPU-h, preempted.  a2: 1800 s = 0.5 GPU-h.
        usage(job_id=1, attempt=1, spot=True, start=0.0, end=3600.0, outcome="preempted", lost_s=900.0,
              startup_s=180.0, steps_done=100, steps_redone=25),
        usage(job_id=1, attempt=2, spot=True, start=3700.0, end=5500.0, restore_s=60.0, steps_done=80),
        # Job 2: L4 on gcp (wildcard, 0.8/h, no spot), 2 GPUs.
        # a1: 900 s x 2 = 0.5 GPU-h, 450 s x 2 = 0.25 GPU-h lost, failed.  a2: 1800 s x 2 = 1.0 GPU-h.
        usage(job_id=2, attempt=1, gpu_type="L4", provider="gcp", gpus=2, start=0.0, end=900.0, outcome="failed",
              lost_s=450.0, steps_done=10, steps_redone=10),
        usage(job_id=2, attempt=2, gpu_type="L4", provider="gcp", gpus=2, start=1000.0, end=2800.0, steps_done=50),
        # Job 3, another team: 1 GPU-hour of H100 on-demand at lambda.
        usage(job_id=3, team="vision", start=0.0, end=3600.0),
    ]  # fmt: skip


def test_per_team_aggregation() -> None:
    ledger = build_ledger(two_jobs(), CARD)
    assert list(ledger.jobs) == [1, 2, 3]
    assert list(ledger.teams) == ["nlp", "vision"]
    assert ledger.currency == "USD"

    job1, job2 = ledger.jobs[1], ledger.jobs[2]
    assert job1.total_gpu_hours == pytest.approx(1.5)
    assert job1.money == pytest.approx(1.5 * 1.5)  # 2.25
    assert job1.on_demand_money == pytest.approx(1.5 * 3.0)  # 4.5
    assert job1.gpu_hours["lost"] == pytest.approx(0.25)
    assert job1.gpu_hours["startup"] == pytest.approx(0.05)
    assert job1.gpu_hours["restore"] == pytest.approx(60 / 3600)
    assert (job1.attempts, job1.preemptions, job1.steps_redone) == (2, 1, 25)
    assert job2.total_gpu_hours == pytest.approx(1.5)
    assert job2.money == pytest.approx(1.2)
    assert job2.on_demand_money == pytest.approx(1.2)
    assert (job2.attempts, job2.preemptions, job2.steps_redone) == (2, 0, 10)

    nlp = ledger.teams["nlp"]
    assert nlp.total_gpu_hours == pytest.approx(3.0)
    assert nlp.gpu_hours["lost"] == pytest.approx(0.5)
    assert nlp.money == pytest.approx(3.45)
    assert nlp.on_demand_money == pytest.approx(5.7)
    assert nlp.lost_money == pytest.approx(3.45 * 0.5 / 3.0)  # 0.575
    assert (nlp.attempts, nlp.preemptions, nlp.steps_redone) == (4, 1, 35)

    vision = ledger.teams["vision"]
    assert vision.money == pytest.approx(3.0)
    assert ledger.total.total_gpu_hours == pytest.approx(4.0)
    assert ledger.total.money == pytest.approx(6.45)
    assert ledger.total.attempts == 5

    d = ledger.total.to_dict()
    assert d["gpu_hours"] == pytest.approx(4.0)
    assert d["money"] == pytest.approx(6.45)
    assert d["lost_gpu_hours"] == pytest.approx(0.5)


def test_empty_ledger() -> None:
    ledger = build_ledger([], CARD)
    assert ledger.jobs == {} and ledger.teams == {}
    assert ledger.total.total_gpu_hours == 0.0
    assert ledger.total.lost_money == 0.0


# --- rate cards --------------------------------------------------------------------------------


def test_default_rate_card_loads() -> None:
    card = load_rates()
    assert card.currency == "USD"
    assert card.price("H100", "anywhere", spot=False) == pytest.approx(2.99)
    assert card.price("H100", "anywhere", spot=True) == pytest.approx(1.49)
    assert card.price("cpu", "local", spot=True) == pytest.approx(0.05)  # no spot row: on-demand


def test_rate_card_from_file(tmp_path: Path) -> None:
    path = tmp_path / "rates.yaml"
    path.write_text('currency: EUR\nas_of: "2026-12-01"\nrates:\n  - {gpu_type: L4, on_demand: 0.7}\n')
    card = load_rates(path)
    assert card.currency == "EUR"
    assert card.price("L4", "x", spot=True) == pytest.approx(0.7)


@pytest.mark.parametrize(
    "text",
    [
        "rates: [ {gpu_type: H100, on_demand: 1.0",  # malformed YAML
        "rates:\n  - {gpu_type: H100, on_demand: 1.0}\ncolour: red\n",  # unknown top-level field
        "rates:\n  - {gpu_type: H100, on_demand: 1.0, colour: red}\n",  # unknown field in a row
        "rates:\n  - {gpu_type: H100, on_demand: -1.0}\n",  # negative price
        "",  # empty file
    ],
)
def test_bad_rate_card_is_a_usage_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "rates.yaml"
    path.write_text(text)
    with pytest.raises(UsageError):
        load_rates(path)


def test_missing_rate_card_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read rate card"):
        load_rates(tmp_path / "nope.yaml")
