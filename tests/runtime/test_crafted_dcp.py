"""A sharded checkpoint whose DCP index (``.metadata``) was rewritten, its manifest hashes made to match.

Whoever can write a checkpoint folder can write its manifest too, so the sha256 of ``.metadata``
proves nothing about what it says. DCP's index names, for each stored item, the file it lives in
and where: only the shard files the manifest lists are ever opened, at offsets inside them, and
``ckpt verify``, a restore and ``ckpt export`` refuse such a checkpoint alike, in one line.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import run_cli
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex
from torch.distributed.checkpoint.state_dict import get_state_dict

from gpufleet.errors import CorruptCheckpoint
from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.runtime.group import Group
from gpufleet.runtime.manifest import DCP_METADATA, MANIFEST, step_dirname
from gpufleet.runtime.sharded import full_state, load_sharded, save_sharded, sharded_candidate

WEIGHT = "model.0.weight"


def save_filled(root: Path, step: int, value: float) -> None:
    """A group of one saves a Linear(4, 3) whose weights all hold ``value``, with Adam and a trainer blob."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(value)
    optimizer = torch.optim.Adam(model.parameters())
    model_sd, optim_sd = get_state_dict(model, [optimizer])
    trainer = io.BytesIO()
    torch.save({"step": step, "data_position": step}, trainer)
    save_sharded(
        CheckpointDir(root, keep=10),
        Group(),
        step,
        {"model": model_sd, "optimizer": optim_sd, "trainer": trainer},
        {"rank": 0},
        healthy=True,
        loss=1.0,
        data_position=step,
        reason="periodic",
        meta={},
        job=None,
        fingerprint=None,
        metrics={},
        strategy="none",
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ck/`` with steps 1 (weights 1.0) and 2 (2.0); ``other/step-00000002``, another job's (weights 7.0)."""
    base = tmp_path_factory.mktemp("crafted")
    save_filled(base / "ck", 1, 1.0)
    save_filled(base / "ck", 2, 2.0)
    save_filled(base / "other", 2, 7.0)
    return base


@pytest.fixture
def setup(pristine: Path, tmp_path: Path) -> Path:
    shutil.copytree(pristine, tmp_path / "base")
    return tmp_path / "base"


def rewrite_index(folder: Path, change: Callable[[Metadata], Any]) -> None:
    """Rewrite DCP's index of ``folder`` as an attacker would, and make the manifest's hashes match it."""
    metadata = pickle.loads((folder / DCP_METADATA).read_bytes())
    replaced = change(metadata)
    data = pickle.dumps(metadata if replaced is None else replaced)
    (folder / DCP_METADATA).write_bytes(data)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][DCP_METADATA] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / MANIFEST).write_text(json.dumps(manifest))


