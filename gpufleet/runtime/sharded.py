"""Checkpoints of a distributed job: every rank writes its shards, rank 0 commits; any world size restores.

Built on ``torch.distributed.checkpoint`` (DCP), so an FSDP2 (``fully_shard``) or DDP job saved by N
ranks restores on M ranks (DCP reshards), one process included (``Group()``: DCP runs without a
process group). Layout, beside the single-process checkpoints of the same directory::

    <dir>/step-00000150/
        .metadata  __0_0.distcp  __1_0.distcp ...   DCP's FileSystemWriter: its index and one file per rank
        rank-00000.pt  rank-00001.pt ...            each rank's private state (RNG states), torch.save
        manifest.json                               format "dcp", world_size, every file's sha256 and size

A save (``save_sharded``, every rank calls it):

1. Every rank checks the manifest fields (a bad value costs no I/O); rank 0 creates
   ``.tmp-step-<n>-dcp-<nonce>/`` and every rank learns its name (one ``gather``, which also
   carries any rank's refusal, so all ranks raise together).
2. DCP writes the shards and ``.metadata`` there, through a ``FileSystemWriter`` whose streams
   hash (sha256, in a helper thread) and count the bytes *while* they are written, and fsync each
   file; each rank then writes its ``rank-<r>.pt`` the same way. Each rank's names, digests and
   sizes are gathered to rank 0 (the ``gather`` is the barrier after the writes).
3. Rank 0 checks each file's size on disk, hashes any file of the folder that no rank reported by
   reading it back (none with torch 2.13's writer; the fallback keeps a future writer's extra file
   from going unverified), writes ``manifest.json`` (fsync), fsyncs the folder, renames it to
   ``step-<n>/`` (fsync of the parent), and prunes. Its ``broadcast`` of the manifest is the barrier
   after the commit: every rank returns the same manifest, or raises the same error.

A folder without a complete, valid manifest is never restored. A restore (``sharded_candidate``)
is decided by rank 0 alone, with ``CheckpointDir.restore_candidate``: the newest checkpoint whose
manifest parses and whose every file has the right size and sha256 (shards hashed in chunks), whose
DCP index holds what the manifest lists (``read_index``, below), and healthy; rank 0 broadcasts the
verdict. ``load_sharded`` then has each rank re-check its own ``rank-<r>.pt`` against the manifest
and load it with ``weights_only=True``, and DCP load its part of the shards, with a planner that
loads DCP's non-tensor entries with ``torch.load(weights_only=True)`` (DCP's own would use
``weights_only=False``).

Nothing is read that the manifest does not list. DCP's ``.metadata`` says, for every item, which
file holds it and where (``_StorageInfo.relative_path``, ``offset``, ``length``), and DCP's reader
would open any path it names, ``../other-job/...`` or ``/abs/...`` included; the manifest lists
``.metadata`` with its sha256, but whoever can write the folder can write the manifest too. So
``read_index`` checks the sha256, unpickles with an allow-list of DCP's metadata classes (DCP's own
reader would ``pickle.load`` it), and then checks the content against the manifest: each item in a
listed shard, at a byte range inside it; ``check_stored_tensors`` reads each tensor's header from
the shards (not its data) to check shape and dtype. ``ckpt verify``, a restore and ``ckpt export``
all go through both, and DCP reads through a file system that opens only the listed shards, never
through a link.

A full disk, on any rank, is a ``CheckpointSpaceError`` on every rank, and the temporary folder is
removed: every earlier checkpoint stays as it was. ``needed`` is an estimate there (the bytes of
the tensors and blobs each rank holds; DCP writes replicated DDP tensors once), not the exact size
the single-process save measures.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import pickle
import re
import shutil
import stat
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Collection, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeGuard

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.utils import _create_file_view

from gpufleet.errors import CheckpointError, CheckpointSpaceError, CorruptCheckpoint
from gpufleet.runtime.checkpoint import (
    NO_SPACE_ERRNOS,
    CheckpointDir,
    CheckpointInfo,
    HashingWriter,
    format_problem,
    fsync_dir,
    is_no_space,
    manifest_header,
    torch_crc32_off,
    write_durably,
)
from gpufleet.runtime.group import Group
from gpufleet.runtime.manifest import (
    DCP_METADATA,
    MANIFEST,
    CheckpointManifest,
    Expectation,
    FileEntry,
    Format,
    hash_regular,
    open_folder,
    open_regular,
    rank_filename,
    read_regular,
    step_dirname,
)

DCP_ONLY: tuple[Format, ...] = ("dcp",)


# ---- writing: DCP's files, hashed as they are written ------------------------------------------
class _HashedStream(HashingWriter):
    """A file DCP writes: hashed while written (``HashingWriter``), fsynced and reported on close.

    DCP asks its streams for ``tell()`` (the offset of each item: here the bytes written, as the
    stream only appends) and ``fileno()`` (to fsync). It never seeks back, so the digest is of the
    file's final bytes.
    """

    def __init__(self, path: Path, pool: ThreadPoolExecutor, done: Callable[[str, str, int], None]) -> None:
        super().__init__(path, pool)
        self._name = path.name
        self._done = done
        self._abandoned = False

    def tell(self) -> int:
        return self.bytes

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("I/O operation on closed file")
        return self._fd

    def abandon(self) -> None:
        """Close without reporting: the write failed, the file is not part of any checkpoint."""
        self._abandoned = True
        self.close()

    def close(self) -> None:
        try:
            if self._fd >= 0 and not self._abandoned and not self.closed:
                digest = self.finish()  # fsync, close, digest
                self._done(self._name, digest, self.bytes)
        finally:
            super().close()


class _HashingFileSystem(FileSystem):
    """DCP's local file system, with every file it creates hashed and sized as it is written."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        super().__init__()
        self._pool = pool
        self._lock = threading.Lock()
        self.written: dict[str, tuple[str, int]] = {}
        """File name -> (sha256, bytes), of the files closed so far (renames followed)."""
        self.errors: list[OSError] = []

    def _record(self, name: str, digest: str, size: int) -> None:
        with self._lock:
            self.written[name] = (digest, size)

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = _HashedStream(Path(path), self._pool, self._record)
        try:
            yield stream
        except BaseException:
            if stream.error is not None:
                self.errors.append(stream.error)
            stream.abandon()
            raise
        stream.close()

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)  # .metadata.tmp -> .metadata
        with self._lock:
            moved = self.written.pop(Path(path).name, None)
            if moved is not None:
                self.written[Path(new_path).name] = moved

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        super().rm_file(path)
        with self._lock:
            self.written.pop(Path(path).name, None)


