"""What may be read from a sharded (DCP) checkpoint, and the readers that read only that.

DCP's ``.metadata`` is its index: for every item of the state, which file holds it and where
(``_StorageInfo.relative_path``, ``offset``, ``length``). DCP's own reader ``pickle.load``-s that
file and opens ``<folder>/<relative_path>`` for whatever it names, ``../other-job/...`` or
``/abs/...`` included. The manifest lists ``.metadata`` with its sha256, but whoever can write the
folder can write the manifest too: a crafted ``.metadata`` could otherwise point DCP at any file,
or run code as it is unpickled. So nothing of a dcp checkpoint is read before this module has
checked it, and what it guarantees is:

- **Nothing is read that the manifest does not list.** ``read_index`` reads ``.metadata`` only as
  the manifest lists it (a regular file of its size and sha256) and unpickles it with an
  allow-list of DCP's metadata classes; ``VerifiedReader`` opens, at each read, only the shard
  files the manifest lists, regular (never through a link) and of their size (``_ListedShards``).
- **Every storage entry names a listed shard, within its size.** A plain file name, never a path,
  at a byte range inside that shard, with no stream transform (DCP writes none).
- **Chunks cover their tensors.** Every tensor's chunks lie inside its size, cover it, are stored,
  and fit their bytes; every entry has a place in the state (``planner_data``) under an entry the
  manifest lists, and no place lies inside another. ``check_stored_tensors`` then reads each
  stored chunk's header (not its data) to check that the shards hold that shape and dtype.
- **Non-tensor entries load with ``weights_only=True``** (``SafeLoadPlanner``, ``SafeFullPlanner``),
  where DCP's default planners would use ``weights_only=False``.

Whatever breaks a rule is a ``CorruptCheckpoint`` naming the first entry that does, in one line.
``ckpt verify`` and a restore (``CheckpointDir.check``), ``sharded.load_sharded`` and ``ckpt export``
(``sharded.full_state``) all go through these checks; writing and committing live in ``sharded``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import pickle
import re
import warnings
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any, TypeGuard

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.utils import _create_file_view

from gpufleet.errors import CorruptCheckpoint
from gpufleet.runtime.manifest import DCP_METADATA, CheckpointManifest, open_folder, open_regular, read_regular

# ---- the index: DCP's .metadata, checked against the manifest -------------------------------------
_METADATA_CLASSES = frozenset(
    {
        *(
            ("torch.distributed.checkpoint.metadata", name)
            for name in (
                "Metadata",
                "MetadataIndex",
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "TensorStorageMetadata",
                "TensorProperties",
                "StorageMeta",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("collections", "OrderedDict"),
        *((module, name) for module in ("pathlib", "pathlib._local") for name in ("PosixPath", "PurePosixPath")),
    }
)
"""What DCP's ``.metadata`` pickle may name (torch 2.13): its dataclasses, sizes, dtypes, the checkpoint path."""
_QUANTIZED = frozenset(
    getattr(torch, n) for n in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4") if hasattr(torch, n)
)
"""Dtypes DCP never saves a chunk of (and ``torch.empty`` warns about): an index naming one is not DCP's."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


class _Refused(Exception):
    """Why DCP's index does not describe the checkpoint its manifest lists (a phrase after ``.metadata``)."""


def read_index(path: Path, manifest: CheckpointManifest, *, folder: int | None = None) -> Metadata:
    """DCP's index (``.metadata``) of the checkpoint at ``path``, only if it describes what the manifest lists.

    The manifest's sha256 of ``.metadata`` proves only that the file is the one the manifest names,
    and whoever wrote the folder wrote the manifest too; so the *content* is checked as well. The
    pickle is loaded with an allow-list of DCP's classes; every storage entry must name a shard
    file the manifest lists (a plain name, never a path: ``../x`` or ``/x`` would read another
    job's files) at a byte range inside it, with no stream transform; every tensor's chunks must
    lie inside its size, cover it, be stored and fit their bytes; every entry must have a place in
    the state (``planner_data``) under an entry the manifest lists, and no place inside another.
    Raises ``CorruptCheckpoint`` naming the first entry that does not. ``folder``: the open folder.
    """
    entry = manifest.files.get(DCP_METADATA)
    if entry is None:
        raise CorruptCheckpoint(f"{path}: the manifest lists no {DCP_METADATA}")
    fd = open_folder(path) if folder is None else folder
    try:
        data = read_regular(fd, DCP_METADATA, path, size=entry.bytes)
    finally:
        if folder is None:
            os.close(fd)
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise CorruptCheckpoint(f"{path}: {DCP_METADATA} fails its sha256 check")
    try:
        with quiet_torch():
            metadata: Metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
        raise CorruptCheckpoint(f"{path}: {DCP_METADATA} does not load ({one_line(str(err))})") from None
    try:
        _check_index(metadata, manifest)
    except _Refused as err:
        raise CorruptCheckpoint(f"{path}: {DCP_METADATA} {err}; delete this checkpoint") from None
    except Exception as err:  # noqa: BLE001 - a value of a type no check expected: not DCP's index either
        why = one_line(f"{type(err).__name__}: {err}")
        raise CorruptCheckpoint(f"{path}: {DCP_METADATA} does not describe DCP shards ({why})") from None
    return metadata


