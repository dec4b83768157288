"""Elastic data parallelism for ``distributed.recovery: continue``: each rank a torchft replica group of one.

Under ``wait`` a lost rank stops every survivor until the group re-forms; under ``continue`` the
survivors step on with fewer replicas while the supervisor starts a replacement, which then heals
from a peer's live state (torchft's semantics, Meta's ``torchft``). The rank supervisor runs the
attempt's Lighthouse (``backends.group_launch.elastic``) and gives each rank its place among the
replicas (``GPUFLEET_REPLICA_RANK`` of ``GPUFLEET_REPLICAS``); torch itself sees a world of one
(``RANK=0``, ``WORLD_SIZE=1``), so the rank's ``TrainSession`` never waits on another rank and
nothing but this module's one all-reduce a step crosses replicas::

    elastic = Elastic.from_env(model, optimizer, session=session, samples_per_replica=rows)
    for _ in session.steps():
        elastic.zero_grad()                 # this step's quorum (and a heal, when this replica is behind)
        loss = model(x[share]).backward()   # the replica's share of the global batch
        elastic.average_gradients()         # the mean over the replicas taking part
        if not elastic.step():              # a peer was lost mid-step: the step is run again
            continue
        session.report(loss)

Each replica is a torchft ``Manager`` over a reconfigurable gloo group (torchft's ``ProcessGroupGloo``)
with its own ``TCPStore``; gradients go through ``Manager.allreduce`` (a sum divided by the
participants) and the optimizer steps only when ``Manager.should_commit`` agrees. torchft's
``DistributedDataParallel`` wrapper is not used: its comm hook fails (``assert fut._fut``) when a peer
vanishes, which is exactly the case this exists for.

Healing sends the model, the optimizer, the session's step and data position and whatever the
caller registers (``state_dict``/``load_state_dict``: a learning-rate schedule), so the healed
replica goes on at the survivors' step. The result is not bit-exact: a step the replicas run
without every replica averages fewer shares of the batch, and the missing shares' samples are
skipped. Those steps are recorded, one ``short_handed`` event per run of them (at most
:data:`EVENT_EVERY` steps), by the lowest participating replica, in the job's event log.

Replicas must start identical (a seeded initialisation, as ``workloads.tinylm``'s): a fresh run's
replicas are all at step 0 and none heals from another.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.errors import UsageError
from gpufleet.extras import required
from gpufleet.jobs.events import EventKind, append_event
from gpufleet.jobs.protocol import (
    ENV_ATTEMPT,
    ENV_ELASTIC_EVENTS,
    ENV_ELASTIC_LIGHTHOUSE,
    ENV_JOB_DIR,
    ENV_RECOVERY,
    ENV_REPLICA_RANK,
    ENV_REPLICAS,
)
from gpufleet.runtime.group import dist_timeout

if TYPE_CHECKING:
    import torch

EVENT_EVERY = 50
"""Short-handed steps at most in one ``short_handed`` event: a long run of them is still seen as it goes."""
CONNECT_TIMEOUT_S = 10.0
MEET_TIMEOUT_S = 60.0
"""How long the replicas of a fresh attempt wait for each other before the first quorum."""


def continues(env: Mapping[str, str] | None = None) -> bool:
    """Whether this rank runs under ``recovery: continue`` with a Lighthouse to talk to."""
    env = env if env is not None else os.environ
    return env.get(ENV_RECOVERY) == "continue" and bool(env.get(ENV_ELASTIC_LIGHTHOUSE))


def replica_place(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(replica rank, replicas)`` of this rank under ``continue``; ``(0, 1)`` elsewhere."""
    env = env if env is not None else os.environ
    rank, count = env.get(ENV_REPLICA_RANK, ""), env.get(ENV_REPLICAS, "")
    if not (rank.isdigit() and count.isdigit()) or not 0 <= int(rank) < int(count):
        return 0, 1
    return int(rank), int(count)


def healed_marker(job_dir: Path, attempt: int, rank: int) -> Path:
    """The file a replica leaves at its first step taking part (its PID, the step, whether it healed).

    The supervisor reads it to know a replacement has caught up with the survivors.
    """
    return job_dir / "ranks" / f"attempt-{attempt}" / f"replica-live-{rank}"


def ready_marker(job_dir: Path, attempt: int, rank: int) -> Path:
    """The file a replica leaves once its manager heartbeats to the Lighthouse."""
    return job_dir / "ranks" / f"attempt-{attempt}" / f"replica-ready-{rank}"


