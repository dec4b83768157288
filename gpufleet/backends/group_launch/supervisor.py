"""The rank supervisor: one attempt of N ranks that replaces a lost rank instead of ending the group.

``group_launch`` runs this instead of torchrun when the job's ``distributed.recovery`` is ``wait``
(``GPUFLEET_RECOVERY=wait``). torchrun (``--max-restarts=0``) can only end every rank when one is
lost; restarting them all (``--max-restarts``) would start new interpreters and lose every rank's
warm state. This starts the ranks itself, with the variables torchrun gives them, and keeps the
survivors' processes:

* **a rendezvous file per attempt** (``GPUFLEET_RDZV_FILE``, ``runtime.group.rendezvous_file``) holds
  the group's ``generation`` and the ``master_port`` where that generation meets. Each generation
  gets a new port: the store of the broken one may still be bound by a survivor.
* **a lost rank** (one killed by a signal: ``kill -9``, the OOM killer) is replaced: the generation
  goes up, a new port is published, a new process starts with the same ``RANK``. The survivors find
  their group broken, wait for the generation (``runtime.launch``) and call their entrypoint again;
  it restores the last step every rank committed. Once the new generation has met and restored
  (rank 0's ``group`` event names every current PID, its ``train_start`` follows), this appends
  ``group_reformed`` to the job's events, with the tier the restore used (``own``, ``peer``, ``disk``).
* **a warm replacement**: the replacement is forked from a warm rank server started with the ranks
  (``group_launch.warm_ranks``), which has imported torch already, and the new generation is
  published at once; a replacement started cold (the server refused, is still importing, or died)
  is waited for until it has imported torch (``runtime.group.ready_marker``). Either way a rank
  started for the current generation and not ready yet is starting, not stuck: it is never ended
  for its silence (the recovery timeout bounds it).
* **a stuck rank** (alive, silent) is found by the others: their collectives time out
  (``distributed.timeout_seconds``) and each leaves a reform request
  (``runtime.group.reform_request``). A rank still silent :data:`SILENCE_S` seconds after the first
  request is SIGKILLed, and replaced as a lost one.
* **the fall-back is today's requeue**: a group not re-formed within
  ``distributed.recovery_timeout_seconds`` of the loss (or a loss after a rank completed its
  session) ends every rank and exits 75, so the job is run again from its last checkpoint.

Under ``distributed.recovery: continue`` (``GPUFLEET_RECOVERY=continue``) the attempt is run by
:class:`~gpufleet.backends.group_launch.elastic.ElasticSupervisor` instead: each rank is a torchft
replica of its own, a lost one is replaced without a new generation, the survivors never stop
stepping, and the replacement heals from a peer (``group_launch.elastic``).

What ``group_launch`` does for torchrun holds here too: signals (SIGTERM, SIGINT, SIGUSR1) are
forwarded once to every rank, which saves and exits 75, and ranks still alive
``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds later are SIGKILLed; a rank that fails with its own error
(an exit status other than 0 and 75) fails the attempt with that status once the others are ended;
once every rank recorded a ``completed`` session the attempt is completed, whatever its processes do
in their teardown, and those alive the exit grace later are ended. Every rank runs in a process
group of its own (the scheduler's signal to the attempt's group reaches it once, from here) behind
the death-signal shim, so nothing outlives this process; a warm replacement runs in a session of its
own and dies with the warm rank server, which dies with this process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.backends.group_launch import FORWARDED, all_completed, exit_grace, exit_status
from gpufleet.backends.group_launch.warm_ranks import WarmRanks
from gpufleet.backends.local.warm import AttemptProcess, WarmProcess
from gpufleet.errors import GpufleetError
from gpufleet.jobs.deathsig import shim_argv
from gpufleet.jobs.events import EventKind, append_event
from gpufleet.jobs.protocol import (
    ENV_ATTEMPT,
    ENV_EVENTS,
    ENV_GENERATION,
    ENV_JOB_DIR,
    ENV_RDZV_FILE,
    ENV_RECOVERY,
    ENV_TORCHRUN_SHUTDOWN,
    REQUEUE_EXIT_CODE,
    exit_reason,
)
from gpufleet.numpy_cpu import without_own_setting
from gpufleet.runtime.group import (
    dist_timeout,
    lost_marker,
    rank_end_statuses,
    read_rendezvous,
    ready_marker,
    reform_request,
    rendezvous_file,
    write_rendezvous,
)
from gpufleet.runtime.launch import recovery_timeout

SILENCE_S = 10.0
"""Seconds a rank may stay silent after another found the group broken before it is taken for stuck
(at most the collective timeout): the survivors of one broken collective all notice within a step."""
TICK_S = 0.05


def free_port() -> int:
    """A TCP port free on this host now, for the next generation's store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


