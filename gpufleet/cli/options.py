"""What several commands share: the ``--json`` flag, the job-id argument, the state store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gpufleet.backends import sync_remote
from gpufleet.cli.render import err_console
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.jobs.store import Store
from gpufleet.paths import gpufleet_home, state_db

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
MAX_JOB_ID = 2**63 - 1
"""The largest job id: SQLite's INTEGER is a signed 64-bit number."""
JobArg = Annotated[int, typer.Argument(help="Job id (see `gpufleet jobs`).", min=1, max=MAX_JOB_ID)]
SpecArg = Annotated[Path, typer.Argument(help="JobSpec YAML with a `module:function` entrypoint.")]


def require_positive(flag: str, value: int) -> None:
    """Refuse a count below 1, naming the flag."""
    if value <= 0:
        raise UsageError(f"{flag} {value} must be at least 1")


def open_store(sync: bool = True) -> Store:
    """The state store, refreshed first from remote schedulers (a warning if one is unreachable)."""
    home = gpufleet_home()
    store = Store(state_db(home))
    if sync:
        try:
            sync_remote(home, store)
        except GpufleetError as err:
            err_console.print(
                f"[yellow]warning:[/] states may be stale: {escape(str(err))}", highlight=False, soft_wrap=True
            )
    return store


__all__ = ["MAX_JOB_ID", "JobArg", "JsonOpt", "SpecArg", "open_store", "require_positive"]
