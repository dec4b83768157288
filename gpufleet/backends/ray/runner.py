"""What runs inside a Ray backend job's actor: the attempt loop and the status file it writes.

:class:`JobRunner` is the actor body :mod:`gpufleet.backends.ray.backend` starts, one detached actor per
job, with the :class:`RunnerArgs` Ray hands to every restart of it. It runs the job's attempts in
a thread and answers ``preempt`` and ``cancel``. An attempt is the same process as on the other
backends (``entry_argv`` with the ``job_environment`` contract and ``GPUFLEET_ATTEMPT``), logging
to ``logs/attempt-<n>.log``. Exit 75 (``REQUEUE_EXIT_CODE``) or a preemption starts the next
attempt, up to ``max_restarts``; 0 completes the job; anything else fails it. On Linux the attempt
starts behind a ``PR_SET_PDEATHSIG`` shim (``lifecycle.attempt_argv``): should its actor die, it
is killed too, as it would be with its node, so two attempts never train into one checkpoint
directory. A restarted actor records the attempt its predecessor left open as ``lost`` and starts
the next one, which restores the last checkpoint.

A job of more than one rank (``launcher: torchrun``) runs its ranks on Ray's own machinery, not
under torchrun, and :mod:`gpufleet.backends.ray.ranks` is where they live: the actor holds the
job's placement group (:func:`placement_name`, one bundle per rank) across attempts and asks for
no resources itself, starts one rank actor per bundle for each attempt, and watches them as one
:class:`~gpufleet.backends.ray.ranks.RankGroup`, whose exit status is the attempt's. A restarted
actor SIGKILLs the ranks its predecessor left on its own node along with the lost attempt. The
actor removes the placement group when the job ends.

The actor is the only writer of ``jobs/<id>/ray-status.json`` (:class:`RunStatus`: the job's state,
restarts, and every :class:`AttemptRecord` with PIDs, times, exit codes and outcomes), through
:func:`write_status` (temp file, fsync, rename); :func:`start_attempt` and :func:`end_attempt` are
the pure transitions, with the same outcomes and requeue rule as the local scheduler.

It is apart from :mod:`gpufleet.backends.ray.backend` (the client side: finding and joining the cluster,
submitting, turning the status file into store rows) because this is the code a Ray worker runs:
Ray ships :class:`JobRunner` by reference to this module (and the rank actors by reference to
:mod:`~gpufleet.backends.ray.ranks`), and the worker imports it to rebuild the actor. It imports
nothing from :mod:`gpufleet.backends.ray.backend` (that module imports this one), and ``ray`` only where
Ray is already loaded, inside the actor.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.backends.lifecycle import attempt_argv, attempt_end, signal_group
from gpufleet.backends.ray.ranks import (
    RANK_CALL_TIMEOUT_S,
    Ended,
    Placement,
    RankGone,
    RankGroup,
    RankSlot,
    RayPlacement,
    current_actor_id,
    current_cluster_address,
    rank_environments,
    rank_order,
)
from gpufleet.cost.rates import price_environment
from gpufleet.errors import UsageError
from gpufleet.jobs.protocol import ENV_EVENTS, entry_argv, job_environment, rank_argv
from gpufleet.jobs.store import TERMINAL
from gpufleet.numpy_cpu import without_own_setting
from gpufleet.paths import attempt_log, job_dir
from gpufleet.spec import JobSpec, parse_spec

STATUS_FILE = "ray-status.json"
SCHEMA_VERSION = 1


# ---- the status file: written by the job's actor only ---------------------------------------


class RankRecord(BaseModel):
    """One rank of a multi-rank attempt: its process (behind the shim) and the host it runs on."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    rank: int = Field(ge=0)
    pid: int | None = None
    node: str | None = None


class AttemptRecord(BaseModel):
    """One attempt as its actor saw it (``pid`` and ``node`` are rank 0's in a multi-rank attempt)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    n: int = Field(ge=1)
    pid: int | None = None
    node: str | None = None
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    outcome: Literal["completed", "preempted", "requeued", "lost", "failed", "cancelled"] | None = None
    sigterm_at: float | None = None
    stop: Literal["preempted", "cancelled"] | None = None
    grace: float | None = None
    kill_at: float | None = None
    ranks: tuple[RankRecord, ...] = ()
    """Every rank of a multi-rank attempt, in rank order; empty for a one-process attempt."""


class RunStatus(BaseModel):
    """``ray-status.json``: the job's state, restarts and attempts."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: int = SCHEMA_VERSION
    job_id: int = Field(ge=1)
    state: Literal["queued", "running", "completed", "failed", "cancelled"] = "queued"
    reason: str | None = None
    restarts: int = Field(default=0, ge=0)
    actor_id: str | None = None
    actor_pid: int | None = None
    node: str | None = None
    attempts: tuple[AttemptRecord, ...] = ()

    def open_attempt(self) -> AttemptRecord | None:
        last = self.attempts[-1] if self.attempts else None
        return last if last is not None and last.ended_at is None else None

    def with_last(self, **changes: Any) -> RunStatus:
        last = self.attempts[-1].model_copy(update=changes)
        return self.model_copy(update={"attempts": (*self.attempts[:-1], last)})


