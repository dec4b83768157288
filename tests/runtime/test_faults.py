"""``GPUFLEET_FAULT``: parsing, and the ``oom@N`` fault that kills an attempt like a real OOM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpufleet.errors import UsageError
from gpufleet.jobs.events import read_events
from gpufleet.jobs.faults import FaultPlan
from gpufleet.workloads import toy


def test_parse_every_kind() -> None:
    plan = FaultPlan.parse(" nan@3, inf@5,spike@7 ,oom@11,")
    assert plan.faults == {3: "nan", 5: "inf", 7: "spike", 11: "oom"}
    assert FaultPlan.parse("").faults == {}


@pytest.mark.parametrize("item", ["oom", "oom@", "oom@-1", "OOM@3", "leak@3", "oom@3x", "nan@3:1", "hang@3:r"])
def test_bad_faults_name_the_item_and_the_kinds(item: str) -> None:
    pattern = rf"invalid fault '{item}': use KIND@STEP\[:rRANK\] with KIND nan, inf, spike, oom or hang"
    with pytest.raises(UsageError, match=pattern):
        FaultPlan.parse(item)


def test_oom_raises_at_its_batch_only() -> None:
    plan = FaultPlan.parse("oom@4")
    loss = torch.tensor(2.0)
    assert plan.apply(loss, 3) is loss and plan.apply(loss, 5) is loss
    with pytest.raises(torch.OutOfMemoryError, match=r"CUDA out of memory\. .*oom@4"):
        plan.apply(loss, 4)


def test_oom_ends_the_session_as_failed_with_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_SPEC", raising=False)
    monkeypatch.setenv("GPUFLEET_CKPT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("GPUFLEET_EVENTS", str(tmp_path / "events.jsonl"))
    monkeypatch.setenv("GPUFLEET_FAULT", "oom@6")
    with pytest.raises(torch.OutOfMemoryError):
        toy.train(steps=20, step_seconds=0.0)
    events, _ = read_events(tmp_path / "events.jsonl")
    end = [e for e in events if e["kind"] == "session_end"]
    assert len(end) == 1 and end[0]["status"] == "failed" and end[0]["step"] == 6
    assert end[0]["error"].startswith("OutOfMemoryError: CUDA out of memory")