def storage_of(metadata: Metadata, fqn: str) -> _StorageInfo:
    found: _StorageInfo = next(info for index, info in metadata.storage_data.items() if index.fqn == fqn)
    return found


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every path this process opens with ``os.open`` or ``open``, resolved."""
    seen: list[str] = []
    real_os_open, real_open = os.open, io.open

    def os_open(path: Any, *args: Any, **kwargs: Any) -> int:
        folder = kwargs.get("dir_fd")
        base = os.readlink(f"/proc/self/fd/{folder}") if folder is not None else ""
        seen.append(os.path.realpath(os.path.join(base, os.fspath(path))))
        return real_os_open(path, *args, **kwargs)

    def py_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(path, str | Path):
            seen.append(os.path.realpath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr("builtins.open", py_open)
    monkeypatch.setattr(io, "open", py_open)
    yield seen


def only_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# ---- DCP's index names a file outside the manifest -------------------------------------------------------
@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("../../other/step-00000002/__0_0.distcp", "outside the checkpoint"),
        ("{secret}", "outside the checkpoint"),
        ("__1_0.distcp", "not a shard file the manifest lists"),
        ("rank-00000.pt", "not a shard file the manifest lists"),
        (DCP_METADATA, "not a shard file the manifest lists"),
    ],
)
def test_an_index_naming_a_file_outside_the_manifest_is_refused_by_verify_restore_and_export(
    setup: Path,
    opened: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    said: str,
) -> None:
    ck, secret = setup / "ck", setup / "other" / "step-00000002" / "__0_0.distcp"
    step2 = ck / step_dirname(2)
    target = where.replace("{secret}", str(secret))
    if target == "__1_0.distcp":  # on disk, but not in the manifest
        shutil.copyfile(secret, step2 / target)

    def point_elsewhere(metadata: Metadata) -> None:
        storage_of(metadata, WEIGHT).relative_path = target

    rewrite_index(step2, point_elsewhere)
    opened.clear()

    code, out, err = run_cli(capsys, monkeypatch, "ckpt", "verify", str(ck))
    assert code == 1 and err == "", err
    bad = next(line for line in out.splitlines() if "step-00000002" in line)
    assert bad.startswith("BAD") and WEIGHT in bad and said in bad, out
    assert "restore would use step 1" in out

    info, _, skipped = sharded_candidate(CheckpointDir(ck), Group(), before_step=None, expect=None)
    assert info is not None and info.step == 1
    assert [s.step for s in skipped] == [2] and skipped[0].problem is not None and WEIGHT in skipped[0].problem

    model = torch.nn.Linear(4, 3)
    with pytest.raises(CorruptCheckpoint, match=WEIGHT):  # a restore handed the folder directly
        load_sharded(CheckpointDir(ck), Group(), step2, {"model": {"0.weight": model.weight.data}})
    assert not torch.equal(model.weight, torch.full((3, 4), 7.0))

    out_file = setup / "model.pt"
    code, _, err = run_cli(capsys, monkeypatch, "ckpt", "export", str(ck), "--step", "2", "--out", str(out_file))
    assert code == 1 and WEIGHT in only_line(err) and said in err and not out_file.exists()
    code, _, err = run_cli(capsys, monkeypatch, "ckpt", "export", str(ck), "--out", str(out_file))
    assert code == 0, err
    assert torch.equal(torch.load(out_file, weights_only=True)["0.weight"], torch.full((3, 4), 1.0))  # step 1

    assert str(secret.resolve()) not in opened and str((step2 / "__1_0.distcp").resolve()) not in opened


# ---- an index whose content does not describe the shards ---------------------------------------------------
def _as_dict(metadata: Metadata) -> Any:
    return {"state_dict_metadata": metadata.state_dict_metadata}


def _drop_weight_storage(metadata: Metadata) -> None:
    del metadata.storage_data[MetadataIndex(WEIGHT, torch.Size([0, 0]))]


def _grow_weight(metadata: Metadata) -> None:
    item = metadata.state_dict_metadata[WEIGHT]
    item.size = torch.Size([5, 4])  # type: ignore[union-attr]
    item.chunks[0].sizes = torch.Size([5, 4])  # type: ignore[union-attr]


def _size_without_chunks(metadata: Metadata) -> None:
    metadata.state_dict_metadata[WEIGHT].size = torch.Size([3, 4000])  # type: ignore[union-attr]


def _past_the_end(metadata: Metadata) -> None:
    storage_of(metadata, WEIGHT).offset = 10**9


def _transformed(metadata: Metadata) -> None:
    storage_of(metadata, WEIGHT).transform_descriptors = ["zstd"]


def _quantized(metadata: Metadata) -> None:
    metadata.state_dict_metadata[WEIGHT].properties.dtype = torch.qint8  # type: ignore[union-attr]


def _as_bytes(metadata: Metadata) -> None:
    metadata.state_dict_metadata[WEIGHT] = BytesStorageMetadata()


def _into_another_entry(metadata: Metadata) -> None:
    assert metadata.planner_data is not None
    metadata.planner_data[WEIGHT] = ("model", "0.bias", "x")
    metadata.planner_data["model.0.bias"] = ("model", "0.bias")


def _unknown_entry(metadata: Metadata) -> None:
    assert metadata.planner_data is not None
    metadata.planner_data[WEIGHT] = ("elsewhere", "w")


def _huge_list(metadata: Metadata) -> None:
    assert metadata.planner_data is not None
    metadata.planner_data[WEIGHT] = ("model", 10**12)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_as_dict, "holds a dict, not DCP metadata"),
        (_drop_weight_storage, f"stores no data for {WEIGHT!r}"),
        (_grow_weight, f"{WEIGHT!r} is stored as [3, 4]"),
        (_size_without_chunks, f"chunks of {WEIGHT!r} that hold 12 elements"),
        (_past_the_end, "__0_0.distcp, which has"),
        (_transformed, "stream transforms"),
        (_quantized, "dtype torch.qint8"),
        (_as_bytes, f"lists {WEIGHT!r} as bytes, but stores no bytes"),
        (_into_another_entry, "inside it"),
        (_unknown_entry, "'elsewhere'"),
        (_huge_list, "10000000000"),
    ],
)
def test_an_index_that_does_not_describe_the_shards_is_refused_alike_in_one_line(
    setup: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[Metadata], Any],
    said: str,
) -> None:
    ck = setup / "ck"
    rewrite_index(ck / step_dirname(2), change)

    code, out, err = run_cli(capsys, monkeypatch, "ckpt", "verify", str(ck), "--json")
    result = json.loads(out)
    assert code == 1 and err == "" and result["restore_step"] == 1, err
    assert [c["step"] for c in result["corrupt"]] == [2]
    problem = result["corrupt"][0]["problem"]
    assert said in problem and "\n" not in problem, problem

    out_file = setup / "model.pt"
    code, _, err = run_cli(capsys, monkeypatch, "ckpt", "export", str(ck), "--step", "2", "--out", str(out_file))
    assert code == 1 and only_line(err) == f"error: {problem}" and not out_file.exists()

    info, _, skipped = sharded_candidate(CheckpointDir(ck), Group(), before_step=None, expect=None)
    assert info is not None and info.step == 1 and [s.problem for s in skipped] == [problem]
    manifest = CheckpointDir(ck).read_manifest(ck / step_dirname(2))
    with pytest.raises(CorruptCheckpoint) as caught:
        full_state(ck / step_dirname(2), manifest)
    assert str(caught.value) == problem


def test_an_untouched_index_still_verifies_restores_and_exports(
    setup: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = setup / "ck"
    code, out, err = run_cli(capsys, monkeypatch, "ckpt", "verify", str(ck), "--json")
    assert code == 0 and err == "" and json.loads(out)["restore_step"] == 2
    state = full_state(ck / step_dirname(2), CheckpointDir(ck).read_manifest(ck / step_dirname(2)))
    assert torch.equal(state["model"]["0.weight"], torch.full((3, 4), 2.0))
    assert state["trainer"] == {"step": 2, "data_position": 2}
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    load_sharded(CheckpointDir(ck), Group(), ck / step_dirname(2), {"model": model.state_dict()})
