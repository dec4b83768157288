"""The local backend with a fleet: the planner places, a storm fails a region over, a team reclaims its quota."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import drive

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.pools import region_dir, use_fleet
from gpufleet.errors import UsageError
from gpufleet.paths import checkpoints_dir
from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.spec import JobSpec, parse_spec

H100 = {"memory_gib": 80, "throughput": {"training": 1.0}}


def offer(
    provider: str, region: str, spot: float | None, on_demand: float, slots: int, egress: float = 0.0
) -> dict[str, Any]:
    return {
        "provider": provider,
        "region": region,
        "gpu_type": "H100",
        "gpus_per_node": 1,
        "on_demand_per_gpu_hour": on_demand,
        "spot_per_gpu_hour": spot,
        "capacity_gpus": slots,
        "egress_per_gb": egress,
    }


def write_fleet(path: Path, **fleet: Any) -> Path:
    path.write_text(yaml.safe_dump({"as_of": "2026-12-01", "gpu_types": {"H100": H100}, **fleet}))
    return path


def toy(name: str, team: str = "default", *, steps: int = 400, spot: bool = True, **extra: Any) -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "team": team,
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": steps, "step_seconds": 0.01},
            "resources": {"gpu_type": "H100", "gpus": 1},
            "spot": spot,
            "checkpoint": {"every_steps": 10, "grace_seconds": 20},
            **extra,
        }
    )


@pytest.fixture
def fleet_sched(home: Path) -> Iterator[tuple[LocalBackend, LocalScheduler]]:
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, poll_s=0.02)
    yield backend, scheduler
    scheduler.shutdown(grace_s=5)


def kinds(backend: LocalBackend, job: int, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in backend.store.events(job, kinds=(kind,))]


def ended(backend: LocalBackend, job: int) -> bool:
    return backend.store.job(job).state in ("completed", "failed", "cancelled")


def test_a_storm_fails_the_region_over_and_the_checkpoint_follows(
    home: Path, tmp_path: Path, fleet_sched: tuple[LocalBackend, LocalScheduler]
) -> None:
    backend, scheduler = fleet_sched

    def fleet(storms: list[dict[str, float]]) -> Path:
        return write_fleet(
            tmp_path / "fleet.yaml",
            offers=[offer("aws", "us-east-1", 2.6, 6.88, 1, egress=0.09), offer("gcp", "us-central1", 3.7, 11.06, 1)],
            pools=[{"offer": "aws/us-east-1/H100", "storms": storms}, {"offer": "gcp/us-central1/H100"}],
            failover={"preemptions": 2, "window_minutes": 60, "cooldown_minutes": 60},
        )

    use_fleet(home, fleet([]))
    # Long enough on AWS (20 s of steps at one preemption every 2 s) that its storm preempts it twice. The storm
    # begins once the job has a checkpoint on AWS: an interpreter that starts slower than the storm's first
    # preemption (a loaded machine) would otherwise leave nothing to move.
    job = backend.submit(toy("storm", steps=2000))
    drive(scheduler, lambda: bool(kinds(backend, job, "checkpoint")) or ended(backend, job), timeout=300)
    use_fleet(home, fleet([{"start_s": 0, "end_s": 3600, "preemptions_per_hour": 1800}]))
    drive(scheduler, lambda: ended(backend, job), timeout=300)
    assert backend.store.job(job).state == "completed", backend.store.job(job).reason
    placed = [e["offer"] for e in kinds(backend, job, "placed")]
    assert placed[:2] == ["aws/us-east-1/H100"] * 2 and placed[2:] == ["gcp/us-central1/H100"], placed
    assert len(kinds(backend, job, "spot_preempted")) == 2
    (failover,) = kinds(backend, job, "failover")
    assert failover["target"] == "aws/us-east-1"
    (moved,) = kinds(backend, job, "checkpoint_moved")
    assert moved["source"] == "aws/us-east-1" and moved["target"] == "gcp/us-central1"
    assert moved["bytes"] > 0 and moved["egress_money"] == pytest.approx(moved["bytes"] / 1e9 * 0.09)
    restores = kinds(backend, job, "restore")
    assert restores[-1]["step"] == moved["step"]
    link = checkpoints_dir(home, job)
    assert link.resolve() == region_dir(home, "gcp/us-central1", job).resolve()
    assert CheckpointDir(link).scan()[-1].step == 2000


def test_a_team_reclaims_the_quota_it_lent(
    home: Path, tmp_path: Path, fleet_sched: tuple[LocalBackend, LocalScheduler]
) -> None:
    backend, scheduler = fleet_sched
    use_fleet(
        home,
        write_fleet(
            tmp_path / "fleet.yaml",
            offers=[offer("aws", "us-east-1", None, 6.88, 2)],
            quotas=[
                {"team": "perception", "gpu_type": "H100", "nominal": 1, "cohort": "research"},
                {"team": "language", "gpu_type": "H100", "nominal": 1, "borrowing_limit": 1, "cohort": "research"},
            ],
        ),
    )
    store = backend.store
    first = backend.submit(toy("own", "language", steps=100_000, spot=False))
    second = backend.submit(toy("borrowed", "language", steps=100_000, spot=False))
    drive(scheduler, lambda: len(scheduler.running) == 2)
    assert kinds(backend, second, "placed")[0]["borrowed_gpus"] == 1
    third = backend.submit(toy("third", "language", steps=10, spot=False))
    drive(scheduler, lambda: (store.job(third).reason or "").startswith("waiting:"))
    assert "quota language/H100" in (store.job(third).reason or ""), store.job(third).reason
    owner = backend.submit(toy("owner", "perception", steps=20, spot=False))
    drive(scheduler, lambda: ended(backend, owner), timeout=300)
    assert store.job(owner).state == "completed"
    (reclaim,) = kinds(backend, second, "reclaimed_by")
    assert reclaim["job"] == owner
    assert store.job(first).state == "running" and not kinds(backend, first, "reclaimed_by")
    for job in (first, second, third):
        if not ended(backend, job):
            backend.cancel(job)


def test_a_job_no_pool_can_ever_take_is_refused_at_submit(
    home: Path, tmp_path: Path, fleet_sched: tuple[LocalBackend, LocalScheduler]
) -> None:
    backend, _ = fleet_sched
    use_fleet(home, write_fleet(tmp_path / "fleet.yaml", offers=[offer("aws", "us-east-1", None, 6.88, 1)]))
    with pytest.raises(UsageError, match="fits no pool"):
        backend.submit(toy("big", spot=False).copy_with(resources={"gpu_type": "H100", "gpus": 2}))
    assert backend.store.jobs() == []
