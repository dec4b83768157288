"""Copy one file of a data source into a folder, checked on the way: what :mod:`gpufleet.data.stage` runs per file.

:func:`copy_verified` reads a :class:`Listed` file in :data:`CHUNK`-byte pieces straight into the
thread's page-aligned buffer, hashes each piece there, and writes it from the same buffer (``O_DIRECT``
where the file system takes it, :class:`_Sink`), so a chunk crosses user memory once. The copy goes to
a temporary name (:data:`PART`) and is returned to the caller to rename only when the bytes read equal
the listed size and their digest equals the store's checksum.

An S3 object is read with one conditional ``GetObject`` (:class:`_ObjectReader`): checksum mode on, so
the answer carries the object's full-object CRC32, and ``If-Match`` its listed ETag, so an object
replaced since it was listed is refused rather than copied half old, half new. Its CRC32 is computed
once, on the worker's thread, from the raw HTTP stream; a connection dropped mid-body is resumed from
the byte reached. Any other file system's file is read through fsspec (:class:`_FileReader`).

What a copy shares with the stager (:class:`Listed`, :class:`StageError`, the checksums a manifest may
name) is defined here, below it, and re-exported by :mod:`gpufleet.data.stage`.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
import re
import stat
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpufleet.errors import GpufleetError

CHUNK = 8 << 20
"""Bytes read, hashed and written at a time (and the read-ahead block of a remote file)."""
PART = ".gfpart-"
"""Infix of a file being copied: ``.<name>.gfpart-<pid>-<thread>``, renamed when verified."""
ETAG_RE = re.compile(r"^[0-9A-Za-z]+(-[0-9]+)?$")
"""An S3 ETag as listings give it (quotes stripped): an MD5, or a multipart upload's ``<hex>-<parts>``."""
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


def reason(err: BaseException) -> str:
    """The first line of a store's or a disk's error, with the fix where the error says which."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    name = type(err).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return f"{text}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile) for the job"
    if isinstance(err, PermissionError):
        return f"access denied ({text}): check the job's credentials"
    return text[:300]


S3_CHECKSUMS = (("ChecksumCRC32", "crc32"), ("ChecksumSHA256", "sha256"), ("ChecksumSHA1", "sha1"))
"""S3's full-object checksums this module can check, cheapest first (CRC32 with zlib: about three
times the speed of MD5 here, and verifying is what bounds a copy on a machine of few cores)."""


def _with_checksum(item: Listed, found: dict[str, Any] | None) -> Listed:
    """``item`` with the first full-object checksum this module can check in a ``GetObject`` answer."""
    if found is None or found.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
        return item
    for field_name, algo in S3_CHECKSUMS:
        value = found.get(field_name)
        if isinstance(value, str) and "-" not in value:
            with contextlib.suppress(ValueError):
                return replace(item, algo=algo, digest=base64.b64decode(value, validate=True).hex())
    return item


class _Crc32:
    """``zlib.crc32`` behind hashlib's interface (S3's CRC32 is the same polynomial)."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


HASHES = frozenset({"crc32", "md5", "sha1", "sha256"})
"""The checksums a manifest may name (a manifest is untrusted input: nothing else is hashed by name)."""


def new_hash(algo: str) -> Any:
    """A hasher for a checksum name this module writes: ``crc32``, or any of hashlib's."""
    return _Crc32() if algo == "crc32" else hashlib.new(algo)


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
    """The file a copy is written to, from the thread's aligned buffer: with ``O_DIRECT`` where the file
    system takes it, else through the page cache.

    Direct I/O skips the kernel's copy into the page cache, which here costs as much CPU as reading from
    the store (the copy halves on two busy cores). The source is read straight into the aligned buffer
    and the disk takes it from there, so a chunk crosses user memory once. The first unaligned write (the
    file's tail, a short read) turns ``O_DIRECT`` off for the rest of the file, as does a file system that
    accepts the flag at open and refuses the write.
    """

    def __init__(self, path: Path, mode: int = STORE_MODE) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        direct = getattr(os, "O_DIRECT", 0)
        self.fd = -1
        self.direct = False
        self.view = memoryview(_aligned_buffer())
        if direct:
            with contextlib.suppress(OSError):
                self.fd = os.open(path, flags | direct, mode)
                self.direct = True
        if self.fd < 0:
            self.fd = os.open(path, flags, mode)
        held = stat.S_IMODE(os.fstat(self.fd).st_mode)
        if held & ~mode:  # a file left under this name: O_CREAT kept its old mode
            os.fchmod(self.fd, held & mode)

    def write(self, n: int) -> None:
        """Write the first ``n`` bytes of :attr:`view`."""
        data = self.view[:n]
        try:
            if self.direct and n % ALIGN == 0:
                try:
                    self._write_all(data)
                    return
                except OSError as err:
                    if err.errno != errno.EINVAL:
                        raise
            if self.direct:
                fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~getattr(os, "O_DIRECT", 0))
                self.direct = False
            self._write_all(data)
        finally:
            data.release()

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
            self.view.release()


class _FileReader:
    """A file of any fsspec file system, read through its file object into the caller's buffer."""

    def __init__(self, fs: Any, item: Listed) -> None:
        self.item = item
        self._src = fs.open(item.path, "rb", block_size=CHUNK, cache_type="none")

    def fill(self, view: memoryview) -> int:
        readinto = getattr(self._src, "readinto", None)
        if readinto is not None:  # a local file reads straight into the buffer
            return int(readinto(view))
        data = self._src.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._src.close()


