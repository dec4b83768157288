"""``checkpoint: {async: true}``: periodic saves are written in the background while training goes on.

The state is copied in memory at the step boundary, so what is written is the state of that step
even though the loop keeps updating the weights in place; the manifest is committed only once the
write is done; a preemption waits for the write in flight. A 2-rank FSDP job with background
saves, preempted twice by the scheduler, ends bitwise equal to the same job saved synchronously
and never interrupted.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_bitwise_equal, final_dcp_state, straight_and_preempted

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.runtime import CheckpointDir, EventLog, TrainSession
from gpufleet.spec import CheckpointPolicy, parse_spec
from gpufleet.workloads.tinylm import TINY


def loop(root: Path, *, background: bool, hold: threading.Event | None = None) -> tuple[TrainSession, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    events = EventLog(root / "events.jsonl")
    session = TrainSession(
        ckpt_dir=root / "ckpt",
        model=model,
        optimizer=optimizer,
        total_steps=9,
        policy=CheckpointPolicy.model_validate({"every_steps": 2, "keep": 10, "async": background}),
        events=events,
        log_every_s=0.0,
        echo=False,
    )
    seen: dict[int, dict[str, torch.Tensor]] = {}
    if hold is not None:
        real_save = session.ckpts.save

        def slow_save(*args: Any, **kwargs: Any) -> Any:
            assert hold.wait(timeout=60), "the test never released the write"
            return real_save(*args, **kwargs)

        session.ckpts.save = slow_save  # type: ignore[method-assign]
    with session:
        for step in session.steps():
            g = torch.Generator().manual_seed(step)
            x = torch.randn(16, 8, generator=g)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.report(loss)
            seen[session.step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if hold is not None and session.step == 3:
                hold.set()  # the step-2 write ran while step 3 changed the weights in place
    return session, seen


def test_a_background_save_writes_the_state_of_its_step_not_a_later_one(tmp_path: Path) -> None:
    _, seen = loop(tmp_path, background=True, hold=threading.Event())
    _, saved = CheckpointDir(tmp_path / "ckpt").load(tmp_path / "ckpt" / "step-00000002")
    for key, value in seen[2].items():
        assert torch.equal(saved["model"][key], value), key
    assert not torch.equal(seen[2]["weight"], seen[3]["weight"])  # the weights did move during the write
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    saves = [e for e in events if e["kind"] == "checkpoint"]
    assert [e["step"] for e in saves] == [2, 4, 6, 8, 9]
    assert all(e.get("background") for e in saves[:4]) and not saves[4].get("background")  # the final save waits
    assert all(e["stall_seconds"] >= 0 for e in saves[:4])


def test_background_saves_change_nothing_in_the_training(tmp_path: Path) -> None:
    _, sync = loop(tmp_path / "sync", background=False)
    _, background = loop(tmp_path / "async", background=True)
    assert sync.keys() == background.keys()
    for step in sync:
        for key in sync[step]:
            assert torch.equal(sync[step][key], background[step][key]), (step, key)
    a = CheckpointDir(tmp_path / "sync" / "ckpt").scan()
    b = CheckpointDir(tmp_path / "async" / "ckpt").scan()
    assert [i.step for i in a] == [i.step for i in b] == [2, 4, 6, 8, 9]


def tinylm(name: str, *, background: bool) -> Any:
    return parse_spec(
        {
            "name": name,
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": {**TINY, "steps": 24},
            "resources": {"nodes": 1, "gpus": 2, "cpus": 2},
            "distributed": {"strategy": "fsdp", "timeout_seconds": 120},
            "checkpoint": {"every_steps": 3, "grace_seconds": 60, "async": background},
            "max_restarts": 10,
        }
    )


def final_state(home: Path, job: int) -> dict[str, Any]:
    return final_dcp_state(home, job, step=24)


@pytest.mark.timeout(900)
def test_a_group_with_background_saves_preempted_twice_ends_bit_identical(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=2, poll_s=0.05)
    try:
        targets = random.Random(7).sample(range(4, 20), 2)
        straight, cut = straight_and_preempted(
            backend, scheduler, tinylm("straight", background=False), tinylm("cut", background=True), targets
        )
    finally:
        scheduler.shutdown(grace_s=30)
    job = backend.store.job(cut)
    assert job.state == "completed" and job.restarts == 2, job.reason
    assert_bitwise_equal(final_state(home, cut), final_state(home, straight), "fsdp, background saves")
    saves = backend.store.events(cut, kinds=["checkpoint"])
    assert any(e.data.get("background") for e in saves) and any(e.data["reason"] == "preempt" for e in saves)


def test_a_loop_error_during_a_background_write_that_finds_the_disk_full_is_the_error_reported(
    tmp_path: Path,
) -> None:
    """The write in flight fails for space under ``on_no_space: requeue`` while the loop raises: the loop's error
    is what ends the session (``session_end`` failed, handlers restored), not a requeue that hides it."""
    from gpufleet.errors import CheckpointSpaceError

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = TrainSession(
        ckpt_dir=tmp_path / "ckpt",
        model=model,
        optimizer=optimizer,
        total_steps=9,
        policy=CheckpointPolicy.model_validate({"every_steps": 2, "async": True, "on_no_space": "requeue"}),
        events=EventLog(tmp_path / "events.jsonl"),
        log_every_s=0.0,
        echo=False,
    )
    started, release = threading.Event(), threading.Event()

    def full(*args: Any, **kwargs: Any) -> Any:
        started.set()
        assert release.wait(timeout=60), "the test never released the write"
        raise CheckpointSpaceError("no space left: 1234 bytes needed, 10 free", path=tmp_path, needed=1234, free=10)

    session.ckpts.save = full  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="the loop broke"), session:
        for _ in session.steps():
            loss = model(torch.ones(2, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.report(loss)
            if session.step == 2:
                assert started.wait(timeout=60), "no background write started at step 2"
                release.set()
                raise RuntimeError("the loop broke")
    ends = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["status"] for e in ends if e["kind"] == "session_end"] == ["failed"]