def _check_index(metadata: Any, manifest: CheckpointManifest) -> None:
    if type(metadata) is not Metadata:
        raise _Refused(f"holds a {type(metadata).__name__}, not DCP metadata")
    entries, storage = getattr(metadata, "state_dict_metadata", None), getattr(metadata, "storage_data", None)
    if not isinstance(entries, dict) or not entries:
        raise _Refused("lists no state entries")
    if not isinstance(storage, dict):
        raise _Refused("has no table of where each entry is stored")
    shards = _shard_sizes(manifest)
    for index, info in storage.items():
        _check_storage(index, info, shards)
    for fqn, item in entries.items():
        _check_entry(fqn, item, storage)
    _check_places(getattr(metadata, "planner_data", None), entries, manifest.entries)
    if not isinstance(getattr(metadata, "storage_meta", None), StorageMeta | None):
        raise _Refused(f"has a storage_meta of type {type(metadata.storage_meta).__name__}")


def _shard_sizes(manifest: CheckpointManifest) -> dict[str, int]:
    """The shard files (``__<rank>_<n>.distcp``) the manifest lists, and their sizes."""
    return {name: entry.bytes for name, entry in manifest.files.items() if name.endswith(".distcp")}


def _check_storage(index: Any, info: Any, shards: Mapping[str, int]) -> None:
    if type(index) is not MetadataIndex or not isinstance(index.fqn, str):
        raise _Refused(f"has a storage key {_shown(index)}, not DCP's")
    fqn = _shown(index.fqn)
    if type(info) is not _StorageInfo:
        raise _Refused(f"stores {fqn} as a {type(info).__name__}, not DCP's storage entry")
    name = getattr(info, "relative_path", None)
    if not isinstance(name, str) or name not in shards:
        outside = not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", "..")
        what = "a path outside the checkpoint" if outside else "not a shard file the manifest lists"
        raise _Refused(f"stores {fqn} in {_shown(name)}, {what}; only {_listed(shards)} may be read")
    offset, length = getattr(info, "offset", None), getattr(info, "length", None)
    if not _is_count(offset) or not _is_count(length) or offset + length > shards[name]:
        raise _Refused(f"stores {fqn} at bytes {_shown(offset)}+{_shown(length)} of {name}, which has {shards[name]}")
    if getattr(info, "transform_descriptors", None):
        raise _Refused(f"stores {fqn} through stream transforms {_shown(info.transform_descriptors)}, never written")


def _check_entry(fqn: Any, item: Any, storage: Mapping[Any, Any]) -> None:
    if not isinstance(fqn, str):
        raise _Refused(f"names an entry {_shown(fqn)}, not a string")
    if type(item) is BytesStorageMetadata:
        if MetadataIndex(fqn) not in storage:
            raise _Refused(f"lists {fqn!r} as bytes, but stores no bytes for it")
        return
    if type(item) is not TensorStorageMetadata:
        raise _Refused(f"describes {fqn!r} as a {type(item).__name__}")
    dtype = getattr(getattr(item, "properties", None), "dtype", None)
    if not isinstance(dtype, torch.dtype) or dtype in _QUANTIZED:
        raise _Refused(f"gives {fqn!r} the dtype {_shown(dtype)}, not one DCP saves")
    size, chunks = getattr(item, "size", None), getattr(item, "chunks", None)
    if not _is_shape(size) or not isinstance(chunks, list):
        raise _Refused(f"gives {fqn!r} the size {_shown(size)} and chunks {_shown(chunks)}")
    held = sum(_check_chunk(fqn, chunk, size, dtype, storage) for chunk in chunks)
    if held != math.prod(size):
        raise _Refused(f"has chunks of {fqn!r} that hold {held} elements, not the {math.prod(size)} of {list(size)}")


