"""The memory keeper serves only clients that know its secret, and a copy belongs to one run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_memtier import Run, place, wait_for  # noqa: F401 - the fixture is used by name

from gpufleet.jobs.events import EventLog
from gpufleet.runtime.components.announce import Announcer
from gpufleet.runtime.group import Group
from gpufleet.runtime.memtier import release
from gpufleet.runtime.memtier.copies import CopyHeader, TierError, encode, header_for
from gpufleet.runtime.memtier.peer import RECORD, PeerClient, ensure_keeper, read_record
from gpufleet.runtime.memtier.runid import RUN_FILE, run_id
from gpufleet.runtime.memtier.tier import RamTier, TierPlace, place_from_env
from gpufleet.runtime.memtier.wire import MAGIC, Op
from gpufleet.spec import MemoryTier

KEY = "ab12"
OTHER_RUN = "0" * 32
REFUSED = r"unauthorized|unreachable"
"""A refused request: the keeper's answer, or the hang-up that follows it."""


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """A job keeper started as a rank starts it: its job folder, address and secret."""
    job = tmp_path / "job"
    address = ensure_keeper(job)
    record = read_record(job)
    assert record is not None
    yield job, address, str(record.get("token", ""))
    release(job, {"GPUFLEET_SHM_DIR": str(tmp_path / "shm")})


def copy_of(step: int, **fields: Any) -> tuple[CopyHeader, bytes]:
    payload = encode({"trainer": {"step": step}})
    return header_for(step, payload, fingerprint=None, **fields), payload


def test_a_client_without_the_secret_gets_nothing_and_cannot_store(keeper: tuple[Path, str, str]) -> None:
    _, address, secret = keeper
    owner = PeerClient(address, token=secret)
    header, payload = copy_of(3)
    owner.put(KEY, 0, header, payload)
    stranger = PeerClient(address, token="f" * 64)
    with pytest.raises(TierError, match=REFUSED):
        stranger.get(KEY, 0)
    with pytest.raises(TierError, match=REFUSED):
        stranger.list(KEY)
    forged, forged_payload = copy_of(9)
    with pytest.raises(TierError, match=REFUSED):
        stranger.put(KEY, 0, forged, forged_payload)
    with pytest.raises(TierError, match=REFUSED):
        stranger.drop(KEY)
    stranger.close()
    assert owner.list(KEY) == [(0, 3)]
    owner.close()


def test_a_request_without_the_secret_is_refused_before_its_payload_is_read(keeper: tuple[Path, str, str]) -> None:
    _, address, _ = keeper
    host, port = address.rsplit(":", 1)
    head = json.dumps({"key": KEY, "rank": 0}).encode()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        # The payload it announces is never sent: a keeper that read it would never answer.
        sock.sendall(struct.pack(">4sBIQ", MAGIC, int(Op.PUT), len(head), 1 << 20) + head)
        reply = sock.recv(4096)
        assert reply[:4] == MAGIC and reply[4] == int(Op.ERR), reply
        assert b"unauthorized" in reply
        assert sock.recv(4096) == b""  # and it hangs up


def test_the_keeper_has_its_secret_in_its_environment_and_not_its_command_line(
    keeper: tuple[Path, str, str],
) -> None:
    job, _, secret = keeper
    record = read_record(job)
    assert record is not None and len(secret) == 64
    cmdline = Path(f"/proc/{record['pid']}/cmdline").read_bytes()
    environ = Path(f"/proc/{record['pid']}/environ").read_bytes().split(b"\0")
    assert secret.encode() not in cmdline
    assert f"GPUFLEET_MEMORY_PEER_TOKEN={secret}".encode() in environ


def test_the_keeper_record_is_readable_by_its_owner_alone(keeper: tuple[Path, str, str]) -> None:
    job, _, _ = keeper
    assert stat.S_IMODE(os.stat(job / RECORD).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(job).st_mode) & 0o077 == 0  # the folder ensure_keeper made


