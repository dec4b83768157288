"""The local scheduler: the loop that owns the attempts of one ``$GPUFLEET_HOME``.

It behaves like Slurm with ``PreemptType=preempt/partition_prio`` and ``PreemptMode=REQUEUE``:
when a pending job cannot fit and lower-priority jobs hold enough slots, the lowest-priority,
most recently started of them get SIGTERM, then SIGKILL after their grace time, and go back
to the queue (up to ``max_restarts`` times). Nothing is lost: the runtime saves at the next
step boundary and the next attempt restores it.

If a scheduler dies, the next one finds the attempts it left, kills them by PID and requeues
their jobs (their checkpoints are intact). The process around the loop (lock, PID, settings) is
``process.py``.

When the home has a fleet, a :class:`FleetPolicy` places the queued jobs instead of the one pool
of slots. The loop calls it through that protocol only: the fleet policy (``fleet.py``) imports
this module and plugs itself in with :func:`plug_fleet_policy`, never the other way round.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from gpufleet.backends.base import ingest_events, write_spec_file
from gpufleet.backends.lifecycle import (
    NOT_STARTED,
    alive,
    attempt_argv,
    attempt_end,
    attempt_processes,
    exit_from_events,
    signal_group,
)
from gpufleet.backends.local.process import configured_slots, lock_file, record_settings, slots_of, store_for
from gpufleet.backends.local.warm import AttemptProcess, WarmProcess, WarmServer, warm_entry, warm_start_enabled
from gpufleet.backends.notices import NoticeDrain, attach
from gpufleet.backends.pools import Placed
from gpufleet.cost.rates import price_environment
from gpufleet.errors import StoreError, UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.protocol import entry_argv, job_environment
from gpufleet.jobs.store import TERMINAL, Job, JobState
from gpufleet.numpy_cpu import without_own_setting
from gpufleet.paths import attempt_log, events_file, hold_file, job_dir, spec_file
from gpufleet.paths import scheduler_pid as pid_file
from gpufleet.runtime.interval import ENV_PREEMPTIONS
from gpufleet.runtime.memtier import release as release_memory_tier

WARM_WAIT_S = 20.0
"""How long launches wait for a warm server still importing (what a new interpreter would spend anyway)."""


def startable(home: Path, queued: list[Job]) -> list[Job]:
    """The queued jobs a scheduler may start: those not held (``gpufleet hold``)."""
    return [j for j in queued if not hold_file(home, j.id).exists()]


@dataclass
class RunningAttempt:
    """An attempt this scheduler started and has not yet reaped."""

    job: Job
    n: int
    proc: AttemptProcess
    """``subprocess.Popen``, or a :class:`WarmProcess` forked by the scheduler's warm server."""
    log: IO[bytes]
    stop: str | None = None
    """``preempted`` or ``cancelled`` once the scheduler has signalled it."""
    kill_at: float | None = None
    placed: Placed | None = None
    """Where it runs when the home has a fleet (``None``: the one pool of slots)."""
    started: float = 0.0


class FleetPolicy(Protocol):
    """What the loop asks of the placement on a fleet: it replaces the one pool of slots while current."""

    def tick(self) -> None:
        """Stop, place and launch for one tick, through the scheduler's ``stop`` and ``launch``."""

    def current(self) -> bool:
        """Whether this is still the fleet in use (``gpufleet fleet use`` or ``drop`` may have changed it)."""


FleetLoader = Callable[["LocalScheduler"], "FleetPolicy | None"]
"""The policy for a scheduler's home, ``None`` when the home has no fleet."""

_fleet_loaders: list[FleetLoader] = []


def plug_fleet_policy(loader: FleetLoader) -> FleetLoader:
    """Make ``loader`` give every scheduler its fleet policy (``fleet.py`` does, when imported).

    Every import of this module runs the package's ``__init__`` first, which imports ``fleet.py``:
    a scheduler never runs without its fleet policy, yet the loop does not import it.
    """
    if loader not in _fleet_loaders:
        _fleet_loaders.append(loader)
    return loader


def no_fleet(sched: LocalScheduler) -> FleetPolicy | None:
    """The loader of a scheduler told to ignore fleets: always the one pool of slots."""
    return None


def plugged_fleet(sched: LocalScheduler) -> FleetPolicy | None:
    """The first policy a plugged-in loader gives for the scheduler's home."""
    for loader in _fleet_loaders:
        policy = loader(sched)
        if policy is not None:
            return policy
    return None