class _RecordingWriter(FileSystemWriter):
    """``FileSystemWriter`` (one ``__<rank>_0.distcp`` per rank, fsynced) through ``_HashingFileSystem``."""

    def __init__(self, path: Path, pool: ThreadPoolExecutor) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1, overwrite=False)
        self.recorder = _HashingFileSystem(pool)
        self.fs = self.recorder


# ---- reading: DCP's index checked against the manifest, only the listed shards opened ---------------
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
        with _quiet_torch():
            metadata: Metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
        raise CorruptCheckpoint(f"{path}: {DCP_METADATA} does not load ({_one_line(str(err))})") from None
    try:
        _check_index(metadata, manifest)
    except _Refused as err:
        raise CorruptCheckpoint(f"{path}: {DCP_METADATA} {err}; delete this checkpoint") from None
    except Exception as err:  # noqa: BLE001 - a value of a type no check expected: not DCP's index either
        why = _one_line(f"{type(err).__name__}: {err}")
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
        with _quiet_torch():
            stored = torch.load(view, map_location="meta", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
        why = _one_line(f"{type(err).__name__}: {err}")
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


class _VerifiedReader(FileSystemReader):
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


def _load_plain(value: io.BytesIO) -> Any:
    """A non-tensor entry DCP stored (``torch.save``), with ``weights_only``; a blob comes back as ``io.BytesIO``."""
    value.seek(0)
    with torch.serialization.safe_globals([io.BytesIO]):
        return torch.load(value, map_location="cpu", weights_only=True)


class _SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor entries are loaded with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = _load_plain(value)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class _SafeFullPlanner(_EmptyStateDictLoadPlanner):
    """DCP's planner that rebuilds the whole state from the metadata (export), loading with ``weights_only``."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = _load_plain(value)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


@contextlib.contextmanager
def _quiet_torch() -> Generator[None, None, None]:
    """torch's warnings about its own internals, silenced around the calls into torch and DCP.

    DCP warns that it runs "in a single process" when there is no process group (intended here);
    ``torch.load`` warns about storages and dtypes of what it reads. They name torch's files, not
    the checkpoint: whatever matters is refused with a message of ours (``CorruptCheckpoint``).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ---- helpers -------------------------------------------------------------------------------------
def _first_failure(err: BaseException) -> BaseException:
    if isinstance(err, CheckpointException) and err.failures:
        return next(iter(err.failures.values()))[0]
    return err


def _describe(err: BaseException) -> str:
    """One line for an error, unwrapping DCP's ``CheckpointException`` (one traceback per rank)."""
    first = _first_failure(err)
    if isinstance(first, CheckpointError):
        return str(first)
    return _one_line(f"{type(first).__name__}: {str(first).strip()}").rstrip(": ")


_CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x1f\x7f]")


