"""Run the fuzz cases of ``fuzz_cases.py`` against the real CLI and check the contract of every command.

For any input, a command that reads a file or a number must

(a) exit 0, 1 (a check it ran failed) or 2 (bad input); 3 only where a network service it needs is
    unreachable (cases that can reach Slurm, Ray, MLflow or a trace collector);
(b) never print a Python traceback;
(c) on exit 2, print exactly one non-empty line on stderr (the error);
(d) on exit 2, leave ``$GPUFLEET_HOME`` exactly as it was: same paths, sizes, sha256 and mtimes,
    no ``state.db``, ``state.db-wal`` or ``state.db-shm`` appearing (and, as docs/getting-started.md promises
    "nothing written", the working directory too);
(e) finish within a wall-clock timeout, a CPU limit (``RLIMIT_CPU``) and an address-space limit
    (``RLIMIT_AS``): a hang, a spin or a memory blow-up is a violation, as is a file over
    ``RLIMIT_FSIZE`` or death by a signal;
(f) write nothing outside its working directory and its home: ``$HOME`` and ``$TMPDIR`` point into
    the case's folder and must be left empty, and so must every other corner of that folder.

Importing gpufleet, torch, pandas and MLflow takes seconds, so the runner is a fork server: the
parent imports them once (with stdout and stderr pointed at ``/dev/null`` while the Rich consoles
are built, as for a redirected run) and, for each case, forks a child that sets up the case's
folder, environment and limits, points fd 0/1/2 at ``/dev/null`` and two files, sets
``sys.argv`` and calls ``gpufleet.cli.app.main()``. The child leaves through ``os._exit`` with the
command's exit status (an uncaught exception prints its traceback and exits 99), so no ``atexit``
handler or buffered output of the parent runs twice; before that it closes the SQLite connections
the command left open, as a normal interpreter exit would, so a WAL file is judged as a real run
leaves it. The parent stays single-threaded (Arrow's jemalloc background thread is turned off and
the thread count checked before every fork); with ``--exec`` each child execs a fresh interpreter
instead, which is slower but exactly the real ``gpufleet`` (use it to confirm a reproducer).

The local backend's scheduler is never started: ``ensure_scheduler`` is replaced by a stand-in that
validates the environment and creates the home as the real one does, but launches nothing. A case
that serves (``observe exporter``) is fetched once when its port file appears, then stopped with
SIGTERM, and must exit 0.

A serving case with ``http`` steps (``gpufleet serve``) is sent each step's raw request instead, over
a fresh loopback connection with every wait bounded (:func:`http_exchange`), and each answer is
judged (:func:`judge`, violations of kind ``http``): the status the step expects (a foreign ``Host``:
400/403/421; no token: 401/403; too large: 413; ...), no 5xx but a 503 the step allows, the security
headers (CSP, ``X-Content-Type-Options: nosniff``, ``X-Frame-Options``), and no absolute path of the
case's folder or of the repository in the body. Then it is stopped with SIGTERM, must exit 0 and
must not flood stderr. A case marked ``must_refuse`` (a crafted input) must not exit 0, and one
marked ``quiet`` may print at most one stderr line, and no warning.

Usage::

    python tests/fuzz/fuzz_runner.py --cases 2000 --seed 1 --jobs 2 --report report.json
    python tests/fuzz/fuzz_runner.py --seed 1 --only 1234 --keep /tmp/case  # one case, its folder kept
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import http.client
import importlib
import json
import os
import re
import resource
import signal
import socket
import sqlite3
import stat
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from fuzz_cases import (  # noqa: E402 - the folder above is on sys.path first
    HOME_MARK,
    INDEX_MARK,
    PORT_MARK,
    REPO,
    SURFACE_ORDER,
    SURFACES,
    TOKEN_MARK,
    WEBHOOK_NOW,
    WEBHOOK_SECRET,
    Case,
    HttpStep,
    Templates,
    make_case,
    materialize_home,
    surface_of,
    write_file,
)

DEVICES = ("/dev/null", "/dev/full", "/dev/zero")
"""Devices cases write to or read from: each must still be one after every case."""
ALLOWED_EXITS = frozenset({0, 1, 2})
SERVICE_EXIT = 3
CRASH_EXIT = 99
"""What a child exits with when the command raised (its traceback is on stderr)."""
TRACEBACK = "Traceback (most recent call last)"
WEBHOOK_STATUSES = frozenset({202, 400, 401, 409, 413, 422})
"""What ``AlertReceiver.handle`` may answer when its handler never fails (a 500 is a bug)."""
PRELOAD = (
    "torch",
    "numpy",
    "pandas",
    "pyarrow",
    "pyarrow.parquet",
    "scipy.stats",
    "matplotlib",
    "matplotlib.pyplot",
    "mlflow",
    "gpufleet.cli.app",
)
SCRUBBED_ENV = ("GPUFLEET_", "MLFLOW_", "OTEL_", "SLURM_", "RAY_", "COLUMNS", "LINES", "PYTHONSTARTUP")
SECURITY_HEADERS = ("content-security-policy", "x-content-type-options", "x-frame-options")
"""Headers every answer of ``gpufleet serve`` carries (``X-Content-Type-Options`` must say ``nosniff``)."""
SERVE_STDERR_LINES = 50
"""A server stopped after its exchanges printed at most this many stderr lines (no line per request)."""
HTTP_TIMEOUT_S = 10.0
"""How long one exchange may wait for an answer; a server silent for longer is reported."""
HTTP_BUDGET_S = 40.0
"""How long all the exchanges of one case may take; the steps left are skipped (and said so)."""
HTTP_BODY_LIMIT = 4 << 20
HASH_LIMIT = 64 << 20
"""Files larger than this are compared by size and mtime, not hashed."""

Target = Callable[[Case], int]
"""What a child runs once the case is set up; returns the exit status (``SystemExit`` is honoured too)."""


@dataclass
class Limits:
    wall_s: float = 60.0
    idle_s: float = 20.0
    """A case that uses no CPU for this long is blocked (a FIFO, a lock, a socket): a hang."""
    cpu_s: int = 20
    address_space: int = 4 << 30
    file_size: int = 256 << 20


@dataclass
class Violation:
    kind: str
    detail: str


@dataclass
class Result:
    seed: int
    index: int
    surface: str
    argv: list[str]
    files: dict[str, str]
    notes: list[str]
    exit_code: int | None
    signal: int | None
    seconds: float
    maxrss_kb: int
    violations: list[Violation] = field(default_factory=list)
    stdout_tail: str = ""
    stderr_tail: str = ""

    @property
    def reproducer(self) -> str:
        keep = f"/tmp/gpufleet-fuzz-{self.seed}-{self.index}"
        return f"python tests/fuzz/fuzz_runner.py --seed {self.seed} --only {self.index} --keep {keep}"

    @property
    def outcome(self) -> str:
        if self.exit_code is not None:
            return f"exit {self.exit_code}"
        if self.signal is not None:
            return f"signal {self.signal}"
        return "not run"


# ---- the child side ------------------------------------------------------------------------------


def _exit_status(code: object) -> int:
    """What ``sys.exit(code)`` makes a process exit with."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _replace_scheduler() -> None:
    """Let ``submit`` and friends run the client side only: nothing launches a local scheduler."""
    from gpufleet.backends.local import process as local
    from gpufleet.cli import jobs
    from gpufleet.jobs.protocol import check_environment
    from gpufleet.paths import scheduler_log

    def ensure_scheduler(home: Path) -> None:  # the checks and writes of the real one, minus the launch
        if local.scheduler_pid(home) is not None:
            return
        check_environment(os.environ)
        home.mkdir(parents=True, exist_ok=True)
        scheduler_log(home).open("ab").close()

    local.ensure_scheduler = ensure_scheduler
    jobs.ensure_scheduler = ensure_scheduler  # type: ignore[attr-defined]


