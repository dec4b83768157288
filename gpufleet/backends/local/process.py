"""The local scheduler as a process: its slots, its lock and PID, the settings it started with, its start.

One scheduler process per ``$GPUFLEET_HOME`` (an ``flock`` on ``scheduler.lock``) owns the
attempts; ``submit`` starts it when none runs (:func:`ensure_scheduler`), and it exits after
``idle_exit`` seconds with nothing queued or running. Its PID is in ``scheduler.pid``. What it
started with (slots, a digest of its environment) is in ``scheduler-env.json``, so a client can
say when its own environment differs: a running scheduler keeps its own.

This is what the client side (``backend.py``) and the loop (``scheduler.py``) both need to know
of the process; it imports neither.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.errors import UsageError
from gpufleet.jobs.protocol import check_environment
from gpufleet.jobs.store import Store
from gpufleet.numpy_cpu import without_own_setting
from gpufleet.paths import scheduler_log, state_db
from gpufleet.paths import scheduler_pid as pid_file
from gpufleet.spec import JobSpec

DEFAULT_SLOTS = 1


def configured_slots() -> int:
    """``GPUFLEET_LOCAL_SLOTS``: the virtual GPU slots a scheduler started now would have."""
    raw = os.environ.get("GPUFLEET_LOCAL_SLOTS", str(DEFAULT_SLOTS))
    try:
        slots = int(raw)
    except ValueError:
        slots = 0
    if slots < 1:
        raise UsageError(f"GPUFLEET_LOCAL_SLOTS={raw!r} is invalid: give a positive number of virtual GPU slots")
    return slots


def slots_of(spec: JobSpec) -> int:
    """Virtual GPU slots a job holds: all its GPUs (one node here, so a slot per rank of a distributed job)."""
    return spec.total_gpus


def store_for(home: Path) -> Store:
    return Store(state_db(home))


def lock_file(home: Path) -> Path:
    """The scheduler's ``flock``: held by the one scheduler of ``home`` for as long as it runs."""
    return home / "scheduler.lock"


def scheduler_pid(home: Path) -> int | None:
    """PID of the running scheduler, or ``None`` (checked against the lock, not just the file)."""
    lock = lock_file(home)
    if not lock.exists():
        return None
    with lock.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return int(pid_file(home).read_text().strip())
            except (OSError, ValueError):
                return -1
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None


SETTINGS_PREFIXES = ("GPUFLEET_", "CUDA_", "NCCL_", "TORCH", "PYTHON", "OMP_", "HF_")
"""The variables whose change a running scheduler is checked for: those gpufleet reads (``GPUFLEET_*``:
its slots, its idle time, the runtime's settings) and the usual ones that change a training run. The
scheduler passes its whole environment on to every attempt it starts."""


def settings_file(home: Path) -> Path:
    """What the running scheduler started with: its PID, slots and a digest of each variable it checks."""
    return home / "scheduler-env.json"


def environment_digests(env: Mapping[str, str]) -> dict[str, str]:
    """A short sha256 of each checked variable's value (:data:`SETTINGS_PREFIXES`): values may be secrets.

    gpufleet's own numpy setting is left out (``numpy_cpu``): each process that imports gpufleet decides it
    for itself, so a scheduler has it where a script that imported numpy first, and submits, has not.
    """
    return {
        name: hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        for name, value in sorted(without_own_setting(env).items())
        if name.startswith(SETTINGS_PREFIXES) and name != "GPUFLEET_HOME"
    }


def record_settings(home: Path, slots: int, idle_exit_s: float) -> None:
    """Written by the scheduler once it holds the lock (private: a digest is all it keeps of a value)."""
    data = {"pid": os.getpid(), "slots": slots, "idle_exit_s": idle_exit_s, "env": environment_digests(os.environ)}
    tmp = home / f".scheduler-env.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, settings_file(home))


def running_settings(home: Path) -> tuple[int, dict[str, Any]] | None:
    """The running scheduler's PID and what it recorded at its start (``None``: none runs, or no record)."""
    pid = scheduler_pid(home)
    if pid is None or pid < 0:
        return None
    try:
        data = json.loads(settings_file(home).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("pid") != pid:  # a record left by an earlier scheduler
        return None
    return pid, data


def scheduler_slots(home: Path) -> tuple[int, int | None]:
    """The slots a job must fit: the running scheduler's (and its PID), else ``GPUFLEET_LOCAL_SLOTS``'s.

    A running scheduler counted its slots when it started; a job bigger than them would wait
    for ever, whatever this process's ``GPUFLEET_LOCAL_SLOTS`` says.
    """
    running = running_settings(home)
    if running is not None:
        slots = running[1].get("slots")
        if isinstance(slots, int) and not isinstance(slots, bool) and slots >= 1:
            return slots, running[0]
    return configured_slots(), None


def restart_hint(pid: int | None) -> str:
    """How to make the running scheduler ``pid`` give way to one started with this environment."""
    return (
        f"pid {pid}, which exits once idle; `kill {pid}` stops it now (what runs saves and resumes under "
        f"the next scheduler, which the next submit starts with this environment)"
    )


def settings_drift(home: Path, env: Mapping[str, str]) -> str | None:
    """A warning when the running scheduler's environment differs from ``env`` in a checked variable.

    The running scheduler keeps the environment it started with, and its attempts inherit it:
    a submit with another ``GPUFLEET_LOCAL_SLOTS``, ``GPUFLEET_LOG_EVERY_S`` or
    ``CUDA_VISIBLE_DEVICES`` would otherwise run, silently, with the old value.
    """
    running = running_settings(home)
    if running is None:
        return None
    pid, data = running
    recorded = data.get("env")
    theirs: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    mine = environment_digests(env)
    changed = sorted(name for name in {*mine, *theirs} if mine.get(name) != theirs.get(name))
    if not changed:
        return None
    return (
        f"warning: the local scheduler of {home} started with another environment ({', '.join(changed)} "
        f"differ{'s' if len(changed) == 1 else ''}); it keeps its own, and so do the jobs it starts. "
        f"It is {restart_hint(pid)}; set a job's own variables in its spec's `env`"
    )


def ensure_scheduler(home: Path) -> None:
    """Start a detached scheduler for ``home`` unless one holds the lock (which keeps its environment)."""
    if scheduler_pid(home) is not None:
        return
    check_environment(os.environ)  # a bad GPUFLEET_SCHEDULER_IDLE_S would kill it at start
    home.mkdir(parents=True, exist_ok=True)
    with scheduler_log(home).open("ab") as log:
        # The launcher forks the scheduler off and exits at once: we reap it here, and the
        # scheduler, in a session of its own, outlives this process.
        subprocess.run(
            [sys.executable, "-m", "gpufleet.backends.local", "--detach", str(home)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "GPUFLEET_HOME": str(home)},
            check=True,
        )
    deadline = time.monotonic() + 10
    while scheduler_pid(home) is None and time.monotonic() < deadline:
        time.sleep(0.02)


__all__ = [
    "DEFAULT_SLOTS",
    "SETTINGS_PREFIXES",
    "configured_slots",
    "ensure_scheduler",
    "environment_digests",
    "lock_file",
    "record_settings",
    "restart_hint",
    "running_settings",
    "scheduler_pid",
    "scheduler_slots",
    "settings_drift",
    "settings_file",
    "slots_of",
    "store_for",
]
