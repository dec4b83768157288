"""The checkpoint manager on its own: a tiny model saved and restored in tmp_path, with a fake clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpufleet.errors import CheckpointError, CheckpointSpaceError
from gpufleet.jobs.events import EventLog
from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.runtime.components.announce import Announcer
from gpufleet.runtime.components.checkpointer import CheckpointManager, LoopPosition, SaveVerdict
from gpufleet.runtime.components.ckpt_io import staged, state_registry
from gpufleet.runtime.group import Group
from gpufleet.runtime.state import RunShape
from gpufleet.spec import CheckpointPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def manager(
    root: Path, model: torch.nn.Module, clock: Clock | None = None, **policy: object
) -> tuple[CheckpointManager, EventLog]:
    events = EventLog(None)
    objects, values = state_registry(model, None, None, {"note": "kept"})
    made = CheckpointManager(
        root,
        objects=objects,
        values=values,
        group=Group(),
        voice=Announcer(events, echo=False),
        policy=CheckpointPolicy.model_validate({"keep": 5, **policy}),
        clock=clock or Clock(),
    )
    made.prepare()
    return made, events


def at(step: int, loss: float = 1.0) -> LoopPosition:
    return LoopPosition(step, step * 2, loss, (0.5, 0.25), 0, RunShape(1))


def kinds(events: EventLog) -> list[str]:
    return [e["kind"] for e in events.memory]


def test_a_saved_state_comes_back_with_its_position_and_values(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt, events = manager(tmp_path, model)
    assert ckpt.save(at(4, loss=0.75), "manual", None) is SaveVerdict.SAVED
    assert (tmp_path / "step-00000004" / "manifest.json").exists() and ckpt.last_saved_step == 4
    with torch.no_grad():
        model.weight.fill_(9.0)
    ckpt.values["note"] = "changed"
    restored = ckpt.restore()
    assert restored is not None and restored.position == LoopPosition(4, 8, 0.75, (0.5, 0.25), 0, RunShape(1))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert ckpt.values["note"] == "kept" and ckpt.saved_run == RunShape(1)
    assert kinds(events) == ["checkpoint", "restore"]


def test_every_steps_owes_a_save_until_a_decision_point_takes_it(tmp_path: Path) -> None:
    ckpt, _ = manager(tmp_path, torch.nn.Linear(1, 1), every_steps=2)
    ckpt.note_step(1, 0.1)
    assert not ckpt.take_due(0.0)
    ckpt.note_step(2, 0.1)
    ckpt.note_step(3, 0.1)  # a step closed between two decision points
    assert ckpt.take_due(0.0) and not ckpt.take_due(0.0)


def test_every_seconds_counts_from_the_last_save_on_the_managers_clock(tmp_path: Path) -> None:
    clock = Clock()
    ckpt, _ = manager(tmp_path, torch.nn.Linear(1, 1), clock, every_seconds=60)
    assert not ckpt.seconds_due(clock.now + 59) and ckpt.seconds_due(clock.now + 60)
    clock.now += 100
    ckpt.save(at(1), "periodic", None)
    assert not ckpt.take_due(clock.now + 30) and ckpt.take_due(clock.now + 61)


def test_a_background_save_is_recorded_when_it_is_finished(tmp_path: Path) -> None:
    ckpt, events = manager(tmp_path, torch.nn.Linear(2, 2), None, **{"async": True})
    ckpt.start_writer()
    try:
        assert ckpt.save(at(2), "periodic", None) is SaveVerdict.WRITING
        assert ckpt.writing_step() == 2 and ckpt.last_saved_step is None
        assert ckpt.finish_write() is SaveVerdict.SAVED and ckpt.finish_write() is SaveVerdict.NOTHING
    finally:
        ckpt.close_writer()
    (event,) = [e for e in events.memory if e["kind"] == "checkpoint"]
    assert event["background"] is True and ckpt.last_saved_step == 2


@pytest.mark.parametrize(
    ("reason", "on_no_space", "verdict"),
    [
        ("periodic", "continue", SaveVerdict.FAILED),
        ("preempt", "continue", SaveVerdict.REQUEUE),
        ("final", "continue", SaveVerdict.REQUEUE),
        ("periodic", "requeue", SaveVerdict.REQUEUE),
    ],
)
def test_a_full_disk_is_a_verdict_not_an_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reason: str, on_no_space: str, verdict: SaveVerdict
) -> None:
    def full(self: CheckpointDir, step: int, state: Any, **fields: Any) -> Any:
        raise CheckpointSpaceError("no space left", path=self.root, needed=10, free=1)

    ckpt, events = manager(tmp_path, torch.nn.Linear(1, 1), on_no_space=on_no_space)
    monkeypatch.setattr(CheckpointDir, "save", full)
    assert ckpt.save(at(3), reason, None) is verdict
    assert kinds(events) == ["checkpoint_failed"] and ckpt.last_saved_step is None


def test_a_checkpoint_of_another_model_shape_is_refused_by_name(tmp_path: Path) -> None:
    first, _ = manager(tmp_path, torch.nn.Linear(3, 2))
    first.save(at(1), "manual", None)
    other, _ = manager(tmp_path, torch.nn.Linear(3, 4))
    with pytest.raises(CheckpointError, match=r"does not fit the model: .*weight"):
        other.restore()


def test_a_rollback_restores_the_step_before_the_bad_one_and_drops_the_later_ones(tmp_path: Path) -> None:
    ckpt, _ = manager(tmp_path, torch.nn.Linear(1, 1))
    ckpt.save(at(2), "periodic", None)
    ckpt.save(at(4), "periodic", None)
    ckpt.note_unhealthy()
    restored = ckpt.restore(before_step=4, cause="rollback")
    assert restored is not None and restored.position.step == 2
    ckpt.rolled_back(2)
    assert [info.step for info in ckpt.ckpts.scan()] == [2] and not ckpt.unhealthy_since_save


def test_the_best_metric_is_saved_with_the_checkpoint_of_its_step(tmp_path: Path) -> None:
    ckpt, _ = manager(tmp_path, torch.nn.Linear(1, 1), keep_best={"metric": "val_loss", "mode": "min"})
    assert ckpt.note_metrics(3, {"val_loss": 2.0}) and not ckpt.note_metrics(3, {"val_loss": 2.5})
    assert not ckpt.note_metrics(3, {"val_loss": float("nan")}) and ckpt.best == 2.0
    ckpt.save(at(3), "best", None)
    (info,) = ckpt.ckpts.scan()
    assert info.manifest is not None and info.manifest.metrics == {"val_loss": 2.5}  # the last measured


def test_resume_never_over_earlier_checkpoints_is_refused(tmp_path: Path) -> None:
    ckpt, _ = manager(tmp_path, torch.nn.Linear(1, 1))
    ckpt.save(at(1), "manual", None)
    objects, values = state_registry(torch.nn.Linear(1, 1), None, None, None)
    never = CheckpointManager(
        tmp_path, objects=objects, values=values, group=Group(), voice=Announcer(EventLog(None)), resume="never"
    )
    with pytest.raises(CheckpointError, match="resume: never, but"):
        never.prepare()


def test_the_registry_refuses_reserved_names_and_staged_copies_are_independent() -> None:
    with pytest.raises(ValueError, match="reserved"):
        state_registry(torch.nn.Linear(1, 1), None, None, {"trainer": 1})
    tensor = torch.zeros(2)
    copy = staged({"t": [tensor]})
    tensor.add_(1.0)
    assert torch.equal(copy["t"][0], torch.zeros(2))