def cli_target(case: Case) -> int:
    """``gpufleet <argv>`` in this process, as the console script runs it."""
    from gpufleet.cli import app

    _replace_scheduler()
    sys.argv = ["gpufleet", *case.argv]
    try:
        app.main()
    except SystemExit as exit_:
        return _exit_status(exit_.code)
    return 0


def webhook_target(case: Case) -> int:
    """One request (``request.json`` headers, ``body.bin``) through ``AlertReceiver.handle``."""
    from gpufleet.quality.webhook import AlertPayload, AlertReceiver

    request = json.loads(Path("request.json").read_text(encoding="utf-8"))
    body = Path("body.bin").read_bytes()
    calls: list[str] = []

    def handler(alert: AlertPayload, key: str) -> dict[str, Any]:
        calls.append(key)
        return {"job_id": len(calls), "model": alert.model}

    journal = Path("journal.jsonl") if os.path.lexists("journal.jsonl") else None
    receiver = AlertReceiver(WEBHOOK_SECRET, handler, clock=lambda: float(WEBHOOK_NOW), journal=journal)
    reply = receiver.handle(request["headers"], body)
    print(json.dumps({"status": reply.status, "body": reply.body}, default=str))
    if reply.status not in WEBHOOK_STATUSES or (reply.status == 202) != (len(calls) == 1):
        print(f"webhook: status {reply.status} with {len(calls)} handler call(s)", file=sys.stderr)
        return 98
    return 0


TARGETS: dict[str, Target] = {"cli": cli_target, "webhook": webhook_target}


@dataclass
class CasePaths:
    root: Path
    work: Path
    home: Path
    user_home: Path
    tmp: Path
    io: Path

    @classmethod
    def under(cls, root: Path) -> CasePaths:
        return cls(root, root / "w1" / "w2" / "work", root / "home", root / "u", root / "t", root / "io")

    def make(self) -> None:
        for path in (self.work, self.user_home, self.tmp, self.io):
            path.mkdir(parents=True, exist_ok=True)


def _child_env(case: Case, paths: CasePaths) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_ENV)}
    env.update(
        GPUFLEET_HOME=str(paths.home),
        HOME=str(paths.user_home),
        TMPDIR=str(paths.tmp),
        GPUFLEET_RAY_DIR=str(paths.root / "no-ray"),
        PYTHONHASHSEED="0",
    )
    env.update(case.env)
    return env


class _Connections:
    """``sqlite3.connect``, recording every connection so that the child can close them at its end."""

    def __init__(self) -> None:
        self.opened: list[sqlite3.Connection] = []
        self._connect = sqlite3.connect

    def __call__(self, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = self._connect(*args, **kwargs)
        self.opened.append(conn)
        return conn

    def close_all(self) -> None:
        for conn in self.opened:
            with contextlib.suppress(Exception):
                conn.close()


def _set_limits(limits: Limits) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 2))
    resource.setrlimit(resource.RLIMIT_AS, (limits.address_space, limits.address_space))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size, limits.file_size))


