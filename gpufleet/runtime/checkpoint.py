"""Checkpoints that survive ``kill -9`` and are what they claim: atomic folders, verified on restore.

Layout (a contract other tools rely on)::

    <dir>/step-00000150/
        model.pt  optimizer.pt  scheduler.pt  trainer.pt  ...   one file per state entry
        manifest.json                                           written last (see manifest.py)

A save writes every file into ``.tmp-step-<n>-<pid>/`` through a writer that hashes (sha256) in a
second thread while the main one writes, fsyncs each file, writes the manifest, fsyncs the folder,
renames it to ``step-<n>/`` and fsyncs the parent. A process killed at any moment leaves either a
complete checkpoint or a temporary folder that restore ignores; a save that fills the disk removes
its temporary folder and raises ``CheckpointSpaceError``, leaving every earlier checkpoint as it was.

Whether a folder can be restored is decided in one place, ``CheckpointDir.check``: strict
manifest, no symbolic links or special files, every size and sha256 right, every file loading
with ``torch.load(weights_only=True)``, the trainer state agreeing with the manifest, and the
caller's ``Expectation`` (same job, every object present) met. ``scan``, ``latest``, ``load``,
``restore_candidate`` and so ``gpufleet ckpt verify`` and a restore all go through it, so what
``verify`` calls restorable is what a restore uses.

A distributed job's checkpoints (manifest ``format: dcp``, written by ``sharded.save_sharded``)
live in the same directory under the same names and commit rule. Here they are listed, verified
(every shard's size and sha256, each rank's file loading with ``weights_only``, DCP's index naming
only the shards the manifest lists and each tensor stored as the index says: ``dcp_index.read_index``),
pruned and dropped like the others, but never ``torch.load``-ed as a state: ``restore_candidate``
takes the formats its caller can load (``torch`` by default: a single-process restore), ``load``
refuses a dcp folder, and ``export`` converts one into a plain state dict through DCP.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import io
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, cast

from pydantic import ValidationError

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

from gpufleet.errors import (
    CheckpointError,
    CheckpointSpaceError,
    CorruptCheckpoint,
    ForeignCheckpoint,
    ParameterError,
)
from gpufleet.runtime.manifest import (
    DCP_METADATA,
    FILE_RE,
    MANIFEST,
    SCHEMA_VERSION,
    SHA256_RE,
    STEP_RE,
    CheckpointManifest,
    Expectation,
    FileEntry,
    Format,
    check_expectation,
    check_trainer,
    describe_invalid,
    finite_or_none,
    hash_regular,
    model_fingerprint,
    open_folder,
    rank_filename,
    read_manifest_at,
    read_regular,
    state_dict_mismatch,
    step_dirname,
)

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
TORCH_ONLY: tuple[Format, ...] = ("torch",)
"""What a single-process restore loads (``restore_candidate``'s default)."""
ANY_FORMAT: tuple[Format, ...] = ("torch", "dcp")


# ---- writing ---------------------------------------------------------------------------------
class HashingWriter(io.RawIOBase):
    """A write-only file that hashes in a helper thread while the caller's thread writes.

    ``hashlib`` and ``os.write`` both release the GIL on large buffers, so the two overlap and
    hashing costs almost nothing on top of the write (measured in ``bench/checkpoint_save.py``).
    The ``OSError`` a write hits is kept in ``error``: torch may hand it on wrapped in a
    ``RuntimeError``, and a full disk must still be told apart from any other failure.

    Each large write is sent to disk at once (``sync_file_range(WRITE)``), so the final fsync
    waits only for the tail; what lies ``_WRITE_BEHIND`` bytes back is waited for and dropped from
    the page cache (``posix_fadvise(DONTNEED)``), so a save of any size holds about that much of
    it and fills the next chunk with pages the kernel has just freed. Fresh pages are what cost: on
    a VM that hands freed memory back to its host (virtio-balloon free page reporting), filling
    256 MiB of page cache with pages not touched for a while took 0.2-0.5 CPU-s instead of 0.06,
    at random: with ``fadvise(DONTNEED)`` alone (which starts the writeback but drops nothing
    still dirty; kept where ``sync_file_range`` is missing) 4 rounds of 12 of
    ``bench/dist_save_throughput.py``'s save ran at 0.57-0.81x dd, the rest at 1.02-1.24x.
    """

    def __init__(self, path: Path, pool: ThreadPoolExecutor) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._hash = hashlib.sha256()
        self._pool = pool
        self._pending: Future[None] | None = None
        self._sync_range = _SYNC_RANGE
        self._started = 0  # bytes whose writeback has been started
        self._dropped = 0  # bytes written back, waited for and dropped from the page cache
        self.bytes = 0
        self.error: OSError | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        start = self.bytes
        if self._pending is not None:
            self._pending.result()
        # The caller may reuse its buffer once write() returns: hash a private copy of small
        # chunks, and wait for large ones before returning.
        small = len(view) < (1 << 16)
        chunk: Any = bytes(view) if small else view
        self._pending = self._pool.submit(self._hash.update, chunk)
        written = 0
        try:
            while written < len(view):
                written += os.write(self._fd, view[written:])
        except OSError as err:
            self.error = err
            raise
        if not small:
            # The hash of this chunk runs on while it goes to disk (and the wait for older ones).
            self._write_behind(start, start + written)
            self._pending.result()
            self._pending = None
        self.bytes += written
        return written

    def _write_behind(self, start: int, end: int) -> None:
        """Start writing back up to ``end``; wait for, and drop, what lies ``_WRITE_BEHIND`` bytes before it."""
        sync = self._sync_range
        if sync is None:
            if _FADVISE is not None:
                os.posix_fadvise(self._fd, start, end - start, _FADVISE)
            return
        end -= end % _PAGE  # whole pages: the next write may still fill the last one
        if end > self._started:
            self._sync(sync, self._started, end, _SFR_WRITE)
            self._started = end
        behind = end - _WRITE_BEHIND
        if behind > self._dropped and self._sync(sync, self._dropped, behind, _SFR_WAIT_WRITE_WAIT):
            if _FADVISE is not None:
                os.posix_fadvise(self._fd, self._dropped, behind - self._dropped, _FADVISE)
            self._dropped = behind

    def _sync(self, sync: Callable[[int, int, int, int], int], start: int, end: int, flags: int) -> bool:
        """``sync_file_range``: whether it ran. Its error is raised: the fsync after it would not see it again."""
        if sync(self._fd, start, end - start, flags) == 0:
            return True
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ESPIPE):  # not on this file: fadvise alone
            self._sync_range = None
            return False
        self.error = OSError(err, os.strerror(err))
        raise self.error

    def finish(self) -> str:
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        return self._hash.hexdigest()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        super().close()


