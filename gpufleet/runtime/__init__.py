"""What runs inside a training process: checkpoints, health, the preemption guard, a resumable loader.

Names are imported on first use, so that tools which only need the protocol (the CLI, a
backend) do not pay for importing torch.

Floor 6 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, tables.py, jobs/, estimate/, iobench/, telemetry/.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpufleet.jobs.protocol import REQUEUE_EXIT_CODE

if TYPE_CHECKING:
    from gpufleet.jobs.events import EventLog
    from gpufleet.runtime.checkpoint import CheckpointDir, CheckpointInfo, CheckpointManifest, Expectation
    from gpufleet.runtime.data import batch_generator, random_batch_indices
    from gpufleet.runtime.health import HealthMonitor
    from gpufleet.runtime.loader import ResumableLoader
    from gpufleet.runtime.session import Preempted, TrainSession

_LAZY = {
    "CheckpointDir": "gpufleet.runtime.checkpoint",
    "CheckpointInfo": "gpufleet.runtime.checkpoint",
    "CheckpointManifest": "gpufleet.runtime.checkpoint",
    "Expectation": "gpufleet.runtime.checkpoint",
    "batch_generator": "gpufleet.runtime.data",
    "random_batch_indices": "gpufleet.runtime.data",
    "EventLog": "gpufleet.jobs.events",
    "HealthMonitor": "gpufleet.runtime.health",
    "Preempted": "gpufleet.runtime.session",
    "ResumableLoader": "gpufleet.runtime.loader",
    "TrainSession": "gpufleet.runtime.session",
}

__all__ = [
    "REQUEUE_EXIT_CODE",
    "CheckpointDir",
    "CheckpointInfo",
    "CheckpointManifest",
    "EventLog",
    "Expectation",
    "HealthMonitor",
    "Preempted",
    "ResumableLoader",
    "TrainSession",
    "batch_generator",
    "random_batch_indices",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gpufleet.runtime' has no attribute {name!r}")