def meet(job_dir: Path, attempt: int, place: tuple[int, int], timeout_s: float = MEET_TIMEOUT_S) -> bool:
    """Wait (at most ``timeout_s``) until every replica of the attempt heartbeats: whether they all do.

    The Lighthouse forms a quorum of the replicas that heartbeat; a replica still importing torch
    would miss the first one and heal into a later one, and the steps before would count as run
    short-handed. A replacement finds every marker there already and does not wait.
    """
    rank, replicas = place
    mine = ready_marker(job_dir, attempt, rank)
    with contextlib.suppress(OSError):
        mine.parent.mkdir(parents=True, exist_ok=True)
        mine.write_text(f"{os.getpid()}\n", encoding="utf-8")
    deadline = time.monotonic() + timeout_s
    while not all(ready_marker(job_dir, attempt, r).exists() for r in range(replicas)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


@dataclass(slots=True)
class ShortHanded:
    """A run of steps with fewer replicas than the job has: counted here, emitted as one event."""

    replicas: int
    samples_per_replica: int
    steps: int = 0
    skipped: int = 0
    fewest: int = 0
    first: int = 0
    last: int = 0

    def note(self, step: int, participants: int) -> dict[str, int] | None:
        """Count committed ``step``; the event to emit when a run of short-handed steps ended or filled up."""
        if participants >= self.replicas:
            return self.flush()
        if self.steps == 0:
            self.first, self.fewest = step, participants
        self.steps += 1
        self.skipped += (self.replicas - participants) * self.samples_per_replica
        self.fewest, self.last = min(self.fewest, participants), step
        return self.flush() if self.steps >= EVENT_EVERY else None

    def flush(self) -> dict[str, int] | None:
        """The pending run as an event's payload (``None``: nothing pending), and start counting anew."""
        if self.steps == 0:
            return None
        out = {
            "steps": self.steps,
            "samples_skipped": self.skipped,
            "participants": self.fewest,
            "replicas": self.replicas,
            "first_step": self.first,
            "last_step": self.last,
        }
        self.steps = self.skipped = 0
        return out


class Elastic:
    """One replica of a ``recovery: continue`` job: its torchft manager, optimizer and short-handed count."""

    def __init__(
        self,
        manager: Any,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        replica: tuple[int, int],
        samples_per_replica: int = 0,
        session: Any = None,
        extra: tuple[Callable[[], Any], Callable[[Any], None]] | None = None,
        events: str | None = None,
        attempt: int = 1,
        marker: Path | None = None,
    ) -> None:
        self.manager, self.model, self.inner = manager, model, optimizer
        self.replica_rank, self.replicas = replica
        self.session, self.extra = session, extra
        self.events, self.attempt, self.marker = events, attempt, marker
        self.count = ShortHanded(self.replicas, samples_per_replica)
        self.committed = False
        """Whether the last :meth:`step` stepped the optimizer."""
        self.healed = False
        """Whether this replica loaded a peer's state (it was behind: a replacement)."""
        self._synced = False
        manager.register_state_dict_fn("gpufleet", self._load, self._state)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_env(
        cls,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        session: Any = None,
        state_dict: Callable[[], Any] | None = None,
        load_state_dict: Callable[[Any], None] | None = None,
        samples_per_replica: int = 0,
        env: Mapping[str, str] | None = None,
    ) -> Elastic | None:
        """The replica the supervisor started this process as; ``None`` when the job is not under ``continue``.

        ``session``: its step and data position travel with a heal. ``state_dict``/``load_state_dict``:
        anything else that must (both or neither). ``samples_per_replica``: the samples of one replica's
        share of a step, counted as skipped for each missing replica.
        """
        env = env if env is not None else os.environ
        if not continues(env):
            return None
        if (state_dict is None) != (load_state_dict is None):
            raise UsageError("Elastic.from_env: give both state_dict and load_state_dict, or neither")
        place = replica_place(env)
        manager = _manager(env[ENV_ELASTIC_LIGHTHOUSE], place[0])
        attempt_raw, folder = env.get(ENV_ATTEMPT, ""), env.get(ENV_JOB_DIR)
        attempt = int(attempt_raw) if attempt_raw.isdigit() else 1
        if folder:
            meet(Path(folder), attempt, place)
        return cls(
            manager,
            model,
            optimizer,
            replica=place,
            samples_per_replica=samples_per_replica,
            session=session,
            extra=(state_dict, load_state_dict) if state_dict is not None and load_state_dict is not None else None,
            events=env.get(ENV_ELASTIC_EVENTS) or None,
            attempt=attempt,
            marker=healed_marker(Path(folder), attempt, place[0]) if folder else None,
        )

    # ---- the state a heal moves -----------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": self.model.state_dict(), "optimizer": self.inner.state_dict()}
        if self.session is not None:
            state["session"] = {"step": self.session.step, "data_position": self.session.data_position}
        if self.extra is not None:
            state["extra"] = self.extra[0]()
        return state

    def _load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.inner.load_state_dict(state["optimizer"])
        if self.session is not None and "session" in state:
            self.session.step = int(state["session"]["step"])
            self.session.data_position = int(state["session"]["data_position"])
        if self.extra is not None and "extra" in state:
            self.extra[1](state["extra"])
        self.healed = True

    # ---- one step -------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        """Start this step's quorum (a replica behind the others heals meanwhile), then zero the gradients."""
        if not self._synced:  # torchft's step is the session's: a replica restored to an older one heals
            self._synced = True
            if self.session is not None:
                batches = int(self.manager.batches_committed())
                self.manager.load_state_dict({"step": int(self.session.step), "batches_committed": batches})
        self.manager.start_quorum()
        self.inner.zero_grad(set_to_none=True)

    def average_gradients(self) -> int:
        """Average every gradient over the replicas taking part this step (one all-reduce); how many they are.

        A replica healing this step sends zeros and receives the others' mean, so it takes the same
        optimizer step as they do once its state is loaded.
        """
        import torch

        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.manager.allreduce(flat).wait()
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        return int(self.manager.num_participants())

    def step(self) -> bool:
        """Step the optimizer if every participant agrees (a peer lost mid-step: not, and the step is run again)."""
        self.committed = bool(self.manager.should_commit())
        if not self.committed:
            return False
        self.inner.step()
        self._note(int(self.manager.current_step()), int(self.manager.num_participants()))
        return True

    def _note(self, step: int, participants: int) -> None:
        taking_part = self.manager.is_participating()
        if taking_part and self.marker is not None:
            self._mark_live(step)
        if taking_part and self.manager.participating_rank() == 0:
            self._emit(self.count.note(step, participants))
        elif taking_part:  # a lower replica is back and counts from now on: what this one counted is recorded now
            self._emit(self.count.flush())

    def _mark_live(self, step: int) -> None:
        marker, self.marker = self.marker, None  # once a process
        assert marker is not None
        with contextlib.suppress(OSError):
            marker.parent.mkdir(parents=True, exist_ok=True)
            tmp = marker.with_name(f".{marker.name}.tmp")
            tmp.write_text(json.dumps({"pid": os.getpid(), "step": step, "healed": self.healed}) + "\n")
            os.replace(tmp, marker)

    def _emit(self, payload: dict[str, int] | None) -> None:
        if payload is not None:
            append_event(self.events, self.attempt, EventKind.SHORT_HANDED, replica=self.replica_rank, **payload)

    def close(self) -> None:
        """Record a pending run of short-handed steps and stop the manager's servers."""
        self._emit(self.count.flush())
        with contextlib.suppress(Exception):
            self.manager.shutdown(wait=False)

    def __enter__(self) -> Elastic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def quiet_torchft() -> None:
    """Keep torchft's per-quorum notes out of the job's log; its errors (a lost peer's collective) stay.

    On CPU each new quorum warns that NCCL's flight recorder cannot be reset, and each heal that the
    received buffer is read-only (torch's own deserialisation of torchft's transfer): both are noise here.
    """
    logging.getLogger("torchft.manager").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


def _manager(lighthouse: str, replica_rank: int) -> Any:
    """A torchft ``Manager`` for a replica group of one rank, with its own store, on loopback."""
    quiet_torchft()
    with required("torchft", "elastic", "distributed.recovery: continue"):
        from torch._C._distributed_c10d import TCPStore
        from torchft.manager import Manager  # type: ignore[import-untyped]
        from torchft.process_group import ProcessGroupGloo  # type: ignore[import-untyped]
    timeout = timedelta(seconds=min(dist_timeout(), 600.0))
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=1,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"replica_{replica_rank}",
        hostname="127.0.0.1",
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timedelta(seconds=CONNECT_TIMEOUT_S),
        init_sync=False,
    )
    manager._gpufleet_store = store  # the manager's store lives as long as the manager
    return manager


__all__ = [
    "CONNECT_TIMEOUT_S",
    "EVENT_EVERY",
    "MEET_TIMEOUT_S",
    "Elastic",
    "ShortHanded",
    "continues",
    "healed_marker",
    "meet",
    "quiet_torchft",
    "ready_marker",
    "replica_place",
]
