"""One exception tree for everything a user can cause.

::

    GpufleetError                 base; every message names the bad value and the fix
    ├── SpecError                 a JobSpec (YAML) that does not validate
    ├── UsageError                a bad command-line value, an unknown job, a bad path
    ├── CheckpointError           nothing restorable, or a checkpoint that fails verification
    │   ├── CorruptCheckpoint     a checkpoint whose manifest or files do not verify
    │   ├── ForeignCheckpoint     a sound checkpoint of another job, or lacking what this job saves
    │   └── CheckpointSpaceError  a save that found the disk full (nothing earlier is touched)
    ├── HealthError               training kept producing unhealthy steps after rollbacks
    └── StoreError                the state database cannot be opened or is from a newer version

The CLI turns any of these into one line on stderr and exit code 2 (bad input) or 1 (a check
that ran and failed), never a traceback.
"""

from __future__ import annotations

from pathlib import Path


class GpufleetError(Exception):
    """Base of every error gpufleet raises on purpose."""

    exit_code: int = 2


class SpecError(GpufleetError):
    """A JobSpec that does not validate; the message names the field."""


class UsageError(GpufleetError):
    """A bad command-line value, an unknown job id, an unreadable path."""


class CheckpointError(GpufleetError):
    """No restorable checkpoint where one was required."""

    exit_code = 1


class CorruptCheckpoint(CheckpointError):
    """A checkpoint folder whose manifest or files do not verify."""


class ForeignCheckpoint(CheckpointError):
    """A checkpoint that verifies but is not this job's: another job wrote it, or it lacks an object."""


class CheckpointSpaceError(CheckpointError):
    """A save that ran out of disk space; its partial folder is removed, earlier checkpoints are kept.

    ``needed`` is the exact serialized size of the state, ``free`` what the filesystem of ``path``
    has left, so a caller can decide between waiting, pruning and moving elsewhere.
    """

    def __init__(self, message: str, *, path: Path, needed: int, free: int) -> None:
        super().__init__(message)
        self.path = path
        self.needed = needed
        self.free = free


class HealthError(GpufleetError):
    """Training produced unhealthy steps more often than the health policy allows."""

    exit_code = 1


class StoreError(GpufleetError):
    """The state database cannot be used."""
