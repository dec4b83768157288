"""The optional features of gpufleet and the extras that install them.

The core (``gpufleet submit``, ``jobs``, ``show``, ``logs``, ``cost``, ``preempt``, ``cancel``,
``demo``, and the runtime inside a job) needs only the dependencies every install has. Each
feature below needs libraries of its own, installed with ``pip install 'gpufleet[EXTRA]'``
(``gpufleet[all]`` installs every one of them)::

    extra     modules             what needs them
    quality   mlflow, pyarrow     the model registry (gpufleet registry, quality demo), Parquet tables
    sweeps    optuna              gpufleet sweep
    rl        gymnasium           the RL workload (gpufleet.rl.dqn)
    serve     fastapi, uvicorn    gpufleet serve
    data      fsspec, s3fs        staging a job's data sources (a spec's ``data:``), gpufleet bench stage
    slurm     ClusterShell        Slurm hostlists: the Slurm backend's ranks, fleet topology files
    elastic   torchft             ``distributed.recovery: continue`` (not in ``all``: a native
                                  Lighthouse and Manager for the hosts that train elastically)

A feature imports its libraries through :func:`require` (a module object) or :func:`required` (a
block of typed ``import`` statements), so a missing one is one line naming the extra to install
(exit 2), not a traceback, and the core never imports any of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from gpufleet.errors import UsageError

EXTRAS: dict[str, tuple[str, ...]] = {
    "quality": ("mlflow", "pyarrow"),
    "sweeps": ("optuna",),
    "rl": ("gymnasium",),
    "serve": ("fastapi", "uvicorn"),
    "data": ("fsspec", "s3fs"),
    "slurm": ("ClusterShell",),
}
"""Each feature extra of ``gpufleet[all]`` and the top-level modules it installs (pyproject's
``optional-dependencies``). ``elastic`` (torchft) is mapped where it is used (``runtime.elastic``, the
local backend's submit check), like the ``ray`` and ``gpu`` extras that ``all`` leaves out too."""


def missing_extra(module: str, extra: str, feature: str, cause: ImportError | None = None) -> UsageError:
    """The one-line error for ``feature`` when ``module`` does not import: which extra installs it.

    When the module is there but one of its own imports fails (``cause.name`` is another module), the
    line says so: installing the extra again brings the missing piece back.
    """
    top = module.partition(".")[0]
    line = f"{feature} needs {top}: pip install 'gpufleet[{extra}]'"
    failed = cause.name if cause is not None else None
    if failed and failed.partition(".")[0] != top:
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        line += f" ({top} is installed but importing it failed: {first})"
    return UsageError(line)


def require(module: str, extra: str, feature: str) -> ModuleType:
    """``module`` imported, or a :class:`UsageError` naming ``extra`` (``gpufleet sweep needs optuna: ...``).

    For libraries used through the module object; typed ``from X import Y`` statements go in a
    :func:`required` block, so the names keep their types.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise missing_extra(module, extra, feature, err) from None


@contextmanager
def required(module: str, extra: str, feature: str) -> Iterator[None]:
    """A block of imports of ``module`` (and its parts): an ImportError in it becomes :func:`missing_extra`'s error.

    ``with required("fastapi", "serve", "gpufleet serve"): from fastapi import FastAPI`` keeps the
    imported names typed, at module scope or in a function alike.
    """
    try:
        yield
    except ImportError as err:
        raise missing_extra(module, extra, feature, err) from None


__all__ = ["EXTRAS", "missing_extra", "require", "required"]