def _one_line(text: str) -> str:
    """The first line of ``text``, without terminal escapes (torch colours some messages), at most 300 characters."""
    lines = text.strip().splitlines()
    return _CONTROL.sub("", lines[0] if lines else "")[:300]


def _out_of_space(err: BaseException, seen: list[OSError]) -> bool:
    failures = [f[0] for f in err.failures.values()] if isinstance(err, CheckpointException) else [err]
    if any(e.errno in NO_SPACE_ERRNOS for e in seen):
        return True
    return any(isinstance(f, Exception) and is_no_space(f, None) for f in failures) or "No space left" in str(err)


def _state_bytes(value: Any) -> int:
    """About what saving ``value`` writes: its tensors' bytes (a DTensor's local shard) and blobs."""
    if isinstance(value, torch.Tensor):
        to_local = getattr(value, "to_local", None)
        local = to_local() if callable(to_local) else value
        return int(local.numel() * local.element_size())
    if isinstance(value, io.BytesIO):
        return value.getbuffer().nbytes
    if isinstance(value, Mapping):
        return sum(_state_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_state_bytes(v) for v in value)
    return 0


def _write_rank_file(path: Path, rank_state: Mapping[str, Any], pool: ThreadPoolExecutor) -> FileEntry:
    writer = HashingWriter(path, pool)
    try:
        with torch_crc32_off():
            torch.save(dict(rank_state), writer)  # type: ignore[arg-type]
        digest = writer.finish()
    except Exception:
        if writer.error is not None and writer.error.errno in NO_SPACE_ERRNOS:
            raise writer.error from None  # torch may have wrapped it
        raise
    finally:
        writer.close()
    return FileEntry(sha256=digest, bytes=writer.bytes)


def _read_rank_file(path: Path, manifest: CheckpointManifest, rank: int) -> dict[str, Any]:
    name = rank_filename(rank)
    entry = manifest.files.get(name)
    if entry is None:
        raise CorruptCheckpoint(f"{path}: the manifest lists no {name}")
    folder = open_folder(path)
    try:
        data = read_regular(folder, name, path, size=entry.bytes)
    finally:
        os.close(folder)
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise CorruptCheckpoint(f"{path}: {name} fails its sha256 check")
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
        raise CorruptCheckpoint(f"{path}: {name} does not load ({err.__class__.__name__})") from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{path}: {name} holds a {type(state).__name__}, not a rank's state")
    return state


