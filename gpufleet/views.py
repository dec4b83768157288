"""The objects gpufleet reports, built once for the CLI's ``--json`` and the server's ``/api/``.

Each function returns plain JSON-ready data: ``gpufleet jobs --json`` prints :func:`jobs_view`,
``gpufleet show ID --json`` :func:`job_view`, ``gpufleet fleet show --json`` :func:`fleet_status`,
and ``gpufleet serve`` answers ``GET /api/jobs``, ``/api/jobs/{id}`` and ``/api/fleet`` with the very same.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.backends.pools import active_fleet, matches, read_failover, read_marks
from gpufleet.cost.usage import attempt_gpus
from gpufleet.errors import UsageError
from gpufleet.jobs.events import NOTABLE, EventKind
from gpufleet.jobs.store import Job, Store, latest_step
from gpufleet.outfiles import read_tail_fd
from gpufleet.paths import attempt_log, checkpoints_dir, state_db
from gpufleet.rl.report import summarize as summarize_rl
from gpufleet.runtime.checkpoint import CheckpointDir

if TYPE_CHECKING:
    from gpufleet.spec import JobSpec
    from gpufleet.telemetry import DiagnosisConfig, Finding


def job_summary(store: Store, job: Job) -> dict[str, Any]:
    attempts = store.attempts(job.id)
    spec = job.spec
    placed = store.last_event(job.id, EventKind.PLACED)
    offer = placed.data.get("offer") if placed is not None else None
    return {
        "id": job.id,
        "name": job.name,
        "team": job.team,
        "priority": job.priority,
        "state": job.state,
        "reason": job.reason,
        "backend": job.backend,
        "gpu_type": str(placed.data.get("gpu_type") or spec.resources.gpu_type) if placed else spec.resources.gpu_type,
        "gpus": spec.resources.gpus,
        "nodes": spec.resources.nodes,
        "world_size": spec.world_size,
        "strategy": spec.distributed.strategy if spec.distributed is not None else None,
        "provider": spec.provider,
        "offer": offer if isinstance(offer, str) else None,
        "spot": spec.spot,
        "attempts": len(attempts),
        "restarts": job.restarts,
        "step": latest_step(store, job.id),
        "submitted_at": job.submitted_at,
        "updated_at": job.updated_at,
    }


def log_view(store: Store, home: Path, job_id: int, attempt: int | None, max_bytes: int) -> dict[str, Any]:
    """The end of an attempt's log (``logs --json``), at most ``max_bytes``; ``size`` is the whole file's.

    The log is read only as a regular file reached through real folders (:func:`_log_tail`): a job's own
    code, which may write under ``jobs/<id>/``, cannot make this (or the server) show another file.
    """
    attempts = store.attempts(store.job(job_id).id)
    if not attempts:
        raise UsageError(f"job {job_id} has not started yet: no logs")
    n = attempt or attempts[-1].n
    if not 1 <= n <= len(attempts):
        raise UsageError(f"job {job_id} has {len(attempts)} attempt(s); --attempt {n} does not exist")
    path = attempt_log(home, job_id, n)
    text, size = "", 0
    if os.path.lexists(path):
        tail = _log_tail(path, max_bytes)
        if tail is None:
            raise UsageError(
                f"cannot read {path}: not a regular file in a real folder (a link, a device or a FIFO); "
                "remove it: the attempt's log is written there as a plain file"
            )
        text, size = tail[0].decode("utf-8", errors="replace"), tail[1]
    return {"id": job_id, "attempt": n, "path": str(path), "log": text, "size": size}


def _log_tail(path: Path, max_bytes: int) -> tuple[bytes, int] | None:
    """The last ``max_bytes`` of the log ``path`` (``.../jobs/<id>/logs/attempt-N.log``) and its size; None
    unless the job's folder and ``logs`` are real folders and the log a regular file, none of them a link.

    What the job's code may write (its own folder) is opened part by part with ``O_NOFOLLOW``, each
    relative to the one above, so a link swapped in between two checks is refused too; ``jobs`` and the
    home above it are the operator's and may be links. The log is opened without blocking (a FIFO is
    never waited on) and read only if it is a regular file.
    """
    parts = path.parts[-3:]
    fds: list[int] = []
    try:
        fds.append(os.open(path.parents[2], os.O_RDONLY | os.O_DIRECTORY))
        for part in parts[:-1]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        fds.append(os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=fds[-1]))
        return read_tail_fd(fds[-1], max_bytes)
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


def job_diagnosis(home: Path, job: Job, config: DiagnosisConfig) -> tuple[str, list[Finding], list[str]]:
    """What holds ``job`` back (``gpufleet diagnose``): GPU findings from its own GPU series and, for a
    distributed job, the ranks' findings; with the source described and notes on what could not be judged."""
    from gpufleet.jobs.events import iter_events
    from gpufleet.paths import events_file, job_dir
    from gpufleet.telemetry import JobContext, diagnose, series_from_samples
    from gpufleet.telemetry.gpu import job_gpu_samples
    from gpufleet.telemetry.ranks import rank_findings

    samples = job_gpu_samples(job_dir(home, job.id))
    telemetry = job.spec.telemetry
    ranked = rank_findings(iter_events(events_file(home, job.id))) if job.spec.world_size > 1 else []
    if not samples and job.spec.world_size > 1:
        source = f"job {job.id} {job.name}: {job.spec.world_size} ranks, no GPU series"
        note = f"no GPU series (telemetry.gpu_source is {telemetry.gpu_source!r}): only the ranks were judged"
        return source, ranked, [note]
    if not samples:
        raise UsageError(
            f"job {job.id} has no GPU series (telemetry.gpu_source is {telemetry.gpu_source!r}); set "
            "telemetry.gpu_source to nvml, scrape:<url> or synthetic:<pattern> in its spec"
        )
    attempts = sorted({s.labels.get("attempt", "?") for s in samples})
    gpus = sorted({s.labels.get("gpu", "?") for s in samples}, key=lambda g: (len(g), g))
    series = series_from_samples(samples)
    source = (
        f"job {job.id} {job.name}: {len(gpus)} GPU(s), {len(attempts)} attempt(s), "
        f"{series.duration_s:.0f} s of GPU series"
    )
    findings = ranked + diagnose(series, JobContext(precision=telemetry.precision), config)
    notes = []
    if series.duration_s < config.min_duration_s:
        notes.append(
            f"the series cover {series.duration_s:.0f} s, less than the {config.min_duration_s:g} s a condition "
            "must hold; lower --min-duration (and --window) to judge a short job"
        )
    return source, findings, notes


