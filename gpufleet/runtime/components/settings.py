"""What a backend exported to an attempt (``GPUFLEET_*``), read into the settings of one session.

``TrainSession.from_env`` is the only caller. Reading the environment in one place keeps the order
that matters here: every value that can be refused (the preemption rate, the price) is checked
before the event log opens its file, so a bad value leaves nothing behind.

Imports: ``gpufleet.spec``, the event log, ``runtime.group``, ``runtime.interval``, ``runtime.memtier``, and the
reporter's constructors of the GPU sampler and the exporters; nothing of the session.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from gpufleet.jobs.events import EventLog
from gpufleet.runtime.components.reporter import (
    gpu_sampler_from_env,
    job_peak_flops,
    listeners_from_env,
    price_from_env,
)
from gpufleet.runtime.group import Group, current_group
from gpufleet.runtime.interval import PreemptionRate, rate_from
from gpufleet.runtime.memtier.tier import TierPlace, place_from_env
from gpufleet.spec import CheckpointPolicy, Distributed, HealthPolicy, JobSpec, Telemetry, parse_spec

if TYPE_CHECKING:
    from gpufleet.telemetry.gpu import GpuSampler

ENV_PREEMPT_AT = "GPUFLEET_DEBUG_PREEMPT_AT"
"""Debugging: behave as if SIGTERM arrived when the attempt's training reaches this step."""
ENV_PHASE_TIMING = "GPUFLEET_PHASE_TIMING"
"""``0`` leaves the model and optimizer without the phase hooks (``components.phases``; a baseline to measure them)."""
ENV_ROLLBACK_AT = "GPUFLEET_DEBUG_ROLLBACK_AT"
"""Debugging: once, after this step, roll back to the previous checkpoint and replay."""


class SessionArguments(TypedDict):
    """The arguments of ``TrainSession`` that the environment decides."""

    ckpt_dir: str
    policy: CheckpointPolicy
    health: HealthPolicy
    events: EventLog
    log_every_s: float
    peak_flops: float | None
    gpu_sampler: GpuSampler | None
    resume: str
    job: str | None
    group: Group
    agree_every: int
    preemption_rate: PreemptionRate | None
    memory: TierPlace | None
    phase_timing: bool
    straggler_factor: float
    hang: tuple[float, float]
    gpus_per_rank: int


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What the environment decides of a session: its arguments, and the faults a debugging run injects."""

    arguments: SessionArguments
    inject_preempt_at: int | None
    inject_rollback_at: int | None


def env_step(env: Mapping[str, str], name: str) -> int | None:
    """A step number of a debugging variable (``GPUFLEET_DEBUG_*_AT``), or ``None`` when unset."""
    raw = env.get(name)
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r} must be a step number of at least 1")
    return int(raw)


def _spec(env: Mapping[str, str]) -> JobSpec | None:
    if not env.get("GPUFLEET_SPEC"):
        return None
    path = Path(env["GPUFLEET_SPEC"])
    return parse_spec(json.loads(path.read_text(encoding="utf-8")), source=str(path))


def settings_from_env(env: Mapping[str, str], *, ckpt_dir: str | Path, resume: str | None) -> SessionSettings:
    """Under gpufleet: the job's spec, event log, checkpoint folder and exporters; run by hand: defaults.

    ``resume`` overrides the spec's (``GPUFLEET_RESUME`` overrides both).
    """
    spec = _spec(env)
    policy = spec.checkpoint if spec is not None else CheckpointPolicy()
    gpus = spec.total_gpus if spec is not None else 1
    telemetry = spec.telemetry if spec is not None else Telemetry()
    # Each value that can be refused is read before the event log opens its file.
    rate = rate_from(env, policy) if policy.every == "auto" else None
    ckpt_root = Path(env.get("GPUFLEET_CKPT_DIR", str(ckpt_dir)))
    memory = place_from_env(env, ckpt_root) if policy.memory is not None else None
    price = price_from_env(env)
    inject_preempt_at, inject_rollback_at = env_step(env, ENV_PREEMPT_AT), env_step(env, ENV_ROLLBACK_AT)
    group = current_group()
    events_path = env.get("GPUFLEET_EVENTS") if group.is_main else None
    # Under a plain sbatch script (not submitted by gpufleet), Slurm numbers the runs.
    attempt = int(env.get("GPUFLEET_ATTEMPT") or int(env.get("SLURM_RESTART_COUNT") or 0) + 1)
    events = EventLog(Path(events_path) if events_path else None, attempt=attempt)
    sampler = gpu_sampler_from_env(env, telemetry, gpus, attempt) if group.is_main else None
    gpu_type, provider = (spec.resources.gpu_type, spec.provider) if spec is not None else ("", "")
    if group.is_main:
        events.listeners.extend(
            listeners_from_env(
                env, gpu_type=gpu_type, provider=provider, attempt=attempt, sampler=sampler, gpus=gpus, price=price
            )
        )
    agree_every = 4 if spec is None else spec.distributed.agree_every if spec.distributed is not None else 1
    ranks = spec.distributed if spec is not None and spec.distributed is not None else Distributed()
    arguments = SessionArguments(
        ckpt_dir=str(ckpt_root),
        policy=policy,
        health=spec.health if spec is not None else HealthPolicy(),
        events=events,
        log_every_s=float(env.get("GPUFLEET_LOG_EVERY_S", "1.0")),
        peak_flops=job_peak_flops(gpu_type, gpus) if spec is not None else None,  # MFU counts every rank
        gpu_sampler=sampler,
        resume=env.get("GPUFLEET_RESUME") or resume or (spec.resume if spec is not None else "auto"),
        job=env.get("GPUFLEET_JOB_ID") or None,
        group=group,
        agree_every=agree_every,
        preemption_rate=rate,
        memory=memory,
        phase_timing=env.get(ENV_PHASE_TIMING, "1").strip().lower() not in ("0", "false", "no", "off"),
        straggler_factor=ranks.straggler_factor,
        hang=(ranks.hang_factor, ranks.hang_floor_seconds),
        gpus_per_rank=max(1, gpus // max(1, group.world_size)),
    )
    return SessionSettings(arguments, inject_preempt_at, inject_rollback_at)


__all__ = ["ENV_PHASE_TIMING", "SessionArguments", "SessionSettings", "env_step", "settings_from_env"]
