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
import gc
import importlib
import json
import os
import pickle
import signal
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpufleet.errors import GpufleetError
from gpufleet.jobs import deathsig
from gpufleet.jobs.protocol import DEFAULT_TIMEOUT_S, ENV_RECOVERY, ENV_TIMEOUT

LOST_MARKS = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out", "timeout")
"""Words of a gloo or NCCL error raised because another rank is gone or stuck."""
_state = {"lost": False, "exit_hook": False}
_RETAINED: deque[Any] = deque(maxlen=16)
"""The tensors of the last collectives of this module, kept alive on purpose.

A gloo worker thread drops its reference to a collective's tensors just after the collective
completes. If Python has already let go of them, that drop frees their Python objects and needs
the GIL; a process group destroyed in that moment (DDP's reducer or FSDP's mesh releasing it as
``main()`` returns) joins that worker while holding the GIL: the rank hangs, or aborts in the
interpreter's finalisation. Holding the tensors here makes the worker's drop never the last.
"""


class PeerLost(GpufleetError):
    """Another rank of the attempt is gone or stuck: this group cannot go on.

    The job is requeued, or, under ``distributed.recovery: wait`` (``GPUFLEET_RECOVERY=wait``), the
    group re-forms around the surviving processes (:func:`after_peer_loss` says which).
    """


def after_peer_loss(env: dict[str, str] | None = None) -> str:
    """What follows a lost or stuck rank, in words: the group re-forms under ``recovery: wait``, else a requeue."""
    recovery = (env if env is not None else os.environ).get(ENV_RECOVERY)
    return "the group re-forms with a replacement rank" if recovery == "wait" else "the attempt is requeued"


def lost_marker(job_dir: Path, attempt: int) -> Path:
    """The file a rank leaves when it finds its group broken (read by ``group_launch``: requeue, not failure)."""
    return job_dir / f"rank-lost-attempt-{attempt}"


def rank_end_marker(job_dir: Path, attempt: int, rank: int) -> Path:
    """The file in which a rank records how its session ended (``completed``, ``requeue``, ``failed``).

    Rank 0 writes the job's events; the others write nothing else the launcher can read, and the
    launcher must know that *every* rank completed to end an attempt whose processes fail to exit.
    """
    return job_dir / "ranks" / f"attempt-{attempt}" / f"session-end-{rank}"


def mark_session_end(rank: int, status: str) -> None:
    """Record this rank's ``session_end`` status for the launcher (under gpufleet; else nothing)."""
    folder, attempt = os.environ.get("GPUFLEET_JOB_DIR"), os.environ.get("GPUFLEET_ATTEMPT", "")
    if not folder or not attempt.isdigit():
        return
    path = rank_end_marker(Path(folder), int(attempt), rank)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(status + "\n", encoding="utf-8")
        os.replace(tmp, path)


def rank_end_statuses(job_dir: Path, attempt: int, world_size: int) -> list[str | None]:
    """Every rank's recorded ``session_end`` status, ``None`` for a rank that recorded none."""
    out: list[str | None] = []
    for rank in range(world_size):
        try:
            out.append(rank_end_marker(job_dir, attempt, rank).read_text(encoding="utf-8").strip() or None)
        except OSError:
            out.append(None)
    return out


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


def rendezvous_file(job_dir: Path, attempt: int) -> Path:
    """The rank supervisor's rendezvous file of an attempt: the generation of its group and where it meets."""
    return job_dir / "ranks" / f"attempt-{attempt}" / "rendezvous.json"


def write_rendezvous(path: Path, generation: int, master_port: int) -> None:
    """Publish a generation of the group (temp file, then rename: a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"generation": generation, "master_port": master_port}) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_rendezvous(path: Path) -> tuple[int, int] | None:
    """``(generation, master_port)`` from a rendezvous file, or ``None`` while it is missing or unreadable."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        generation, port = found["generation"], found["master_port"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2**31 for v in (generation, port)):
        return None
    return generation, port


def reform_request(job_dir: Path, attempt: int, generation: int, rank: int) -> Path:
    """The file a rank leaves when it finds generation ``generation`` of its group broken.

    The supervisor replaces the ranks that stay silent while others asked (stuck, not dead).
    """
    return job_dir / "ranks" / f"attempt-{attempt}" / f"reform-request-{generation}-{rank}"


def ready_marker(job_dir: Path, attempt: int, generation: int, rank: int) -> Path:
    """The file a started rank leaves once its interpreter is ready (torch imported) to join ``generation``.

    The supervisor publishes a generation with a replaced rank only then: the survivors would
    otherwise wait in ``init_process_group`` for a rank still importing torch, and time out.
    """
    return job_dir / "ranks" / f"attempt-{attempt}" / f"ready-{generation}-{rank}"


