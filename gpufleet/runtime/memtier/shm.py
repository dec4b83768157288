"""The node's own copies: files in shared memory that outlive the rank that wrote them.

::

    /dev/shm/gpufleet-<uid>/<key>/rank-<R>/step-00000150.mem     the state's torch.save bytes
                                          /step-00000150.head    magic line, length (4 bytes), JSON header
                                          (``$GPUFLEET_SHM_DIR`` replaces the root)

``<key>`` is a short hash of the job's folder, so two jobs on a node never share copies. The state
is serialised straight into its file (no copy in memory first), hashed on the way; the header goes
in a file of its own, written last: a copy without one does not exist, like a checkpoint folder
without its manifest. Both are written under temporary names and renamed, so a rank killed
mid-write leaves the previous copy whole; the two newest steps are kept. ``tmpfs`` lives in RAM:
there is nothing to fsync.

The state's file is a plain ``torch.save`` archive, so a restore maps it (``mmap``), verifies it
over 2 threads and loads it with ``torch.load(mmap=True)``: its tensors point into the mapping,
and the only copy is the one into the model (``load_state_dict``).
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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, BinaryIO

from gpufleet.runtime.memtier.copies import (
    MAX_HEADER_BYTES,
    CopyHeader,
    CorruptCopy,
    TierError,
    check_state,
    save_into,
    verify,
)

ENV_SHM_DIR = "GPUFLEET_SHM_DIR"
MAGIC = b"GFMEM2\n"
_LENGTH = struct.Struct(">I")
STEP_FILE = re.compile(r"step-(\d{8})\.head")
RANK_DIR = re.compile(r"rank-(\d{1,5})")
KEEP = 2


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

    def put(self, header: CopyHeader, payload: bytes | bytearray | memoryview) -> CopyHeader:
        """Write one copy of bytes already serialised (temporary names, then renames); keep the ``keep`` newest."""
        return self._commit(header.step, lambda fh: fh.write(payload), lambda: header)

    def write(self, step: int, state: Any, **fields: Any) -> CopyHeader:
        """Serialise ``state`` straight into the copy of ``step``, hashed as it is written; its header."""
        made: dict[str, Any] = {}

        def fill(fh: IO[bytes]) -> None:
            made["sha256"], made["bytes"] = save_into(state, fh)

        return self._commit(step, fill, lambda: CopyHeader(step=step, created_at=time.time(), **made, **fields))

    def _commit(
        self, step: int, fill: Callable[[IO[bytes]], object], header_of: Callable[[], CopyHeader]
    ) -> CopyHeader:
        self.job_folder.parent.parent.mkdir(parents=True, exist_ok=True)
        for folder in (self.job_folder.parent, self.job_folder, self.folder):
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
        if not private_root(self.job_folder.parent):
            raise TierError(f"{self.job_folder.parent} is not a folder of this user's alone: no copy is written")
        final = self.path(step)
        tmp = self.folder / f".tmp-step-{step:08d}-{os.getpid()}"
        head_tmp = self.folder / f".tmp-head-{step:08d}-{os.getpid()}"
        try:
            with contextlib.suppress(OSError):
                self.head_path(step).unlink()  # a copy of this step being replaced does not exist meanwhile
            with open(tmp, "wb") as fh:
                fill(fh)
            os.replace(tmp, final)
            header = header_of()
            head = header.to_json()
            with open(head_tmp, "wb") as fh:
                fh.write(MAGIC + _LENGTH.pack(len(head)) + head)
            os.replace(head_tmp, self.head_path(step))
        except BaseException:
            for left in (tmp, head_tmp):
                with contextlib.suppress(OSError):
                    left.unlink()
            raise
        for old in self.steps()[self.keep :]:
            self._remove(old)
        return header

    def remove(self, step: int) -> None:
        """The copy of ``step`` stops existing (its header goes first)."""
        self._remove(step)

    def _remove(self, step: int) -> None:
        for path in (self.head_path(step), self.path(step)):  # the header first: the copy stops existing at once
            with contextlib.suppress(OSError):
                path.unlink()

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
        """The file of the state's bytes of the copy of ``step``."""
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

        The bytes hashed are the bytes loaded: the file is opened once, verified through a
        mapping of that descriptor, and ``torch.load`` maps the same open file (``/proc/self/fd``).
        """
        import torch

        with _open_regular(self.path(header.step)) as fh:
            fd = fh.fileno()
            if os.fstat(fd).st_size != header.bytes:
                size = os.fstat(fd).st_size
                raise CorruptCopy(f"copy of step {header.step} holds {size} bytes, its header says {header.bytes}")
            if header.bytes:
                with mmap.mmap(fd, header.bytes, prot=mmap.PROT_READ) as mapped, memoryview(mapped) as view:
                    verify(header, view)
            else:
                verify(header, b"")
            by_fd = f"/proc/self/fd/{fd}"
            source = by_fd if os.path.exists(by_fd) else str(self.path(header.step))
            try:
                state = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
            except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
                raise CorruptCopy(f"copy of step {header.step} does not load ({err.__class__.__name__})") from None
        return check_state(header, state)

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
