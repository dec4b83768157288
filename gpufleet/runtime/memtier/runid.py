"""The run a job folder belongs to: a random id made once, the first time the memory tier needs it.

Copies are found by their job folder (``shm.job_key`` hashes its path), and a copy's header names
its job id and model fingerprint. None of these tells two runs apart when a job folder is made anew
at the same path: a reset home gives job ids out again from 1, and a new job with the same model
would restore the weights of the old one. The job's folder itself is what a reset removes, so an id
kept in it (``memory-run.id``) is the same for every attempt and rank of one run and new for the
next. The store's submit time would do as well, but a rank has no store to read (a Slurm node may
not see the home's database); the folder it has.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
from pathlib import Path

from gpufleet.runtime.memtier.copies import TierError

RUN_FILE = "memory-run.id"
RUN_ID = re.compile(r"[0-9a-f]{32}")
TRIES = 3


def run_id(job_dir: Path) -> str:
    """The id of the run whose folder is ``job_dir``, made (and kept there, mode 0600) when it has none.

    Ranks starting at once agree: each writes its own candidate to a private file and links it to
    ``memory-run.id``; a link never replaces a file, so the first one wins and every rank reads it.
    """
    path = job_dir / RUN_FILE
    for _ in range(TRIES):
        found = _read(path)
        if found is not None:
            return found
        try:
            job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            _create(path)
        except OSError as err:
            raise TierError(f"cannot keep the run id in {path}: {err.strerror}") from None
    raise TierError(f"{path} holds no run id and cannot be replaced; remove it")


def _read(path: Path) -> str | None:
    """The id in ``path``; ``None`` when there is none (a file that holds anything else is removed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()  # a link or a special file: not ours to trust
        return None
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(64).decode("ascii", errors="replace").strip()
    if RUN_ID.fullmatch(raw):
        return raw
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def _create(path: Path) -> None:
    """Make ``path`` hold a new id unless another process made it first (``os.link`` fails then)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(secrets.token_hex(16) + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["RUN_FILE", "run_id"]