def status_path(home: Path, job_id: int) -> Path:
    return job_dir(home, job_id) / STATUS_FILE


def read_status(path: Path) -> RunStatus | None:
    """The status file, ``None`` before the actor first wrote it; a clear error when it is garbled."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        status = RunStatus.model_validate_json(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        raise UsageError(f"{path} is not a valid Ray status file ({where}: {first['msg']}); move it aside") from None
    if status.schema_version > SCHEMA_VERSION:
        raise UsageError(f"{path} was written by a newer gpufleet (schema {status.schema_version}); upgrade gpufleet")
    return status


def write_status(path: Path, status: RunStatus) -> None:
    """Temp file, fsync, rename: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(status.model_dump_json(indent=1))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def start_attempt(
    status: RunStatus, pid: int | None, node: str, now: float, ranks: Sequence[RankRecord] = ()
) -> RunStatus:
    record = AttemptRecord(n=len(status.attempts) + 1, pid=pid, node=node, started_at=now, ranks=tuple(ranks))
    return status.model_copy(update={"state": "running", "attempts": (*status.attempts, record)})


def end_attempt(status: RunStatus, code: int | None, stop: str | None, now: float, max_restarts: int) -> RunStatus:
    """Close the open attempt: the same outcomes and requeue rule as the local scheduler."""
    last = status.open_attempt()
    if last is None:
        return status
    end = attempt_end(code, stop, attempt=last.n, restarts=status.restarts, max_restarts=max_restarts)
    outcome, state, reason = end.outcome, end.state, end.reason
    restarts = status.restarts + 1 if end.requeued else status.restarts
    ended = status.with_last(ended_at=now, exit_code=code, outcome=outcome)
    return ended.model_copy(update={"state": state, "reason": reason, "restarts": restarts})


# ---- the actor ---------------------------------------------------------------------------------


def exit_actor() -> None:
    """End the current actor on purpose (Ray does not restart it); nothing outside an actor."""
    if current_actor_id() is None:
        return
    import ray

    with contextlib.suppress(SystemExit):
        ray.actor.exit_actor()  # type: ignore[no-untyped-call]


def placement_name(job_id: int) -> str:
    """The name of a multi-rank job's placement group (in the ``gpufleet`` namespace)."""
    return f"gpufleet-job-{job_id}"


@dataclass(frozen=True, slots=True)
class RunnerArgs:
    """What the actor needs; Ray hands the same values to every restart of it."""

    home: str
    job_id: int
    spec_json: str
    workdir: str
    bundles: tuple[dict[str, float], ...] = ()
    """One bundle per rank of a multi-rank job (its placement group); empty for a one-process job."""
    strategy: str = "PACK"
    """The placement group's strategy."""


class Running(Protocol):
    """An attempt's processes while they run: one process, or a :class:`RankGroup`."""

    @property
    def pid(self) -> int | None: ...

    def poll(self) -> Ended | None: ...

    def signal(self, signum: int) -> None: ...

    def close(self) -> None: ...


