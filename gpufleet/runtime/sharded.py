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
   hash (sha256, in a helper thread) and count the bytes *while* they are written, send them to
   disk as they go (``HashingWriter``), and fsync each file; meanwhile a second thread writes and
   fsyncs the rank's ``rank-<r>.pt`` (serialised first, then hashed from memory). Each rank's
   names, digests and sizes are gathered to rank 0 (the ``gather`` is the barrier after the writes).
3. Rank 0 checks each file's size on disk, hashes any file of the folder that no rank reported by
   reading it back (none with torch 2.13's writer; the fallback keeps a future writer's extra file
   from going unverified), writes ``manifest.json`` (fsync), fsyncs the folder, renames it to
   ``step-<n>/`` (fsync of the parent), and prunes. Its ``broadcast`` of the manifest is the barrier
   after the commit: every rank returns the same manifest, or raises the same error.

A folder without a complete, valid manifest is never restored. A restore (``sharded_candidate``)
is decided by rank 0 alone, with ``CheckpointDir.restore_candidate``: the newest checkpoint whose
manifest parses and whose every file has the right size and sha256 (shards hashed in chunks), whose
DCP index holds what the manifest lists, and healthy; rank 0 broadcasts the verdict.
``load_sharded`` then has each rank re-check its own ``rank-<r>.pt`` against the manifest and load
it with ``weights_only=True``, and DCP load its part of the shards; ``full_state`` (``ckpt export``)
loads them all in one process.

What may be read, and how, is ``dcp_index``'s: ``read_index`` checks DCP's ``.metadata`` against
the manifest (nothing but the listed shards, each item at a byte range inside one, chunks covering
their tensors), since a crafted index could otherwise point DCP at any file; ``check_stored_tensors``
checks each stored tensor's header; DCP reads through its ``VerifiedReader`` (only the listed
shards, never through a link) and its planners (non-tensor entries with ``weights_only=True``,
where DCP's own would use ``weights_only=False``). ``ckpt verify``, a restore and ``ckpt export``
all go through them.

A full disk, on any rank, is a ``CheckpointSpaceError`` on every rank, and the temporary folder is
removed: every earlier checkpoint stays as it was. ``needed`` is an estimate there (the bytes of
the tensors and blobs each rank holds; DCP writes replicated DDP tensors once), not the exact size
the single-process save measures.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable, Collection, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

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
from gpufleet.runtime.dcp_index import (
    SafeFullPlanner,
    SafeLoadPlanner,
    VerifiedReader,
    check_stored_tensors,
    load_plain,
    one_line,
    quiet_torch,
    read_index,
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
    rank_filename,
    read_regular,
    step_dirname,
)

DCP_ONLY: tuple[Format, ...] = ("dcp",)


# ---- writing: DCP's files, hashed as they are written ------------------------------------------
class _HashedStream(HashingWriter):
    """A file DCP writes: hashed while written (``HashingWriter``), fsynced and reported on close.

    DCP ``torch.save``-s each tensor into the stream: one large write of its bytes among some 40
    writes of a few bytes each (zip headers, ``data.pkl``, ``version``, padding). Each of those
    would cost a system call and a hand-off to the hashing thread, more than the bytes themselves:
    a save of 256 MiB in 10 MiB tensors made about 1,000 of them per rank. So writes under
    ``_SMALL`` bytes are gathered in memory and go out as one write (hashed in order) just before
    the next large one, on ``flush`` (DCP flushes after each item), and before ``fileno`` (DCP
    fsyncs through it) and the final fsync. Large writes go straight from the caller's buffer.

    DCP asks its streams for ``tell()`` (the offset of each item: here the bytes written or
    gathered, as the stream only appends) and ``fileno()`` (to fsync). It never seeks back, so the
    digest is of the file's final bytes.
    """

    def __init__(self, path: Path, pool: ThreadPoolExecutor, done: Callable[[str, str, int], None]) -> None:
        super().__init__(path, pool)
        self._name = path.name
        self._done = done
        self._abandoned = False
        self._gathered = bytearray()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) < _SMALL:
            self._gathered += view
            if len(self._gathered) >= _SMALL:
                self._drain()
            return len(view)
        self._drain()
        return super().write(view)

    def _drain(self) -> None:
        if self._gathered:
            super().write(self._gathered)
            # A new buffer, not clear(): the hashing thread's task may still hold a view of this
            # one for a moment after its result is in, and a bytearray with a view cannot shrink.
            self._gathered = bytearray()

    def flush(self) -> None:
        if self._fd >= 0:
            self._drain()

    def tell(self) -> int:
        return self.bytes + len(self._gathered)

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("I/O operation on closed file")
        self._drain()
        return self._fd

    def finish(self) -> str:
        self._drain()
        return super().finish()

    def abandon(self) -> None:
        """Close without reporting: the write failed, the file is not part of any checkpoint."""
        self._abandoned = True
        self.close()

    def close(self) -> None:
        try:
            if self._fd >= 0 and not self._abandoned and not self.closed:
                digest = self.finish()  # write what is gathered, fsync, close, digest
                self._done(self._name, digest, self.bytes)
        finally:
            super().close()


_SMALL = 1 << 16
"""Writes under this many bytes are gathered into one (``HashingWriter`` hashes a copy of such writes)."""


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
    return one_line(f"{type(first).__name__}: {str(first).strip()}").rstrip(": ")


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


def _serialize(rank_state: Mapping[str, Any]) -> bytes:
    buffer = io.BytesIO()
    with torch_crc32_off():
        torch.save(dict(rank_state), buffer)
    return buffer.getvalue()


def _write_rank_file(path: Path, data: bytes) -> FileEntry:
    """Create ``path`` holding ``data``, fsynced: a rank's file, written while DCP writes the shards.

    It is small (RNG states, some 30 KiB), but its create, write and fsync (a journal commit) took
    5-8 ms after the shards, on every save's critical path; in a thread of its own, started before
    DCP's planning, they overlap it.
    """
    write_durably(path, lambda fh: fh.write(data), atomic=False)
    return FileEntry(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


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
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-hash") as pool,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-rank") as side,
    ):
        writer = _RecordingWriter(tmp, pool)
        try:
            rank_file = side.submit(_write_rank_file, tmp / rank_filename(group.rank), _serialize(rank_state))
            with quiet_torch(), torch_crc32_off():
                dcp_save(
                    state,
                    storage_writer=writer,
                    no_dist=not group.distributed,
                    process_group=group.process_group,
                )
            entry = rank_file.result()
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
        with quiet_torch():
            dcp_load(
                state,
                storage_reader=VerifiedReader(path, manifest, metadata),
                planner=SafeLoadPlanner(),
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
    reader = VerifiedReader(path, manifest, metadata)
    try:
        with quiet_torch():
            _load_state_dict(state, storage_reader=reader, planner=SafeFullPlanner(), no_dist=True)
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP's is a BaseException
        if isinstance(_first_failure(err), CorruptCheckpoint):
            raise CorruptCheckpoint(_describe(err)) from None
        raise CorruptCheckpoint(f"{path}: the shards do not load ({_describe(err)})") from None
    out: dict[str, Any] = {}
    for name, value in state.items():
        if isinstance(value, io.BytesIO):
            try:
                with quiet_torch():
                    value = load_plain(value)
            except Exception:  # noqa: BLE001 - raw bytes, not a torch.save blob: export them as bytes
                value = value.getvalue()
        out[name] = value
    return out


__all__ = ["full_state", "load_sharded", "save_sharded", "sharded_candidate"]
