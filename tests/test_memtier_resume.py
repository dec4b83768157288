"""A job of the local backend killed with SIGKILL resumes from its own memory copy and ends as if never cut.

The rank stops stepping at batch 12 (``GPUFLEET_FAULT=hang@12``, first attempt only), so the
preemption's SIGTERM never reaches a step boundary and the grace ends in SIGKILL: no disk checkpoint
is written, and the requeued attempt has only the memory tier to resume from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import assert_bitwise_equal, drive

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.jobs.events import read_events
from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.runtime.memtier import release
from gpufleet.runtime.memtier.shm import OwnStore, job_key
from gpufleet.spec import parse_spec

STEPS = 30


def spec(shm: Path, memory: bool) -> Any:
    checkpoint: dict[str, Any] = {"every_steps": 1000, "grace_seconds": 2}
    if memory:
        checkpoint["memory"] = {"every_steps": 1}
    return parse_spec(
        {
            "name": "memtier",
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": STEPS, "step_seconds": 0.05},
            "checkpoint": checkpoint,
            "max_restarts": 2,
        }
    )


def final_state(home: Path, job: int) -> dict[str, Any]:
    ckpts = CheckpointDir(home / "jobs" / str(job) / "checkpoints")
    info, _ = ckpts.latest()
    assert info is not None and info.step == STEPS
    _, state = ckpts.load(info.path)
    return {"model": state["model"], "optimizer": state["optimizer"], "step": state["trainer"]["step"]}


HANG_AT = 12


def test_a_job_killed_with_sigkill_resumes_from_its_own_memory_copy_bitwise(
    local: tuple[LocalBackend, LocalScheduler], home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, scheduler = local
    shm = tmp_path / "shm"
    monkeypatch.setenv("GPUFLEET_SHM_DIR", str(shm))  # the attempts inherit it
    straight = backend.submit(spec(shm, memory=False))
    drive(scheduler, lambda: backend.store.job(straight).state in ("completed", "failed"), timeout=600)
    assert backend.store.job(straight).state == "completed", backend.store.job(straight).reason

    monkeypatch.setenv("GPUFLEET_FAULT", f"hang@{HANG_AT}")
    cut = backend.submit(spec(shm, memory=True))
    job_dir = home / "jobs" / str(cut)
    own = OwnStore(shm, job_key(job_dir), 0)
    try:
        drive(scheduler, lambda: own.steps()[:1] == [HANG_AT], timeout=600)
        backend.preempt(cut)  # SIGTERM, unanswered by the stuck rank, then SIGKILL after the grace
        drive(scheduler, lambda: backend.store.job(cut).state in ("completed", "failed"), timeout=600)
        assert backend.store.job(cut).state == "completed", backend.store.job(cut).reason
        events, _ = read_events(job_dir / "events.jsonl")
        restores = [e for e in events if e["kind"] == "restore" and e.get("step") is not None]
        assert len(backend.store.attempts(cut)) == 2
        assert [(r["tier"], r["step"]) for r in restores] == [("own", HANG_AT)], restores
        assert backend.store.attempts(cut)[0].outcome == "preempted"
        assert not any(e["kind"] == "checkpoint" and e["step"] < STEPS for e in events)  # no disk copy to resume
        assert_bitwise_equal(final_state(home, straight), final_state(home, cut))
    finally:
        release(job_dir, {"GPUFLEET_SHM_DIR": str(shm)})