def _commit(
    ckpts: CheckpointDir, tmp: Path, step: int, header: dict[str, Any], files: dict[str, FileEntry], started: float
) -> CheckpointManifest:
    """Rank 0: check the files, write the manifest, rename the folder into place, prune."""
    folder = open_folder(tmp)
    try:
        for name in sorted(os.listdir(tmp)):
            if name not in files:  # written by no stream we hashed: read it back
                size = os.stat(name, dir_fd=folder, follow_symlinks=False).st_size
                files[name] = FileEntry(sha256=hash_regular(folder, name, tmp, size=size), bytes=size)
        for name, entry in files.items():
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or info.st_size != entry.bytes:
                raise CheckpointError(f"{tmp / name}: {info.st_size} bytes on disk, {entry.bytes} written")
    finally:
        os.close(folder)
    manifest = CheckpointManifest(
        **header, files=files, created_at=time.time(), save_seconds=time.perf_counter() - started
    )
    write_durably(tmp / MANIFEST, lambda fh: fh.write(manifest.to_json().encode("utf-8")), atomic=False)
    fsync_dir(tmp)
    ckpts.install(tmp, step)
    with contextlib.suppress(OSError, CheckpointError):
        ckpts.prune()
    return manifest.model_copy(update={"save_seconds": time.perf_counter() - started})


# ---- the API -------------------------------------------------------------------------------------
def save_sharded(
    ckpts: CheckpointDir,
    group: Group,
    step: int,
    state: dict[str, Any],
    rank_state: dict[str, Any],
    *,
    healthy: bool,
    loss: float | None,
    data_position: int,
    reason: str,
    meta: dict[str, Any],
    job: str | None,
    fingerprint: str | None,
    metrics: dict[str, float],
    strategy: str,
) -> CheckpointManifest:
    """Collective: every rank calls it. Write ``state`` with DCP and ``rank_state`` as this rank's file.

    ``state`` is the DCP state dict (``{"model": ..., "optimizer": ...}`` from
    ``torch.distributed.checkpoint.state_dict.get_state_dict``, plus plain entries such as blobs);
    ``rank_state`` is this rank's private state (RNG states), saved as ``rank-<rank>.pt``. Returns
    the committed manifest on every rank, or raises the same error on every rank
    (``CheckpointSpaceError`` for a full disk on any of them) with the temporary folder removed.
    A NaN or infinite ``loss`` is recorded as ``None``; such metrics are left out.
    """
    started = time.perf_counter()
    header: dict[str, Any] = {}
    problem: str | None = None
    tmp_name: str | None = None
    try:
        header = manifest_header(
            step,
            state,
            healthy=healthy,
            loss=loss,
            data_position=data_position,
            reason=reason,
            meta=meta,
            job=job,
            fingerprint=fingerprint,
            metrics=metrics,
            format="dcp",
            world_size=group.world_size,
            strategy=strategy,
            entries=sorted(str(name) for name in state),
        )
    except CheckpointError as err:
        problem = str(err)
    if group.is_main and problem is None:
        try:
            ckpts.root.mkdir(parents=True, exist_ok=True)
            tmp_name = f".tmp-{step_dirname(step)}-dcp-{uuid.uuid4().hex[:12]}"
            (ckpts.root / tmp_name).mkdir()
        except OSError as err:
            tmp_name, problem = None, f"cannot create a checkpoint folder in {ckpts.root} ({err.strerror})"
    setup: list[tuple[str | None, str | None]] = group.gather((problem, tmp_name))
    main_tmp = setup[0][1]
    refused = [f"rank {r}: {p}" if group.distributed else p for r, (p, _) in enumerate(setup) if p]
    if refused or main_tmp is None:
        if group.is_main and main_tmp is not None:
            shutil.rmtree(ckpts.root / main_tmp, ignore_errors=True)
        raise CheckpointError(refused[0] if refused else f"cannot save step {step}: no checkpoint folder")
    tmp = ckpts.root / main_tmp

    written: dict[str, tuple[str, int]] | None = None
    error: str | None = None
    no_space = False
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-hash") as pool:
        writer = _RecordingWriter(tmp, pool)
        try:
            with _quiet_torch(), torch_crc32_off():
                dcp_save(
                    state,
                    storage_writer=writer,
                    no_dist=not group.distributed,
                    process_group=group.process_group,
                )
            entry = _write_rank_file(tmp / rank_filename(group.rank), rank_state, pool)
            written = {**writer.recorder.written, rank_filename(group.rank): (entry.sha256, entry.bytes)}
        except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP's is a BaseException
            error, no_space = _describe(err), _out_of_space(err, writer.recorder.errors)
    estimate = _state_bytes(state) + _state_bytes(rank_state)
    outcomes: list[tuple[dict[str, tuple[str, int]] | None, str | None, bool, int]] = group.gather(
        (written, error, no_space, estimate)
    )

    files: dict[str, FileEntry] = {}
    failed = [(rank, o[1]) for rank, o in enumerate(outcomes) if o[1] is not None]
    for rank, (rank_files, _, _, _) in enumerate(outcomes):
        for name, (digest, size) in (rank_files or {}).items():
            if name in files:  # the same on every rank: all of them decide alike
                failed.append((rank, f"{name} was written by two ranks"))
            files[name] = FileEntry(sha256=digest, bytes=size)
    if failed:
        if group.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if any(o[2] for o in outcomes):
            raise _space_error(ckpts.root, sum(o[3] for o in outcomes))
        rank, why = failed[0]
        where = f" (rank {rank})" if group.distributed else ""
        raise CheckpointError(f"checkpoint at step {step} not saved{where}: {why}")

    result: tuple[str | None, str | None, bool] = (None, None, False)
    if group.is_main:
        try:
            result = (_commit(ckpts, tmp, step, header, files, started).to_json(), None, False)
        except Exception as err:  # noqa: BLE001 - told to every rank, then raised on each
            shutil.rmtree(tmp, ignore_errors=True)
            result = (None, _describe(err), is_no_space(err, None))
    text, why, full = group.broadcast(result)
    if text is None:
        if full:
            raise _space_error(ckpts.root, sum(o[3] for o in outcomes))
        raise CheckpointError(f"checkpoint at step {step} not committed: {why}")
    return CheckpointManifest.parse(text, ckpts.root / step_dirname(step))