def test_the_keeper_refuses_to_start_without_a_secret(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_MEMORY_PEER_TOKEN"}
    module = "gpufleet.runtime.memtier.keeper"
    done = subprocess.run(
        [sys.executable, "-m", module, "--ready-file", str(ready), "--idle-seconds", "60"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "GPUFLEET_MEMORY_PEER_TOKEN" in done.stderr
    assert not ready.exists()


def test_a_named_peer_needs_its_token_and_the_tier_sends_it(tmp_path: Path) -> None:
    env = {"GPUFLEET_MEMORY_PEER": "127.0.0.1:7070", "GPUFLEET_JOB_DIR": str(tmp_path / "job")}
    with pytest.raises(TierError, match="GPUFLEET_MEMORY_PEER_TOKEN"):
        place_from_env(env, tmp_path / "ckpt")
    here = place_from_env({**env, "GPUFLEET_MEMORY_PEER_TOKEN": "s" * 40}, tmp_path / "ckpt")
    assert here.peer_token == "s" * 40 and "s" * 40 not in repr(here)


def tier_of(place: TierPlace, *, peer: bool = False) -> RamTier:  # noqa: F811
    return RamTier(MemoryTier(peer=peer), place, group=Group(), voice=Announcer(EventLog(None)), job=None)


def skipped(tier: RamTier) -> set[tuple[str, int | None, str]]:
    events = tier.voice.events.memory
    return {(e["tier"], e["step"], e["reason"]) for e in events if e["kind"] == "tier_skipped"}


def test_an_own_copy_of_another_run_is_skipped_and_removed(tmp_path: Path, place: TierPlace) -> None:  # noqa: F811
    tier = tier_of(place)
    header, payload = copy_of(4, run=OTHER_RUN)
    tier.own.put(header, payload)
    mine, mine_payload = copy_of(2, run=tier.run())
    tier.own.put(mine, mine_payload)
    got = tier.restore(before_step=None, disk_step=None, fingerprint=None)
    tier.close()
    assert got is not None and got.header.step == 2
    assert ("own", 4, "other_run") in skipped(tier)
    assert tier.own.steps() == [2]


def test_a_peer_copy_of_another_run_is_skipped_and_dropped(tmp_path: Path, place: TierPlace) -> None:  # noqa: F811
    tier = tier_of(place, peer=True)
    client = PeerClient(ensure_keeper(place.job_dir))
    header, payload = copy_of(4, run=OTHER_RUN)
    client.put(place.key, 0, header, payload)
    got = tier.restore(before_step=None, disk_step=None, fingerprint=None)
    tier.close()
    assert got is None
    assert ("peer", 4, "other_run") in skipped(tier)
    assert client.list(place.key) == []
    client.close()


def test_a_job_folder_made_anew_does_not_restore_the_earlier_runs_ram_copies(
    tmp_path: Path,
    place: TierPlace,  # noqa: F811
) -> None:
    run = Run(tmp_path, place)
    with run.session:
        run.train(3)
    first = run_id(place.job_dir)
    shutil.rmtree(place.job_dir)  # a reset home: the same job id, the same folder path, a new job
    again = Run(tmp_path, place, log="again")
    with again.session:
        assert again.session.step == 0
    assert run_id(place.job_dir) != first and (place.job_dir / RUN_FILE).exists()
    assert {(e["tier"], e["reason"]) for e in again.kinds("tier_skipped")} >= {("own", "other_run")}


def test_ranks_of_one_run_share_its_id(tmp_path: Path) -> None:
    import multiprocessing as mp

    with mp.get_context("forkserver").Pool(2) as pool:
        ids = pool.map(run_id, [tmp_path / "job"] * 4)
    assert len(set(ids)) == 1 and ids[0] == run_id(tmp_path / "job")
    assert stat.S_IMODE(os.stat(tmp_path / "job" / RUN_FILE).st_mode) == 0o600
