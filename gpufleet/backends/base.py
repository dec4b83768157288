"""The backend interface and its registry.

A backend turns a JobSpec into attempts on some scheduler and reports what happened in the
state store; everything above it (CLI, cost, notes) reads the store, so every backend is priced
and shown the same way.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

from gpufleet.errors import Conflict, GpufleetError, ParameterError, StoreError, UsageError
from gpufleet.jobs.events import EventKind, read_events_checked
from gpufleet.jobs.protocol import check_environment
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import TERMINAL, Job, Store
from gpufleet.paths import events_file, job_dir, private_dir, state_db

if TYPE_CHECKING:  # the spec's models are built when a spec is first read
    from gpufleet.spec import JobSpec

B = TypeVar("B", bound="type[Backend]")
_REGISTRY: dict[str, type[Backend]] = {}


class Feature(enum.Enum):
    """What a backend may or may not support beyond submit, preempt and cancel (declared as data)."""

    PREEMPT_GRACE = "a grace time per preemption (--grace): this scheduler applies its own (Slurm's KillWait)"
    MULTI_RANK = "jobs of more than one rank (distributed: with gpus > 1)"
    MULTI_NODE = "jobs over more than one node (resources.nodes > 1)"
    RESIZE = (
        "changing a job's GPUs between attempts (gpufleet resize): its request to the scheduler is fixed at "
        "submission; cancel the job and submit its spec again with the new resources (the new job has a "
        "checkpoint folder of its own, so it starts from step 0)"
    )
    ELASTIC = (
        "elastic recovery (distributed.recovery: continue, survivors stepping short-handed): "
        "use recovery: wait or requeue"
    )
    HOLD = "holding a queued job back (gpufleet hold) and releasing it: cancel it and submit its spec again later"


MAX_RESOURCE = 1024
"""The most GPUs per node, and nodes, a spec accepts (the bounds of ``Resources``)."""


@dataclass(frozen=True, slots=True)
class Resize:
    """What ``Backend.resize`` changed: the job's spec before and after, and what happens next."""

    job_id: int
    state: str
    """The job's state when it was resized: a ``running`` job keeps its size until its next attempt."""
    before: JobSpec
    after: JobSpec

    @property
    def changed(self) -> bool:
        return self.before != self.after

    @property
    def distributed_dropped(self) -> bool:
        """The job was a group and is now one plain process (``one_process``: no ``distributed`` block)."""
        return self.before.distributed is not None and self.after.distributed is None

    @property
    def one_rank_group(self) -> bool:
        """The job was a group and is now a group of one rank: still started by its launcher (torchrun)."""
        return self.before.world_size > 1 and self.after.distributed is not None and self.after.world_size == 1


def resized_spec(spec: JobSpec, *, gpus: int, nodes: int | None, source: str, one_process: bool = False) -> JobSpec:
    """``spec`` with ``gpus`` per node on ``nodes`` (``None``: as it is), validated as a submitted spec is.

    A group resized to one GPU on one node stays a group of one rank (``distributed.one_rank``): its
    launcher (torchrun) still starts it, so a script that reads ``RANK`` or calls
    ``init_process_group()`` runs as before, it restores the group's sharded checkpoint resharded to
    one rank, and a later resize grows it back into a group that reshards what the one rank wrote.
    ``one_process`` drops the ``distributed`` block instead (one plain process, still given torchrun's
    variables by ``job_environment``); a later resize cannot bring the block back: a single
    process writes single-process checkpoints, which a group cannot reshard.
    """
    if not 0 <= gpus <= MAX_RESOURCE:
        raise ParameterError(
            "{gpus} is invalid: give the GPUs per node, from 0 to {most!s}", gpus=gpus, most=MAX_RESOURCE
        )
    if nodes is not None and not 1 <= nodes <= MAX_RESOURCE:
        raise ParameterError(
            "{nodes} is invalid: give the number of nodes, from 1 to {most!s}", nodes=nodes, most=MAX_RESOURCE
        )
    nodes = spec.resources.nodes if nodes is None else nodes
    if spec.distributed is None and nodes > 1:
        raise ParameterError(
            "{nodes}: this job is one process (it has no `distributed` block), which runs on one node; "
            "keep {nodes:name} 1, or submit the job again with a `distributed` block",
            nodes=nodes,
        )
    world = nodes * max(gpus, 1)
    if one_process and spec.distributed is not None and world > 1:
        raise ParameterError(
            "{gpus} on {nodes!s} node(s) is a world of {world!s} ranks, but {one_process:name} runs the job as "
            "one process: give {gpus:name} 1 on one node with it, or leave {one_process:name} out",
            gpus=gpus,
            nodes=nodes,
            world=world,
            one_process=True,
        )
    fields = spec.model_dump()
    fields["resources"] = {**fields["resources"], "gpus": gpus, "nodes": nodes}
    if spec.distributed is not None and world < 2:
        fields["distributed"] = None if one_process else {**fields["distributed"], "one_rank": True}
    from gpufleet.spec import parse_spec

    return parse_spec(fields, source=source)


