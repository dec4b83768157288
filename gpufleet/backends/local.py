"""The embedded local backend: virtual GPU slots, priority preemption with requeue.

It behaves like Slurm with ``PreemptType=preempt/partition_prio`` and ``PreemptMode=REQUEUE``:
when a pending job cannot fit and lower-priority jobs hold enough slots, the lowest-priority,
most recently started of them get SIGTERM, then SIGKILL after their grace time, and go back
to the queue (up to ``max_restarts`` times). Nothing is lost: the runtime saves at the next
step boundary and the next attempt restores it.

One scheduler process per ``$GPUFLEET_HOME`` (an ``flock`` on ``scheduler.lock``) owns the
attempts; ``submit`` starts it when none runs, and it exits after ``idle_exit`` seconds with
nothing queued or running. Its PID is in ``scheduler.pid``. If it dies, the next one finds the
attempts it left, kills them by PID and requeues their jobs (their checkpoints are intact).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gpufleet.backends.base import Backend, Feature, ingest_events, register, write_spec_file
from gpufleet.backends.lifecycle import (
    NOT_STARTED,
    alive,
    attempt_argv,
    attempt_end,
    attempt_processes,
    exit_from_events,
    signal_group,
)
from gpufleet.errors import ParameterError, StoreError, UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.protocol import check_environment, entry_argv, job_environment
from gpufleet.jobs.store import TERMINAL, Job, Store
from gpufleet.paths import attempt_log, events_file, hold_file, job_dir, scheduler_log, spec_file, state_db
from gpufleet.paths import scheduler_pid as pid_file
from gpufleet.runtime.interval import ENV_PREEMPTIONS
from gpufleet.spec import JobSpec

if TYPE_CHECKING:
    from gpufleet.backends.fleet_sched import FleetScheduling, Placed

DEFAULT_SLOTS = 1


def configured_slots() -> int:
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


@register("local")
class LocalBackend(Backend):
    """Client side: writes jobs and requests to the store and makes sure a scheduler runs."""

    features = frozenset({Feature.PREEMPT_GRACE, Feature.MULTI_RANK, Feature.RESIZE, Feature.HOLD})
    """One host: a job of several ranks runs them all here (one slot each); never several nodes. Each
    attempt is launched from the job's stored spec, so a resized job simply starts its next one bigger
    or smaller."""

    def __init__(self, home: Path, *, spawn: bool = True) -> None:
        super().__init__(home)
        self.spawn = spawn

    def _admit(self, spec: JobSpec, env: dict[str, str] | None) -> JobSpec:
        from gpufleet.backends.fleet_sched import check_fits
        from gpufleet.backends.pools import active_fleet

        fleet = active_fleet(self.home)
        if fleet is not None:
            check_fits(spec, fleet)
            return spec
        slots, running = scheduler_slots(self.home)
        if slots_of(spec) > slots:
            raise UsageError(
                f"resources.gpus={spec.resources.gpus} exceeds the local backend's {slots} virtual GPU slot(s)"
                + (f" (those of its running scheduler, {_restart_hint(running)})" if running else "")
                + "; lower it or set GPUFLEET_LOCAL_SLOTS"
            )
        return spec

    def _start(self, job_id: int, folder: Path, spec: JobSpec) -> None:
        if self.spawn:  # a scheduler already running keeps its environment: say so when it differs
            note = settings_drift(self.home, os.environ)
            if note is not None:
                print(note, file=sys.stderr, flush=True)
        self._wake()

    def _resize(self, job: Job, spec: JobSpec) -> JobSpec:
        slots, running = scheduler_slots(self.home)
        if slots_of(spec) > slots:
            raise ParameterError(
                "{gpus} exceeds the local backend's {slots!s} virtual GPU slot(s){where!s}: "
                "give {slots!s} or fewer, or set GPUFLEET_LOCAL_SLOTS",
                gpus=spec.resources.gpus,
                slots=slots,
                where=f" (those of its running scheduler, {_restart_hint(running)})" if running else "",
            )
        return spec

    def _preempt(self, job: Job, grace: float | None) -> None:
        self.store.add_request(job.id, "preempt", grace)
        self._wake()

    def _cancel(self, job: Job) -> None:
        self.store.add_request(job.id, "cancel")
        self._wake()

    def _held(self, job: Job) -> bool:
        return hold_file(self.home, job.id).exists()

    def _hold(self, job: Job, *, held: bool) -> None:
        marker = hold_file(self.home, job.id)
        if held:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            if self.store.job(job.id).state != "queued":  # the scheduler started it meanwhile
                marker.unlink(missing_ok=True)
                raise UsageError(f"job {job.id} started meanwhile: preempt it, then hold it")
            self.store.set_reason(job.id, "held: `gpufleet release` lets it start")
            self.store.add_event(job.id, EventKind.HELD)
        else:
            marker.unlink(missing_ok=True)
            self.store.set_reason(job.id, None)
            self.store.add_event(job.id, EventKind.RELEASED)
            self._wake()

    def _wake(self) -> None:
        if self.spawn:
            ensure_scheduler(self.home)

    def sync(self) -> None:
        """The scheduler writes the store itself; if it died with jobs to run, start a new one and say so."""
        died = pid_file(self.home).exists()  # a scheduler that exits cleanly removes it
        if self.spawn and died and self.store.has_active(self.name) and scheduler_pid(self.home) is None:
            ensure_scheduler(self.home)
            raise UsageError(
                f"the local scheduler of {self.home} was not running (it died?); a new one was started "
                "and recovers its jobs"
            )


# ---- the scheduler process ------------------------------------------------------------------


def scheduler_pid(home: Path) -> int | None:
    """PID of the running scheduler, or ``None`` (checked against the lock, not just the file)."""
    lock = home / "scheduler.lock"
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


def startable(home: Path, queued: list[Job]) -> list[Job]:
    """The queued jobs a scheduler may start: those not held (``gpufleet hold``)."""
    return [j for j in queued if not hold_file(home, j.id).exists()]


SETTINGS_PREFIXES = ("GPUFLEET_", "CUDA_", "NCCL_", "TORCH", "PYTHON", "OMP_", "HF_")
"""The variables whose change a running scheduler is checked for: those gpufleet reads (``GPUFLEET_*``:
its slots, its idle time, the runtime's settings) and the usual ones that change a training run. The
scheduler passes its whole environment on to every attempt it starts."""


def settings_file(home: Path) -> Path:
    """What the running scheduler started with: its PID, slots and a digest of each variable it checks."""
    return home / "scheduler-env.json"


def environment_digests(env: Mapping[str, str]) -> dict[str, str]:
    """A short sha256 of each checked variable's value (:data:`SETTINGS_PREFIXES`): values may be secrets."""
    return {
        name: hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        for name, value in sorted(env.items())
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


def _restart_hint(pid: int | None) -> str:
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
        f"It is {_restart_hint(pid)}; set a job's own variables in its spec's `env`"
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


@dataclass
class _Running:
    job: Job
    n: int
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    stop: str | None = None
    """``preempted`` or ``cancelled`` once the scheduler has signalled it."""
    kill_at: float | None = None
    placed: Placed | None = None
    """Where it runs when the home has a fleet (``None``: the one pool of slots)."""
    started: float = 0.0


class LocalScheduler:
    """Owns the attempts of one ``$GPUFLEET_HOME``; call ``tick`` in a loop, or ``run``."""

    def __init__(self, home: Path, *, slots: int | None = None, poll_s: float = 0.1, idle_exit_s: float = 10.0) -> None:
        self.home = home
        self.store = store_for(home)
        self.slots = slots if slots is not None else configured_slots()
        self.poll_s = poll_s
        self.idle_exit_s = idle_exit_s
        self.running: dict[int, _Running] = {}
        self.fleet: FleetScheduling | None = None

    # ---- main loop ---------------------------------------------------------------------------
    def run(self) -> None:
        lock = (self.home / "scheduler.lock").open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        pid_file(self.home).write_text(str(os.getpid()))
        record_settings(self.home, self.slots, self.idle_exit_s)
        stop = False

        def _stop(signum: int, frame: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        self.adopt_orphans()
        idle_since = time.monotonic()
        full_since: float | None = None
        while not stop:
            try:
                self.tick()
                if full_since is not None:
                    print(f"gpufleet scheduler: {self.home} is writable again; scheduling resumes", flush=True)
                full_since = None
            except StoreError as err:  # a full disk: keep the attempts, try again, never die of it
                if full_since is None:
                    print(f"gpufleet scheduler: {err}", flush=True)
                    full_since = time.monotonic()
                idle_since = time.monotonic()
                time.sleep(1.0)
                continue
            if self.running or startable(self.home, self.store.jobs(states=("queued",))):
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > self.idle_exit_s:
                break
            time.sleep(self.poll_s)
        self.shutdown()
        pid_file(self.home).unlink(missing_ok=True)
        lock.close()

    def tick(self) -> None:
        self._handle_requests()
        self._ingest_all()
        self._reap()
        self._enforce_grace()
        self._schedule()

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Preempt what still runs (it saves and is requeued for the next scheduler)."""
        for run in list(self.running.values()):
            if run.stop is None:
                self._stop(run, "preempted", grace_s)
        deadline = time.monotonic() + grace_s
        while self.running and time.monotonic() < deadline:
            self._reap()
            self._enforce_grace()
            time.sleep(0.05)
        for run in list(self.running.values()):
            signal_group(run.proc.pid, signal.SIGKILL)
            run.proc.wait()
        self._reap()

    # ---- requests and grace ------------------------------------------------------------------
    def _handle_requests(self) -> None:
        for job_id, kind, grace in self.store.take_requests():
            job = self.store.job(job_id)
            run = self.running.get(job_id)
            if kind == "cancel" and run is None and job.state not in TERMINAL:
                self.store.set_job_state(job_id, "cancelled", reason="cancelled while queued")
                self.store.add_event(job_id, EventKind.CANCELLED)
            elif run is not None and run.stop is None:
                outcome = "cancelled" if kind == "cancel" else "preempted"
                self._stop(run, outcome, grace)

    def stop(self, run: _Running, outcome: str, grace: float | None, *, abrupt: bool = False) -> None:
        """SIGTERM the attempt, SIGKILL after ``grace`` (the job's own by default); ``abrupt``: SIGKILL now."""
        if abrupt:
            now = time.time()
            run.stop, run.kill_at = outcome, None
            signal_group(run.proc.pid, signal.SIGKILL)
            self.store.update_attempt(run.job.id, run.n, state="stopping", sigterm_at=now, kill_at=now)
            self.store.add_event(run.job.id, EventKind.SIGKILL, attempt=run.n, ts=now, reason=f"{outcome}, abruptly")
            return
        self._stop(run, outcome, grace)

    def _stop(self, run: _Running, outcome: str, grace: float | None) -> None:
        grace_s = grace if grace is not None else run.job.spec.checkpoint.grace_seconds
        now = time.time()
        run.stop, run.kill_at = outcome, time.monotonic() + grace_s
        signal_group(run.proc.pid, signal.SIGTERM)
        self.store.update_attempt(run.job.id, run.n, state="stopping", sigterm_at=now)
        self.store.add_event(run.job.id, EventKind.SIGTERM, attempt=run.n, ts=now, reason=outcome, grace=grace_s)

    def _enforce_grace(self) -> None:
        now = time.monotonic()
        for run in self.running.values():
            if run.kill_at is not None and now >= run.kill_at and run.proc.poll() is None:
                signal_group(run.proc.pid, signal.SIGKILL)
                self.store.update_attempt(run.job.id, run.n, kill_at=time.time())
                self.store.add_event(run.job.id, EventKind.SIGKILL, attempt=run.n, reason="grace time expired")
                run.kill_at = None

    # ---- attempts ------------------------------------------------------------------------------
    def _ingest(self, job: Job) -> None:
        ingest_events(self.store, self.home, job)

    def _ingest_all(self) -> None:
        for job_id in list(self.running):
            self._ingest(self.store.job(job_id))

    def _reap(self) -> None:
        for job_id, run in list(self.running.items()):
            code = run.proc.poll()
            if code is None:
                continue
            signal_group(run.proc.pid, signal.SIGKILL)  # leave no stray children behind
            # Recorded before it is forgotten: a store that fails here (a full disk) is retried next tick.
            self._ingest(self.store.job(job_id))
            self._finish(self.store.job(job_id), run.n, code, run.stop)
            run.log.close()
            del self.running[job_id]

    def _finish(self, job: Job, n: int, code: int, stop: str | None) -> None:
        end = attempt_end(code, stop, attempt=n, restarts=job.restarts, max_restarts=job.spec.max_restarts)
        self.store.end_attempt(
            job.id,
            n,
            ended_at=time.time(),
            exit_code=code,
            outcome=end.outcome,
            job_state=end.state,
            reason=end.reason,
            restarts=job.restarts + 1 if end.requeued else None,
        )

    def adopt_orphans(self, grace_s: float = 30.0) -> None:
        """Recover every attempt a dead scheduler left open (launching, running or stopping).

        Its processes (by PID, or found by their ``GPUFLEET_*`` variables when the scheduler died
        before recording the PID) got SIGTERM from the kernel when it died, and are given it again
        with ``grace_s`` to save before SIGKILL. How the attempt ended is read from its own
        ``session_end`` event: one that completed while nobody watched is completed, not re-run.
        """
        for attempt in self.store.running_attempts():
            job = self.store.job(attempt.job_id)
            pids = [attempt.pid] if attempt.pid else attempt_processes(self.home, job.id, attempt.n)
            for pid in pids:
                signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + min(grace_s, job.spec.checkpoint.grace_seconds)
            while any(alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            for pid in pids:
                signal_group(pid, signal.SIGKILL)
            self._ingest(job)
            code = exit_from_events(events_file(self.home, job.id), attempt.n)
            stop = "lost" if code is None else ("preempted" if attempt.state == "stopping" else None)
            self._finish(self.store.job(job.id), attempt.n, -int(signal.SIGKILL) if code is None else code, stop)

    def launch(self, job: Job, placed: Placed | None = None) -> None:
        """Start the job's next attempt (on ``placed``, when the home has a fleet)."""
        self._launch(job, placed)

    def _launch(self, job: Job, placed: Placed | None = None) -> None:
        spec = job.spec
        n = len(self.store.attempts(job.id)) + 1
        folder = job_dir(self.home, job.id)
        log_path = attempt_log(self.home, job.id, n)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **job_environment(spec, job.id, self.home, "local"),
            **job.env,
            "GPUFLEET_ATTEMPT": str(n),
        }
        if placed is not None:  # what `checkpoint: {every: auto}` plans for on this pool
            env[ENV_PREEMPTIONS] = f"{placed.preemptions_per_hour:g}"
        argv = entry_argv(spec)
        try:  # the stored spec is the authority; the attempt reads this copy (a resize changes the store only)
            write_spec_file(folder, spec)
        except OSError as err:
            raise StoreError(
                f"cannot write {spec_file(self.home, job.id)}: {err.strerror}; free some space there"
            ) from None
        started = time.time()
        self.store.begin_attempt(job.id, n, started)  # intent first: a crash now cannot launch it twice
        log = log_path.open("ab")
        try:
            proc = subprocess.Popen(
                attempt_argv(argv, signal.SIGTERM),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=spec.workdir or None,
                env=env,
                start_new_session=True,
            )
        except OSError as err:
            log.close()
            reason = f"cannot start {argv[0]!r}: {err.strerror}"
            self.store.end_attempt(
                job.id,
                n,
                ended_at=time.time(),
                exit_code=NOT_STARTED,
                outcome="failed",
                job_state="failed",
                reason=reason,
                restarts=None,
            )
            return
        # Ours before anything else can fail: if the store does, the next scheduler finds the process
        # by its GPUFLEET_* variables.
        self.running[job.id] = _Running(job, n, proc, log, placed=placed, started=started)
        self.store.set_attempt_pid(job.id, n, proc.pid)
        where = {} if placed is None else placed.to_event()
        for key in ("why", "gpus"):  # the reasons are in the `placed` event; the GPUs are counted below
            where.pop(key, None)
        self.store.add_event(
            job.id,
            EventKind.ATTEMPT_START,
            attempt=n,
            ts=started,
            pid=proc.pid,
            gpus=spec.total_gpus,
            world_size=spec.world_size,
            **where,
        )

    # ---- placement and preemption ----------------------------------------------------------
    def _schedule(self) -> None:
        from gpufleet.backends.fleet_sched import FleetScheduling

        self.fleet = FleetScheduling.load(self, self.fleet)
        if self.fleet is not None:
            self.fleet.tick()
            return
        used = sum(slots_of(r.job.spec) for r in self.running.values())
        free = self.slots - used
        queued = startable(self.home, self.store.jobs(states=("queued",)))
        queue = sorted(queued, key=lambda j: (-j.priority, j.id))
        for job in queue:
            need = slots_of(job.spec)
            if need <= free:
                self._launch(job)
                free -= need
                continue
            draining = sum(slots_of(r.job.spec) for r in self.running.values() if r.stop is not None)
            victims = sorted(
                (r for r in self.running.values() if r.stop is None and r.job.priority < job.priority),
                key=lambda r: (r.job.priority, -r.proc.pid),
            )
            chosen, reclaim = [], free + draining
            for victim in victims:
                if reclaim >= need:
                    break
                chosen.append(victim)
                reclaim += slots_of(victim.job.spec)
            if reclaim >= need:
                for victim in chosen:
                    self.store.add_event(victim.job.id, EventKind.PREEMPTED_BY, attempt=victim.n, job=job.id)
                    self._stop(victim, "preempted", None)
            break  # strict priority: nothing lower jumps ahead of a job that is waiting


def main(argv: list[str]) -> int:
    if argv[:1] == ["--detach"]:
        argv = argv[1:]
        if os.fork() != 0:
            return 0
        os.setsid()
    if len(argv) != 1:
        print("usage: python -m gpufleet.backends.local [--detach] GPUFLEET_HOME", file=sys.stderr)
        return 2
    idle = float(os.environ.get("GPUFLEET_SCHEDULER_IDLE_S", "10"))
    LocalScheduler(Path(argv[0]), idle_exit_s=idle).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = [
    "DEFAULT_SLOTS",
    "LocalBackend",
    "LocalScheduler",
    "configured_slots",
    "ensure_scheduler",
    "main",
    "scheduler_pid",
    "scheduler_slots",
    "settings_drift",
    "slots_of",
    "store_for",
]
