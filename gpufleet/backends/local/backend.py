"""The local backend's client side: it writes jobs and requests to the store and makes sure a scheduler runs.

Every decision about attempts is the scheduler's (``scheduler.py``); this side checks that a job
fits (the scheduler's slots, or the fleet's pools), records it, and wakes the scheduler. It reaches
the scheduler process through the ``process`` module's functions, looked up when called
(``process.ensure_scheduler``), so a test replaces the launch in one place.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from gpufleet.backends.base import Backend, Feature, register
from gpufleet.backends.local import process
from gpufleet.backends.pools import active_fleet, check_fits
from gpufleet.errors import Conflict, ParameterError, UsageError
from gpufleet.estimate.memory import estimate_memory
from gpufleet.extras import missing_extra
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Job
from gpufleet.paths import hold_file
from gpufleet.paths import scheduler_pid as pid_file
from gpufleet.runtime.memtier.peer import ENV_PEER
from gpufleet.runtime.memtier.release import need_words, room, tier_need_bytes
from gpufleet.runtime.memtier.shm import shm_root
from gpufleet.spec import JobSpec

TINYLM = "gpufleet.workloads.tinylm:train"
TINYLM_DEFAULTS = {"layers": 2, "embed": 128, "context": 64}
"""``workloads.tinylm.train``'s defaults of the arguments that size its model."""


def tinylm_params(args: dict[str, object]) -> int | None:
    """At least the parameters of ``workloads.tinylm``'s model (``None``: arguments it cannot read).

    Position embedding ``context·E``, per block ``12·E² + 13·E`` (qkv and projection, the 4x MLP,
    their biases, two LayerNorms) and the final LayerNorm; the token embedding and the head are
    left out (the vocabulary is the corpus's), so the count is a lower bound: a refusal is sure.
    """
    sizes: dict[str, int] = {}
    for name, default in TINYLM_DEFAULTS.items():
        value = args.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 20:
            return None
        sizes[name] = value
    embed, layers, context = sizes["embed"], sizes["layers"], sizes["context"]
    return context * embed + layers * (12 * embed * embed + 13 * embed) + 2 * embed


def memory_state_bytes(spec: JobSpec) -> int | None:
    """Bytes of one rank's memory copy (fp32 weights and AdamW's two moments, ZeRO's 4Ψ + 8Ψ), or ``None``.

    Known for the built-in workloads the estimate can size; any other entrypoint is checked by the
    runtime at its first snapshot instead.
    """
    params = tinylm_params(dict(spec.args)) if spec.entrypoint == TINYLM else None
    if params is None:
        return None
    estimate = estimate_memory(params, 1, "ddp", precision="fp32")
    return estimate.params_bytes + estimate.optimizer_bytes


def check_memory_tier_fits(spec: JobSpec, env: Mapping[str, str]) -> None:
    """Refuse a job whose ``checkpoint.memory`` cannot fit this host's shared memory or RAM (the runtime's rule).

    Each rank of the host keeps up to 4 files in ``/dev/shm`` (``runtime.memtier.release.tier_need_bytes``) and,
    with the job's own keeper, 2 more copies in RAM.
    """
    memory = spec.checkpoint.memory
    state_bytes = memory_state_bytes(spec) if memory is not None else None
    if memory is None or state_bytes is None:
        return
    own_keeper = memory.peer and not env.get(ENV_PEER, "").strip()
    need, need_ram = tier_need_bytes(state_bytes, spec.ranks_per_node, own_keeper=own_keeper)
    free, available = room(shm_root(env))
    if free >= need and available >= need_ram:
        return
    raise UsageError(
        f"checkpoint.memory needs {need} bytes of shared memory ({free} free) and {need_ram} of RAM "
        f"({available} available): {need_words(state_bytes, spec.ranks_per_node)}; "
        "remove checkpoint.memory, or free /dev/shm and memory"
    )


