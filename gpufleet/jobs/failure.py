"""Why a job failed, in one line, where people look: ``submit --wait``, ``show``, the dashboard.

The store knows how the failed attempt ended (``exit code 1``, ``killed by SIGKILL``, ``lost after
3 restarts (max_restarts)``); the reason a person needs (``RuntimeError: boom at step 80``) is at
the end of that attempt's log. :func:`failure_line` finds it in the log's tail: the exception line
of the last Python traceback (its whole message when it spans lines; a torchrun agent's own
``ChildFailedError`` only when no rank's traceback is there), else a line that says how the process
died (``Killed``, ``Segmentation fault``, a ``gpufleet:`` line), else the last few lines.

Every backend writes an attempt's output to ``jobs/<id>/logs/attempt-<n>.log`` (the Slurm batch
script and the Ray runner too), so one reader serves them all: :func:`read_log_tail`, which
``gpufleet logs`` uses as well. A job's own code may write under its folder, so that reader never
follows a link out of it, and what it returns is text a job wrote: :func:`printable` escapes its
control characters and caps its length before anyone prints it.
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpufleet.jobs.protocol import exit_reason
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import Attempt, Job, Store
from gpufleet.outfiles import read_tail_fd
from gpufleet.paths import attempt_log

TAIL_BYTES = 64 << 10
"""The end of a log searched for the reason (``show``, ``submit --wait``): a traceback fits many times over."""
LIST_TAIL_BYTES = 8 << 10
"""What a list of jobs reads of each failed job's log: a list of thousands must stay cheap."""
LINE_MAX = 300
"""Characters of a reason; a longer one ends in ``...``."""
LAST_LINES = 3
"""Lines quoted when the log holds neither a traceback nor a line that says how the process died."""
MESSAGE_LINES = 4
"""Lines of one exception's message kept (a message of several lines, a chained summary)."""

TRACEBACK = "Traceback (most recent call last):"
RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")
"""What torch puts before each line a rank of a group writes (``[rank0]: Traceback ...``)."""
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""Colour and cursor sequences a logger writes: dropped, not escaped, so the words stay readable."""
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure|Warning|Fault)\b")
AGENT_ERROR = "ChildFailedError"
"""torchrun's own exception when a rank failed: it names the rank, while the rank's traceback names why."""
LOG_LINE = re.compile(
    r"^(?:[IWEF]\d{4} \d|gpufleet: |\[?\d{4}-\d\d-\d\d[ T]\d|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)[:\s])"
)
"""A line another writer logged after the traceback (torchrun's agent, gpufleet, a logger with a time or a
level), not the next line of the exception's message."""
DEATH = re.compile(r"^(?:Killed|Segmentation fault|Aborted|Bus error|Illegal instruction|gpufleet: )")
"""Lines that say how a process ended when no traceback does: the shell's, the kernel's, gpufleet's own."""


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a job failed: its last attempt, how that attempt ended, and the line of its log that says why."""

    attempt: int | None
    """The failed attempt (``None``: the job failed before any attempt started)."""
    exit: str
    """How it ended: ``exit code 1``, ``killed by SIGKILL``, ``lost after 3 restarts (max_restarts)``."""
    line: str | None
    """The exception line (``RuntimeError: boom at step 80``) or the last lines of its log; ``None``: empty."""
    hint: str | None
    """The command that shows the whole log: ``gpufleet logs 2``."""

    def describe(self) -> str:
        """``exit code 1: RuntimeError: boom at step 80``."""
        return f"{self.exit}: {self.line}" if self.line else self.exit

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def job_failure(store: Store, home: Path, job: Job, *, tail_bytes: int = TAIL_BYTES) -> Failure | None:
    """Why ``job`` failed (``None`` unless it did), reading at most ``tail_bytes`` of its last attempt's log."""
    if job.state != JobState.FAILED:
        return None
    attempts = store.attempts(job.id)
    if not attempts:
        return Failure(attempt=None, exit=printable(job.reason or "failed before it started"), line=None, hint=None)
    last = attempts[-1]
    tail = read_log_tail(attempt_log(home, job.id, last.n), tail_bytes)
    line = None
    if tail is not None:
        data, size = tail
        line = failure_line(data.decode("utf-8", errors="replace"), partial=size > len(data))
    return Failure(
        attempt=last.n, exit=printable(job.reason or _ended(last)), line=line, hint=f"gpufleet logs {job.id}"
    )


