"""A warm start for local attempts: a process that has imported torch forks each attempt.

A restart after a preemption used to pay a new interpreter importing torch, numpy and gpufleet's
runtime (about two seconds on a small machine) and, at the end of the attempt before, the
interpreter's teardown of all of them. The local scheduler starts one *warm spawn server* (this
module's :func:`main`, run by ``python -c``: :data:`SERVER_CODE`) that imports them once
(:data:`PRELOADED`) and then forks a child per attempt on request over a unix socket pair. The
server dies with its scheduler (a death signal), and its children with it (theirs: SIGTERM, so
they save first, as before).

The child becomes the attempt as a fresh ``python [-u] -m MODULE ...`` or ``python [-u] FILE ...``
would be, nothing of the server or of another attempt leaking in:

- a session of its own (the scheduler signals its process group), a death signal tied to the server;
- the attempt's exact environment (``os.environ`` cleared and replaced; also written over the
  process's original environment block, so ``/proc/PID/environ`` names the attempt's
  ``GPUFLEET_*`` variables and a scheduler that restarts after a crash finds it there);
- its working directory; stdin ``/dev/null``, stdout and stderr its log (passed over the socket),
  every other descriptor closed; ``sys.stdin``/``stdout``/``stderr`` made anew (``-u`` honoured);
- ``sys.argv`` and ``sys.path`` as the interpreter sets them, import caches dropped: only what the
  server preloaded is already in ``sys.modules``, so the attempt's own modules are read from disk;
- the random generators seeded from the OS as a fresh interpreter's are (``random``, numpy's legacy
  global state, torch's default generator); signal handlers and mask as at interpreter start;
- its exit status as a fresh process's: a ``SystemExit`` code, 1 with the traceback on an
  exception, death by SIGINT on ``KeyboardInterrupt``. At exit it joins non-daemon threads, runs
  the ``atexit`` handlers and flushes every open file, then leaves without tearing the interpreter
  down (objects alive at exit are not finalised, which Python never promises either).

What cannot be the same is refused, and the scheduler starts that attempt the ordinary way: an argv
that is not gpufleet's own interpreter running a module or a file (another interpreter, a ``-c``,
other interpreter flags); an environment whose variables read at interpreter or library start
(:data:`START_VARIABLE_PREFIXES`, :data:`START_VARIABLES`) differ from the server's: hash
randomisation (``PYTHONHASHSEED``), for one, is fixed when an interpreter starts and cannot change
after. The server itself is single-threaded when it forks: it refuses to fork otherwise (numpy's
BLAS pool, the one thread an import starts, is stopped first).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import io
import json
import linecache
import os
import random
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from gpufleet.backends.lifecycle import alive, attempt_argv
from gpufleet.jobs.deathsig import NOT_STARTED, die_with_parent

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
START_VARIABLE_PREFIXES = ("PYTHON", "TORCH", "LD_", "LC_", "MKL_", "KMP_")
"""Variables read when an interpreter, the loader or a preloaded library starts: an attempt whose
values differ from the server's starts cold."""
START_VARIABLES = ("LANG",)
"""Single variables of the same kind."""
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""Thread counts torch and OpenBLAS read once, in the server: a warm child applies its own (:func:`_apply_threads`)."""
ONE_PROCESS = ("", "0", "1")
"""``WORLD_SIZE`` values of a process that is not a rank of a group (the runtime's session reads it at import)."""
SERVER_CODE = "import sys; from gpufleet.backends.local.warm import main; main(sys.argv[1:])"
"""The server's command (``python -c``: run as ``-m``, this module would be imported twice)."""
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


def _thread_count(env: Mapping[str, str], name: str) -> int | None:
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
        if server_env.get(name) != env.get(name) and name in server_env and _thread_count(env, name) is None
    ]


def _apply_threads(env: Mapping[str, str]) -> None:
    """The thread counts ``env`` names, as torch and OpenBLAS read them when a new interpreter loads them.

    Both read them once, when the server imported them: without this a child with
    ``OMP_NUM_THREADS=4`` (the scheduler's share of the cores) would run with the server's count.
    """
    omp, mkl, blas = (_thread_count(env, name) for name in THREAD_VARIABLES)
    torch = sys.modules.get("torch")
    if torch is not None and (mkl or omp) is not None:
        torch.set_num_threads(mkl or omp)
    if (blas or omp) is not None:
        _set_blas_threads(blas or omp or 1)


def _set_blas_threads(count: int) -> None:
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if line.split() else ""
        if "openblas" in Path(path).name.lower() and ".so" in path:
            with contextlib.suppress(OSError):
                lib = ctypes.CDLL(path)
                for symbol in ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_"):
                    if hasattr(lib, symbol):
                        getattr(lib, symbol)(ctypes.c_int(count))
                        return
            return


def environ_block(env: Mapping[str, str]) -> bytes:
    """``env`` as the kernel shows a process's environment: ``NAME=value`` strings, each ended by a NUL."""
    return b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in env.items())


