"""The pieces of an attempt's life that every backend shares: start, signal, find, judge its end.

An attempt is one process (and its process group). A backend starts it behind a small shim that
asks the kernel to signal it when the process that started it dies (``PR_SET_PDEATHSIG``, the one
shim of ``jobs/deathsig.py``), so a scheduler that crashes never leaves an attempt training
unwatched for long: the local scheduler asks for SIGTERM (the runtime saves and exits 75), the
Ray actor for SIGKILL (Ray restarts the actor, which resumes from the checkpoint).

After a crash, a new scheduler finds an attempt it never knew the PID of by the variables every
attempt carries (``GPUFLEET_JOB_ID``, ``GPUFLEET_ATTEMPT``, ``GPUFLEET_HOME``), and judges how an
attempt that ended unwatched ended from its own ``session_end`` event, not from a guess.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.jobs.deathsig import NOT_STARTED as NOT_STARTED  # the shim's; re-exported
from gpufleet.jobs.deathsig import shim_argv
from gpufleet.jobs.events import SESSION_EXIT as SESSION_EXIT  # re-exported: it moved to the runtime
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.events import exit_from_events as exit_from_events
from gpufleet.jobs.protocol import ENV_ATTEMPT, ENV_JOB_ID, REQUEUE_EXIT_CODE, exit_reason
from gpufleet.jobs.store import TERMINAL, Attempt, Job, JobState, Outcome, SyncEvent, SyncPlan


def failure_reason(code: int | None) -> str:
    """Why an attempt that exited with ``code`` (``None``: it vanished) failed, in words."""
    if code is None:
        return "lost"
    if code == NOT_STARTED:
        return f"exit code {code}: the entrypoint could not be started (cannot start it; see the attempt log)"
    return exit_reason(code)


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """What an ended attempt means for its job: the attempt's outcome, the job's next state and why."""

    outcome: Outcome
    """``completed``, ``cancelled``, ``preempted``, ``lost``, ``requeued`` or ``failed``."""
    state: JobState
    """The job's next state: ``completed``, ``cancelled``, ``queued`` (requeued) or ``failed``."""
    reason: str | None
    requeued: bool


def attempt_end(code: int | None, stop: str | None, *, attempt: int, restarts: int, max_restarts: int) -> AttemptEnd:
    """The one rule every backend applies when an attempt ends with ``code`` (``None``: it vanished).

    ``stop`` is why the backend stopped it (``preempted``, ``cancelled``) or ``lost`` (nobody saw it
    end). A cancellation wins; exit 0 completes; a preemption, a loss or exit 75 requeues the job
    until ``max_restarts`` requeues are spent; anything else fails it with the reason in words.
    """
    if stop == Outcome.CANCELLED:
        return AttemptEnd(Outcome.CANCELLED, JobState.CANCELLED, "cancelled by request", False)
    if code == 0:
        return AttemptEnd(Outcome.COMPLETED, JobState.COMPLETED, None, False)
    if stop in (Outcome.PREEMPTED, Outcome.LOST) or code == REQUEUE_EXIT_CODE or code is None:
        outcome = Outcome(stop) if stop else (Outcome.REQUEUED if code == REQUEUE_EXIT_CODE else Outcome.LOST)
        if restarts >= max_restarts:
            return AttemptEnd(outcome, JobState.FAILED, f"{outcome} after {restarts} restarts (max_restarts)", False)
        return AttemptEnd(outcome, JobState.QUEUED, f"{outcome} at attempt {attempt}", True)
    return AttemptEnd(Outcome.FAILED, JobState.FAILED, failure_reason(code), False)


REQUEUED_OUTCOMES = (Outcome.PREEMPTED, Outcome.REQUEUED, Outcome.LOST)
"""Outcomes after which the job goes back to the queue (while restarts remain)."""


def plan_sync(
    job: Job,
    stored: Sequence[Attempt],
    seen: Sequence[Attempt],
    *,
    state: str,
    reason: str | None,
    restarts: int,
    now: float,
    details: Mapping[tuple[int, str], dict[str, Any]] | None = None,
) -> SyncPlan:
    """The store rows and events that bring ``stored`` to what the scheduler reports (``seen``).

    Events are derived from the difference (an attempt that appeared started, one whose SIGTERM,
    SIGKILL or end is new), so a second sync of the same report adds none, and a sync killed
    before its transaction committed is simply done again. ``details`` adds data to an event by
    ``(attempt, kind)`` (the node an attempt ran on, the grace of a SIGTERM).
    """
    details = details or {}
    before = {a.n: a for a in stored}
    attempts, events = [], []

    def event(kind: str, n: int, ts: float, **data: Any) -> None:
        events.append(SyncEvent(kind, n, ts, {**data, **details.get((n, kind), {})}))

    for new in seen:
        old = before.get(new.n)
        if old != new:
            attempts.append(new)
        if old is None:
            event(EventKind.ATTEMPT_START, new.n, new.started_at, pid=new.pid)
        if new.sigterm_at is not None and (old is None or old.sigterm_at is None):
            event(EventKind.SIGTERM, new.n, new.sigterm_at)
        if new.kill_at is not None and (old is None or old.kill_at is None):
            event(EventKind.SIGKILL, new.n, new.kill_at, reason="grace time expired")
        if new.ended_at is not None and (old is None or old.ended_at is None):
            event(EventKind.ATTEMPT_END, new.n, new.ended_at, exit_code=new.exit_code, outcome=new.outcome)
            if new.outcome in REQUEUED_OUTCOMES and (new.n < len(seen) or state in (JobState.QUEUED, JobState.RUNNING)):
                event(EventKind.REQUEUED, new.n, new.ended_at)
    if state in TERMINAL and job.state not in TERMINAL:
        last = seen[-1] if seen else None
        ts = last.ended_at if last is not None and last.ended_at is not None else now
        events.append(SyncEvent(state, last.n if last else None, ts, {"reason": reason}))
    return SyncPlan(tuple(attempts), tuple(events), state, reason, restarts)


def attempt_argv(argv: Sequence[str], death_signal: int = signal.SIGKILL) -> list[str]:
    """``argv`` behind the death-signal shim: ``death_signal`` when this, the starting process, dies (Linux)."""
    return shim_argv(argv, death_signal, parent=os.getpid())


def signal_group(pid: int | None, sig: int) -> None:
    """Signal an attempt's process group (it was started in a session of its own); gone is fine."""
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def attempt_processes(home: Path, job_id: int, attempt: int) -> list[int]:
    """PIDs of the processes of attempt ``attempt`` of job ``job_id`` under ``home`` (Linux ``/proc``)."""
    want = {
        f"{ENV_JOB_ID}={job_id}".encode(),
        f"{ENV_ATTEMPT}={attempt}".encode(),
        f"GPUFLEET_HOME={home}".encode(),
    }
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= environ:
            found.append(int(entry.name))
    return sorted(found)


__all__ = [
    "NOT_STARTED",
    "REQUEUED_OUTCOMES",
    "SESSION_EXIT",
    "AttemptEnd",
    "alive",
    "attempt_argv",
    "attempt_end",
    "attempt_processes",
    "exit_from_events",
    "failure_reason",
    "plan_sync",
    "signal_group",
]