class OneProcess:
    """A one-process attempt, started in a session of its own (signalled as a process group)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self.proc, self.log, self.pid = proc, log, proc.pid

    def poll(self) -> Ended | None:
        code = self.proc.poll()
        return None if code is None else Ended(code)

    def signal(self, signum: int) -> None:
        signal_group(self.proc.pid, signum)

    def close(self) -> None:
        signal_group(self.proc.pid, signal.SIGKILL)  # leave no stray children behind
        self.log.close()


RESERVE_POLL_S = 1.0
"""How often a job waiting for its placement group or its rank actors looks for a cancellation."""


class JobRunner:
    """The actor body: runs the job's attempts in a thread; methods answer preempt and cancel."""

    def __init__(
        self,
        args: RunnerArgs,
        *,
        poll_s: float = 0.1,
        exit_hook: Callable[[], None] | None = None,
        start: bool = True,
        placement: Placement | None = None,
    ) -> None:
        self.home = Path(args.home)
        self.job_id = args.job_id
        self.spec: JobSpec = parse_spec(json.loads(args.spec_json), source=f"job {args.job_id}")
        self.workdir = args.workdir
        self.poll_s = poll_s
        self.exit_hook = exit_hook or exit_actor
        if placement is None and args.bundles:
            placement = RayPlacement(placement_name(args.job_id), args.bundles, args.strategy)
        self.placement = placement
        self.path = status_path(self.home, self.job_id)
        self.node = socket.gethostname()
        self._lock = threading.Lock()
        self._running: Running | None = None
        self._kill_at: float | None = None
        self._cancel = False
        status = read_status(self.path) or RunStatus(job_id=self.job_id)
        status = status.model_copy(update={"actor_id": current_actor_id(), "actor_pid": os.getpid(), "node": self.node})
        lost = status.open_attempt()
        if lost is not None:  # this actor is a restart: its predecessor died with an attempt running
            for pid, node in [(lost.pid, lost.node)] + [(r.pid, r.node) for r in lost.ranks]:
                if node == self.node:
                    signal_group(pid, signal.SIGKILL)
            status = end_attempt(status, None, "lost", time.time(), self.spec.max_restarts)
        self.status = status
        self._save()
        self.thread = threading.Thread(target=self._run, name=f"gpufleet-job-{self.job_id}", daemon=True)
        if start:
            self.thread.start()

    # ---- called through Ray ----------------------------------------------------------------
    def preempt(self, grace: float | None = None) -> int | None:
        """SIGTERM the running attempt, SIGKILL after ``grace``; its number, or ``None`` if none runs."""
        with self._lock:
            last = self.status.open_attempt()
            if self._running is None or last is None or last.stop is not None:
                return None
            self._stop(self._running, "preempted", grace)
            return last.n

    def cancel(self, grace: float | None = None) -> str:
        """Stop for good: the running attempt is stopped like a preemption but not followed by another."""
        with self._lock:
            last = self.status.open_attempt()
            if self._running is None or last is None:
                self._cancel = True
                return "cancelled"
            if last.stop != "cancelled":
                self._stop(self._running, "cancelled", grace)
            return "stopping"

    # ---- the attempt loop ------------------------------------------------------------------
    def _save(self) -> None:
        write_status(self.path, self.status)

    def _stop(self, running: Running, why: Literal["preempted", "cancelled"], grace: float | None) -> None:
        """SIGTERM once; a cancel after a preemption only changes what follows the exit."""
        grace_s = grace if grace is not None else self.spec.checkpoint.grace_seconds
        last = self.status.open_attempt()
        first = last is not None and last.stop is None
        if first:
            self._kill_at = time.monotonic() + grace_s
            running.signal(signal.SIGTERM)
        changes: dict[str, Any] = {"stop": why}
        if first:
            changes.update(sigterm_at=time.time(), grace=grace_s)
        self.status = self.status.with_last(**changes)
        self._save()

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if self.status.state in TERMINAL:
                        break
                    if self._cancel:
                        self.status = self.status.model_copy(
                            update={"state": "cancelled", "reason": "cancelled while queued"}
                        )
                        self._save()
                        break
                ranks = self._place(self.placement) if self.placement is not None else None
                with self._lock:
                    running = self._launch(ranks)
                if running is not None:
                    self._finish(running, self._wait(running))
        except Exception as err:
            with self._lock:
                self.status = self.status.model_copy(update={"state": "failed", "reason": f"runner error: {err!r}"})
                self._save()
            raise
        finally:
            if self.placement is not None:
                self.placement.release()
            self.exit_hook()

    def _place(self, placement: Placement) -> tuple[list[Any], list[RankSlot]] | None:
        """Hold the job's bundles and start a rank actor in each: the actors and their slots in rank order.

        Waits (for the cluster to free the bundles, for the last attempt's rank actors to be gone)
        without holding the lock, so ``cancel`` answers; ``None`` once the job is cancelled.
        """
        while not self._cancel:
            if not placement.ready(RESERVE_POLL_S):
                continue
            ranks = placement.start_ranks()
            slots: list[Any] | None = None
            while slots is None and not self._cancel:
                with contextlib.suppress(TimeoutError):
                    slots = placement.call(ranks, "where", [()] * len(ranks), timeout=RESERVE_POLL_S)
            if slots is not None and not any(isinstance(s, RankGone) for s in slots):
                order = rank_order(slots)
                return [ranks[i] for i in order], [slots[i] for i in order]
            placement.stop(ranks)  # cancelled, or a rank actor died before it started: ask again
        return None

    def _launch(self, placed: tuple[list[Any], list[RankSlot]] | None) -> Running | None:
        n = len(self.status.attempts) + 1
        log_path = attempt_log(self.home, self.job_id, n)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **job_environment(self.spec, self.job_id, self.home, "ray"),
            **price_environment(self.spec),
            "GPUFLEET_ATTEMPT": str(n),
            "GPUFLEET_BACKEND_JOB_ID": self.status.actor_id or "",
        }
        cluster = current_cluster_address()
        if cluster:  # a job that starts Ray actors of its own (gpufleet.rl) joins this cluster, not "auto"'s guess
            env.setdefault("GPUFLEET_RAY_ADDRESS", cluster)
        cwd = self.spec.workdir or self.workdir or None
        if self.placement is not None:
            if placed is None or self._cancel:
                if placed is not None:
                    self.placement.stop(placed[0])
                return None
            return self._launch_ranks(self.placement, n, env, cwd, log_path, *placed)
        argv = entry_argv(self.spec)
        log = log_path.open("ab")
        try:
            proc = subprocess.Popen(
                attempt_argv(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env={**without_own_setting(os.environ), **env},
                start_new_session=True,
            )
        except OSError as err:
            log.close()
            reason = f"cannot start {argv[0]!r} in {cwd}: {err.strerror}"
            self.status = self.status.model_copy(update={"state": "failed", "reason": reason})
            self._save()
            return None
        self._running, self._kill_at = OneProcess(proc, log), None
        self.status = start_attempt(self.status, proc.pid, self.node, time.time())
        self._save()
        return self._running

    def _launch_ranks(
        self,
        placement: Placement,
        n: int,
        env: dict[str, str],
        cwd: str | None,
        log: Path,
        ranks: list[Any],
        slots: list[RankSlot],
    ) -> Running:
        """Start every rank of attempt ``n`` (``ranks`` and their ``slots`` in rank order)."""
        (port,) = placement.call(ranks[:1], "free_port", [()], timeout=RANK_CALL_TIMEOUT_S)
        port = port if isinstance(port, int) else 0  # rank 0's actor died: the attempt will be lost
        argv = rank_argv(self.spec)
        # Unbuffered: the ranks share one log, and a rank killed mid-line should leave its last words.
        args = [
            (argv, {**env, **rank, "PYTHONUNBUFFERED": "1"}, cwd, str(log)) for rank in rank_environments(slots, port)
        ]
        pids = [
            p if isinstance(p, int) else 0 for p in placement.call(ranks, "start", args, timeout=RANK_CALL_TIMEOUT_S)
        ]
        events = Path(env[ENV_EVENTS])
        group = RankGroup(placement, ranks, pids, events=events, attempt=n, grace=self.spec.checkpoint.grace_seconds)
        records = [
            RankRecord(rank=r, pid=pid or None, node=slot.host)
            for r, (pid, slot) in enumerate(zip(pids, slots, strict=True))
        ]
        self._running, self._kill_at = group, None
        self.status = start_attempt(self.status, group.pid, slots[0].host, time.time(), records)
        self._save()
        return group

    def _wait(self, running: Running) -> int | None:
        while (ended := running.poll()) is None:
            with self._lock:
                if self._kill_at is not None and time.monotonic() >= self._kill_at:
                    running.signal(signal.SIGKILL)
                    self._kill_at = None
                    self.status = self.status.with_last(kill_at=time.time())
                    self._save()
            time.sleep(self.poll_s)
        return ended.code

    def _finish(self, running: Running, code: int | None) -> None:
        with self._lock:
            running.close()
            last = self.status.open_attempt()
            stop = last.stop if last is not None else None
            self.status = end_attempt(self.status, code, stop, time.time(), self.spec.max_restarts)
            self._running, self._kill_at = None, None
            self._save()


__all__ = [
    "RESERVE_POLL_S",
    "SCHEMA_VERSION",
    "STATUS_FILE",
    "AttemptRecord",
    "JobRunner",
    "OneProcess",
    "RankRecord",
    "RunStatus",
    "RunnerArgs",
    "Running",
    "end_attempt",
    "exit_actor",
    "placement_name",
    "read_status",
    "start_attempt",
    "status_path",
    "write_status",
]
