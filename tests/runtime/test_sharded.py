"""Sharded checkpoints (DCP) of distributed jobs: saved by N ranks, verified, restored on M ranks.

The ranks run ``sharded_worker.py`` (gloo on CPU); a group of one runs here, in the test process.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import run_cli
from sharded_worker import mlp, snapshot, unblob
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from gpufleet.errors import CheckpointError, CheckpointSpaceError, CorruptCheckpoint
from gpufleet.runtime.checkpoint import CheckpointDir, CheckpointManifest, Expectation
from gpufleet.runtime.group import Group
from gpufleet.runtime.manifest import MANIFEST
from gpufleet.runtime.sharded import load_sharded, save_sharded, sharded_candidate

WORKER = Path(__file__).with_name("sharded_worker.py")
REPO = Path(__file__).resolve().parents[2]
OBJECTS = Expectation(job="7", objects=frozenset({"model", "optimizer", "trainer"}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(world: int, logs: Path, *args: str) -> None:
    """Run ``world`` ranks of the worker until all exit; a rank that fails stops the others."""
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "OMP_NUM_THREADS": "1",
        }
        with (logs / f"rank{rank}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), *args], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
                )
            )
    try:
        while any(p.poll() is None for p in procs) and all(p.returncode in (None, 0) for p in procs):
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    failed = [(rank, p.returncode) for rank, p in enumerate(procs) if p.returncode != 0]
    assert not failed, "\n".join(
        f"rank {rank} exited {code}:\n{(logs / f'rank{rank}.log').read_text()[-4000:]}" for rank, code in failed
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """FSDP2 and DDP runs of 2 ranks, each saved at steps 3 and 5; what was saved, as full tensors."""
    root = tmp_path_factory.mktemp("sharded")
    launch(2, root / "logs-save", "save", str(root / "ck"), str(root / "dump.pt"))
    return root / "ck", torch.load(root / "dump.pt", weights_only=True)


def assert_restored(restored: dict[str, Any], saved: dict[str, Any]) -> None:
    """Every parameter and optimizer state tensor bitwise equal (full tensors), and the optimizer's settings."""
    assert restored["model"].keys() == saved["model"].keys() and len(saved["model"]) == 4
    for name, tensor in saved["model"].items():
        assert torch.equal(restored["model"][name], tensor), name
    assert restored["optimizer"].keys() == saved["optimizer"].keys()
    for name, per_param in saved["optimizer"].items():
        assert per_param.keys() == restored["optimizer"][name].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key, tensor in per_param.items():
            assert torch.equal(restored["optimizer"][name][key], tensor), (name, key)
    assert restored["lr"] == saved["lr"] == 1e-2