# ---- the server ---------------------------------------------------------------------------------


@dataclass
class _Server:
    sock: socket.socket
    wake_r: int
    wake_w: int
    base_path: list[str]
    """``sys.path`` after its first entry (the script's folder or the working directory)."""
    environ_room: int
    """Bytes of the original environment block a child may write its environment into."""
    start_env: dict[str, str]
    """The environment the server started with, before its imports (``torch._inductor`` sets a variable of its
    own): what a new interpreter of the attempt is compared with."""


def _original_environ_span() -> tuple[int, int]:
    """Where the kernel keeps this process's original environment block (``/proc/self/stat``, fields 50-51)."""
    fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
    return int(fields[47]), int(fields[48])


def release_blas_threads() -> None:
    """Stop OpenBLAS's worker threads (numpy's import starts them; its next call starts them again).

    OpenBLAS does the same before every fork (``pthread_atfork``); doing it now leaves the server
    single-threaded, which :func:`threads` checks before each fork.
    """
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if line.split() else ""
        if "openblas" in Path(path).name.lower() and ".so" in path:
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(path).blas_thread_shutdown_()
                return


def threads() -> int:
    """Threads of this process, native ones included."""
    return len(os.listdir("/proc/self/task"))


def serve(fd: int) -> int:
    """The server's loop: import, say ready, then fork on request and report each child's exit."""
    sock = socket.socket(fileno=fd)
    try:
        return _serve(sock)
    except ConnectionError:  # the scheduler closed its end first: nobody is left to serve
        return 0


def _serve(sock: socket.socket) -> int:
    start_env = dict(os.environ)
    for name in PRELOADED:
        importlib.import_module(name)
    release_blas_threads()
    gc.collect()
    gc.freeze()  # the server's objects: never scanned by a child's collector (nor copied on write by it)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    start, end = _original_environ_span()
    server = _Server(sock, wake_r, wake_w, sys.path[1:], end - start, start_env)
    _send(sock, {"ready": os.getpid()})
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
        _report_exits(sock)
        if sock.fileno() in readable:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
            except ConnectionError:  # closed with our messages unread
                data, fds = b"", []
            if not data:
                return 0  # the scheduler closed its end (or died): the children get their death signal
            _answer(server, json.loads(data), fds)


def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def _report_exits(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status), "ts": time.time()})


def refusal(server: _Server, request: Mapping[str, Any], fds: Sequence[int]) -> str | None:
    """Why the server will not fork this request (``None``: it will)."""
    entry = warm_entry(request["argv"])
    if entry is None:
        return "not gpufleet's interpreter running a module or a file"
    if len(fds) != 1:
        return "no log descriptor came with the request"
    differ = start_variables_differ(server.start_env, request["env"])
    if differ:
        return f"{', '.join(differ[:3])} differ from the warm server's, which read them at its start"
    unset = thread_variables_refused(server.start_env, request["env"])
    if unset:
        return f"{', '.join(unset)} set for the warm server is not a thread count in the attempt's environment"
    if request["env"].get("WORLD_SIZE", "") not in ONE_PROCESS:
        return "a rank of a group starts as a new process"
    if len(environ_block(request["env"])) >= server.environ_room:
        return "the environment is larger than the room the warm server keeps for it"
    if not Path(request["cwd"]).is_dir():
        return f"working directory {request['cwd']!r} does not exist"
    if entry.kind == "script" and not (Path(request["cwd"]) / entry.target).is_file():
        return f"script {entry.target!r} does not exist"
    if threads() != 1:
        return f"the warm server runs {threads()} threads; it forks only single-threaded"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the warm server"
    return None


def _answer(server: _Server, request: dict[str, Any], fds: list[int]) -> None:
    reason = refusal(server, request, fds)
    if reason is not None:
        for fd in fds:
            os.close(fd)
        _send(server.sock, {"id": request["id"], "refused": reason})
        return
    started_r, started_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(started_r)
            _become_attempt(server, request, fds[0], started_w)
        except BaseException:  # noqa: BLE001 - it never became the attempt: say why in its log
            traceback.print_exc()
        finally:
            os._exit(NOT_STARTED)
    os.close(started_w)
    os.close(fds[0])
    os.read(started_r, 1)  # the child has its own session: the scheduler may signal its group from now on
    os.close(started_r)
    _send(server.sock, {"id": request["id"], "pid": pid})


# ---- the child --------------------------------------------------------------------------------


def _become_attempt(server: _Server, request: Mapping[str, Any], log_fd: int, started_w: int) -> None:
    """Turn this fresh fork into the attempt, run it and exit as its interpreter would (never returns)."""
    server_pid = os.getppid()
    os.setsid()
    die_with_parent(int(request["death_signal"]), parent=server_pid)
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    # Before the PID is given out: a scheduler that dies before recording it finds the attempt by these.
    _show_environ(env)
    os.write(started_w, b"1")
    os.close(started_w)
    _reset_signals()
    server.sock.close()
    os.close(server.wake_r)
    os.close(server.wake_w)
    _standard_descriptors(log_fd)
    os.chdir(request["cwd"])
    entry = warm_entry(request["argv"])
    assert entry is not None  # refused otherwise
    _fresh_stdio(entry.unbuffered)
    first = str(Path(entry.target).resolve().parent) if entry.kind == "script" else os.getcwd()
    sys.path[:] = [first, *server.base_path]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    linecache.clearcache()
    _reseed()
    _apply_threads(env)
    code, interrupted = _run(entry)
    _exit_as_python(code, interrupted)


