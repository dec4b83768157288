"""Schedulers gpufleet runs jobs on; ``local`` is the embedded default.

``base`` is the contract every backend implements (:class:`Backend`, :class:`Feature`);
``lifecycle`` the one rule for how an attempt ended; ``pools`` the fleet a home uses (its files
and the placing) that the local and Slurm backends share; one unit per scheduler: ``local/``
(backend, scheduler, fleet policy), ``slurm/``, ``ray/``; ``group_launch/`` runs the ranks of one
attempt under torchrun.

Floor 10 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/, data/, rl/,
workloads/, devtools/, placement/.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.backends import base
from gpufleet.backends.base import Backend, Feature, register
from gpufleet.errors import ServiceUnavailable, UsageError
from gpufleet.jobs.store import Store
from gpufleet.paths import scheduler_pid

if TYPE_CHECKING:
    from gpufleet.backends.local import LocalBackend, LocalScheduler
    from gpufleet.backends.ray.backend import RayBackend
    from gpufleet.backends.slurm.backend import SlurmBackend

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

BUILTIN = {
    "local": "gpufleet.backends.local",
    "ray": "gpufleet.backends.ray.backend",
    "slurm": "gpufleet.backends.slurm.backend",
}
"""gpufleet's own backends and the module that registers each: imported when first named, so that a command
reading the store (``gpufleet jobs``) loads no scheduler's client, the placement planner nor numpy."""

_CLASSES = {
    "LocalBackend": "gpufleet.backends.local",
    "LocalScheduler": "gpufleet.backends.local",
    "RayBackend": "gpufleet.backends.ray.backend",
    "SlurmBackend": "gpufleet.backends.slurm.backend",
}


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        return getattr(importlib.import_module(_CLASSES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def registered() -> dict[str, type[Backend]]:
    """Every backend by name, gpufleet's own loaded first (a copy)."""
    for module in BUILTIN.values():
        importlib.import_module(module)
    return base.registered()


def get_backend(name: str, home: Path) -> Backend:
    """The backend ``name`` on ``home``; only its own module is imported (an unknown name: every one, to list them)."""
    if name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    elif name not in base.registered():
        registered()
    return base.get_backend(name, home)


def sync_remote(home: Path, store: Store) -> None:
    """Refresh the store from every scheduler that has active jobs (``Backend.sync``).

    Every scheduler is asked even when one of them is unreachable; the first problem is raised after.
    A backend without active jobs is not imported.
    """
    problems: list[UsageError | ServiceUnavailable] = []
    for name in dict.fromkeys([*BUILTIN, *base.registered()]):
        if name == "local" and not scheduler_pid(home).exists():
            # The local scheduler writes the store itself; its sync only restarts one that died, which leaves
            # its pid file behind. Without one there is nothing to do, and the backend (numpy, the planner) is
            # not imported: `gpufleet jobs` with jobs running stays quick.
            continue
        if store.has_active(name):
            try:
                get_backend(name, home).sync()
            except (UsageError, ServiceUnavailable) as err:
                problems.append(err)
    if problems:
        raise problems[0]
