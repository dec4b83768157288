"""The reporter on its own: step events over a window, MFU, rank timings, session_end, the price."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import UsageError
from gpufleet.jobs.events import EventLog, read_events
from gpufleet.runtime.components.agreement import AgreedStep, Agreement
from gpufleet.runtime.components.announce import Announcer
from gpufleet.runtime.components.guard import Preempted
from gpufleet.runtime.components.reporter import Reporter, price_from_env
from gpufleet.runtime.group import Group


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def reporter(
    tmp_path: Path, log_every_s: float = 1.0, flops_per_token: float | None = None, peak_flops: float | None = None
) -> tuple[Reporter, EventLog]:
    events = EventLog(tmp_path / "events.jsonl")
    voice = Announcer(events, echo=False)
    return Reporter(voice, Group(), log_every_s, flops_per_token, peak_flops, clock=Clock()), events


def logged(path: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(path)[0] if e["kind"] == kind]


def test_a_step_event_per_window_with_the_windows_throughput_and_mfu(tmp_path: Path) -> None:
    report, events = reporter(tmp_path, log_every_s=10.0, flops_per_token=6.0, peak_flops=1200.0)
    report.restart()  # the window opens at 50
    assert report.step(1, 2.0, 100, 1, 1.0, 60.0, {}, last=False)  # the first event: 0 -> 60 is past 10 s
    assert not report.step(2, 1.9, 100, 2, 1.0, 65.0, {}, last=False)
    assert report.step(3, 1.8, 300, 3, 1.0, 70.0, {"lr": 0.1}, last=False)
    assert report.step(4, 1.7, 50, 4, 1.0, 71.0, {}, last=True)  # the last step always reports
    events.close()
    first, second, last = logged(tmp_path / "events.jsonl", "step")
    assert first["tokens_per_s"] == pytest.approx(10.0) and first["mfu"] == pytest.approx(10.0 * 6.0 / 1200.0)
    assert second["step"] == 3 and second["tokens_per_s"] == pytest.approx(40.0) and second["lr"] == 0.1
    assert last["tokens_per_s"] == pytest.approx(50.0)


def test_rank_zero_adds_every_ranks_timings_to_the_next_step_event(tmp_path: Path) -> None:
    report, events = reporter(tmp_path, log_every_s=0.0)
    agreed = Agreement((AgreedStep([1.0], 1, 0.0),), False, False, (1.0, 3.0), (0.5, 0.0))
    report.note_ranks(agreed)
    report.note_ranks(agreed)
    report.step(1, 1.0, 0, 1, 1.0, 60.0, {}, last=False)
    report.step(2, 1.0, 0, 2, 1.0, 61.0, {}, last=False)
    events.close()
    with_ranks, without = logged(tmp_path / "events.jsonl", "step")
    assert with_ranks["rank_step_s"] == [1.0, 3.0] and with_ranks["rank_wait_s"] == [0.5, 0.0]
    assert "rank_step_s" not in without


@pytest.mark.parametrize(
    ("exc", "preempted", "status"),
    [(None, False, "completed"), (Preempted(3), True, "requeue"), (RuntimeError("boom"), False, "failed")],
)
def test_session_end_says_how_the_attempt_ended_and_closes_the_log(
    tmp_path: Path, exc: BaseException | None, preempted: bool, status: str
) -> None:
    report, events = reporter(tmp_path)
    assert report.end(exc, 3, preempted=preempted) == status
    assert events._fh is None
    (end,) = logged(tmp_path / "events.jsonl", "session_end")
    assert end["status"] == status and end["step"] == 3


def test_the_price_comes_from_the_attempts_environment() -> None:
    assert price_from_env({}) == (None, "USD")
    assert price_from_env({"GPUFLEET_PRICE_PER_GPU_HOUR": " 2.5 ", "GPUFLEET_CURRENCY": "EUR"}) == (2.5, "EUR")
    assert price_from_env({"GPUFLEET_PRICE_PER_GPU_HOUR": "0"}) == (0.0, "USD")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"GPUFLEET_PRICE_PER_GPU_HOUR": "two"}, "GPUFLEET_PRICE_PER_GPU_HOUR='two'"),
        ({"GPUFLEET_PRICE_PER_GPU_HOUR": "-1"}, "GPUFLEET_PRICE_PER_GPU_HOUR='-1'"),
        ({"GPUFLEET_PRICE_PER_GPU_HOUR": "inf"}, "GPUFLEET_PRICE_PER_GPU_HOUR='inf'"),
        ({"GPUFLEET_PRICE_PER_GPU_HOUR": "1", "GPUFLEET_CURRENCY": "US D"}, "GPUFLEET_CURRENCY='US D'"),
    ],
)
def test_a_malformed_price_is_one_line_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(UsageError) as caught:
        price_from_env(env)
    assert str(caught.value).startswith(named) and "\n" not in str(caught.value)
