"""The memory tier: snapshots in shared memory and a keeper, restored own -> peer -> disk, each verified."""

from __future__ import annotations

import os
import signal
import socket
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_bitwise_equal

from gpufleet.jobs.events import EventLog, read_events
from gpufleet.runtime.components.announce import Announcer
from gpufleet.runtime.group import Group, Reduction
from gpufleet.runtime.memtier import release, tier_need_bytes
from gpufleet.runtime.memtier.copies import CopyHeader, TierError, decode, encode, header_for
from gpufleet.runtime.memtier.peer import PeerClient, ensure_keeper, read_record, running_keeper
from gpufleet.runtime.memtier.shm import OwnStore
from gpufleet.runtime.memtier.tier import RamTier, TierPlace
from gpufleet.runtime.memtier.wire import MAGIC
from gpufleet.runtime.session import TrainSession
from gpufleet.spec import CheckpointPolicy, MemoryTier


def wait_for(until: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def place(tmp_path: Path) -> Iterator[TierPlace]:
    here = TierPlace(shm_root=tmp_path / "shm", job_dir=tmp_path / "job", peer_address=None)
    yield here
    release(here.job_dir, {"GPUFLEET_SHM_DIR": str(here.shm_root)})


class Run:
    """A small model, optimizer and scheduler trained by a session with a memory tier."""

    def __init__(
        self, root: Path, place: TierPlace | None, *, peer: bool = False, disk_every: int = 1000, log: str = "events"
    ) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(16, 16)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        self.events = root / f"{log}.jsonl"
        memory = MemoryTier(peer=peer) if place is not None else None
        self.session = TrainSession(
            ckpt_dir=root / "job" / "checkpoints",
            model=self.model,
            optimizer=self.opt,
            scheduler=self.sched,
            policy=CheckpointPolicy(every_steps=disk_every, memory=memory),
            events=EventLog(self.events),
            memory=place,
            echo=False,
        )

    def train(self, steps: int, *, settle: bool = True) -> None:
        """Train ``steps`` more steps, each step's snapshot written before the next (``settle``)."""
        s = self.session
        for _ in range(steps):
            x = torch.randn(8, 16)
            loss = self.model(x).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.sched.step()
            s.report(loss)
            if settle and s._ckpt.tier is not None:
                s._ckpt.tier.wait()

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "sched": self.sched.state_dict(),
            "step": self.session.step,
            "data": self.session.data_position,
            "rng": torch.rand(4),
        }

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in read_events(self.events)[0] if e["kind"] == kind]


def test_a_restore_from_own_ram_is_bit_identical_to_one_from_disk(tmp_path: Path, place: TierPlace) -> None:
    run = Run(tmp_path, place, disk_every=5)
    with run.session:
        run.train(5)
    ram = Run(tmp_path, place, log="ram")
    with ram.session:
        ram_state = ram.state()  # the RNG's next draws too
    disk = Run(tmp_path, None, log="disk")
    with disk.session:
        disk_state = disk.state()
    assert ram.kinds("restore")[-1]["tier"] == "own" and disk.kinds("restore")[-1]["tier"] == "disk"
    assert ram_state["step"] == 5
    assert_bitwise_equal(ram_state, disk_state)


def test_a_copy_older_than_the_disk_is_stale_and_skipped(tmp_path: Path, place: TierPlace) -> None:
    run = Run(tmp_path, place, disk_every=3)
    with run.session:
        run.train(3)
        run.session._ckpt.tier.enabled = False  # type: ignore[union-attr]
        run.train(1)
    again = Run(tmp_path, place, log="again")
    with again.session:
        assert again.session.step == 4  # the final save
    assert again.kinds("restore")[-1]["tier"] == "disk"
    assert {(e["tier"], e["reason"]) for e in again.kinds("tier_skipped")} >= {("own", "stale")}


def peer_steps(place: TierPlace) -> list[int]:
    client = PeerClient(running_keeper(place.job_dir) or "127.0.0.1:1")
    try:
        return sorted(step for _, step in client.list(place.key))
    finally:
        client.close()


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupt_own_copy_is_skipped_for_the_peer_and_both_corrupt_for_the_disk(
    tmp_path: Path, place: TierPlace
) -> None:
    run = Run(tmp_path, place, peer=True, disk_every=2)
    with run.session:
        run.train(4)
        tier = run.session._ckpt.tier
        assert tier is not None
        wait_for(lambda: peer_steps(place) == [3, 4])
    own = OwnStore(place.shm_root, place.key, 0)
    assert own.steps() == [4, 3]
    flip(own.path(4))
    peer = Run(tmp_path, place, peer=True, log="peer")
    with peer.session:
        assert peer.session.step == 4
    assert peer.kinds("restore")[-1]["tier"] == "peer"
    assert ("own", 4, "corrupt") in {(e["tier"], e["step"], e["reason"]) for e in peer.kinds("tier_skipped")}

    address = running_keeper(place.job_dir)
    assert address is not None
    client = PeerClient(address)
    for step in (4, 3):  # the keeper's copies replaced by ones whose bytes do not match their header
        header, payload = own.read(3)
        client.put(place.key, 0, CopyHeader.from_dict({**header.to_dict(), "step": step}), payload[:-1] + b"x")
    client.close()
    flip(own.path(3))
    disk = Run(tmp_path, place, peer=True, log="disk")
    with disk.session:
        assert disk.session.step == 4
    assert disk.kinds("restore")[-1]["tier"] == "disk"
    skipped = {(e["tier"], e["reason"]) for e in disk.kinds("tier_skipped")}
    assert {("own", "corrupt"), ("peer", "corrupt")} <= skipped


