"""Stage a job's data in: parallel, checked, resumable, and idempotent across attempts.

For each source of a spec's ``data`` block, :class:`Stager` lists the files (one file, or every file
under a prefix), then for each file either reuses a verified copy or copies it:

* **checked**: a file is copied to a temporary name in its folder while it is hashed, and renamed
  to its place only when the bytes read equal the size the store listed and the digest equals the
  store's own checksum (an S3 ETag of a single-part upload and a GCS ``md5Hash`` are MD5s). Where the
  store gives none, the SHA-256 of the first copy is written to the manifest and later copies are
  checked against the file's identity (size and version: ETag, or modification time) instead;
* **resumable**: the manifest (one JSON line per verified file, appended as each is renamed) says
  what is already there. A re-run reuses a file whose size and modification time still match its
  entry and whose source is unchanged (``verify: full`` hashes it again), re-hashes a file that is
  there but not in the manifest (a run killed between the rename and the line), and copies the rest.
  A temporary file left by a killed run is removed, never trusted;
* **idempotent across attempts**: the first process of an attempt to take the data folder's lock
  stages and leaves a marker; the job's other ranks on that node find it and go on. An attempt after
  a preemption finds every file verified and copies nothing;
* **shared cache** (``cache: shared``): files are stored once per content under
  ``$GPUFLEET_DATA_CACHE`` (default ``$GPUFLEET_HOME/cache/data``) as read-only blobs named by their
  digest, and hard-linked (or, across file systems, symlinked) into the job's folder. A second job
  staging the same objects links them and copies nothing;
* **never more readable than the source**: a copy of a local file keeps its permission bits (a blob
  drops the write bits, and a blob reused for a narrower source is narrowed); an object store's files,
  which have none, are ``0644`` (blobs ``0444``), less the umask. A host a source names that resolves
  to a link-local or cloud metadata address is refused before anything is read
  (:func:`gpufleet.spec.sources.check_resolved_hosts`).

A bad source (nothing listed, no access, a file that changed size during the copy, a checksum
mismatch, an object key that would land outside its folder) raises :class:`StageError` naming the
file; whatever was half-copied stays under a temporary name and is removed by the next run.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import re
import stat
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from gpufleet.errors import GpufleetError
from gpufleet.extras import require
from gpufleet.spec import DataPolicy, DataSource
from gpufleet.spec.sources import check_relative, check_resolved_hosts, package_hint, split_source

CHUNK = 8 << 20
"""Bytes read, hashed and written at a time (and the read-ahead block of a remote file)."""
PART = ".gfpart-"
"""Infix of a file being copied: ``.<name>.gfpart-<pid>-<thread>``, renamed when verified."""
META = ".gpufleet"
"""Folder, inside the job's data folder, of the manifests, the lock and the attempt markers."""
MD5_RE = re.compile(r"^[0-9a-f]{32}$")
STORE_MODE = 0o644
"""Permission bits of a copy of a file whose store has none (an object), before the umask."""


class StageError(GpufleetError):
    """Staging failed: a file named, nothing half-copied left as verified."""

    exit_code = 1

    def __init__(self, message: str, *, file: str | None = None) -> None:
        super().__init__(message)
        self.file = file


@dataclass(frozen=True, slots=True)
class Listed:
    """One file of a source, as its store lists it."""

    rel: str
    """Path under the destination folder."""
    path: str
    """Path on its file system (what ``fs.open`` takes)."""
    url: str
    size: int
    version: str
    """What changes when the file does: the ETag, else the modification time."""
    algo: str | None = None
    """The store's own checksum of the content, the cheapest to check: ``crc32`` (an S3 full-object
    checksum), ``sha256``, ``sha1`` or ``md5`` (an S3 single-part ETag, a GCS md5Hash); ``None``: none."""
    digest: str | None = None
    """That checksum in hex."""
    md5: str | None = None
    """The content's MD5 when the store gives it: what names a blob of the shared cache."""
    protocol: str = "file"
    mode: int | None = None
    """The source file's permission bits (a local file); ``None`` where the store has none."""

    @property
    def identity(self) -> str:
        return f"{self.url}|{self.size}|{self.version}"

    @property
    def copy_mode(self) -> int:
        """The widest permission bits a copy of this file may have: the source's own, else :data:`STORE_MODE`."""
        return STORE_MODE if self.mode is None else self.mode