def _check_chunk(fqn: str, chunk: Any, size: torch.Size, dtype: torch.dtype, storage: Mapping[Any, Any]) -> int:
    """One chunk of a tensor: inside its size (DCP's own rule on save), stored, in enough bytes; its element count."""
    offsets, sizes = getattr(chunk, "offsets", None), getattr(chunk, "sizes", None)
    inside = (
        type(chunk) is ChunkStorageMetadata
        and _is_shape(offsets)
        and _is_shape(sizes)
        and len(offsets) == len(sizes) == len(size)
        and all(o + n <= d for o, n, d in zip(offsets, sizes, size, strict=True))
    )
    if not inside or not _is_shape(offsets) or not _is_shape(sizes):
        raise _Refused(f"has a chunk of {fqn!r} ({_shown(chunk)}) outside its size {list(size)}")
    info = storage.get(MetadataIndex(fqn, offsets))
    if info is None:
        raise _Refused(f"stores no data for {fqn!r} at {list(offsets)}")
    if math.prod(sizes) * dtype.itemsize > info.length:
        raise _Refused(f"gives a chunk of {fqn!r} {list(sizes)} {dtype} elements, in {info.length} bytes")
    return math.prod(sizes)


def _check_places(places: Any, entries: Mapping[str, Any], top: list[str] | None) -> None:
    """Each entry's place in the state (``planner_data``): names and list positions, under a listed entry."""
    if not isinstance(places, dict):
        raise _Refused("does not say where each entry goes in the state (planner_data)")
    seen: set[tuple[str | int, ...]] = set()
    for fqn in entries:
        place = places.get(fqn)
        if not (isinstance(place, tuple) and place and isinstance(place[0], str)) or not all(
            type(p) is str or (type(p) is int and 0 <= p < len(entries)) for p in place
        ):
            raise _Refused(f"places {fqn!r} at {_shown(place)}, not a path of names and list positions")
        if top is not None and place[0] not in top:
            raise _Refused(f"places {fqn!r} under {place[0]!r}, an entry the manifest does not list")
        seen.add(place)
    for place in seen:
        inside = next((place[:cut] for cut in range(1, len(place)) if place[:cut] in seen), None)
        if inside is not None:
            raise _Refused(f"places an entry at {_shown(inside)} and another inside it, at {_shown(place)}")


def _listed(shards: Mapping[str, int]) -> str:
    names = sorted(shards)
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more if names else "no shard file"


