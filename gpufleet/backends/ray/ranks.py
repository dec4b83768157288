"""The ranks of one multi-rank attempt on the Ray backend: where they run, what they are told, how they end.

A job of more than one rank (``launcher: torchrun``) runs its ranks on Ray's own machinery, not
under torchrun: the job's placement group (:class:`RayPlacement`: ``gpufleet-job-<id>``, detached,
one bundle per rank, reserved by the job's actor on its first start and found by name on a
restart) holds the job's CPUs and GPUs across attempts, and the job's actor itself asks for none,
so nothing is reserved twice. Each attempt starts one :class:`RankProcess` actor per bundle; each
runs ``rank_argv`` as a subprocess behind the ``PR_SET_PDEATHSIG`` shim (``lifecycle.attempt_argv``),
so it dies with its actor, with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` (rank 0's node) and ``MASTER_PORT`` (a free port found there) set
(:func:`rank_order`, :func:`rank_environments`), so ``runtime.group`` initialises
``torch.distributed`` as it does under torchrun; every rank appends to the attempt's log,
unprefixed, as torchrun's ranks do on the local backend. :class:`RankGroup` polls and signals the
ranks together: a preemption reaches every rank once, a rank that fails makes the others stop (as
torchrun's agent does), and the attempt's exit status is :func:`group_exit` over the ranks, so a
requeue is recognised exactly as on the local backend. The rank actors are owned by the job's
actor: Ray ends them when it dies, and their bundles are not free for the next attempt's ranks
until they are gone. The job's actor removes the placement group when the job ends.

The job's actor (:class:`~gpufleet.backends.ray.runner.JobRunner`) sees the placement group only
through :class:`Placement`: :class:`RayPlacement` on a cluster, an in-process stand-in whose ranks
are plain :class:`RankProcess` objects in unit tests.

This is code a Ray worker runs: Ray ships :class:`RankProcess` by reference to this module, and
each rank's worker imports it to rebuild the actor, so the class stays at module level here. It
imports nothing from :mod:`gpufleet.backends.ray.backend` or :mod:`gpufleet.backends.ray.runner` (they
import this one), and ``ray`` only where Ray is already loaded: inside the actors, in the job's
actor that calls :class:`RayPlacement`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpufleet.backends.group_launch import exit_status
from gpufleet.backends.lifecycle import NOT_STARTED, attempt_argv, signal_group
from gpufleet.jobs.protocol import REQUEUE_EXIT_CODE
from gpufleet.numpy_cpu import without_own_setting

# ---- what the ranks are told and what their exits mean (pure) -----------------------------


@dataclass(frozen=True, slots=True)
class RankSlot:
    """Where one bundle's rank actor runs: its node's address and host name, and the GPUs Ray gave it."""

    node_ip: str
    host: str
    gpu_ids: tuple[str, ...] = ()


def _gpu_key(gpu: str) -> tuple[int, int, str]:
    return (0, int(gpu), "") if gpu.isdigit() else (1, 0, gpu)


def rank_order(slots: Sequence[RankSlot]) -> list[int]:
    """Bundle indices in rank order: grouped by node (in the order nodes first appear), by GPU within one.

    Ranks of one node are numbered in the order of their GPUs so that ``LOCAL_RANK`` is the index of
    the rank's own GPU among the node's (:func:`rank_environments`), which is the device
    ``runtime.group`` selects; rank 0 is on the node of bundle 0.
    """
    first: dict[str, int] = {}
    for i, slot in enumerate(slots):
        first.setdefault(slot.node_ip, i)

    def key(i: int) -> tuple[int, tuple[tuple[int, int, str], ...], int]:
        slot = slots[i]
        return first[slot.node_ip], tuple(_gpu_key(g) for g in slot.gpu_ids), i

    return sorted(range(len(slots)), key=key)


def rank_environments(slots: Sequence[RankSlot], master_port: int) -> list[dict[str, str]]:
    """What each rank (``slots`` in rank order) gets on top of the attempt's environment.

    The variables torchrun would set, so ``runtime.group`` initialises ``torch.distributed`` with
    ``env://`` the same way: ``MASTER_ADDR`` is rank 0's node. Where the ranks have GPUs, every rank
    of a node sees all the node's GPUs of the job (``CUDA_VISIBLE_DEVICES``, Ray gave each rank one)
    and picks its own by ``LOCAL_RANK``, as under torchrun; NCCL needs to see its peers' devices.
    """
    world = len(slots)
    master = slots[0].node_ip if slots else ""
    envs = []
    for rank, slot in enumerate(slots):
        peers = [r for r, other in enumerate(slots) if other.node_ip == slot.node_ip]
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(peers.index(rank)),
            "LOCAL_WORLD_SIZE": str(len(peers)),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(master_port),
        }
        gpus = sorted({g for r in peers for g in slots[r].gpu_ids}, key=_gpu_key)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        envs.append(env)
    return envs


def group_exit(codes: Sequence[int | None], events: Path | None, attempt: int | None) -> int | None:
    """The attempt's exit status from its ranks' ``codes``, in the order they ended (``None``: vanished).

    The first rank to fail speaks for the attempt, as torchrun's agent reports its first failure;
    ``group_launch.exit_status`` then turns it into 75 when the attempt's ``session_end`` says
    ``requeue`` or a rank left the lost-rank marker, as it does for a torchrun attempt. A rank whose
    actor vanished (its node lost) with no requeue on record makes the attempt ``lost`` (``None``).
    """
    first = next((code for code in codes if code != 0), 0)
    status = exit_status(1 if first is None else first, events, attempt)
    return None if first is None and status != REQUEUE_EXIT_CODE else status


# ---- the processes: the rank actors and the group that watches them ------------------------


class RankGone:
    """The answer of a rank actor that died (with its node, or killed) instead of answering."""


def current_actor_id() -> str | None:
    """The Ray actor this code runs in; ``None`` outside one (or when Ray is not loaded)."""
    if "ray" not in sys.modules:
        return None
    import ray

    actor_id: str | None = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
    return actor_id


def current_cluster_address() -> str | None:
    """The GCS address of the cluster this code runs in (what a job's own Ray driver joins); ``None`` outside."""
    if "ray" not in sys.modules:
        return None
    import ray

    address: str | None = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    return address


class RankProcess:
    """One rank of one attempt: the actor in the rank's bundle that runs the rank as a subprocess.

    Every method returns at once: the actor runs one call at a time, and the job's actor must be
    able to signal a rank while it trains. The subprocess is started from the actor's main thread
    (where Ray runs the calls of a one-at-a-time actor) behind the death-signal shim, so it dies
    with the actor's process, and in a session of its own so that a signal reaches its children.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._code: int | None = None

    def where(self) -> RankSlot:
        if current_actor_id() is None:
            return RankSlot("127.0.0.1", socket.gethostname())
        import ray

        node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return RankSlot(node_ip, socket.gethostname(), tuple(str(g) for g in ray.get_gpu_ids()))

    def free_port(self) -> int:
        """A TCP port free on this node now: rank 0's ``MASTER_PORT``."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port: int = sock.getsockname()[1]
        return port

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, log: str) -> int:
        """Start the rank, appending its output to ``log``; its PID (0 when it cannot start: exit 127)."""
        with Path(log).open("ab") as out:  # the rank holds its own copy of the descriptor
            try:
                self._proc = subprocess.Popen(
                    attempt_argv(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env={**without_own_setting(os.environ), **env},
                    start_new_session=True,
                )
            except OSError as err:
                out.write(f"gpufleet: cannot start {argv[0]!r} in {cwd}: {err.strerror}\n".encode())
                self._code = NOT_STARTED
                return 0
        return self._proc.pid

    def poll(self) -> int | None:
        """The rank's exit status once it ended, else ``None``."""
        if self._proc is not None and self._code is None:
            self._code = self._proc.poll()
        return self._code

    def signal(self, signum: int) -> None:
        if self._proc is not None:
            signal_group(self._proc.pid, signum)


class Placement(Protocol):
    """Where a multi-rank job's ranks run: its placement group on Ray (in-process in unit tests)."""

    def ready(self, timeout: float) -> bool:
        """Reserve the job's bundles (the first call), and whether they are held; waits up to ``timeout``."""

    def start_ranks(self) -> list[Any]:
        """One :class:`RankProcess` per bundle, in bundle order (they may still be waiting for it)."""

    def call(self, ranks: Sequence[Any], method: str, args: Sequence[tuple[Any, ...]], *, timeout: float) -> list[Any]:
        """Call ``method`` of each rank with its ``args``: the answers, :class:`RankGone` for a dead rank.

        ``TimeoutError`` when not every rank answered within ``timeout``.
        """

    def stop(self, ranks: Sequence[Any]) -> None:
        """End the ranks' actors (a rank process still running dies with its actor)."""

    def release(self) -> None:
        """Give the job's bundles back to the cluster: the job has ended."""


@dataclass(frozen=True, slots=True)
class Ended:
    """How an attempt's processes ended: ``code`` as an exit status, ``None`` when it vanished."""

    code: int | None


RANK_CALL_TIMEOUT_S = 60.0
"""How long the job's actor waits for its rank actors to answer a call that starts or signals."""
RANK_POLL_TIMEOUT_S = 5.0
"""How long one poll of the ranks waits; one that does not answer in time is asked again."""


class RankGroup:
    """The ranks of one attempt as the job's actor sees them: polled together, signalled together.

    SIGTERM reaches every rank once: a preemption, or the first rank that fails, whichever comes
    first (the ranks then agree on a step, save together and exit). The ranks still running
    ``grace`` seconds after a failure are SIGKILLed, like torchrun's agent does after its own wait.
    """

    def __init__(
        self,
        placement: Placement,
        ranks: Sequence[Any],
        pids: Sequence[int],
        *,
        events: Path,
        attempt: int,
        grace: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.placement = placement
        self.ranks = list(ranks)
        self.pid = pids[0] or None
        self.events, self.attempt, self.grace, self.clock = events, attempt, grace, clock
        self._lock = threading.Lock()
        self._ended: dict[int, int | None] = {}
        self._order: list[int] = []
        self._sigtermed = False
        self._kill_at: float | None = None

    def _running(self) -> list[int]:
        return [r for r in range(len(self.ranks)) if r not in self._ended]

    def _signal(self, signum: int) -> None:
        running = self._running()
        with contextlib.suppress(TimeoutError):
            self.placement.call(
                [self.ranks[r] for r in running], "signal", [(int(signum),)] * len(running), timeout=RANK_CALL_TIMEOUT_S
            )

    def signal(self, signum: int) -> None:
        """Signal every rank still running; a second SIGTERM is not sent (it would cut a save short)."""
        with self._lock:
            if signum == signal.SIGTERM:
                if self._sigtermed:
                    return
                self._sigtermed = True
            self._signal(signum)

    def poll(self) -> Ended | None:
        """``None`` while a rank runs; once every rank ended, the attempt's exit status (:func:`group_exit`)."""
        with self._lock:
            running = self._running()
            try:
                answers = self.placement.call(
                    [self.ranks[r] for r in running], "poll", [()] * len(running), timeout=RANK_POLL_TIMEOUT_S
                )
            except TimeoutError:
                return None
            for rank, answer in zip(running, answers, strict=True):
                if isinstance(answer, RankGone) or answer is not None:
                    self._ended[rank] = None if isinstance(answer, RankGone) else int(answer)
                    self._order.append(rank)
            if len(self._ended) == len(self.ranks):
                codes = [self._ended[r] for r in self._order]
                return Ended(group_exit(codes, self.events, self.attempt))
            if any(code != 0 for code in self._ended.values()) and not self._sigtermed:
                self._sigtermed = True  # a rank failed: stop the others rather than wait for their timeout
                self._signal(signal.SIGTERM)
                self._kill_at = self.clock() + self.grace
            if self._kill_at is not None and self.clock() >= self._kill_at:
                self._kill_at = None
                self._signal(signal.SIGKILL)
            return None

    def close(self) -> None:
        """SIGKILL whatever is left of the ranks' process groups, then end the rank actors."""
        with self._lock:
            with contextlib.suppress(TimeoutError):
                self.placement.call(
                    self.ranks, "signal", [(int(signal.SIGKILL),)] * len(self.ranks), timeout=RANK_CALL_TIMEOUT_S
                )
            self.placement.stop(self.ranks)


class RayPlacement:
    """The job's placement group, named after the job, detached: it outlives a restart of the actor."""

    def __init__(self, name: str, bundles: Sequence[Mapping[str, float]], strategy: str) -> None:
        self.name, self.bundles, self.strategy = name, [dict(b) for b in bundles], strategy
        self._group: Any = None

    def _get(self) -> Any:
        from ray.util.placement_group import get_placement_group, placement_group

        if self._group is None:
            try:
                self._group = get_placement_group(self.name)
            except ValueError:
                self._group = placement_group(self.bundles, strategy=self.strategy, name=self.name, lifetime="detached")
        return self._group

    def ready(self, timeout: float) -> bool:
        return bool(self._get().wait(timeout_seconds=timeout))

    def start_ranks(self) -> list[Any]:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        rank_actor = ray.remote(RankProcess)
        return [
            rank_actor.options(
                num_cpus=bundle.get("CPU", 0),
                num_gpus=bundle.get("GPU", 0),
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._get(), placement_group_bundle_index=i, placement_group_capture_child_tasks=False
                ),
            ).remote()
            for i, bundle in enumerate(self.bundles)
        ]

    def call(self, ranks: Sequence[Any], method: str, args: Sequence[tuple[Any, ...]], *, timeout: float) -> list[Any]:
        import ray
        from ray.exceptions import RayActorError

        if not ranks:
            return []
        refs = [getattr(rank, method).remote(*a) for rank, a in zip(ranks, args, strict=True)]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(done) < len(refs):
            raise TimeoutError(f"{len(refs) - len(done)} of {len(refs)} ranks did not answer {method} in {timeout:g}s")
        answers: list[Any] = []
        for ref in refs:
            try:
                answers.append(ray.get(ref))
            except RayActorError:
                answers.append(RankGone())
        return answers

    def stop(self, ranks: Sequence[Any]) -> None:
        import ray

        for rank in ranks:
            with contextlib.suppress(Exception):
                ray.kill(rank)

    def release(self) -> None:
        from ray.util.placement_group import get_placement_group, remove_placement_group

        with contextlib.suppress(ValueError):
            remove_placement_group(self._group if self._group is not None else get_placement_group(self.name))


__all__ = [
    "RANK_CALL_TIMEOUT_S",
    "RANK_POLL_TIMEOUT_S",
    "Ended",
    "Placement",
    "RankGone",
    "RankGroup",
    "RankProcess",
    "RankSlot",
    "RayPlacement",
    "current_actor_id",
    "current_cluster_address",
    "group_exit",
    "rank_environments",
    "rank_order",
]
