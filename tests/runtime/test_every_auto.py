"""``checkpoint: {every: auto}``: Daly's interval from the run's own saves, re-estimated as they change."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_bitwise_equal

from gpufleet.errors import SpecError
from gpufleet.estimate.goodput import daly_interval
from gpufleet.jobs.events import EventKind, read_events
from gpufleet.placement.advisor import PreemptionRate
from gpufleet.runtime import CheckpointDir, EventLog, Preempted, TrainSession
from gpufleet.runtime.interval import (
    ENV_PREEMPTIONS,
    FALLBACK_SECONDS,
    FIRST_SAVE_SHARE,
    MAX_SECONDS,
    SAVE_WINDOW,
    AutoInterval,
    rate_from,
)
from gpufleet.spec import CheckpointPolicy, parse_spec
from gpufleet.workloads import tinylm
from gpufleet.workloads.tinylm import TINY

AUTO = CheckpointPolicy(every="auto", preemptions_per_hour=3600.0)
"""One preemption a second: an MTBF of 1 s makes the intervals a test can watch."""


# ---- the spec ------------------------------------------------------------------------------------------------


def test_every_auto_replaces_the_default_step_trigger_and_old_specs_are_unchanged() -> None:
    auto = parse_spec({"name": "a", "entrypoint": "m:f", "checkpoint": {"every": "auto"}}).checkpoint
    assert (auto.every, auto.every_steps, auto.every_seconds) == ("auto", None, None)
    both = CheckpointPolicy.model_validate({"every": "auto", "every_steps": 100})
    assert (both.every, both.every_steps) == ("auto", 100)  # also saved every 100 steps
    old = parse_spec({"name": "a", "entrypoint": "m:f", "checkpoint": {"every_steps": 7}}).checkpoint
    assert (old.every, old.every_steps, old.preemptions_per_hour) == (None, 7, None)
    assert CheckpointPolicy.model_validate(auto.model_dump()) == auto  # stored specs read back the same


@pytest.mark.parametrize(
    ("checkpoint", "match"),
    [
        ({"every": "sometimes"}, "every"),
        ({"every_steps": None}, "every: auto"),
        ({"every_steps": 5, "preemptions_per_hour": 1}, "set every: auto too"),
        ({"every": "auto", "preemptions_per_hour": -1}, "preemptions_per_hour"),
        ({"every": "auto", "preemptions_per_hour": "nan"}, "preemptions_per_hour"),
        ({"every": "auto", "preemptions_per_hour": 1e6}, "preemptions_per_hour"),
    ],
)
def test_bad_auto_settings_are_refused(checkpoint: dict[str, Any], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        parse_spec({"name": "a", "entrypoint": "m:f", "checkpoint": checkpoint})


# ---- the estimator ---------------------------------------------------------------------------------------------


def test_the_rate_comes_from_the_backend_then_the_spec() -> None:
    assert rate_from({}, CheckpointPolicy(every="auto")) is None
    assert rate_from({}, AUTO) == PreemptionRate(3600.0, "checkpoint.preemptions_per_hour")
    assert rate_from({ENV_PREEMPTIONS: "0.25"}, AUTO) == PreemptionRate(0.25, f"${ENV_PREEMPTIONS}")
    for bad in ("-1", "nan", "inf", "fast", "1e9"):
        with pytest.raises(ValueError, match=ENV_PREEMPTIONS):
            rate_from({ENV_PREEMPTIONS: bad}, AUTO)


def test_fallbacks_before_anything_is_known() -> None:
    unknown = AutoInterval(None)
    assert unknown.seconds == FALLBACK_SECONDS and "no preemption rate known" in unknown.why
    unknown.note_save(5.0)
    assert unknown.seconds == FALLBACK_SECONDS  # a save alone does not make a rate
    calm = AutoInterval(PreemptionRate(0.0, "spec"))
    assert calm.seconds == MAX_SECONDS and "none expected" in calm.why
    first = AutoInterval(PreemptionRate(60.0, "spec"))  # MTBF one minute
    assert first.seconds == pytest.approx(60.0 / FIRST_SAVE_SHARE) and "no save measured" in first.why
    assert AutoInterval(PreemptionRate(0.01, "spec")).seconds == FALLBACK_SECONDS  # MTBF/10 is 10 h: 30 min


def test_daly_of_the_mean_of_the_last_saves_with_a_restore_standing_in_first() -> None:
    auto = AutoInterval(PreemptionRate(2.0, "spec"))  # MTBF 1800 s
    assert auto.note_restore(4.0)
    assert auto.seconds == pytest.approx(daly_interval(4.0, 1800.0)) and "restore" in auto.why
    saves = [10.0, 12.0, 8.0, 10.0, 30.0, 30.0, 30.0]
    for i, save in enumerate(saves):
        auto.note_save(save)
        window = saves[max(0, i + 1 - SAVE_WINDOW) : i + 1]
        assert auto.seconds == pytest.approx(daly_interval(sum(window) / len(window), 1800.0))
        assert auto.save_seconds == pytest.approx(sum(window) / len(window))
    auto.note_restore(1.0)  # a measured save is better than a restore
    assert auto.save_seconds == pytest.approx(sum(saves[-SAVE_WINDOW:]) / SAVE_WINDOW)
    assert auto.steps is None
    for _ in range(10):
        auto.note_step(2.0)
    assert auto.steps == round(auto.seconds / 2.0)


def test_capped_and_at_least_one_step_and_only_real_changes_are_logged() -> None:
    slow = AutoInterval(PreemptionRate(0.001, "spec"))  # MTBF 1000 h: Daly would wait days
    slow.note_save(600.0)
    assert slow.seconds == MAX_SECONDS and "capped" in slow.why
    fast = AutoInterval(PreemptionRate(3600.0, "spec"))
    fast.event()
    assert fast.note_save(0.001)  # from MTBF/10 to Daly's: logged
    fast.event()
    assert not fast.note_save(0.00101)  # within 10 %: not logged
    fast.note_step(10.0)  # a step far longer than the interval
    assert fast.steps == 1 and fast.due(fast.seconds) and not fast.due(0.0)
    event = fast.event()
    assert set(event) == {"seconds", "steps", "save_seconds", "preemptions_per_hour", "mtbf_seconds", "why"}
    assert event["mtbf_seconds"] == pytest.approx(1.0)


# ---- the session ---------------------------------------------------------------------------------------------


def test_the_save_cadence_follows_the_measured_save_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Saves of a few ms, then of 0.6 s: the interval (MTBF 1 s) stretches, and the steps between saves with it.

    Daly's interval grows about as the square root of the save time, and a loaded machine makes the
    "fast" saves tens of ms: the slow ones are slow enough that the factor of 1.5 holds even then. A
    loaded machine also stretches the intervals in steps: 320 steps after the slow saves begin leave
    room for several intervals even then.
    """
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    events = EventLog(None)
    sess = TrainSession(ckpt_dir=tmp_path, model=model, optimizer=opt, total_steps=420, policy=AUTO, events=events)
    install = sess.ckpts.install
    slow_from = 100

    def install_slowly(tmp: Path, step: int) -> Path:
        if step > slow_from:
            time.sleep(0.6)  # inside the save the manifest times
        return install(tmp, step)

    monkeypatch.setattr(sess.ckpts, "install", install_slowly)
    with sess:
        for _ in sess.steps():
            x = torch.randn(4, 1)
            loss = ((model(x) - x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(0.01)
            sess.report(loss)

    saves = [e for e in events.memory if e["kind"] == EventKind.CHECKPOINT and e["reason"] == "periodic"]
    steps = [e["step"] for e in saves]
    fast = [b - a for a, b in itertools.pairwise(steps) if b <= slow_from]
    slow = [b - a for a, b in itertools.pairwise(steps) if a > slow_from + 60]
    assert fast and slow, steps
    assert statistics.median(slow) > 1.5 * statistics.median(fast), steps
    intervals = [e for e in events.memory if e["kind"] == EventKind.CHECKPOINT_INTERVAL]
    assert "no save measured" in intervals[0]["why"]
    assert max(e["seconds"] for e in intervals) > 1.5 * min(e["seconds"] for e in intervals[1:])
    # each logged interval is Daly's for the mean of the saves before it
    for logged in intervals[1:]:
        n = next(i for i, e in enumerate(events.memory) if e is logged)
        before = [e["seconds"] for e in events.memory[:n] if e["kind"] == EventKind.CHECKPOINT][-SAVE_WINDOW:]
        assert logged["seconds"] == pytest.approx(daly_interval(sum(before) / len(before), 1.0))
        assert logged["save_seconds"] == pytest.approx(sum(before) / len(before))


SMALL: dict[str, Any] = {**TINY, "steps": 60}


def _spec(tmp_path: Path, checkpoint: dict[str, Any]) -> None:
    spec = {"name": "t", "entrypoint": "gpufleet.workloads.tinylm:train", "checkpoint": {**checkpoint, "keep": 2}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))


class Crash(Exception):
    """A process that dies without saving: the next attempt resumes from the last periodic checkpoint."""


def _saved_after(events: Path, step: int) -> bool:
    """Whether the event log holds a periodic checkpoint of a step after ``step``."""
    if not events.exists():
        return False
    found, _ = read_events(events)
    return any(e["kind"] == EventKind.CHECKPOINT and e["reason"] == "periodic" and e["step"] > step for e in found)


def _run(
    preempt_at: set[int], monkeypatch: pytest.MonkeyPatch, crash_after: int | None = None, events: Path | None = None
) -> int:
    """Run tinylm to the end, asking for a preemption after each step in ``preempt_at`` and crashing once, at
    the first step after ``crash_after`` by which a periodic checkpoint past it is in ``events``; the attempts
    it took. (The crash waits for that save, not for a number of steps: on a loaded machine the interval, from
    the measured save or restore time, may span more steps than on an idle one.)"""
    pending = set(preempt_at)
    crash = [crash_after]

    def on_step(sess: TrainSession) -> None:
        time.sleep(0.01)  # steps long enough for the auto interval (about 0.1 s here) to pass now and then
        if crash[0] is not None and sess.step > crash[0] and events is not None and _saved_after(events, crash[0]):
            crash[0] = None
            raise Crash
        if sess.step in pending:
            pending.discard(sess.step)
            sess.request_preemption()

    attempt = 1
    while True:
        monkeypatch.setenv("GPUFLEET_ATTEMPT", str(attempt))
        try:
            tinylm.train(**SMALL, on_step=on_step)
            return attempt
        except (Preempted, Crash):
            attempt += 1


def test_preempted_and_resumed_with_every_auto_is_bit_exact(
    job_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saves at times, not steps, and resumes from them: the math is the same as an uninterrupted run's."""
    _spec(tmp_path, {"every_steps": 1000})
    assert _run(set(), monkeypatch) == 1
    _, reference = CheckpointDir(tmp_path / "ckpt").load(tmp_path / "ckpt" / f"step-{SMALL['steps']:08d}")

    _spec(tmp_path, {"every": "auto", "preemptions_per_hour": 1})
    monkeypatch.setenv(ENV_PREEMPTIONS, "3600")  # the backend's rate, over the spec's: MTBF 1 s
    monkeypatch.setenv("GPUFLEET_CKPT_DIR", str(tmp_path / "auto"))
    monkeypatch.setenv("GPUFLEET_EVENTS", str(tmp_path / "auto.jsonl"))
    assert _run({12, 30, 44}, monkeypatch, crash_after=45, events=tmp_path / "auto.jsonl") == 5, (
        "no periodic save came between the last preemption (step 45) and the end (step 60)"
    )
    _, resumed = CheckpointDir(tmp_path / "auto").load(tmp_path / "auto" / f"step-{SMALL['steps']:08d}")
    for name in ("model", "optimizer", "scheduler"):
        assert_bitwise_equal(reference[name], resumed[name], name)
    assert_bitwise_equal(reference["trainer"]["rng"], resumed["trainer"]["rng"], "rng")

    events, _ = read_events(tmp_path / "auto.jsonl")
    reasons = [e["reason"] for e in events if e["kind"] == EventKind.CHECKPOINT]
    assert reasons.count("preempt") == 3 and "periodic" in reasons
    crashed = next(e for e in events if e["kind"] == EventKind.SESSION_END and e["status"] == "failed")
    restored = next(e for e in events if e["kind"] == EventKind.RESTORE and e["attempt"] == crashed["attempt"] + 1)
    assert 45 < restored["step"] < SMALL["steps"]  # from a periodic save after the last preemption (steps redone)
    intervals = [e for e in events if e["kind"] == EventKind.CHECKPOINT_INTERVAL]
    assert {e["attempt"] for e in intervals} == {1, 2, 3, 4, 5}
    assert all(f"${ENV_PREEMPTIONS}" in e["why"] and e["preemptions_per_hour"] == 3600 for e in intervals)
    resumed_first = [e for e in intervals if e["attempt"] > 1 and "restore" in e["why"]]
    assert resumed_first, "a resumed attempt plans with its restore time before its first save"
    assert all(math.isfinite(e["seconds"]) and e["seconds"] > 0 for e in intervals)
