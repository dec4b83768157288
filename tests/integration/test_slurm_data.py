"""A job with a `data` block on the real dev Slurm: two ranks under srun, one stages, both train on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import S3, follow, shards

from gpufleet.backends.slurm.backend import SlurmBackend
from gpufleet.jobs.store import TERMINAL
from gpufleet.spec import parse_spec
from gpufleet.workloads.tinylm import TINY


@pytest.fixture
def backend(slurm: dict[str, str], home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmBackend]:
    monkeypatch.setenv("GPUFLEET_SLURM_GRES", "0")
    backend = SlurmBackend(home)
    yield backend
    backend.sync()
    for job in backend.store.jobs():
        if job.state not in TERMINAL:
            backend.cancel(job.id)


@pytest.mark.timeout(400)
def test_two_ranks_stage_once_from_s3_and_train(backend: SlurmBackend, s3: S3, home: Path) -> None:
    s3.client.create_bucket(Bucket="slurm-corpus")
    objects = shards(5, 120_000, seed=11)
    for name, body in objects.items():
        s3.put("slurm-corpus", f"d/{name}", body)
    spec = parse_spec(
        {
            "name": "data-ddp",
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": {**TINY, "steps": 10},
            "resources": {"nodes": 1, "gpus": 2, "cpus": 2, "gpu_type": "A100"},
            "distributed": {"strategy": "ddp", "timeout_seconds": 120},
            "data": {"sources": [{"source": "s3://slurm-corpus/d", "dest": "shards", "endpoint_url": s3.endpoint}]},
        }
    )
    job = backend.submit(spec)
    follow(backend, lambda: backend.store.job(job).state in TERMINAL)
    assert backend.store.job(job).state == "completed", backend.store.job(job).reason
    staged = [e for e in backend.store.events(job) if e.kind == "data_staged"]
    assert len(staged) == 1 and staged[0].data["files_copied"] == 5  # two ranks, one staging
    folder = home / "jobs" / str(job) / "data" / "shards"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == objects