def _ended(attempt: Attempt) -> str:
    if attempt.exit_code is not None:
        return exit_reason(attempt.exit_code)
    return str(attempt.outcome or attempt.state)


def failure_line(text: str, *, partial: bool = False) -> str | None:
    """The line of a log that says why its process failed, printable; ``None`` for an empty log.

    ``partial``: ``text`` is the end of a longer log, so its first line may be cut and is left out.
    """
    raw = [ANSI.sub("", line) for line in text.splitlines()[1 if partial else 0 :]]
    ranks = [m.group(0) if (m := RANK_PREFIX.match(line)) else "" for line in raw]
    lines = [line[len(rank) :].rstrip() for line, rank in zip(raw, ranks, strict=True)]
    found = (
        _exception(lines, ranks) or _death(lines) or " | ".join([s.strip() for s in lines if s.strip()][-LAST_LINES:])
    )
    return printable(found) if found else None


def _exception(lines: list[str], ranks: list[str]) -> str | None:
    """The exception of the last traceback, torchrun's own ``ChildFailedError`` only if no other is there."""
    agent = None
    for start in reversed([i for i, line in enumerate(lines) if line.strip() == TRACEBACK]):
        found = _exception_after(lines, ranks, start + 1)
        if found is None:
            continue
        if AGENT_ERROR not in found.split(":", 1)[0]:
            return found
        agent = agent or found
    return agent


def _exception_after(lines: list[str], ranks: list[str], start: int) -> str | None:
    """The exception line that ends a traceback's frames (indented lines), with its message's next lines
    (those the same rank wrote, up to a line another writer logged: in a group's log another rank's or
    the agent's lines come in between, and after it the agent's or gpufleet's own)."""
    i = start
    while i < len(lines) and (not lines[i] or lines[i][0].isspace()):
        i += 1
    if i == len(lines) or not (EXCEPTION.match(lines[i]) or ":" in lines[i] or lines[i].isidentifier()):
        return None
    message = [lines[i]]
    for line, rank in zip(lines[i + 1 : i + MESSAGE_LINES], ranks[i + 1 : i + MESSAGE_LINES], strict=False):
        if rank != ranks[i] or not line.strip() or line.startswith(("Traceback", "During handling", "The above")):
            break
        if LOG_LINE.match(line):
            break
        message.append(line.strip())
    return " | ".join(message)


def _death(lines: list[str]) -> str | None:
    for line in reversed(lines):
        if DEATH.match(line.strip()):
            return line.strip()
    return None


def printable(text: str, limit: int = LINE_MAX) -> str:
    """``text`` with its control characters escaped (``\\x07``, ``\\u202e``), at most ``limit`` characters.

    A job's log is untrusted: a terminal must not act on what it wrote, nor a line run on for pages.
    """
    out = "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch)[0] == "C" else ch for ch in text
    )
    return out if len(out) <= limit else out[: limit - 3] + "..."


def read_log_tail(path: Path, max_bytes: int) -> tuple[bytes, int] | None:
    """The last ``max_bytes`` of the log ``path`` (``.../jobs/<id>/logs/attempt-N.log``) and its size; None
    unless the job's folder and ``logs`` are real folders and the log a regular file, none of them a link.

    What the job's code may write (its own folder) is opened part by part with ``O_NOFOLLOW``, each
    relative to the one above, so a link swapped in between two checks is refused too; ``jobs`` and the
    home above it are the operator's and may be links. The log is opened without blocking (a FIFO is
    never waited on) and read only if it is a regular file.
    """
    parts = path.parts[-3:]
    fds: list[int] = []
    try:
        fds.append(os.open(path.parents[2], os.O_RDONLY | os.O_DIRECTORY))
        for part in parts[:-1]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        fds.append(os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=fds[-1]))
        return read_tail_fd(fds[-1], max_bytes)
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


__all__ = [
    "LIST_TAIL_BYTES",
    "TAIL_BYTES",
    "Failure",
    "failure_line",
    "job_failure",
    "printable",
    "read_log_tail",
]
