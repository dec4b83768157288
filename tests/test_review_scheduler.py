"""What the local scheduler leaves behind of a job's memory tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.paths import job_dir
from gpufleet.runtime.memtier.shm import job_key
from gpufleet.spec import parse_spec


def test_a_job_cancelled_while_queued_leaves_no_memory_copies(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = tmp_path / "shm"
    monkeypatch.setenv("GPUFLEET_SHM_DIR", str(shm))
    monkeypatch.setenv("GPUFLEET_WARM_START", "0")
    backend = LocalBackend(home, spawn=False)
    spec = {"name": "requeued", "team": "t", "entrypoint": "gpufleet.workloads.toy:train"}
    job = backend.submit(parse_spec(spec))
    copies = shm / job_key(job_dir(home, job)) / "rank-0"  # what an earlier attempt left for the next
    copies.mkdir(parents=True)
    (copies / "step-00000010.mem").write_bytes(b"weights")
    backend.cancel(job)
    scheduler = LocalScheduler(home, slots=1, poll_s=0.02)
    try:
        scheduler._handle_requests()
    finally:
        scheduler.shutdown(grace_s=5)
    assert backend.store.job(job).state == "cancelled"
    assert not copies.parent.exists()
