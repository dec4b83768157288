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
    assert sec == pytest.approx(
        {"startup": 20.0, "restore": 10.0, "staging": 0.0, "checkpoint": 15.0, "lost": 40.0, "useful": 215.0}
    )
    assert sum(sec.values()) == pytest.approx(u.wall_s) == pytest.approx(300.0)


def test_overhead_larger_than_wall_is_scaled_down() -> None:
    # 200 s of overhead in a 100 s attempt: everything is halved, nothing is left for useful.
    u = usage(start=0.0, end=100.0, startup_s=100.0, restore_s=50.0, checkpoint_s=25.0, lost_s=25.0)
    sec = u.seconds()
    assert sec == pytest.approx(
        {"startup": 50.0, "restore": 25.0, "staging": 0.0, "checkpoint": 12.5, "lost": 12.5, "useful": 0.0}
    )
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


# --- preemption overhead -----------------------------------------------------------------------


def preempted_three_times() -> list[AttemptUsage]:
    """One job (1 H100 spot at lambda, 1.5/h) preempted three times, saving at each signal.

    Lost work is tiny (0.0624 s in all), the restarts' start-up and restore are not. Attempt 4 also
    rolls back once (5 s redone, 1.2 s to reload): lost and restore, but not preemption overhead.
    """
    job = usage(spot=True, first_step=0)
    return [
        replace(job, attempt=1, start=0.0, end=100.0, outcome="preempted", startup_s=10.0, shutdown_s=2.0,
                checkpoint_s=1.5, preempt_save_s=1.0, lost_s=0.02),
        replace(job, attempt=2, start=110.0, end=200.0, outcome="requeued", after_preemption=True, startup_s=9.0,
                shutdown_s=1.5, restore_s=0.8, checkpoint_s=1.0, preempt_save_s=1.0, lost_s=0.03),
        replace(job, attempt=3, start=210.0, end=300.0, outcome="preempted", after_preemption=True, startup_s=8.5,
                shutdown_s=0.5, restore_s=0.7, checkpoint_s=0.9, preempt_save_s=0.9, lost_s=0.0124),
        replace(job, attempt=4, start=310.0, end=400.0, outcome="completed", after_preemption=True, startup_s=7.0,
                restore_s=0.5 + 1.2, rollback_restore_s=1.2, checkpoint_s=0.5, lost_s=5.0, rollback_lost_s=5.0),
    ]  # fmt: skip


# Worked by hand from the attempts above, in GPU-seconds.
OVERHEAD_LOST = 0.02 + 0.03 + 0.0124  # = 0.0624: all the headline used to show
OVERHEAD_STARTUP = 2.0 + 9.0 + 8.5 + 7.0  # attempt 1's shut-down, all of each restart's start-up
OVERHEAD_RESTORE = 0.8 + 0.7 + 0.5  # the restarts' restores, not the rollback's 1.2
OVERHEAD_SAVE = 1.0 + 1.0 + 0.9  # the saves at the signal, not the periodic or final ones
OVERHEAD = OVERHEAD_LOST + OVERHEAD_STARTUP + OVERHEAD_RESTORE + OVERHEAD_SAVE  # 31.4624
WALL = 100.0 + 90.0 + 90.0 + 90.0


def test_preemption_overhead_counts_restart_startup_restore_and_the_save_at_the_signal() -> None:
    ledger = build_ledger(preempted_three_times(), CARD)
    job = ledger.jobs[1]
    assert job.preemptions == 3
    assert job.gpu_hours["lost"] * 3600 == pytest.approx(OVERHEAD_LOST + 5.0)
    parts = {k: v * 3600 for k, v in job.preemption_gpu_hours.items()}
    assert parts == pytest.approx(
        {
            "lost": OVERHEAD_LOST,
            "startup": OVERHEAD_STARTUP,
            "restore": OVERHEAD_RESTORE,
            "checkpoint": OVERHEAD_SAVE,
            "staging": 0.0,
        }
    )
    assert job.preemption_overhead_gpu_hours * 3600 == pytest.approx(OVERHEAD) == pytest.approx(31.4624)
    assert job.preemption_share == pytest.approx(OVERHEAD / WALL)
    assert job.preemption_money == pytest.approx(OVERHEAD / 3600 * 1.5)

    d = job.to_dict()  # six significant digits, like every other value there
    assert d["preemption_overhead_gpu_seconds"] == 31.4624
    assert d["preemption_overhead_gpu_hours"] == pytest.approx(OVERHEAD / 3600, rel=1e-5)
    assert d["preemption_overhead_money"] == pytest.approx(OVERHEAD / 3600 * 1.5, rel=1e-5)
    assert d["preemption_overhead_share"] == pytest.approx(OVERHEAD / WALL, rel=1e-5)
    assert d["preemption_overhead_gpu_seconds_by_bucket"] == {"lost": 0.0624, "checkpoint": 2.9, "restore": 2.0,
                                                              "staging": 0.0, "startup": 26.5}  # fmt: skip
    assert d["lost_gpu_hours"] == pytest.approx((OVERHEAD_LOST + 5.0) / 3600, rel=1e-5)  # the old keys stay
    assert ledger.total.to_dict()["preemption_overhead_gpu_seconds"] == d["preemption_overhead_gpu_seconds"]


def test_preemption_overhead_uses_the_attempts_rate_and_gpus() -> None:
    # 2 GPUs at lambda on-demand (3.0/h) next to a 1-GPU spot job (1.5/h): each priced at its own rate.
    spot = usage(spot=True, outcome="preempted", start=0.0, end=3600.0, preempt_save_s=360.0, checkpoint_s=360.0)
    demand = usage(job_id=2, gpus=2, after_preemption=True, start=0.0, end=3600.0, startup_s=180.0)
    ledger = build_ledger([spot, demand], CARD)
    assert ledger.total.preemption_overhead_gpu_hours == pytest.approx(0.1 + 0.1)
    assert ledger.total.preemption_money == pytest.approx(0.1 * 1.5 + 0.1 * 3.0)


def test_no_preemption_no_overhead() -> None:
    plain = usage(start=0.0, end=100.0, startup_s=10.0, restore_s=2.0, checkpoint_s=3.0, lost_s=4.0)
    assert plain.preemption_seconds() == {
        "lost": 0.0,
        "checkpoint": 0.0,
        "restore": 0.0,
        "staging": 0.0,
        "startup": 0.0,
    }
    cost = attempt_cost(plain, CARD)
    assert cost.preemption_overhead_gpu_hours == 0.0 and cost.preemption_share == 0.0
    assert cost.to_dict()["preemption_overhead_money"] == 0.0


def test_preemption_overhead_never_exceeds_its_buckets_or_the_wall() -> None:
    # Parts claimed beyond their bucket are clamped; buckets beyond the wall are scaled like seconds().
    u = usage(start=0.0, end=10.0, outcome="preempted", after_preemption=True, startup_s=15.0, restore_s=5.0,
              checkpoint_s=1.0, preempt_save_s=3.0, lost_s=4.0, shutdown_s=99.0)  # fmt: skip
    parts = u.preemption_seconds()
    scale = 10.0 / (15.0 + 5.0 + 1.0 + 4.0)
    assert parts == pytest.approx({"startup": 15.0 * scale, "restore": 5.0 * scale, "checkpoint": 1.0 * scale,
                                   "lost": 4.0 * scale, "staging": 0.0})  # fmt: skip
    assert sum(parts.values()) == pytest.approx(u.wall_s)
