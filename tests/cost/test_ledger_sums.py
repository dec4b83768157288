"""The ledger's fast paths give the very floats of the plain expressions they stand for (signed zeros included):
a cached row and a report computed from scratch must agree to the bit."""

from __future__ import annotations

import math
import random

from gpufleet.cost import ledger
from gpufleet.cost.ledger import BUCKETS, GOODPUT_BUCKETS, PREEMPTION_BUCKETS, Cost, NoticeLead
from gpufleet.cost.usage import _num
from gpufleet.jobs.events import MAX_TS


def _random_cost(rng: random.Random) -> Cost:
    def v() -> float:
        return rng.choice([0.0, -0.0, rng.random() * 10, rng.random() * 1e-9, rng.random() * 1e12])

    return Cost(
        gpu_hours={k: v() for k in BUCKETS},
        preemption_gpu_hours={k: v() for k in PREEMPTION_BUCKETS},
        preemption_money=v(),
        money=v(),
        on_demand_money=v(),
        attempts=rng.randrange(3),
        preemptions=rng.randrange(2),
        killed=rng.randrange(2),
        steps_redone=rng.randrange(5),
        unpriced=tuple(sorted(rng.sample(["a/x/spot", "b/y/on-demand", "c/z/spot"], rng.randrange(3)))),
        egress_money=v(),
        egress_bytes=rng.randrange(9),
        notices=tuple(NoticeLead(1, i, "aws", v(), v()) for i in range(rng.randrange(3))),
        short_handed_steps=rng.randrange(3),
        samples_skipped=rng.randrange(3),
        goodput_gpu_seconds={k: v() for k in GOODPUT_BUCKETS},
    )


def test_a_job_total_is_the_chained_sum_of_its_attempts() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        costs = [_random_cost(rng) for _ in range(rng.randrange(0, 5))]
        chained = Cost()
        for cost in costs:
            chained = chained + cost
        assert repr(ledger._total(costs)) == repr(chained)


def test_seconds_and_numbers_are_the_clamped_finite_values() -> None:
    for value in (0.0, -0.0, 2.5, -1.0, math.inf, -math.inf, math.nan, 1e300, MAX_TS, 5e-324, 7):
        expected = 0.0 if math.isnan(value) else min(max(value, 0.0), MAX_TS)
        assert repr(ledger._seconds(value)) == repr(expected), value

    class Sub(float):
        pass

    for raw, expected in (
        (1.5, 1.5),
        (-0.0, -0.0),
        (math.inf, -1.0),
        (math.nan, -1.0),
        (3, 3.0),
        (10**400, -1.0),
        (True, -1.0),
        ("1", -1.0),
        (None, -1.0),
        (Sub(2.0), 2.0),
        (Sub("nan"), -1.0),
    ):
        assert repr(_num({"k": raw}, "k", -1.0)) == repr(expected), raw
