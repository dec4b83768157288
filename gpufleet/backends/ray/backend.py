"""The Ray backend: each job is a detached, named Ray actor that runs its attempts as subprocesses.

Why an actor per job and not a Ray task per attempt: the actor holds the job's resources
(``num_cpus``; ``num_gpus`` on clusters that have GPUs) across attempts, so a preempted attempt
is followed at once by the next one on the same reservation, and Ray's own fault tolerance
covers the loss of the process that supervises the job: when the actor dies (its node is lost),
Ray restarts it (``max_restarts``), the new actor records the open attempt as ``lost`` and starts
the next one, which restores the last checkpoint. The actor is detached, so it outlives the
``gpufleet submit`` that created it, and named ``gpufleet-job-<id>`` in the ``gpufleet``
namespace, so ``preempt`` and ``cancel`` find it from any process.

A job of more than one rank (``distributed``: ``resources.gpus`` ranks on one node, started by
gpufleet under the default ``launcher: torchrun``) runs on Ray's own machinery: a placement group
of one bundle per rank (:func:`placement_bundles`: the rank's share of ``resources.cpus``, and one
GPU on clusters that have GPUs), strategy ``PACK``, named ``gpufleet-job-<id>`` and held across
attempts the way a one-process job's actor holds its resources. The actor then asks for nothing
itself (it only supervises), so no CPU is reserved twice, and it is not in the group: it removes
the group when the job ends, which would end it too. Each attempt starts one rank actor per bundle
and runs the ranks as torchrun would (see :mod:`~gpufleet.backends.ray.ranks`). Jobs over several
nodes are refused (``MULTI_NODE``).

This module is the client side: finding and joining the cluster, :class:`RayBackend` (submit,
preempt, cancel, sync) and :func:`plan_sync`. The actor's side, what runs in the Ray workers (the
attempt loop, the ``PR_SET_PDEATHSIG`` shim, the status file), is
:mod:`gpufleet.backends.ray.runner`, and the ranks of an attempt :mod:`gpufleet.backends.ray.ranks`;
this module imports them, never the reverse.

State is pushed by the actor, pulled by the client: the actor is the only writer of
``jobs/<id>/ray-status.json`` (attempts with PIDs, times, exit codes and outcomes; temp file,
fsync, rename), and ``sync()`` turns that file and the runtime's ``events.jsonl`` into store
rows, so ``jobs``, ``show``, ``logs`` and ``cost`` work unchanged. ``$GPUFLEET_HOME`` must be on
a file system every Ray node shares. The backend job id is the Ray actor id.

The cluster: ``$GPUFLEET_RAY_ADDRESS``, else the address in ``$GPUFLEET_HOME/ray-address``, else
the development cluster's (``scripts/dev-ray up`` writes ``.dev/ray/address`` and its token).
``ray`` is imported only when a cluster is needed (``pip install 'gpufleet[ray]'``): here to join
it, in :mod:`~gpufleet.backends.ray.runner` and :mod:`~gpufleet.backends.ray.ranks` only where it is
already loaded (inside the actors).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpufleet.backends import lifecycle
from gpufleet.backends.base import Backend, Feature, ingest_events, register
from gpufleet.backends.ray.runner import (
    AttemptRecord,
    JobRunner,
    RunnerArgs,
    RunStatus,
    placement_name,
    read_status,
    status_path,
)
from gpufleet.errors import Conflict, ServiceUnavailable, Timeout, UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.protocol import threads_per_rank
from gpufleet.jobs.store import TERMINAL, Attempt, Job, Outcome, SyncPlan
from gpufleet.paths import dev_services_dir
from gpufleet.spec import JobSpec

NAMESPACE = "gpufleet"
CALL_TIMEOUT_S = 30.0
PLACEMENT_STRATEGY = "PACK"
"""A multi-rank job's bundles on as few nodes as fit; ``STRICT_PACK`` would wait forever on a cluster
whose nodes are each too small for the whole job, though it has room for it."""
START_HINT = "start the development cluster with `scripts/dev-ray up`, or set GPUFLEET_RAY_ADDRESS to a running one"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def actor_name(job_id: int) -> str:
    return f"gpufleet-job-{job_id}"


# ---- from the status file to the store (pure) --------------------------------------------------


def _as_attempt(job_id: int, rec: AttemptRecord) -> Attempt:
    return Attempt(
        job_id=job_id,
        n=rec.n,
        state="ended" if rec.ended_at is not None else ("stopping" if rec.sigterm_at else "running"),
        pid=rec.pid,
        started_at=rec.started_at,
        ended_at=rec.ended_at,
        exit_code=rec.exit_code,
        outcome=None if rec.outcome is None else Outcome(rec.outcome),
        sigterm_at=rec.sigterm_at,
        kill_at=rec.kill_at,
    )


def plan_sync(job: Job, stored: Sequence[Attempt], status: RunStatus | None, *, gone: bool, now: float) -> SyncPlan:
    """Compare the store with the actor's status file: what changed since the last sync.

    When the actor is ``gone`` (Ray gave up restarting it, or the cluster was replaced) and its
    file does not say the job ended, the open attempt is ``lost`` and the job ``failed``.
    """
    status = status or RunStatus(job_id=job.id)
    if gone and status.state not in TERMINAL:
        why = f"Ray actor {actor_name(job.id)} is gone (its cluster stopped or it ran out of restarts); resubmit"
        if status.open_attempt() is not None:
            status = status.with_last(ended_at=now, outcome="lost")
        status = status.model_copy(update={"state": "failed", "reason": why})
    details: dict[tuple[int, str], dict[str, Any]] = {}
    # The actor runs every attempt from the spec it was created with, which is the stored one (Ray jobs
    # are not resized): each attempt's GPUs and world size, as the ledger prices them.
    size = {"gpus": job.spec.total_gpus, "world_size": job.spec.world_size}
    for rec in status.attempts:
        details[(rec.n, EventKind.ATTEMPT_START)] = {"node": rec.node, **size}
        if rec.ranks:
            details[(rec.n, EventKind.ATTEMPT_START)]["ranks"] = [r.model_dump() for r in rec.ranks]
        details[(rec.n, EventKind.SIGTERM)] = {"reason": rec.stop, "grace": rec.grace}
    return lifecycle.plan_sync(
        job,
        stored,
        [_as_attempt(job.id, rec) for rec in status.attempts],
        state=status.state,
        reason=status.reason,
        restarts=status.restarts,
        now=now,
        details=details,
    )


# ---- the cluster ---------------------------------------------------------------------------------


def dev_ray_dir() -> Path:
    """Where ``scripts/dev-ray`` keeps its cluster (``$GPUFLEET_RAY_DIR``, default ``<repo>/.dev/ray``)."""
    raw = os.environ.get("GPUFLEET_RAY_DIR")
    return Path(raw) if raw else dev_services_dir("ray")


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
        raise ServiceUnavailable(
            f"no Ray cluster answers at {where.address} (from {where.source}: {err.strerror or err}); {START_HINT}"
        ) from None


def cluster_problem(home: Path | None = None) -> str | None:
    """``None`` when a Ray cluster answers at the configured address, else why not."""
    where = find_cluster(home)
    if where is None:
        return f"no GPUFLEET_RAY_ADDRESS and no {dev_ray_dir() / 'address'}"
    try:
        check_reachable(where)
    except (UsageError, ServiceUnavailable) as err:
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

    def kill(self, job_id: int) -> None:
        """End the job's actor for good and give back its placement group, if it has them."""

    def alive(self, job_id: int) -> bool: ...