def _redirect(paths: CasePaths) -> None:
    fds = (
        os.open(os.devnull, os.O_RDONLY),
        os.open(paths.io / "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        os.open(paths.io / "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
    )
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    # Fresh text streams over the new descriptors, as a new interpreter would have (the parent's may be
    # pytest's capture objects, or hold its buffered output).
    like_out, like_err = sys.__stdout__, sys.__stderr__
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stdout = open(  # noqa: SIM115
        1,
        "w",
        encoding=getattr(like_out, "encoding", None) or "utf-8",
        errors=_errors(like_out, "strict"),
        closefd=False,
    )
    sys.stderr = open(  # noqa: SIM115
        2,
        "w",
        buffering=1,
        encoding=getattr(like_err, "encoding", None) or "utf-8",
        errors=_errors(like_err, "backslashreplace"),
        closefd=False,
    )


def _errors(stream: object, default: str) -> str:
    errors = getattr(stream, "errors", None)
    return errors if isinstance(errors, str) else default


def _child(case: Case, paths: CasePaths, limits: Limits, target: Target | None, exec_mode: bool) -> None:
    """The forked child: set the case up, run it, leave with its exit status. Never returns."""
    code = CRASH_EXIT
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _redirect(paths)
        os.chdir(paths.work)
        env = _child_env(case, paths)
        _set_limits(limits)
        if exec_mode and target is None:
            argv = [sys.executable, str(Path(__file__).resolve()), "--exec-target", case.target, "--", *case.argv]
            os.execve(sys.executable, argv, env)
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None
        connections = _Connections()
        sqlite3.connect = connections  # type: ignore[assignment]
        try:
            code = (target or TARGETS[case.target])(case)
        except SystemExit as exit_:
            code = _exit_status(exit_.code)
        except BaseException:  # noqa: BLE001 - any escape is what the check is for
            traceback.print_exc()
            code = CRASH_EXIT
        finally:
            connections.close_all()
    except BaseException:  # noqa: BLE001 - the harness itself failed: say so, loudly
        with contextlib.suppress(BaseException):
            traceback.print_exc()
        code = CRASH_EXIT
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        with contextlib.suppress(BaseException):
            (paths.io / "code").write_text(str(code))
        os._exit(code & 0xFF if 0 <= code <= 255 else CRASH_EXIT)


def exec_main(target_name: str, argv: list[str]) -> int:
    """``--exec-target``: the case in a fresh interpreter that exits the normal way."""
    case = Case(seed=0, index=0, surface="exec", argv=argv, target=target_name)
    return TARGETS[target_name](case)


# ---- snapshots -----------------------------------------------------------------------------------

Entry = tuple[str, int, str, int]
"""(type, size, sha256 or link target, mtime_ns) of one path."""


def snapshot(root: Path, skip: Sequence[Path] = ()) -> dict[str, Entry]:
    """Every path under ``root`` (links not followed); folders by existence only."""
    out: dict[str, Entry] = {}
    if not root.is_dir():
        return out
    skipped = {str(p) for p in skip}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skipped]
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            try:
                info = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                out[rel] = ("dir", 0, "", 0)
            elif stat.S_ISLNK(info.st_mode):
                out[rel] = ("link", 0, os.readlink(full), 0)
            elif stat.S_ISREG(info.st_mode):
                out[rel] = ("file", info.st_size, _digest(full, info.st_size), info.st_mtime_ns)
            else:
                out[rel] = ("other", 0, "", info.st_mtime_ns)
    return out


def _digest(path: str, size: int) -> str:
    if size > HASH_LIMIT:
        return "(large)"
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError as err:
        return f"(unreadable: {err.strerror})"
    return h.hexdigest()


