"""The fleet a home uses, shared by the local and Slurm backends: its files, placing a job, its regions.

Files under ``$GPUFLEET_HOME/fleet/``, each with one writer:

- ``fleet.yaml``: the validated fleet file ``gpufleet fleet use`` copied (the CLI);
- ``marks.json``: the fleet's clock origin and the targets marked down by hand (the CLI, under
  an ``flock``);
- ``failover.json``: the failover blocks and recent preemptions (the local scheduler).

Placing: both backends ask the planner (:func:`~gpufleet.placement.planner.plan`) for a job's offer
under the name :func:`planning_name` gives it, record the answer as a :class:`Placed` (the
``placed`` event, what the ledger prices) and explain it with :func:`explain_choice`. What each
backend then does with the offer is its own: the local scheduler runs the job in the pool's slots
(``backends/local/fleet.py``), Slurm submits it to the pool's partition and QOS (``backends/slurm/fleet.py``).

A pool keeps its checkpoints in its region: ``regions/<provider>/<region>/<job id>/``. The job's
``jobs/<id>/checkpoints`` is a link to the region it last ran in, so ``gpufleet show``, ``ckpt``
and every reader keep one path. When the planner sends a job to another region, the newest
restorable checkpoint is copied there, verified file by file (sha256, as a restore would), and
only then installed; the bytes moved are what the ledger charges as egress.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import UsageError
from gpufleet.jobs.store import Job
from gpufleet.paths import checkpoints_dir, private_dir
from gpufleet.placement.failover import Block, Failover
from gpufleet.placement.fleetfile import Fleet, load_fleet
from gpufleet.placement.planner import Choice, Plan, parse_target, plan
from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.runtime.manifest import step_dirname
from gpufleet.spec import JobSpec


def fleet_dir(home: Path) -> Path:
    return home / "fleet"


def fleet_file(home: Path) -> Path:
    return fleet_dir(home) / "fleet.yaml"


def marks_file(home: Path) -> Path:
    return fleet_dir(home) / "marks.json"


def failover_file(home: Path) -> Path:
    return fleet_dir(home) / "failover.json"


def region_dir(home: Path, region: str, job_id: int) -> Path:
    """Where a job's checkpoints live in ``provider/region``."""
    provider, _, name = region.partition("/")
    return home / "regions" / provider / name / str(job_id)


