"""The supervisor's side of ``distributed.recovery: continue``: the attempt's Lighthouse and each replica's variables.

torchft's Lighthouse decides, step by step, which replicas take part (a quorum): a replica that
stops heartbeating (``kill -9``) is left out after :data:`HEARTBEAT_TIMEOUT_MS`, and the survivors
go on without it. One Lighthouse serves one attempt; it runs inside the supervisor (a server of
torchft's native module, on threads of its own), so it dies with the supervisor and a requeued
attempt gets a fresh one. It binds loopback only: every replica is on this node.

The native module (``torchft._torchft``, Rust) does not need torch; loading it by its file keeps
the supervisor free of ``import torch`` (torchft's package ``__init__`` imports torch, seconds of a
start the ranks would wait for).

Each rank is a replica group of one (``runtime.elastic``): torch sees ``RANK=0``, ``WORLD_SIZE=1``
and no torchrun run id, so its session never joins a process group with the others, and its place
among the replicas is ``GPUFLEET_REPLICA_RANK`` of ``GPUFLEET_REPLICAS``. Replica 0 writes the job's
events and checkpoints; the others keep their checkpoints in a folder of their own
(:func:`replica_ckpt_dir`), so no two sessions write the same ``step-N`` folder.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from gpufleet.backends.group_launch.supervisor import RankSupervisor
from gpufleet.backends.group_launch.warm_ranks import WarmRanks
from gpufleet.extras import missing_extra
from gpufleet.jobs.events import EventKind, append_event
from gpufleet.jobs.protocol import (
    ENV_CKPT_DIR,
    ENV_ELASTIC_EVENTS,
    ENV_ELASTIC_LIGHTHOUSE,
    ENV_EVENTS,
    ENV_REPLICA_RANK,
    ENV_REPLICAS,
    exit_reason,
)
from gpufleet.numpy_cpu import without_own_setting
from gpufleet.runtime.elastic import healed_marker

HEARTBEAT_TIMEOUT_MS = 2000
"""A replica silent this long is left out of the next quorum: most of a survivor's stall after a ``kill -9``."""
JOIN_TIMEOUT_MS = 1000
"""How long a quorum waits for a replica that heartbeats but has not asked to join yet."""
QUORUM_TICK_MS = 100
RUST_LOG = "warn"
"""torchft's native log level unless the job's environment sets ``RUST_LOG``: at ``info`` it writes a dozen
lines a step (every quorum, every commit) into the attempt's log."""
NATIVE = "torchft._torchft"


def native_module() -> ModuleType:
    """torchft's native module, loaded from its file without running ``torchft/__init__`` (no torch)."""
    if NATIVE in sys.modules:
        return sys.modules[NATIVE]
    found = importlib.util.find_spec("torchft")
    folders = list(found.submodule_search_locations or []) if found is not None else []
    for folder in folders:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"_torchft{suffix}"
            if path.is_file():
                spec = importlib.util.spec_from_file_location(NATIVE, path)
                if spec is None or spec.loader is None:
                    continue
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                sys.modules[NATIVE] = module
                return module
    raise missing_extra("torchft", "elastic", "distributed.recovery: continue")


class Lighthouse:
    """The attempt's torchft Lighthouse on ``127.0.0.1``: its address for the replicas."""

    def __init__(self, server: Any, port: int) -> None:
        self.server, self.port = server, port

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls) -> Lighthouse:
        """Bind a free loopback port; a quorum needs one replica (the survivors go on alone)."""
        os.environ.setdefault("RUST_LOG", RUST_LOG)  # read when the native module starts logging
        server = native_module().LighthouseServer(
            bind="127.0.0.1:0",
            min_replicas=1,
            join_timeout_ms=JOIN_TIMEOUT_MS,
            quorum_tick_ms=QUORUM_TICK_MS,
            heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
        )
        return cls(server, int(str(server.address()).rstrip("/").rsplit(":", 1)[1]))

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None


def replica_ckpt_dir(ckpt_dir: str, rank: int) -> str:
    """Where replica ``rank`` keeps its checkpoints: the job's folder for replica 0, one beside it for others."""
    return ckpt_dir if rank == 0 else str(Path(ckpt_dir).parent / "replicas" / f"replica-{rank}" / "checkpoints")


def replica_environment(
    base: Mapping[str, str], rank: int, nproc: int, lighthouse: str, shared: Mapping[str, str]
) -> dict[str, str]:
    """The whole environment of replica ``rank``: ``base`` with the group's ``shared`` variables, as one of
    ``nproc`` replicas of one rank each; events only for replica 0, a checkpoint folder of its own for others."""
    env = {**base, **shared, ENV_ELASTIC_LIGHTHOUSE: lighthouse, ENV_REPLICA_RANK: str(rank), ENV_REPLICAS: str(nproc)}
    env["LOCAL_RANK"] = str(rank)  # the device a script picks (torchrun's convention); no process group reads it
    env.setdefault("RUST_LOG", RUST_LOG)
    if base.get(ENV_EVENTS):
        env[ENV_ELASTIC_EVENTS] = base[ENV_EVENTS]
    if rank != 0:
        env.pop(ENV_EVENTS, None)
        if base.get(ENV_CKPT_DIR):
            env[ENV_CKPT_DIR] = replica_ckpt_dir(base[ENV_CKPT_DIR], rank)
    return env


