"""The memory keeper inherits nothing of the rank that started it."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from gpufleet.runtime.memtier import peer


def test_the_keeper_holds_none_of_the_ranks_inheritable_descriptors(tmp_path: Path) -> None:
    # A rank's gloo sockets are inheritable; a keeper holding one open would hide the rank's death from
    # its peers, who would wait out the collective timeout instead of seeing the connection closed.
    mine, other = socket.socketpair()
    mine.set_inheritable(True)
    inode = os.fstat(mine.fileno()).st_ino
    pid, exited = peer._spawn_detached(tmp_path / "keeper.log", tmp_path / "ready")
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "ready").exists():
            assert not exited.is_set(), (tmp_path / "keeper.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        held = set()
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                held.add(os.stat(f"/proc/{pid}/fd/{name}").st_ino)
            except OSError:
                continue
        assert inode not in held
    finally:
        os.kill(pid, signal.SIGKILL)
        exited.wait(30)
        mine.close()
        other.close()
