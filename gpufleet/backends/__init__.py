"""Schedulers gpufleet runs jobs on; ``local`` is the embedded default.

``base`` is the contract every backend implements (:class:`Backend`, :class:`Feature`);
``lifecycle`` the one rule for how an attempt ended; ``pools`` the fleet a home uses (its files
and the placing) that the local and Slurm backends share; one unit per scheduler: ``local/``
(backend, scheduler, fleet policy), ``slurm/``, ``ray/``; ``group_launch/`` runs the ranks of one
attempt under torchrun.

Floor 10 of the layers (README, "Layout"; ``tests/test_layers.py``): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/, data/, rl/,
workloads/, devtools/, placement/.
"""

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