def diff(before: dict[str, Entry], after: dict[str, Entry]) -> list[str]:
    """``+path``, ``-path`` and ``~path`` (changed) lines, sorted."""
    lines = [f"+{p}" for p in after.keys() - before.keys()]
    lines += [f"-{p}" for p in before.keys() - after.keys()]
    lines += [f"~{p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(lines)


# ---- the parent side -----------------------------------------------------------------------------


def os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def quiet_environment() -> None:
    """No helper threads in this process (a fork server must have none), one thread per case for torch."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")  # Arrow's jemalloc thread
    os.environ.setdefault("MPLBACKEND", "Agg")
    for name in ("COLUMNS", "LINES"):  # the consoles are built as for output into a file
        os.environ.pop(name, None)


def preload() -> list[str]:
    """Import what the commands import, with the Rich consoles built as for a redirected run."""
    quiet_environment()
    saved = sys.stdout, sys.stderr
    failed: list[str] = []
    with open(os.devnull, "w", encoding="utf-8") as null:
        sys.stdout = sys.stderr = null
        try:
            for name in PRELOAD:
                try:
                    importlib.import_module(name)
                except ImportError:
                    failed.append(name)
            import gpufleet

            for name in _gpufleet_modules(gpufleet.__path__):
                try:
                    importlib.import_module(name)
                except Exception:  # noqa: BLE001 - an optional extra missing: the child imports it itself
                    failed.append(name)
        finally:
            sys.stdout, sys.stderr = saved
    gc.collect()
    gc.freeze()  # the children's collections then skip the preloaded objects (and their pages stay shared)
    return failed


def _gpufleet_modules(path: Iterable[str]) -> Iterator[str]:
    import pkgutil

    for info in pkgutil.walk_packages(list(path), "gpufleet."):
        if not info.name.endswith("__main__"):
            yield info.name


@dataclass
class _Running:
    case: Case
    paths: CasePaths
    pid: int
    started: float
    deadline: float
    home_before: dict[str, Entry]
    work_before: dict[str, Entry]
    outside_before: dict[str, Entry]
    setup_problems: list[str]
    """What failed while the home was prepared with gpufleet's own code (the scheduler's ingest)."""
    timed_out: bool = False
    blocked_in: str | None = None
    """Where a case that stopped using CPU was blocked (its ``wchan``) when it was killed."""
    cpu_ticks: int = -1
    cpu_moved_at: float = 0.0
    next_probe: float = 0.0
    served: str | None = None
    """What the served endpoint answered (``serves`` cases), once it was fetched."""
    http: list[Violation] = field(default_factory=list)
    """What the exchanges of a case with ``http`` steps found wrong."""


class Runner:
    def __init__(
        self,
        root: Path,
        *,
        limits: Limits | None = None,
        jobs: int = 1,
        target: Target | None = None,
        exec_mode: bool = False,
        keep: bool = False,
        templates: Templates | None = None,
    ) -> None:
        self.root = root
        self.limits = limits or Limits()
        self.jobs = max(1, jobs)
        self.target = target
        self.exec_mode = exec_mode
        self.keep = keep
        self.templates = templates or Templates()
        self.baseline_rss_kb = 0
        self.thread_warnings = 0

    # -- one case
    def _start(self, case: Case) -> _Running:
        if self.target is None and case.target not in TARGETS:
            raise RuntimeError(" ".join(case.argv))
        paths = CasePaths.under(self.root / f"case-{case.seed}-{case.index}")
        if paths.root.exists():
            _remove(paths.root)
        paths.make()
        for name, content in case.files.items():
            write_file(paths.work / name, content)
        for name in case.private:
            os.chmod(paths.work / name, 0o600)
        problems = materialize_home(case.home, paths.home) if case.home is not None else []
        case.argv = [a.replace(HOME_MARK, str(paths.home)) for a in case.argv]
        home_before = snapshot(paths.home)
        work_before = snapshot(paths.work)
        outside_before = snapshot(paths.root, skip=(paths.work, paths.home, paths.io))
        if os_threads() > 1:
            self.thread_warnings += 1
        sys.stdout.flush()
        sys.stderr.flush()
        self.baseline_rss_kb = max(self.baseline_rss_kb, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        pid = os.fork()
        if pid == 0:
            _child(case, paths, self.limits, self.target, self.exec_mode)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        now = time.monotonic()
        return _Running(
            case, paths, pid, now, now + self.limits.wall_s, home_before, work_before, outside_before, problems
        )

    def _unstarted(self, case: Case, err: Exception) -> Result:
        detail = "".join(traceback.format_exception_only(err)).strip()
        return Result(
            seed=case.seed,
            index=case.index,
            surface=case.surface,
            argv=[_clip(a) for a in case.argv],
            files=case.describe_files(),
            notes=case.notes,
            exit_code=None,
            signal=None,
            seconds=0.0,
            maxrss_kb=0,
            violations=[Violation("harness", f"the case could not be set up: {detail}")],
        )

    def _serve(self, run: _Running) -> None:
        """A serving case: fetch its endpoint once its port file is there, then SIGTERM it."""
        if run.case.serves is None or run.served is not None:
            return
        port_file = run.paths.work / run.case.serves
        try:
            port = int(port_file.read_text().strip())
        except (OSError, ValueError):
            return
        if run.case.http is not None:
            run.served = "exchanged"
            run.http = exchange_all(run.case, port, _token_of(run), _private_paths(run.paths))
            with contextlib.suppress(ProcessLookupError):
                os.kill(run.pid, signal.SIGTERM)
            run.deadline = min(run.deadline, time.monotonic() + 10)
            return
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", run.case.serves_path)
            response = conn.getresponse()
            response.read()
            run.served = f"{response.status}"
            conn.close()
        except (OSError, http.client.HTTPException) as err:
            run.served = f"error: {err}"
        with contextlib.suppress(ProcessLookupError):
            os.kill(run.pid, signal.SIGTERM)
        run.deadline = min(run.deadline, time.monotonic() + 10)

    def _watch(self, run: _Running) -> None:
        """Kill a case past its wall-clock deadline, or one that has not used CPU for ``idle_s``."""
        now = time.monotonic()
        if run.timed_out or now < run.next_probe:
            return
        run.next_probe = now + 0.2
        ticks = _cpu_ticks(run.pid)
        if ticks != run.cpu_ticks:
            run.cpu_ticks, run.cpu_moved_at = ticks, now
        idle = now - max(run.cpu_moved_at, run.started)
        if now > run.deadline or idle > self.limits.idle_s:
            if now <= run.deadline:
                run.blocked_in = _wchan(run.pid)
            run.timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)

    def _finish(self, run: _Running, status: int, usage: resource.struct_rusage) -> Result:
        seconds = time.monotonic() - run.started
        left = False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, signal.SIGKILL)  # anything the command started and left behind
            left = True
        code: int | None = None
        sig: int | None = None
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
            with contextlib.suppress(OSError, ValueError):
                code = int((run.paths.io / "code").read_text())
        else:
            sig = os.WTERMSIG(status)
        out = _read_tail(run.paths.io / "stdout")
        err = _read_tail(run.paths.io / "stderr")
        case = run.case
        result = Result(
            seed=case.seed,
            index=case.index,
            surface=case.surface,
            argv=[_clip(a) for a in case.argv],
            files=case.describe_files(),
            notes=case.notes,
            exit_code=code,
            signal=sig,
            seconds=round(seconds, 3),
            maxrss_kb=usage.ru_maxrss,
            stdout_tail=out[-2000:],
            stderr_tail=err[-4000:],
        )
        result.violations = self._check(run, result, out, err, left)
        if not self.keep:
            _remove(run.paths.root)
        return result

    def _check(self, run: _Running, r: Result, out: str, err: str, left: bool) -> list[Violation]:
        v: list[Violation] = []
        case, paths = run.case, run.paths
        v.extend(Violation("ingest", problem) for problem in run.setup_problems)
        crashed = TRACEBACK in out or TRACEBACK in err
        if crashed:
            last = _traceback_summary(err if TRACEBACK in err else out)
            kind = "memory" if "MemoryError" in last or "bad_alloc" in last else "traceback"
            v.append(Violation(kind, last))
        if run.timed_out and run.blocked_in is not None:
            v.append(
                Violation("hang", f"used no CPU for {self.limits.idle_s:g} s, blocked in {run.blocked_in} (killed)")
            )
        elif run.timed_out:
            v.append(Violation("timeout", f"still running after {self.limits.wall_s:g} s (killed)"))
        elif r.signal is not None:
            names = {signal.SIGXCPU: "cpu-limit", signal.SIGXFSZ: "file-size", signal.SIGKILL: "killed"}
            kind = names.get(signal.Signals(r.signal), "signal")
            v.append(Violation(kind, f"died of {signal.Signals(r.signal).name}"))
        code = r.exit_code
        expected = code in ALLOWED_EXITS or (crashed and code == CRASH_EXIT)
        if code is not None and not expected and not (code == SERVICE_EXIT and case.service_exit_ok):
            v.append(Violation("exit-code", f"exit {code}: {_first_line(err)}"))
        if code in (2, SERVICE_EXIT) and not crashed:
            lines = [line for line in err.splitlines() if line.strip()]
            if len(lines) != 1 or err.strip("\n").count("\n"):
                shown = " | ".join(_clip(line, 150) for line in lines[:3])
                v.append(Violation("stderr-lines", f"exit {code} with {len(lines)} non-empty stderr lines: {shown}"))
        if code == 2:
            changed = diff(run.home_before, snapshot(paths.home))
            remote = case.home is not None and any(j.backend in ("ray", "slurm") for j in case.home.jobs)
            if remote or case.service_exit_ok:
                # A command refreshes remote jobs' states (the Ray actor's status file, sacct) before it
                # judges its input: a state.db brought up to date is a sync, not a write of the refused input.
                # And a job a live scheduler refuses (sbatch) was written, then removed: its row is gone,
                # only SQLite's pages and the id counter moved.
                changed = [c for c in changed if c != "~state.db"]
            # The store's page-check marker (state.db.sound) is a cache of a check any read makes, refreshed when
            # the file changed since: not the refused input written.
            changed = [c for c in changed if c[1:] != "state.db.sound"]
            if changed:
                v.append(Violation("home-changed", "exit 2 but the home changed: " + ", ".join(changed[:8])))
            wrote = diff(run.work_before, snapshot(paths.work))
            if wrote:
                v.append(Violation("cwd-changed", "exit 2 but the working folder changed: " + ", ".join(wrote[:8])))
        outside = diff(run.outside_before, snapshot(paths.root, skip=(paths.work, paths.home, paths.io)))
        # torch's own compile cache ($TMPDIR/torchinductor_<user>), which any torch program may create.
        outside = [o for o in outside if "torchinductor_" not in o]
        for device in DEVICES:  # cases name /dev/null and /dev/full as outputs: a rename would replace them
            if not Path(device).is_char_device():
                v.append(Violation("device-replaced", f"{device} is no longer a character device"))
        if outside:
            v.append(
                Violation("wrote-outside", "written outside the working folder and home: " + ", ".join(outside[:8]))
            )
        if case.must_refuse and code == 0:
            v.append(Violation("accepted", "exit 0 on an input it must refuse: " + "; ".join(case.notes[:2])))
        if case.quiet and not crashed:
            lines = [line for line in err.splitlines() if line.strip()]
            noisy = [line for line in lines if "warn" in line.lower()]
            if len(lines) > 1 or noisy:
                shown = " | ".join(_clip(line, 150) for line in (noisy or lines)[:3])
                v.append(Violation("stderr-noise", f"{r.outcome} with {len(lines)} stderr line(s): {shown}"))
        if case.http is not None:
            v.extend(run.http)
            lines = [line for line in err.splitlines() if line.strip()]
            if run.served is None and not v and code == 0:
                v.append(Violation("serve", "exited 0 without ever writing its port file"))
            elif run.served is not None and code != 0:
                v.append(Violation("serve", f"after its exchanges and SIGTERM: {r.outcome}: {_first_line(err)}"))
            if len(lines) > SERVE_STDERR_LINES:
                v.append(Violation("stderr-flood", f"{len(lines)} stderr lines while serving: {_clip(lines[-1], 150)}"))
        elif case.serves is not None:
            if run.served is None and not v and code == 0:
                v.append(Violation("serve", "exited 0 without ever writing its port file"))
            elif run.served is not None and (run.served != "200" or code != 0):
                v.append(
                    Violation("serve", f"GET {case.serves_path} answered {run.served}; after SIGTERM: {r.outcome}")
                )
        if left and not run.timed_out:
            v.append(Violation("left-process", "processes of the case were still running after it exited"))
        return v

    # -- many cases
    def run(self, cases: Iterable[Case], progress: Callable[[Result], None] | None = None) -> list[Result]:
        results: list[Result] = []
        pending = iter(cases)
        running: dict[int, _Running] = {}
        exhausted = False
        while True:
            while not exhausted and len(running) < self.jobs:
                case = next(pending, None)
                if case is None:
                    exhausted = True
                    break
                try:
                    run = self._start(case)
                except Exception as err:  # noqa: BLE001 - the harness failed to set the case up: report it
                    result = self._unstarted(case, err)
                    results.append(result)
                    if progress is not None:
                        progress(result)
                    continue
                running[run.pid] = run
            if not running:
                break
            for pid, run in list(running.items()):
                done_pid, status, usage = os.wait4(pid, os.WNOHANG)
                if done_pid == pid:
                    del running[pid]
                    result = self._finish(run, status, usage)
                    results.append(result)
                    if progress is not None:
                        progress(result)
                    continue
                self._serve(run)
                self._watch(run)
            time.sleep(0.003)
        return results


# ---- the exchanges of a serving case -------------------------------------------------------------


@dataclass
class Answer:
    """What the server sent back for one request (``status`` None: no answer, ``error`` says why)."""

    status: int | None
    headers: dict[str, str]
    body: bytes
    error: str | None = None


HALF_HEAD = b"GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
"""What a slow client sends before it stops: half a request head."""


def http_exchange(port: int, raw: bytes, *, slow: int = 0, timeout: float = HTTP_TIMEOUT_S) -> Answer:
    """Send ``raw`` to 127.0.0.1:``port`` on a fresh connection and read the answer, every wait bounded.

    The head goes first; the body follows in pieces only while no answer has come (a server may
    answer 401 or 413 without reading the body, and then close: the answer is read, not lost to a
    reset). ``slow`` connections, each holding half a request head, stay open meanwhile.
    """
    held: list[socket.socket] = []
    opening_ends = time.monotonic() + timeout / 2
    try:
        for _ in range(slow):
            if time.monotonic() > opening_ends:
                break
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=2.0)
            except OSError:
                break  # the server refuses more connections: what is held is the test
            held.append(conn)
            with contextlib.suppress(OSError):
                conn.sendall(HALF_HEAD)
        return _one_exchange(port, raw, timeout)
    finally:
        for conn in held:
            conn.close()


def _one_exchange(port: int, raw: bytes, timeout: float) -> Answer:
    import select

    head, sep, body = raw.partition(b"\r\n\r\n")
    method = raw.split(b" ", 1)[0].decode("latin-1")
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError as err:
        return Answer(None, {}, b"", f"cannot connect: {err}")
    try:
        with contextlib.suppress(OSError):
            sock.sendall(head + sep)
            for at in range(0, len(body), 16 << 10):
                if select.select([sock], [], [], 0.2 if at == 0 else 0)[0]:
                    break  # answered before the body: read that answer
                sock.sendall(body[at : at + (16 << 10)])
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        data = response.read(HTTP_BODY_LIMIT)
        headers = {k.lower(): v for k, v in response.getheaders()}
        return Answer(response.status, headers, data)
    except (OSError, http.client.HTTPException, ValueError) as err:
        return Answer(None, {}, b"", f"{type(err).__name__}: {err}".strip())
    finally:
        sock.close()


def judge(step: HttpStep, answer: Answer, private: Sequence[str]) -> str | None:
    """What is wrong with ``answer`` to ``step``, or None: its status, a 5xx, a host path, a missing header."""
    if answer.status is None:
        return f"no answer within {HTTP_TIMEOUT_S:g} s ({answer.error})"
    status = answer.status
    said = _clip(answer.body.decode("utf-8", "backslashreplace").replace("\n", " "), 160)
    if status >= 500 and not (status == 503 and step.allow_503):
        return f"answered {status}: {said}"
    if step.statuses and status not in step.statuses:
        return f"answered {status}, not {'/'.join(map(str, step.statuses))}: {said}"
    for path in private:
        if path.encode() in answer.body:
            return f"answered {status} with the host path {path} in its body: {said}"
    missing = [name for name in SECURITY_HEADERS if name not in answer.headers]
    if "x-content-type-options" not in missing and answer.headers["x-content-type-options"].lower() != "nosniff":
        missing.append("X-Content-Type-Options: nosniff")
    if missing:
        return f"answered {status} without {', '.join(missing)}"
    return None


def exchange_all(case: Case, port: int, token: bytes, private: Sequence[str]) -> list[Violation]:
    """Every step of ``case.http`` against the server on ``port``; the first problem of each step is reported."""
    found: list[Violation] = []
    ends = time.monotonic() + HTTP_BUDGET_S
    for n, step in enumerate(case.http or []):
        if time.monotonic() > ends:
            found.append(Violation("http", f"steps {n} and later not sent: the exchanges took {HTTP_BUDGET_S:g} s"))
            break
        raw = step.raw.replace(PORT_MARK, str(port).encode()).replace(TOKEN_MARK, token)
        for i in range(step.repeat):
            answer = http_exchange(port, raw.replace(INDEX_MARK, str(i).encode()), slow=step.slow)
            problem = judge(step, answer, private)
            if problem is not None:
                found.append(Violation("http", f"step {n} ({step.describe()}): {problem}"))
                break
    return found


def _token_of(run: _Running) -> bytes:
    """The token a serving case's server uses: its ``--token-file``, else ``$GPUFLEET_HOME/serve.token``."""
    argv = run.case.argv
    if "--no-token" in argv:
        return b""
    path = run.paths.home / "serve.token"
    if "--token-file" in argv[:-1]:
        path = run.paths.work / argv[argv.index("--token-file") + 1]
    try:
        return path.read_bytes().strip()
    except OSError:
        return b""


