"""Schedulers gpufleet runs jobs on; ``local`` is the embedded default."""

from __future__ import annotations

from pathlib import Path

from gpufleet.backends.base import Backend, Feature, get_backend, register, registered
from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.ray.backend import RayBackend
from gpufleet.backends.slurm.backend import SlurmBackend
from gpufleet.errors import ServiceUnavailable, UsageError
from gpufleet.jobs.store import Store

__all__ = [
    "Backend",
    "Feature",
    "LocalBackend",
    "LocalScheduler",
    "RayBackend",
    "SlurmBackend",
    "get_backend",
    "register",
    "registered",
    "sync_remote",
]


def sync_remote(home: Path, store: Store) -> None:
    """Refresh the store from every scheduler that has active jobs (``Backend.sync``).

    Every scheduler is asked even when one of them is unreachable; the first problem is raised after.
    """
    problems: list[UsageError | ServiceUnavailable] = []
    for backend in registered().values():
        if store.has_active(backend.name):
            try:
                backend(home).sync()
            except (UsageError, ServiceUnavailable) as err:
                problems.append(err)
    if problems:
        raise problems[0]