class Backend(ABC):
    """Submit, preempt, cancel and resize jobs; states and events land in the store.

    The public methods hold the guards every backend needs (the job exists, is this backend's,
    has not ended, is running before a preemption, the grace is valid and supported, a resized
    spec validates and is one this backend runs; a submit the scheduler refuses leaves nothing
    behind) and call the hooks: subclasses override the hooks, not these methods.
    """

    name: ClassVar[str]
    features: ClassVar[frozenset[Feature]] = frozenset()

    def __init__(self, home: Path) -> None:
        self.home = home
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        """The state store, opened (and created) on first use: a submit refused before then writes nothing."""
        if self._store is None:
            self._store = Store(state_db(self.home))
        return self._store

    @store.setter
    def store(self, store: Store) -> None:
        self._store = store

    # ---- the contract -----------------------------------------------------------------------
    def submit(self, spec: JobSpec, env: dict[str, str] | None = None) -> int:
        """Queue a job; return its id. A refused job leaves no row and no folder.

        What needs no scheduler (the features, the job's ``GPUFLEET_*`` variables, the data tools) is
        refused before the store is opened, so a submit refused for it leaves a new home as it was.
        """
        if spec.world_size > 1:
            self.require(Feature.MULTI_RANK)
        if spec.resources.nodes > 1:
            self.require(Feature.MULTI_NODE)
        if spec.recovery == "continue":
            self.require(Feature.ELASTIC)
        check_submittable(spec, env)
        spec = self._admit(spec, env)
        fresh = [p for p in (self.home, self.home / "jobs", state_db(self.home)) if not os.path.lexists(p)]
        job_id, folder = add_job_folder(self.store, self.home, spec, self.name, env)
        try:
            self._start(job_id, folder, spec)
        except GpufleetError:
            self.store.delete_job(job_id)
            shutil.rmtree(folder, ignore_errors=True)
            self._undo_fresh(fresh)
            raise
        return job_id

    def _undo_fresh(self, fresh: list[Path]) -> None:
        """Remove what a refused submit created in a home that lacked it (a store holding no job, empty folders)."""
        db = state_db(self.home)
        if db in fresh and self._store is not None and not self._store.jobs():
            self._store.close()
            self._store = None
            for suffix in ("", "-wal", "-shm", ".sound"):
                path = db.with_name(db.name + suffix)
                with contextlib.suppress(OSError):
                    path.unlink()
        for path in fresh[::-1]:
            if path != db:
                with contextlib.suppress(OSError):
                    path.rmdir()  # only when empty

    def preempt(self, job_id: int, grace: float | None = None) -> None:
        """SIGTERM the running attempt, SIGKILL after ``grace``, then requeue the job."""
        if grace is not None:
            if not (math.isfinite(grace) and grace > 0):
                raise ParameterError("{grace} is invalid: give a positive number of seconds", grace=grace)
            self.require(Feature.PREEMPT_GRACE)
        job = self.active(job_id)
        if job.state != JobState.RUNNING:
            raise Conflict(f"job {job_id} is {job.state}, not running: only a running job can be preempted")
        self._preempt(job, grace)

    def cancel(self, job_id: int) -> None:
        """Stop the job for good."""
        self._cancel(self.active(job_id))

    def hold(self, job_id: int) -> None:
        """Keep a queued job from starting until :meth:`release` (a ``held`` event; its reason says so)."""
        self.require(Feature.HOLD)
        job = self.active(job_id)
        if job.state != JobState.QUEUED:
            raise Conflict(
                f"job {job_id} is {job.state}, not queued: only a queued job can be held (preempt it, then hold it)"
            )
        self._hold(job, held=True)

    def release(self, job_id: int) -> None:
        """Let a held job be started again, in its turn."""
        self.require(Feature.HOLD)
        job = self.active(job_id)
        if not self._held(job):
            raise Conflict(f"job {job_id} is not held: nothing to release")
        self._hold(job, held=False)

    def resize(self, job_id: int, gpus: int, nodes: int | None = None, *, one_process: bool = False) -> Resize:
        """Give the job ``gpus`` per node on ``nodes`` from its next attempt on (``resized`` event).

        A group resized to one rank stays a group (torchrun with one rank), unless ``one_process``
        (see :func:`resized_spec`).

        A queued job starts at the new size; a running one keeps its GPUs until its attempt ends
        (a preemption ends it now). What lets the job resume on another world size is its
        checkpoints: sharded ones reshard (``runtime.sharded``). The new spec is refused as a
        submitted one would be (it must validate, and this backend must run it), and is written
        only if the job has neither ended nor been resized meanwhile (``Store.replace_spec``).
        """
        self.require(Feature.RESIZE)
        job = self.active(job_id)
        spec = resized_spec(job.spec, gpus=gpus, nodes=nodes, source=f"job {job_id} resized", one_process=one_process)
        done = Resize(job.id, job.state, job.spec, spec)
        if not done.changed:
            return done
        if spec.world_size > 1:
            self.require(Feature.MULTI_RANK)
        if spec.resources.nodes > 1:
            self.require(Feature.MULTI_NODE)
        spec = self._resize(job, spec)
        self.store.replace_spec(
            job.id,
            job.spec,
            spec,
            "resized",
            old_gpus=job.spec.total_gpus,
            new_gpus=spec.total_gpus,
            old_world_size=job.spec.world_size,
            new_world_size=spec.world_size,
            distributed_dropped=done.distributed_dropped,
            one_rank_group=done.one_rank_group,
        )
        return Resize(job.id, job.state, job.spec, spec)

    def sync(self) -> None:
        """Bring the store up to date with the scheduler (nothing to do where it writes the store itself)."""
        return None

    def active(self, job_id: int) -> Job:
        """The job, as fresh as the backend can make it.

        ``NotFound`` for an unknown id, ``UsageError`` when it is another backend's, ``Conflict`` when it has ended.
        """
        job = self.store.job(job_id)
        if job.backend != self.name:
            raise UsageError(f"job {job_id} runs on the {job.backend} backend, not {self.name}")
        if job.state not in TERMINAL:
            job = self._refresh(job)
        if job.state in TERMINAL:
            raise Conflict(f"job {job_id} is already {job.state}")
        return job

    def require(self, feature: Feature) -> None:
        """Refuse what this backend cannot do, instead of ignoring it."""
        if feature not in self.features:
            raise UsageError(f"the {self.name} backend does not support {feature.value}")

    # ---- hooks ------------------------------------------------------------------------------
    def _admit(self, spec: JobSpec, env: dict[str, str] | None) -> JobSpec:
        """Check the job fits before anything is written; the spec to store."""
        return spec

    @abstractmethod
    def _start(self, job_id: int, folder: Path, spec: JobSpec) -> None:
        """Hand the recorded job to the scheduler (a ``GpufleetError`` undoes the submit)."""

    def _hold(self, job: Job, *, held: bool) -> None:
        """Hold or release a job (backends that declare :attr:`Feature.HOLD`)."""
        raise UsageError(f"the {self.name} backend does not support {Feature.HOLD.value}")

    def _held(self, job: Job) -> bool:
        return False

    @abstractmethod
    def _preempt(self, job: Job, grace: float | None) -> None:
        """Preempt a running job (its grace already checked)."""

    @abstractmethod
    def _cancel(self, job: Job) -> None:
        """Cancel a job that has not ended."""

    def _resize(self, job: Job, spec: JobSpec) -> JobSpec:
        """Check the resized spec fits this scheduler before it is written; the spec to store.

        Called only on backends with ``Feature.RESIZE``; the new spec applies from the job's next
        attempt, which the backend starts from the stored spec.
        """
        return spec

    def _refresh(self, job: Job) -> Job:
        """The job as the scheduler sees it now (default: as stored)."""
        return job


