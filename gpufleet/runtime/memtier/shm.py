"""The node's own copies: files in shared memory that outlive the rank that wrote them.

::

    /dev/shm/gpufleet-<uid>/<key>/rank-<R>/step-00000150.mem     the copy's bytes (``flat.py``)
                                          /step-00000150.head    magic line, length (4 bytes), JSON header
                                          /.spare                a pruned copy's file, kept to be written over
                                          (``$GPUFLEET_SHM_DIR`` replaces the root)

``<key>`` is a short hash of the job's folder, so two jobs on a node never share copies. The
header goes in a file of its own, written last: a copy without one does not exist, like a
checkpoint folder without its manifest. Both are written under temporary names and renamed, so a
rank killed mid-write leaves the previous copy whole; the two newest steps are kept. ``tmpfs``
lives in RAM: there is nothing to fsync. Every file is 0600 in folders of 0700.

A pruned copy's file is not deleted but renamed ``.spare`` (its header gone first), and the next
copy is written over it: a new file in ``tmpfs`` costs a page fault and a zeroed page for every
4 KiB, five times the cost of the write itself. The spare takes the room the copy being written
took anyway. A file a restore of this process mapped is never written over: it is deleted instead. A
file being sent to a keeper (``lent``, read by name by the job's own keeper) stays until the send
ends (``give_back``), its header gone when it was pruned.

A restore maps the file privately, verifies it (``copies.verify``, several threads) through that
mapping and makes every tensor a view of the same mapping (``flat.load``): the bytes checked are
the bytes loaded, and the only copy is the one into the model (``load_state_dict``).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import re
import shutil
import stat
import struct
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from gpufleet.runtime.memtier.copies import (
    MAX_HEADER_BYTES,
    ChunkedCrc32,
    CopyHeader,
    CorruptCopy,
    OtherFormat,
    TierError,
    check_state,
    verify,
)
from gpufleet.runtime.memtier.flat import Staged, Stager, load

ENV_SHM_DIR = "GPUFLEET_SHM_DIR"
MAGIC = b"GFMEM3\n"
"""The header file's first line; ``GFMEM2`` was the sha256 and ``torch.save`` copies of an earlier version."""
_LENGTH = struct.Struct(">I")
STEP_FILE = re.compile(r"step-(\d{8})\.head")
RANK_DIR = re.compile(r"rank-(\d{1,5})")
KEEP = 2
SPARE = ".spare"
WRITE_PIECE = 8 << 20
"""The copy is checked and written a MiB at a time: each piece is checked while it is in the cache."""


def shm_root(env: Mapping[str, str]) -> Path:
    """Where the node's copies live: ``$GPUFLEET_SHM_DIR``, else ``/dev/shm/gpufleet-<uid>``."""
    return Path(env.get(ENV_SHM_DIR) or f"/dev/shm/gpufleet-{os.getuid()}")


def job_key(job_dir: Path) -> str:
    """A short, stable name for a job's folder (its absolute path hashed): the copies' folder name."""
    return hashlib.sha256(str(Path(job_dir).resolve()).encode("utf-8")).hexdigest()[:16]


