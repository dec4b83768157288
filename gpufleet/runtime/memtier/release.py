"""What a memory tier needs, the room a node has for it, and what a finished job leaves behind of it.

``release`` is the scheduler's to call when a job ends for good: it stops the job's keeper (only
after checking that the recorded pid runs our keeper) and removes the job's shared-memory folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path

COPIES_KEPT = 2
"""Copies of each rank's state a store keeps: the newest two steps."""
SHM_FILES = COPIES_KEPT + 2
"""Files of each rank in shared memory at most: the copies kept, the one being written (kept as a spare
between writes), and a pruned one still being read by the keeper."""


def tier_need_bytes(state_bytes: int, ranks_per_node: int, *, own_keeper: bool = False) -> tuple[int, int]:
    """Bytes of shared memory and of ``MemAvailable`` a node's memory tier needs.

    Shared memory holds :data:`SHM_FILES` files per rank of the node; the job's own keeper, when it
    runs on the node (``own_keeper``), keeps :data:`COPIES_KEPT` more per rank in its RAM. Shared memory
    is RAM too, so both count against ``MemAvailable``.
    """
    if state_bytes < 0 or ranks_per_node < 1:
        raise ValueError(f"tier_need_bytes({state_bytes}, {ranks_per_node}): give bytes >= 0 and ranks >= 1")
    shm = SHM_FILES * state_bytes * ranks_per_node
    return shm, shm + (COPIES_KEPT * state_bytes * ranks_per_node if own_keeper else 0)


def need_words(state_bytes: int, ranks_per_node: int) -> str:
    """How the need is counted, for a refusal: the files per rank and the state's size."""
    return (
        f"{SHM_FILES} files of about {state_bytes} bytes (2 copies, the one being written, one being sent) "
        f"for each of {ranks_per_node} rank(s), and 2 more in the keeper's RAM when it runs here"
    )


def room(shm: Path) -> tuple[int, int]:
    """Free bytes of the shared-memory filesystem holding ``shm`` (its nearest existing folder); ``MemAvailable``."""
    probe = shm
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    available = free
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return free, available


def release(job_dir: Path | str, env: Mapping[str, str] | None = None) -> None:
    """Stop the job's keeper (if the recorded pid is ours) and remove its shared-memory copies."""
    from gpufleet.runtime.memtier.peer import RECORD, is_keeper, read_record
    from gpufleet.runtime.memtier.shm import job_key, shm_root

    job_dir = Path(job_dir)
    record = read_record(job_dir)
    if record is not None and is_keeper(record["pid"]):
        with contextlib.suppress(OSError):
            os.kill(record["pid"], signal.SIGTERM)
    with contextlib.suppress(OSError):
        (job_dir / RECORD).unlink()
    shutil.rmtree(shm_root(os.environ if env is None else env) / job_key(job_dir), ignore_errors=True)


__all__ = ["COPIES_KEPT", "SHM_FILES", "need_words", "release", "room", "tier_need_bytes"]
