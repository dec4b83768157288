"""Schedulers gpufleet runs jobs on; ``local`` is the embedded default."""

from __future__ import annotations

from pathlib import Path

from gpufleet.backends.base import Backend, get_backend, register
from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.slurm import SlurmBackend
from gpufleet.store import Store

__all__ = ["Backend", "LocalBackend", "LocalScheduler", "SlurmBackend", "get_backend", "register", "sync_remote"]


def sync_remote(home: Path, store: Store) -> None:
    """Refresh the store from remote schedulers that have active jobs (the local one pushes)."""
    if store.has_active("slurm"):
        SlurmBackend(home).sync()
