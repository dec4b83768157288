"""A warm replacement rank: forked from a process that has imported torch, not a new interpreter.

Most of the time a lost rank's replacement takes is a new interpreter importing torch, numpy and
gpufleet's runtime; the survivors wait for it. The rank supervisor therefore starts, with the
ranks, one *warm spawn server* (``backends/local/warm_server.py``) for the attempt, and forks each
replacement there: the child becomes ``python -u -m gpufleet.runtime.launch ...`` with the rank's
exact environment, as the local scheduler's warm start does for whole attempts.

The runtime reads ``WORLD_SIZE`` when it is imported (``runtime/session.py`` prepares the world
group's defaults then), so a server forks only processes of the world size it was started for. This
one is started for the group's (``--world-size N``) with the environment the ranks share
(:func:`gpufleet.backends.group_launch.supervisor.shared_environment`: ``WORLD_SIZE``,
``TORCHELASTIC_RUN_ID``...), so what it imported is what a new rank would have imported; every other
refusal of the server holds, and a refused, failed or dead server means a cold start.

Lifetimes: the server dies with the supervisor (SIGKILL, the death-signal shim of
``WarmServer.start``), each child with the server (SIGKILL); so a replacement still dies with the
supervisor, as a cold rank does.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Self

from gpufleet.backends.local import warm

READY_WAIT_S = 30.0
"""How long a replacement waits for a server still importing: it is further along than a new interpreter."""


def group_world_size(env: Mapping[str, str]) -> int:
    """The ``WORLD_SIZE`` ``env`` names (1 when it names none): the group a rank server serves."""
    raw = env.get("WORLD_SIZE", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


class RankServer(warm.WarmServer):
    """The supervisor's handle on its warm rank server: ``warm.WarmServer`` for the ranks of one group."""

    @classmethod
    def start(cls, env: Mapping[str, str], *, world_size: int | None = None) -> Self:
        """Start the server with ``env`` (the ranks' shared environment); it dies with this process.

        It forks ranks of ``world_size``, by default the ``WORLD_SIZE`` that ``env`` names.
        """
        return super().start(env, world_size=world_size or group_world_size(env))


def one_log() -> bool:
    """Whether this process's stdout and stderr are the same file: a warm child gets one log for both."""
    try:
        return os.path.samestat(os.fstat(1), os.fstat(2))
    except OSError:
        return False


class WarmRanks:
    """Replacement ranks forked warm when the server can, else ``None`` and the caller starts them cold."""

    def __init__(self, server: RankServer | None, why_not: str = "") -> None:
        self.server = server
        self.why_not = why_not
        """Why no rank can start warm in this attempt (empty while the server may)."""

    @classmethod
    def start(cls, argv: Sequence[str], env: Mapping[str, str]) -> WarmRanks:
        """A server for ranks running ``argv``, started with the ranks' shared ``env``, unless it cannot serve them."""
        if not warm.warm_start_enabled(env):
            return cls(None, f"{warm.ENV_WARM_START}=0")
        if warm.warm_entry(argv) is None:
            return cls(None, "the rank command is not gpufleet's interpreter running a module or a file")
        if not one_log():
            return cls(None, "stdout and stderr are different files, and a warm rank has one log")
        try:
            return cls(RankServer.start(env))
        except OSError as err:
            return cls(None, f"the warm rank server cannot start: {err.strerror}")

    def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> warm.WarmProcess | str:
        """Fork a rank (dying with the server, and so with this process), or why it starts cold."""
        if self.server is None:
            return self.why_not
        if not self.server.ready:
            self.server.wait_ready(READY_WAIT_S)
        return self.server.spawn(
            argv, env=env, cwd=os.getcwd(), log=sys.stdout.buffer, death_signal=int(signal.SIGKILL)
        )

    def close(self) -> None:
        """End the server (a rank it forked and still alive gets its death signal)."""
        if self.server is not None:
            self.server.close()
            self.server = None


__all__ = ["READY_WAIT_S", "RankServer", "WarmRanks", "group_world_size", "one_log"]
