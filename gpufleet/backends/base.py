"""The backend interface and its registry.

A backend turns a JobSpec into attempts on some scheduler and reports what happened in the
state store; everything above it (CLI, cost, notes) reads the store, so every backend is priced
and shown the same way.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, TypeVar

from gpufleet.errors import UsageError
from gpufleet.paths import job_dir, private_dir
from gpufleet.runtime.events import read_events_checked
from gpufleet.runtime.protocol import check_environment
from gpufleet.spec import JobSpec
from gpufleet.store import Job, Store

B = TypeVar("B", bound="type[Backend]")
_REGISTRY: dict[str, type[Backend]] = {}


class Backend(ABC):
    """Submit, preempt and cancel jobs; states and events land in the store."""

    name: ClassVar[str]

    def __init__(self, home: Path) -> None:
        self.home = home

    @abstractmethod
    def submit(self, spec: JobSpec, env: dict[str, str] | None = None) -> int:
        """Queue a job; return its id."""

    @abstractmethod
    def preempt(self, job_id: int, grace: float | None = None) -> None:
        """SIGTERM the running attempt, SIGKILL after ``grace``, then requeue the job."""

    @abstractmethod
    def cancel(self, job_id: int) -> None:
        """Stop the job for good."""


def add_job_folder(
    store: Store, home: Path, spec: JobSpec, backend: str, env: dict[str, str] | None
) -> tuple[int, Path]:
    """Record a submitted job and lay out its folder (``logs/``, ``spec.json``); its id and folder.

    The ``GPUFLEET_*`` variables the job will see are checked first (a bad one is a usage error
    here, not a scheduler or a job that dies later). The folder is private to its owner: a spec's
    ``env`` may hold tokens.
    """
    check_environment({**os.environ, **(env or {})})
    job_id = store.add_job(spec, backend, env)
    folder = job_dir(home, job_id)
    private_dir(folder.parent)
    private_dir(folder)
    (folder / "logs").mkdir(mode=0o700, exist_ok=True)
    fd = os.open(folder / "spec.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(spec.model_dump_json(indent=2))
    return job_id, folder


def ingest_events(store: Store, home: Path, job: Job) -> None:
    """Move new lines of the job's runtime event log into the store (from its saved offset).

    The log is written by user code: a line that is not a valid event is left out and reported
    as one ``events_rejected`` warning per read, never allowed to stop the scheduler.
    """
    events, rejected, offset = read_events_checked(job_dir(home, job.id) / "events.jsonl", job.events_offset)
    if offset != job.events_offset:
        store.add_runtime_events(job.id, events, offset)
    if rejected:
        first = rejected[0]
        store.add_event(
            job.id,
            "events_rejected",
            lines=len(rejected),
            offset=first.offset,
            reason=first.reason,
            preview=first.preview,
        )


def register(name: str) -> Callable[[B], B]:
    def deco(cls: B) -> B:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_backend(name: str, home: Path) -> Backend:
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown backend {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}") from None
    return cls(home)
