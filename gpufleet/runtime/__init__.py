"""What runs inside a training process: checkpoints, health, the preemption guard."""

from __future__ import annotations

from gpufleet.runtime.checkpoint import CheckpointDir, CheckpointInfo, CheckpointManifest
from gpufleet.runtime.events import EventLog
from gpufleet.runtime.health import HealthMonitor
from gpufleet.runtime.session import REQUEUE_EXIT_CODE, Preempted, TrainSession

__all__ = [
    "REQUEUE_EXIT_CODE",
    "CheckpointDir",
    "CheckpointInfo",
    "CheckpointManifest",
    "EventLog",
    "HealthMonitor",
    "Preempted",
    "TrainSession",
]
