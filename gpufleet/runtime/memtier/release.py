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


def tier_need_bytes(state_bytes: int, ranks_per_node: int) -> int:
    """Bytes one store of a node needs: the 2 newest copies of each of its ranks' states.

    The node's shared memory needs this much; so does a keeper on it (it keeps as many), and both
    live in RAM, so a node that runs its own keeper needs twice this much of ``MemAvailable``.
    """
    if state_bytes < 0 or ranks_per_node < 1:
        raise ValueError(f"tier_need_bytes({state_bytes}, {ranks_per_node}): give bytes >= 0 and ranks >= 1")
    return COPIES_KEPT * state_bytes * ranks_per_node


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


__all__ = ["release", "room", "tier_need_bytes"]
