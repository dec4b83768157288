"""The ranks of one attempt, and the few collective calls the runtime makes between them.

A single-process job is a group of one: every call is local and free. Under torchrun (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` in the environment) the group is
``torch.distributed``'s default process group, initialised here if the script has not done it
(gloo on CPU, NCCL where CUDA is available), with the timeout of the job's spec
(``distributed.timeout_seconds``, exported as ``GPUFLEET_DIST_TIMEOUT_S``): a lost or stuck rank
makes every collective fail within it instead of hanging forever.

Why one small all-reduce per step (:meth:`Group.agree`): the ranks must take the same decision
at the same step (save, roll back, stop for a preemption), from facts only some of them know (a
SIGTERM that reached one rank first, a NaN in one rank's loss, one rank's clock saying a
time-based checkpoint is due). Summing a few floats across ranks is the cheapest way to make
every rank know all of them.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import os
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpufleet.errors import GpufleetError
from gpufleet.jobs.protocol import DEFAULT_TIMEOUT_S, ENV_TIMEOUT

LOST_MARKS = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out", "timeout")
"""Words of a gloo or NCCL error raised because another rank is gone or stuck."""
_state = {"lost": False}


class PeerLost(GpufleetError):
    """Another rank of the attempt is gone or stuck: the group cannot go on, the job must be requeued."""


def lost_marker(job_dir: Path, attempt: int) -> Path:
    """The file a rank leaves when it finds its group broken (read by ``group_launch``: requeue, not failure)."""
    return job_dir / f"rank-lost-attempt-{attempt}"


def is_peer_loss(err: BaseException) -> bool:
    """Whether an error out of a collective (ours, or DDP's in ``backward``) means a rank is gone or stuck."""
    if isinstance(err, PeerLost):
        return True
    if not isinstance(err, RuntimeError):
        return False
    text = str(err).lower()
    return any(mark in text for mark in LOST_MARKS)


def mark_lost(rank: int, why: str) -> None:
    """Leave the lost-rank marker for this attempt (under gpufleet) and skip tearing the broken group down."""
    _state["lost"] = True
    folder, attempt = os.environ.get("GPUFLEET_JOB_DIR"), os.environ.get("GPUFLEET_ATTEMPT", "")
    if folder and attempt.isdigit():
        with contextlib.suppress(OSError):
            lost_marker(Path(folder), int(attempt)).write_text(f"rank {rank}: {why}\n", encoding="utf-8")


@contextlib.contextmanager
def _collective(rank: int) -> Iterator[None]:
    try:
        yield
    except RuntimeError as err:
        if not is_peer_loss(err):
            raise
        why = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        mark_lost(rank, why)
        raise PeerLost(f"rank {rank}: another rank of this attempt is gone or stuck ({why}); requeued") from None


@dataclass(frozen=True, slots=True)
class Group:
    """This process's place among the ranks of its attempt (``Group()`` is a group of one)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = ""
    """``gloo`` or ``nccl``; empty for a group of one."""
    process_group: Any = None
    """The ``torch.distributed`` process group the calls go through (``None``: the default one)."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes the job's events and commits checkpoints."""
        return self.rank == 0

    def _device(self) -> Any:
        import torch

        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def agree(self, values: Sequence[float]) -> list[float]:
        """The element-wise sum of ``values`` over every rank (one all-reduce; NaN spreads)."""
        if not self.distributed:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._device())
        with _collective(self.rank):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.process_group)
        return [float(v) for v in tensor.cpu().tolist()]

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any."""
        return self.agree([1.0 if flag else 0.0])[0] > 0

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            with _collective(self.rank):
                dist.barrier(group=self.process_group)

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank (any picklable object)."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box = [value]
        with _collective(self.rank):
            dist.broadcast_object_list(box, src=0, group=self.process_group)
        return box[0]

    def side_group(self) -> Group:
        """Collective: the same ranks in a gloo process group of their own, for work in another thread.

        Collectives of two threads must not share a process group (their order would differ between
        ranks and they would pair up wrongly); a background checkpoint write talks through this one
        while the training loop keeps the default group for itself.
        """
        if not self.distributed:
            return self
        import dataclasses

        import torch.distributed as dist

        pg = dist.new_group(backend="gloo", timeout=timedelta(seconds=dist_timeout()))
        return dataclasses.replace(self, backend="gloo", process_group=pg)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        with _collective(self.rank):
            dist.all_gather_object(out, value, group=self.process_group)
        return out


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw.strip().isdigit() else default


def dist_timeout(env: dict[str, str] | None = None) -> float:
    """Seconds a collective may wait for the other ranks (``GPUFLEET_DIST_TIMEOUT_S``, default 300)."""
    raw = (env if env is not None else os.environ).get(ENV_TIMEOUT, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 and value == value and value != float("inf") else DEFAULT_TIMEOUT_S


def die_with_parent() -> None:
    """Under torchrun: be SIGKILLed when the launcher dies.

    torchrun starts each rank in a session of its own, so a SIGKILL to the launcher's process
    group (a scheduler's last resort after the grace time) does not reach the ranks; without
    this they would train on, unwatched, into the job's checkpoint folder.
    """
    if os.environ.get("TORCHELASTIC_RUN_ID") is None or not hasattr(os, "getppid"):
        return
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the launcher died before the call
        os._exit(137)


WORLD_DEFAULT_MODULES = (
    "torch.distributed.checkpoint.state_dict",  # pulls torch.distributed.nn.functional and FSDP
    "torch.distributed.optim",
    "torch.distributed.fsdp.sharded_grad_scaler",
    "torch.distributed.algorithms.ddp_comm_hooks",
    "torch.distributed.algorithms.model_averaging.averagers",
)
"""Modules whose functions take ``group=dist.group.WORLD`` as a default argument.

Imported after ``init_process_group``, each such default holds the world group for good, so
``destroy_process_group`` cannot free it and gloo's worker threads outlive the interpreter: the
last of them to drop a collective's tensor then takes the GIL during finalisation, and the rank
dies of SIGABRT ("terminate called without an active exception") after a run that succeeded.
Imported before, the defaults are ``None`` and the group dies with ``destroy_process_group``.
"""


def import_world_defaults() -> None:
    """Import :data:`WORLD_DEFAULT_MODULES`, before anyone initialises the world group."""
    for module in WORLD_DEFAULT_MODULES:
        importlib.import_module(module)


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and not _state["lost"]:  # a broken group is left to the process's end
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        # FSDP's meshes and DTensors hold the groups in reference cycles: free them now, while the
        # interpreter is whole, not in its finalisation (see WORLD_DEFAULT_MODULES).
        gc.collect()


def current_group() -> Group:
    """The group of this process: torch.distributed's when initialised or launched by torchrun, else one."""
    world = _env_int("WORLD_SIZE", 1)
    try:
        import torch.distributed as dist

        available = dist.is_available()
    except ImportError:
        available = False
    if not available:
        return Group()
    if not dist.is_initialized():
        if world <= 1:
            return Group()
        import torch

        die_with_parent()
        import_world_defaults()
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=dist_timeout()))
        # Ours to tear down before the interpreter's finalisation (see WORLD_DEFAULT_MODULES).
        atexit.register(_destroy)
    return Group(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=_env_int("LOCAL_RANK", 0),
        backend=str(dist.get_backend()),
    )


__all__ = [
    "LOST_MARKS",
    "WORLD_DEFAULT_MODULES",
    "Group",
    "PeerLost",
    "current_group",
    "die_with_parent",
    "dist_timeout",
    "import_world_defaults",
    "is_peer_loss",
    "lost_marker",
    "mark_lost",
]
