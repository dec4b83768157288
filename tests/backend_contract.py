"""The backend contract, written once and run over every backend.

A :class:`Harness` wraps one backend with what a test needs to drive it: ``advance`` (tick the
in-process scheduler, or sync with the remote one), ``blocked`` (the scheduler has no room, so a
submitted job stays queued), a spec it refuses, and ``restart`` (the process that writes the
store died; a new one takes over). The ``check_*`` scenarios take a harness; the fast suite runs
them over in-process fakes (``tests/backends/test_contract.py``), the integration suite over the
real services (``tests/integration/test_backend_contract.py``).

:class:`FakeSlurm` is a one-node Slurm in this process: ``sbatch``, ``scontrol requeue``/``hold``/``release``,
``scancel`` and ``sacct`` over real processes, running each job's batch script as slurmd would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from gpufleet.backends.base import Backend, Feature
from gpufleet.backends.lifecycle import REQUEUED_OUTCOMES, alive
from gpufleet.cost.usage import store_usages
from gpufleet.errors import UsageError
from gpufleet.jobs.store import TERMINAL, Store
from gpufleet.paths import job_dir
from gpufleet.spec import JobSpec, parse_spec

# ---- the jobs: small scripts, each one behaviour ----------------------------------------------

# Attempt 1 says it is ready (with its PID), then waits for SIGTERM and exits 75; later attempts finish.
PREEMPTIBLE = """
import os, signal, sys, time
n = int(os.environ["GPUFLEET_ATTEMPT"])
if n > 1:
    sys.exit(0)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
with open(os.path.join(os.environ["GPUFLEET_JOB_DIR"], "ready-1.tmp"), "w") as fh:
    fh.write(str(os.getpid()))
os.replace(os.path.join(os.environ["GPUFLEET_JOB_DIR"], "ready-1.tmp"),
           os.path.join(os.environ["GPUFLEET_JOB_DIR"], "ready-1"))
