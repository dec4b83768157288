"""The rank agreement on its own: a group of one, and rank 0 of two with the other rank's numbers faked."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from gpufleet.runtime.components.agreement import PendingStep, RankAgreement, step_ends
from gpufleet.runtime.group import Group, Reduction


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class RankZeroOfTwo(Group):
    """Rank 0 of a group of two whose all-reduce adds the vector rank 1 would send."""

    other: tuple[float, ...] = ()
    other_name: str | None = None

    def agree(self, values: Sequence[float]) -> list[float]:
        return [a + b for a, b in zip(values, self.other, strict=True)]

    def agree_later(self, values: Sequence[float]) -> Reduction:
        return Reduction(self.rank, values=self.agree(values))

    def gather(self, value: Any) -> list[Any]:
        return [value, self.other_name]


def step(values: list[float], tokens: int = 10, seconds: float = 1.0) -> PendingStep:
    return PendingStep(values, tokens, len(values), {}, seconds)


def test_the_ranks_meet_every_few_steps_or_when_something_is_due() -> None:
    agreement = RankAgreement(Group(), every=3)
    assert not agreement.hold(step([1.0]), due=False)
    assert not agreement.hold(step([1.0]), due=False)
    assert agreement.hold(step([1.0]), due=False)
    assert len(agreement.take()) == 3 and agreement.pending == []
    assert agreement.hold(step([1.0]), due=True)


def test_a_group_of_one_agrees_with_itself() -> None:
    clock = Clock()
    agreement = RankAgreement(Group(), every=2, clock=clock)
    pending = [step([2.0, 4.0], tokens=5, seconds=1.5), step([3.0], tokens=7, seconds=0.5)]
    agreed = agreement.agree(pending, now=clock.now + 2.0, preempt=True, seconds_due=False)
    assert [s.losses for s in agreed.steps] == [[2.0, 4.0], [3.0]]
    assert [s.tokens for s in agreed.steps] == [5, 7]
    assert [s.ended for s in agreed.steps] == [101.5, 102.0]  # each step's own end, the last one now
    assert agreed.preempt and not agreed.seconds_due
    assert agreed.rank_step_s == (1.0,) and agreed.rank_wait_s == (0.0,)  # 2 s over 2 steps; no wait yet
    assert agreement.mean(3.0) == 3.0 and agreement.first("model.w") == "model.w"


def test_the_other_ranks_nan_and_signal_reach_every_rank() -> None:
    # rank 1: its losses, its tokens, its preempt and seconds_due flags, its timing slots (1) of 2 + 2.
    group = RankZeroOfTwo(rank=0, world_size=2, other=(math.nan, 1.0, 6.0, 1.0, 1.0, 0.0, 0.25, 0.0, 0.1))
    agreement = RankAgreement(group, every=4, clock=Clock())
    agreed = agreement.agree([step([2.0, 3.0], tokens=4)], now=101.0, preempt=False, seconds_due=False)
    (judged,) = agreed.steps
    assert math.isnan(judged.losses[0]) and judged.losses[1] == pytest.approx(2.0)  # means over the two ranks
    assert judged.tokens == 10 and agreed.preempt and agreed.seconds_due
    assert agreed.rank_step_s == (1.0, 0.25) and agreed.rank_wait_s == (0.0, 0.1)


def test_a_finding_on_another_ranks_shard_is_every_ranks() -> None:
    group = RankZeroOfTwo(rank=0, world_size=2, other_name="optimizer.state.0.exp_avg")
    assert RankAgreement(group).first(None) == "optimizer.state.0.exp_avg"


def test_step_ends_count_back_from_now() -> None:
    assert step_ends([step([1.0], seconds=2.0), step([1.0], seconds=3.0)], now=10.0) == [7.0, 10.0]


def test_an_agreement_sent_now_is_read_at_the_next_boundary_with_the_same_verdict() -> None:
    group = RankZeroOfTwo(rank=0, world_size=2, other=(math.nan, 1.0, 6.0, 1.0, 1.0, 0.0, 0.25, 0.0, 0.1))
    waited = RankAgreement(group, every=1, clock=Clock()).agree(
        [step([2.0, 3.0], tokens=4)], now=101.0, preempt=False, seconds_due=False
    )
    agreement = RankAgreement(group, every=1, clock=Clock())
    assert agreement.receive() is None  # nothing in flight
    agreement.send([step([2.0, 3.0], tokens=4)], now=101.0, preempt=False, seconds_due=False)
    assert agreement.in_flight
    with pytest.raises(RuntimeError, match="in flight"):  # one at a time: the ranks' collectives stay in order
        agreement.send([step([1.0])], now=102.0, preempt=False, seconds_due=False)
    received = agreement.receive()
    assert received is not None and not agreement.in_flight
    pending, agreed = received
    assert [p.values for p in pending] == [[2.0, 3.0]]
    assert math.isnan(agreed.steps[0].losses[0]) and agreed.steps[0].losses[1] == pytest.approx(2.0)
    assert (agreed.preempt, agreed.seconds_due, agreed.rank_step_s) == (
        waited.preempt,
        waited.seconds_due,
        waited.rank_step_s,
    )


def test_a_session_ending_on_an_error_drops_the_agreement_in_flight_unread() -> None:
    agreement = RankAgreement(Group(), every=1, clock=Clock())
    agreement.send([step([1.0])], now=101.0, preempt=False, seconds_due=False)
    agreement.close()
    assert not agreement.in_flight and agreement.receive() is None