def restore_here(root: Path) -> tuple[int, dict[str, Any], dict[str, Any] | None, list[str | None]]:
    """A group of one (no process group) restores the newest sharded checkpoint into a plain model."""
    ckpts, group = CheckpointDir(root, keep=10), Group()
    info, manifest, skipped = sharded_candidate(ckpts, group, before_step=None, expect=OBJECTS)
    assert info is not None and manifest is not None and manifest.format == "dcp", [s.problem for s in skipped]
    model = mlp(1)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-2)
    model_sd, optim_sd = get_state_dict(model, [optimizer])
    state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd, "trainer": io.BytesIO()}
    rank_state = load_sharded(ckpts, group, info.path, state)
    set_state_dict(model, [optimizer], model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    assert unblob(state["trainer"]) == {"step": info.step, "data_position": info.step}
    return info.step, snapshot(model, optimizer), rank_state, [s.problem for s in skipped]


# ---- 1. FSDP2: saved by 2 ranks, restored on 1 and on 4 ----------------------------------------------
def test_fsdp_saved_by_two_ranks_restores_on_one_and_on_four(
    saved: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, dump = saved
    manifest = CheckpointDir(root / "fsdp").read_manifest(root / "fsdp" / "step-00000005")
    assert (manifest.format, manifest.world_size, manifest.strategy) == ("dcp", 2, "fsdp")
    assert set(manifest.files) == {".metadata", "__0_0.distcp", "__1_0.distcp", "rank-00000.pt", "rank-00001.pt"}

    launch(4, tmp_path / "logs", "load", str(root), str(tmp_path / "out.pt"), "fsdp")
    restored = torch.load(tmp_path / "out.pt", weights_only=True)["fsdp"]
    assert restored["step"] == 5 and restored["skipped"] == []
    assert_restored(restored, dump["fsdp"][5])
    assert restored["trainer"] == {"step": 5, "data_position": 5}
    assert restored["rank_states"] == [None] * 4  # saved by 2 ranks: no state for each of 4

    step, here, rank_state, skipped = restore_here(root / "fsdp")
    assert step == 5 and skipped == [] and rank_state is None
    assert_restored(here, dump["fsdp"][5])


# ---- 2. DDP: saved by 2 ranks, restored on 2 (with each rank's state) and on 1 ---------------------
def test_ddp_restores_on_two_ranks_with_each_ranks_state(saved: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    root, dump = saved
    launch(2, tmp_path / "logs", "load", str(root), str(tmp_path / "out.pt"), "ddp")
    restored = torch.load(tmp_path / "out.pt", weights_only=True)["ddp"]
    assert restored["step"] == 5
    assert_restored(restored, dump["ddp"][5])
    expected = dump["ddp"][5]["rank_states"]
    assert [s["rank"] for s in expected] == [0, 1] and not torch.equal(expected[0]["noise"], expected[1]["noise"])
    for rank, got in enumerate(restored["rank_states"]):
        assert got is not None and got.keys() == expected[rank].keys() and got["rank"] == rank
        assert all(torch.equal(got[k], expected[rank][k]) for k in ("noise", "rng")), rank

    step, here, rank_state, _ = restore_here(root / "ddp")  # another world size: no rank state
    assert step == 5 and rank_state is None
    assert_restored(here, dump["ddp"][5])


# ---- 3. a shard altered after commit, a save that never committed, both formats in one folder -----
def test_altered_shard_is_skipped_and_the_previous_checkpoint_restored(
    saved: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, dump = saved
    ck = tmp_path / "ck"
    shutil.copytree(root / "fsdp", ck)
    shard = ck / "step-00000005" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size
    shard.write_bytes(bytes(data))
    uncommitted = ck / "step-00000009"  # killed before rank 0 wrote the manifest
    shutil.copytree(ck / "step-00000003", uncommitted)
    (uncommitted / MANIFEST).unlink()
    shutil.copytree(ck / "step-00000003", ck / ".tmp-step-00000010-dcp-0123456789ab")
    ckpts = CheckpointDir(ck, keep=10)
    for step in (1, 7):  # single-process checkpoints beside the sharded ones
        ckpts.save(step, {"model": {"w": torch.full((3,), float(step))}, "trainer": {"step": step}})

    step, here, rank_state, skipped = restore_here(ck)
    assert step == 3 and rank_state is None
    assert_restored(here, dump["fsdp"][3])
    assert len(skipped) == 3 and skipped[0] is not None and skipped[1] is not None and skipped[2] is not None
    assert "manifest.json is missing" in skipped[0]  # step 9
    assert "single-process checkpoint" in skipped[1]  # step 7: not for a sharded restore
    assert "__1_0.distcp fails its sha256 check" in skipped[2]  # step 5

    # The single-process path is as before: the newest torch checkpoint, dcp ones skipped as foreign.
    info, manifest, state, passed = ckpts.restore_candidate()
    assert info is not None and manifest is not None and state is not None and info.step == 7
    assert torch.equal(state["model"]["w"], torch.full((3,), 7.0)) and [p.step for p in passed] == [9]
    info, _, state, passed = ckpts.restore_candidate(before_step=7)
    assert info is not None and info.step == 1 and [p.step for p in passed] == [5, 3]
    assert passed[1].foreign and passed[1].problem is not None and "sharded checkpoint" in passed[1].problem
    with pytest.raises(CheckpointError, match="load_sharded"):
        ckpts.load(ck / "step-00000003")  # never torch.load-ed as a single-process state
    assert [(i.step, i.status) for i in ckpts.scan()] == [
        (1, "ok"),
        (3, "ok"),
        (5, "corrupt"),
        (7, "ok"),
        (9, "corrupt"),
    ]

    # DCP's index altered between the verdict and the load: refused as it is read.
    metadata = ck / "step-00000003" / ".metadata"
    raw = bytearray(metadata.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    metadata.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint, match=r"\.metadata fails its sha256 check"):
        load_sharded(ckpts, Group(), ck / "step-00000003", {"model": mlp(2).state_dict()})


def test_cli_lists_and_verifies_both_formats(
    saved: tuple[Path, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, dump = saved
    ck = tmp_path / "ck"
    shutil.copytree(root / "ddp", ck)
    CheckpointDir(ck).save(1, {"model": {"w": torch.zeros(2)}, "trainer": {"step": 1}})
    code, out, _ = run_cli(capsys, monkeypatch, "ckpt", "verify", str(ck), "--json")
    assert code == 0
    rows = json.loads(out)["checkpoints"]
    assert [(r["step"], r["status"], r["format"], r["world_size"], r["strategy"]) for r in rows] == [
        (1, "ok", "torch", 1, None),
        (3, "ok", "dcp", 2, "ddp"),
        (5, "ok", "dcp", 2, "ddp"),
    ]
    exported_to = tmp_path / "model.pt"
    exported = CheckpointDir(ck).export(exported_to, step=5)
    model = torch.load(exported_to, weights_only=True)
    assert exported.tensors == 4 and model.keys() == dump["ddp"][5]["model"].keys()
    assert all(torch.equal(model[k], v) for k, v in dump["ddp"][5]["model"].items())
    mlp(3).load_state_dict(model)  # a plain state dict for any script


# ---- a group of one: saves, restores, prunes, and a full disk -----------------------------------------
def test_group_of_one_saves_restores_and_survives_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpts, group = CheckpointDir(tmp_path / "ck", keep=2), Group()
    model = mlp(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    expected: dict[int, dict[str, Any]] = {}

    def save(step: int) -> CheckpointManifest:
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        model_sd, optim_sd = get_state_dict(model, [optimizer])
        trainer = io.BytesIO()
        torch.save({"step": step, "data_position": step}, trainer)
        expected[step] = {**snapshot(model, optimizer), "rng": torch.get_rng_state()}
        return save_sharded(
            ckpts,
            group,
            step,
            {"model": model_sd, "optimizer": optim_sd, "trainer": trainer},
            {"rank": 0, "rng": expected[step]["rng"]},
            healthy=True,
            loss=float("nan"),
            data_position=step,
            reason="periodic",
            meta={},
            job="7",
            fingerprint=None,
            metrics={"val_loss": float("inf")},
            strategy="none",
        )

    for step in (1, 2, 3):
        manifest = save(step)
        assert manifest.format == "dcp" and manifest.world_size == 1 and manifest.loss is None
        assert manifest.metrics == {} and manifest.entries == ["model", "optimizer", "trainer"]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000002", "step-00000003"]  # pruned
    step, here, rank_state, _ = restore_here(tmp_path / "ck")
    assert step == 3 and rank_state is not None and rank_state["rank"] == 0  # same world size: its state
    assert torch.equal(rank_state["rng"], expected[3]["rng"])
    assert_restored(here, expected[3])

    before = {p.name: p.read_bytes() for p in (tmp_path / "ck" / "step-00000003").iterdir()}

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", full)
        with pytest.raises(CheckpointSpaceError, match="no space left on") as caught:
            save(3)  # a re-save of the same step: the committed one must survive
    assert caught.value.needed > 0
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000002", "step-00000003"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "ck" / "step-00000003").iterdir()} == before

    with pytest.raises(CheckpointError, match="cannot name a checkpoint"):
        save(-1)
    assert not [p for p in (tmp_path / "ck").iterdir() if p.name.startswith(".tmp-")]


# ---- 4. the manifest: old ones still parse, traversal refused in both formats -------------------------
def manifest_json(**fields: Any) -> str:
    entry = {"sha256": "0" * 64, "bytes": 1}
    files = fields.pop("files", None)
    if files is None:
        files = {"model.pt": entry}
    base = {"schema_version": 1, "step": 3, "healthy": True, "created_at": 1.0}
    return json.dumps({**base, **fields, "files": {name: entry for name in files}})


DCP_FILES = [".metadata", "__0_0.distcp", "__1_0.distcp", "rank-00000.pt", "rank-00001.pt"]


def test_old_manifests_parse_and_new_single_process_ones_read_as_before(tmp_path: Path) -> None:
    old = CheckpointManifest.parse(manifest_json(), tmp_path)  # written before the format field
    assert (old.format, old.world_size, old.strategy, old.entries) == ("torch", 1, None, None)
    assert old.stems == {"model"}
    assert not {"format", "world_size", "strategy", "entries"} & set(json.loads(old.to_json()))  # old readers
    sharded = CheckpointManifest.parse(
        manifest_json(format="dcp", world_size=2, strategy="fsdp", entries=["model", "trainer"], files=DCP_FILES),
        tmp_path,
    )
    assert sharded.stems == {"model", "trainer"} and sharded.described == "dcp x2"
    assert CheckpointManifest.parse(sharded.to_json(), tmp_path) == sharded


@pytest.mark.parametrize(
    "name", ["../x.pt", "/etc/x.pt", "", ".", "..", ".hidden.pt", "a/b.pt", "../.metadata", "__0_0.distcp/../x.pt"]
)
@pytest.mark.parametrize("fmt", ["torch", "dcp"])
def test_traversal_names_are_refused_in_both_formats(tmp_path: Path, name: str, fmt: str) -> None:
    files = [*DCP_FILES, name] if fmt == "dcp" else ["model.pt", name]
    with pytest.raises(CorruptCheckpoint, match="invalid file"):
        CheckpointManifest.parse(manifest_json(format=fmt, world_size=2 if fmt == "dcp" else 1, files=files), tmp_path)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"format": "torch", "files": ["model.pt", ".metadata"]}, "not a file of a torch-format checkpoint"),
        ({"format": "torch", "world_size": 2}, "written by one process"),
        ({"format": "dcp", "world_size": 2, "files": [*DCP_FILES, "model.pt"]}, "not a file of a dcp checkpoint"),
        ({"format": "dcp", "world_size": 2, "files": DCP_FILES[1:]}, "lists .metadata"),
        ({"format": "dcp", "world_size": 2, "files": DCP_FILES[:-1]}, "rank-00001.pt is not listed"),
        ({"format": "dcp", "world_size": 2, "files": [*DCP_FILES, "__2_0.distcp"]}, "names rank 2"),
        ({"format": "dcp", "world_size": 0, "files": DCP_FILES}, "world_size"),
        ({"format": "zip"}, "format"),
    ],
)
def test_each_format_accepts_only_its_own_files(tmp_path: Path, fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(CorruptCheckpoint, match=problem):
        CheckpointManifest.parse(manifest_json(**fields), tmp_path)