PER_RANK = ("RANK", "LOCAL_RANK", "ROLE_RANK", "MASTER_PORT", ENV_GENERATION)
"""Variables of :func:`rank_environment` that differ between the ranks, or between generations."""


def rank_environment(rank: int, nproc: int, port: int, generation: int, run_id: str, rdzv: Path) -> dict[str, str]:
    """What torchrun gives a rank of one node, plus the rendezvous file and the generation it joins."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "ROLE_WORLD_SIZE": str(nproc),
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        ENV_RDZV_FILE: str(rdzv),
        ENV_GENERATION: str(generation),
    }


def shared_environment(nproc: int, run_id: str, rdzv: Path) -> dict[str, str]:
    """What every rank of the attempt gets alike: the warm rank server starts with it (``WORLD_SIZE``...)."""
    every = rank_environment(0, nproc, 0, 0, run_id, rdzv)
    return {name: value for name, value in every.items() if name not in PER_RANK}


@dataclass(slots=True)
class Reform:
    """A re-forming in progress: since when (both clocks), which ranks were replaced."""

    since: float
    wall: float
    replaced: set[int] = field(default_factory=set)
    met: bool = False
    """Rank 0 reported the current generation's ranks (its ``group`` event): the next ``train_start`` ends it."""
    tier: str | None = None
    """Where the last ``restore`` since the loss read its state: ``own``, ``peer``, ``disk`` (``None``: nothing)."""


