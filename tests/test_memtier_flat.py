"""The memory tier's flat copies: exact round trips, a buffer reused, files written over, old copies refused."""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_bitwise_equal
from test_memtier import place, wait_for  # noqa: F401 - the fixture is used by name

from gpufleet.jobs.events import EventLog
from gpufleet.runtime.components.announce import Announcer
from gpufleet.runtime.group import Group
from gpufleet.runtime.memtier import release
from gpufleet.runtime.memtier.copies import (
    ALGORITHM,
    CopyHeader,
    CorruptCopy,
    OtherFormat,
    TierError,
    checksum,
    decode,
    encode,
    header_for,
)
from gpufleet.runtime.memtier.flat import Stager
from gpufleet.runtime.memtier.peer import PeerClient, ensure_keeper
from gpufleet.runtime.memtier.shm import SPARE, OwnStore
from gpufleet.runtime.memtier.tier import WRITER_NICE, RamTier, TierPlace
from gpufleet.runtime.memtier.wire import FILE_REFUSED
from gpufleet.spec import MemoryTier


def rich_state(step: int = 3) -> dict[str, Any]:
    """What state dicts hold: ordered dicts with metadata, int keys, tuples, odd floats, layouts, tied tensors."""
    torch.manual_seed(step)
    weights = OrderedDict(w=torch.randn(4, 3), b=torch.randn(3))
    weights._metadata = OrderedDict({"": {"version": 2}})  # type: ignore[attr-defined]
    tied = torch.randn(5, 2)
    return {
        "model": weights,
        "optimizer": {
            "state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.randn(2, 3, 4, 5).permute(0, 2, 3, 1)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0], "foreach": None, "fused": False}],
        },
        "extra": {
            "transposed": torch.arange(12.0).reshape(3, 4).t(),
            "sliced": torch.arange(20).reshape(4, 5)[:, 1:3],
            "empty": torch.zeros(0, 3),
            "kinds": [torch.ones(3, dtype=torch.bool), torch.ones(2, dtype=torch.bfloat16), torch.tensor(5)],
            "tied": (tied, tied),
            "floats": [-0.0, math.inf, 1e-310, 0.1],
            "big": 2**80,
            "text": "naïve \ud800",
            "dtype": torch.float16,
            "sparse": torch.eye(3).to_sparse(),
        },
        "trainer": {"step": step, "rng": torch.get_rng_state(), "python": (3, tuple(range(625)), None)},
    }