def _is_count(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _is_shape(value: object) -> TypeGuard[torch.Size]:
    return type(value) is torch.Size and all(_is_count(d) for d in value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


# ---- the shards: each stored chunk's header ----------------------------------------------------
def check_stored_tensors(folder: int, path: Path, manifest: CheckpointManifest, metadata: Metadata) -> None:
    """Each tensor chunk the index lists is stored, at its place, as a tensor of that shape and dtype.

    ``read_index`` checks what the index says; this checks that the shards say the same, reading
    only each stored chunk's header (``torch.load`` onto the meta device, ``weights_only``: a few
    kilobytes, no tensor data), so ``ckpt verify`` and a restore refuse a checkpoint whose tensors
    would not load, as ``ckpt export`` and a load do. Blobs are left to the loads: raw bytes are valid.
    """
    shards = _shard_sizes(manifest)
    wanted: dict[str, list[tuple[int, int, str, TensorStorageMetadata, ChunkStorageMetadata]]] = {}
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            for chunk in item.chunks:
                info = metadata.storage_data[MetadataIndex(fqn, chunk.offsets)]
                wanted.setdefault(info.relative_path, []).append((info.offset, info.length, fqn, item, chunk))
    for name, chunks in sorted(wanted.items()):
        with os.fdopen(open_regular(folder, name, path, size=shards[name]), "rb") as stream:
            for offset, length, fqn, item, chunk in sorted(chunks, key=lambda c: c[0]):
                _check_stored(path, name, _create_file_view(stream, offset, length), fqn, item, chunk)


def _check_stored(
    path: Path, name: str, view: Any, fqn: str, item: TensorStorageMetadata, chunk: ChunkStorageMetadata
) -> None:
    try:
        with quiet_torch():
            stored = torch.load(view, map_location="meta", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
        why = one_line(f"{type(err).__name__}: {err}")
        raise CorruptCheckpoint(
            f"{path}: the chunk of {fqn!r} at {list(chunk.offsets)} in {name} does not load ({why})"
        ) from None
    if not isinstance(stored, torch.Tensor):
        raise CorruptCheckpoint(f"{path}: {name} holds a {type(stored).__name__} where {fqn!r} is stored, not a tensor")
    if stored.shape != chunk.sizes or stored.dtype != item.properties.dtype:
        raise CorruptCheckpoint(
            f"{path}: {DCP_METADATA} gives a chunk of {fqn!r} {list(chunk.sizes)} {item.properties.dtype} elements; "
            f"{fqn!r} is stored as {list(stored.shape)} {stored.dtype} in {name}; delete this checkpoint"
        )


# ---- the readers: only the listed shards, non-tensor entries with weights_only ------------------
class _ListedShards(FileSystem):
    """DCP's local file system for reading: only the shard files the manifest lists, regular, of their size.

    DCP opens ``<folder>/<relative_path>`` for each item its index names; the index is checked
    against the manifest first (``read_index``), and this is the same rule once more, at the open.
    """

    def __init__(self, folder: Path, sizes: Mapping[str, int]) -> None:
        super().__init__()
        self._folder = folder
        self._sizes = dict(sizes)

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        target = Path(path)
        if mode != "rb" or target.parent != self._folder or target.name not in self._sizes:
            raise CorruptCheckpoint(f"{target}: not a shard file the manifest of {self._folder} lists; not read")
        folder = open_folder(self._folder)
        try:
            fd = open_regular(folder, target.name, self._folder, size=self._sizes[target.name])
        finally:
            os.close(folder)
        with os.fdopen(fd, "rb") as stream:
            yield stream


class VerifiedReader(FileSystemReader):
    """``FileSystemReader`` over an index ``read_index`` checked, opening only the shards the manifest lists."""

    def __init__(self, path: Path, manifest: CheckpointManifest, metadata: Metadata) -> None:
        super().__init__(path)
        self.fs = _ListedShards(Path(path), _shard_sizes(manifest))
        self._where = Path(path)
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # DCP's fallback to per-rank metadata, which gpufleet never writes
            raise CorruptCheckpoint(f"{self._where}: no per-rank metadata in a gpufleet checkpoint")
        metadata = self._metadata
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def load_plain(value: io.BytesIO) -> Any:
    """A non-tensor entry DCP stored (``torch.save``), with ``weights_only``; a blob comes back as ``io.BytesIO``."""
    value.seek(0)
    with torch.serialization.safe_globals([io.BytesIO]):
        return torch.load(value, map_location="cpu", weights_only=True)


def _put_plain(planner: DefaultLoadPlanner, read_item: ReadItem, value: io.BytesIO) -> None:
    """Where DCP's planners put a non-tensor entry, loaded with ``weights_only=True`` instead of a pickle."""
    loaded = load_plain(value)
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], loaded)
    else:
        planner.state_dict[read_item.dest_index.fqn] = loaded


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor entries are loaded with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _put_plain(self, read_item, value)


class SafeFullPlanner(_EmptyStateDictLoadPlanner):
    """DCP's planner that rebuilds the whole state from the metadata (export), loading with ``weights_only``."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _put_plain(self, read_item, value)


# ---- helpers -------------------------------------------------------------------------------------
@contextlib.contextmanager
def quiet_torch() -> Generator[None, None, None]:
    """torch's warnings about its own internals, silenced around the calls into torch and DCP.

    DCP warns that it runs "in a single process" when there is no process group (intended here);
    ``torch.load`` warns about storages and dtypes of what it reads. They name torch's files, not
    the checkpoint: whatever matters is refused with a message of ours (``CorruptCheckpoint``).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


_CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """The first line of ``text``, without terminal escapes (torch colours some messages), at most 300 characters."""
    lines = text.strip().splitlines()
    return _CONTROL.sub("", lines[0] if lines else "")[:300]


__all__ = [
    "SafeFullPlanner",
    "SafeLoadPlanner",
    "VerifiedReader",
    "check_stored_tensors",
    "load_plain",
    "one_line",
    "quiet_torch",
    "read_index",
]
