"""The Ray backend: each job is a detached, named Ray actor that runs its attempts as subprocesses.

Why an actor per job and not a Ray task per attempt: the actor holds the job's resources
(``num_cpus``; ``num_gpus`` on clusters that have GPUs) across attempts, so a preempted attempt
is followed at once by the next one on the same reservation, and Ray's own fault tolerance
covers the loss of the process that supervises the job: when the actor dies (its node is lost),
Ray restarts it (``max_restarts``), the new actor records the open attempt as ``lost`` and starts
the next one, which restores the last checkpoint. The actor is detached, so it outlives the
``gpufleet submit`` that created it, and named ``gpufleet-job-<id>`` in the ``gpufleet``
namespace, so ``preempt`` and ``cancel`` find it from any process.

An attempt is the same process as on the other backends (``entry_argv`` with the
``job_environment`` contract and ``GPUFLEET_ATTEMPT``), logging to ``logs/attempt-<n>.log``.
Exit 75 (``REQUEUE_EXIT_CODE``) or a preemption starts the next attempt, up to ``max_restarts``;
0 completes the job; anything else fails it. On Linux the attempt gets ``PR_SET_PDEATHSIG``:
should its actor die, it is killed too, as it would be with its node, so two attempts never
train into one checkpoint directory.

State is pushed by the actor, pulled by the client: the actor is the only writer of
``jobs/<id>/ray-status.json`` (attempts with PIDs, times, exit codes and outcomes; temp file,
fsync, rename), and ``sync()`` turns that file and the runtime's ``events.jsonl`` into store
rows, so ``jobs``, ``show``, ``logs`` and ``cost`` work unchanged. ``$GPUFLEET_HOME`` must be on
a file system every Ray node shares. The backend job id is the Ray actor id.

The cluster: ``$GPUFLEET_RAY_ADDRESS``, else the address in ``$GPUFLEET_HOME/ray-address``, else
the development cluster's (``scripts/dev-ray up`` writes ``.dev/ray/address`` and its token).
``ray`` is imported only here and only when a cluster is needed (``pip install 'gpufleet[ray]'``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.backends.base import Backend, add_job_folder, ingest_events, register
from gpufleet.errors import UsageError
from gpufleet.paths import job_dir
from gpufleet.runtime.protocol import REQUEUE_EXIT_CODE, entry_argv, job_environment
from gpufleet.spec import JobSpec, parse_spec
from gpufleet.store import TERMINAL, Attempt, Job, Store

NAMESPACE = "gpufleet"
STATUS_FILE = "ray-status.json"
SCHEMA_VERSION = 1
CALL_TIMEOUT_S = 30.0
START_HINT = "start the development cluster with `scripts/dev-ray up`, or set GPUFLEET_RAY_ADDRESS to a running one"
REQUEUED = ("preempted", "requeued", "lost")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def actor_name(job_id: int) -> str:
    return f"gpufleet-job-{job_id}"


# ---- the status file: written by the job's actor only ---------------------------------------


class AttemptRecord(BaseModel):
    """One attempt as its actor saw it."""

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


def start_attempt(status: RunStatus, pid: int, node: str, now: float) -> RunStatus:
    record = AttemptRecord(n=len(status.attempts) + 1, pid=pid, node=node, started_at=now)
    return status.model_copy(update={"state": "running", "attempts": (*status.attempts, record)})


def _failure(code: int | None) -> str:
    if code is None:
        return "lost"
    if code == NOT_STARTED:
        return f"exit code {code}: the entrypoint could not be started (see the attempt log)"
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def end_attempt(status: RunStatus, code: int | None, stop: str | None, now: float, max_restarts: int) -> RunStatus:
    """Close the open attempt: the same outcomes and requeue rule as the local scheduler."""
    last = status.open_attempt()
    if last is None:
        return status
    if stop == "cancelled":
        outcome, state, reason = "cancelled", "cancelled", "cancelled by request"
    elif code == 0:
        outcome, state, reason = "completed", "completed", None
    elif stop in ("preempted", "lost") or code == REQUEUE_EXIT_CODE:
        outcome = stop or "requeued"
        state, reason = "queued", f"{outcome} at attempt {last.n}"
        if status.restarts >= max_restarts:
            state, reason = "failed", f"{outcome} after {status.restarts} restarts (max_restarts)"
    else:
        outcome, state, reason = "failed", "failed", _failure(code)
    restarts = status.restarts + 1 if state == "queued" else status.restarts
    ended = status.with_last(ended_at=now, exit_code=code, outcome=outcome)
    return ended.model_copy(update={"state": state, "reason": reason, "restarts": restarts})


# ---- the actor ---------------------------------------------------------------------------------

# Run by the attempt's own interpreter before it becomes the entrypoint: die with the parent.
_PDEATHSIG = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"  # PR_SET_PDEATHSIG
    "os.getppid() == int(sys.argv[1]) or os._exit(137)\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as err:\n"
    "    print(f'gpufleet: cannot start {sys.argv[2]!r}: {err.strerror}', file=sys.stderr, flush=True)\n"
    "    os._exit(127)\n"
)
NOT_STARTED = 127
"""The shim's exit status when the entrypoint cannot be executed (as a shell's)."""


def attempt_argv(argv: Sequence[str]) -> list[str]:
    """``argv``, behind a PR_SET_PDEATHSIG shim on Linux (elsewhere as it is)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-c", _PDEATHSIG, str(os.getpid()), *argv]


