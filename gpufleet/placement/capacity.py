"""Capacity left per candidate while a plan is built, and as it was when any one job was placed.

The planner consumes capacity job by job; an explanation ("needs 16 GPUs, 8 left") needs the
capacity as it stood when that job's turn came. A copy per job would be jobs x candidates integers
(1.6 GB at 100,000 jobs x 1,000 offers), so :class:`CapacityLog` keeps a copy every
:data:`SNAPSHOT_EVERY` positions and the list of placements, and replays at most that many of them
when an explanation is read. It belongs to one ``plan()`` call, like the quota book.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np
import numpy.typing as npt

SNAPSHOT_EVERY = 256
"""Positions between two copies: 391 copies (6 MiB) at 100,000 jobs x 1,000 offers, 255 placements at most to replay."""


class CapacityLog:
    """GPUs left per candidate (both markets of an offer share them), replayable at any position."""

    def __init__(self, remaining: npt.NDArray[np.int64]) -> None:
        self.left = remaining
        """Live counters, consumed by :meth:`take`; read them, never write them."""
        self._snapshots: list[npt.NDArray[np.int64]] = []
        self._positions: list[int] = []
        self._taken: list[tuple[int, int]] = []

    def turn(self, position: int) -> None:
        """Mark the start of the turn of the job at ``position`` (0, 1, 2, ... in placement order)."""
        if position % SNAPSHOT_EVERY == 0:
            self._snapshots.append(self.left.copy())

    def take(self, position: int, candidate: int, gpus: int) -> None:
        """The job at ``position`` rents ``gpus`` of ``candidate``'s offer, in either market."""
        pair = candidate & ~1
        self.left[pair : pair + 2] -= gpus
        self._positions.append(position)
        self._taken.append((pair, gpus))

    def before(self, position: int) -> npt.NDArray[np.int64]:
        """GPUs left per candidate when the job at ``position`` took its turn (a fresh array)."""
        start = position - position % SNAPSHOT_EVERY
        left = self._snapshots[start // SNAPSHOT_EVERY].copy()
        first, last = bisect_left(self._positions, start), bisect_left(self._positions, position)
        for pair, gpus in self._taken[first:last]:
            left[pair : pair + 2] -= gpus
        return left


__all__ = ["SNAPSHOT_EVERY", "CapacityLog"]
