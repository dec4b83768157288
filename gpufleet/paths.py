"""Where state lives, and the one place that turns user-supplied names into paths.

Layout under ``$GPUFLEET_HOME`` (default ``~/.gpufleet``)::

    state.db                 SQLite: jobs, attempts, events, requests
    scheduler.pid            PID of the local scheduler while it runs
    scheduler.log
    jobs/<id>/spec.json      the validated JobSpec the latest attempt started with (resize changes it)
    jobs/<id>/events.jsonl   what the runtime reported, one JSON object a line
    jobs/<id>/logs/attempt-<n>.log
    jobs/<id>/checkpoints/step-<8 digits>/
    notes/                   cost notes
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpufleet.errors import UsageError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
NAME_HINT = "use 1-63 characters: lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"


def gpufleet_home() -> Path:
    """The state root: ``$GPUFLEET_HOME`` or ``~/.gpufleet``."""
    raw = os.environ.get("GPUFLEET_HOME")
    return Path(raw).expanduser() if raw else Path.home() / ".gpufleet"


def check_name(value: str, what: str = "name") -> str:
    """Return ``value`` if it is safe to use as one path component, else raise ``UsageError``."""
    if not NAME_RE.match(value):
        raise UsageError(f"invalid {what} {value!r}: {NAME_HINT}")
    return value


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) readable by its owner only; tighten it if it is ours and open.

    ``UsageError`` when ``path``, or a folder above it, exists and is not a folder (``GPUFLEET_HOME=/dev/null``).
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(_not_a_folder(path)) from None
    if not path.is_dir():
        raise UsageError(_not_a_folder(path))
    info = path.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        path.chmod(info.st_mode & 0o700)
    return path


def _not_a_folder(path: Path) -> str:
    """Why ``path`` cannot be a folder: the first of it and the folders above it that exists and is not one."""
    blocker = next((p for p in (*reversed(path.parents), path) if p.exists() and not p.is_dir()), path)
    home = gpufleet_home()
    if "GPUFLEET_HOME" in os.environ and (path == home or home in path.parents):
        return (
            f"GPUFLEET_HOME={str(home)!r} is not a folder: {str(blocker)!r} exists and is not a folder; "
            "set GPUFLEET_HOME to a folder (or unset it to use ~/.gpufleet)"
        )
    return f"{str(path)!r} is not a folder: {str(blocker)!r} exists and is not a folder; choose another path"


def dev_services_dir(service: str) -> Path:
    """Where ``scripts/dev-<service>`` keeps a development service of a source checkout: ``<repo>/.dev/<service>``."""
    return Path(__file__).resolve().parents[1] / ".dev" / service


def state_db(home: Path) -> Path:
    """The SQLite store of jobs, attempts, events and requests."""
    return home / "state.db"


def scheduler_pid(home: Path) -> Path:
    return home / "scheduler.pid"


def scheduler_log(home: Path) -> Path:
    return home / "scheduler.log"


def notes_dir(home: Path) -> Path:
    """Where cost notes go unless told otherwise."""
    return home / "notes"


def job_dir(home: Path, job_id: int) -> Path:
    if job_id < 1:
        raise UsageError(f"invalid job id {job_id}: job ids are positive integers (see `gpufleet jobs`)")
    return home / "jobs" / str(job_id)


def spec_file(home: Path, job_id: int) -> Path:
    """The validated JobSpec the job's latest attempt started with."""
    return job_dir(home, job_id) / "spec.json"


def events_file(home: Path, job_id: int) -> Path:
    """The JSONL log the job's processes write (``gpufleet.jobs.events``)."""
    return job_dir(home, job_id) / "events.jsonl"


def checkpoints_dir(home: Path, job_id: int) -> Path:
    return job_dir(home, job_id) / "checkpoints"


def attempt_log(home: Path, job_id: int, attempt: int) -> Path:
    """The stdout and stderr of one attempt (``gpufleet logs``)."""
    return job_dir(home, job_id) / "logs" / f"attempt-{attempt}.log"


def hold_file(home: Path, job_id: int) -> Path:
    """Present while job ``job_id`` is held (``gpufleet hold``): the local scheduler does not start it."""
    return job_dir(home, job_id) / "held"


def has_store(home: Path) -> bool:
    """Whether ``home`` holds a state store: an empty ``state.db`` (0 bytes, never initialised) is none."""
    try:
        return os.stat(state_db(home)).st_size > 0
    except OSError:
        return False


__all__ = [
    "NAME_HINT",
    "NAME_RE",
    "attempt_log",
    "check_name",
    "checkpoints_dir",
    "dev_services_dir",
    "events_file",
    "gpufleet_home",
    "has_store",
    "hold_file",
    "job_dir",
    "notes_dir",
    "private_dir",
    "scheduler_log",
    "scheduler_pid",
    "spec_file",
    "state_db",
]