def _rank_file(name: str) -> Path | None:
    folder, attempt = os.environ.get("GPUFLEET_JOB_DIR"), os.environ.get("GPUFLEET_ATTEMPT", "")
    if not folder or not attempt.isdigit():
        return None
    rank, generation = _env_int("RANK", 0), _env_int("GPUFLEET_GENERATION", 0)
    makers = {"ready": ready_marker, "request": reform_request}
    return makers[name](Path(folder), int(attempt), generation, rank)


def _touch(path: Path | None) -> None:
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{time.time()}\n", encoding="utf-8")


def mark_ready() -> None:
    """Tell the supervisor this rank can join its generation now (under gpufleet; else nothing)."""
    _touch(_rank_file("ready"))


def request_reform() -> None:
    """Ask the supervisor for a generation after this rank's, which it found broken (under gpufleet)."""
    _touch(_rank_file("request"))


def next_generation(
    path: Path, generation: int, timeout_s: float, stop: Callable[[], bool] = lambda: False
) -> tuple[int, int] | None:
    """Wait up to ``timeout_s`` for a generation newer than ``generation`` in the rendezvous file
    (``None`` at the timeout, or as soon as ``stop()`` holds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = read_rendezvous(path)
        if found is not None and found[0] > generation:
            return found
        if time.monotonic() >= deadline or stop():
            return None
        time.sleep(0.05)


def forget_group(wait_s: float = 10.0) -> bool:
    """Destroy a broken group and reset this module's per-process state, so the process can join a new one.

    Best effort and bounded: the destroy runs in a thread given ``wait_s`` (a collective backend that
    still waits on a dead peer must not keep the survivor from the next generation). True when no
    default process group is left, which a new ``init_process_group`` needs.
    """
    import torch.distributed as dist

    def destroy() -> None:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()

    if dist.is_initialized():
        worker = threading.Thread(target=destroy, name="gpufleet-destroy-group", daemon=True)
        worker.start()
        worker.join(wait_s)
    gc.collect()
    _RETAINED.clear()
    _state["lost"] = False
    return not dist.is_initialized()


def close_sockets_on_exec() -> None:
    """Make every socket of this process close on ``exec`` (Linux; elsewhere nothing).

    gloo opens its connections to the other ranks inheritable. A process this rank starts afterwards
    without closing descriptors (the memory tier's keeper, started detached with ``posix_spawn``,
    outlives the rank) then holds them: when this rank is killed its connections stay open, and the
    other ranks, instead of failing their collective at once ("connection closed by peer"), wait in
    it for the whole ``distributed.timeout_seconds``. Called whenever a process group is made.
    """
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            fd = int(name)
            if stat.S_ISSOCK(os.fstat(fd).st_mode) and os.get_inheritable(fd):
                os.set_inheritable(fd, False)


@contextlib.contextmanager
def _collective(rank: int) -> Iterator[None]:
    try:
        yield
    except RuntimeError as err:
        if not is_peer_loss(err):
            raise
        why = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        mark_lost(rank, why)
        raise PeerLost(
            f"rank {rank}: another rank of this attempt is gone or stuck ({why}); {after_peer_loss()}"
        ) from None


class Reduction:
    """A sum over the ranks in flight (:meth:`Group.agree_later`), read once with :meth:`wait`.

    It holds the collective's tensor until the sum is read (and ``_RETAINED`` beyond: see there). A
    rank that drops one unread (its session ends on an error) leaves the tensor to ``_RETAINED`` and
    waits for nothing: the other ranks may be gone.
    """

    __slots__ = ("_rank", "_tensor", "_values", "_work")

    def __init__(self, rank: int, tensor: Any = None, work: Any = None, *, values: list[float] | None = None) -> None:
        self._rank, self._tensor, self._work = rank, tensor, work
        self._values = values

    def wait(self) -> list[float]:
        """The sum, once every rank contributed (``PeerLost`` when a rank is gone or stuck, as for any collective)."""
        work, self._work = self._work, None
        if work is not None:
            with _collective(self._rank):
                work.wait()
            del work
            self._values = [float(v) for v in self._tensor.cpu().tolist()]
        return list(self._values or [])


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

    launched: bool = False
    """Started by torchrun: a group even of one rank (its checkpoints sharded, so a bigger group reshards them)."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or (self.launched and bool(self.backend))

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes the job's events and commits checkpoints."""
        return self.rank == 0

    def _device(self) -> Any:
        import torch

        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _all_reduce(self, tensor: Any) -> Any:
        """Sum ``tensor`` over every rank in place, waited on, the tensor retained (see ``_RETAINED``)."""
        import torch.distributed as dist

        _RETAINED.append(tensor)
        with _collective(self.rank):
            work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.process_group, async_op=True)
            work.wait()
        del work
        return tensor

    def agree(self, values: Sequence[float]) -> list[float]:
        """The element-wise sum of ``values`` over every rank (one all-reduce; NaN spreads)."""
        if not self.distributed:
            return [float(v) for v in values]
        import torch

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._device())
        return [float(v) for v in self._all_reduce(tensor).cpu().tolist()]

    def agree_later(self, values: Sequence[float]) -> Reduction:
        """:meth:`agree`, started now and read with :meth:`Reduction.wait` later (one all-reduce, not waited on).

        The sum travels while this rank computes its next step. It is a collective of this group like
        any other: every rank starts it at the same point of its sequence of collectives.
        """
        if not self.distributed:
            return Reduction(self.rank, values=[float(v) for v in values])
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._device())
        _RETAINED.append(tensor)
        with _collective(self.rank):
            work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.process_group, async_op=True)
        return Reduction(self.rank, tensor, work)

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
        return self._exchange(value, only_main=True)[0]

    def _exchange(self, value: Any, *, only_main: bool = False) -> list[Any]:
        """Every rank's pickled ``value`` (rank 0's only: ``only_main``), through two all-reduces of plain tensors.

        ``all_gather_object`` and ``broadcast_object_list`` hand gloo tensors that Python drops as
        soon as the call returns; these stay in ``_RETAINED`` (why: see there).
        """
        import torch

        send = self.rank == 0 or not only_main
        data = pickle.dumps(value) if send else b""
        sizes = torch.zeros(self.world_size, dtype=torch.int64, device=self._device())
        sizes[self.rank] = len(data)
        lengths = [int(n) for n in self._all_reduce(sizes).cpu().tolist()]
        table = torch.zeros((self.world_size, max(lengths) or 1), dtype=torch.uint8, device=self._device())
        if data:
            table[self.rank, : len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(table.device)
        rows = self._all_reduce(table).cpu()
        senders = [0] if only_main else range(self.world_size)
        return [pickle.loads(rows[r, : lengths[r]].numpy().tobytes()) for r in senders]

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
        close_sockets_on_exec()
        return dataclasses.replace(self, backend="gloo", process_group=pg)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        if not self.distributed:
            return [value]
        return self._exchange(value)

    def drain(self) -> None:
        """Collective, the session's last: let every gloo worker finish with the tensors of earlier calls.

        Other code's collectives (DCP's object collectives in the final save) leave tensors that
        only a gloo worker still references. Two all-reduces that every rank waits in, with the
        GIL released, give those workers the GIL to free them; ``gc.collect`` then frees what
        reference cycles still hold, before the script's own teardown destroys the group.
        """
        if not self.distributed:
            return
        import torch

        for _ in range(2):
            self._all_reduce(torch.zeros(1, dtype=torch.float64, device=self._device()))
        gc.collect()


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
    if os.environ.get("TORCHELASTIC_RUN_ID") is None:
        return
    deathsig.die_with_parent(signal.SIGKILL)


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
    """Import :data:`WORLD_DEFAULT_MODULES`, before anyone initialises the world group.

    Also makes the job's ``distributed.timeout_seconds`` the default timeout of a process group,
    so a script that calls ``init_process_group`` itself, without a ``timeout``, gets it too.
    """
    for module in WORLD_DEFAULT_MODULES:
        importlib.import_module(module)
    apply_default_timeout()


def apply_default_timeout(env: dict[str, str] | None = None) -> None:
    """Under gpufleet (``GPUFLEET_DIST_TIMEOUT_S`` set), make it torch's default process-group timeout.

    ``init_process_group(timeout=None)`` reads ``torch.distributed.distributed_c10d``'s defaults at
    each call, so this reaches a script's own call made afterwards; one made before keeps torch's.
    """
    if not (env if env is not None else os.environ).get(ENV_TIMEOUT):
        return
    import torch.distributed.distributed_c10d as c10d

    timeout = timedelta(seconds=dist_timeout(env))
    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):
        if getattr(c10d, name, None) is not None:
            setattr(c10d, name, timeout)


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
    launched = os.environ.get("TORCHELASTIC_RUN_ID") is not None
    if not dist.is_initialized():
        if world <= 1 and not launched:
            return Group()
        import torch

        die_with_parent()
        import_world_defaults()
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=dist_timeout()))
        if not _state["exit_hook"]:  # once, though a re-formed group is initialised again
            _state["exit_hook"] = True
            # Ours to tear down before the interpreter's finalisation (see WORLD_DEFAULT_MODULES).
            atexit.register(_destroy)
    close_sockets_on_exec()  # the world group's connections, whoever made it
    return Group(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=_env_int("LOCAL_RANK", 0),
        backend=str(dist.get_backend()),
        launched=launched,
    )


__all__ = [
    "LOST_MARKS",
    "WORLD_DEFAULT_MODULES",
    "Group",
    "PeerLost",
    "Reduction",
    "after_peer_loss",
    "apply_default_timeout",
    "close_sockets_on_exec",
    "current_group",
    "die_with_parent",
    "dist_timeout",
    "forget_group",
    "import_world_defaults",
    "is_peer_loss",
    "lost_marker",
    "mark_lost",
    "mark_ready",
    "mark_session_end",
    "next_generation",
    "rank_end_marker",
    "rank_end_statuses",
    "read_rendezvous",
    "ready_marker",
    "reform_request",
    "rendezvous_file",
    "request_reform",
    "write_rendezvous",
]
