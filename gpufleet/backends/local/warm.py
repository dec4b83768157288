"""A warm start for local attempts: the handle on a process that has imported torch and forks each attempt.

A restart after a preemption used to pay a new interpreter importing torch, numpy and gpufleet's
runtime (about two seconds on a small machine) and, at the end of the attempt before, the
interpreter's teardown of all of them. The local scheduler starts one *warm spawn server*
(``warm_server.py``, run by ``python -c``: :data:`SERVER_CODE`) that imports them once
(:data:`PRELOADED`) and then forks a child per attempt on request over a unix socket pair; the rank
supervisor starts one for the ranks of its group (``--world-size N``). The server dies with its
scheduler (a death signal), and its children with it (theirs: SIGTERM, so they save first, as before).

This module is the caller's half: :class:`WarmServer` (start, spawn, close), :class:`WarmProcess`
(a forked attempt with ``Popen``'s surface), and the pure rules both halves share. The server's
module describes how a child becomes the attempt as a fresh interpreter would.

What cannot be the same is refused, and the caller starts that attempt the ordinary way: an argv
that is not gpufleet's own interpreter running a module or a file (another interpreter, a ``-c``,
other interpreter flags, :func:`warm_entry`); an environment whose variables read at interpreter or
library start (:data:`START_VARIABLE_PREFIXES`, :data:`START_VARIABLES`) differ from the server's:
hash randomisation (``PYTHONHASHSEED``), for one, is fixed when an interpreter starts and cannot
change after (:func:`start_variables_differ`); a ``WORLD_SIZE`` other than the one the server's
runtime read at import (:func:`serves_world_size`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal, Protocol, Self

from gpufleet.backends.lifecycle import alive, attempt_argv

ENV_WARM_START = "GPUFLEET_WARM_START"
"""``0`` turns the warm start off: every attempt is a new interpreter."""
ENV_ROOM = "GPUFLEET_WARM_ENV_ROOM"
"""Padding in the server's environment block, overwritten by each child with its own environment."""
ENV_ROOM_BYTES = 64 * 1024
PRELOADED = (
    "numpy",
    "torch",
    "torch._dynamo",  # what `torch.use_deterministic_algorithms` and `torch.compile` import: ~1.5 s on 2 cores
    "torch._inductor.config",
    "gpufleet.runtime.session",
    "gpufleet.runtime.group",
    "gpufleet.spec",
    "gpufleet.workloads.tinylm",  # the built-in workloads (the demo's): gpufleet's own modules, not a user's
    "gpufleet.workloads.toy",
)
"""What the server imports once for every attempt: torch and the runtime an entrypoint uses. Not a module an
attempt runs with ``-m`` (``gpufleet.runtime.launch``): run as ``__main__`` it must not be imported already."""
START_VARIABLE_PREFIXES = ("PYTHON", "TORCH", "LD_", "LC_", "MKL_", "KMP_", "NPY_")
"""Variables read when an interpreter, the loader or a preloaded library starts: an attempt whose
values differ from the server's starts cold."""
START_VARIABLES = ("LANG",)
"""Single variables of the same kind."""
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""Thread counts torch and OpenBLAS read once, in the server: a warm child applies its own (``warm_server.py``)."""
ONE_PROCESS = ("", "0", "1")
"""``WORLD_SIZE`` values of a process that is not a rank of a group (the runtime's session reads it at import)."""
SERVER_CODE = "import sys; from gpufleet.backends.local.warm_server import main; main(sys.argv[1:])"
"""The server's command, ``python -c SERVER_CODE FD [--world-size N]`` (``-c``: run as ``-m``, the server's
module would be imported twice)."""
MAX_MESSAGE = 1 << 20
SPAWN_TIMEOUT_S = 30.0
"""The longest a spawn may take to be answered before the server is given up (a fork takes milliseconds)."""


def warm_start_enabled(env: Mapping[str, str]) -> bool:
    """Whether ``GPUFLEET_WARM_START`` leaves the warm start on (the default)."""
    return env.get(ENV_WARM_START, "1").strip() != "0"


@dataclass(frozen=True, slots=True)
class WarmEntry:
    """What an argv runs, when a warm child can run it in process."""

    kind: Literal["module", "script"]
    target: str
    """The module name (``-m``) or the script's path."""
    args: tuple[str, ...]
    unbuffered: bool
    """``-u``: stdout and stderr unbuffered."""


def warm_entry(argv: Sequence[str], interpreter: str = sys.executable) -> WarmEntry | None:
    """``argv`` as a :class:`WarmEntry`: ``INTERPRETER [-u] -m MODULE ARGS`` or ``INTERPRETER [-u] FILE ARGS``.

    Anything else (another interpreter, ``-c``, other flags, a script read from stdin) is ``None``.
    """
    if len(argv) < 2 or argv[0] != interpreter:
        return None
    rest = list(argv[1:])
    unbuffered = rest[0] == "-u"
    if unbuffered:
        rest = rest[1:]
    if not rest or not rest[0]:
        return None
    if rest[0] == "-m":
        if len(rest) < 2 or not rest[1] or rest[1].startswith("-"):
            return None
        return WarmEntry("module", rest[1], tuple(rest[2:]), unbuffered)
    if rest[0].startswith("-"):
        return None
    return WarmEntry("script", rest[0], tuple(rest[1:]), unbuffered)


def start_variables_differ(server_env: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """The variables read at start whose value differs between the server and an attempt."""

    def read_at_start(name: str) -> bool:
        return name.startswith(START_VARIABLE_PREFIXES) or name in START_VARIABLES

    names = {n for n in (*server_env, *env) if read_at_start(n) and n != ENV_ROOM}
    return sorted(n for n in names if server_env.get(n) != env.get(n))


def thread_count(env: Mapping[str, str], name: str) -> int | None:
    """The positive thread count ``env`` names in ``name`` (``None``: none, or not a count)."""
    raw = env.get(name, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def thread_variables_refused(server_env: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """Thread variables the server was started with that an attempt lacks (or spoils): it starts cold.

    A warm child sets the count its environment names; without one it would run with the count
    the server's value gave, not the default a new interpreter picks.
    """
    return [
        name
        for name in THREAD_VARIABLES
        if server_env.get(name) != env.get(name) and name in server_env and thread_count(env, name) is None
    ]


def serves_world_size(world_size: int, value: str) -> bool:
    """Whether a server for groups of ``world_size`` forks a process whose ``WORLD_SIZE`` is ``value``.

    The runtime reads ``WORLD_SIZE`` when it is imported (``runtime/session.py``), and the server imported it
    once for all its children: only a child of the same world size finds what a new interpreter would.
    """
    return value in ONE_PROCESS if world_size == 1 else value == str(world_size)


def environ_block(env: Mapping[str, str]) -> bytes:
    """``env`` as the kernel shows a process's environment: ``NAME=value`` strings, each ended by a NUL."""
    return b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in env.items())


# ---- the scheduler's side ---------------------------------------------------------------------


class AttemptProcess(Protocol):
    """What the scheduler uses of an attempt's process: ``subprocess.Popen``'s, or a :class:`WarmProcess`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class WarmProcess:
    """A child of the warm server, with the surface of ``subprocess.Popen`` the scheduler uses."""

    def __init__(self, server: WarmServer, pid: int, args: Sequence[str]) -> None:
        self.server = server
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self.ended_at: float | None = None
        """When the server reaped it (the attempt's end, before the scheduler got round to it)."""
        self.lost = False
        """Its server died before reporting its exit: how it ended is for its own events to say."""

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.server.pump(min(left, 0.5))
        assert self.returncode is not None
        return self.returncode


class WarmServer:
    """The scheduler's handle on its warm spawn server (``start``, ``spawn``, ``close``)."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        """The server's process (ours to reap)."""
        self.sock = sock
        self.ready = False
        self.dead = False
        self.children: dict[int, WarmProcess] = {}
        self.answers: dict[int, dict[str, Any]] = {}
        self.next_id = 0

    @classmethod
    def start(cls, env: Mapping[str, str], *, world_size: int = 1) -> Self:
        """Start a server for this process (it dies with it); it answers once its imports are done.

        ``world_size``: the ``WORLD_SIZE`` of what it forks, 1 for single processes; ``env`` names the same.
        """
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = [sys.executable, "-c", SERVER_CODE, str(theirs.fileno()), "--world-size", str(world_size)]
        argv = attempt_argv(code)
        os.set_inheritable(theirs.fileno(), True)  # the only descriptor it gets beyond stdin, stdout, stderr
        quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1)]
        try:  # not subprocess: the server is a helper of the scheduler, not one of the attempts it starts
            pid = os.posix_spawn(
                argv[0], argv, {**env, ENV_ROOM: "x" * ENV_ROOM_BYTES}, file_actions=quiet, setsid=True
            )
        finally:
            theirs.close()
        return cls(pid, mine)

    def fileno(self) -> int:
        """The socket, readable when the server has something to say (a child exited): for ``select``."""
        return self.sock.fileno()

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the server has imported what it preloads (or died): whether it is ready."""
        deadline = time.monotonic() + timeout
        while not self.ready and not self.dead and time.monotonic() < deadline:
            self.pump(min(0.5, max(0.0, deadline - time.monotonic())))
        return self.ready

    def pump(self, timeout: float = 0.0) -> None:
        """Read what the server has said, waiting up to ``timeout`` for the first message."""
        if self.dead:
            self._check_orphans()
            return
        wait: float | None = timeout
        while select.select([self.sock], [], [], wait)[0]:
            wait = 0.0
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                self._died()
                return
            self._take(json.loads(data))

    def _take(self, message: dict[str, Any]) -> None:
        if "ready" in message:
            self.ready = True
        elif "exit" in message:
            child = self.children.pop(int(message["exit"]), None)
            if child is not None:
                child.returncode = int(message["code"])
                ts = message.get("ts")
                child.ended_at = float(ts) if isinstance(ts, int | float) else time.time()
        elif "id" in message:
            self.answers[int(message["id"])] = message

    def _died(self) -> None:
        self.dead, self.ready = True, False
        with contextlib.suppress(OSError):
            self.sock.close()
        self._check_orphans()

    def _check_orphans(self) -> None:
        """Children of a dead server end unreported: gone is all that can be known here."""
        for pid, child in list(self.children.items()):
            if not alive(pid):
                child.returncode, child.lost = -int(signal.SIGKILL), True
                del self.children[pid]

    def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, log: IO[bytes], death_signal: int
    ) -> WarmProcess | str:
        """Fork ``argv`` as a warm child: its process, or why not (the caller starts it cold)."""
        self.pump()
        if self.dead:
            return "the warm start server has exited"
        if not self.ready:
            return "the warm start server is still importing"
        if warm_entry(argv) is None:
            return "not gpufleet's interpreter running a module or a file"
        self.next_id += 1
        request = {"id": self.next_id, "argv": list(argv), "env": dict(env), "cwd": cwd, "death_signal": death_signal}
        data = json.dumps(request).encode()
        if len(data) > MAX_MESSAGE // 2:
            return "the request is too large for the warm start server"
        try:
            socket.send_fds(self.sock, [data], [log.fileno()])
        except OSError as err:
            self._died()
            return f"the warm start server cannot be reached: {err.strerror}"
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        while self.next_id not in self.answers and not self.dead and time.monotonic() < deadline:
            self.pump(0.5)
        answer = self.answers.pop(self.next_id, None)
        if answer is None:
            self.close()
            return "the warm start server did not answer"
        if "refused" in answer:
            return str(answer["refused"])
        child = WarmProcess(self, int(answer["pid"]), argv)
        self.children[child.pid] = child
        return child

    def close(self, timeout: float = 10.0) -> None:
        """Close the socket: the server exits (its children, if any still run, get their death signal)."""
        if not self.dead:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.dead = True
        deadline = time.monotonic() + timeout
        while not self._reaped():
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.01)

    def _reaped(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG)[0] != 0
        except ChildProcessError:  # reaped already
            return True


__all__ = [
    "ENV_ROOM",
    "ENV_WARM_START",
    "MAX_MESSAGE",
    "ONE_PROCESS",
    "PRELOADED",
    "SERVER_CODE",
    "START_VARIABLES",
    "START_VARIABLE_PREFIXES",
    "THREAD_VARIABLES",
    "AttemptProcess",
    "WarmEntry",
    "WarmProcess",
    "WarmServer",
    "environ_block",
    "serves_world_size",
    "start_variables_differ",
    "thread_count",
    "thread_variables_refused",
    "warm_entry",
    "warm_start_enabled",
]
