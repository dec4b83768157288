from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpufleet.errors import CorruptCheckpoint
from gpufleet.runtime.checkpoint import MANIFEST, CheckpointDir


def state(step: int) -> dict[str, object]:
    return {"model": {"w": torch.full((64, 64), float(step))}, "trainer": {"step": step}}


def test_save_writes_manifest_with_hashes(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    manifest = ckpts.save(7, state(7), loss=1.5, data_position=7)
    folder = tmp_path / "step-00000007"
    raw = json.loads((folder / MANIFEST).read_text())
    assert raw["step"] == 7 and raw["healthy"] is True and raw["schema_version"] == 1
    assert set(raw["files"]) == {"model.pt", "trainer.pt"}
    assert manifest.total_bytes == sum(f.stat().st_size for f in folder.glob("*.pt"))
    _, loaded = ckpts.load(folder)
    assert torch.equal(loaded["model"]["w"], torch.full((64, 64), 7.0))
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete_file", "delete_manifest", "bad_json"])
def test_damaged_newest_is_skipped_for_previous(tmp_path: Path, damage: str) -> None:
    ckpts = CheckpointDir(tmp_path, keep=5)
    ckpts.save(1, state(1))
    ckpts.save(2, state(2))
    newest = tmp_path / "step-00000002"
    target = newest / "model.pt"
    if damage == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "delete_file":
        target.unlink()
    elif damage == "delete_manifest":
        (newest / MANIFEST).unlink()
    else:
        (newest / MANIFEST).write_text("{not json")
    with pytest.raises(CorruptCheckpoint):
        ckpts.load(newest)
    info, skipped = ckpts.latest()
    assert info is not None and info.step == 1
    assert [s.step for s in skipped] == [2] and skipped[0].problem
    _, loaded = ckpts.load(info.path)
    assert torch.equal(loaded["model"]["w"], torch.full((64, 64), 1.0))


def test_unhealthy_checkpoint_is_not_restored(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    ckpts.save(1, state(1))
    ckpts.save(2, state(2), healthy=False)
    info, skipped = ckpts.latest()
    assert info is not None and info.step == 1 and skipped[0].problem == "marked unhealthy"


def test_prune_keeps_k_and_newest_healthy(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path, keep=2)
    ckpts.save(1, state(1))
    for step in (2, 3, 4):
        ckpts.save(step, state(step), healthy=False)
    ckpts.prune()
    assert [i.step for i in ckpts.scan()] == [1, 3, 4]


def test_resave_same_step_replaces(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    ckpts.save(3, state(3))
    ckpts.save(3, state(30))
    _, loaded = ckpts.load(tmp_path / "step-00000003")
    assert loaded["model"]["w"][0, 0].item() == 30.0


def test_leftover_temporary_is_ignored_and_cleaned(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    ckpts.save(1, state(1))
    tmp = tmp_path / ".tmp-step-00000002-999"
    tmp.mkdir()
    (tmp / "model.pt").write_bytes(b"partial")
    info, _ = ckpts.latest()
    assert info is not None and info.step == 1
    ckpts.clean_temporaries()
    assert not tmp.exists()


def test_manifest_is_untrusted(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    ckpts.save(1, state(1))
    path = tmp_path / "step-00000001" / MANIFEST
    raw = json.loads(path.read_text())
    raw["files"]["../../etc/passwd.pt"] = raw["files"].pop("model.pt")
    path.write_text(json.dumps(raw))
    with pytest.raises(CorruptCheckpoint, match="invalid file"):
        ckpts.verify(tmp_path / "step-00000001")


def test_pickled_code_is_refused(tmp_path: Path) -> None:
    """A checkpoint file that unpickles arbitrary objects is refused by weights_only loading."""
    ckpts = CheckpointDir(tmp_path)
    ckpts.save(1, {"model": {"w": torch.zeros(2)}})
    folder = tmp_path / "step-00000001"
    evil = folder / "model.pt"
    torch.save({"w": Path("/etc")}, evil)
    import hashlib

    raw = json.loads((folder / MANIFEST).read_text())
    raw["files"]["model.pt"] = {"sha256": hashlib.sha256(evil.read_bytes()).hexdigest(), "bytes": evil.stat().st_size}
    (folder / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(CorruptCheckpoint, match="does not load"):
        ckpts.load(folder)


def test_drop_after(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path, keep=10)
    for step in (1, 2, 3):
        ckpts.save(step, state(step))
    ckpts.drop_after(1)
    assert [i.step for i in ckpts.scan()] == [1]