@dataclass(slots=True)
class SourceReport:
    source: str
    dest: str
    cache: str
    files: int = 0
    bytes: int = 0
    files_copied: int = 0
    bytes_copied: int = 0
    files_reused: int = 0
    checksums: dict[str, int] = field(default_factory=dict)
    """Files by how they were checked: ``md5`` (the store's), ``sha256`` (manifest of the first copy)."""


@dataclass(slots=True)
class StageReport:
    """What one staging did: per source, and in all."""

    sources: list[SourceReport]
    seconds: float
    workers: int

    @property
    def files(self) -> int:
        return sum(s.files for s in self.sources)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.sources)

    @property
    def files_copied(self) -> int:
        return sum(s.files_copied for s in self.sources)

    @property
    def bytes_copied(self) -> int:
        return sum(s.bytes_copied for s in self.sources)

    @property
    def files_reused(self) -> int:
        return sum(s.files_reused for s in self.sources)

    @property
    def copy_bytes_per_s(self) -> float | None:
        return self.bytes_copied / self.seconds if self.bytes_copied and self.seconds > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 6),
            "workers": self.workers,
            "files": self.files,
            "bytes": self.bytes,
            "files_copied": self.files_copied,
            "bytes_copied": self.bytes_copied,
            "files_reused": self.files_reused,
            "copy_bytes_per_s": self.copy_bytes_per_s,
            "sources": [asdict(s) for s in self.sources],
        }


Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes to do) as staging goes."""


# --------------------------------------------------------------------------------------------
# Listing a source
# --------------------------------------------------------------------------------------------


def open_source(source: DataSource) -> tuple[Any, str, str]:
    """``(file system, protocol, root path)`` of a source; ``StageError`` when its package is missing."""
    fsspec = require("fsspec", "data", "staging a job's data sources")

    try:
        protocol, path = split_source(source.source)
        if not source.allow_link_local:
            check_resolved_hosts(source.source, source.endpoint_url)
    except ValueError as err:
        raise StageError(str(err), file=source.source) from None
    hint = package_hint(protocol)
    if hint is not None:
        raise StageError(f"cannot read {source.source}: {hint}", file=source.source)
    options: dict[str, Any] = {}
    if source.endpoint_url is not None:
        options["endpoint_url"] = source.endpoint_url
    try:
        # A fresh instance, no cached listing: a listing from an earlier staging in this process
        # would name old ETags, and a store refuses a read that is conditional on one (412).
        fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
        fs.invalidate_cache()
    except Exception as err:  # noqa: BLE001 - a file system that cannot start: say which, and why
        raise StageError(f"cannot open {source.source}: {_reason(err)}", file=source.source) from None
    return fs, protocol, path.rstrip("/") if protocol != "file" else path


def _version(info: dict[str, Any]) -> str:
    for key in ("ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "last_modified", "updated"):
        value = info.get(key)
        if value not in (None, ""):
            return str(value).strip('"')
    return ""


def _md5(protocol: str, info: dict[str, Any]) -> str | None:
    algo, digest = _expected(protocol, info)
    return digest if algo == "md5" else None


def _expected(protocol: str, info: dict[str, Any]) -> tuple[str | None, str | None]:
    """The content's MD5 when the store gives one (an S3 single-part ETag, a GCS md5Hash)."""
    if protocol in ("s3", "s3a"):
        etag = str(info.get("ETag") or info.get("etag") or "").strip('"').lower()
        if MD5_RE.match(etag):
            return "md5", etag
    if protocol in ("gs", "gcs") and isinstance(info.get("md5Hash"), str):
        with contextlib.suppress(ValueError):
            return "md5", base64.b64decode(info["md5Hash"], validate=True).hex()
    return None, None