def _space_error(root: Path, needed: int) -> CheckpointSpaceError:
    free = shutil.disk_usage(root).free if root.exists() else 0
    return CheckpointSpaceError(
        f"no space left on {root}: about {needed} bytes needed, {free} free; "
        "free space there (fewer checkpoints with checkpoint.keep) or use a larger disk",
        path=root,
        needed=needed,
        free=free,
    )


_Packed = tuple[str, int, str | None, str | None, bool]


def _pack(info: CheckpointInfo) -> _Packed:
    return (str(info.path), info.step, info.manifest.to_json() if info.manifest else None, info.problem, info.foreign)


def _unpack(packed: _Packed) -> CheckpointInfo:
    path, step, text, problem, foreign = packed
    manifest = CheckpointManifest.parse(text, Path(path)) if text is not None else None
    return CheckpointInfo(Path(path), step, manifest, problem, foreign=foreign)


def sharded_candidate(
    ckpts: CheckpointDir,
    group: Group,
    *,
    before_step: int | None,
    expect: Expectation | None,
    formats: Collection[Format] = DCP_ONLY,
) -> tuple[CheckpointInfo | None, CheckpointManifest | None, list[CheckpointInfo]]:
    """Collective: rank 0 picks the newest complete, hash-verified, healthy checkpoint; every rank gets it.

    The same rule as ``CheckpointDir.restore_candidate`` (which rank 0 runs), with the newer
    checkpoints passed over and their problems, newest first. ``formats`` are those the caller
    loads: a single-process (``torch``) checkpoint is skipped as foreign by default; a caller that
    can load both (one process) passes ``("torch", "dcp")`` and looks at ``manifest.format``.
    """
    answer: tuple[str | None, _Packed | None, list[_Packed]] = (None, None, [])
    if group.is_main:
        try:
            info, _, _, skipped = ckpts.restore_candidate(before_step=before_step, expect=expect, formats=formats)
            answer = (None, _pack(info) if info is not None else None, [_pack(s) for s in skipped])
        except (CheckpointError, OSError) as err:
            answer = (str(err), None, [])
    problem, chosen, passed = group.broadcast(answer)
    if problem is not None:
        raise CheckpointError(problem)
    info = _unpack(chosen) if chosen is not None else None
    return info, (info.manifest if info is not None else None), [_unpack(p) for p in passed]