def _signal_group(pid: int | None, sig: int) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _current_actor_id() -> str | None:
    if "ray" not in sys.modules:
        return None
    import ray

    actor_id: str | None = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
    return actor_id


def exit_actor() -> None:
    """End the current actor on purpose (Ray does not restart it); nothing outside an actor."""
    if _current_actor_id() is None:
        return
    import ray

    with contextlib.suppress(SystemExit):
        ray.actor.exit_actor()  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class RunnerArgs:
    """What the actor needs; Ray hands the same values to every restart of it."""

    home: str
    job_id: int
    spec_json: str
    workdir: str


class JobRunner:
    """The actor body: runs the job's attempts in a thread; methods answer preempt and cancel."""

    def __init__(
        self, args: RunnerArgs, *, poll_s: float = 0.1, exit_hook: Callable[[], None] | None = None, start: bool = True
    ) -> None:
        self.home = Path(args.home)
        self.job_id = args.job_id
        self.spec: JobSpec = parse_spec(json.loads(args.spec_json), source=f"job {args.job_id}")
        self.workdir = args.workdir
        self.poll_s = poll_s
        self.exit_hook = exit_hook or exit_actor
        self.path = status_path(self.home, self.job_id)
        self.node = socket.gethostname()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._kill_at: float | None = None
        self._cancel = False
        status = read_status(self.path) or RunStatus(job_id=self.job_id)
        status = status.model_copy(
            update={"actor_id": _current_actor_id(), "actor_pid": os.getpid(), "node": self.node}
        )
        lost = status.open_attempt()
        if lost is not None:  # this actor is a restart: its predecessor died with an attempt running
            if lost.node == self.node:
                _signal_group(lost.pid, signal.SIGKILL)
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
            if self._proc is None or last is None or last.stop is not None:
                return None
            self._stop(self._proc, "preempted", grace)
            return last.n

    def cancel(self, grace: float | None = None) -> str:
        """Stop for good: the running attempt is stopped like a preemption but not followed by another."""
        with self._lock:
            last = self.status.open_attempt()
            if self._proc is None or last is None:
                self._cancel = True
                return "cancelled"
            if last.stop != "cancelled":
                self._stop(self._proc, "cancelled", grace)
            return "stopping"

    # ---- the attempt loop ------------------------------------------------------------------
    def _save(self) -> None:
        write_status(self.path, self.status)

    def _stop(self, proc: subprocess.Popen[bytes], why: Literal["preempted", "cancelled"], grace: float | None) -> None:
        """SIGTERM once; a cancel after a preemption only changes what follows the exit."""
        grace_s = grace if grace is not None else self.spec.checkpoint.grace_seconds
        last = self.status.open_attempt()
        first = last is not None and last.stop is None
        if first:
            self._kill_at = time.monotonic() + grace_s
            _signal_group(proc.pid, signal.SIGTERM)
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
                    started = self._launch()
                if started is not None:
                    self._finish(started, self._wait(started))
        except Exception as err:
            with self._lock:
                self.status = self.status.model_copy(update={"state": "failed", "reason": f"runner error: {err!r}"})
                self._save()
            raise
        finally:
            self.exit_hook()

    def _launch(self) -> tuple[subprocess.Popen[bytes], IO[bytes]] | None:
        n = len(self.status.attempts) + 1
        folder = job_dir(self.home, self.job_id)
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **job_environment(self.spec, self.job_id, self.home, "ray"),
            "GPUFLEET_ATTEMPT": str(n),
            "GPUFLEET_BACKEND_JOB_ID": self.status.actor_id or "",
        }
        argv = entry_argv(self.spec)
        cwd = self.spec.workdir or self.workdir or None
        log = (folder / "logs" / f"attempt-{n}.log").open("ab")
        try:
            proc = subprocess.Popen(
                attempt_argv(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        except OSError as err:
            log.close()
            reason = f"cannot start {argv[0]!r} in {cwd}: {err.strerror}"
            self.status = self.status.model_copy(update={"state": "failed", "reason": reason})
            self._save()
            return None
        self._proc, self._kill_at = proc, None
        self.status = start_attempt(self.status, proc.pid, self.node, time.time())
        self._save()
        return proc, log

    def _wait(self, started: tuple[subprocess.Popen[bytes], IO[bytes]]) -> int:
        proc = started[0]
        while (code := proc.poll()) is None:
            with self._lock:
                if self._kill_at is not None and time.monotonic() >= self._kill_at:
                    _signal_group(proc.pid, signal.SIGKILL)
                    self._kill_at = None
                    self.status = self.status.with_last(kill_at=time.time())
                    self._save()
            time.sleep(self.poll_s)
        return code

    def _finish(self, started: tuple[subprocess.Popen[bytes], IO[bytes]], code: int) -> None:
        proc, log = started
        with self._lock:
            _signal_group(proc.pid, signal.SIGKILL)  # leave no stray children behind
            log.close()
            last = self.status.open_attempt()
            stop = last.stop if last is not None else None
            self.status = end_attempt(self.status, code, stop, time.time(), self.spec.max_restarts)
            self._proc, self._kill_at = None, None
            self._save()


# ---- from the status file to the store (pure) --------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreEvent:
    kind: str
    attempt: int | None
    ts: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What one sync writes: attempts to upsert, backend events to add, and the job's new state."""

    attempts: tuple[Attempt, ...]
    events: tuple[StoreEvent, ...]
    state: str
    reason: str | None
    restarts: int


def _as_attempt(job_id: int, rec: AttemptRecord) -> Attempt:
    return Attempt(
        job_id=job_id,
        n=rec.n,
        state="ended" if rec.ended_at is not None else ("stopping" if rec.sigterm_at else "running"),
        pid=rec.pid,
        started_at=rec.started_at,
        ended_at=rec.ended_at,
        exit_code=rec.exit_code,
        outcome=rec.outcome,
        sigterm_at=rec.sigterm_at,
        kill_at=rec.kill_at,
    )


def plan_sync(job: Job, stored: Sequence[Attempt], status: RunStatus | None, *, gone: bool, now: float) -> SyncPlan:
    """Compare the store with the actor's status file: what changed since the last sync.

    Events are derived from the difference, so a second sync of the same file adds none. When
    the actor is ``gone`` (Ray gave up restarting it, or the cluster was replaced) and its file
    does not say the job ended, the open attempt is ``lost`` and the job ``failed``.
    """
    status = status or RunStatus(job_id=job.id)
    if gone and status.state not in TERMINAL:
        why = f"Ray actor {actor_name(job.id)} is gone (its cluster stopped or it ran out of restarts); resubmit"
        if status.open_attempt() is not None:
            status = status.with_last(ended_at=now, outcome="lost")
        status = status.model_copy(update={"state": "failed", "reason": why})
    before = {a.n: a for a in stored}
    attempts, events = [], []
    for rec in status.attempts:
        old = before.get(rec.n)
        new = _as_attempt(job.id, rec)
        if old != new:
            attempts.append(new)
        if old is None:
            events.append(StoreEvent("attempt_start", rec.n, rec.started_at, {"pid": rec.pid, "node": rec.node}))
        if rec.sigterm_at is not None and (old is None or old.sigterm_at is None):
            events.append(StoreEvent("sigterm", rec.n, rec.sigterm_at, {"reason": rec.stop, "grace": rec.grace}))
        if rec.kill_at is not None and (old is None or old.kill_at is None):
            events.append(StoreEvent("sigkill", rec.n, rec.kill_at, {"reason": "grace time expired"}))
        if rec.ended_at is not None and (old is None or old.ended_at is None):
            data = {"exit_code": rec.exit_code, "outcome": rec.outcome}
            events.append(StoreEvent("attempt_end", rec.n, rec.ended_at, data))
            if rec.outcome in REQUEUED and (rec.n < len(status.attempts) or status.state in ("queued", "running")):
                events.append(StoreEvent("requeued", rec.n, rec.ended_at))
    if status.state in TERMINAL and job.state not in TERMINAL:
        last = status.attempts[-1] if status.attempts else None
        ts = last.ended_at if last is not None and last.ended_at is not None else now
        events.append(StoreEvent(status.state, last.n if last else None, ts, {"reason": status.reason}))
    return SyncPlan(tuple(attempts), tuple(events), status.state, status.reason, status.restarts)


# ---- the cluster ---------------------------------------------------------------------------------


def dev_ray_dir() -> Path:
    """Where ``scripts/dev-ray`` keeps its cluster (``$GPUFLEET_RAY_DIR``, default ``<repo>/.dev/ray``)."""
    raw = os.environ.get("GPUFLEET_RAY_DIR")
    return Path(raw) if raw else Path(__file__).resolve().parents[2] / ".dev" / "ray"


@dataclass(frozen=True, slots=True)
class ClusterAddress:
    address: str
    source: str
    """Where the address came from (for error messages)."""
    token: Path | None = None
    """The cluster's auth token file, when its address file has one beside it."""


def find_cluster(home: Path | None, env: Mapping[str, str] | None = None) -> ClusterAddress | None:
    """``$GPUFLEET_RAY_ADDRESS``, else ``$GPUFLEET_HOME/ray-address``, else the dev cluster's; ``None`` if none."""
    env = os.environ if env is None else env
    if env.get("GPUFLEET_RAY_ADDRESS", "").strip():
        return ClusterAddress(env["GPUFLEET_RAY_ADDRESS"].strip(), "GPUFLEET_RAY_ADDRESS")
    raw = env.get("GPUFLEET_RAY_DIR")
    dev = Path(raw) if raw else dev_ray_dir()
    for path in ([home / "ray-address"] if home is not None else []) + [dev / "address"]:
        with contextlib.suppress(OSError):
            address = path.read_text(encoding="utf-8").strip()
            if address:
                token = path.parent / "auth_token"
                return ClusterAddress(address, str(path), token if token.is_file() else None)
    return None


def split_address(address: str) -> tuple[str, int]:
    if "://" in address:
        raise UsageError(f"Ray address {address!r}: give the cluster's GCS address host:port (Ray Client is not used)")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"Ray address {address!r} is not host:port (the cluster's GCS address); {START_HINT}")
    return host.strip("[]"), int(port)


def check_reachable(where: ClusterAddress, timeout: float = 3.0) -> None:
    """A TCP connect first: ``ray.init`` would retry an absent cluster for a minute."""
    host, port = split_address(where.address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as err:
        raise UsageError(
            f"no Ray cluster answers at {where.address} (from {where.source}: {err.strerror or err}); {START_HINT}"
        ) from None


def cluster_problem(home: Path | None = None) -> str | None:
    """``None`` when a Ray cluster answers at the configured address, else why not."""
    where = find_cluster(home)
    if where is None:
        return f"no GPUFLEET_RAY_ADDRESS and no {dev_ray_dir() / 'address'}"
    try:
        check_reachable(where)
    except UsageError as err:
        return str(err)
    return None


class Cluster(Protocol):
    """What the backend needs from Ray (a fake in unit tests)."""

    address: str

    def resources(self) -> dict[str, float]: ...

    def start(self, args: RunnerArgs, options: dict[str, Any]) -> str:
        """Create the job's actor; return its id."""

    def call(self, job_id: int, method: str, *args: Any, timeout: float) -> Any:
        """Call an actor method; ``LookupError`` with no live actor, ``TimeoutError`` if it does not answer."""

    def kill(self, job_id: int) -> None: ...

    def alive(self, job_id: int) -> bool: ...


def actor_options(spec: JobSpec, resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray actor options for ``spec`` (name and namespace aside); GPUs only on clusters that have them.

    A job that asks for more than the whole cluster has would wait forever: refused here instead.
    """
    cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    if spec.resources.cpus > cpus:
        raise UsageError(
            f"resources.cpus={spec.resources.cpus} exceeds the Ray cluster's {cpus:g} CPUs: lower it or add nodes"
        )
    use_gpus = spec.resources.gpus if gpus > 0 else 0
    if use_gpus > gpus:
        raise UsageError(f"resources.gpus={use_gpus} exceeds the Ray cluster's {gpus:g} GPUs: lower it or add nodes")
    return {
        "lifetime": "detached",
        "num_cpus": spec.resources.cpus,
        "num_gpus": use_gpus,
        "max_restarts": spec.max_restarts,
        "max_task_retries": 0,
    }


def _prepare_client_env(where: ClusterAddress) -> None:
    """Ray reads its client settings from the environment: set them before it is imported."""
    if where.token is not None:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(where.token)
        os.environ.pop("RAY_AUTH_TOKEN", None)
    if split_address(where.address)[0] in LOOPBACK:
        # Ray rewrites 127.0.0.1 to the machine's address unless clusters are off-by-default,
        # which is how a loopback-only cluster (scripts/dev-ray) is started and must be joined.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        if "ray" in sys.modules:
            from ray._private import ray_constants

            ray_constants.ENABLE_RAY_CLUSTER = False


class RayCluster:
    """The real thing: a driver connection to a running Ray cluster."""

    def __init__(self, address: str) -> None:
        self.address = address

    @classmethod
    def connect(cls, home: Path) -> RayCluster:
        where = find_cluster(home)
        if where is None:
            raise UsageError(f"no Ray cluster configured; {START_HINT}")
        check_reachable(where)
        _prepare_client_env(where)
        import logging

        import ray

        if ray.is_initialized():
            if ray.get_runtime_context().gcs_address == where.address:
                return cls(where.address)
            ray.shutdown()
        try:
            ray.init(
                address=where.address,
                namespace=NAMESPACE,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
        except (ConnectionError, RuntimeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UsageError(f"cannot join the Ray cluster at {where.address} ({first}); {START_HINT}") from None
        return cls(where.address)

    def resources(self) -> dict[str, float]:
        import ray

        totals: dict[str, Any] = ray.cluster_resources()  # type: ignore[no-untyped-call]
        return {k: float(v) for k, v in totals.items()}

    def start(self, args: RunnerArgs, options: dict[str, Any]) -> str:
        import ray

        try:
            actor = ray.remote(JobRunner).options(**options, name=actor_name(args.job_id), namespace=NAMESPACE)
            handle: Any = actor.remote(args)
        except ValueError as err:  # the name is taken: a job of another state.db on the same cluster
            raise UsageError(f"cannot create Ray actor {actor_name(args.job_id)}: {err}") from None
        return str(handle._actor_id.hex())

    def _handle(self, job_id: int) -> Any:
        import ray

        try:
            return ray.get_actor(actor_name(job_id), namespace=NAMESPACE)
        except ValueError:
            raise LookupError(actor_name(job_id)) from None

    def call(self, job_id: int, method: str, *args: Any, timeout: float) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        ref = getattr(self._handle(job_id), method).remote(*args)
        try:
            return ray.get(ref, timeout=timeout)
        except GetTimeoutError:
            raise TimeoutError(f"{actor_name(job_id)}.{method}") from None
        except RayActorError:
            raise LookupError(actor_name(job_id)) from None

    def kill(self, job_id: int) -> None:
        import ray

        with contextlib.suppress(LookupError):
            ray.kill(self._handle(job_id), no_restart=True)

    def alive(self, job_id: int) -> bool:
        try:
            self._handle(job_id)
        except LookupError:
            return False
        return True


# ---- the backend ---------------------------------------------------------------------------------


@register("ray")
class RayBackend(Backend):
    """Submit jobs as Ray actors; attempts and states come back through ``sync``."""

    def __init__(self, home: Path, cluster: Cluster | None = None) -> None:
        super().__init__(home)
        self.store = Store(home / "state.db")
        self._cluster = cluster

    def cluster(self) -> Cluster:
        """The connection, made on first use (``UsageError`` when no cluster answers)."""
        if self._cluster is None:
            self._cluster = RayCluster.connect(self.home)
        return self._cluster

    def submit(self, spec: JobSpec, env: dict[str, str] | None = None) -> int:
        cluster = self.cluster()
        options = actor_options(spec, cluster.resources())
        if spec.env or env:
            spec = spec.copy_with(env={**spec.env, **(env or {})})
        job_id, folder = add_job_folder(self.store, self.home, spec, self.name, env)
        args = RunnerArgs(str(self.home), job_id, spec.model_dump_json(), spec.workdir or os.getcwd())
        try:
            ref = cluster.start(args, options)
        except UsageError:
            self.store.delete_job(job_id)  # refused: nothing of it stays behind
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self.store.set_backend_ref(job_id, ref)
        self.store.add_event(job_id, "submitted", actor=actor_name(job_id), ray_actor_id=ref, address=cluster.address)
        return job_id

    def _active(self, job_id: int) -> Job:
        """The job, refreshed from its status file; ``UsageError`` when it has ended."""
        job = self.store.job(job_id)
        if job.backend != self.name:
            raise UsageError(f"job {job_id} is not a Ray job (backend {job.backend})")
        if job.state not in TERMINAL:
            self._apply(job, gone=False)
            job = self.store.job(job_id)
        if job.state in TERMINAL:
            raise UsageError(f"job {job_id} is already {job.state}")
        return job

    def preempt(self, job_id: int, grace: float | None = None) -> None:
        """The actor SIGTERMs the attempt, SIGKILLs it after ``grace``, and starts the next one."""
        if grace is not None and grace <= 0:
            raise UsageError(f"--grace {grace} is invalid: give a positive number of seconds")
        job = self._active(job_id)
        if job.state != "running":
            raise UsageError(f"job {job_id} is {job.state}, not running: only a running job can be preempted")
        try:
            attempt = self.cluster().call(job_id, "preempt", grace, timeout=CALL_TIMEOUT_S)
        except LookupError:
            raise UsageError(f"job {job_id} has no live Ray actor {actor_name(job_id)}; see `gpufleet show`") from None
        except TimeoutError:
            raise UsageError(
                f"job {job_id}'s actor did not answer in {CALL_TIMEOUT_S:g}s (waiting for resources or restarting); "
                "try again"
            ) from None
        if attempt is None:
            raise UsageError(f"job {job_id} has no running attempt: only a running job can be preempted")

    def cancel(self, job_id: int) -> None:
        """A started job stops like a preemption but for good; a queued one's actor is removed."""
        job = self._active(job_id)
        cluster = self.cluster()
        started = status_path(self.home, job_id).exists()
        if started:
            with contextlib.suppress(LookupError, TimeoutError):
                cluster.call(job_id, "cancel", None, timeout=CALL_TIMEOUT_S)
                return
        cluster.kill(job_id)
        now = time.time()
        for attempt in self.store.attempts(job_id):
            if attempt.ended_at is None:
                self.store.update_attempt(job_id, attempt.n, state="ended", ended_at=now, outcome="cancelled")
        reason = "cancelled while queued" if not started else "cancelled; its Ray actor did not answer"
        self.store.set_job_state(job.id, "cancelled", reason=reason)
        self.store.add_event(job.id, "cancelled", reason=reason)

    # ---- following ---------------------------------------------------------------------------
    def sync(self) -> None:
        """Ingest every active Ray job's status file and events; jobs whose actor is gone fail.

        The files are read even when the cluster does not answer (the ``UsageError`` is raised
        after), so ``gpufleet jobs`` shows what the actors last wrote.
        """
        jobs = [j for j in self.store.jobs() if j.backend == self.name and j.state not in TERMINAL]
        if not jobs:
            return
        cluster: Cluster | None = None
        problem: UsageError | None = None
        try:
            cluster = self.cluster()
        except UsageError as err:
            problem = err
        for job in jobs:
            gone = cluster is not None and not cluster.alive(job.id)  # asked before the file is read
            self._apply(job, gone=gone)
        if problem is not None:
            raise problem

    def _apply(self, job: Job, *, gone: bool) -> None:
        ingest_events(self.store, self.home, job)
        status = read_status(status_path(self.home, job.id))
        plan = plan_sync(job, self.store.attempts(job.id), status, gone=gone, now=time.time())
        for attempt in plan.attempts:
            self.store.upsert_attempt(attempt)
        for ev in plan.events:
            self.store.add_event(job.id, ev.kind, attempt=ev.attempt, ts=ev.ts, **ev.data)
        if (plan.state, plan.restarts) != (job.state, job.restarts) or plan.reason not in (None, job.reason):
            self.store.set_job_state(job.id, plan.state, reason=plan.reason, restarts=plan.restarts)
