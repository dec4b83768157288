"""A rank's phase board: 16 bytes in the attempt's rank folder that say where the rank is, and that it moves.

Byte 0 is the code of the phase the rank is in, bytes 8-15 a heartbeat bumped at every forward.
The file is memory-mapped: an update is a store, no system call, so the training loop's hooks
(:mod:`gpufleet.runtime.components.phases`) can write it on every transition, and the watchdog
of another rank (:mod:`gpufleet.runtime.watchdog`) can read where a frozen rank stopped, which the
frozen process itself can no longer say.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from pathlib import Path

# Where the rank is now (the code byte); the phase a frozen rank was last in.
AT_START, IN_FORWARD, AFTER_BACKWARD, IN_OPTIMIZER, AFTER_OPTIMIZER, AT_BOUNDARY, IN_BACKWARD = range(7)
BOARD_PHASE = {
    AT_START: "data_wait",
    IN_FORWARD: "compute",
    IN_BACKWARD: "compute",
    AFTER_BACKWARD: "compute",
    IN_OPTIMIZER: "optimizer",
    AFTER_OPTIMIZER: "compute",
    AT_BOUNDARY: "collective",
}
"""Board code -> the phase a person reads (a rank stuck at the step boundary is in the agreement)."""


class PhaseBoard:
    """One rank's 16 bytes in the rank folder: its phase code (byte 0) and a heartbeat (bytes 8-15)."""

    SIZE = 16

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, self.SIZE)
            self._map: mmap.mmap | None = mmap.mmap(fd, self.SIZE)
        finally:
            os.close(fd)
        self.beats = 0

    def phase(self, code: int) -> None:
        if self._map is not None:
            self._map[0] = code

    def beat(self) -> None:
        self.beats += 1
        if self._map is not None:
            self._map[8:16] = struct.pack("<Q", self.beats)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        with contextlib.suppress(OSError):
            self.path.unlink()

    @staticmethod
    def read(path: Path) -> tuple[str, int] | None:
        """(phase, heartbeat) a rank last published, or ``None`` (no board: not started, or closed)."""
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        if len(raw) < PhaseBoard.SIZE:
            return None
        return BOARD_PHASE.get(raw[0], "unknown"), struct.unpack("<Q", raw[8:16])[0]


def board_path(folder: Path, rank: int) -> Path:
    return folder / f"phase-{rank}"


__all__ = [
    "AFTER_BACKWARD",
    "AFTER_OPTIMIZER",
    "AT_BOUNDARY",
    "AT_START",
    "BOARD_PHASE",
    "IN_BACKWARD",
    "IN_FORWARD",
    "IN_OPTIMIZER",
    "PhaseBoard",
    "board_path",
]