class OwnStore:
    """One rank's copies in shared memory: put, list, read, drop."""

    def __init__(self, root: Path, key: str, rank: int, keep: int = KEEP) -> None:
        self.job_folder = root / key
        self.folder = self.job_folder / f"rank-{rank}"
        self.keep = keep
        self.lent: set[int] = set()
        """Steps whose file is being read elsewhere (a send to the keeper): kept until ``give_back``."""
        self._mapped: set[int] = set()

    def put(self, header: CopyHeader, payload: bytes | bytearray | memoryview) -> CopyHeader:
        """Write one copy of bytes already encoded (temporary names, then renames); keep the ``keep`` newest."""
        self._commit(header.step, [memoryview(payload)])
        return self._publish(header)

    def write(self, step: int, state: Any, **fields: Any) -> CopyHeader:
        """Encode ``state`` into the copy of ``step``, checked as it is written; its header."""
        return self.write_staged(step, Stager().stage(state), **fields)

    def write_staged(self, step: int, staged: Staged, **fields: Any) -> CopyHeader:
        """Write a staged snapshot into the copy of ``step`` (checked as it is written); its header."""
        check = self._commit(step, staged.pieces(staged.tail()))
        return self._publish(
            CopyHeader(step=step, checksum=check.hexdigest(), bytes=check.bytes, created_at=time.time(), **fields)
        )

    def _commit(self, step: int, pieces: Iterator[memoryview] | list[memoryview]) -> ChunkedCrc32:
        """The copy's bytes in its file (written over the spare when there is one); their checksum."""
        self.job_folder.parent.parent.mkdir(parents=True, exist_ok=True)
        for folder in (self.job_folder.parent, self.job_folder, self.folder):
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
        if not private_root(self.job_folder.parent):
            raise TierError(f"{self.job_folder.parent} is not a folder of this user's alone: no copy is written")
        tmp = self.folder / f".tmp-step-{step:08d}-{os.getpid()}"
        with contextlib.suppress(OSError):
            self.head_path(step).unlink()  # a copy of this step being replaced does not exist meanwhile
        try:
            fd = self._open_tmp(tmp)
            try:
                check = _write_checked(fd, pieces)
                os.ftruncate(fd, check.bytes)  # a spare of a larger copy: its tail goes
            finally:
                os.close(fd)
            os.replace(tmp, self.path(step))
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return check

    def _open_tmp(self, tmp: Path) -> int:
        """The spare renamed ``tmp`` and opened to be written over, else a new file (0600)."""
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        with contextlib.suppress(OSError):
            os.replace(self.folder / SPARE, tmp)
            fd = os.open(tmp, flags)
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
            tmp.unlink()
        with contextlib.suppress(OSError):
            tmp.unlink()
        return os.open(tmp, flags | os.O_CREAT | os.O_EXCL, 0o600)

    def _publish(self, header: CopyHeader) -> CopyHeader:
        """The header file, written last (the copy exists from here on); then the copies past ``keep`` go."""
        head = header.to_json()
        head_tmp = self.folder / f".tmp-head-{header.step:08d}-{os.getpid()}"
        try:
            fd = os.open(head_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(MAGIC + _LENGTH.pack(len(head)) + head)
            os.replace(head_tmp, self.head_path(header.step))
        except BaseException:
            with contextlib.suppress(OSError):
                head_tmp.unlink()
            raise
        for old in self.steps()[self.keep :]:
            self._remove(old, spare=True)
        return header

    def remove(self, step: int) -> None:
        """The copy of ``step`` stops existing (its header goes first)."""
        self._remove(step)

    def give_back(self, step: int, *, clean: bool = True) -> None:
        """The read of a lent copy's file ended: a copy pruned meanwhile goes now.

        ``clean=False`` (the send failed: a keeper may still hold the file open and read on) unlinks it
        instead of keeping it as the spare the next write reuses, so no reader sees it rewritten.
        """
        self.lent.discard(step)
        if not self.head_path(step).exists():
            self._remove(step, spare=clean)

    def _remove(self, step: int, *, spare: bool = False) -> None:
        with contextlib.suppress(OSError):
            self.head_path(step).unlink()  # the header first: the copy stops existing at once
        if step in self.lent:
            return  # its file is being read (by the keeper, by name): ``give_back`` removes it
        reuse = spare and step not in self._mapped and not (self.folder / SPARE).exists()
        with contextlib.suppress(OSError):
            if reuse:
                os.replace(self.path(step), self.folder / SPARE)
            else:
                self.path(step).unlink()

    def steps(self) -> list[int]:
        """The steps held, newest first (by header file name: each is still checked when read)."""
        if not private_root(self.job_folder.parent):
            return []  # another user could have put anything there
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        return sorted((int(m.group(1)) for n in names if (m := STEP_FILE.fullmatch(n))), reverse=True)

    def path(self, step: int) -> Path:
        """The file of the copy's bytes of ``step``."""
        return self.folder / f"step-{step:08d}.mem"

    def head_path(self, step: int) -> Path:
        return self.folder / f"step-{step:08d}.head"

    def header(self, step: int) -> CopyHeader:
        """The header of the copy of ``step`` (listing needs no payload); ``CorruptCopy`` if unreadable."""
        with _open_regular(self.head_path(step)) as fh:
            return _read_header(fh.read(len(MAGIC) + _LENGTH.size + MAX_HEADER_BYTES + 1), step)

    def read(self, step: int) -> tuple[CopyHeader, bytes]:
        """The header and bytes of the copy of ``step`` (not yet verified: ``copies.decode`` does)."""
        header = self.header(step)
        with _open_regular(self.path(step)) as fh:
            return header, fh.read()

    def load(self, header: CopyHeader) -> dict[str, Any]:
        """The verified state of the copy ``header`` describes, its tensors mapped from the file; else ``CorruptCopy``.

        The file is opened once and mapped privately; the mapping is verified and its tensors are
        views of it, so the bytes checked are the bytes loaded. The file is not written over by
        this store afterwards (a tensor of the mapping may outlive the restore).
        """
        with _open_regular(self.path(header.step)) as fh:
            fd = fh.fileno()
            size = os.fstat(fd).st_size
            if size != header.bytes or not size:
                raise CorruptCopy(f"copy of step {header.step} holds {size} bytes, its header says {header.bytes}")
            self._mapped.add(header.step)
            mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        with memoryview(mapped) as view:
            verify(header, view)
        return check_state(header, load(mapped))

    def drop_after(self, step: int) -> None:
        for held in self.steps():
            if held > step:
                self._remove(held)

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def private_root(root: Path) -> bool:
    """Whether ``root`` is a real folder of this user that no one else may write to.

    ``/dev/shm`` is writable by every user: one who creates ``gpufleet-<uid>`` first could swap a
    rank's folder for one of their own (a copy with forged weights) or read what it holds.
    """
    try:
        info = os.lstat(root)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


@contextlib.contextmanager
def _open_regular(path: Path) -> Iterator[BinaryIO]:
    """A copy's file opened without following a link; a missing or special file is a ``CorruptCopy`` too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        raise CorruptCopy(f"{path.name}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CorruptCopy(f"{path.name} is not a regular file")
        yield fh


def _read_header(data: bytes, step: int) -> CopyHeader:
    """The header in a copy's header file."""
    if data.startswith(b"GFMEM") and not data.startswith(MAGIC):
        raise OtherFormat(f"step-{step:08d}.head is a memory copy header of another version")
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LENGTH.size:
        raise CorruptCopy(f"step-{step:08d}.head is not a memory copy header")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    if length > MAX_HEADER_BYTES or start + length != len(data):
        raise CorruptCopy(f"step-{step:08d}.head has a header of {length} bytes")
    header = CopyHeader.from_json(data[start : start + length])
    if header.step != step:
        raise CorruptCopy(f"step-{step:08d}.head claims step {header.step}")
    return header


def _write_checked(fd: int, pieces: Iterator[memoryview] | list[memoryview]) -> ChunkedCrc32:
    """Write ``pieces`` from the start of ``fd``, a MiB at a time, each checked before it is written."""
    check, at = ChunkedCrc32(), 0
    for piece in pieces:
        view = piece.cast("B") if piece.format != "B" or piece.ndim != 1 else piece
        for start in range(0, len(view), WRITE_PIECE):
            part = view[start : start + WRITE_PIECE]
            check.update(part)
            while len(part):
                wrote = os.pwrite(fd, part, at)
                part, at = part[wrote:], at + wrote
    return check


def held_copies(root: Path, key: str) -> dict[int, list[int]]:
    """Rank -> steps held (newest first) in a job's shared-memory folder (``ckpt list``)."""
    folder = root / key
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    out: dict[int, list[int]] = {}
    for name in names:
        if (m := RANK_DIR.fullmatch(name)) is not None:
            rank = int(m.group(1))
            out[rank] = OwnStore(root, key, rank).steps()
    return dict(sorted(out.items()))


__all__ = ["ENV_SHM_DIR", "OwnStore", "held_copies", "job_key", "shm_root"]
