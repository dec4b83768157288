"""Checkpoints that survive ``kill -9``: atomic folders with a verified manifest.

Layout (a contract other tools rely on)::

    <dir>/step-00000150/
        model.pt  optimizer.pt  scheduler.pt  trainer.pt  ...   one file per state entry
        manifest.json                                           written last

A save writes every file into ``.tmp-step-<n>-<pid>/`` through a writer that hashes (sha256) in a
second thread while the main one writes, fsyncs each file, writes the manifest, fsyncs the folder,
renames it to ``step-<n>/`` and fsyncs the parent. A process killed at any moment leaves either a
complete checkpoint or a temporary folder that restore ignores. Restore re-hashes every file
before ``torch.load(weights_only=True)``: a byte flipped or a file truncated is reported and that
checkpoint skipped, never loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import CheckpointError, CorruptCheckpoint

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
STEP_RE = re.compile(r"^step-(\d{8})$")
FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\.pt$")


def step_dirname(step: int) -> str:
    return f"step-{step:08d}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointManifest:
    """What ``manifest.json`` holds."""

    schema_version: int
    step: int
    healthy: bool
    loss: float | None
    data_position: int
    reason: str
    created_at: float
    save_seconds: float
    files: dict[str, dict[str, Any]]
    """File name -> ``{"sha256": hex, "bytes": int}``."""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(int(f["bytes"]) for f in self.files.values())

    def to_json(self) -> str:
        loss = self.loss if self.loss is None or (self.loss == self.loss and abs(self.loss) != float("inf")) else None
        return json.dumps(
            {
                "schema_version": self.schema_version,
                "step": self.step,
                "healthy": self.healthy,
                "loss": loss,
                "data_position": self.data_position,
                "reason": self.reason,
                "created_at": self.created_at,
                "save_seconds": self.save_seconds,
                "files": self.files,
                "meta": self.meta,
            },
            indent=2,
            sort_keys=True,
        )

    @classmethod
    def parse(cls, text: str, where: Path) -> CheckpointManifest:
        """Parse an untrusted manifest; raise ``CorruptCheckpoint`` naming what is wrong."""
        try:
            raw = json.loads(text)
        except ValueError as err:
            raise CorruptCheckpoint(f"{where}: manifest is not valid JSON ({err})") from None
        if not isinstance(raw, dict):
            raise CorruptCheckpoint(f"{where}: manifest is not a JSON object")
        version = raw.get("schema_version")
        if version != SCHEMA_VERSION:
            raise CorruptCheckpoint(
                f"{where}: manifest schema_version {version!r} is not {SCHEMA_VERSION} (written by another gpufleet?)"
            )
        files = raw.get("files")
        if not isinstance(files, dict) or not files:
            raise CorruptCheckpoint(f"{where}: manifest lists no files")
        for name, info in files.items():
            if not isinstance(name, str) or not FILE_RE.match(name):
                raise CorruptCheckpoint(f"{where}: manifest names an invalid file {name!r}")
            if (
                not isinstance(info, dict)
                or not isinstance(info.get("sha256"), str)
                or not isinstance(info.get("bytes"), int)
            ):
                raise CorruptCheckpoint(f"{where}: manifest entry for {name} needs sha256 and bytes")
        try:
            loss = raw.get("loss")
            return cls(
                schema_version=version,
                step=int(raw["step"]),
                healthy=bool(raw["healthy"]),
                loss=None if loss is None else float(loss),
                data_position=int(raw.get("data_position", 0)),
                reason=str(raw.get("reason", "")),
                created_at=float(raw["created_at"]),
                save_seconds=float(raw.get("save_seconds", 0.0)),
                files=files,
                meta=dict(raw["meta"]) if isinstance(raw.get("meta"), dict) else {},
            )
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptCheckpoint(f"{where}: manifest field missing or mistyped ({err})") from None


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes in a helper thread while the caller's thread writes.

    ``hashlib`` and ``os.write`` both release the GIL on large buffers, so the two overlap and
    hashing costs almost nothing on top of the write (measured in ``bench/checkpoint_save.py``).
    """

    def __init__(self, path: Path, pool: ThreadPoolExecutor) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._hash = hashlib.sha256()
        self._pool = pool
        self._pending: Future[None] | None = None
        self.bytes = 0

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
        while written < len(view):
            written += os.write(self._fd, view[written:])
        if not small:
            if _FADVISE is not None:
                # Start writing this chunk back to disk while the hash finishes, so the final
                # fsync waits only for the tail (and a save does not evict the page cache).
                os.posix_fadvise(self._fd, start, written, _FADVISE)
            self._pending.result()
            self._pending = None
        self.bytes += written
        return written

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


@contextlib.contextmanager
def _torch_crc32_off() -> Iterator[None]:
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """One folder in a checkpoint directory, as ``ckpt list`` shows it."""

    path: Path
    step: int
    manifest: CheckpointManifest | None
    problem: str | None
    """Why it cannot be restored (``None`` when it verified, or was not verified)."""

    @property
    def restorable(self) -> bool:
        return self.manifest is not None and self.problem is None and self.manifest.healthy


