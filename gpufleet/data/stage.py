"""Stage a job's data in: parallel, checked, resumable, and idempotent across attempts.

For each source of a spec's ``data`` block, :class:`Stager` lists the files (one file, or every file
under a prefix), then for each file either reuses a verified copy or copies it:

* **checked**: a file is copied to a temporary name in its folder while it is hashed
  (:func:`gpufleet.data.transfer.copy_verified`), and renamed to its place only when the bytes read equal
  the size the store listed and the digest equals the store's own checksum (an S3 object's full-object
  CRC32 from its ``GetObject`` answer, else a single-part upload's ETag; a GCS ``md5Hash``). Where the
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

A bad source (nothing listed, no access, a file that changed size during the copy, an object replaced
since it was listed, a checksum mismatch, an object key that would land outside its folder) raises
:class:`StageError` naming the file; whatever was half-copied stays under a temporary name and is
removed by the next run.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from gpufleet.data.transfer import (
    CHUNK,
    HASHES,
    PART,
    Listed,
    StageError,
    copy_verified,
    new_hash,
    reason,
)
from gpufleet.extras import require
from gpufleet.spec import DataPolicy, DataSource
from gpufleet.spec.sources import check_relative, check_resolved_hosts, package_hint, split_source

META = ".gpufleet"
"""Folder, inside the job's data folder, of the manifests, the lock and the attempt markers."""
MD5_RE = re.compile(r"^[0-9a-f]{32}$")


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
        raise StageError(f"cannot open {source.source}: {reason(err)}", file=source.source) from None
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
        raise StageError(f"cannot list data source {source.source}: {reason(err)}", file=source.source) from None
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
# Files on disk: hashes, modes, temporary names, links
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
            manifest.close()

    # -- scratch: files in the job's folder, one manifest per destination --------------------

    def _one_scratch(self, fs: Any, item: Listed, dest: Path, manifest: Manifest) -> tuple[bool, str]:
        final = dest / item.rel
        entry = manifest.entries.get(item.rel)
        algo = item.algo or "sha256"
        stat = _stat_key(final)
        if stat is not None and stat[0] == item.size:
            narrow_mode(final, item.copy_mode)
            if entry is not None and entry.get("identity") == item.identity and entry.get("algo") in HASHES:
                # The same object (its ETag is in the identity), checked at its copy by the checksum the
                # copy found (the object's own CRC32 comes only with its content): check it again by that.
                algo = str(entry["algo"])
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
        tmp, algo, digest = copy_verified(fs, item, blobs / ".incoming", self._advance, store_checksum=False)
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
    "stage_for_attempt",
]