def list_source(source: DataSource) -> tuple[Any, list[Listed]]:
    """The files of ``source``, sorted by their path under the destination."""
    fs, protocol, root = open_source(source)
    try:
        found, base = fs.find(root, detail=True, withdirs=False), root  # a prefix or a folder: one listing
        if not found or list(found) == [root]:  # nothing under it, or one object: is it a file?
            info = fs.info(root)
            if info.get("type") == "file":
                found, base = {root: info}, root.rsplit("/", 1)[0]
    except FileNotFoundError:
        raise StageError(f"data source {source.source} does not exist (no such key, prefix or file)") from None
    except Exception as err:  # noqa: BLE001 - credentials, network, permissions: the store's own words
        raise StageError(f"cannot list data source {source.source}: {_reason(err)}", file=source.source) from None
    listed: list[Listed] = []
    for path, meta in found.items():
        if meta.get("type", "file") != "file" or path.endswith("/"):
            continue
        rel = path[len(base) :].lstrip("/") if path.startswith(base) else path.rsplit("/", 1)[-1]
        url = path if protocol == "file" else f"{protocol}://{path}"
        try:
            check_relative(rel, what=f"file {url}:")
        except ValueError as err:
            raise StageError(str(err), file=url) from None
        size = meta.get("size")
        if not isinstance(size, int) or size < 0:
            raise StageError(f"{url}: the store gives no size for it", file=url)
        algo, digest = _expected(protocol, meta)
        mode = meta.get("mode") if protocol == "file" else None
        listed.append(
            Listed(
                rel=rel,
                path=path,
                url=url,
                size=size,
                version=_version(meta),
                algo=algo,
                digest=digest,
                md5=_md5(protocol, meta),
                protocol=protocol,
                mode=stat.S_IMODE(mode) if isinstance(mode, int) else None,
            )
        )
    if not listed:
        raise StageError(f"data source {source.source} holds no files", file=source.source)
    listed.sort(key=lambda item: item.rel)
    return fs, listed


S3_CHECKSUMS = (("ChecksumCRC32", "crc32"), ("ChecksumSHA256", "sha256"), ("ChecksumSHA1", "sha1"))
"""S3's full-object checksums this module can check, cheapest first (CRC32 with zlib: about three
times the speed of MD5 here, and verifying is what bounds a copy on a machine of few cores)."""


def _with_checksum(item: Listed, found: dict[str, Any] | None) -> Listed:
    """``item`` with the first full-object checksum of a ``HeadObject`` answer this module can check."""
    if found is None or found.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
        return item
    for field_name, algo in S3_CHECKSUMS:
        value = found.get(field_name)
        if isinstance(value, str) and "-" not in value:
            with contextlib.suppress(ValueError):
                return replace(item, algo=algo, digest=base64.b64decode(value, validate=True).hex())
    return item


def prefetch_checksums(fs: Any, listed: list[Listed]) -> dict[str, Future[dict[str, Any] | None]]:
    """Ask S3 for each object's own full-object checksum (``HeadObject`` with ``ChecksumMode``), in the background.

    SDKs store a CRC32 (or a CRC64NVME, a CRC32C, a SHA) with every object they upload; an object without
    one this module can check (older uploads, composite multipart checksums) keeps the ETag's MD5, or
    none. The requests go out at once, in listing order, on fsspec's event loop, while the workers copy:
    a worker waits only for its own file's answer. Empty for other stores.
    """
    if not listed or listed[0].protocol not in ("s3", "s3a"):
        return {}
    import asyncio

    limit = asyncio.Semaphore(16)  # bound to fsspec's loop at its first use

    async def head(item: Listed) -> dict[str, Any] | None:
        bucket, key, version = fs.split_path(item.path)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "ChecksumMode": "ENABLED"}
        if version:
            kwargs["VersionId"] = version
        try:
            async with limit:
                return dict(await fs._call_s3("head_object", **kwargs))
        except Exception:  # noqa: BLE001 - no checksum then: the ETag (or a manifest) checks the copy
            return None

    return {item.path: asyncio.run_coroutine_threadsafe(head(item), fs.loop) for item in listed}