SHARED_REPLICA_ENVIRONMENT = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "GROUP_RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "0",
}
"""What every replica gets alike: torch's world of one, and no torchrun run id, so no process group is made."""


class ElasticSupervisor(RankSupervisor):
    """:class:`RankSupervisor` for ``recovery: continue``: a lost replica is replaced while the others step on.

    No generation is published and nobody waits: the survivors' next quorum leaves the lost replica
    out, the replacement (forked warm where it can be) joins a later one and heals from a peer. The
    replacement has recovered once it took part in a step (:func:`gpufleet.runtime.elastic.healed_marker`
    names its PID): ``group_reformed`` is appended then. Not recovered within the recovery timeout, or
    lost after a replica completed, is what it is under ``wait``: a requeue, and nothing to replace.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lighthouse: Lighthouse | None = None
        self.healing: dict[int, tuple[float, float]] = {}
        """Replaced ranks not recovered yet: since when (monotonic, wall clock) they were lost."""
        self.abandoned: set[int] = set()
        """Replacements ended unhealed because a replica completed: the job's result is the survivors'."""

    def environment(self, rank: int) -> dict[str, str]:
        assert self.lighthouse is not None
        return replica_environment(
            without_own_setting(os.environ), rank, self.nproc, self.lighthouse.address, SHARED_REPLICA_ENVIRONMENT
        )

    def start(self) -> None:
        """The Lighthouse first (the replicas' managers connect to it), then the warm rank server and every rank."""
        self.lighthouse = Lighthouse.start()
        print(f"gpufleet: elastic replicas meet at the Lighthouse {self.lighthouse.address}", file=sys.stderr)
        self.warm = WarmRanks.start(self.argv, {**without_own_setting(os.environ), **SHARED_REPLICA_ENVIRONMENT})
        for rank in range(self.nproc):
            self.spawn(rank, warm=False)

    def close(self) -> None:
        super().close()
        if self.lighthouse is not None:
            self.lighthouse.close()

    def tick(self) -> int | None:
        if self.stop_at is not None:
            return super().tick()
        lost = [rank for rank in self._reap() if rank not in self.abandoned]
        if self.stop_at is not None:
            return None
        if lost and self._finished():
            return self.requeue(f"rank {', '.join(map(str, lost))} was lost after a replica had completed its session")
        for rank in lost:
            self._replace_one(rank)
        self._check_healed()
        if self.healing and self._finished():
            if 0 in self.healing:  # replica 0 writes the job's checkpoints and events: they would stop short
                return self.requeue("replica 0 had not healed when another replica completed its session")
            self._abandon()
        oldest = min((since for since, _ in self.healing.values()), default=None)
        if oldest is not None and time.monotonic() - oldest > self.recovery_s:
            return self.requeue(f"the replacement did not heal within {self.recovery_s:g} s")
        if not self.alive():
            return self.status()
        return None

    def _finished(self) -> bool:
        return any(proc.poll() == 0 for proc in self.procs.values())

    def _replace_one(self, rank: int) -> None:
        told = exit_reason(self.procs[rank].returncode or 0)
        print(f"gpufleet: rank {rank} {told}: the others step on while a replacement starts", file=sys.stderr)
        self.healing.setdefault(rank, (time.monotonic(), time.time()))
        self.spawn(rank)

    def _abandon(self) -> None:
        """A replica completed while a replacement was still healing: it has nothing left to catch up with."""
        ranks = sorted(self.healing)
        print(
            f"gpufleet: a replica completed before rank {', '.join(map(str, ranks))} healed: ending the replacement",
            file=sys.stderr,
        )
        self.send([r for r in ranks if r in self.alive()], signal.SIGKILL)
        self.abandoned.update(ranks)
        self.healing.clear()

    def _check_healed(self) -> None:
        for rank in sorted(self.healing):
            live = _read_live(healed_marker(self.job_dir, self.attempt, rank))
            if live is None or live.get("pid") != self.procs[rank].pid:
                continue
            since, _ = self.healing.pop(rank)
            seconds = time.monotonic() - since
            append_event(
                str(self.events) if self.events is not None else None,
                self.attempt,
                EventKind.GROUP_REFORMED,
                generation=self.generation,
                replaced=[rank],
                pids={str(r): proc.pid for r, proc in sorted(self.procs.items())},
                step=live.get("step"),
                tier="peer" if live.get("healed") else None,
                seconds=round(seconds, 3),
                recovery="continue",
            )
            print(f"gpufleet: rank {rank} healed from a peer and steps again ({seconds:.1f} s)", file=sys.stderr)

    def status(self) -> int:
        """Every replica exited 0 (an abandoned replacement aside): completed; else as :meth:`RankSupervisor.status`."""
        kept = [proc for rank, proc in self.procs.items() if rank not in self.abandoned]
        if self.failure is None and all(proc.returncode == 0 for proc in kept):
            return 0
        return super().status()


def _read_live(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


__all__ = [
    "HEARTBEAT_TIMEOUT_MS",
    "JOIN_TIMEOUT_MS",
    "NATIVE",
    "QUORUM_TICK_MS",
    "RUST_LOG",
    "SHARED_REPLICA_ENVIRONMENT",
    "ElasticSupervisor",
    "Lighthouse",
    "native_module",
    "replica_ckpt_dir",
    "replica_environment",
]
