"""The memory tier as a user's fleet meets it: bad copies, lying peers, leftovers."""

from __future__ import annotations

import math
import os
import socket
import stat
import struct
import threading
import tracemalloc
from pathlib import Path

import torch
from test_memtier import Run, place  # noqa: F401 - the fixture is used by name

from gpufleet.runtime.memtier.copies import TierError
from gpufleet.runtime.memtier.shm import OwnStore
from gpufleet.runtime.memtier.tier import TierPlace
from gpufleet.runtime.memtier.wire import MAGIC, Op, WireError, recv_frame


def test_a_rollback_skips_a_memory_copy_whose_weights_hold_nan(tmp_path: Path, place: TierPlace) -> None:  # noqa: F811
    run = Run(tmp_path, place, disk_every=2)
    with run.session:
        run.train(2)  # on disk at step 2
        x = torch.randn(8, 16)
        loss = run.model(x).pow(2).mean()
        run.opt.zero_grad()
        loss.backward()
        run.opt.step()
        with torch.no_grad():
            run.model.weight[0, 0] = math.nan  # the update blew up; the loss it was measured at is finite
        run.session.report(loss)
        run.session._ckpt.tier.wait()  # type: ignore[union-attr]
        assert run.session.step == 3
        run.train(1)  # step 4's loss is NaN: a rollback
        assert torch.isfinite(run.model.weight).all()
    restores = [e for e in run.kinds("restore") if e.get("cause") == "rollback"]
    assert restores and restores[0]["step"] == 2
    skipped = [e for e in run.kinds("tier_skipped") if e.get("step") == 3]
    assert skipped and skipped[0]["reason"] == "nonfinite"


def test_a_frame_that_claims_more_bytes_than_it_sends_costs_only_what_it_sends() -> None:
    ours, theirs = socket.socketpair()
    claimed = 256 << 20
    theirs.sendall(struct.pack(">4sBIQ", MAGIC, int(Op.PUT), 0, claimed) + b"x" * 1000)
    theirs.close()
    tracemalloc.start()
    try:
        try:
            recv_frame(ours, max_payload=1 << 30)
        except WireError as err:
            assert "closed mid-frame" in str(err)
        else:
            raise AssertionError("a frame cut short was read as whole")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        ours.close()
    assert peak < claimed // 8


def test_a_payload_sent_in_pieces_arrives_whole() -> None:
    ours, theirs = socket.socketpair()
    payload = bytes(range(256)) * 40_000  # past one read's worth
    sender = threading.Thread(
        target=lambda: theirs.sendall(struct.pack(">4sBIQ", MAGIC, int(Op.PUT), 2, len(payload)) + b"{}" + payload)
    )
    sender.start()
    op, header, got = recv_frame(ours, max_payload=len(payload))
    sender.join()
    assert (op, header, bytes(got)) == (Op.PUT, {}, payload)
    ours.close()
    theirs.close()


def test_copies_are_neither_written_nor_read_under_a_root_others_may_write(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    root.chmod(0o777)  # as another user of the node could have made /dev/shm/gpufleet-<uid>
    store = OwnStore(root, "ab12", 0)
    try:
        store.write(3, {"trainer": {"step": 3}}, fingerprint=None)
    except TierError:
        pass
    else:
        raise AssertionError("a copy was written where another user could swap it")
    (root / "ab12" / "rank-0").mkdir(parents=True, exist_ok=True)
    (root / "ab12" / "rank-0" / "step-00000003.head").write_bytes(b"forged")
    assert store.steps() == []
    root.chmod(0o755)
    store.write(3, {"trainer": {"step": 3}}, fingerprint=None)
    assert store.steps() == [3]
    assert stat.S_IMODE(os.stat(root / "ab12").st_mode) & 0o077 == 0