time.sleep(600)
sys.exit(3)
"""

# Attempt 1 ignores SIGTERM (only a SIGKILL stops it); later attempts finish.
STUBBORN = PREEMPTIBLE.replace("lambda *_: sys.exit(75)", "signal.SIG_IGN")

# Every attempt asks to be requeued.
ALWAYS_REQUEUE = "import sys; sys.exit(75)"

# Killed by a real-time signal, outside Python's signal.Signals.
ODD_SIGNAL = "import os, signal; signal.signal(35, signal.SIG_DFL); os.kill(os.getpid(), 35)"

SLEEPER = "import time; time.sleep(600)"


def command_spec(script: str, name: str = "contract", **overrides: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": name,
        "team": "perception",
        "entrypoint": [sys.executable, "-c", script],
        "resources": {"cpus": 1, "gpus": 0},
        "checkpoint": {"every_steps": 10, "grace_seconds": 20},
        "max_restarts": 5,
    }
    data.update(overrides)
    return parse_spec(data)


# ---- harnesses ------------------------------------------------------------------------------------


class Harness:
    """One backend and the means to drive it (see the module docstring)."""

    name: str
    backend: Backend
    writer: Store
    """The store the scheduler side writes through (what a crash test kills)."""

    def advance(self) -> None:
        raise NotImplementedError

    def wait(self, until: Callable[[], bool], timeout: float = 180.0) -> None:
        """Advance until ``until()`` holds (the timeout is only a safety net)."""
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, f"{self.name}: timed out"
            self.advance()
            time.sleep(0.05)

    fill: dict[str, int] = {"cpus": 1, "gpus": 1}
    """The resources of a job that leaves no room for another."""
    waits: dict[str, int] = {"cpus": 1, "gpus": 1}
    """The resources of a job that waits behind a ``fill`` job."""

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """No room in the scheduler: a job that holds it all runs meanwhile."""
        filler = self.backend.submit(command_spec(SLEEPER, name="filler", resources=self.fill))
        self.wait(lambda: self.state(filler) == "running")
        try:
            yield
        finally:
            self.backend.cancel(filler)
            self.wait(lambda: self.state(filler) == "cancelled")

    def refused(self) -> tuple[JobSpec, str]:
        """A spec this backend refuses at submission, and a pattern its error matches."""
        raise NotImplementedError

    def restart(self) -> None:
        """The scheduler side died (at any point); a new one takes over."""
        raise NotImplementedError

    def close(self) -> None:
        return None

    def cancel_left(self) -> None:
        """Cancel what a failed test left queued or running (best effort)."""
        for job in self.backend.store.jobs(states=("queued", "running")):
            with contextlib.suppress(Exception):
                self.backend.cancel(job.id)

    def state(self, job_id: int) -> str:
        return self.backend.store.job(job_id).state


def ready_pid(harness: Harness, job_id: int) -> int:
    """Wait for attempt 1 of a PREEMPTIBLE/STUBBORN job to be ready; its PID."""
    ready = job_dir(harness.backend.home, job_id) / "ready-1"
    harness.wait(ready.exists)
    harness.wait(lambda: harness.state(job_id) == "running")
    return int(ready.read_text())


# ---- the scenarios --------------------------------------------------------------------------------


def check_preempt_and_resume(h: Harness) -> None:
    job = h.backend.submit(command_spec(PREEMPTIBLE))
    pid = ready_pid(h, job)
    h.backend.preempt(job)
    h.wait(lambda: h.state(job) == "completed")
    assert not alive(pid)
    attempts = h.backend.store.attempts(job)
    assert [a.n for a in attempts] == [1, 2]
    assert attempts[0].outcome in REQUEUED_OUTCOMES and attempts[1].outcome == "completed"
    assert h.backend.store.job(job).restarts == 1
    assert len(store_usages(h.backend.store, job_ids=[job])) == 2  # the ledger prices both
    kinds = [e.kind for e in h.backend.store.events(job, kinds=["attempt_end", "requeued", "completed"])]
    assert kinds == ["attempt_end", "requeued", "attempt_end", "completed"], kinds


def check_preempt_with_grace(h: Harness) -> None:
    """A job that ignores SIGTERM is killed once the grace given to ``preempt`` is over, then resumes."""
    job = h.backend.submit(command_spec(STUBBORN))
    pid = ready_pid(h, job)
    if Feature.PREEMPT_GRACE not in h.backend.features:
        with pytest.raises(UsageError, match="does not support"):
            h.backend.preempt(job, grace=0.5)
        assert h.state(job) == "running" and alive(pid)  # refused, not ignored: nothing was done
        h.backend.cancel(job)
        h.wait(lambda: h.state(job) == "cancelled")
        return
    h.backend.preempt(job, grace=0.5)
    h.wait(lambda: h.state(job) == "completed")
    first = h.backend.store.attempts(job)[0]
    assert first.outcome == "preempted" and first.kill_at is not None and first.exit_code == -signal.SIGKILL
    assert not alive(pid)


def check_cancel_queued(h: Harness) -> None:
    with h.blocked():
        job = h.backend.submit(command_spec(SLEEPER, name="waits", resources=h.waits))
        h.advance()
        assert h.state(job) == "queued"
        h.backend.cancel(job)
        h.wait(lambda: h.state(job) == "cancelled")
    assert h.backend.store.attempts(job) == []
    with pytest.raises(UsageError, match="already cancelled"):
        h.backend.cancel(job)


def check_cancel_running(h: Harness) -> None:
    job = h.backend.submit(command_spec(PREEMPTIBLE))
    pid = ready_pid(h, job)
    h.backend.cancel(job)
    h.wait(lambda: h.state(job) == "cancelled")
    h.wait(lambda: not alive(pid))
    attempts = h.backend.store.attempts(job)
    assert [a.outcome for a in attempts] == ["cancelled"] and attempts[0].ended_at is not None
    with pytest.raises(UsageError, match="already cancelled"):
        h.backend.preempt(job)


def check_refused_submit_leaves_nothing(h: Harness) -> None:
    spec, pattern = h.refused()
    before = h.backend.store.jobs()
    jobs = h.backend.home / "jobs"
    folders = sorted(jobs.iterdir()) if jobs.exists() else []
    with pytest.raises(UsageError, match=pattern):
        h.backend.submit(spec)
    assert h.backend.store.jobs() == before
    assert (sorted(jobs.iterdir()) if jobs.exists() else []) == folders


def check_max_restarts(h: Harness) -> None:
    job = h.backend.submit(command_spec(ALWAYS_REQUEUE, max_restarts=2))
    h.wait(lambda: h.state(job) == "failed")
    stored = h.backend.store.job(job)
    assert stored.restarts == 2 and stored.reason is not None and "max_restarts" in stored.reason
    assert [a.outcome for a in h.backend.store.attempts(job)] == ["requeued"] * 3


def check_odd_exit_signal(h: Harness) -> None:
    job = h.backend.submit(command_spec(ODD_SIGNAL))
    h.wait(lambda: h.state(job) == "failed")
    stored = h.backend.store.job(job)
    assert stored.reason is not None and "signal 35" in stored.reason, stored.reason
    assert [a.exit_code for a in h.backend.store.attempts(job)] == [-35]
    survivor = h.backend.submit(command_spec("pass", name="after"))  # the scheduler is still there
    h.wait(lambda: h.state(survivor) == "completed")


def check_hold_and_release(h: Harness) -> None:
    """A held job stays queued when there is room for it, and runs once released; without HOLD, refused."""
    with h.blocked():
        job = h.backend.submit(command_spec("pass", name="held", resources=h.waits))
        h.advance()
        assert h.state(job) == "queued"
        if Feature.HOLD not in h.backend.features:
            with pytest.raises(UsageError, match="does not support holding"):
                h.backend.hold(job)
            h.backend.cancel(job)
            h.wait(lambda: h.state(job) == "cancelled")
            return
        with pytest.raises(UsageError, match="is not held"):
            h.backend.release(job)
        h.backend.hold(job)
    h.advance()  # the room the filler held is free: a job not held would have started by now
    stored = h.backend.store.job(job)
    assert stored.state == "queued" and h.backend.store.attempts(job) == [], stored
    assert stored.reason is not None and stored.reason.startswith("held"), stored.reason
    h.backend.release(job)
    h.wait(lambda: h.state(job) == "completed")
    kinds = [e.kind for e in h.backend.store.events(job, kinds=["held", "released"])]
    assert kinds == ["held", "released"], kinds
    assert [a.outcome for a in h.backend.store.attempts(job)] == ["completed"]


SCENARIOS: dict[str, Callable[[Harness], None]] = {
    "preempt_and_resume": check_preempt_and_resume,
    "preempt_with_grace": check_preempt_with_grace,
    "cancel_queued": check_cancel_queued,
    "cancel_running": check_cancel_running,
    "refused_submit": check_refused_submit_leaves_nothing,
    "max_restarts": check_max_restarts,
    "odd_exit_signal": check_odd_exit_signal,
    "hold_and_release": check_hold_and_release,
}


# ---- a crash of the scheduler side at any store write --------------------------------------------

WRITES = (
    "begin_attempt",
    "set_attempt_pid",
    "end_attempt",
    "update_attempt",
    "upsert_attempt",
    "apply_sync",
    "set_job_state",
    "add_event",
    "add_runtime_events",
    "take_requests",
)


class Killed(BaseException):
    """The scheduler side dies here (BaseException: nothing in it may catch this)."""


def kill_at_write(store: Store, k: int, armed: Callable[[], bool] = lambda: True) -> list[str]:
    """Make the ``k``-th write through ``store`` (while ``armed()``) raise ``Killed``; return the writes made."""
    made: list[str] = []
    for name in WRITES:
        real = getattr(store, name)

        def wrapped(*args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any) -> Any:
            if not armed() or not writes(store, _name, args):
                return _real(*args, **kwargs)
            if len(made) + 1 == k:
                raise Killed(f"killed at write {k} ({_name})")
            made.append(_name)
            return _real(*args, **kwargs)

        setattr(store, name, wrapped)
    return made


def writes(store: Store, name: str, args: tuple[Any, ...]) -> bool:
    """Whether a call changes the store (taking no request, ingesting no event or syncing nothing does not)."""
    if name == "take_requests":
        return store._db.execute("SELECT 1 FROM requests WHERE handled_at IS NULL LIMIT 1").fetchone() is not None
    if name == "add_runtime_events":
        return bool(args[1])
    if name == "apply_sync":
        job, plan = args
        return bool(plan.attempts or plan.events or plan.moves(job))
    return True


def check_crash_at_write(h: Harness, k: int) -> bool:
    """Preempt and resume with the scheduler side killed at its ``k``-th write; True if it was killed.

    Whatever ``k``: the job completes, no event is recorded twice or lost, and the ledger prices
    every attempt.
    """
    scheduling = [False]
    kill_at_write(h.writer, k, armed=lambda: scheduling[0])
    advance = h.advance

    def advance_and_die() -> None:  # the scheduler side is what advance runs: a tick, a sync
        scheduling[0] = True
        try:
            advance()
        finally:
            scheduling[0] = False

    h.advance = advance_and_die  # type: ignore[method-assign]
    job = h.backend.submit(command_spec(PREEMPTIBLE, name="victim"))
    preempted = killed = False
    try:
        ready_pid(h, job)
        h.backend.preempt(job)
        preempted = True
        h.wait(lambda: h.state(job) == "completed")
    except Killed:
        killed = True
    h.advance = advance  # type: ignore[method-assign]
    h.restart()
    if not preempted:  # attempt 1 waits for its SIGTERM, unless the recovery already stopped it
        ready = job_dir(h.backend.home, job) / "ready-1"

        def waiting() -> bool:
            open_ = [a.n for a in h.backend.store.attempts(job) if a.ended_at is None]
            return open_ == [1] and ready.exists() and h.state(job) == "running"

        h.wait(lambda: h.state(job) in TERMINAL or waiting())
        if waiting():
            h.backend.preempt(job)
    h.wait(lambda: h.state(job) in ("completed", "failed"))
    assert h.state(job) == "completed", (k, h.backend.store.job(job).reason)
    attempts = h.backend.store.attempts(job)
    assert all(a.state == "ended" and a.outcome for a in attempts), (k, attempts)
    assert attempts[-1].outcome == "completed"
    ends = [e.attempt for e in h.backend.store.events(job, kinds=["attempt_end"])]
    assert ends == [a.n for a in attempts], (k, ends)
    assert len(h.backend.store.events(job, kinds=["completed"])) == 1
    assert len(store_usages(h.backend.store, job_ids=[job])) == len(attempts)
    return killed


# ---- a one-node Slurm in this process ------------------------------------------------------------


def _stamp(ts: float | None) -> str:
    return "Unknown" if ts is None else datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S")


@dataclass
class _Run:
    state: str
    start: float | None = None
    end: float | None = None
    exit: str = "0:0"
    ran: bool = True
    """False for a job cancelled while pending: Slurm gives it a Start (the cancel) but no AllocTRES."""


@dataclass
class _SlurmJob:
    id: int
    script: str
    account: str
    cpus: int
    runs: list[_Run] = field(default_factory=list)
    pending: bool = True
    proc: subprocess.Popen[bytes] | None = None
    stopping: str | None = None
    term_at: float | None = None
    held: bool = False
    """``scontrol hold``: a pending job that does not start until ``scontrol release``."""


class FakeSlurm:
    """``sbatch``, ``scontrol requeue``, ``scancel``, ``sacct`` and ``squeue`` as a one-node Slurm answers them.

    Jobs start on :meth:`tick` while CPUs are free; a run's process gets
    ``SLURM_JOB_ID`` and, once requeued, ``SLURM_RESTART_COUNT``; a requeue or cancel sends
    SIGTERM and SIGKILL ``kill_wait`` seconds later (``KillWait``). A requeued job is pending
    again; a run that ended is ``COMPLETED`` or ``FAILED`` (exit ``code:signal``). No
    ``RequeueExit``: a run that exits 75 has failed as far as this Slurm knows.
    """

    def __init__(self, accounts: Sequence[str] = ("perception",), cpus: int = 2, kill_wait: float = 2.0) -> None:
        self.accounts = set(accounts)
        self.cpus = cpus
        self.kill_wait = kill_wait
        self.jobs: dict[int, _SlurmJob] = {}

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        command, args = argv[0], list(argv[1:])
        out = ""
        if command == "sbatch":
            out = self._sbatch(args)
        elif command == "scontrol" and args[:1] == ["requeue"]:
            self._requeue(self._job(args[1]))
        elif command == "scontrol" and args[:1] in (["hold"], ["release"]):  # accepted in any state, as Slurm does
            self._job(args[1]).held = args[0] == "hold"
        elif command == "scancel":
            self._cancel(self._job(args[0]))
        elif command == "sacct":
            out = self._sacct(args[args.index("-j") + 1].split(","))
        elif command == "squeue":  # a pending job waits for CPUs, or for its release
            refs = [int(r) for r in args[args.index("-j") + 1].split(",")]
            pending = [self.jobs[r] for r in refs if r in self.jobs and self.jobs[r].pending]
            out = "".join(f"{j.id}|{'JobHeldUser' if j.held else 'Resources'}\n" for j in pending)
        else:
            raise AssertionError(f"FakeSlurm does not know {list(argv)}")
        return subprocess.CompletedProcess(list(argv), 0, out, "")

    def _job(self, ref: str) -> _SlurmJob:
        try:
            return self.jobs[int(ref)]
        except (KeyError, ValueError):
            raise UsageError(f"{ref} refused: Invalid job id specified") from None

    def _sbatch(self, args: list[str]) -> str:
        opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        if opts.get("account") not in self.accounts:
            raise UsageError("sbatch refused: Batch job submission failed: Invalid account or account/partition")
        job = _SlurmJob(
            id=1000 + len(self.jobs), script=args[-1], account=opts["account"], cpus=int(opts.get("cpus-per-task", "1"))
        )
        self.jobs[job.id] = job
        return f"{job.id}\n"

    def _signal(self, job: _SlurmJob, why: str) -> None:
        assert job.proc is not None
        job.stopping, job.term_at = why, time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.proc.pid, signal.SIGTERM)

    def _requeue(self, job: _SlurmJob) -> None:
        if job.pending:
            raise UsageError(f"scontrol refused: Job is pending execution for job {job.id}")
        if job.proc is not None:
            self._signal(job, "requeue")
        elif job.runs:  # a finished job goes back to the queue
            job.runs[-1].state = "REQUEUED"
            job.pending = True

    def _cancel(self, job: _SlurmJob) -> None:
        if job.proc is not None:
            self._signal(job, "cancel")
        elif job.pending:
            job.pending = False
            job.runs.append(_Run("CANCELLED", int(time.time()), int(time.time()), "0:0", ran=False))

    def _sacct(self, refs: list[str]) -> str:
        lines = []
        for ref in refs:
            job = self.jobs.get(int(ref))
            if job is None:
                continue
            rows = [*job.runs] + ([_Run("PENDING", ran=False)] if job.pending else [])
            for run in rows:
                elapsed = int((run.end or time.time()) - run.start) if run.start is not None else 0
                tres = f"billing={job.cpus},cpu={job.cpus},node=1" if run.ran else ""
                lines.append(
                    f"{job.id}|{run.state}|{_stamp(run.start)}|{_stamp(run.end)}|{run.exit}|{elapsed}"
                    f"|{tres}|{job.account}"
                )
        return "\n".join(lines) + "\n"

    def tick(self) -> None:
        now = time.time()
        for job in self.jobs.values():
            if job.proc is None:
                continue
            code = job.proc.poll()
            if code is None:
                if job.term_at is not None and now - job.term_at > self.kill_wait:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(job.proc.pid, signal.SIGKILL)
                continue
            run = job.runs[-1]
            run.end = int(now)
            run.exit = f"{code}:0" if code >= 0 else f"0:{-code}"
            if job.stopping == "requeue":
                run.state, job.pending = "REQUEUED", True
            elif job.stopping == "cancel":
                run.state = "CANCELLED"
            else:
                run.state = "COMPLETED" if code == 0 else "FAILED"
            job.proc, job.stopping, job.term_at = None, None, None
        busy = sum(j.cpus for j in self.jobs.values() if j.proc is not None)
        for job in self.jobs.values():
            if job.pending and not job.held and busy + job.cpus <= self.cpus:
                env = {**os.environ, "SLURM_JOB_ID": str(job.id)}
                if job.runs:
                    env["SLURM_RESTART_COUNT"] = str(len(job.runs))
                job.proc = subprocess.Popen(
                    [job.script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
                )
                job.pending = False
                job.runs.append(_Run("RUNNING", int(now)))
                busy += job.cpus

    def close(self) -> None:
        for job in self.jobs.values():
            if job.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.proc.pid, signal.SIGKILL)
                job.proc.wait()