def _not_a_file(path: Path) -> UsageError:
    return UsageError(f"{path} is not a regular file: remove it (gpufleet writes it)")


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise _not_a_file(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    """A small JSON file gpufleet wrote, or ``None`` when it is missing or not what it wrote."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.exists():
        path.unlink(missing_ok=True)
    elif path.is_file():
        path.unlink()
    else:
        raise _not_a_file(path)


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    private_dir(fleet_dir(home))
    with (fleet_dir(home) / "marks.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ---- marks: the clock origin and hand-made outages ----------------------------------------------
@dataclass(frozen=True, slots=True)
class Marks:
    epoch: float
    """Unix time the fleet was put in use: storm and outage times count from it."""
    down: dict[str, bool] = field(default_factory=dict)
    """Target (provider, provider/region or offer) -> abrupt."""

    def seconds(self, now: float) -> float:
        return max(0.0, now - self.epoch)


def read_marks(home: Path) -> Marks:
    raw = _read_json(marks_file(home))
    try:
        epoch = float(raw["epoch"])
        down = {str(k): bool(v) for k, v in dict(raw.get("down", {})).items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return Marks(time.time())
    return Marks(epoch if math.isfinite(epoch) else time.time(), down)


def use_fleet(home: Path, source: Path) -> Fleet:
    """Validate ``source`` and make it this home's fleet; the fleet's clock starts now."""
    fleet = load_fleet(source)
    text = source.read_bytes()
    for path in (fleet_file(home), marks_file(home), failover_file(home)):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise _not_a_file(path)
    with _locked(home):
        (fleet_dir(home) / ".fleet.yaml.tmp").write_bytes(text)
        os.replace(fleet_dir(home) / ".fleet.yaml.tmp", fleet_file(home))
        _write_json(marks_file(home), {"epoch": time.time(), "down": {}})
        failover_file(home).unlink(missing_ok=True)
    return fleet


def drop_fleet(home: Path) -> bool:
    """Back to one pool of ``GPUFLEET_LOCAL_SLOTS``; ``False`` when no fleet was in use."""
    if not fleet_dir(home).is_dir():
        return False  # nothing to drop: write nothing
    paths = (fleet_file(home), marks_file(home), failover_file(home))
    for path in paths:  # all or nothing: a fleet half dropped would still place jobs
        if not path.is_symlink() and path.exists() and not path.is_file():
            raise _not_a_file(path)
    with _locked(home):
        had = fleet_file(home).exists()
        for path in paths:
            _remove(path)
    return had


def active_fleet(home: Path) -> Fleet | None:
    """The fleet in use, or ``None`` (one pool, as without a fleet)."""
    path = fleet_file(home)
    if not path.exists():
        return None
    return load_fleet(path)


def mark(home: Path, target: str, *, down: bool, abrupt: bool = False) -> Marks:
    """``fleet down TARGET`` / ``fleet up TARGET``; ``UsageError`` for a target the fleet does not have."""
    fleet = active_fleet(home)
    if fleet is None:
        raise UsageError(f"{home} has no fleet: run `gpufleet fleet use FILE` first")
    key = parse_target(target)
    if key not in fleet.targets():
        raise UsageError(f"{target!r} is not in the fleet: give one of {', '.join(fleet.targets())}")
    if marks_file(home).is_symlink() or (marks_file(home).exists() and not marks_file(home).is_file()):
        raise _not_a_file(marks_file(home))  # refused before the lock file is made, as the next one
    if not down and key not in read_marks(home).down:
        raise UsageError(f"{key} is not marked down; marked down: {', '.join(read_marks(home).down) or 'nothing'}")
    with _locked(home):
        marks = read_marks(home)
        if down:
            marks.down[key] = abrupt
        elif key not in marks.down:
            raise UsageError(f"{key} is not marked down; marked down: {', '.join(marks.down) or 'nothing'}")
        else:
            del marks.down[key]
        _write_json(marks_file(home), {"epoch": marks.epoch, "down": marks.down})
    return marks


def matches(target: str, offer_key: str) -> bool:
    """Whether ``target`` (provider, provider/region or offer key) covers the offer."""
    return offer_key == target or offer_key.startswith(target + "/")


# ---- failover state ----------------------------------------------------------------------------
def read_failover(home: Path, fleet: Fleet) -> Failover:
    policy = fleet.failover.policy()
    raw = _read_json(failover_file(home))
    try:
        blocks = tuple(
            Block(str(b["target"]), float(b["since_hours"]), float(b["until_hours"]), str(b["why"]))
            for b in raw["blocks"]
        )
        recent = tuple((str(t), float(h)) for t, h in raw["preemptions"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return Failover(policy)
    return Failover(policy, blocks, recent)


def write_failover(home: Path, failover: Failover) -> None:
    private_dir(fleet_dir(home))
    _write_json(
        failover_file(home),
        {"blocks": [b.to_dict() for b in failover.blocks], "preemptions": [list(p) for p in failover.preemptions]},
    )


# ---- placing a job on the fleet ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Placed:
    """Where one attempt runs, as the planner chose it."""

    offer: str
    provider: str
    region: str
    gpu_type: str
    spot: bool
    gpus: int
    """GPUs held (whole nodes of the offer)."""
    price_per_gpu_hour: float
    on_demand_per_gpu_hour: float
    borrowed_gpus: int
    team: str
    why: str
    preemptions_per_hour: float = 0.0
    """The catalogue's expected spot preemption rate of the offer (0 on demand): what ``every: auto`` plans for."""

    @property
    def location(self) -> str:
        return f"{self.provider}/{self.region}"

    def to_event(self) -> dict[str, Any]:
        return {
            "offer": self.offer,
            "provider": self.provider,
            "region": self.region,
            "gpu_type": self.gpu_type,
            "spot": self.spot,
            "gpus": self.gpus,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "on_demand_per_gpu_hour": self.on_demand_per_gpu_hour,
            "borrowed_gpus": self.borrowed_gpus,
            "why": self.why,
        }


def planning_name(job_id: int) -> str:
    """The job's name in a plan: unique, where the names users give their jobs need not be."""
    return f"job-{job_id}"


def planning_spec(job: Job, home: Path) -> JobSpec:
    """The job as the planner sees it: a unique name, and ``provider`` where its checkpoint is."""
    region = current_region(home, job.id)
    provider = region.split("/", 1)[0] if region else job.spec.provider
    return job.spec.copy_with(name=planning_name(job.id), provider=provider)


def placed_from(choice: Choice, fleet: Fleet, team: str, why: str) -> Placed:
    offer = fleet.offer(choice.offer)
    return Placed(
        offer=choice.offer,
        provider=choice.provider,
        region=choice.region,
        gpu_type=choice.gpu_type,
        spot=choice.spot,
        gpus=choice.allocated_gpus,
        price_per_gpu_hour=choice.price_per_gpu_hour,
        on_demand_per_gpu_hour=offer.on_demand_per_gpu_hour,
        borrowed_gpus=choice.admission.borrowed_gpus if choice.admission is not None else 0,
        team=team,
        why=why,
        preemptions_per_hour=offer.spot_preemptions_per_hour if choice.spot else 0.0,
    )


def check_fits(spec: JobSpec, fleet: Fleet) -> None:
    """At submit: a job no pool of the empty fleet could ever take is refused (exit 2) with the planner's reasons."""
    decision = plan([spec], fleet.catalog).decisions[0]
    if not decision.placed:
        reasons = "; ".join(decision.reasons) or "no offer matches"
        raise UsageError(f"job {spec.name!r} fits no pool of the fleet even when it is empty: {reasons}")


def explain_choice(result: Plan, name: str) -> str:
    """The chosen offer and its price, then up to three losing candidates and why each lost."""
    decision = result.decision(name)
    choice = decision.choice
    if choice is None:
        return ""
    market = "spot" if choice.spot else "on-demand"
    lines = [f"{choice.offer} {market} at {choice.price_per_gpu_hour:g}/GPU-h, expected {decision.expected_cost:.4g}"]
    runners = [c for c in decision.rejected if c.reason not in ("chosen",)][:3]
    lines += [f"{c.offer} {'spot' if c.spot else 'on-demand'}: {c.reason} ({c.detail})" for c in runners]
    return "; ".join(lines)


# ---- region storage ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Move:
    """A checkpoint copied from one region to another before a job resumes there."""

    source: str
    target: str
    step: int | None
    """``None``: nothing restorable to move (the job restarts from scratch there)."""
    bytes: int
    seconds: float


def current_region(home: Path, job_id: int) -> str | None:
    """``provider/region`` the job's checkpoints are in, from where its link points."""
    link = checkpoints_dir(home, job_id)
    if not link.is_symlink():
        return None
    parts = Path(os.readlink(link)).parts
    return f"{parts[-3]}/{parts[-2]}" if len(parts) >= 3 else None


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def place_checkpoints(home: Path, job_id: int, region: str) -> Move | None:
    """Make ``region`` hold the job's checkpoints and point its link there; the move, if one was made.

    The newest restorable checkpoint of the region the job leaves is copied into a temporary folder
    of the new region, verified there (every file's sha256 against its manifest) and renamed into
    place. A checkpoint that fails verification is never installed: the copy is removed and the
    error raised (the job stays queued; the next try copies again).
    """
    target = region_dir(home, region, job_id)
    target.mkdir(parents=True, exist_ok=True)
    link = checkpoints_dir(home, job_id)
    previous = current_region(home, job_id)
    move: Move | None = None
    if previous is None and link.is_dir() and not link.is_symlink():
        previous_dir: Path | None = link  # checkpoints written before the fleet was in use
        previous = "local"
    else:
        previous_dir = region_dir(home, previous, job_id) if previous is not None else None
    if previous_dir is not None and previous_dir.resolve() != target.resolve():
        started = time.monotonic()
        info, _ = CheckpointDir(previous_dir).latest()
        step, size = None, 0
        if info is not None:
            staging = target / f".tmp-move-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            tmp = staging / step_dirname(info.step)  # verified under its own name, as a restore reads it
            shutil.copytree(info.path, tmp, symlinks=True)
            dest = CheckpointDir(target)
            try:
                dest.verify(tmp)
                size = _folder_bytes(tmp)
                dest.install(tmp, info.step)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            dest.drop_after(info.step)  # a newer folder left from an earlier stay here is not this job's past
            step = info.step
        move = Move(previous or "local", region, step, size, time.monotonic() - started)
        if previous == "local" and link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp_link = link.with_name(f".checkpoints.{os.getpid()}")
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(target)
    os.replace(tmp_link, link)
    return move


__all__ = [
    "Marks",
    "Move",
    "Placed",
    "active_fleet",
    "check_fits",
    "current_region",
    "drop_fleet",
    "explain_choice",
    "failover_file",
    "fleet_dir",
    "fleet_file",
    "mark",
    "marks_file",
    "matches",
    "place_checkpoints",
    "placed_from",
    "planning_name",
    "planning_spec",
    "read_failover",
    "read_marks",
    "region_dir",
    "use_fleet",
    "write_failover",
]