def test_a_copy_round_trips_every_value_bit_for_bit() -> None:
    state = rich_state()
    payload = encode(state)
    got = decode(header_for(3, payload, fingerprint=None), payload)
    sparse = got["extra"].pop("sparse")
    state["extra"].pop("sparse")
    assert_bitwise_equal(got, state)
    assert math.copysign(1, got["extra"]["floats"][0]) == -1 and got["extra"]["big"] == 2**80
    nan = encode({"trainer": {"step": 1}, "loss": math.nan})
    assert math.isnan(decode(header_for(1, nan, fingerprint=None), nan)["loss"])
    assert got["extra"]["text"] == "naïve \ud800" and got["extra"]["dtype"] is torch.float16
    assert torch.equal(sparse.to_dense(), torch.eye(3))  # in the pickled part
    assert type(got["model"]) is OrderedDict
    assert got["model"]._metadata == {"": {"version": 2}}  # type: ignore[attr-defined]
    assert type(got["trainer"]["python"]) is tuple and list(got["optimizer"]["state"]) == [0]
    assert got["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)


def test_a_dense_layout_is_kept_and_a_tensor_named_twice_comes_back_one() -> None:
    state = rich_state()
    payload = encode(state)
    got = decode(header_for(3, payload, fingerprint=None), payload)
    assert got["optimizer"]["state"][0]["exp_avg"].stride() == state["optimizer"]["state"][0]["exp_avg"].stride()
    assert got["extra"]["transposed"].stride() == (1, 4)
    assert got["extra"]["sliced"].is_contiguous()  # not dense: stored compactly, the same values
    first, second = got["extra"]["tied"]
    assert first is second


def test_a_restored_tensor_starts_its_own_storage(tmp_path: Path) -> None:
    """Some readers (``torch.set_rng_state``) read a tensor's storage from its start."""
    store = OwnStore(tmp_path / "shm", "ab", 0)
    store.write(3, rich_state(), fingerprint=None)
    got = store.load(store.header(3))
    assert all(t.storage_offset() == 0 for t in (got["trainer"]["rng"], got["model"]["b"], got["extra"]["sliced"]))
    torch.set_rng_state(got["trainer"]["rng"])


def test_the_stager_reuses_its_buffer_and_its_copy_does_not_follow_the_state() -> None:
    stager = Stager()
    state = rich_state()
    for _ in range(3):
        staged = stager.stage(state)
    before = bytes(staged.data)
    state["model"]["w"].add_(1.0)
    assert bytes(staged.data) == before and stager.allocations == 1
    state["model"]["w"] = torch.zeros(40, 40)  # the state outgrew the buffer
    stager.stage(state)
    assert stager.allocations == 2


def test_a_copy_whose_index_lies_is_corrupt_not_a_crash() -> None:
    payload = bytearray(encode(rich_state()))
    data_bytes, index_bytes = struct.unpack_from(">QQ", payload, 8)
    start = 64 + data_bytes
    index = json.loads(payload[start : start + index_bytes])
    index["tensors"][0][3] = data_bytes + 64  # past the data region
    forged = json.dumps(index).encode()
    payload[start : start + index_bytes] = forged
    struct.pack_into(">Q", payload, 16, len(forged))
    with pytest.raises(CorruptCopy, match="outside its data region"):
        decode(header_for(3, payload, fingerprint=None), payload)
    with pytest.raises(CorruptCopy):
        decode(header_for(3, b"GFFLAT1\n" + bytes(100), fingerprint=None), b"GFFLAT1\n" + bytes(100))


def test_a_header_of_another_checksum_is_another_format() -> None:
    payload = encode({"trainer": {"step": 1}})
    header = header_for(1, payload, fingerprint=None).to_dict()
    assert header["algorithm"] == ALGORITHM and header["checksum"] == checksum(payload)
    old = {k: v for k, v in header.items() if k not in ("algorithm", "checksum")} | {"sha256": "0" * 64}
    with pytest.raises(OtherFormat, match="sha256"):
        CopyHeader.from_dict(old)
    with pytest.raises(CorruptCopy, match="fails its checksum"):
        decode(CopyHeader.from_dict({**header, "checksum": "00000000"}), payload)


def test_an_own_copy_of_an_earlier_version_is_skipped_as_another_format(place: TierPlace) -> None:  # noqa: F811
    log = EventLog(None)
    tier = RamTier(MemoryTier(peer=False), place, group=Group(), voice=Announcer(log), job=None)
    tier.snapshot(4, lambda: {"trainer": {"step": 4}}, fields={"fingerprint": None}, step_seconds=1.0)
    tier.snapshot(5, lambda: {"trainer": {"step": 5}}, fields={"fingerprint": None}, step_seconds=1.0)
    tier.wait()
    head = {"step": 5, "sha256": "0" * 64, "bytes": 10, "fingerprint": None, "created_at": 1.0}
    raw = json.dumps(head).encode()
    tier.own.head_path(5).write_bytes(b"GFMEM2\n" + struct.pack(">I", len(raw)) + raw)
    got = tier.restore(before_step=None, disk_step=None, fingerprint=None)
    tier.close()
    assert got is not None and got.header.step == 4
    skipped = [(e["tier"], e["step"], e["reason"]) for e in log.memory if e["kind"] == "tier_skipped"]
    assert ("own", 5, "other_format") in skipped


def test_a_pruned_copys_file_is_written_over_unless_mapped_and_kept_while_lent(tmp_path: Path) -> None:
    store = OwnStore(tmp_path / "shm", "ab", 0)
    for step in (1, 2, 3):
        store.write(step, {"trainer": {"step": step}, "w": torch.full((1000,), float(step))}, fingerprint=None)
    spare = os.stat(store.folder / SPARE).st_ino  # step 1's file
    store.write(4, {"trainer": {"step": 4}, "w": torch.full((1000,), 4.0)}, fingerprint=None)
    assert os.stat(store.path(4)).st_ino == spare and store.steps() == [4, 3]
    assert store.load(store.header(4))["w"][0] == 4.0
    store.lent.add(3)
    loaded = store.load(store.header(4))  # mapped by this process: never written over
    for step in (5, 6):
        store.write(step, {"trainer": {"step": step}, "w": torch.full((1000,), float(step))}, fingerprint=None)
    assert not (store.folder / SPARE).exists() and loaded["w"][0] == 4.0
    assert store.steps() == [6, 5] and store.path(3).exists()  # pruned while lent: its file stays
    lent = os.stat(store.path(3)).st_ino
    store.give_back(3)
    assert os.stat(store.folder / SPARE).st_ino == lent and not store.path(3).exists()
    modes = {stat.S_IMODE(os.stat(p).st_mode) for p in store.folder.iterdir()}
    assert modes == {0o600} and stat.S_IMODE(os.stat(store.folder).st_mode) == 0o700


def test_a_copy_whose_send_failed_is_unlinked_not_reused_while_a_keeper_may_still_read_it(tmp_path: Path) -> None:
    store = OwnStore(tmp_path / "shm", "ab", 0)
    for step in (1, 2):
        store.write(step, {"trainer": {"step": step}, "w": torch.full((1000,), float(step))}, fingerprint=None)
    (store.folder / SPARE).unlink(missing_ok=True)
    store.lent.add(1)
    reader = open(store.path(1), "rb")  # noqa: SIM115 - a keeper reading the file by name, as put_path does
    store.write(3, {"trainer": {"step": 3}, "w": torch.full((1000,), 3.0)}, fingerprint=None)
    store.give_back(1, clean=False)
    assert not store.path(1).exists() and not (store.folder / SPARE).exists()
    store.write(4, {"trainer": {"step": 4}, "w": torch.full((1000,), 4.0)}, fingerprint=None)
    before = reader.read()
    reader.close()
    assert torch.tensor(1.0).numpy().tobytes() in before  # what it read is still step 1's bytes


def test_the_writer_and_sender_threads_yield_the_cpu(place: TierPlace) -> None:  # noqa: F811
    tier = RamTier(MemoryTier(peer=False), place, group=Group(), voice=Announcer(EventLog(None)), job=None)
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        for pool in (tier._writer, tier._sender):
            assert pool.submit(os.getpriority, os.PRIO_PROCESS, 0).result() == min(base + WRITER_NICE, 19)
    finally:
        tier.close()


def test_the_jobs_keeper_reads_a_rank_copy_from_its_file_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = tmp_path / "shm"
    monkeypatch.setenv("GPUFLEET_SHM_DIR", str(shm))  # the keeper gets the job's environment
    here = TierPlace(shm_root=shm, job_dir=tmp_path / "job", peer_address=None)
    tier = RamTier(MemoryTier(peer=True), here, group=Group(), voice=Announcer(EventLog(None)), job=None)
    try:
        state: dict[str, Any] = {"trainer": {"step": 2}, "w": torch.arange(6.0)}
        tier.snapshot(2, lambda: state, fields={"fingerprint": None}, step_seconds=1.0)
        tier.wait()
        assert tier._by_path and tier.peer_failures == 0
        client = PeerClient(ensure_keeper(here.job_dir))
        got = client.get(here.key, 0, 2)
        assert got is not None and torch.equal(decode(*got)["w"], state["w"])
        header = tier.own.header(2)
        elsewhere = tmp_path / "secret.txt"
        elsewhere.write_bytes(b"x" * header.bytes)
        with pytest.raises(TierError, match=FILE_REFUSED):
            client.put_path(here.key, 0, header, str(elsewhere))
        gone = CopyHeader.from_dict({**header.to_dict(), "step": 9})  # pruned before the keeper read it
        with pytest.raises(TierError) as missing:
            client.put_path(here.key, 0, gone, str(tier.own.path(9)))
        assert FILE_REFUSED not in str(missing.value)  # the next copy is still handed over by its file
        client.close()
    finally:
        tier.close()
        release(here.job_dir, {"GPUFLEET_SHM_DIR": str(shm)})


def test_a_keeper_of_another_root_is_sent_the_bytes(place: TierPlace) -> None:  # noqa: F811
    tier = RamTier(MemoryTier(peer=True), place, group=Group(), voice=Announcer(EventLog(None)), job=None)
    try:
        tier.snapshot(1, lambda: {"trainer": {"step": 1}}, fields={"fingerprint": None}, step_seconds=1.0)
        tier.wait()
        tier.snapshot(2, lambda: {"trainer": {"step": 2}}, fields={"fingerprint": None}, step_seconds=1.0)
        tier.wait()
        assert not tier._by_path  # the keeper's root is /dev/shm's, the copies' a test folder
        wait_for(lambda: tier._peer(start=False).list(place.key) == [(0, 1), (0, 2)])
    finally:
        tier.close()


def test_auto_picks_its_interval_from_the_flat_snapshots_cost(place: TierPlace) -> None:  # noqa: F811
    """``every_steps: auto``: the second snapshot (into the buffer that exists) is what a step pays."""
    picked = {}
    state = rich_state()
    for step_seconds in (10.0, 1e-7):
        log = EventLog(None)
        tier = RamTier(MemoryTier(every_steps="auto", peer=False), place, group=Group(), voice=Announcer(log), job=None)
        for step in (1, 2):
            state["trainer"]["step"] = step
            assert tier.snapshot(step, lambda: state, fields={"fingerprint": None}, step_seconds=step_seconds)
        tier.close()
        (event,) = [e for e in log.memory if e["kind"] == "memory_tier"]
        assert event["auto"] and event["every_steps"] == tier.every and event["snapshot_s"] > 0
        picked[step_seconds] = tier.every
    assert picked[10.0] == 1 and picked[1e-7] is not None and picked[1e-7] > 1


def forged(edit: Any) -> bytearray:
    """A copy of :func:`rich_state` whose index ``edit`` changed, its header's lengths and checksum made to match."""
    payload = bytearray(encode(rich_state()))
    data_bytes, index_bytes = struct.unpack_from(">QQ", payload, 8)
    start = 64 + data_bytes
    index = json.loads(payload[start : start + index_bytes])
    edit(index)
    raw = json.dumps(index).encode()
    payload[start : start + index_bytes] = raw
    struct.pack_into(">Q", payload, 16, len(raw))
    return payload


def test_a_tensor_entry_that_reads_its_elements_twice_is_corrupt_not_a_huge_view() -> None:
    def overlap(index: dict[str, Any]) -> None:
        index["tensors"][0][1:3] = [[2**30, 2**30], [0, 0]]  # a one-element span, 2**60 elements

    payload = forged(overlap)
    with pytest.raises(CorruptCopy, match="overlaps itself"):
        decode(header_for(3, payload, fingerprint=None), payload)


def test_ordered_dict_metadata_that_is_not_a_mapping_is_corrupt() -> None:
    def bad_meta(index: dict[str, Any]) -> None:
        def visit(node: Any) -> bool:
            if isinstance(node, dict) and "m" in node and "o" in node:
                node["m"] = [1, 2]
                return True
            children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
            return any(visit(child) for child in children)

        assert visit(index)

    payload = forged(bad_meta)
    with pytest.raises(CorruptCopy, match="metadata that is not a mapping"):
        decode(header_for(3, payload, fingerprint=None), payload)
