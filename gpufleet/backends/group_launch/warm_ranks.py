"""A warm replacement rank: forked from a process that has imported torch, not a new interpreter.

Most of the time a lost rank's replacement takes is a new interpreter importing torch, numpy and
gpufleet's runtime; the survivors wait for it. The rank supervisor therefore starts, with the
ranks, one *warm spawn server* (``backends/local/warm.py``) for the attempt, and forks each
replacement there: the child becomes ``python -u -m gpufleet.runtime.launch ...`` with the rank's
exact environment, as the local scheduler's warm start does for whole attempts.

The local scheduler's server refuses a rank of a group (``WORLD_SIZE`` above 1), because the
runtime reads ``WORLD_SIZE`` when it is imported (``runtime/session.py`` prepares the world group's
defaults then). This server is started with the environment the ranks share
(:func:`gpufleet.backends.group_launch.supervisor.shared_environment`: ``WORLD_SIZE``,
``TORCHELASTIC_RUN_ID``...), so what it imported is what a new rank would have imported, and it
forks a rank whose ``WORLD_SIZE`` is its own (:func:`rank_refusal`); every other refusal of
``warm.py`` holds, and a refused, failed or dead server means a cold start.

Lifetimes: the server dies with the supervisor (SIGKILL, the death-signal shim of
``WarmServer.start``), each child with the server (SIGKILL); so a replacement still dies with the
supervisor, as a cold rank does.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.backends.lifecycle import attempt_argv
from gpufleet.backends.local import warm

RANK_SERVER_CODE = (
    "import sys; from gpufleet.backends.group_launch.warm_ranks import serve_ranks; serve_ranks(sys.argv[1:])"
)
"""The rank server's command (``python -c``), as ``warm.SERVER_CODE`` with :func:`rank_refusal` in place."""

READY_WAIT_S = 30.0
"""How long a replacement waits for a server still importing: it is further along than a new interpreter."""

_plain_refusal = warm.refusal


def rank_refusal(server: Any, request: Mapping[str, Any], fds: Sequence[int]) -> str | None:
    """``warm.refusal`` for a rank of the server's own group: its ``WORLD_SIZE`` must be the server's."""
    env: Mapping[str, str] = request["env"]
    mine, theirs = os.environ.get("WORLD_SIZE", ""), env.get("WORLD_SIZE", "")
    if theirs != mine:
        return f"WORLD_SIZE {theirs!r} is not the warm rank server's {mine!r}, which the runtime read at import"
    alone = {name: value for name, value in env.items() if name != "WORLD_SIZE"}
    return _plain_refusal(server, {**request, "env": alone}, fds)


def serve_ranks(argv: Sequence[str]) -> None:
    """The rank server's process: ``warm.main`` judging requests with :func:`rank_refusal`."""
    warm.refusal = rank_refusal  # the server's loop looks the function up at each request
    warm.main(argv)


class RankServer(warm.WarmServer):
    """The supervisor's handle on its warm rank server (``warm.WarmServer`` running :data:`RANK_SERVER_CODE`)."""

    @classmethod
    def start(cls, env: Mapping[str, str]) -> RankServer:
        """Start the server with ``env`` (the ranks' shared environment); it dies with this process."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = attempt_argv([sys.executable, "-c", RANK_SERVER_CODE, str(theirs.fileno())])
        os.set_inheritable(theirs.fileno(), True)
        quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1)]
        try:
            pid = os.posix_spawn(
                argv[0], argv, {**env, warm.ENV_ROOM: "x" * warm.ENV_ROOM_BYTES}, file_actions=quiet, setsid=True
            )
        finally:
            theirs.close()
        return cls(pid, mine)


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


__all__ = ["RANK_SERVER_CODE", "READY_WAIT_S", "RankServer", "WarmRanks", "one_log", "rank_refusal", "serve_ranks"]