def check_submittable(spec: JobSpec, env: dict[str, str] | None) -> None:
    """Refuse a job whose ``GPUFLEET_*`` variables (those it will see) are bad, or whose data tools are missing.

    A bad one is a usage error at submission, not a scheduler or a job that dies later.
    """
    check_environment({**os.environ, **(env or {})})
    if spec.data is not None:
        from gpufleet.spec.sources import check_installed

        check_installed(spec.data)


def add_job_folder(
    store: Store, home: Path, spec: JobSpec, backend: str, env: dict[str, str] | None
) -> tuple[int, Path]:
    """Record a submitted job and lay out its folder (``logs/``, ``spec.json``); its id and folder.

    The caller has checked the job (:func:`check_submittable`) before it opened ``store``. The folder
    is private to its owner: a spec's ``env`` may hold tokens.
    """
    job_id = store.add_job(spec, backend, env)
    folder = job_dir(home, job_id)
    private_dir(folder.parent)
    private_dir(folder)
    try:
        (folder / "logs").mkdir(mode=0o700, exist_ok=True)
        write_spec_file(folder, spec)
    except OSError as err:
        store.delete_job(job_id)
        shutil.rmtree(folder, ignore_errors=True)
        raise StoreError(f"cannot lay out {folder}: {err.strerror}; free some space or fix its permissions") from None
    return job_id, folder


