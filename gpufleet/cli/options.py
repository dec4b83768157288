"""What several commands share: the ``--json`` flag, the job-id argument, the state store, path checks."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gpufleet.backends import sync_remote
from gpufleet.cli.render import err_console
from gpufleet.errors import GpufleetError, NotFound, UsageError
from gpufleet.fmt import shown_path
from gpufleet.jobs.store import Store
from gpufleet.paths import gpufleet_home, has_store, state_db

try:  # Typer runs commands in its own copy of Click: their context is that copy's
    from typer._click.globals import get_current_context as _current_context
except ImportError:  # a Typer on Click itself
    from click import get_current_context as _current_context  # type: ignore[no-redef,unused-ignore]

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
MAX_JOB_ID = 2**63 - 1
"""The largest job id: SQLite's INTEGER is a signed 64-bit number."""
JobArg = Annotated[int, typer.Argument(help="Job id (see `gpufleet jobs`).", min=1, max=MAX_JOB_ID)]
SpecArg = Annotated[Path, typer.Argument(help="JobSpec YAML with a `module:function` entrypoint.")]
NAME_MAX = 255
"""Longest file or folder name, in bytes, that Linux file systems take (ext4, XFS, btrfs)."""
PATH_MAX = 4096
"""Longest path, in bytes, the Linux kernel opens."""


def require_positive(flag: str, value: int) -> None:
    """Refuse a count below 1, naming the flag."""
    if value <= 0:
        raise UsageError(f"{flag} {value} must be at least 1")


def check_path_name(path: Path, what: str) -> Path:
    """``path``, refused (naming ``what``, a flag) when no file could have that name: checked before any work is done.

    A name over :data:`NAME_MAX` bytes, a path over :data:`PATH_MAX` or one holding a NUL byte fails
    only when the file is opened; a command that writes its output last would have done its work,
    and maybe written other files, by then.
    """
    raw = os.fsencode(path)
    if b"\0" in raw:
        raise UsageError(f"{what} {shown_path(path)}: a path cannot hold a NUL byte")
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > NAME_MAX:
        raise UsageError(
            f"{what} {shown_path(path)}: a name in it is {longest:,} bytes long, over the {NAME_MAX} "
            "a file system takes: shorten it"
        )
    if len(raw) >= PATH_MAX:
        raise UsageError(f"{what} {shown_path(path)}: the path is {len(raw):,} bytes long, over {PATH_MAX - 1}")
    return path


def open_store(sync: bool = True) -> Store:
    """The state store, refreshed first from remote schedulers (a warning if one is unreachable)."""
    home = gpufleet_home()
    store = Store(state_db(home))
    if sync:
        _refresh(home, store)
    return store


def _refresh(home: Path, store: Store) -> None:
    """Bring ``store`` up to date from remote schedulers; an unreachable one is a warning, printed if the command
    succeeds (a failing command prints its error line alone)."""
    try:
        sync_remote(home, store)
    except GpufleetError as err:
        warn_on_success(f"states may be stale: {err}")


class _DeferredWarning(AbstractContextManager[None]):
    """A warning printed when the command it belongs to ends well: a failing command prints its error line alone."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None or getattr(exc, "exit_code", None) == 0:  # ended, or `typer.Exit(0)`
            _print_warning(self.message)


def _print_warning(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def warn_on_success(message: str) -> None:
    """Print ``message`` as a warning once the running command succeeds (at once outside a command)."""
    ctx = _current_context(silent=True)
    if ctx is None:
        _print_warning(message)
    else:
        ctx.with_resource(_DeferredWarning(message))


def existing_store(sync: bool = True) -> Store | None:
    """:func:`open_store`, or ``None`` on a home without a state store (or an empty one): a command that only
    reads creates none, and writes nothing to say so."""
    return open_store(sync) if has_store(gpufleet_home()) else None


def job_store(job_id: int, sync: bool = True) -> Store:
    """The state store, to read or act on job ``job_id``: on a home without one there is no such job, and
    the refusal creates no store (nor the home) to say so."""
    home = gpufleet_home()
    if not has_store(home):
        raise NotFound(f"no job {job_id} in {state_db(home)} (list them with `gpufleet jobs`)")
    store = open_store(sync=False)
    store.job(job_id)  # an unknown id is refused before the refresh, which may write the store
    if sync:
        _refresh(home, store)
    return store


__all__ = [
    "MAX_JOB_ID",
    "NAME_MAX",
    "PATH_MAX",
    "JobArg",
    "JsonOpt",
    "SpecArg",
    "check_path_name",
    "existing_store",
    "has_store",
    "job_store",
    "open_store",
    "require_positive",
    "warn_on_success",
]