def placement_bundles(spec: JobSpec, resources: Mapping[str, float]) -> tuple[dict[str, float], ...]:
    """One bundle per rank of a multi-rank job (none for one process): the placement group it holds.

    A rank gets its node's ``resources.cpus`` shared by the node's ranks (``threads_per_rank``, the
    threads it runs), and one GPU where the cluster has GPUs, as a one-process job asks for its GPUs.
    Under ``launcher: script`` the command starts its own ranks: it runs as one process holding the
    node's resources, as on the local backend.
    """
    if spec.world_size <= 1 or spec.distributed is None or spec.distributed.launcher != "torchrun":
        return ()
    bundle = {"CPU": float(threads_per_rank(spec))}
    if resources.get("GPU", 0.0) > 0:
        bundle["GPU"] = 1.0
    return tuple(dict(bundle) for _ in range(spec.world_size))


def actor_options(spec: JobSpec, resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray actor options for ``spec`` (name and namespace aside); GPUs only on clusters that have them.

    A job that asks for more than the whole cluster has would wait forever: refused here instead.
    A multi-rank job's actor asks for nothing: its ranks' bundles hold the job's resources.
    """
    cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    options: dict[str, Any] = {"lifetime": "detached", "max_restarts": spec.max_restarts, "max_task_retries": 0}
    bundles = placement_bundles(spec, resources)
    if bundles:
        want_cpus = sum(b["CPU"] for b in bundles)
        if want_cpus > cpus:
            raise UsageError(
                f"{len(bundles)} ranks x {threads_per_rank(spec)} CPUs (resources.cpus={spec.resources.cpus} per node) "
                f"exceed the Ray cluster's {cpus:g} CPUs: lower resources.cpus or resources.gpus, or add nodes"
            )
        if len(bundles) > gpus > 0:
            raise UsageError(
                f"{len(bundles)} ranks need one GPU each, more than the Ray cluster's {gpus:g} GPUs: "
                "lower resources.gpus or add nodes"
            )
        return {**options, "num_cpus": 0, "num_gpus": 0}
    if spec.resources.cpus > cpus:
        raise UsageError(
            f"resources.cpus={spec.resources.cpus} exceeds the Ray cluster's {cpus:g} CPUs: lower it or add nodes"
        )
    use_gpus = spec.resources.gpus if gpus > 0 else 0
    if use_gpus > gpus:
        raise UsageError(f"resources.gpus={use_gpus} exceeds the Ray cluster's {gpus:g} GPUs: lower it or add nodes")
    return {**options, "num_cpus": spec.resources.cpus, "num_gpus": use_gpus}


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
            raise ServiceUnavailable(f"no Ray cluster configured; {START_HINT}")
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
            raise ServiceUnavailable(
                f"cannot join the Ray cluster at {where.address} ({first}); {START_HINT}"
            ) from None
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
        from ray.util.placement_group import get_placement_group, remove_placement_group

        with contextlib.suppress(LookupError):
            ray.kill(self._handle(job_id), no_restart=True)
        with contextlib.suppress(ValueError):  # a multi-rank job's, which the actor removes when it ends
            remove_placement_group(get_placement_group(placement_name(job_id)))

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

    features = frozenset({Feature.PREEMPT_GRACE, Feature.MULTI_RANK})

    def __init__(self, home: Path, cluster: Cluster | None = None) -> None:
        super().__init__(home)
        self._cluster = cluster

    def cluster(self) -> Cluster:
        """The connection, made on first use (``UsageError`` when no cluster answers)."""
        if self._cluster is None:
            self._cluster = RayCluster.connect(self.home)
        return self._cluster

    def _admit(self, spec: JobSpec, env: dict[str, str] | None) -> JobSpec:
        actor_options(spec, self.cluster().resources())  # fits the cluster, before anything is written
        return spec.copy_with(env={**spec.env, **(env or {})}) if spec.env or env else spec

    def _start(self, job_id: int, folder: Path, spec: JobSpec) -> None:
        cluster = self.cluster()
        resources = cluster.resources()
        args = RunnerArgs(
            str(self.home),
            job_id,
            spec.model_dump_json(),
            spec.workdir or os.getcwd(),
            bundles=placement_bundles(spec, resources),
            strategy=PLACEMENT_STRATEGY,
        )
        ref = cluster.start(args, actor_options(spec, resources))
        self.store.set_backend_ref(job_id, ref)
        self.store.add_event(
            job_id, EventKind.SUBMITTED, actor=actor_name(job_id), ray_actor_id=ref, address=cluster.address
        )

    def _refresh(self, job: Job) -> Job:
        self._apply(job, gone=False)  # the actor's status file, not the last one stored
        return self.store.job(job.id)

    def _preempt(self, job: Job, grace: float | None) -> None:
        """The actor SIGTERMs the attempt, SIGKILLs it after ``grace``, and starts the next one."""
        job_id = job.id
        try:
            attempt = self.cluster().call(job_id, "preempt", grace, timeout=CALL_TIMEOUT_S)
        except LookupError:
            raise Conflict(f"job {job_id} has no live Ray actor {actor_name(job_id)}; see `gpufleet show`") from None
        except TimeoutError:
            raise Timeout(
                f"job {job_id}'s actor did not answer in {CALL_TIMEOUT_S:g}s (waiting for resources or restarting); "
                "try again"
            ) from None
        if attempt is None:
            raise Conflict(f"job {job_id} has no running attempt: only a running job can be preempted")

    def _cancel(self, job: Job) -> None:
        """A started job stops like a preemption but for good; a queued one's actor is removed."""
        job_id = job.id
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
        self.store.add_event(job.id, EventKind.CANCELLED, reason=reason)

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
        problem: UsageError | ServiceUnavailable | None = None
        try:
            cluster = self.cluster()
        except (UsageError, ServiceUnavailable) as err:
            problem = err
        for job in jobs:
            gone = cluster is not None and not cluster.alive(job.id)  # asked before the file is read
            if cluster is not None and gone and job.spec.world_size > 1:
                cluster.kill(job.id)  # an actor out of restarts leaves its placement group behind
            self._apply(job, gone=gone)
        if problem is not None:
            raise problem

    def _apply(self, job: Job, *, gone: bool) -> None:
        ingest_events(self.store, self.home, job)
        status = read_status(status_path(self.home, job.id))
        self.store.apply_sync(job, plan_sync(job, self.store.attempts(job.id), status, gone=gone, now=time.time()))


__all__ = [
    "CALL_TIMEOUT_S",
    "LOOPBACK",
    "NAMESPACE",
    "PLACEMENT_STRATEGY",
    "START_HINT",
    "Cluster",
    "ClusterAddress",
    "RayBackend",
    "RayCluster",
    "actor_name",
    "actor_options",
    "check_reachable",
    "cluster_problem",
    "dev_ray_dir",
    "find_cluster",
    "placement_bundles",
    "plan_sync",
    "split_address",
]