class CheckpointDir:
    """A directory of ``step-N`` checkpoints: save, list, verify, restore, prune."""

    def __init__(self, root: Path, keep: int = 3) -> None:
        self.root = Path(root)
        self.keep = keep

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
    ) -> CheckpointManifest:
        """Write ``state`` (name -> picklable-with-weights_only object) as ``step-<step>``."""
        import torch

        started = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / step_dirname(step)
        tmp = self.root / f".tmp-{step_dirname(step)}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        files: dict[str, dict[str, Any]] = {}
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-hash") as pool, _torch_crc32_off():
            for name, obj in state.items():
                filename = f"{name}.pt"
                if not FILE_RE.match(filename):
                    raise CheckpointError(f"invalid state name {name!r}: use letters, digits, '_', '.', '-'")
                writer = _HashingWriter(tmp / filename, pool)
                try:
                    torch.save(obj, writer)  # type: ignore[arg-type]
                    digest = writer.finish()
                finally:
                    writer.close()
                files[filename] = {"sha256": digest, "bytes": writer.bytes}
        manifest = CheckpointManifest(
            schema_version=SCHEMA_VERSION,
            step=step,
            healthy=healthy,
            loss=loss,
            data_position=data_position,
            reason=reason,
            created_at=time.time(),
            save_seconds=0.0,
            files=files,
            meta=dict(meta or {}),
        )
        manifest = _with_seconds(manifest, time.perf_counter() - started)
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            fh.write(manifest.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():
            # Re-saving a step (resumed, then preempted before the next step): swap atomically
            # enough that a crash leaves either folder or none, never a mix.
            old = self.root / f".old-{step_dirname(step)}-{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        _fsync_dir(self.root)
        return _with_seconds(manifest, time.perf_counter() - started)

    # ---- reading ------------------------------------------------------------------------
    def scan(self, verify: bool = True) -> list[CheckpointInfo]:
        """Every ``step-N`` folder, oldest first, with the reason it cannot be restored."""
        if not self.root.exists():
            return []
        if not self.root.is_dir():
            raise CheckpointError(f"{self.root} is not a directory")
        infos = []
        for entry in sorted(self.root.iterdir()):
            match = STEP_RE.match(entry.name)
            if not match or not entry.is_dir():
                continue
            try:
                manifest = self.verify(entry) if verify else self.read_manifest(entry)
                problem = None if manifest.healthy else "marked unhealthy"
                infos.append(CheckpointInfo(entry, int(match.group(1)), manifest, problem))
            except CorruptCheckpoint as err:
                infos.append(CheckpointInfo(entry, int(match.group(1)), None, str(err)))
        return infos

    def read_manifest(self, path: Path) -> CheckpointManifest:
        try:
            text = (path / MANIFEST).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{path}: no manifest.json (incomplete save)") from None
        except (OSError, UnicodeDecodeError) as err:
            raise CorruptCheckpoint(f"{path}: manifest unreadable ({err})") from None
        manifest = CheckpointManifest.parse(text, path)
        if step_dirname(manifest.step) != path.name:
            raise CorruptCheckpoint(f"{path}: manifest says step {manifest.step}")
        return manifest

    def verify(self, path: Path) -> CheckpointManifest:
        """Check the manifest and every file's size and sha256; raise ``CorruptCheckpoint``."""
        self._read_verified(path, load=False)
        return self.read_manifest(path)

    def _read_verified(self, path: Path, load: bool) -> tuple[CheckpointManifest, dict[str, bytes]]:
        manifest = self.read_manifest(path)
        blobs: dict[str, bytes] = {}
        for name, info in manifest.files.items():
            try:
                data = (path / name).read_bytes()
            except OSError as err:
                raise CorruptCheckpoint(f"{path}: {name} unreadable ({err.strerror})") from None
            if len(data) != info["bytes"]:
                raise CorruptCheckpoint(f"{path}: {name} has {len(data)} bytes, manifest says {info['bytes']}")
            if hashlib.sha256(data).hexdigest() != info["sha256"]:
                raise CorruptCheckpoint(f"{path}: {name} fails its sha256 check")
            if load:
                blobs[name.removesuffix(".pt")] = data
        return manifest, blobs

    def load(self, path: Path) -> tuple[CheckpointManifest, dict[str, Any]]:
        """Verify, then load every file with ``torch.load(weights_only=True)``."""
        import torch

        manifest, blobs = self._read_verified(path, load=True)
        state: dict[str, Any] = {}
        for name, data in blobs.items():
            try:
                state[name] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
                raise CorruptCheckpoint(f"{path}: {name}.pt does not load ({err.__class__.__name__})") from None
        return manifest, state

    def latest(self, *, before_step: int | None = None) -> tuple[CheckpointInfo | None, list[CheckpointInfo]]:
        """The newest restorable checkpoint (below ``before_step``), and the newer ones skipped."""
        skipped: list[CheckpointInfo] = []
        for info in reversed(self.scan(verify=True)):
            if before_step is not None and info.step >= before_step:
                continue
            if info.restorable:
                return info, skipped
            skipped.append(info)
        return None, skipped

    # ---- housekeeping -------------------------------------------------------------------
    def prune(self) -> list[Path]:
        """Keep the newest ``keep`` checkpoints and the newest healthy one; delete the rest."""
        infos = self.scan(verify=False)
        keep = {info.path for info in infos[-self.keep :]}
        healthy = [i for i in infos if i.restorable]
        if healthy:
            keep.add(healthy[-1].path)
        removed = [info.path for info in infos if info.path not in keep]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def drop_after(self, step: int) -> list[Path]:
        """Delete checkpoints newer than ``step`` (a discarded branch after a rollback)."""
        removed = [info.path for info in self.scan(verify=False) if info.step > step]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def clean_temporaries(self) -> None:
        """Remove folders left by saves that were killed (only one writer per directory)."""
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if entry.name.startswith((".tmp-step-", ".old-step-")) and entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)


def _with_seconds(manifest: CheckpointManifest, seconds: float) -> CheckpointManifest:
    from dataclasses import replace

    return replace(manifest, save_seconds=seconds)