class LocalScheduler:
    """Owns the attempts of one ``$GPUFLEET_HOME``; call ``tick`` in a loop, or ``run``."""

    def __init__(
        self,
        home: Path,
        *,
        slots: int | None = None,
        poll_s: float = 0.1,
        idle_exit_s: float = 10.0,
        fleet: FleetLoader = plugged_fleet,
    ) -> None:
        self.home = home
        self.store = store_for(home)
        self.slots = slots if slots is not None else configured_slots()
        self.poll_s = poll_s
        self.idle_exit_s = idle_exit_s
        self.running: dict[int, RunningAttempt] = {}
        self.fleet_loader = fleet
        """Gives the fleet policy of the home, re-asked whenever the current one is no longer current."""
        self.fleet: FleetPolicy | None = None
        self.warm: WarmServer | None = None
        """Forks attempts from an interpreter that has imported torch (``warm.py``); started at the first launch."""
        self.warm_fallback_said = False
        self.warm_cannot_start = False
        self.warm_born = 0.0
        self.warm_hold = False
        """Launches wait (up to ``WARM_WAIT_S``) for the warm server the daemon started with."""
        self.drain: NoticeDrain | None = None
        """Turns a provider's preemption notice into a save of every attempt, and holds new starts (``notices.py``)."""

    # ---- main loop ---------------------------------------------------------------------------
    def run(self) -> None:
        lock = lock_file(self.home).open("a+")
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
        try:
            self.drain = attach(self.home)
        except UsageError as err:  # a bad GPUFLEET_NOTICES: say it, run without notices rather than die
            print(f"gpufleet scheduler: {err}; preemption notices are not watched", flush=True)
        self.prepare()
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
            if self.running or any(not hold_file(self.home, i).exists() for i in self.store.queued_ids()):
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > self.idle_exit_s:
                break
            self._idle(self.poll_s)
        if self.drain is not None and self.drain.watcher is not None:
            self.drain.watcher.stop()
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
        if self.warm is not None:
            self.warm.close()
            self.warm = None

    def _idle(self, seconds: float) -> None:
        """Sleep until the next tick, woken at once when the warm server reports an attempt's exit."""
        if self.warm is None or self.warm.dead:
            time.sleep(seconds)
            return
        self.warm.pump(seconds)  # reads what it said, so the next wait waits again

    # ---- requests and grace ------------------------------------------------------------------
    def _handle_requests(self) -> None:
        for job_id, kind, grace in self.store.take_requests():
            job = self.store.job(job_id)
            run = self.running.get(job_id)
            if kind == "cancel" and run is None and job.state not in TERMINAL:
                self.store.set_job_state(job_id, "cancelled", reason="cancelled while queued")
                self.store.add_event(job_id, EventKind.CANCELLED)
                release_memory_tier(job_dir(self.home, job_id))  # an earlier attempt's copies and keeper
            elif run is not None and run.stop is None:
                outcome = "cancelled" if kind == "cancel" else "preempted"
                self._stop(run, outcome, grace)

    def stop(self, run: RunningAttempt, outcome: str, grace: float | None, *, abrupt: bool = False) -> None:
        """SIGTERM the attempt, SIGKILL after ``grace`` (the job's own by default); ``abrupt``: SIGKILL now."""
        if abrupt:
            now = time.time()
            run.stop, run.kill_at = outcome, None
            signal_group(run.proc.pid, signal.SIGKILL)
            self.store.update_attempt(run.job.id, run.n, state="stopping", sigterm_at=now, kill_at=now)
            self.store.add_event(run.job.id, EventKind.SIGKILL, attempt=run.n, ts=now, reason=f"{outcome}, abruptly")
            return
        self._stop(run, outcome, grace)

    def _stop(self, run: RunningAttempt, outcome: str, grace: float | None) -> None:
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
            # The end is when the process ended, not when its events were read into the store below.
            ended_at = (run.proc.ended_at if isinstance(run.proc, WarmProcess) else None) or time.time()
            signal_group(run.proc.pid, signal.SIGKILL)  # leave no stray children behind
            # Recorded before it is forgotten: a store that fails here (a full disk) is retried next tick.
            self._ingest(self.store.job(job_id))
            stop = run.stop
            if isinstance(run.proc, WarmProcess) and run.proc.lost:  # its server died: its own events say how
                seen = exit_from_events(events_file(self.home, job_id), run.n)
                code, stop = (code, stop or "lost") if seen is None else (seen, stop)
            elif code < 0 and stop is None:  # killed by no one here (a node's notice, then its kill): after
                seen = exit_from_events(events_file(self.home, job_id), run.n)  # a save it is a requeue
                code = code if seen is None else seen
            self._finish(self.store.job(job_id), run.n, code, stop, ended_at=ended_at)
            run.log.close()
            del self.running[job_id]

    def _finish(self, job: Job, n: int, code: int, stop: str | None, *, ended_at: float | None = None) -> None:
        end = attempt_end(code, stop, attempt=n, restarts=job.restarts, max_restarts=job.spec.max_restarts)
        self.store.end_attempt(
            job.id,
            n,
            ended_at=ended_at if ended_at is not None else time.time(),
            exit_code=code,
            outcome=end.outcome,
            job_state=end.state,
            reason=end.reason,
            restarts=job.restarts + 1 if end.requeued else None,
        )
        if end.state in TERMINAL:
            release_memory_tier(job_dir(self.home, job.id))  # its keeper and shared memory go with it

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
            **without_own_setting(os.environ),  # the job's own code gets the user's environment
            **job_environment(spec, job.id, self.home, "local"),
            **price_environment(spec, {**os.environ, **job.env}),
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
            proc = self._start(argv, env, spec.workdir, log)
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
        self.running[job.id] = RunningAttempt(job, n, proc, log, placed=placed, started=started)
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

    def _start(self, argv: list[str], env: Mapping[str, str], workdir: str | None, log: IO[bytes]) -> AttemptProcess:
        """Fork the attempt from the warm server when it can (``warm.py``), else start a new interpreter.

        Either way it runs in a session of its own and gets SIGTERM when its starter dies.
        """
        warm = self._warm_server()
        if warm is not None and (warm.ready or warm.dead):  # still importing: this one starts cold, silently
            cwd = str(Path(workdir).resolve()) if workdir else os.getcwd()
            child = warm.spawn(argv, env=env, cwd=cwd, log=log, death_signal=signal.SIGTERM)
            if isinstance(child, WarmProcess):
                return child
            if warm_entry(argv) is not None and not self.warm_fallback_said:  # it could have run warm
                self.warm_fallback_said = True
                print(f"gpufleet scheduler: no warm start: {child}; such attempts start as new processes", flush=True)
        return subprocess.Popen(
            attempt_argv(argv, signal.SIGTERM),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir or None,
            env=env,
            start_new_session=True,
        )

    def prepare(self) -> None:
        """Start the warm server now, so that it imports while the first submit arrives; launches wait for
        it (up to ``WARM_WAIT_S``) rather than start a new interpreter that would take as long."""
        self.warm_hold = self._warm_server() is not None

    def _warm_starting(self) -> bool:
        """Whether the warm server is still importing, and young enough that waiting for it costs nothing."""
        warm = self.warm
        if not self.warm_hold or warm is None or warm.ready or warm.dead:
            return False
        warm.pump()
        return not (warm.ready or warm.dead) and time.monotonic() - self.warm_born < WARM_WAIT_S

    def _warm_server(self) -> WarmServer | None:
        """The warm server, started at the first launch unless ``GPUFLEET_WARM_START=0`` (``None``: none runs)."""
        if self.warm is None and not self.warm_cannot_start and warm_start_enabled(os.environ):
            try:
                self.warm = WarmServer.start(without_own_setting(os.environ))
                self.warm_born = time.monotonic()
            except OSError as err:
                print(f"gpufleet scheduler: no warm start: {err.strerror}; attempts start as new processes", flush=True)
                self.warm_cannot_start = True
                return None
            weakref.finalize(self, self.warm.close)
        if self.warm is not None:
            self.warm.pump()  # has it finished importing (or died) since?
            if self.warm.dead:
                self.warm.close()  # reaped; a later launch starts no other: the attempts start cold
        return self.warm

    # ---- placement and preemption ----------------------------------------------------------
    def _schedule(self) -> None:
        if self.drain is not None and self.drain.draining():
            return  # the node is about to be taken back: nothing new starts here
        if self._warm_starting():
            return  # a new interpreter would take as long as the server's imports: wait for it instead
        if self.fleet is None or not self.fleet.current():
            self.fleet = self.fleet_loader(self)
        if self.fleet is not None:
            self.fleet.tick()
            return
        used = sum(slots_of(r.job.spec) for r in self.running.values())
        free = self.slots - used
        for job_id in self.store.queued_ids():  # by priority, then age; each job read only when its turn comes
            if hold_file(self.home, job_id).exists():
                continue
            job = self.store.job(job_id)
            if job.state != JobState.QUEUED:  # a broken spec was just failed by the read
                continue
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
    """``python -m gpufleet.backends.local [--detach] GPUFLEET_HOME``: run the scheduler of a home."""
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


__all__ = [
    "FleetLoader",
    "FleetPolicy",
    "LocalScheduler",
    "RunningAttempt",
    "main",
    "no_fleet",
    "plug_fleet_policy",
    "plugged_fleet",
    "startable",
]