_FADVISE = getattr(os, "POSIX_FADV_DONTNEED", None) if hasattr(os, "posix_fadvise") else None


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux's ``sync_file_range(2)`` from the C library (``os`` has none); ``None`` elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast("Callable[[int, int, int, int], int]", fn)


_SYNC_RANGE = _sync_file_range()
_SFR_WRITE = 2  # SYNC_FILE_RANGE_WRITE: start writeback, do not wait
_SFR_WAIT_WRITE_WAIT = 1 | 2 | 4  # WAIT_BEFORE | WRITE | WAIT_AFTER: the range is on disk on return
_PAGE = 4096
_WRITE_BEHIND = 64 << 20
"""Bytes in flight per file between the write and the wait: 16 MiB left the disk idle between
waits (0.90x dd against 1.06x at 64 MiB, 2 ranks, interleaved rounds); more means more fresh pages."""


class _CountingSink(io.RawIOBase):
    """A writable file that keeps only the count: the exact size of a save without the disk."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.bytes += n
        return n


@contextlib.contextmanager
def torch_crc32_off() -> Iterator[None]:
    """torch's zip writer computes a CRC-32 on the main thread; sha256 already covers every byte."""
    import torch.serialization as ser

    get, set_ = getattr(ser, "get_crc32_options", None), getattr(ser, "set_crc32_options", None)
    if get is None or set_ is None:
        yield
        return
    previous = get()
    set_(False)
    try:
        yield
    finally:
        set_(previous)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, write: Callable[[IO[bytes]], object], *, atomic: bool = True) -> None:
    """Create ``path`` through ``write(file)`` and fsync it; with ``atomic``, via a temporary + rename.

    ``atomic`` writes ``.<name>.tmp-<pid>`` beside ``path`` and renames it over ``path`` only once
    it is durable, so a reader sees the old file or the new one, never half of one; a failure
    removes the temporary. Without it the file is created in place (``O_EXCL``), for files inside
    a folder that is itself renamed into place.
    """
    target = path.with_name(f".{path.name}.tmp-{os.getpid()}") if atomic else path
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if atomic else os.O_EXCL)
    try:
        with os.fdopen(os.open(target, flags, 0o644), "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if atomic:
            os.replace(target, path)
    except BaseException:
        if atomic:
            with contextlib.suppress(OSError):
                target.unlink()
        raise
    if atomic:
        fsync_dir(path.parent)


def manifest_header(step: int, state: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """The manifest fields of a save, checked before a byte is written (a bad value costs no I/O).

    ``fields`` may hold ``format="dcp"`` and ``world_size`` (a sharded save): then the state's
    names are DCP keys, not file names, and the placeholder files are those such a save writes.
    A NaN or infinite ``loss`` is recorded as ``None`` and such ``metrics`` are left out (both
    save paths, here once).
    """
    if "loss" in fields:
        fields["loss"] = finite_or_none(fields["loss"])
    if "metrics" in fields:
        fields["metrics"] = {k: f for k, v in (fields["metrics"] or {}).items() if (f := finite_or_none(v)) is not None}
    if "meta" in fields:
        fields["meta"] = dict(fields["meta"] or {})
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= 99_999_999:
        raise CheckpointError(f"step {step!r} cannot name a checkpoint: use an int from 0 to 99999999")
    if not state:
        raise CheckpointError(f"nothing to save at step {step}: the state is empty")
    sharded = fields.get("format") == "dcp"
    for name in state:
        if not isinstance(name, str) or not (name if sharded else FILE_RE.match(f"{name}.pt")):
            raise CheckpointError(f"invalid state name {name!r}: use letters, digits, '_', '.', '-'")
    fingerprint = fields.get("fingerprint")
    if fingerprint is not None and not (isinstance(fingerprint, str) and re.fullmatch(SHA256_RE, fingerprint)):
        raise CheckpointError(f"fingerprint {fingerprint!r} is not a sha256 hex digest: use model_fingerprint()")
    header = {"schema_version": SCHEMA_VERSION, "step": step, **fields}
    blank = FileEntry(sha256="0" * 64, bytes=0)
    files = {"x.pt": blank}
    world = fields.get("world_size", 1)
    if sharded and isinstance(world, int) and not isinstance(world, bool) and 1 <= world <= 99_999:
        files = {DCP_METADATA: blank, **{rank_filename(r): blank for r in range(world)}}
    try:  # the same model that reads it back; placeholder files stand for those to come
        CheckpointManifest(**header, files=files, created_at=0.0).to_json()
    except ValidationError as err:
        raise CheckpointError(
            f"cannot save step {step}: {describe_invalid(err, fix='pass a value of that type')}"
        ) from None
    except ValueError as err:  # pydantic's serialization error: meta holds something JSON cannot
        raise CheckpointError(f"cannot save step {step}: meta must hold JSON values only ({err})") from None
    return header


def is_no_space(err: BaseException, writer: HashingWriter | None) -> bool:
    """Whether ``err`` (or what caused it, or what ``writer`` hit) is a full disk or quota."""
    chain: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if writer is not None and writer.error is not None:
        chain.append(writer.error)
    return any(isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS for e in chain)


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """One folder in a checkpoint directory, as ``ckpt list`` shows it."""

    path: Path
    step: int
    manifest: CheckpointManifest | None
    problem: str | None
    """Why it cannot be restored (``None`` when it verified, or was not verified)."""
    foreign: bool = False
    """Intact, but written by another job or lacking an object the caller expects."""

    @property
    def restorable(self) -> bool:
        """The one rule restore and ``ckpt verify`` share: intact, expected, and healthy."""
        return self.manifest is not None and self.problem is None and self.manifest.healthy

    @property
    def status(self) -> Literal["ok", "corrupt", "foreign", "unhealthy"]:
        if self.manifest is None:
            return "corrupt"
        if self.foreign:
            return "foreign"
        return "ok" if self.manifest.healthy else "unhealthy"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportedEntry:
    """What ``CheckpointDir.export`` wrote."""

    source: Path
    step: int
    entry: str
    out: Path
    bytes: int
    tensors: int
    fingerprint: str | None
    """``model_fingerprint`` of the entry when it is a mapping of tensors (a state dict)."""


class CheckpointDir:
    """A directory of ``step-N`` checkpoints: save, list, verify, restore, prune."""

    def __init__(self, root: Path, keep: int = 3, keep_best: tuple[str, str] | None = None) -> None:
        self.root = Path(root)
        self.keep = keep
        if keep_best is not None and (
            not isinstance(keep_best, tuple) or len(keep_best) != 2 or keep_best[1] not in ("min", "max")
        ):
            raise ValueError(f"keep_best={keep_best!r}: give (metric, 'min' or 'max'), e.g. ('val_loss', 'min')")
        self.keep_best = keep_best
        """(metric, "min" | "max"): ``prune`` also keeps the healthy checkpoint with the best value."""

    # ---- saving -------------------------------------------------------------------------
    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        *,
        healthy: bool = True,
        loss: float | None = None,
        data_position: int = 0,
        reason: str = "periodic",
        meta: Mapping[str, Any] | None = None,
        job: str | None = None,
        fingerprint: str | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> CheckpointManifest:
        """Write ``state`` (name -> picklable-with-weights_only object) as ``step-<step>``.

        A NaN or infinite ``loss`` is recorded as ``None`` and such metrics are left out: a
        manifest holds finite numbers only, and a NaN must never rank as the best checkpoint.
        """
        import torch

        started = time.perf_counter()
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
        )
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{step_dirname(step)}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        files: dict[str, FileEntry] = {}
        writer: HashingWriter | None = None
        try:
            from concurrent.futures import ThreadPoolExecutor  # a save's, not a reader's (`gpufleet show`)

            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-hash") as pool, torch_crc32_off():
                for name, obj in state.items():
                    writer = HashingWriter(tmp / f"{name}.pt", pool)
                    try:
                        torch.save(obj, writer)  # type: ignore[arg-type]
                        digest = writer.finish()
                    except Exception:
                        if writer.error is not None and writer.error.errno in NO_SPACE_ERRNOS:
                            raise writer.error from None  # torch may have wrapped it
                        raise
                    finally:
                        writer.close()
                    files[f"{name}.pt"] = FileEntry(sha256=digest, bytes=writer.bytes)
            manifest = CheckpointManifest(
                **header, files=files, created_at=time.time(), save_seconds=time.perf_counter() - started
            )
            write_durably(tmp / MANIFEST, lambda fh: fh.write(manifest.to_json().encode("utf-8")), atomic=False)
            fsync_dir(tmp)
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(err, Exception) and is_no_space(err, writer):
                raise self._space_error(state) from err
            raise
        self.install(tmp, step)
        return manifest.model_copy(update={"save_seconds": time.perf_counter() - started})

    def install(self, tmp: Path, step: int) -> Path:
        """Rename the complete folder ``tmp`` (manifest written and fsynced) to ``step-<step>``; fsync the parent."""
        final = self.root / step_dirname(step)
        if final.exists():
            # Re-saving a step (resumed, then preempted before the next step): swap atomically
            # enough that a crash leaves either folder or none, never a mix.
            old = self.root / f".old-{step_dirname(step)}-{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        fsync_dir(self.root)
        return final

    def _space_error(self, state: Mapping[str, Any]) -> CheckpointSpaceError:
        import torch

        needed = 0
        with torch_crc32_off():
            for obj in state.values():
                sink = _CountingSink()
                torch.save(obj, sink)  # type: ignore[arg-type]
                needed += sink.bytes
        free = shutil.disk_usage(self.root).free
        return CheckpointSpaceError(
            f"no space left on {self.root}: {needed} bytes needed, {free} free; "
            "free space there (fewer checkpoints with checkpoint.keep) or use a larger disk",
            path=self.root,
            needed=needed,
            free=free,
        )

    # ---- deciding -----------------------------------------------------------------------
    def check(self, path: Path, *, expect: Expectation | None = None) -> tuple[CheckpointManifest, dict[str, Any]]:
        """Decide whether ``path`` can be restored; return its manifest and loaded state, or raise.

        Raises ``CorruptCheckpoint`` (a link, a bad manifest, a file of the wrong type, size or
        sha256, one that ``torch.load(weights_only=True)`` refuses, a trainer state that
        disagrees with the manifest) or ``ForeignCheckpoint`` (intact, but not what ``expect``
        asks for). A checkpoint marked unhealthy is returned: it is intact, and callers decide.
        For a sharded (``dcp``) checkpoint every shard is hashed but not loaded, and the state
        returned holds only the ranks' own files (``rank-00000`` ...).
        """
        manifest, state = self._verified(path)
        if expect is not None:
            check_expectation(path, manifest, expect)
        return manifest, state

    def _verified(
        self, path: Path, formats: Collection[Format] | None = None
    ) -> tuple[CheckpointManifest, dict[str, Any]]:
        """Integrity alone: the manifest, every file's type, size and sha256, loading, trainer consistency.

        A ``torch`` checkpoint's state is every file loaded. A ``dcp`` checkpoint's shards are
        hashed in chunks and not loaded (DCP loads them, into a sharded model); its state is the
        ranks' own files, ``rank-00000`` ... (each loaded with ``weights_only``, as a check).
        A checkpoint whose format is not in ``formats`` raises ``_OtherFormat`` before any hashing.
        """
        import torch

        folder = open_folder(path)
        try:
            manifest = read_manifest_at(folder, path)
            if formats is not None and manifest.format not in formats:
                raise _OtherFormat(format_problem(path, manifest), manifest)
            state: dict[str, Any] = {}
            for name, entry in manifest.files.items():
                if manifest.format == "dcp" and not name.endswith(".pt"):
                    if hash_regular(folder, name, path, size=entry.bytes) != entry.sha256:
                        raise CorruptCheckpoint(f"{path}: {name} fails its sha256 check")
                    continue
                data = read_regular(folder, name, path, size=entry.bytes)
                if hashlib.sha256(data).hexdigest() != entry.sha256:
                    raise CorruptCheckpoint(f"{path}: {name} fails its sha256 check")
                try:
                    state[name.removesuffix(".pt")] = torch.load(
                        io.BytesIO(data), map_location="cpu", weights_only=True
                    )
                except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
                    raise CorruptCheckpoint(f"{path}: {name} does not load ({err.__class__.__name__})") from None
            if manifest.format == "dcp":  # DCP's index names only listed shards, which hold what it says
                from gpufleet.runtime.dcp_index import check_stored_tensors, read_index

                check_stored_tensors(folder, path, manifest, read_index(path, manifest, folder=folder))
        finally:
            os.close(folder)
        if manifest.format == "torch":
            check_trainer(path, manifest, state)
        return manifest, state

    def _inspect(
        self,
        path: Path,
        step: int,
        *,
        verify: bool,
        expect: Expectation | None,
        formats: Collection[Format] | None = None,
    ) -> tuple[CheckpointInfo, dict[str, Any] | None]:
        try:
            manifest, state = self._verified(path, formats) if verify else (self.read_manifest(path), None)
        except _OtherFormat as err:
            return CheckpointInfo(path, step, err.manifest, str(err), foreign=True), None
        except CorruptCheckpoint as err:
            return CheckpointInfo(path, step, None, str(err)), None
        try:
            if expect is not None:
                check_expectation(path, manifest, expect)
        except ForeignCheckpoint as err:
            return CheckpointInfo(path, step, manifest, str(err), foreign=True), None
        return CheckpointInfo(path, step, manifest, None if manifest.healthy else "marked unhealthy"), state

    def _folders(self) -> list[tuple[Path, int]]:
        """``(path, step)`` of every ``step-N`` entry that is a folder or a link, oldest first."""
        if not self.root.exists():
            return []
        if not self.root.is_dir():
            raise CheckpointError(f"{self.root} is not a directory")
        found = []
        with os.scandir(self.root) as entries:
            for entry in entries:
                match = STEP_RE.match(entry.name)
                if match and (entry.is_symlink() or entry.is_dir(follow_symlinks=False)):
                    found.append((self.root / entry.name, int(match.group(1))))
        return sorted(found, key=lambda item: item[1])

    # ---- reading ------------------------------------------------------------------------
    def scan(self, verify: bool = True, expect: Expectation | None = None) -> list[CheckpointInfo]:
        """Every ``step-N`` folder, oldest first, with the reason it cannot be restored.

        ``verify`` runs ``check`` on each (every byte hashed and loaded); without it only the
        manifests are read, which is what listing and pruning need.
        """
        return [self._inspect(path, step, verify=verify, expect=expect)[0] for path, step in self._folders()]

    def read_manifest(self, path: Path) -> CheckpointManifest:
        folder = open_folder(path)
        try:
            return read_manifest_at(folder, path)
        finally:
            os.close(folder)

    def verify(self, path: Path) -> CheckpointManifest:
        """Check the manifest and every file's size and sha256; raise ``CorruptCheckpoint``."""
        return self.check(path)[0]

    def load(self, path: Path, expect: Expectation | None = None) -> tuple[CheckpointManifest, dict[str, Any]]:
        """``check``, which verifies and loads every file with ``torch.load(weights_only=True)``.

        A sharded (``dcp``) checkpoint is refused with ``CheckpointError``: its shards are not a
        state one process can ``torch.load``; see ``sharded.load_sharded`` and ``export``.
        """
        manifest = self.read_manifest(path)
        if manifest.format != "torch":
            raise CheckpointError(
                f"{path} is a sharded checkpoint ({manifest.described} ranks' DCP shards), not one state to load: "
                "restore it with gpufleet.runtime.sharded.load_sharded, or convert it with `gpufleet ckpt export`"
            )
        return self.check(path, expect=expect)

    def restore_candidate(
        self,
        *,
        before_step: int | None = None,
        expect: Expectation | None = None,
        formats: Collection[Format] = TORCH_ONLY,
    ) -> tuple[CheckpointInfo | None, CheckpointManifest | None, dict[str, Any] | None, list[CheckpointInfo]]:
        """The newest restorable checkpoint (below ``before_step``), its manifest and state, and those skipped.

        Newest first, each folder goes through ``check`` until one passes and is healthy; its
        state is returned as loaded then, so the bytes verified are the bytes restored. The
        newer folders passed over come back with their problems, newest first.

        ``formats`` are those the caller can load: by default ``torch`` (a single-process
        restore), and a sharded (``dcp``) checkpoint is skipped as foreign, with the reason.
        With ``"dcp"`` in ``formats`` a dcp checkpoint can be the candidate: it is verified
        (every shard's sha256) and returned with state ``None``; load it with
        ``sharded.load_sharded`` (a group of one works).
        """
        skipped: list[CheckpointInfo] = []
        for path, step in reversed(self._folders()):
            if before_step is not None and step >= before_step:
                continue
            info, state = self._inspect(path, step, verify=True, expect=expect, formats=tuple(formats))
            if info.restorable and state is not None and info.manifest is not None:
                return info, info.manifest, (state if info.manifest.format == "torch" else None), skipped
            skipped.append(info)
        return None, None, None, skipped

    def latest(
        self,
        *,
        before_step: int | None = None,
        expect: Expectation | None = None,
        formats: Collection[Format] = ANY_FORMAT,
    ) -> tuple[CheckpointInfo | None, list[CheckpointInfo]]:
        """The newest restorable checkpoint (below ``before_step``) of ``formats``, and the newer ones skipped."""
        info, _, _, skipped = self.restore_candidate(before_step=before_step, expect=expect, formats=formats)
        return info, skipped

    def export(self, out: Path, *, step: int | None = None, entry: str = "model") -> ExportedEntry:
        """Write one entry of a verified checkpoint as a plain ``torch.save`` file, atomically.

        The default checkpoint is the one a restore would use. The result loads with
        ``torch.load(out, weights_only=True)`` and, for ``model``, ``model.load_state_dict``.
        """
        import torch

        out = Path(out)
        if out.is_dir():
            raise ParameterError(
                "{out} is a directory: give a file name, e.g. {example!r}", out=str(out), example=str(out / "model.pt")
            )
        if not out.parent.is_dir():
            raise ParameterError(
                "{out}: folder {folder!r} does not exist; create it first", out=str(out), folder=str(out.parent)
            )
        found: dict[str, Any] | None
        if step is None:
            info, manifest, found, skipped = self.restore_candidate(formats=ANY_FORMAT)
            if info is None or manifest is None:
                why = f"; newest skipped: {skipped[0].problem}" if skipped else ""
                raise CheckpointError(f"{self.root} holds no restorable checkpoint to export{why}")
            path = info.path
        else:
            path = self.root / step_dirname(step)
            if not (path.exists() or path.is_symlink()):
                steps = ", ".join(str(s) for _, s in self._folders()) or "none"
                raise ParameterError(
                    "{step}: {root!s} has no {folder!s} (steps there: {steps!s}); pick one",
                    step=step,
                    root=self.root,
                    folder=path.name,
                    steps=steps,
                )
            manifest, found = self.check(path)
            if not manifest.healthy:
                raise CheckpointError(f"{path} is marked unhealthy; export a healthy step (see `gpufleet ckpt list`)")
        if manifest.format == "dcp":
            # Verified above (every shard's sha256); DCP assembles the full tensors on this one process.
            from gpufleet.runtime.sharded import full_state

            state = full_state(path, manifest)
        elif found is None:
            raise CheckpointError(f"{path}: nothing was loaded to export")  # unreachable: a torch state is loaded
        else:
            state = found
        if entry not in state:
            raise ParameterError(
                "{entry}: {folder!s} holds {held!s}; pick one of those",
                entry=entry,
                folder=path.name,
                held=", ".join(sorted(state)),
            )
        value = state[entry]
        try:
            write_durably(out, lambda fh: torch.save(value, fh))
        except OSError as err:
            raise ParameterError(
                "{out}: cannot write ({why!s}); choose another path", out=str(out), why=err.strerror
            ) from None
        tensors = _tensor_map(value)
        return ExportedEntry(
            source=path,
            step=manifest.step,
            entry=entry,
            out=out,
            bytes=out.stat().st_size,
            tensors=len(tensors) if tensors is not None else 0,
            fingerprint=model_fingerprint(tensors) if tensors else None,
        )

    # ---- housekeeping -------------------------------------------------------------------
    def prune(self) -> list[Path]:
        """Keep the newest ``keep``, the newest healthy one and the best by ``keep_best``; delete the rest.

        Links named ``step-N`` are not ours to delete and take no place among the ``keep``.
        """
        infos = [i for i in self.scan(verify=False) if not i.path.is_symlink()]
        keep = {info.path for info in infos[-self.keep :]}
        healthy = [i for i in infos if i.restorable]
        if healthy:
            keep.add(healthy[-1].path)
        best = self.best(healthy)
        if best is not None:
            keep.add(best.path)
        removed = [info.path for info in infos if info.path not in keep]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def best(self, infos: list[CheckpointInfo]) -> CheckpointInfo | None:
        """The healthy checkpoint of ``infos`` with the best ``keep_best`` metric (the newest on a tie)."""
        if self.keep_best is None:
            return None
        metric, mode = self.keep_best
        ranked = [
            (i.manifest.metrics[metric], i)
            for i in infos
            if i.restorable and i.manifest and metric in i.manifest.metrics
        ]
        if not ranked:
            return None
        sign = 1.0 if mode == "max" else -1.0
        return max(ranked, key=lambda item: (sign * item[0], item[1].step))[1]

    def drop_after(self, step: int) -> list[Path]:
        """Delete checkpoints newer than ``step`` (a discarded branch after a rollback)."""
        removed = [p for p, s in self._folders() if s > step and not p.is_symlink()]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def clean_temporaries(self) -> None:
        """Remove folders left by saves that were killed (only one writer per directory)."""
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if entry.name.startswith((".tmp-step-", ".old-step-")) and entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)


