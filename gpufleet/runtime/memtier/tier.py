"""The memory tier as a checkpoint manager drives it: snapshot at a step boundary, restore before the disk.

A snapshot copies every tensor of the state into views of one buffer allocated once (``copy_``;
pinned host memory when a tensor is on a GPU, the copy waited on by the writer thread through a
CUDA event) and the rest into a small tagged tree (``flat.py``), so the loop goes on at once; the
background thread writes the buffer and the tree into the node's own copy in shared memory
(written over a pruned copy's file), checksumming each MiB as it goes, then hands the file to the
send to the peer's keeper: the job's own keeper, on this node, reads the file itself (``PUT_FILE``),
and another keeper is sent it from the file by the kernel (``sendfile``). While the writer is
still busy the next boundary takes no snapshot (counted in ``busy_skips``): a slow write never
stalls training. The writing and sending threads run at a lower priority (``WRITER_NICE``, as the
keeper does): where the ranks keep every core busy, a write waits for an idle moment rather than
take a core from a step. The send runs in a thread of its own; while one is in flight the next copy is
not sent (``peer_skips``): the keeper then holds an older step than the own store, which a restore
handles (the ranks agree on a step every rank holds, own or peer), and a slow or lost keeper never
holds the own copies back. A failed write or send says nothing per step; it is counted, and the
next snapshot tries again (a lost keeper is started anew).

In a group, a snapshot with a fixed ``every_steps`` is taken at the same steps on every rank by
construction, so the ranks do not meet for it: the steps between two agreements are snapshotted
before the agreement judges them, and such a copy says so (``judged: false``). Its health window
holds the steps judged when it was taken. A rollback never uses a copy beyond the last step judged
healthy, and a step judged unhealthy (and kept) drops the copies taken after it as healthy.

``every_steps: auto`` measures the synchronous cost of the first two snapshots (the second is a
copy into the buffer that exists, as every later one: one ``_foreach_copy_`` and the walk over the
state's containers) and picks the fewest steps whose snapshot costs
at most 2 % of the step time, the same on every rank (one all-reduce, at steps where the ranks meet).

A restore lists what each tier holds, skips with a ``tier_skipped`` event each copy that is stale
(older than the newest disk checkpoint), of another run, of an earlier version's format
(``other_format``), unhealthy or corrupt, and makes the ranks
agree on one step: the newest that every rank holds (``Group.gather``), each rank verifying its
copy (own, else peer); if any rank fails, the next older common step, and after that the disk.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.jobs.events import EventKind
from gpufleet.runtime.components.announce import Announcer
from gpufleet.runtime.group import Group
from gpufleet.runtime.health import first_nonfinite
from gpufleet.runtime.memtier.copies import CopyHeader, CorruptCopy, OtherFormat, TierError, decode
from gpufleet.runtime.memtier.flat import Staged, Stager
from gpufleet.runtime.memtier.peer import PeerClient, ensure_keeper, peer_address, peer_token, running_keeper
from gpufleet.runtime.memtier.release import need_words, room, tier_need_bytes
from gpufleet.runtime.memtier.runid import run_id
from gpufleet.runtime.memtier.shm import OwnStore, job_key, shm_root
from gpufleet.runtime.memtier.wire import FILE_REFUSED
from gpufleet.spec import MemoryTier

OVERHEAD_SHARE = 0.02
"""``every_steps: auto``: a snapshot may cost at most this share of a step."""
MEASURED = 2
"""Snapshots measured before ``auto`` picks its interval (the first allocates its buffers)."""
MAX_ROUNDS = 4
WRITER_NICE = 10
"""How much the threads that write and send copies lower their priority (as the keeper does)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TierPlace:
    """Where a job's copies live on this node and which keeper holds its peer copies (from the environment)."""

    shm_root: Path
    job_dir: Path
    peer_address: str | None
    """``GPUFLEET_MEMORY_PEER``; ``None``: the job's own keeper, started on first use."""
    ranks_per_node: int = 1
    peer_token: str | None = field(default=None, repr=False)
    """``GPUFLEET_MEMORY_PEER_TOKEN``: the secret of the keeper ``peer_address`` names."""

    @property
    def key(self) -> str:
        return job_key(self.job_dir)


