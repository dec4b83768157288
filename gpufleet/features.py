"""The features gpufleet ships, listed once, and the call that loads them with the installed plugins'.

Each module in :data:`BUILTIN` registers its feature (:mod:`gpufleet.jobs.features`) when imported,
and imports only light things (pydantic, its own report helpers): never torch, gymnasium or optuna.
A module that cannot be imported all the same is skipped and named by :func:`load_features`; the
others load. The CLI and the server call :func:`load_features` at start; any other process (a job's
metrics exporter) loads the same list on its first lookup, through this package's
``gpufleet.features`` entry point, which names :func:`register_builtin`.
"""

from __future__ import annotations

import importlib

from gpufleet.jobs.features import discover, note_skipped

BUILTIN = ("gpufleet.data.feature", "gpufleet.rl.feature", "gpufleet.sweeps.feature")
"""The modules of gpufleet's own features: data staging, actor-learner RL, sweeps' pruning."""


def register_builtin() -> None:
    """Import each of :data:`BUILTIN`; one that fails to import is recorded, the others still register."""
    for name in BUILTIN:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - a missing library or a clashing plugin skips this one only
            note_skipped(name, f"{type(err).__name__}: {err}")


def load_features() -> dict[str, str]:
    """Register gpufleet's features and every installed plugin's; those skipped, and why (none: ``{}``)."""
    register_builtin()
    return discover()


__all__ = ["BUILTIN", "load_features", "register_builtin"]