class _OtherFormat(ForeignCheckpoint):
    """An intact checkpoint of a format its caller cannot load (a sharded one for a single process)."""

    def __init__(self, message: str, manifest: CheckpointManifest) -> None:
        super().__init__(message)
        self.manifest = manifest


def format_problem(path: Path, manifest: CheckpointManifest) -> str:
    if manifest.format == "dcp":
        return (
            f"{path}: a sharded checkpoint (DCP, written by {manifest.world_size} ranks) that a single-process "
            "restore cannot load; restore it with gpufleet.runtime.sharded (any number of ranks, one included)"
        )
    return (
        f"{path}: a single-process checkpoint (torch format) that a sharded restore cannot load; "
        "resume it with one process, or start over in a fresh checkpoint directory"
    )


def _tensor_map(value: Any) -> dict[str, Any] | None:
    """``value`` as a name -> tensor mapping when it is one (a state dict), else ``None``."""
    import torch

    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        return None
    return {k: v for k, v in value.items() if isinstance(v, torch.Tensor)}


__all__ = [
    "MANIFEST",
    "NO_SPACE_ERRNOS",
    "SCHEMA_VERSION",
    "STEP_RE",
    "CheckpointDir",
    "CheckpointInfo",
    "CheckpointManifest",
    "Expectation",
    "ExportedEntry",
    "FileEntry",
    "Format",
    "HashingWriter",
    "format_problem",
    "fsync_dir",
    "is_no_space",
    "manifest_header",
    "model_fingerprint",
    "state_dict_mismatch",
    "step_dirname",
    "torch_crc32_off",
    "write_durably",
]
