"""Goodput in twelve buckets: every billed GPU-second of an attempt in exactly one, from hand-made events."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import attempt_events

from gpufleet.cost.ledger import GOODPUT_BUCKETS, AttemptUsage, Cost, PhaseShares, attempt_cost, build_ledger
from gpufleet.cost.rates import Rate, RateCard
from gpufleet.cost.usage import job_usages, phase_shares
from gpufleet.jobs.store import Attempt, Outcome, Store
from gpufleet.spec import parse_spec

SPEC = parse_spec({"name": "lm", "team": "nlp", "entrypoint": "gpufleet.workloads.toy:train"})
CARD = RateCard(currency="USD", rates=[Rate(gpu_type="H100", provider="*", on_demand=3.6)])
ZERO = dict.fromkeys(GOODPUT_BUCKETS, 0.0)
TWO_RANKS = {  # rank 1 computes 10 s longer: rank 0 waits 10 s of its collectives for it
    "data_wait": [2.0, 2.0],
    "compute": [50.0, 60.0],
    "collective": [15.0, 5.0],
    "optimizer": [3.0, 3.0],
    "checkpoint": [0.4, 0.4],
    "straggler_wait": [10.0, 0.0],
}


def store_job(tmp_path: Path, backend: str = "local") -> tuple[Store, int]:
    store = Store(tmp_path / "state.db")
    return store, store.add_job(SPEC, backend)


def add_attempt(store: Store, job: int, n: int, start: float, end: float, outcome: str, events: list[Any]) -> None:
    store.upsert_attempt(Attempt(job, n, "ended", None, start, end, 0, Outcome(outcome), None, None))
    store.add_runtime_events(job, [{**e, "attempt": n} for e in events], offset=n)


def billed(store: Store, job: int) -> tuple[list[AttemptUsage], Cost]:
    usages = job_usages(store, store.job(job), now=1e6)
    for u in usages:  # each attempt's buckets are its wall, to the microsecond
        assert math.fsum(u.goodput_seconds().values()) == pytest.approx(u.wall_s, abs=1e-6)
        assert min(u.goodput_seconds().values()) >= 0.0
    cost = build_ledger(usages, CARD).jobs[job]
    assert_adds_up(cost)
    return usages, cost


def assert_adds_up(cost: Cost) -> None:
    """The buckets are the billed GPU time; printed, they add up to the printed total."""
    assert cost.gpu_seconds == pytest.approx(cost.total_gpu_hours * 3600.0, abs=1e-6)
    data = cost.to_dict()
    buckets = data["buckets"]
    assert isinstance(buckets, dict) and list(buckets) == list(GOODPUT_BUCKETS)
    assert math.fsum(buckets.values()) == pytest.approx(data["gpu_seconds"], abs=1e-6)


def test_preempted_then_completed_with_a_two_rank_straggler(tmp_path: Path) -> None:
    store, job = store_job(tmp_path)
    add_attempt(store, job, 1, 1000.0, 1063.0, "preempted", attempt_events(1, 1000.0, "preempted"))
    last = attempt_events(2, 2000.0, "completed")
    last[-1]["phase_totals_s"] = TWO_RANKS
    add_attempt(store, job, 2, 2000.0, 2091.0, "completed", last)
    store.add_event(job, "attempt_start", attempt=2, ts=2000.0, gpus=2, world_size=2)
    (first, second), cost = billed(store, job)

    # Attempt 1: 8 s to the first step, 0.4 + 0.7 s of saves, 0.02 s after the save at the signal
    # lost, the 2.97 s exit after the session ended idle; the rest compute (no phase totals).
    assert first.goodput_seconds() == pytest.approx(
        {**ZERO, "startup": 8.0, "checkpoint": 1.1, "lost": 0.02, "idle": 2.97, "compute": 50.91}
    )
    # Attempt 2 on 2 GPUs: 7.5 s start-up, 0.5 s restore, 0.4 s save, 1 s exit after the session's end;
    # T = 81.6 s split by the ranks' phase totals: S = 4 + 110 + 20 + 6 = 140.
    training = 91.0 - 7.5 - 0.5 - 0.4 - 1.0
    expected = {
        **ZERO,
        "startup": 7.5,
        "restore": 0.5,
        "checkpoint": 0.4,
        "idle": 1.0,
        "data_wait": training * 4 / 140,
        "straggler_wait": training * 10 / 140,
        "compute": training * 126 / 140,
    }
    assert second.goodput_seconds() == pytest.approx(expected)
    assert cost.goodput_gpu_seconds["straggler_wait"] == pytest.approx(2 * training * 10 / 140)
    assert cost.goodput_gpu_seconds["compute"] == pytest.approx(50.91 + 2 * training * 126 / 140)
    # The older buckets are as they were: the idle tail of a finished attempt is still useful there.
    assert second.seconds()["useful"] == pytest.approx(91.0 - 7.5 - 0.5 - 0.4)
    assert cost.goodput == pytest.approx(cost.goodput_gpu_seconds["compute"] / (63.0 + 2 * 91.0))


def test_rolled_back(tmp_path: Path) -> None:
    store, job = store_job(tmp_path)
    events = [
        {"ts": 1.0, "kind": "session_start"},
        {"ts": 5.0, "kind": "train_start", "step": 0},
        {
            "ts": 50.0,
            "kind": "rollback",
            "from_step": 40,
            "to_step": 30,
            "redone_seconds": 12.0,
            "restore_seconds": 1.5,
        },
        {"ts": 99.0, "kind": "session_end", "status": "completed", "step": 100},
    ]
    add_attempt(store, job, 1, 0.0, 100.0, "completed", events)
    (u,), _ = billed(store, job)
    assert u.goodput_seconds() == pytest.approx(
        {**ZERO, "startup": 5.0, "rollback": 13.5, "idle": 1.0, "compute": 80.5}
    )


@pytest.mark.parametrize(
    "signal",
    ["backend_world_size", "run_changed", "rng_reseeded", "restore_fields", "none"],
)
def test_resized_restore_goes_to_resize(tmp_path: Path, signal: str) -> None:
    """The restore after ``gpufleet resize`` resharded the checkpoint: ``resize``, not ``restore``."""
    store, job = store_job(tmp_path)
    add_attempt(store, job, 1, 0.0, 63.0, "preempted", attempt_events(1, 0.0, "preempted"))
    second = attempt_events(2, 100.0, "completed")
    restore = second[1]
    restore["seconds"] = 2.0
    if signal == "run_changed":
        second.insert(2, {"ts": 107.0, "kind": "run_changed", "step": 10, "old_world_size": 2, "world_size": 4})
    elif signal == "rng_reseeded":
        second.insert(1, {"ts": 105.9, "kind": "rng_reseeded", "step": 10, "world_size": 4})
    elif signal == "restore_fields":
        restore.update(old_world_size=2, world_size=4)
    add_attempt(store, job, 2, 100.0, 191.0, "completed", second)
    store.add_event(job, "attempt_start", attempt=1, ts=0.0, gpus=2, world_size=2)
    resized = 4 if signal == "backend_world_size" else 2
    store.add_event(job, "attempt_start", attempt=2, ts=100.0, gpus=resized, world_size=resized)
    (_, u), _ = billed(store, job)
    buckets = u.goodput_seconds()
    moved = signal != "none"
    assert (buckets["resize"], buckets["restore"]) == pytest.approx((2.0, 0.0) if moved else (0.0, 2.0))
    assert buckets["startup"] == pytest.approx(6.0)


def test_slurm_allocation_before_the_batch_script_ran_is_queued(tmp_path: Path) -> None:
    """sacct's Start precedes the batch script's own ``attempt_start``: that gap is queued, not start-up."""
    store, job = store_job(tmp_path, "slurm")
    events = [
        {"ts": 103.0, "kind": "attempt_start", "gpus": 1, "world_size": 1},
        *attempt_events(1, 100.0, "completed"),
    ]
    add_attempt(store, job, 1, 100.0, 191.0, "completed", events)
    (u,), _ = billed(store, job)
    buckets = u.goodput_seconds()
    assert (buckets["queued"], buckets["startup"]) == pytest.approx((3.0, 5.0))
    assert u.seconds()["startup"] == pytest.approx(8.0)  # the older bucket still holds both


def test_killed_without_a_session_end_loses_the_work_after_its_checkpoint(tmp_path: Path) -> None:
    store, job = store_job(tmp_path)
    events = [
        {"ts": 4.0, "kind": "train_start", "step": 0},
        {"ts": 30.0, "kind": "checkpoint", "step": 10, "seconds": 1.0, "reason": "periodic"},
        {"ts": 45.0, "kind": "step", "step": 15},
    ]
    add_attempt(store, job, 1, 0.0, 50.0, "requeued", events)
    (u,), _ = billed(store, job)
    assert u.goodput_seconds() == pytest.approx(
        {**ZERO, "startup": 4.0, "checkpoint": 1.0, "lost": 20.0, "compute": 25.0}
    )


def test_never_reached_a_step_is_start_up_then_idle(tmp_path: Path) -> None:
    store, job = store_job(tmp_path)
    events = [
        {"ts": 2.0, "kind": "nothing_to_train", "step": 100},
        {"ts": 7.0, "kind": "session_end", "status": "completed"},
    ]
    add_attempt(store, job, 1, 0.0, 10.0, "completed", events)
    (u,), _ = billed(store, job)
    assert u.goodput_seconds() == pytest.approx({**ZERO, "startup": 7.0, "idle": 3.0})
    assert u.seconds()["startup"] == pytest.approx(10.0)


def test_hand_built_usage_and_measured_overheads_beyond_the_wall() -> None:
    base = AttemptUsage(job_id=1, job_name="j", team="t", attempt=1, gpu_type="H100", provider="aws", spot=False,
                        gpus=8, start=0.0, end=100.0, outcome="preempted")  # fmt: skip
    u = replace(base, startup_s=30.0, shutdown_s=5.0, restore_s=10.0, rollback_restore_s=4.0, lost_s=9.0,
                rollback_lost_s=6.0, first_step=0, phases=PhaseShares(10.0, 30.0, 100.0))  # fmt: skip
    training = 100.0 - 25.0 - 5.0 - 6.0 - 3.0 - 10.0
    assert u.goodput_seconds() == pytest.approx(
        {**ZERO, "startup": 25.0, "idle": 5.0, "restore": 6.0, "lost": 3.0, "rollback": 10.0,
         "data_wait": training * 0.1, "straggler_wait": training * 0.3, "compute": training * 0.6}
    )  # fmt: skip
    over = replace(base, startup_s=150.0, checkpoint_s=50.0, idle_s=20.0, first_step=0)
    buckets = over.goodput_seconds()
    assert math.fsum(buckets.values()) == pytest.approx(100.0) and buckets["compute"] == pytest.approx(0.0, abs=1e-9)
    assert buckets["startup"] == pytest.approx(150.0 * 100 / 220) and buckets["idle"] == pytest.approx(20 * 100 / 220)
    cost = attempt_cost(u, CARD)
    assert_adds_up(cost)
    top: Any = cost.to_dict()["badput_top"]
    assert [t["bucket"] for t in top] == ["startup", "straggler_wait", "rollback"]
    assert top[0]["gpu_seconds"] == pytest.approx(200.0) and top[0]["money"] == pytest.approx(0.2)


def test_buckets_add_up_when_rounded_and_summed_over_attempts() -> None:
    base = AttemptUsage(job_id=1, job_name="j", team="t", attempt=1, gpu_type="H100", provider="aws", spot=False,
                        gpus=3, start=0.1234567891, end=7.7654321987, outcome="completed", startup_s=1.0000004,
                        checkpoint_s=0.3333333, idle_s=0.7777777, phases=PhaseShares(1 / 3, 1 / 7, 3.0))  # fmt: skip
    total = Cost()
    for n in range(7):
        total = total + attempt_cost(replace(base, attempt=n, start=base.start + n / 3), CARD)
        assert_adds_up(total)
    assert Cost().to_dict()["goodput"] is None and Cost().to_dict()["gpu_seconds"] == 0.0


HUGE = [1.0] * (1024 * 1024 + 1)


@pytest.mark.parametrize(
    "totals",
    [
        "not a dict",
        {**TWO_RANKS, "compute": ["50", "60"]},
        {**TWO_RANKS, "compute": [float("nan"), 60.0]},
        {**TWO_RANKS, "data_wait": [float("inf"), 1.0]},
        {**TWO_RANKS, "optimizer": [-3.0, 3.0]},
        {**TWO_RANKS, "straggler_wait": [10.0]},
        {**TWO_RANKS, "collective": []},
        {**TWO_RANKS, "collective": 20.0},
        {**TWO_RANKS, "data_wait": [True, False]},
        {**TWO_RANKS, "data_wait": [10**400, 1]},
        {k: v for k, v in TWO_RANKS.items() if k != "straggler_wait"},
        {k: HUGE for k in TWO_RANKS},
    ],
    ids=[
        "str",
        "strings",
        "nan",
        "inf",
        "negative",
        "short",
        "empty",
        "scalar",
        "bools",
        "overflow",
        "missing",
        "huge",
    ],
)
def test_malformed_phase_totals_are_ignored(totals: Any) -> None:
    assert phase_shares({"phase_totals_s": totals}) is None
    assert phase_shares({"phase_totals_s": TWO_RANKS}, ranks=3) is None  # one per rank of the attempt
    assert phase_shares({"phase_totals_s": TWO_RANKS}, ranks=2) == PhaseShares(4.0, 10.0, 140.0)


def test_malformed_phase_totals_in_the_event_log_fall_back(tmp_path: Path) -> None:
    """A malformed last report is skipped for the last good one; none good: all training time is compute."""
    store, job = store_job(tmp_path)
    good = {"ts": 50.0, "kind": "step", "step": 50, "phase_totals_s": TWO_RANKS}
    bad: list[dict[str, Any]] = [
        {"ts": 60.0, "kind": "step", "step": 60, "phase_totals_s": {**TWO_RANKS, "compute": ["a", "b"]}},
        {"ts": 70.0, "kind": "step", "step": 70, "phase_totals_s": {**TWO_RANKS, "optimizer": [-1.0, 2.0]}},
        {"ts": 80.0, "kind": "step", "step": 80, "phase_totals_s": [1, 2, 3]},
    ]
    start: list[dict[str, Any]] = [{"ts": 10.0, "kind": "train_start", "step": 0}]
    end: list[dict[str, Any]] = [
        {"ts": 90.0, "kind": "session_end", "status": "completed", "step": 90, "phase_totals_s": "oops"}
    ]
    add_attempt(store, job, 1, 0.0, 100.0, "completed", [*start, good, *bad, *end])
    add_attempt(store, job, 2, 200.0, 300.0, "completed", [{**e, "ts": e["ts"] + 200} for e in [*start, *bad, *end]])
    (fell_back, none_good), _ = billed(store, job)
    assert fell_back.goodput_seconds()["straggler_wait"] == pytest.approx(80.0 * 10 / 140)
    assert none_good.goodput_seconds() == pytest.approx({**ZERO, "startup": 10.0, "idle": 10.0, "compute": 80.0})