class _ObjectReader:
    """An S3 object read with one ``GetObject`` (``ChecksumMode`` on, ``If-Match`` its listed ETag), its
    body streamed into the caller's buffer on fsspec's event loop.

    The answer carries the object's own full-object checksum, so no ``HeadObject`` per object is needed
    to learn it (on a small machine that shares its CPU with the store, each request costs both sides
    milliseconds). The body is read from the HTTP stream itself, not through the SDK's checksumming
    wrapper, which would compute the same CRC a second time: :func:`copy_verified` computes it once,
    on the worker's thread, and compares it with the answer's. A connection that drops mid-body is
    resumed from the byte it reached (a ranged ``GetObject``, still conditional on the ETag), up to the
    file system's retry count.
    """

    def __init__(self, fs: Any, item: Listed, *, store_checksum: bool) -> None:
        self._fs = fs
        bucket, key, version = fs.split_path(item.path)
        self._request: dict[str, Any] = {"Bucket": bucket, "Key": key, "ChecksumMode": "ENABLED"}
        if version:
            self._request["VersionId"] = version
        if ETAG_RE.match(item.version):  # the listing's ETag (not a date where a store gave none)
            self._request["IfMatch"] = f'"{item.version}"'
        self._body: Any = None
        self._offset = 0
        self._retries = int(getattr(fs, "retries", 5))
        answer = self._sync(self._open)
        self.item = _with_checksum(item, answer) if store_checksum else item

    def _sync(self, coroutine: Callable[..., Any], *args: Any) -> Any:
        from fsspec.asyn import sync

        return sync(self._fs.loop, coroutine, *args)

    async def _open(self, offset: int = 0) -> dict[str, Any]:
        request = dict(self._request, Range=f"bytes={offset}-") if offset else self._request
        answer: dict[str, Any] = await self._fs._call_s3("get_object", **request)
        self._body = answer["Body"]
        if offset and not str(answer.get("ContentRange", "")).startswith(f"bytes {offset}-"):
            raise OSError(f"the store answered a read from byte {offset:,} with {answer.get('ContentRange')!r}")
        return answer

    def _stream(self) -> Any:
        """The HTTP body itself (aiohttp's ``StreamReader``) where the SDK exposes it, else the SDK's body."""
        raw = getattr(self._body, "raw_stream", None)
        content = getattr(raw, "content", None)
        return content if content is not None and hasattr(content, "readany") else self._body

    async def _fill(self, view: memoryview) -> int:
        import aiohttp

        n, tries = 0, 0
        while n < len(view):
            try:
                piece = await self._stream().read(len(view) - n)
            except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
                tries += 1
                if tries > self._retries:
                    raise
                self._body.close()
                await self._open(self._offset + n)
                continue
            if not piece:
                break
            view[n : n + len(piece)] = piece
            n += len(piece)
        self._offset += n
        return n

    def fill(self, view: memoryview) -> int:
        return int(self._sync(self._fill, view))

    async def _close(self) -> None:
        if self._body is not None:
            self._body.close()

    def close(self) -> None:
        self._sync(self._close)


def _reader(fs: Any, item: Listed, *, store_checksum: bool) -> _FileReader | _ObjectReader:
    if item.protocol in ("s3", "s3a") and hasattr(fs, "_call_s3"):
        return _ObjectReader(fs, item, store_checksum=store_checksum)
    return _FileReader(fs, item)


def copy_verified(
    fs: Any, item: Listed, folder: Path, progress: Callable[[int], None], *, store_checksum: bool = True
) -> tuple[Path, str, str]:
    """Copy ``item`` into ``folder`` under a temporary name, hashing as it goes; check size and digest.

    An S3 object is checked against the full-object checksum its ``GetObject`` answer carries where it
    has one this module can check (``store_checksum``; a shared blob passes ``False``: it is named by the
    MD5), else against what the listing gave (the ETag's MD5). Returns ``(temporary path, algorithm,
    digest)``: the caller renames it into place. On any failure the temporary file is removed and
    ``StageError`` names the file.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{item.rel.rsplit('/', 1)[-1][:180]}{PART}{os.getpid()}-{threading.get_ident()}"
    read = 0
    try:
        src = _reader(fs, item, store_checksum=store_checksum)
        try:
            item = src.item
            algo = item.algo or "sha256"
            h = new_hash(algo)
            out = _Sink(tmp, item.copy_mode)
            try:
                while n := src.fill(out.view):
                    chunk = out.view[:n]
                    h.update(chunk)
                    chunk.release()
                    out.write(n)
                    read += n
                    progress(n)
                    if read > item.size:
                        break
            except BaseException:
                out.close(sync=False)
                raise
            out.close(sync=True)
        finally:
            src.close()
    except StageError:
        tmp.unlink(missing_ok=True)
        raise
    except Exception as err:  # noqa: BLE001 - the store's or the disk's error, with the file it hit
        tmp.unlink(missing_ok=True)
        words = reason(err)
        if "checksum" in words.lower():
            words = f"checksum mismatch reported by the client ({words})"
        elif "pre-condition" in words.lower():  # If-Match: the object was replaced since it was listed
            words = f"the object changed since it was listed (its ETag no longer matches); stage again ({words})"
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


__all__ = [
    "CHUNK",
    "HASHES",
    "PART",
    "STORE_MODE",
    "Listed",
    "StageError",
    "copy_verified",
    "new_hash",
    "reason",
]
