"""Per-rank phase times, the straggler detector and the hang threshold, each on its own.

The end-to-end runs (real ranks, a slow rank, a frozen rank) are in ``test_phases_e2e.py``; here a
clock is driven by hand, so every second of a step is accounted for exactly.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from test_component_agreement import RankZeroOfTwo, step

from gpufleet.runtime.board import PhaseBoard, board_path
from gpufleet.runtime.components.agreement import RankAgreement
from gpufleet.runtime.components.phases import (
    CHECKPOINT,
    PHASES,
    TRAIN,
    PhaseClock,
    straggler_waits,
)
from gpufleet.runtime.components.stragglers import StragglerDetector, Window
from gpufleet.runtime.session import TrainSession
from gpufleet.runtime.watchdog import RankInfo, RankWatch, hang_seconds


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def phases_of(clock: PhaseClock) -> dict[str, float]:
    values, _ = clock.take()
    return {**dict(zip(PHASES, values[: len(PHASES)], strict=True)), "train": values[TRAIN]}


def test_every_second_of_a_step_falls_in_one_phase() -> None:
    t = Clock()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    clock = PhaseClock(clock=t, work_clock=t)
    clock.attach(model, opt)
    clock.restart()
    t.now = 5.0  # the batch arrives
    out = model(torch.ones(3, 4))
    t.now = 8.0  # the last gradient is ready at 8 ...
    original = clock._backward_end

    def later() -> None:
        t.now = 10.0  # ... and the backward (its collectives) ends at 10
        original()

    clock._backward_end = later  # type: ignore[method-assign]
    out.sum().backward()
    t.now = 11.0
    opt.step()  # pre-hook at 11 (clipping etc. since 10: compute), post-hook at 11: no optimizer time
    t.now = 12.0
    clock.end_step()
    clock.add(CHECKPOINT, 0.5)
    t.now = 13.0
    clock.begin_step()
    got = phases_of(clock)
    train = got.pop("train")
    compute = 3.0 + 1.0 + 1.0 + 0.5  # forward to the last gradient, clipping, after the optimizer, the boundary
    assert got == {"data_wait": 5.0, "compute": compute, "collective": 2.0, "optimizer": 0.0, "checkpoint": 0.5}
    assert sum(got.values()) == 13.0  # the wall from the start to the next step
    # The training forward and backward only, what ranks are compared on: on the host the work clock (the
    # thread's CPU time) runs to the backward's end, where a real thread waiting for the others spends none.
    assert train == 5.0


def test_gradient_accumulation_counts_the_next_micro_batch_as_data_wait() -> None:
    t = Clock()
    model = torch.nn.Linear(4, 2)
    clock = PhaseClock(clock=t, work_clock=t)
    clock.attach(model, None)
    clock.restart()
    for _ in range(2):
        t.now += 1.0  # fetch a micro-batch
        out = model(torch.ones(1, 4))
        t.now += 2.0
        out.sum().backward()
    clock.end_step()
    got = phases_of(clock)
    assert got["data_wait"] == 2.0 and got["compute"] == 4.0 and got["collective"] == 0.0 and got["train"] == 4.0


def test_an_evaluation_is_compute_but_not_what_ranks_are_compared_on() -> None:
    t = Clock()
    model = torch.nn.Linear(4, 2)
    clock = PhaseClock(clock=t, work_clock=t)
    clock.attach(model, None)
    clock.restart()
    t.now = 1.0
    out = model(torch.ones(1, 4))
    t.now = 3.0
    out.sum().backward()
    with torch.no_grad():
        model(torch.ones(1, 4))
        t.now = 10.0  # a long evaluation after the backward
    clock.end_step()
    got = phases_of(clock)
    assert got["compute"] == 2.0 + 7.0 and got["train"] == 2.0 and got["data_wait"] == 1.0


def test_a_session_without_phase_timing_leaves_the_model_unhooked(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session = TrainSession(ckpt_dir=tmp_path, model=model, optimizer=opt, total_steps=1, phase_timing=False)
    assert session._phases is None and not model._forward_pre_hooks
    hooked = TrainSession(ckpt_dir=tmp_path / "b", model=model, optimizer=opt, total_steps=1)
    assert hooked._phases is not None and model._forward_pre_hooks


def test_straggler_wait_is_collective_beyond_the_least() -> None:
    assert straggler_waits([0.5, 0.1, 0.3]) == pytest.approx([0.4, 0.0, 0.2])
    assert straggler_waits([]) == []


def test_the_phases_ride_the_agreement_vector() -> None:
    other = [0.0] * 4 + [0.0] * 4 + [0.0] * 5 + [1.0, 2.0, 3.0, 4.0, 5.0]  # losses, flags, times, phases
    agreement = RankAgreement(RankZeroOfTwo(rank=0, world_size=2, other=tuple(other)), every=1)
    agreed = agreement.agree([step([1.0])], 1.0, preempt=False, seconds_due=False, phases=[0.1, 0.2, 0.3, 0.4, 0.5])
    assert agreed.rank_phases == ((0.1, 0.2, 0.3, 0.4, 0.5), (1.0, 2.0, 3.0, 4.0, 5.0))


def window(first: int, last: int, compute: Sequence[float], data: Sequence[float] = (0.01, 0.01)) -> Window:
    """Per-step seconds times the window's steps; rank 0 waits for rank 1's extra compute."""
    n = last - first + 1
    extra = [max(compute) - c for c in compute]
    rows = tuple((d * n, c * n, (0.01 + e) * n, 0.001 * n, 0.0) for c, d, e in zip(compute, data, extra, strict=True))
    return Window(first, last, rows, tuple(e * n for e in extra))


def test_a_slow_rank_is_named_within_a_few_windows_with_its_tax_then_ended() -> None:
    detector = StragglerDetector(factor=1.5)
    named = []
    for k in range(20):
        first = 4 * k + 1
        slow = first >= 29
        named += detector.observe(window(first, first + 3, [0.10, 0.40 if slow else 0.10]))
    assert len(named) == 1
    s = named[0]
    assert (s.rank, s.phase, s.first_step, s.open) == (1, "compute", 29, True) and s.last_step - 29 <= 20
    assert s.tax_s == pytest.approx(0.30 * (s.last_step - 28))  # rank 0 waited 0.3 s a step since step 29
    ended = [e for k in range(5) for e in detector.observe(window(81 + 4 * k, 84 + 4 * k, [0.10, 0.10]))]
    assert [e.open for e in ended] == [False] and ended[0].tax_s == pytest.approx(0.30 * 52)


def test_noise_and_an_immaterial_data_wait_name_nobody() -> None:
    detector = StragglerDetector(factor=1.5)
    found = []
    for k in range(30):
        noisy = [0.10, 0.17 if k % 3 == 0 else 0.10]  # one slow window in three: never two in a row
        found += detector.observe(window(4 * k + 1, 4 * k + 4, noisy, data=(0.0001, 0.0004)))
    assert found == []


def test_a_slow_data_loader_is_named_in_data_wait() -> None:
    detector = StragglerDetector(factor=1.5)
    found = []
    for k in range(6):
        found += detector.observe(window(4 * k + 1, 4 * k + 4, [0.1, 0.1], data=(0.03, 0.09)))
    assert [(s.rank, s.phase) for s in found] == [(1, "data_wait")] and found[0].factor == pytest.approx(3.0)


def test_the_hang_threshold_follows_the_step_time() -> None:
    assert hang_seconds(None, factor=10, floor_s=30, timeout_s=300, stall_s=60) == 60
    assert hang_seconds(0.05, factor=10, floor_s=30, timeout_s=300, stall_s=60) == 30
    assert hang_seconds(12.0, factor=10, floor_s=30, timeout_s=300, stall_s=60) == 120
    assert hang_seconds(100.0, factor=10, floor_s=30, timeout_s=300, stall_s=60) == 225  # named before the timeout


def test_a_frozen_rank_on_this_host_is_named_in_its_phase_and_killed(tmp_path: Path) -> None:
    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        board = PhaseBoard(board_path(tmp_path, 1))
        board.phase(2)  # after the backward
        events: list[dict[str, Any]] = []
        host = socket.gethostname()
        watch = RankWatch(
            rank=0,
            ranks=[RankInfo(0, host, os.getpid()), RankInfo(1, host, frozen.pid)],
            folder=tmp_path,
            stall_s=60.0,
            timeout_s=300.0,
            emit=lambda kind, **data: events.append({"kind": kind, **data}),
            poll_s=0.2,
            hang_floor_s=1.0,
        )
        for s in range(4):  # three timed steps: the threshold is the floor (the steps are fast)
            watch.progress(s)
        assert watch.threshold_s == 1.0
        import gpufleet.runtime.watchdog as wd

        original = wd.where
        wd.where = lambda frame: (True, "distributed_c10d.py:1 in all_reduce")
        try:
            start = time.monotonic()
            for k in range(1, 40):
                watch.check(start + 0.5 + 0.2 * k)
                if events:
                    break
                time.sleep(0.2)  # the CPU time of the frozen rank is compared between two real polls
        finally:
            wd.where = original
        assert [e["kind"] for e in events] == ["rank_stalled"]
        event = events[0]
        assert event["ranks"] == [1] and event["phases"] == {"1": "compute"} and event["action"] == "killed"
        assert frozen.wait(timeout=30) == -signal.SIGKILL
        board.close()
    finally:
        if frozen.poll() is None:
            frozen.kill()
            frozen.wait()


def test_the_phases_are_exported_per_rank_host_and_phase() -> None:
    from prometheus_client import generate_latest

    from gpufleet.telemetry.metrics import JobMetrics

    metrics = JobMetrics({"job_id": "7", "attempt": "1"})
    metrics({"kind": "group", "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "b"}]})
    metrics({"kind": "step", "step": 4, "rank_phase_s": {"compute": [0.1, 0.4], "data_wait": ["x", None]}})
    text = generate_latest(metrics.registry).decode()
    assert "gpufleet_rank_phase_seconds{" in text
    line = next(x for x in text.splitlines() if x.startswith("gpufleet_rank_phase_seconds{") and 'rank="1"' in x)
    assert 'host="b"' in line and 'phase="compute"' in line and line.endswith(" 0.4")
    assert 'phase="data_wait"' not in text  # malformed values are skipped