def test_own_restores_without_the_keeper_and_the_next_snapshot_starts_a_new_one(
    tmp_path: Path, place: TierPlace
) -> None:
    run = Run(tmp_path, place, peer=True)
    with run.session:
        run.train(2)
        run.session._ckpt.tier.wait()  # type: ignore[union-attr]
    record = read_record(place.job_dir)
    assert record is not None
    os.kill(record["pid"], signal.SIGKILL)
    wait_for(lambda: running_keeper(place.job_dir) is None)
    again = Run(tmp_path, place, peer=True, log="again")
    with again.session:
        assert again.session.step == 2
        assert again.kinds("restore")[-1]["tier"] == "own"
        again.train(1)
        again.session._ckpt.tier.wait()  # type: ignore[union-attr]
        fresh = read_record(place.job_dir)
        assert fresh is not None and fresh["pid"] != record["pid"]
        assert running_keeper(place.job_dir) == fresh["address"]


def test_two_ranks_starting_at_once_start_one_keeper(tmp_path: Path) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    job = tmp_path / "job"
    try:
        with ctx.Pool(2) as pool:
            addresses = pool.map(ensure_keeper, [job, job])
        assert addresses[0] == addresses[1]
        record = read_record(job)
        assert record is not None and running_keeper(job) == addresses[0]
    finally:
        release(job, {"GPUFLEET_SHM_DIR": str(tmp_path / "shm")})


def frame(op: int, header: bytes, payload_len: int) -> bytes:
    return struct.pack(">4sBIQ", MAGIC, op, len(header), payload_len) + header


def test_the_keeper_refuses_oversize_and_garbage_frames(tmp_path: Path) -> None:
    import subprocess
    import sys

    ready = tmp_path / "ready"
    module = "gpufleet.runtime.memtier.keeper"
    args = ["--ready-file", str(ready), "--max-copy-bytes", "4000", "--idle-seconds", "60"]
    secret = "k" * 64
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args], env={**os.environ, "GPUFLEET_MEMORY_PEER_TOKEN": secret}
    )
    try:
        wait_for(ready.exists)
        host, port = ready.read_text().strip().rsplit(":", 1)
        for garbage in (b"GET / HTTP/1.1\r\n\r\n", frame(1, b'{"key":"ab","rank":0}', 10**9), frame(9, b"{}", 0)):
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(garbage)
                reply = sock.recv(4096)
                assert reply[:4] == MAGIC and reply[4] == 101, reply  # ERR, then the keeper hangs up
                assert sock.recv(4096) == b""
        client = PeerClient(f"{host}:{port}", token=secret)
        payload = encode({"trainer": {"step": 1}})
        with pytest.raises(TierError):  # refused before its bytes are read ("larger than", or the hang-up)
            client.put("ab", 0, header_for(1, payload * 100, fingerprint=None), payload * 100)
        assert client.get("ab", 0) is None
        client.put(
            "ab", 0, header_for(1, payload, fingerprint=None), payload
        )  # a fresh connection: the keeper still serves
        got = client.get("ab", 0)
        assert got is not None and decode(got[0], got[1]) == {"trainer": {"step": 1}}
        client.close()
    finally:
        proc.kill()
        proc.wait()


@dataclass
class FakeGroup:
    """Two ranks' agreement with a rank whose steps are given: what ``RamTier.restore`` asks of a group."""

    rank: int
    other: list[int]
    world_size: int = 2
    distributed: bool = True
    failed: list[bool] = field(default_factory=list)

    def gather(self, value: Any) -> list[Any]:
        return [value, self.other] if self.rank == 0 else [self.other, value]

    def any(self, flag: bool) -> bool:
        self.failed.append(flag)
        return flag


def test_ranks_holding_different_steps_restore_the_newest_step_both_hold(tmp_path: Path, place: TierPlace) -> None:
    """Rank 0 got to step 6 before rank 1 was lost at 5: both restore step 5 (rank 0 skips its newer copy)."""
    held = {0: [5, 6], 1: [4, 5]}
    restored = []
    for rank in (0, 1):
        group = FakeGroup(rank, held[1 - rank])
        tier = RamTier(MemoryTier(peer=False), place, group=group, voice=Announcer(EventLog(None)), job=None)  # type: ignore[arg-type]
        for step in held[rank]:
            payload = encode({"trainer": {"step": step}})
            tier.own.put(header_for(step, payload, fingerprint=None, rank=rank, world_size=2), payload)
        got = tier.restore(before_step=None, disk_step=None, fingerprint=None)
        tier.close()
        assert got is not None and group.failed == [False]
        restored.append(got.header.step)
    assert restored == [5, 5]