def load_sharded(ckpts: CheckpointDir, group: Group, path: Path, state: dict[str, Any]) -> dict[str, Any] | None:
    """Collective: DCP-load ``path`` into ``state`` in place (the caller then calls ``set_state_dict``).

    Returns this rank's ``rank_state`` when the checkpoint was written by as many ranks as this
    group has, else ``None`` (the caller re-derives it: another world size has no state per rank).
    ``path`` should come from ``sharded_candidate`` (which verified every file); here each rank
    checks its own rank file and DCP's index again, as they are read. Raises ``CorruptCheckpoint``
    for a file that does not verify and ``CheckpointError`` for a checkpoint that does not fit
    ``state``, on every rank.
    """
    path = Path(path)
    text: str | None = None
    problem: str | None = None
    if group.is_main:
        try:
            text = ckpts.read_manifest(path).to_json()
        except CheckpointError as err:
            problem = str(err)
    text, problem = group.broadcast((text, problem))
    if problem is not None or text is None:
        raise CorruptCheckpoint(problem or f"{path}: no manifest")
    manifest = CheckpointManifest.parse(text, path)
    if manifest.format != "dcp":
        raise CheckpointError(format_problem(path, manifest))

    rank_state: dict[str, Any] | None = None
    metadata: Metadata | None = None
    try:
        if manifest.world_size == group.world_size:
            rank_state = _read_rank_file(path, manifest, group.rank)
        metadata = read_index(path, manifest)
    except CheckpointError as err:
        problem = str(err)
    problems = [p for p in group.gather(problem) if p is not None]
    if problems or metadata is None:  # every rank raises, or none does
        raise CorruptCheckpoint(problems[0] if problems else f"{path}: {DCP_METADATA} not read")

    try:
        with _quiet_torch():
            dcp_load(
                state,
                storage_reader=_VerifiedReader(path, manifest, metadata),
                planner=_SafeLoadPlanner(),
                no_dist=not group.distributed,
            )
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP's is a BaseException
        if isinstance(_first_failure(err), CorruptCheckpoint):  # a shard changed since it was verified
            raise CorruptCheckpoint(_describe(err)) from None
        group.barrier()  # a rank lost during the load is PeerLost (requeue), not a checkpoint that does not fit
        raise CheckpointError(
            f"{path} does not fit this run: {_describe(err)}; start over with resume: never in a fresh "
            "checkpoint directory"
        ) from None
    return rank_state


def full_state(path: Path, manifest: CheckpointManifest) -> dict[str, Any]:
    """The whole of a dcp checkpoint as plain tensors and values, in this one process (``ckpt export``).

    What ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` does, after the checks
    ``ckpt verify`` runs (``read_index``, ``check_stored_tensors``: the same refusal, in the same
    words), through the reader of listed shards and ``weights_only`` planner; each blob entry
    (``io.BytesIO``, as the session saves a scheduler's state) is loaded with ``weights_only`` too,
    so it exports as its value.
    Holds every tensor in memory at once.
    """
    if manifest.format != "dcp":
        raise CheckpointError(f"{path} is not a sharded (dcp) checkpoint")
    folder = open_folder(path)
    try:
        metadata = read_index(path, manifest, folder=folder)
        check_stored_tensors(folder, path, manifest, metadata)
    finally:
        os.close(folder)
    state: dict[str, Any] = {}
    reader = _VerifiedReader(path, manifest, metadata)
    try:
        with _quiet_torch():
            _load_state_dict(state, storage_reader=reader, planner=_SafeFullPlanner(), no_dist=True)
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP's is a BaseException
        if isinstance(_first_failure(err), CorruptCheckpoint):
            raise CorruptCheckpoint(_describe(err)) from None
        raise CorruptCheckpoint(f"{path}: the shards do not load ({_describe(err)})") from None
    out: dict[str, Any] = {}
    for name, value in state.items():
        if isinstance(value, io.BytesIO):
            try:
                with _quiet_torch():
                    value = _load_plain(value)
            except Exception:  # noqa: BLE001 - raw bytes, not a torch.save blob: export them as bytes
                value = value.getvalue()
        out[name] = value
    return out


__all__ = ["check_stored_tensors", "full_state", "load_sharded", "read_index", "save_sharded", "sharded_candidate"]