def jobs_view(store: Store | None, *, team: str | None = None, state: str | None = None) -> dict[str, Any]:
    """``{"jobs": [...]}``: every job (of ``team``, in ``state``) as :func:`job_summary`."""
    found = [] if store is None else store.jobs(team=team, states=(state,) if state else None)
    return {"jobs": [job_summary(store, j) for j in found if store is not None]}


ENV_SET = "set"
"""What :func:`spec_view` shows in place of each ``env`` value."""


def spec_view(spec: JobSpec, *, reveal_env: bool = False) -> dict[str, Any]:
    """A job's spec as JSON, with its ``env`` values replaced by ``"set"`` (names kept) unless ``reveal_env``.

    The env is where a job's tokens and passwords go: ``show --json`` and the server's API print the
    same object, and neither should hand those values to whoever reads the output.
    """
    out = spec.model_dump()
    if not reveal_env:
        out["env"] = dict.fromkeys(spec.env, ENV_SET)
    return out


def job_view(store: Store, home: Path, job_id: int, *, reveal_env: bool = False) -> dict[str, Any]:
    """One job: its summary, spec, attempts, notable events, checkpoints and RL figures (``show --json``).

    The spec's ``env`` values are ``"set"`` unless ``reveal_env`` (:func:`spec_view`)."""
    job = store.job(job_id)
    summary = job_summary(store, job)
    starts = store.events(job_id, (EventKind.ATTEMPT_START, EventKind.RESIZED))
    attempts = [
        {
            "attempt": a.n,
            "outcome": a.outcome or a.state,
            "pid": a.pid,
            "gpus": attempt_gpus(job, a, starts),
            "started_at": a.started_at,
            "ended_at": a.ended_at,
            "exit_code": a.exit_code,
        }
        for a in store.attempts(job_id)
    ]
    events = [{"ts": e.ts, "attempt": e.attempt, "kind": e.kind, **e.data} for e in store.events(job_id, NOTABLE)]
    rl = summarize_rl({"kind": e.kind, "attempt": e.attempt, **e.data} for e in store.events(job_id, (EventKind.RL,)))
    ckpts = [
        {
            "step": i.step,
            "path": str(i.path),
            "healthy": i.manifest.healthy if i.manifest else None,
            "problem": i.problem,
        }
        for i in CheckpointDir(checkpoints_dir(home, job_id)).scan(verify=False)
    ]
    return {
        **summary,
        "spec": spec_view(job.spec, reveal_env=reveal_env),
        "attempts": attempts,
        "events": events,
        "checkpoints": ckpts,
        "rl": rl,
    }


def running_on(home: Path) -> dict[str, list[int]]:
    """Offer -> the jobs whose latest attempt was placed there and still runs."""
    if not state_db(home).exists():
        return {}
    store = Store(state_db(home))
    where: dict[str, list[int]] = {}
    for job in store.jobs(states=("running",)):
        placed = store.last_event(job.id, EventKind.PLACED)
        if placed is not None and isinstance(placed.data.get("offer"), str):
            where.setdefault(placed.data["offer"], []).append(job.id)
    return where


def fleet_status(home: Path) -> dict[str, Any]:
    fleet = active_fleet(home)
    if fleet is None:
        return {"fleet": None}
    marks = read_marks(home)
    now = time.time()
    seconds, hours = marks.seconds(now), marks.seconds(now) / 3600
    blocks = read_failover(home, fleet).active(hours)
    running = running_on(home)
    pools = []
    for o in fleet.catalog.offers:
        outage = fleet.outage(o.key, seconds)
        down = [t for t in marks.down if matches(t, o.key)]
        blocked = [b.to_dict() for b in blocks if matches(b.target, o.key)]
        state = "down" if down or outage is not None else "blocked" if blocked else "up"
        pools.append(
            {
                "offer": o.key,
                "slots": o.capacity_gpus,
                "on_demand_per_gpu_hour": o.on_demand_per_gpu_hour,
                "spot_per_gpu_hour": o.spot_per_gpu_hour,
                "state": state,
                "storm_per_hour": fleet.storm_rate(o.key, seconds),
                "jobs": running.get(o.key, []),
                "blocks": blocked,
            }
        )
    quotas = [q.model_dump() for q in fleet.catalog.quotas]
    return {
        "fleet": str(home / "fleet" / "fleet.yaml"),
        "seconds": seconds,
        "down": marks.down,
        "pools": pools,
        "quotas": quotas,
        "failover": fleet.failover.model_dump(),
    }


__all__ = [
    "ENV_SET",
    "fleet_status",
    "job_diagnosis",
    "job_summary",
    "job_view",
    "jobs_view",
    "log_view",
    "running_on",
    "spec_view",
]