def test_tier_need_bytes_counts_four_shared_memory_files_per_rank_and_the_keepers_two_copies() -> None:
    assert tier_need_bytes(1000, 4) == (16000, 16000)  # 2 copies, the one being written, one being sent
    assert tier_need_bytes(1000, 4, own_keeper=True) == (16000, 24000)  # and the keeper's 2 in RAM
    with pytest.raises(ValueError, match="ranks >= 1"):
        tier_need_bytes(1000, 0)


@dataclass(frozen=True)
class TwinGroup(Group):
    """Rank 0 of two whose other rank reports the same numbers; counts the meetings (all-reduces)."""

    meetings: list[int] = field(default_factory=list)

    def agree(self, values: Sequence[float]) -> list[float]:
        self.meetings.append(len(values))
        return [2 * v for v in values]

    def agree_later(self, values: Sequence[float]) -> Reduction:
        return Reduction(self.rank, values=self.agree(values))

    def gather(self, value: Any) -> list[Any]:
        return [value, value]

    def any(self, flag: bool) -> bool:
        return flag

    def barrier(self) -> None:
        pass

    def broadcast(self, value: Any) -> Any:
        return value

    def drain(self) -> None:
        pass


def test_a_group_with_a_fixed_interval_snapshots_between_agreements_without_meeting(
    tmp_path: Path, place: TierPlace
) -> None:
    group = TwinGroup(rank=0, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session = TrainSession(
        ckpt_dir=tmp_path / "job" / "checkpoints",
        model=model,
        optimizer=opt,
        policy=CheckpointPolicy(every_steps=1000, memory=MemoryTier(every_steps=1, peer=False)),
        events=EventLog(tmp_path / "events.jsonl"),
        memory=place,
        group=group,
        agree_every=4,
        echo=False,
        handle_signals=False,
    )
    tier, seen = None, {}
    with pytest.raises(RuntimeError, match="stop"), session:
        tier = session._ckpt.tier
        assert tier is not None
        tier.own.keep = 10
        before = len(group.meetings)
        for _ in range(6):
            loss = model(torch.ones(2, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            session.report(loss)
            tier.wait()
            seen[tier.last_step] = len(group.meetings) - before
        raise RuntimeError("stop")
    assert tier is not None and tier.snapshots == 6
    assert seen == {1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1}  # one meeting, at the agreement of step 4
    judged = {step: tier.own.header(step).judged for step in tier.own.steps()}
    # step 4's agreement decides nothing: it is read at step 5, so every copy was taken before its judgement
    assert judged == {1: False, 2: False, 3: False, 4: False, 5: False, 6: False}
    assert tier.healthy_through == 4  # ... and the judgement read at step 5 reached the tier


def snapshot_tier(place: TierPlace, marks: list[tuple[int, bool]]) -> RamTier:
    tier = RamTier(MemoryTier(peer=False), place, group=Group(), voice=Announcer(EventLog(None)), job=None)
    tier.own.keep = 10
    for step, judged in marks:
        state = {"trainer": {"step": step}, "w": torch.full((3,), float(step))}
        tier.snapshot(step, lambda s=state: s, fields={"fingerprint": None}, step_seconds=1.0, judged=judged)  # type: ignore[misc]
        tier.wait()
    return tier


def test_a_rollback_uses_no_copy_beyond_the_last_step_judged_healthy(place: TierPlace) -> None:
    tier = snapshot_tier(place, [(3, True), (5, False)])
    tier.note_judged(4, healthy=True)
    got = tier.restore(before_step=6, disk_step=None, fingerprint=None)
    assert got is not None and got.header.step == 3
    tier.note_judged(5, healthy=True)
    got = tier.restore(before_step=6, disk_step=None, fingerprint=None)
    assert got is not None and got.header.step == 5 and not got.header.judged
    tier.close()


def test_a_step_judged_unhealthy_drops_the_copies_taken_after_it_as_healthy(place: TierPlace) -> None:
    tier = snapshot_tier(place, [(4, True), (5, False), (6, False)])
    tier.note_judged(4, healthy=True)
    tier.note_judged(5, healthy=False)
    assert tier.own.steps() == [4]
    tier.close()


def test_a_restore_from_own_ram_leaves_no_tensor_in_the_copys_mapping(tmp_path: Path, place: TierPlace) -> None:
    run = Run(tmp_path, place)
    with run.session:
        run.train(3)
    again = Run(tmp_path, place, log="again")
    with again.session:
        assert again.kinds("restore")[-1]["tier"] == "own"
        maps = Path("/proc/self/maps").read_text(encoding="utf-8")
        assert str(place.shm_root) not in maps
