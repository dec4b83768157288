from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpufleet.errors import CheckpointError, CheckpointSpaceError, CorruptCheckpoint, ForeignCheckpoint
from gpufleet.runtime.checkpoint import (
    MANIFEST,
    CheckpointDir,
    Expectation,
    model_fingerprint,
    state_dict_mismatch,
)


def state(step: int) -> dict[str, object]:
    return {"model": {"w": torch.full((64, 64), float(step))}, "trainer": {"step": step}}


def edit_manifest(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = folder / MANIFEST
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


def rehash(folder: Path, name: str) -> None:
    """Make the manifest agree with ``name`` as it is now (a consistent forgery, not a bit flip)."""
    data = (folder / name).read_bytes()

    def change(raw: dict[str, Any]) -> None:
        raw["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}

    edit_manifest(folder, change)


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
    manifest, _ = ckpts.check(tmp_path / "step-00000002")  # intact: unhealthy is not a corruption
    assert manifest.healthy is False and skipped[0].status == "unhealthy"


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
    ckpts.save(3, {**state(3), "model": {"w": torch.full((64, 64), 30.0)}})
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
    edit_manifest(
        tmp_path / "step-00000001",
        lambda raw: raw["files"].update({"../../etc/passwd.pt": raw["files"].pop("model.pt")}),
    )
    with pytest.raises(CorruptCheckpoint, match="invalid file"):
        ckpts.verify(tmp_path / "step-00000001")


def test_pickled_code_is_refused(tmp_path: Path) -> None:
    """A checkpoint file that unpickles arbitrary objects is refused by weights_only loading."""
    ckpts = CheckpointDir(tmp_path)
    ckpts.save(1, {"model": {"w": torch.zeros(2)}})
    folder = tmp_path / "step-00000001"
    torch.save({"w": Path("/etc")}, folder / "model.pt")
    rehash(folder, "model.pt")
    with pytest.raises(CorruptCheckpoint, match="does not load"):
        ckpts.load(folder)
    # ... and `scan(verify=True)`, what `ckpt verify` runs, reaches the same verdict as a restore.
    [info] = ckpts.scan(verify=True)
    assert info.status == "corrupt" and "does not load" in str(info.problem)


def test_drop_after(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path, keep=10)
    for step in (1, 2, 3):
        ckpts.save(step, state(step))
    ckpts.drop_after(1)
    assert [i.step for i in ckpts.scan()] == [1]


# ---- 1. a strict manifest ---------------------------------------------------------------------
STRICT_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "healthy_string": (lambda raw: raw.update(healthy="false"), "healthy"),
    "step_string": (lambda raw: raw.update(step="2"), "step"),
    "loss_string": (lambda raw: raw.update(loss="1.5"), "loss"),
    "negative_bytes": (lambda raw: raw["files"]["model.pt"].update(bytes=-1), "files['model.pt'].bytes"),
    "non_hex_sha": (lambda raw: raw["files"]["model.pt"].update(sha256="Z" * 64), "files['model.pt'].sha256"),
    "unknown_field": (lambda raw: raw.update(restore_me=True), "restore_me"),
    "newer_schema": (lambda raw: raw.update(schema_version=2), "schema_version"),
    "metric_string": (lambda raw: raw.update(metrics={"val_loss": "0.5"}), "metrics.val_loss"),
}


@pytest.mark.parametrize("case", sorted(STRICT_CASES))
def test_mistyped_manifest_field_makes_the_checkpoint_corrupt(tmp_path: Path, case: str) -> None:
    change, field = STRICT_CASES[case]
    ckpts = CheckpointDir(tmp_path, keep=5)
    ckpts.save(1, state(1))
    ckpts.save(2, state(2), healthy=False)
    edit_manifest(tmp_path / "step-00000002", change)
    with pytest.raises(CorruptCheckpoint, match=re.escape(f"manifest field {field}")):
        ckpts.read_manifest(tmp_path / "step-00000002")
    info, skipped = ckpts.latest()
    assert info is not None and info.step == 1 and skipped[0].status == "corrupt"


def test_manifest_written_before_the_new_fields_still_reads(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    ckpts.save(4, state(4), loss=0.25, meta={"attempt": 2})
    folder = tmp_path / "step-00000004"

    def as_written_by_the_first_release(raw: dict[str, Any]) -> None:
        for name in ("job", "fingerprint", "metrics"):
            del raw[name]

    edit_manifest(folder, as_written_by_the_first_release)
    manifest, loaded = ckpts.check(folder)
    assert manifest.loss == 0.25 and manifest.meta == {"attempt": 2} and manifest.job is None and not manifest.metrics
    assert loaded["trainer"] == {"step": 4}


def test_save_records_job_fingerprint_and_finite_metrics(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    model = torch.nn.Linear(3, 2)
    fp = model_fingerprint(model.state_dict())
    ckpts.save(1, state(1), loss=float("nan"), job="7", fingerprint=fp, metrics={"acc": 0.5, "bad": float("inf")})
    raw = json.loads((tmp_path / "step-00000001" / MANIFEST).read_text())
    assert raw["job"] == "7" and raw["fingerprint"] == fp and raw["metrics"] == {"acc": 0.5} and raw["loss"] is None
    with pytest.raises(CheckpointError, match="fingerprint 'abc'"):
        ckpts.save(2, state(2), fingerprint="abc")
    with pytest.raises(CheckpointError, match="manifest field job: Input should be a valid string"):
        ckpts.save(2, state(2), job=7)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="meta must hold JSON values"):
        ckpts.save(2, state(2), meta={"t": torch.zeros(1)})
    assert [i.step for i in ckpts.scan()] == [1]


# ---- 2. links and special files ---------------------------------------------------------------
def test_step_folder_that_is_a_link_is_never_restored(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path / "ck")
    ckpts.save(1, state(1))
    elsewhere = CheckpointDir(tmp_path / "elsewhere")
    elsewhere.save(2, state(2))
    link = tmp_path / "ck" / "step-00000002"
    link.symlink_to(tmp_path / "elsewhere" / "step-00000002")
    info, skipped = ckpts.latest()
    assert info is not None and info.step == 1
    assert skipped[0].path == link and "is a symbolic link" in str(skipped[0].problem)
    with pytest.raises(CorruptCheckpoint, match="is a symbolic link"):
        ckpts.load(link)
    ckpts.prune()
    ckpts.drop_after(0)
    assert (tmp_path / "elsewhere" / "step-00000002" / "model.pt").exists()  # never deleted through the link


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["dev_zero_link", "fifo", "fifo_manifest", "directory", "huge_manifest"])
def test_special_files_are_corrupt_not_a_hang(tmp_path: Path, kind: str) -> None:
    ckpts = CheckpointDir(tmp_path, keep=5)
    ckpts.save(1, state(1))
    ckpts.save(2, state(2))
    folder = tmp_path / "step-00000002"
    target = folder / ("manifest.json" if kind == "fifo_manifest" else "model.pt")
    target.unlink()
    if kind == "dev_zero_link":
        target.symlink_to("/dev/zero")
        expected = "symbolic link"
    elif kind in ("fifo", "fifo_manifest"):
        os.mkfifo(target)
        expected = "not a regular file"
    elif kind == "directory":
        target.mkdir()
        expected = "not a regular file"
    else:
        (folder / MANIFEST).write_text(json.dumps({"step": 2}) + " " * (2 << 20))
        expected = "more than"
    with pytest.raises(CorruptCheckpoint, match=expected):
        ckpts.check(folder)
    info, skipped = ckpts.latest()
    assert info is not None and info.step == 1 and expected in str(skipped[0].problem)


# ---- 3. one function decides ------------------------------------------------------------------
def test_manifest_step_must_match_the_trainer_state(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path, keep=5)
    ckpts.save(20, state(20))
    (tmp_path / "step-00000020").rename(tmp_path / "step-00000060")
    edit_manifest(tmp_path / "step-00000060", lambda raw: raw.update(step=60))
    with pytest.raises(CorruptCheckpoint, match=re.escape("manifest says step 60, trainer.pt holds step 20")):
        ckpts.check(tmp_path / "step-00000060")
    assert ckpts.latest()[0] is None


def test_removed_object_with_rewritten_manifest_is_caught(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    full = {
        "model": {"w": torch.ones(4)},
        "optimizer": {"state": {}},
        "trainer": {"step": 5, "objects": ["model", "optimizer", "trainer"]},
    }
    ckpts.save(5, full)
    folder = tmp_path / "step-00000005"
    (folder / "optimizer.pt").unlink()
    edit_manifest(folder, lambda raw: raw["files"].pop("optimizer.pt"))
    with pytest.raises(CorruptCheckpoint, match=re.escape("no optimizer.pt")):
        ckpts.check(folder)


def test_expectation_refuses_another_jobs_checkpoint(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path, keep=5)
    ckpts.save(1, state(1), job="9")
    ckpts.save(2, state(2), job="7")
    ckpts.save(3, state(3))  # written before jobs were recorded: not refused
    expect = Expectation(job="9")
    with pytest.raises(ForeignCheckpoint, match="written by job 7, this is job 9"):
        ckpts.check(tmp_path / "step-00000002", expect=expect)
    ckpts.check(tmp_path / "step-00000002")  # intact: only the expectation refuses it
    info, _ = ckpts.latest(before_step=3, expect=expect)
    assert info is not None and info.step == 1
    statuses = [i.status for i in ckpts.scan(verify=True, expect=expect)]
    assert statuses == ["ok", "foreign", "ok"]


def test_expectation_requires_every_object(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    ckpts.save(1, state(1))
    with pytest.raises(ForeignCheckpoint, match=re.escape("has no optimizer.pt")):
        ckpts.load(tmp_path / "step-00000001", expect=Expectation(objects=frozenset({"model", "optimizer"})))


def test_restore_candidate_returns_state_loaded_once_and_skips_newer(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path, keep=5)
    for step in (1, 2, 3):
        ckpts.save(step, state(step), healthy=step != 3)
    (tmp_path / "step-00000002" / "model.pt").write_bytes(b"garbage")
    info, manifest, loaded, skipped = ckpts.restore_candidate()
    assert info is not None and manifest is not None and loaded is not None
    assert info.step == manifest.step == 1 and loaded["trainer"] == {"step": 1}
    assert [(s.step, s.status) for s in skipped] == [(3, "unhealthy"), (2, "corrupt")]
    assert ckpts.restore_candidate(before_step=1) == (None, None, None, [])


# ---- 4. fingerprints --------------------------------------------------------------------------
def test_fingerprint_names_the_architecture_not_the_weights() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    assert model_fingerprint(a.state_dict()) == model_fingerprint(b.state_dict())
    assert model_fingerprint(dict(reversed(a.state_dict().items()))) == model_fingerprint(a.state_dict())
    assert model_fingerprint(torch.nn.Linear(8, 5).state_dict()) != model_fingerprint(a.state_dict())
    assert len(model_fingerprint(a.state_dict())) == 64


def test_state_dict_mismatch_lists_what_differs() -> None:
    saved = {"head.weight": torch.zeros(65, 128), "old.bias": torch.zeros(3)}
    current = {f"blocks.{i}.attn.weight": torch.zeros(2) for i in range(5)} | {"head.weight": torch.zeros(65, 256)}
    message = state_dict_mismatch(saved, current)
    assert "missing 5: blocks.0.attn.weight, blocks.1.attn.weight, blocks.2.attn.weight (+2 more)" in message
    assert "unexpected 1: old.bias" in message
    assert "shape of head.weight is [65, 128] in the checkpoint, [65, 256] in the model" in message


# ---- 5. a full disk ---------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root and permission to mount); unmounted afterwards."""
    mount = tmp_path / "small"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small filesystem")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here ({proc.stderr.decode().strip() or proc.returncode})")
    try:
        yield mount
    finally:
        for _ in range(10):
            if subprocess.run(["umount", str(mount)], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)


def test_full_disk_keeps_earlier_checkpoints_on_a_real_tmpfs(small_disk: Path) -> None:
    ckpts = CheckpointDir(small_disk / "ck")
    ckpts.save(1, state(1))
    big = {"model": {"w": torch.zeros(512 * 1024)}, "trainer": {"step": 2}}  # 2 MiB of floats
    with pytest.raises(CheckpointSpaceError, match=f"no space left on {small_disk / 'ck'}") as caught:
        ckpts.save(2, big)
    err = caught.value
    assert err.needed > 2 * 1024 * 1024 and err.free < 1024 * 1024 and err.path == small_disk / "ck"
    assert f"{err.needed} bytes needed, {err.free} free" in str(err)
    assert sorted(p.name for p in (small_disk / "ck").iterdir()) == ["step-00000001"]
    info, skipped = ckpts.latest()
    assert info is not None and info.step == 1 and not skipped


def test_full_disk_injected_in_the_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpts = CheckpointDir(tmp_path / "ck")
    ckpts.save(1, state(1))
    before = {p.name: p.read_bytes() for p in (tmp_path / "ck" / "step-00000001").iterdir()}

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", full)
        with pytest.raises(CheckpointSpaceError) as caught:
            ckpts.save(1, state(2))  # a re-save of the same step: the old one must survive too
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000001"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "ck" / "step-00000001").iterdir()} == before
    exact = CheckpointDir(tmp_path / "other").save(1, state(2)).total_bytes
    assert caught.value.needed == exact


# ---- 6. keep_best -----------------------------------------------------------------------------
def test_keep_best_survives_many_prunes(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path, keep=2, keep_best=("val_loss", "min"))
    losses = {step: 1.0 + abs(step - 4) * 0.1 for step in range(1, 15)}
    for step, loss in losses.items():
        healthy = step != 6
        metric = 0.1 if step == 6 else loss  # an unhealthy step never counts as the best
        ckpts.save(step, state(step), healthy=healthy, metrics={"val_loss": metric})
        ckpts.prune()
    assert [i.step for i in ckpts.scan(verify=False)] == [4, 13, 14]
    best = CheckpointDir(tmp_path, keep=1, keep_best=("val_loss", "max"))
    best.prune()
    assert [i.step for i in ckpts.scan(verify=False)] == [14]
    with pytest.raises(ValueError, match="'min' or 'max'"):
        CheckpointDir(tmp_path, keep_best=("val_loss", "lowest"))