def _reset_signals() -> None:
    """Handlers and mask as a new interpreter has them (SIGINT raises, SIGPIPE and SIGXFSZ ignored)."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler: Any = signal.SIG_DFL
        if sig == signal.SIGINT:
            handler = signal.default_int_handler
        elif sig in (signal.SIGPIPE, signal.SIGXFSZ):
            handler = signal.SIG_IGN
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _standard_descriptors(log_fd: int) -> None:
    """stdin ``/dev/null``, stdout and stderr the log, nothing else open."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))


def _show_environ(env: Mapping[str, str]) -> None:
    """Write ``env`` over the original environment block, which is what ``/proc/PID/environ`` shows.

    ``os.environ.clear()`` has unset every original variable, so nothing refers to the block any more.
    """
    with contextlib.suppress(OSError, ValueError):
        start, end = _original_environ_span()
        block = environ_block(env)
        if len(block) < end - start:
            ctypes.memmove(start, block + b"\0" * (end - start - len(block)), end - start)


def _fresh_stdio(unbuffered: bool) -> None:
    """``sys.stdin``/``stdout``/``stderr`` as the interpreter makes them at start (stderr line-buffered)."""
    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"
    errors = (sys.stdout.errors if sys.stdout is not None else None) or "strict"

    def writer(fd: int, errors: str, line_buffering: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        binary: IO[bytes] = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            binary,
            encoding=encoding,
            errors=errors,
            line_buffering=line_buffering,
            write_through=unbuffered,
        )

    stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=encoding, errors=errors)
    stdout = writer(1, errors, False)
    stderr = writer(2, "backslashreplace", True)
    for name, stream in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)):
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reseed() -> None:
    """Every generator a fresh interpreter seeds from the OS, seeded from the OS again."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def _run(entry: WarmEntry) -> tuple[int, bool]:
    """Run the entry as the interpreter's ``-m``/file mode would: its exit code, and whether it was interrupted."""
    sys.argv = [entry.target, *entry.args]
    try:
        if entry.kind == "module":
            runpy.run_module(entry.target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(entry.target, run_name="__main__")
    except SystemExit as exit_:
        return _exit_code(exit_.code), False
    except KeyboardInterrupt:
        traceback.print_exc()
        return 1, True
    except BaseException:  # noqa: BLE001 - as the interpreter: print the traceback, exit 1
        sys.excepthook(*sys.exc_info())
        return 1, False
    return 0, False


def _exit_code(code: object) -> int:
    """A ``SystemExit`` code as the interpreter turns it into a status (a message is printed, then 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


BUFFERED_FILES = (io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair, io.TextIOWrapper)
"""The file objects that hold written data until flushed (``io.FileIO`` holds none)."""


def _exit_as_python(code: int, interrupted: bool) -> None:
    """Leave as the interpreter would at exit, less its teardown: threads joined, ``atexit`` run, files flushed."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):
            shutdown()
    atexit._run_exitfuncs()
    # Only the attempt's own objects: the server's were frozen before the fork (a scan of all ~300,000
    # of them costs ~0.1 s), and a file of the server's is not the attempt's to flush.
    for obj in (o for generation in (0, 1, 2) for o in gc.get_objects(generation=generation)):
        if issubclass(type(obj), BUFFERED_FILES):  # type(): an isinstance may run a property's code
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    obj.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


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
    def start(cls, env: Mapping[str, str]) -> WarmServer:
        """Start a server for this process (it dies with it); it answers once its imports are done."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = attempt_argv([sys.executable, "-c", SERVER_CODE, str(theirs.fileno())])
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


def main(argv: Sequence[str]) -> None:
    """The server process (:data:`SERVER_CODE` ``FD``): serve spawn requests on the socket ``FD``, then leave."""
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -c SERVER_CODE FD (the local scheduler starts the warm server)", file=sys.stderr)
        os._exit(2)
    os._exit(serve(int(argv[0])))  # nothing to tear down: leaving at once lets the scheduler go on


__all__ = [
    "ENV_ROOM",
    "ENV_WARM_START",
    "PRELOADED",
    "SERVER_CODE",
    "START_VARIABLES",
    "START_VARIABLE_PREFIXES",
    "AttemptProcess",
    "WarmEntry",
    "WarmProcess",
    "WarmServer",
    "environ_block",
    "main",
    "release_blas_threads",
    "serve",
    "start_variables_differ",
    "thread_variables_refused",
    "threads",
    "warm_entry",
    "warm_start_enabled",
]