class _Crc32:
    """``zlib.crc32`` behind hashlib's interface (S3's CRC32 is the same polynomial)."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def new_hash(algo: str) -> Any:
    """A hasher for a checksum name this module writes: ``crc32``, or any of hashlib's."""
    return _Crc32() if algo == "crc32" else hashlib.new(algo)


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    name = type(err).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return f"{text}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile) for the job"
    if isinstance(err, PermissionError):
        return f"access denied ({text}): check the job's credentials"
    return text[:300]


# --------------------------------------------------------------------------------------------
# Manifests, locks, markers
# --------------------------------------------------------------------------------------------


def _slug(dest: str) -> str:
    return dest.strip("/").replace("/", "__")


class Manifest:
    """Append-only JSON lines, one per verified file; the last line for a key wins, a torn one is ignored."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        if path.exists():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                        self.entries[entry["key"]] = entry
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = path.open("a", encoding="utf-8")

    def add(self, key: str, **data: Any) -> None:
        entry = {"key": key, **data}
        with self._lock:
            self.entries[key] = entry
            self._fh.write(json.dumps(entry, separators=(",", ":")) + "\n")
            self._fh.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.fsync(self._fh.fileno())
        self._fh.close()


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder/.lock`` exclusively (``flock``): one stager per folder at a time, released on death."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def default_cache(home: Path) -> Path:
    """The shared cache: ``$GPUFLEET_DATA_CACHE``, else ``$GPUFLEET_HOME/cache/data``."""
    env = os.environ.get("GPUFLEET_DATA_CACHE")
    return Path(env) if env else home / "cache" / "data"


# --------------------------------------------------------------------------------------------
# Copying one file
# --------------------------------------------------------------------------------------------


def _hash_file(path: Path, algo: str) -> str:
    h = new_hash(algo)
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return str(h.hexdigest())


def narrow_mode(path: Path, widest: int) -> None:
    """Take from ``path`` the permission bits ``widest`` lacks (never adds one): a copy kept from an earlier
    staging, or a shared blob, is no more readable than the source it now stands for."""
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & ~widest:
            os.chmod(path, mode & widest)


def _stat_key(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


ALIGN = 4096
"""O_DIRECT writes: buffer address, file offset and length a multiple of this (any logical block size up to 4 KiB)."""


_THREAD = threading.local()


def _aligned_buffer() -> mmap.mmap:
    """This thread's page-aligned buffer of ``CHUNK`` bytes, made once: a fresh one per file would fault in
    (and zero) every page again, a cost as large as the copy itself."""
    buffer: mmap.mmap | None = getattr(_THREAD, "buffer", None)
    if buffer is None:
        buffer = _THREAD.buffer = mmap.mmap(-1, CHUNK)
    return buffer


class _Sink:
    """The file a copy is written to: with ``O_DIRECT`` where the file system takes it, else through the page cache.

    Direct I/O skips the kernel's copy into the page cache, which here costs as much CPU as reading from
    the store (the copy halves on two busy cores); a chunk is copied once into an aligned buffer and the
    disk reads it from there. The first unaligned chunk (the file's tail, a short read) turns ``O_DIRECT``
    off for the rest of the file, as does a file system that accepts the flag at open and refuses the write.
    """

    def __init__(self, path: Path, mode: int = STORE_MODE) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        direct = getattr(os, "O_DIRECT", 0)
        self.fd = -1
        self.buffer: mmap.mmap | None = None
        if direct:
            with contextlib.suppress(OSError):
                self.fd = os.open(path, flags | direct, mode)
                self.buffer = _aligned_buffer()
        if self.fd < 0:
            self.fd = os.open(path, flags, mode)
        held = stat.S_IMODE(os.fstat(self.fd).st_mode)
        if held & ~mode:  # a file left under this name: O_CREAT kept its old mode
            os.fchmod(self.fd, held & mode)

    def write(self, chunk: bytes) -> None:
        n = len(chunk)
        if self.buffer is not None and n <= CHUNK and n % ALIGN == 0:
            view = memoryview(self.buffer)
            try:
                view[:n] = chunk
                try:
                    self._write_all(view[:n])
                    return
                except OSError as err:
                    if err.errno != errno.EINVAL:
                        raise
            finally:
                view.release()
        if self.buffer is not None:
            self._buffered()
        self._write_all(memoryview(chunk))

    def _buffered(self) -> None:
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~getattr(os, "O_DIRECT", 0))
        self.buffer = None

    def _write_all(self, data: memoryview) -> None:
        done = 0
        while done < len(data):
            done += os.write(self.fd, data[done:])

    def close(self, *, sync: bool) -> None:
        try:
            if sync:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)
            self.buffer = None


def copy_verified(fs: Any, item: Listed, folder: Path, progress: Callable[[int], None]) -> tuple[Path, str, str]:
    """Copy ``item`` into ``folder`` under a temporary name, hashing as it goes; check size and digest.

    Returns ``(temporary path, algorithm, digest)``: the caller renames it into place. On any
    failure the temporary file is removed and ``StageError`` names the file.
    """
    algo = item.algo or "sha256"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{item.rel.rsplit('/', 1)[-1][:180]}{PART}{os.getpid()}-{threading.get_ident()}"
    h = new_hash(algo)
    read = 0
    try:
        with fs.open(item.path, "rb", block_size=CHUNK, cache_type="none") as src:
            out = _Sink(tmp, item.copy_mode)
            try:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    read += len(chunk)
                    progress(len(chunk))
                    if read > item.size:
                        break
            except BaseException:
                out.close(sync=False)
                raise
            out.close(sync=True)
    except StageError:
        tmp.unlink(missing_ok=True)
        raise
    except Exception as err:  # noqa: BLE001 - the store's or the disk's error, with the file it hit
        tmp.unlink(missing_ok=True)
        words = _reason(err)
        if "checksum" in words.lower():
            words = f"checksum mismatch reported by the client ({words})"
        raise StageError(f"{item.url}: copy failed: {words}", file=item.url) from None
    if read != item.size:
        tmp.unlink(missing_ok=True)
        raise StageError(
            f"{item.url} changed size during the copy: listed {item.size:,} bytes, read "
            f"{read:,}{' or more' if read > item.size else ''}",
            file=item.url,
        )
    digest = str(h.hexdigest())
    if item.digest is not None and digest != item.digest:
        tmp.unlink(missing_ok=True)
        raise StageError(
            f"{item.url}: checksum mismatch: the store says {algo} {item.digest}, the bytes read hash to {digest}",
            file=item.url,
        )
    return tmp, algo, digest


def _sweep_parts(folder: Path) -> None:
    """Remove what killed runs were copying: temporary files are never trusted."""
    if not folder.exists():
        return
    for path in folder.rglob(f"*{PART}*"):
        with contextlib.suppress(OSError):
            path.unlink()


def _place(target: Path, final: Path) -> None:
    """Make ``final`` the blob ``target``: a hard link, or a symlink where they are on two file systems."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        if final.samefile(target):
            return
    tmp = final.with_name(f".{final.name[:180]}{PART}{os.getpid()}-{threading.get_ident()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(target, tmp)
    except OSError:
        os.symlink(target, tmp)
    os.replace(tmp, final)


# --------------------------------------------------------------------------------------------
# The stager
# --------------------------------------------------------------------------------------------


class Stager:
    """Stage a :class:`DataPolicy` into ``data_root`` (the job's ``data`` folder)."""

    def __init__(
        self, policy: DataPolicy, data_root: Path, *, cache_root: Path | None = None, progress: Progress | None = None
    ) -> None:
        self.policy = policy
        self.data_root = data_root
        self.cache_root = cache_root if cache_root is not None else data_root / META / "cache"
        self.progress = progress
        self._done = 0
        self._total = 0
        self._lock = threading.Lock()
        self._heads: dict[str, Future[dict[str, Any] | None]] = {}

    def _advance(self, n: int) -> None:
        with self._lock:
            self._done += n
            done, total = self._done, self._total
        if self.progress is not None:
            self.progress(done, total)

    def run(self) -> StageReport:
        started = time.perf_counter()
        listings = [(source, *list_source(source)) for source in self.policy.sources]
        reports = [SourceReport(source=s.source, dest=s.dest, cache=s.cache) for s in self.policy.sources]
        self._total = sum(item.size for _, _, listed in listings for item in listed)
        if self.progress is not None:
            self.progress(0, self._total)
        for (source, fs, listed), report in zip(listings, reports, strict=True):
            report.files = len(listed)
            report.bytes = sum(item.size for item in listed)
            if source.cache == "shared":
                with locked(self.cache_root):
                    self._stage(source, fs, listed, report)
            else:
                self._stage(source, fs, listed, report)
        return StageReport(sources=reports, seconds=time.perf_counter() - started, workers=self.policy.workers)

    def _stage(self, source: DataSource, fs: Any, listed: list[Listed], report: SourceReport) -> None:
        dest = self.data_root / source.dest
        shared = source.cache == "shared"
        manifest = Manifest(
            self.cache_root / "index.jsonl"
            if shared
            else self.data_root / META / f"manifest-{_slug(source.dest)}.jsonl"
        )
        _sweep_parts(dest)
        if shared:
            _sweep_parts(self.cache_root / "blobs")
        one = self._one_shared if shared else self._one_scratch
        self._heads = {} if shared else prefetch_checksums(fs, listed)  # shared blobs are named by the MD5
        try:
            with ThreadPoolExecutor(max_workers=self.policy.workers, thread_name_prefix="gpufleet-stage") as pool:
                futures = {pool.submit(one, fs, item, dest, manifest): item for item in listed}
                try:
                    for future in as_completed(futures):
                        copied, algo = future.result()
                        size = futures[future].size
                        if copied:
                            report.files_copied += 1
                            report.bytes_copied += size
                        else:
                            report.files_reused += 1
                            self._advance(size)
                        report.checksums[algo] = report.checksums.get(algo, 0) + 1
                except BaseException:
                    for future in futures:
                        future.cancel()
                    raise
        finally:
            for pending in self._heads.values():
                pending.cancel()
            self._heads = {}
            manifest.close()

    # -- scratch: files in the job's folder, one manifest per destination --------------------

    def _one_scratch(self, fs: Any, item: Listed, dest: Path, manifest: Manifest) -> tuple[bool, str]:
        head = self._heads.get(item.path)
        if head is not None:
            item = _with_checksum(item, head.result())
        final = dest / item.rel
        entry = manifest.entries.get(item.rel)
        algo = item.algo or "sha256"
        stat = _stat_key(final)
        if stat is not None and stat[0] == item.size:
            narrow_mode(final, item.copy_mode)
            if entry is not None and entry.get("identity") == item.identity and entry.get("algo") == algo:
                if self.policy.verify == "stat" and [entry.get("size"), entry.get("mtime_ns")] == list(stat):
                    return False, algo
                if _hash_file(final, algo) == entry.get("digest"):
                    manifest.add(item.rel, **self._entry(item, algo, str(entry["digest"]), final))
                    return False, algo
            elif item.digest is not None and _hash_file(final, algo) == item.digest:
                manifest.add(item.rel, **self._entry(item, algo, item.digest, final))
                return False, algo
        tmp, algo, digest = copy_verified(fs, item, final.parent, self._advance)
        os.replace(tmp, final)
        manifest.add(item.rel, **self._entry(item, algo, digest, final))
        return True, algo

    @staticmethod
    def _entry(item: Listed, algo: str, digest: str, final: Path) -> dict[str, Any]:
        st = final.stat()
        return {
            "identity": item.identity,
            "algo": algo,
            "digest": digest,
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
        }

    # -- shared: read-only blobs named by their digest, linked into the job's folder ----------

    def _one_shared(self, fs: Any, item: Listed, dest: Path, index: Manifest) -> tuple[bool, str]:
        # Blobs are named by a digest strong enough to share a cache between jobs (not a CRC): the
        # store's MD5 where it gives one, else the SHA-256 of the first copy.
        item = replace(item, algo="md5" if item.md5 else None, digest=item.md5)
        blobs = self.cache_root / "blobs"
        entry = index.entries.get(item.identity)
        if item.digest is not None:
            name = f"{item.algo}-{item.digest}"
        elif (
            entry is not None
            and isinstance(entry.get("blob"), str)
            and re.match(r"^[a-z0-9]+-[0-9a-f]+$", entry["blob"])
        ):
            name = entry["blob"]
        else:
            name = None
        if name is not None:
            blob = blobs / name.split("-", 1)[1][:2] / name
            stat = _stat_key(blob)
            if stat is not None and stat[0] == item.size:
                algo, digest = name.split("-", 1)
                fresh = (
                    entry is not None
                    and entry.get("blob") == name
                    and [entry.get("size"), entry.get("mtime_ns")] == list(stat)
                )
                if (fresh and self.policy.verify == "stat") or _hash_file(blob, algo) == digest:
                    narrow_mode(blob, item.copy_mode)
                    if not fresh:
                        index.add(item.identity, blob=name, size=stat[0], mtime_ns=stat[1])
                    _place(blob, dest / item.rel)
                    return False, algo
        tmp, algo, digest = copy_verified(fs, item, blobs / ".incoming", self._advance)
        name = f"{algo}-{digest}"
        blob = blobs / digest[:2] / name
        blob.parent.mkdir(parents=True, exist_ok=True)
        narrow_mode(tmp, item.copy_mode & ~0o222)  # read-only, and no wider than the source
        os.replace(tmp, blob)
        st = blob.stat()
        index.add(item.identity, blob=name, size=st.st_size, mtime_ns=st.st_mtime_ns)
        _place(blob, dest / item.rel)
        return True, algo


# --------------------------------------------------------------------------------------------
# Once per attempt
# --------------------------------------------------------------------------------------------


def marker(data_root: Path, attempt: int) -> Path:
    return data_root / META / f"staged-attempt-{attempt}.json"


def stage_for_attempt(
    policy: DataPolicy, data_root: Path, attempt: int, *, cache_root: Path, progress: Progress | None = None
) -> StageReport | None:
    """Stage once per attempt and data folder: ``None`` when another rank of this attempt already did."""
    meta = data_root / META
    with locked(meta):
        done = marker(data_root, attempt)
        if done.exists():
            return None
        report = Stager(policy, data_root, cache_root=cache_root, progress=progress).run()
        tmp = done.with_suffix(".tmp")
        tmp.write_text(json.dumps(report.to_json()), encoding="utf-8")
        os.replace(tmp, done)
        return report


__all__ = [
    "CHUNK",
    "Listed",
    "Manifest",
    "SourceReport",
    "StageError",
    "StageReport",
    "Stager",
    "copy_verified",
    "default_cache",
    "list_source",
    "locked",
    "open_source",
    "prefetch_checksums",
    "stage_for_attempt",
]
