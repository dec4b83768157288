"""The backend interface and its registry.

A backend turns a JobSpec into attempts on some scheduler and reports what happened in the
state store; everything above it (CLI, cost, notes) reads the store, so every backend is priced
and shown the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, TypeVar

from gpufleet.errors import UsageError
from gpufleet.paths import job_dir
from gpufleet.runtime.events import read_events
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
    """Record a submitted job and lay out its folder (``logs/``, ``spec.json``); its id and folder."""
    job_id = store.add_job(spec, backend, env)
    folder = job_dir(home, job_id)
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    (folder / "spec.json").write_text(spec.model_dump_json(indent=2), encoding="utf-8")
    return job_id, folder


def ingest_events(store: Store, home: Path, job: Job) -> None:
    """Move new lines of the job's runtime event log into the store (from its saved offset)."""
    events, offset = read_events(job_dir(home, job.id) / "events.jsonl", job.events_offset)
    if offset != job.events_offset:
        store.add_runtime_events(job.id, events, offset)


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