def check_elastic_installed(spec: JobSpec) -> None:
    """Refuse ``distributed.recovery: continue`` where torchft is not installed: its replicas could not start.

    Looked up, not imported (torchft imports torch): the job's own processes import it.
    """
    if spec.recovery == "continue" and importlib.util.find_spec("torchft") is None:
        raise missing_extra("torchft", "elastic", "distributed.recovery: continue")


@register("local")
class LocalBackend(Backend):
    """Client side: writes jobs and requests to the store and makes sure a scheduler runs."""

    features = frozenset({Feature.PREEMPT_GRACE, Feature.MULTI_RANK, Feature.RESIZE, Feature.HOLD, Feature.ELASTIC})
    """One host: a job of several ranks runs them all here (one slot each); never several nodes. Each
    attempt is launched from the job's stored spec, so a resized job simply starts its next one bigger
    or smaller."""

    def __init__(self, home: Path, *, spawn: bool = True) -> None:
        super().__init__(home)
        self.spawn = spawn

    def _admit(self, spec: JobSpec, env: dict[str, str] | None) -> JobSpec:
        check_elastic_installed(spec)
        check_memory_tier_fits(spec, {**os.environ, **(env or {})})
        fleet = active_fleet(self.home)
        if fleet is not None:
            check_fits(spec, fleet)
            return spec
        slots, running = process.scheduler_slots(self.home)
        if process.slots_of(spec) > slots:
            raise UsageError(
                f"resources.gpus={spec.resources.gpus} exceeds the local backend's {slots} virtual GPU slot(s)"
                + (f" (those of its running scheduler, {process.restart_hint(running)})" if running else "")
                + "; lower it or set GPUFLEET_LOCAL_SLOTS"
            )
        return spec

    def _start(self, job_id: int, folder: Path, spec: JobSpec) -> None:
        if self.spawn:  # a scheduler already running keeps its environment: say so when it differs
            note = process.settings_drift(self.home, os.environ)
            if note is not None:
                print(note, file=sys.stderr, flush=True)
        self._wake()

    def _resize(self, job: Job, spec: JobSpec) -> JobSpec:
        slots, running = process.scheduler_slots(self.home)
        if process.slots_of(spec) > slots:
            raise ParameterError(
                "{gpus} exceeds the local backend's {slots!s} virtual GPU slot(s){where!s}: "
                "give {slots!s} or fewer, or set GPUFLEET_LOCAL_SLOTS",
                gpus=spec.resources.gpus,
                slots=slots,
                where=f" (those of its running scheduler, {process.restart_hint(running)})" if running else "",
            )
        return spec

    def _preempt(self, job: Job, grace: float | None) -> None:
        self.store.add_request(job.id, "preempt", grace)
        self._wake()

    def _cancel(self, job: Job) -> None:
        self.store.add_request(job.id, "cancel")
        self._wake()

    def _held(self, job: Job) -> bool:
        return hold_file(self.home, job.id).exists()

    def _hold(self, job: Job, *, held: bool) -> None:
        marker = hold_file(self.home, job.id)
        if held:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            if self.store.job(job.id).state != "queued":  # the scheduler started it meanwhile
                marker.unlink(missing_ok=True)
                raise Conflict(f"job {job.id} started meanwhile: preempt it, then hold it")
            self.store.set_reason(job.id, "held: `gpufleet release` lets it start")
            self.store.add_event(job.id, EventKind.HELD)
        else:
            marker.unlink(missing_ok=True)
            self.store.set_reason(job.id, None)
            self.store.add_event(job.id, EventKind.RELEASED)
            self._wake()

    def _wake(self) -> None:
        if self.spawn:
            process.ensure_scheduler(self.home)

    def sync(self) -> None:
        """The scheduler writes the store itself; if it died with jobs to run, start a new one and say so."""
        died = pid_file(self.home).exists()  # a scheduler that exits cleanly removes it
        if self.spawn and died and self.store.has_active(self.name) and process.scheduler_pid(self.home) is None:
            process.ensure_scheduler(self.home)
            raise UsageError(
                f"the local scheduler of {self.home} was not running (it died?); a new one was started "
                "and recovers its jobs"
            )


__all__ = ["LocalBackend"]
