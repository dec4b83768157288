"""The warm spawn server: a process that imports torch once and forks each attempt from it.

:class:`~gpufleet.backends.local.warm.WarmServer` starts it (``python -c`` ``warm.SERVER_CODE``
``FD [--world-size N]``, this module's :func:`main`). It imports what every attempt would
(``warm.PRELOADED``), says it is ready, then forks a child per request on the
unix socket ``FD`` and reports each child's exit there. It serves the attempts of one world size: single
processes (the local scheduler's, the default), or the ranks of one group (``--world-size N``, the rank
supervisor's), because the runtime reads ``WORLD_SIZE`` when it is imported and a fork keeps what was read.

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
  global state, torch's default generator); signal handlers and mask as at interpreter start; the
  thread counts its environment names applied to torch and OpenBLAS, which read theirs in the server;
- its exit status as a fresh process's: a ``SystemExit`` code, 1 with the traceback on an
  exception, death by SIGINT on ``KeyboardInterrupt``. At exit it joins non-daemon threads, runs
  the ``atexit`` handlers and flushes every open file, then leaves without tearing the interpreter
  down (objects alive at exit are not finalised, which Python never promises either).

What cannot be the same is refused (:func:`refusal`, the reasons ``warm.py`` describes), and the caller
starts that attempt the ordinary way. The server is single-threaded when it forks: it refuses to fork
otherwise (numpy's BLAS pool, the one thread an import starts, is stopped first).
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
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpufleet.backends.local.warm import (
    MAX_MESSAGE,
    PRELOADED,
    THREAD_VARIABLES,
    WarmEntry,
    environ_block,
    serves_world_size,
    start_variables_differ,
    thread_count,
    thread_variables_refused,
    warm_entry,
)
from gpufleet.jobs.deathsig import NOT_STARTED, die_with_parent
from gpufleet.numpy_cpu import without_own_setting

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
    world_size: int = 1
    """The ``WORLD_SIZE`` of the attempts it forks: 1 for single processes, else the ranks of one group."""


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


def serve(fd: int, world_size: int = 1) -> int:
    """The server's loop: import, say ready, then fork on request and report each child's exit."""
    sock = socket.socket(fileno=fd)
    try:
        return _serve(sock, world_size)
    except ConnectionError:  # the scheduler closed its end first: nobody is left to serve
        return 0


def _serve(sock: socket.socket, world_size: int) -> int:
    start_env = without_own_setting(os.environ)  # as an attempt's is: without gpufleet's numpy setting
    for name in PRELOADED:
        importlib.import_module(name)
    release_blas_threads()
    gc.collect()
    gc.freeze()  # the server's objects: never scanned by a child's collector (nor copied on write by it)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    start, end = _original_environ_span()
    server = _Server(sock, wake_r, wake_w, sys.path[1:], end - start, start_env, world_size)
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
    world_size = request["env"].get("WORLD_SIZE", "")
    if not serves_world_size(server.world_size, world_size):
        return _world_size_refusal(server.world_size, world_size)
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


def _world_size_refusal(served: int, requested: str) -> str:
    """Why a request of another world size is refused: the runtime read the server's at import."""
    if served == 1:
        return "a rank of a group starts as a new process"
    return f"WORLD_SIZE {requested!r} is not the warm rank server's {str(served)!r}, which the runtime read at import"


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


def _apply_threads(env: Mapping[str, str]) -> None:
    """The thread counts ``env`` names, as torch and OpenBLAS read them when a new interpreter loads them.

    Both read them once, when the server imported them: without this a child with
    ``OMP_NUM_THREADS=4`` (the scheduler's share of the cores) would run with the server's count.
    """
    omp, mkl, blas = (thread_count(env, name) for name in THREAD_VARIABLES)
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


# ---- the process --------------------------------------------------------------------------------

USAGE = (
    "usage: python -c SERVER_CODE FD [--world-size N] "
    "(the local scheduler and the rank supervisor start the warm server)"
)


def parse_args(argv: Sequence[str]) -> tuple[int, int] | None:
    """``FD [--world-size N]`` as the socket's descriptor and the world size served (``None``: not that)."""
    if len(argv) == 1:
        argv = [*argv, "--world-size", "1"]
    if len(argv) != 3 or argv[1] != "--world-size" or not argv[0].isdigit() or not argv[2].isdigit():
        return None
    if int(argv[2]) < 1:
        return None
    return int(argv[0]), int(argv[2])


def main(argv: Sequence[str]) -> None:
    """The server process (``SERVER_CODE FD [--world-size N]``): serve spawn requests on ``FD``, then leave.

    Its own ``WORLD_SIZE`` must be one it serves: the runtime it preloads reads it at import.
    """
    parsed = parse_args(argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        os._exit(2)
    fd, world_size = parsed
    own = os.environ.get("WORLD_SIZE", "")
    if not serves_world_size(world_size, own):
        print(
            f"gpufleet warm server: WORLD_SIZE {own!r} in its environment is not the world size {world_size} it "
            "serves (the runtime it preloads reads it at import): pass the group's WORLD_SIZE as --world-size",
            file=sys.stderr,
        )
        os._exit(2)
    os._exit(serve(fd, world_size))  # nothing to tear down: leaving at once lets the scheduler go on


__all__ = [
    "USAGE",
    "main",
    "parse_args",
    "refusal",
    "release_blas_threads",
    "serve",
    "threads",
]
