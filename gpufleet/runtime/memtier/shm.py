"""The node's own copies: files in shared memory that outlive the rank that wrote them.

::

    /dev/shm/gpufleet-<uid>/<key>/rank-<R>/step-00000150.mem    (``$GPUFLEET_SHM_DIR`` replaces the root)

``<key>`` is a short hash of the job's folder, so two jobs on a node never share copies. One file
per copy: a magic line, the header's length (4 bytes, big-endian), the JSON header, the state's
bytes. A copy is written under a temporary name and renamed, so a rank killed mid-write leaves
the previous copy whole; the two newest steps are kept. ``tmpfs`` lives in RAM: there is nothing
to fsync.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from gpufleet.runtime.memtier.copies import MAX_HEADER_BYTES, CopyHeader, CorruptCopy

ENV_SHM_DIR = "GPUFLEET_SHM_DIR"
MAGIC = b"GFMEM1\n"
_LENGTH = struct.Struct(">I")
STEP_FILE = re.compile(r"step-(\d{8})\.mem")
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

    def put(self, header: CopyHeader, payload: bytes) -> Path:
        """Write one copy (temporary name, then rename) and drop all but the ``keep`` newest."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        final = self.folder / f"step-{header.step:08d}.mem"
        tmp = self.folder / f".tmp-step-{header.step:08d}-{os.getpid()}"
        head = header.to_json()
        try:
            with open(tmp, "wb") as fh:
                fh.write(MAGIC + _LENGTH.pack(len(head)) + head)
                fh.write(payload)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        for step in self.steps()[self.keep :]:
            with contextlib.suppress(OSError):
                (self.folder / f"step-{step:08d}.mem").unlink()
        return final

    def steps(self) -> list[int]:
        """The steps held, newest first (by file name: each is still checked when read)."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        return sorted((int(m.group(1)) for n in names if (m := STEP_FILE.fullmatch(n))), reverse=True)

    def path(self, step: int) -> Path:
        return self.folder / f"step-{step:08d}.mem"

    def header(self, step: int) -> CopyHeader:
        """The header of the copy of ``step`` alone (listing needs no payload); ``CorruptCopy`` if unreadable."""
        with _open_regular(self.path(step)) as fh:
            return _read_header(fh.read(len(MAGIC) + _LENGTH.size + MAX_HEADER_BYTES), step)[0]

    def read(self, step: int) -> tuple[CopyHeader, bytes]:
        """The header and bytes of the copy of ``step`` (not yet verified: ``copies.decode`` does)."""
        with _open_regular(self.path(step)) as fh:
            data = fh.read()
        header, start = _read_header(data, step)
        return header, data[start:]

    def drop_after(self, step: int) -> None:
        for held in self.steps():
            if held > step:
                with contextlib.suppress(OSError):
                    self.path(held).unlink()

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


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


def _read_header(data: bytes, step: int) -> tuple[CopyHeader, int]:
    """The header at the front of a copy's file, and where its payload starts."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LENGTH.size:
        raise CorruptCopy(f"step-{step:08d}.mem is not a memory copy")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    if length > MAX_HEADER_BYTES or start + length > len(data):
        raise CorruptCopy(f"step-{step:08d}.mem has a header of {length} bytes")
    header = CopyHeader.from_json(data[start : start + length])
    if header.step != step:
        raise CorruptCopy(f"step-{step:08d}.mem claims step {header.step}")
    return header, start + length


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
