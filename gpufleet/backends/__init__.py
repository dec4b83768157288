"""Schedulers gpufleet runs jobs on; ``local`` is the embedded default."""

from __future__ import annotations

from gpufleet.backends.base import Backend, get_backend, register
from gpufleet.backends.local import LocalBackend, LocalScheduler

__all__ = ["Backend", "LocalBackend", "LocalScheduler", "get_backend", "register"]