class RankSupervisor:
    """The ranks of one attempt on this node, each replaced in place when it is lost."""

    def __init__(self, nproc: int, argv: Sequence[str], *, job_dir: Path, events: Path | None, attempt: int) -> None:
        self.nproc, self.argv, self.job_dir, self.events, self.attempt = nproc, list(argv), job_dir, events, attempt
        self.rdzv = rendezvous_file(job_dir, attempt)
        self.run_id = uuid.uuid4().hex[:12]
        self.generation, self.port = 0, free_port()
        self.procs: dict[int, AttemptProcess] = {}
        self.warm = WarmRanks(None, "not started")
        """Forks replacement ranks from an interpreter that has imported torch (started with the ranks)."""
        self.recovery_s = recovery_timeout()
        self.silence_s = min(SILENCE_S, dist_timeout())
        self.reform: Reform | None = None
        self.asked_at: float | None = None
        self.stop_at: float | None = None
        """Set once the ranks are being ended (a signal, a failed rank): SIGKILL then."""
        self.failure: int | None = None
        self.completed_at: float | None = None
        self.unready: set[int] = set()
        """Ranks started for the current generation that are not ready yet (``ready_marker``): never silent."""
        self.cold: set[int] = set()
        """Those of :attr:`unready` started as new interpreters: the generation is published once they are ready."""
        self.ended: set[int] = set()
        """PIDs SIGKILLed for their silence, not reaped yet."""
        self._offset = 0

    # ---- the ranks -----------------------------------------------------------------------------
    def start(self) -> None:
        """Publish generation 0 and start every rank cold, and the warm rank server beside them."""
        write_rendezvous(self.rdzv, self.generation, self.port)
        self.warm = WarmRanks.start(
            self.argv, {**without_own_setting(os.environ), **shared_environment(self.nproc, self.run_id, self.rdzv)}
        )
        for rank in range(self.nproc):
            self.spawn(rank, warm=False)

    def environment(self, rank: int) -> dict[str, str]:
        """The whole environment ``rank`` starts with, for the current generation."""
        return {
            **without_own_setting(os.environ),
            **rank_environment(rank, self.nproc, self.port, self.generation, self.run_id, self.rdzv),
        }

    def spawn(self, rank: int, *, warm: bool = True) -> bool:
        """Start ``rank`` for the current generation, forked warm when asked and possible: whether it was."""
        env = self.environment(rank)
        if warm:
            child = self.warm.spawn(self.argv, env)
            if isinstance(child, WarmProcess):
                self.procs[rank] = child
                print(f"gpufleet: rank {rank} forked from the warm rank server (pid {child.pid})", file=sys.stderr)
                return True
            print(f"gpufleet: rank {rank} starts as a new process: {child}", file=sys.stderr, flush=True)
        self.procs[rank] = subprocess.Popen(shim_argv(self.argv, signal.SIGKILL, os.getpid()), env=env, process_group=0)
        return False

    def close(self) -> None:
        """After the attempt: end the warm rank server."""
        self.warm.close()

    def alive(self) -> list[int]:
        return [rank for rank, proc in self.procs.items() if proc.poll() is None]

    def send(self, ranks: Sequence[int], signum: int) -> None:
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.procs[rank].pid, signum)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """End the attempt: ``signum`` to every rank alive, SIGKILL to those left after the shut-down time."""
        if self.stop_at is None:
            raw = os.environ.get(ENV_TORCHRUN_SHUTDOWN, "")
            self.stop_at = time.monotonic() + (float(raw) if raw.strip().isdigit() else 30.0)
        self.send(self.alive(), signum)

    # ---- one look at the group ------------------------------------------------------------------
    def tick(self) -> int | None:
        """Act on what changed; the attempt's exit status once it is decided."""
        if self.stop_at is not None:
            if not self.alive():
                return self.status()
            if time.monotonic() >= self.stop_at:
                self.send(self.alive(), signal.SIGKILL)
            return None
        lost = self._reap()
        if self.stop_at is not None:
            return None
        if lost and self._finished_somewhere():
            return self.requeue(f"rank {', '.join(map(str, lost))} was lost after a rank had completed its session")
        if lost:
            self._replace(lost)
        self._publish()
        self._check_requests()
        if self.reform is not None:
            self._check_reformed()
            if self.reform is not None and time.monotonic() - self.reform.since > self.recovery_s:
                return self.requeue(f"the group did not re-form within {self.recovery_s:g} s")
        if not self.alive():
            return self.status()
        return self._check_completed()

    def _reap(self) -> list[int]:
        """Ranks lost since the last look; a rank's own failure starts ending the attempt."""
        lost: list[int] = []
        statuses = rank_end_statuses(self.job_dir, self.attempt, self.nproc)
        for rank, proc in self.procs.items():
            code = proc.poll()
            if code is None or code == 0 or statuses[rank] == "completed":
                continue
            if code < 0:
                lost.append(rank)
            elif self.stop_at is None:
                if code != REQUEUE_EXIT_CODE:
                    self.failure = code
                    print(f"gpufleet: rank {rank} {exit_reason(code)}: ending the group", file=sys.stderr, flush=True)
                self.stop()
        return [] if self.stop_at is not None else lost

    def _finished_somewhere(self) -> bool:
        return "completed" in rank_end_statuses(self.job_dir, self.attempt, self.nproc)

    def _replace(self, lost: Sequence[int]) -> None:
        """A new generation on a new port, and a new process for each lost rank."""
        now = time.monotonic()
        if self.reform is None:
            self.reform = Reform(since=now, wall=time.time())
        self.reform.replaced.update(lost)
        self.reform.met = False
        self._offset = self._offset or self._events_size()
        self.generation, self.port, self.asked_at = self.generation + 1, free_port(), None
        told = ", ".join(f"rank {r} {exit_reason(self.procs[r].returncode or 0)}" for r in lost)
        print(
            f"gpufleet: {told or 'every rank asked for a new group'}: re-forming it (generation {self.generation})",
            file=sys.stderr,
            flush=True,
        )
        self.unready, self.cold = set(lost), {rank for rank in lost if not self.spawn(rank)}
        self._publish()

    def _publish(self) -> None:
        """Let the survivors join the new generation once every rank started cold for it is ready to."""
        ready = {r for r in self.unready if ready_marker(self.job_dir, self.attempt, self.generation, r).exists()}
        self.unready -= ready
        self.cold &= self.unready
        if not self.cold and (read_rendezvous(self.rdzv) or (-1, 0))[0] != self.generation:
            write_rendezvous(self.rdzv, self.generation, self.port)

    def _check_requests(self) -> None:
        """Ranks found generation ``self.generation`` broken: re-form it, SIGKILLing a rank that stays silent."""
        asked = {
            r for r in range(self.nproc) if reform_request(self.job_dir, self.attempt, self.generation, r).exists()
        }
        if not asked:
            return
        now = time.monotonic()
        self.asked_at = self.asked_at if self.asked_at is not None else now
        quiet = [r for r in self.alive() if r not in asked]
        if not quiet:
            self._replace([])
            return
        silent = [r for r in quiet if r not in self.unready]  # a rank still starting is not stuck
        if not silent:  # judged silent only once ready: the recovery timeout bounds a start that never ends
            self.asked_at = None
            return
        fresh = [r for r in silent if self.procs[r].pid not in self.ended]
        if fresh and now - self.asked_at >= self.silence_s:
            print(f"gpufleet: rank {', '.join(map(str, fresh))} stopped answering: ending it", file=sys.stderr)
            self.ended.update(self.procs[r].pid for r in fresh)
            self.send(fresh, signal.SIGKILL)  # reaped as lost, and replaced, at the next look

    def _events_size(self) -> int:
        try:
            return self.events.stat().st_size if self.events is not None else 0
        except OSError:
            return 0

    def _new_events(self) -> list[dict[str, object]]:
        """Complete lines appended to the event log since the last look."""
        import json

        if self.events is None:
            return []
        try:
            with self.events.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        found = []
        for line in complete.splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("attempt") == self.attempt:
                    found.append(event)
        return found

    def _check_reformed(self) -> None:
        """The current generation met (a ``group`` event naming every current PID) and started training."""
        assert self.reform is not None
        pids = {rank: proc.pid for rank, proc in self.procs.items()}
        for event in self._new_events():
            ranks = event.get("ranks")
            if event.get("kind") == EventKind.GROUP and isinstance(ranks, list):
                self.reform.met = {r.get("rank"): r.get("pid") for r in ranks if isinstance(r, dict)} == pids
            elif event.get("kind") == EventKind.RESTORE:
                self.reform.tier = restore_tier(event)
            elif event.get("kind") == EventKind.TRAIN_START and self.reform.met:
                self._reformed(event.get("step"))
                return

    def _reformed(self, step: object) -> None:
        assert self.reform is not None
        seconds = time.monotonic() - self.reform.since
        append_event(
            str(self.events) if self.events is not None else None,
            self.attempt,
            EventKind.GROUP_REFORMED,
            generation=self.generation,
            replaced=sorted(self.reform.replaced),
            pids={str(rank): proc.pid for rank, proc in sorted(self.procs.items())},
            step=step,
            tier=self.reform.tier,
            seconds=round(seconds, 3),
        )
        print(
            f"gpufleet: the group re-formed in {seconds:.1f} s (generation {self.generation}, "
            f"restored from {self.reform.tier or 'nothing'})",
            file=sys.stderr,
        )
        lost_marker(self.job_dir, self.attempt).unlink(missing_ok=True)  # recovered: no reason to requeue
        self.reform, self._offset = None, 0

    def _check_completed(self) -> int | None:
        """Every rank completed its session: the attempt is completed, its processes get the exit grace."""
        if self.completed_at is None:
            if all_completed(self.job_dir, self.attempt, self.nproc):
                self.completed_at = time.monotonic()
            return None
        grace = exit_grace()
        if time.monotonic() - self.completed_at < grace:
            return None
        print(f"gpufleet: every rank completed its session, {grace:g} s later some had not exited; ending them")
        self.send(self.alive(), signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        return 0

    def requeue(self, why: str) -> int:
        """Today's answer to a lost rank: end every rank, exit 75 (run again from the last checkpoint)."""
        print(f"gpufleet: {why}: ending the group, the attempt is requeued", file=sys.stderr, flush=True)
        self.send(self.alive(), signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        return REQUEUE_EXIT_CODE

    def status(self) -> int:
        """The attempt's exit status once every rank has exited."""
        if self.failure is not None:
            return self.failure
        codes = [proc.returncode for proc in self.procs.values() if proc.returncode is not None]  # all exited
        code = 0 if all(c == 0 for c in codes) else 1
        return exit_status(
            code, self.events, self.attempt, world_size=self.nproc, rank_exits=[c for c in codes if c != 0]
        )


def restore_tier(event: dict[str, object]) -> str | None:
    """The tier a ``restore`` event read from: its ``tier``, else ``disk``; ``None`` when it restored nothing."""
    if event.get("step") is None:
        return None
    tier = event.get("tier")
    return str(tier) if tier else "disk"


def supervise(nproc: int, command: Sequence[str], *, no_python: bool = False) -> int:
    """Run one attempt of ``nproc`` ranks of ``command`` under a :class:`RankSupervisor`; its exit status."""
    events_raw, attempt_raw = os.environ.get(ENV_EVENTS), os.environ.get(ENV_ATTEMPT, "")
    events = Path(events_raw) if events_raw else None
    attempt = int(attempt_raw) if attempt_raw.strip().isdigit() else 0
    job_dir = Path(os.environ.get(ENV_JOB_DIR) or (events.parent if events is not None else tempfile.mkdtemp()))
    argv = list(command) if no_python else [sys.executable, "-u", *command]
    kind = RankSupervisor
    if os.environ.get(ENV_RECOVERY) == "continue":  # the survivors step on while a replacement heals
        from gpufleet.backends.group_launch.elastic import ElasticSupervisor

        kind = ElasticSupervisor
    sup = kind(nproc, argv, job_dir=job_dir, events=events, attempt=attempt)
    pending: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if not sup.procs:
            pending.append(signum)
        else:
            sup.stop(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        sup.start()
    except OSError as err:
        print(f"gpufleet.backends.group_launch: cannot start a rank: {err.strerror}", file=sys.stderr, flush=True)
        sup.send(sup.alive(), signal.SIGKILL)
        sup.close()
        return 127
    except GpufleetError as err:  # continue's Lighthouse without torchft: the extra to install, in one line
        print(f"gpufleet.backends.group_launch: {err}", file=sys.stderr, flush=True)
        sup.send(sup.alive(), signal.SIGKILL)
        sup.close()
        return err.exit_code
    for signum in pending:
        sup.stop(signum)
    try:
        while (status := sup.tick()) is None:
            time.sleep(TICK_S)
    finally:
        sup.close()
    return status


__all__ = [
    "PER_RANK",
    "SILENCE_S",
    "RankSupervisor",
    "free_port",
    "rank_environment",
    "restore_tier",
    "shared_environment",
    "supervise",
]