def write_spec_file(folder: Path, spec: JobSpec) -> bool:
    """Make ``folder/spec.json`` hold ``spec`` (what an attempt reads via ``GPUFLEET_SPEC``); whether it changed.

    Written whole or not at all (temp file, fsync, rename): the ranks of an attempt each read it
    as they start, and must never see half a file. The store's copy is the authority; a backend
    whose jobs can be resized calls this with the stored spec just before it starts an attempt,
    so the file and the attempt agree (see ``LocalScheduler._launch``).
    """
    path = folder / "spec.json"
    text = spec.model_dump_json(indent=2)
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8") == text:
            return False
    tmp = folder / f".spec.json.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return True


def ingest_events(store: Store, home: Path, job: Job) -> None:
    """Move new lines of the job's runtime event log into the store (from its saved offset).

    The log is written by user code: a line that is not a valid event is left out and reported
    as one ``events_rejected`` warning per read, never allowed to stop the scheduler.
    """
    events, rejected, offset = read_events_checked(events_file(home, job.id), job.events_offset)
    if offset != job.events_offset:
        store.add_runtime_events(job.id, events, offset)
    if rejected:
        first = rejected[0]
        store.add_event(
            job.id,
            EventKind.EVENTS_REJECTED,
            lines=len(rejected),
            offset=first.offset,
            reason=first.reason,
            preview=first.preview,
        )


def register(name: str) -> Callable[[B], B]:
    """Class decorator: make a backend available as ``--backend NAME``; a name is taken once."""

    def deco(cls: B) -> B:
        taken = _REGISTRY.get(name)
        # The same class defined again (its module run as __main__, or reloaded) is not a clash.
        if taken is not None and taken.__qualname__ != cls.__qualname__:
            raise ValueError(f"backend name {name!r} is already registered by {taken.__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def registered() -> dict[str, type[Backend]]:
    """Every backend by name (a copy)."""
    return dict(_REGISTRY)


def get_backend(name: str, home: Path) -> Backend:
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown backend {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}") from None
    return cls(home)


__all__ = [
    "MAX_RESOURCE",
    "B",
    "Backend",
    "Feature",
    "Resize",
    "add_job_folder",
    "check_submittable",
    "get_backend",
    "ingest_events",
    "register",
    "registered",
    "resized_spec",
    "write_spec_file",
]