def place_from_env(env: Mapping[str, str], ckpt_dir: Path) -> TierPlace:
    """The job's folder (``$GPUFLEET_JOB_DIR``, else the checkpoint folder), the shm root and the peer.

    ``TierError`` when ``GPUFLEET_MEMORY_PEER`` names a keeper without ``GPUFLEET_MEMORY_PEER_TOKEN``.
    """
    ranks = env.get("LOCAL_WORLD_SIZE") or env.get("WORLD_SIZE") or "1"
    return TierPlace(
        shm_root=shm_root(env),
        job_dir=Path(env.get("GPUFLEET_JOB_DIR") or ckpt_dir).resolve(),
        peer_address=peer_address(env),
        ranks_per_node=int(ranks) if ranks.isdigit() and int(ranks) > 0 else 1,
        peer_token=peer_token(env),
    )


@dataclass(frozen=True, slots=True)
class MemoryCopy:
    """A verified copy, loaded: the tier it came from and where it lives."""

    tier: str
    header: CopyHeader
    state: dict[str, Any]
    where: str


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a nested state (what one copy holds, give or take its small plain values)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


class RamTier:
    """One rank's memory tier: snapshots out, verified copies in."""

    def __init__(
        self, config: MemoryTier, place: TierPlace, *, group: Group, voice: Announcer, job: str | None
    ) -> None:
        self.config, self.place, self.group, self.voice, self.job = config, place, group, voice, job
        self.own = OwnStore(place.shm_root, place.key, group.rank)
        self.every: int | None = config.every_steps if isinstance(config.every_steps, int) else None
        """Steps between snapshots; ``None`` while ``auto`` measures."""
        self.enabled = True
        self.snapshots = 0
        self.busy_skips = 0
        self.write_failures = 0
        self.peer_failures = 0
        self.last_step: int | None = None
        self.healthy_through: int | None = None
        """The last step the ranks judged healthy: a rollback uses no copy beyond it."""
        self._optimistic: int | None = None
        """The newest step snapshotted before it was judged, recorded healthy."""
        self.state_bytes = 0
        self._measured: list[float] = []
        self._stager = Stager()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpufleet-memtier", initializer=_yield_cpu)
        self._future: Future[None] | None = None
        self._sender = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gpufleet-memtier-peer", initializer=_yield_cpu
        )
        self._sending: Future[None] | None = None
        self.peer_skips = 0
        self._client: PeerClient | None = None
        self._by_path = True
        """The job's own keeper reads the copies from their files (until it refuses one)."""
        self._run: str | None = None
        self._others_cleared = False

    def run(self) -> str:
        """This run's id (``runid.run_id``, kept in the job folder), carried by every copy it writes."""
        if self._run is None:
            self._run = run_id(self.place.job_dir)
        return self._run

    # ---- snapshots ------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        return self.enabled and (self.last_step is None or step - self.last_step >= (self.every or 1))

    def snapshot(
        self,
        step: int,
        build: Callable[[], dict[str, Any]],
        *,
        fields: Mapping[str, Any],
        step_seconds: float,
        judged: bool = True,
    ) -> float | None:
        """Copy the state of ``step`` when one is due; the seconds the loop stood still for it, or ``None``.

        ``judged=False``: the ranks have not judged ``step`` yet (a group between two agreements).
        """
        if not self.due(step):
            return None
        measuring = self.snapshots < MEASURED
        if self._future is not None and not self._future.done():
            if not measuring:  # the ranks take the measured snapshots together: those wait
                self.busy_skips += 1
                return None
            self._future.result()
        started = time.perf_counter()
        state = build()
        if self.snapshots == 0 and not self._fits(step, tensor_bytes(state)):
            return None
        staged = self._stager.stage(state)
        seconds = time.perf_counter() - started
        self.snapshots += 1
        self.last_step = step
        if not judged and fields.get("healthy", True):
            self._optimistic = step
        self._future = self._writer.submit(self._write, step, staged, {**fields, "judged": judged})
        if measuring:
            self._measure(step, seconds, step_seconds)
        return seconds

    def _fits(self, step: int, state_bytes: int) -> bool:
        """Collective, at the first snapshot: the copies of the node's ranks fit its shared memory and RAM."""
        self.state_bytes = state_bytes
        own_keeper = self.config.peer and self.place.peer_address is None
        need, need_ram = tier_need_bytes(state_bytes, self.place.ranks_per_node, own_keeper=own_keeper)
        free, available = room(self.place.shm_root)
        short = free < need or available < need_ram
        if not self.group.any(short):
            return True
        self.enabled = False
        self.voice.say(
            EventKind.TIER_SKIPPED,
            f"memory tier off: {need_words(state_bytes, self.place.ranks_per_node)} need "
            f"{need} bytes of shared memory ({free} free) and {need_ram} of RAM ({available} available); "
            "checkpoints go to disk only",
            tier="own",
            step=step,
            reason="no_room",
            need_bytes=need,
            shm_free_bytes=free,
            need_ram_bytes=need_ram,
            mem_available_bytes=available,
        )
        return False

    def _measure(self, step: int, seconds: float, step_seconds: float) -> None:
        """Measured snapshots: ``auto`` picks its interval after the last; the tier is announced once."""
        self._measured.append(seconds)
        if self.every is None and len(self._measured) < MEASURED:
            return
        if len(self._measured) > 1 and self.every is not None:
            return
        cost, step_s = self._measured[-1], max(step_seconds, 1e-9)
        if self.every is None:
            cost, step_s = (v / self.group.world_size for v in self.group.agree([cost, step_s]))
            self.every = max(1, math.ceil(cost / (OVERHEAD_SHARE * max(step_s, 1e-9))))
        self.voice.emit(
            EventKind.MEMORY_TIER,
            step=step,
            bytes=self.state_bytes,
            own_root=str(self.own.job_folder),
            peer=self.place.peer_address or ("job keeper" if self.config.peer else None),
            every_steps=self.every,
            auto=isinstance(self.config.every_steps, str),
            snapshot_s=round(cost, 6),
        )

    def _write(self, step: int, staged: Staged, fields: dict[str, Any]) -> None:
        """Background: write and checksum the own copy, hand its file to the send; failures are counted."""
        try:
            if staged.synced is not None:
                staged.synced.synchronize()
            run = self.run()
            if not self._others_cleared:  # copies of another run at later steps would prune this one at once
                self._own_steps(run, announce=False)
                self._others_cleared = True
            header = self.own.write_staged(
                step, staged, rank=self.group.rank, world_size=self.group.world_size, run=run, **fields
            )
        except Exception:  # noqa: BLE001 - a full /dev/shm or a bad value: the disk tier still holds the job
            self.write_failures += 1
            return
        if not self.config.peer:
            return
        if self._sending is not None and not self._sending.done():
            self.peer_skips += 1  # the keeper lags behind: it gets a later copy
            return
        self.own.lent.add(step)  # not written over while it is sent
        try:  # opened here, before a later write of this thread prunes the file
            fd = os.open(self.own.path(step), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self.own.give_back(step)
            self.peer_failures += 1
            return
        self._sending = self._sender.submit(self._send, header, fd)

    def _send(self, header: CopyHeader, fd: int) -> None:
        """Hand the copy to the keeper: the job's own keeper reads its file; another is sent it from the file."""
        sent = False
        try:
            client = self._peer(start=True)
            if self.place.peer_address is None and self._by_path:
                try:
                    client.put_path(self.place.key, self.group.rank, header, str(self.own.path(header.step)))
                    sent = True
                    return
                except TierError as err:
                    if FILE_REFUSED not in str(err):
                        raise
                    self._by_path = False  # a keeper of another root: it gets the bytes from now on
                    client = self._peer(start=True)
            client.put_file(self.place.key, self.group.rank, header, fd)
            sent = True
        except (TierError, OSError, ValueError):
            self.peer_failures += 1
            if self._client is not None:
                self._client.close()
            self._client = None
        finally:
            os.close(fd)
            self.own.give_back(header.step, clean=sent)

    def note_judged(self, step: int, *, healthy: bool) -> None:
        """The ranks judged ``step``: it is the last healthy one, or copies taken after it as healthy go."""
        if healthy:
            self.healthy_through = step
            return
        if self._optimistic is None or self._optimistic < step:
            return
        self._optimistic = None
        self.wait()
        after = step - 1
        self.own.drop_after(after)
        if self.config.peer:
            try:
                self._peer(start=False).drop(self.place.key, self.group.rank, after_step=after)
            except TierError:
                self._client = None

    def _peer(self, *, start: bool) -> PeerClient:
        """The keeper's client: the given peer, else the job's keeper (started when ``start``)."""
        if self._client is None:
            address = self.place.peer_address
            token = self.place.peer_token
            if address is None:  # the job's keeper: its client finds the secret its record gave this process
                address = ensure_keeper(self.place.job_dir) if start else running_keeper(self.place.job_dir)
            if address is None:
                raise TierError("missing")
            self._client = PeerClient(address, token=token)
        return self._client

    def wait(self) -> None:
        """Let the write and the send in flight finish (their failures are already counted)."""
        if self._future is not None:
            self._future.result()
            self._future = None
        if self._sending is not None:
            self._sending.result()
            self._sending = None

    def close(self) -> None:
        """The last write lands; later boundaries (the session's end) take no snapshot: the final save is on disk."""
        self.enabled = False
        self.wait()
        self._writer.shutdown(wait=True)
        self._sender.shutdown(wait=True)
        if self._client is not None:
            self._client.close()
            self._client = None

    # ---- restoring ----------------------------------------------------------------------------
    def restore(self, *, before_step: int | None, disk_step: int | None, fingerprint: str | None) -> MemoryCopy | None:
        """Collective: the newest copy every rank holds and verifies (own, then peer), or ``None`` for the disk."""
        self.wait()
        held: dict[int, list[str]] = {}
        try:
            run: str | None = self.run()
        except TierError:
            run = None  # no copy can be told to be this run's: none is a candidate (the ranks still meet)
            self._skipped("own", None, "no_run_id")
        own, peer = (self._own_steps(run), self._peer_steps(disk_step, run)) if run is not None else ([], [])
        for tier, steps in (("own", own), ("peer", peer)):
            for step in steps:
                reason = _step_problem(step, before_step, disk_step, self.healthy_through)
                if reason == "stale":
                    self._skipped(tier, step, reason)
                elif reason is None:
                    held.setdefault(step, []).append(tier)
            if not steps and disk_step is not None and (tier == "own" or self.config.peer):
                self._skipped(tier, None, "missing")
        common = set(held)
        for steps_of_rank in self.group.gather(sorted(held)) if self.group.distributed else []:
            common &= set(steps_of_rank)
        for step in sorted(common, reverse=True)[:MAX_ROUNDS]:
            got = self._load(step, held[step], fingerprint)
            if not self.group.any(got is None):
                self.last_step = self.healthy_through = step
                return got
        return None

    def _own_steps(self, run: str, *, announce: bool = True) -> list[int]:
        """The own copies' steps; a copy of another run is skipped and removed (it is this user's, and stale)."""
        steps = []
        for step in self.own.steps():
            with contextlib.suppress(TierError):  # an unreadable header is judged (and skipped) when loaded
                if self.own.header(step).run not in (None, run):
                    if announce:
                        self._skipped("own", step, "other_run")
                    self.own.remove(step)
                    continue
            steps.append(step)
        return steps

    def _peer_steps(self, disk_step: int | None, run: str) -> list[int]:
        """The keeper's steps of this rank; its copies of another run are skipped and dropped."""
        if not self.config.peer:
            return []
        try:
            client = self._peer(start=False)
            listed = client.copies(self.place.key)
            other = sorted(s for r, s, of in listed if r == self.group.rank and of not in (None, run))
            for step in other:
                self._skipped("peer", step, "other_run")
            if other:
                client.drop(self.place.key, self.group.rank, other_than_run=run)
        except TierError as err:
            if str(err) != "missing":
                self._skipped("peer", None, "unreachable")
            if self._client is not None:
                self._client.close()
            self._client = None
            return []
        return sorted((s for r, s, of in listed if r == self.group.rank and of in (None, run)), reverse=True)

    def _load(self, step: int, tiers: list[str], fingerprint: str | None) -> MemoryCopy | None:
        for tier in tiers:
            try:
                if tier == "own":
                    header = self.own.header(step)
                    where = str(self.own.path(step))
                    reason = self._header_problem(header, fingerprint)
                    if reason is not None:
                        self._skipped(tier, step, reason)
                        continue
                    return self._finite(MemoryCopy(tier, header, self.own.load(header), where))
                else:
                    got = self._peer(start=False).get(self.place.key, self.group.rank, step)
                    if got is None:
                        self._skipped(tier, step, "missing")
                        continue
                    header, payload = got
                    where = f"keeper {self._peer(start=False).address}"
                reason = self._header_problem(header, fingerprint)
                if reason is not None:
                    self._skipped(tier, step, reason)
                    continue
                return self._finite(MemoryCopy(tier, header, decode(header, payload), where))
            except NonfiniteCopy:
                self._skipped(tier, step, "nonfinite")
            except OtherFormat:
                self._skipped(tier, step, "other_format")
            except CorruptCopy:
                self._skipped(tier, step, "corrupt")
            except TierError:
                self._skipped(tier, step, "unreachable")
        return None

    @staticmethod
    def _finite(got: MemoryCopy) -> MemoryCopy:
        """``got``, unless a weight or optimizer tensor holds NaN or inf (``NonfiniteCopy``).

        A disk checkpoint is checked for non-finite state before it is written; a snapshot is not
        (it costs a pass over the state every step), so the check is made here, once, at restore:
        otherwise a rollback would land on the very state that broke the run, again and again.
        """
        named = [(name, tensor) for name, tensor in _named_tensors(got.state) if not name.startswith("trainer/")]
        bad = first_nonfinite(named)
        if bad is not None:
            raise NonfiniteCopy(f"copy of step {got.header.step}: {bad} holds NaN or inf")
        return got

    def _header_problem(self, header: CopyHeader, fingerprint: str | None) -> str | None:
        if header.run is not None and header.run != self._run:
            return "other_run"
        if header.fingerprint != fingerprint:
            return "fingerprint"
        if header.rank != self.group.rank or header.world_size != self.group.world_size:
            return "world_size"
        if self.job is not None and header.job not in (None, self.job):
            return "foreign"
        return None if header.healthy else "unhealthy"

    def _skipped(self, tier: str, step: int | None, reason: str) -> None:
        self.voice.emit(EventKind.TIER_SKIPPED, tier=tier, step=step, reason=reason, rank=self.group.rank)

    def drop_after(self, step: int) -> None:
        """After a rollback to ``step``: the copies of the steps thrown away go (own and peer)."""
        self.wait()
        self.own.drop_after(step)
        self.last_step = None
        self.healthy_through = step if self.healthy_through is None else min(step, self.healthy_through)
        self._optimistic = None
        if self.config.peer:
            try:
                self._peer(start=False).drop(self.place.key, self.group.rank, after_step=step)
            except TierError:
                self._client = None


def _yield_cpu() -> None:
    """Lower the calling thread's priority (``WRITER_NICE``): on a node whose cores the ranks keep busy,
    a background write waits for an idle moment rather than take a core from a training step."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)


class NonfiniteCopy(CorruptCopy):
    """A copy whose bytes are whole but whose weights or optimizer state hold NaN or inf."""


def _named_tensors(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every tensor of a nested state, named by its path (``model/weight``)."""
    if isinstance(value, Mapping):
        return [item for k, v in value.items() for item in _named_tensors(v, f"{prefix}{k}/")]
    if isinstance(value, (list, tuple)):
        return [item for i, v in enumerate(value) for item in _named_tensors(v, f"{prefix}{i}/")]
    return [(prefix.rstrip("/"), value)]


def _step_problem(step: int, before_step: int | None, disk_step: int | None, healthy_through: int | None) -> str | None:
    """Why a copy of ``step`` is not a candidate: ``"after"`` (a rollback's bad step or later, or a step
    beyond the last judged healthy), ``"stale"``."""
    if before_step is not None and (step >= before_step or (healthy_through is not None and step > healthy_through)):
        return "after"
    if disk_step is not None and step < disk_step:
        return "stale"
    return None


__all__ = ["MemoryCopy", "RamTier", "TierPlace", "place_from_env", "room", "tensor_bytes"]