def _private_paths(paths: CasePaths) -> list[str]:
    """Absolute paths of this machine no answer may hold: the case's folder and the repository."""
    found = {str(paths.root), str(paths.root.resolve()), str(REPO)}
    return sorted(found, key=len, reverse=True)


def _cpu_ticks(pid: int) -> int:
    """User and system clock ticks of ``pid`` and of the children it waited for (-1 when gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return -1
    return sum(int(f) for f in fields[11:15])


def _wchan(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/wchan", encoding="ascii", errors="replace") as fh:
            where = fh.read().strip()
    except OSError:
        return "?"
    return where or "?"


def _remove(path: Path) -> None:
    import shutil

    def onerror(func: Callable[..., Any], p: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(p, 0o700)
            func(p)

    shutil.rmtree(path, onerror=onerror)


def _read_tail(path: Path, limit: int = 64 << 10) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", "backslashreplace")
    except OSError:
        return ""


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[: limit - 40]}...({len(text)} chars)"


def _first_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return _clip(lines[-1], 200) if lines else "(no stderr)"


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')


def _traceback_summary(text: str) -> str:
    """``ExceptionType: message (at gpufleet/x.py:12 in f)``: the last line and the innermost gpufleet frame."""
    lines = text[text.rfind(TRACEBACK) :].splitlines()
    where = ""
    last_frame = 0
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m:
            last_frame = i
            if "/gpufleet/" in m.group(1) and "/tests/" not in m.group(1):
                where = f"{m.group(1).split('/gpufleet/', 1)[1]}:{m.group(2)} in {m.group(3)}"
    after = lines[last_frame + 1 :]
    last = next((line.strip() for line in after if line.strip() and not line.startswith(" ")), "?")
    return _clip(last, 240) + (f" (at gpufleet/{where})" if where else "")


def signature(v: Violation, r: Result) -> str:
    """What groups violations of one root cause: the exception and frame, or the kind and the command."""
    if v.kind in ("traceback", "memory"):
        text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", v.detail)
        text = re.sub(r"\d{4,}", "N", text)
        return f"{v.kind}: {text[:200]}"
    if v.kind == "http":  # by the kind of request and what was wrong with the answer
        m = _HTTP_DETAIL.match(v.detail)
        if m:
            return f"http: {m.group(1)}: {m.group(2)}"
    command = " ".join(a for a in r.argv[:3] if not a.startswith("-") and "/" not in a and "." not in a)[:40]
    return f"{v.kind}: {command}"


_HTTP_DETAIL = re.compile(
    r"step \d+ \(([^:]*): .*?\): (answered \d+(?:, not [\d/]+| without [^:]+| with the host path)?|no answer)"
)


# ---- choosing cases and reporting ----------------------------------------------------------------


def generate(seed: int, indices: Iterable[int], templates: Templates) -> Iterator[Case]:
    """The cases; one the generator fails to make becomes a case that reports the failure."""
    for index in indices:
        try:
            yield make_case(seed, index, templates)
        except Exception as err:  # noqa: BLE001 - a generator bug must not end the run
            detail = "".join(traceback.format_exception_only(err)).strip()
            yield Case(seed, index, surface_of(index), ["<generator failed>", detail], target="broken")


def case_indices(count: int, *, start: int = 0, surfaces: Sequence[str] = (), only: Sequence[int] = ()) -> list[int]:
    if only:
        return list(only)
    if not surfaces:
        return list(range(start, start + count))
    wanted = set(surfaces)
    out: list[int] = []
    i = start
    while len(out) < count:
        if surface_of(i) in wanted:
            out.append(i)
        i += 1
    return out


def build_templates(root: Path) -> Templates:
    """The checkpoint and Parquet templates, built in a subprocess (it may start threads; we must not)."""
    folder = root / "templates"
    if not folder.is_dir():
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess_run([sys.executable, str(HERE / "fuzz_cases.py"), "--templates", str(folder)], env)
    return Templates.load(folder)


def subprocess_run(argv: list[str], env: dict[str, str]) -> None:
    import subprocess

    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")


def summarize(results: Sequence[Result], wall_s: float, baseline_rss_kb: int) -> tuple[str, dict[str, Any]]:
    by_surface = Counter(r.surface for r in results)
    exits = Counter(r.outcome for r in results)
    violations = [(r, v) for r in results for v in r.violations]
    groups: dict[str, list[tuple[Result, Violation]]] = {}
    for r, v in violations:
        groups.setdefault(signature(v, r), []).append((r, v))
    longest = max(results, key=lambda r: r.seconds, default=None)
    largest = max(results, key=lambda r: r.maxrss_kb, default=None)
    lines = [
        f"cases: {len(results)} in {wall_s:.1f} s wall ({wall_s / max(1, len(results)) * 1000:.0f} ms a case; "
        f"{sum(r.seconds for r in results) / max(1, len(results)) * 1000:.0f} ms of child time a case)",
        "per surface: " + ", ".join(f"{s} {n}" for s, n in sorted(by_surface.items())),
        "outcomes: " + ", ".join(f"{k}: {n}" for k, n in sorted(exits.items())),
    ]
    if longest is not None:
        lines.append(f"longest: {longest.seconds:.2f} s, {longest.surface}: gpufleet {_argv_line(longest.argv)}")
    if largest is not None:
        lines.append(
            f"largest memory: {largest.maxrss_kb / 1024:.0f} MiB max RSS (the fork server alone: "
            f"{baseline_rss_kb / 1024:.0f} MiB), {largest.surface}: gpufleet {_argv_line(largest.argv)}"
        )
    lines.append(f"violations: {len(violations)} in {len(groups)} group(s)")
    for sig, items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        r, v = items[0]
        lines.append(f"  [{len(items)}] {sig}")
        lines.append(f"      e.g. {r.surface}: gpufleet {_argv_line(r.argv)}")
        lines.append(f"      {v.detail[:300]}")
        lines.append(f"      reproduce: {r.reproducer}")
    for r, v in violations:
        lines.append(f"VIOLATION {v.kind} [{r.surface}] {r.reproducer}  # gpufleet {_argv_line(r.argv, 160)}")
    report = {
        "cases": len(results),
        "wall_seconds": round(wall_s, 2),
        "per_surface": dict(by_surface),
        "outcomes": dict(exits),
        "violations": len(violations),
        "groups": {sig: [f"{r.reproducer}" for r, _ in items] for sig, items in groups.items()},
        "results": [asdict(r) | {"reproducer": r.reproducer} for r in results if r.violations],
        "timings": [[r.index, r.surface, r.outcome, r.seconds, r.maxrss_kb] for r in results],
    }
    return "\n".join(lines), report


def _argv_line(argv: Sequence[str], limit: int = 200) -> str:
    return _clip(" ".join(json.dumps(a) if (not a or any(c in a for c in " \n\t'\"")) else a for a in argv), limit)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--exec-target"]:
        from gpufleet.cli import app as _app  # noqa: F401 - imported first, as the console script does

        rest = args[3:] if args[2:3] == ["--"] else args[2:]
        if args[1] == "cli":
            _replace_scheduler()
        return exec_main(args[1], rest)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0, help="first case index")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--surface", action="append", default=[], choices=sorted(SURFACES))
    p.add_argument("--only", type=int, action="append", default=[], help="run this case index (repeatable)")
    p.add_argument("--report", type=Path)
    p.add_argument("--keep", type=Path, help="keep every case's folder under this directory")
    p.add_argument("--timeout", type=float, default=60.0, help="wall-clock seconds a case may take")
    p.add_argument("--idle", type=float, default=20.0, help="seconds without CPU use after which a case hangs")
    p.add_argument("--cpu", type=int, default=20, help="CPU seconds a case may take (RLIMIT_CPU)")
    p.add_argument("--mem-gib", type=float, default=4.0, help="address space of a case (RLIMIT_AS)")
    p.add_argument("--exec", action="store_true", help="exec a fresh interpreter per case (slow, exact)")
    p.add_argument("--quiet", action="store_true")
    opts = p.parse_args(args)
    quiet_environment()
    indices = case_indices(opts.cases, start=opts.start, surfaces=opts.surface, only=opts.only)
    print(f"fuzz: {len(indices)} case(s) of seed {opts.seed}", file=sys.stderr, flush=True)
    keep = opts.keep is not None
    root = opts.keep.resolve() if keep else Path(tempfile.mkdtemp(prefix="gpufleet-fuzz-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        templates = build_templates(root)
        if not opts.exec:
            failed = preload()
            if failed:
                print(f"note: not preloaded: {', '.join(failed)}", file=sys.stderr)
        runner = Runner(
            root,
            limits=Limits(
                wall_s=opts.timeout,
                idle_s=opts.idle,
                cpu_s=opts.cpu,
                address_space=int(opts.mem_gib * (1 << 30)),
            ),
            jobs=opts.jobs,
            exec_mode=opts.exec,
            keep=keep,
            templates=templates,
        )
        started = time.monotonic()
        done = [0]
        bad = [0]
        last = [0.0]

        def progress(result: Result) -> None:
            done[0] += 1
            bad[0] += bool(result.violations)
            now = time.monotonic()
            if opts.quiet or (now - last[0] < 5 and done[0] != len(indices)):
                return
            last[0] = now
            rate = done[0] / max(1e-9, now - started)
            print(
                f"[{done[0]}/{len(indices)}] {rate:.1f} cases/s, {bad[0]} with violations", file=sys.stderr, flush=True
            )

        results = runner.run(generate(opts.seed, indices, templates), progress)
        text, report = summarize(results, time.monotonic() - started, runner.baseline_rss_kb)
        report["seed"] = opts.seed
        report["thread_warnings"] = runner.thread_warnings
        if runner.thread_warnings:
            text += f"\nwarning: the fork server had more than one thread at {runner.thread_warnings} fork(s)"
        print(text)
        if opts.report is not None:
            opts.report.write_text(json.dumps(report, indent=1, default=str, ensure_ascii=True))
        return 1 if report["violations"] else 0
    finally:
        if not keep:
            _remove(root)


__all__ = [
    "ALLOWED_EXITS",
    "SURFACE_ORDER",
    "Answer",
    "Limits",
    "Result",
    "Runner",
    "Target",
    "Violation",
    "case_indices",
    "cli_target",
    "diff",
    "exchange_all",
    "http_exchange",
    "judge",
    "main",
    "preload",
    "signature",
    "snapshot",
    "summarize",
    "webhook_target",
]


if __name__ == "__main__":
    sys.exit(main())
