"""``HashingWriter`` sends each large write to disk as it goes: what it asks the kernel, and what a refusal does."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpufleet.runtime import checkpoint
from gpufleet.runtime.checkpoint import HashingWriter

CHUNK = 24 << 20  # three chunks pass the 64 MiB write-behind mark


class FakeSync:
    """Stands for ``sync_file_range``: records each call, and fails with ``fail`` (an errno) when given one."""

    def __init__(self, fail: int | None = None) -> None:
        self.fail = fail
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, fd: int, offset: int, nbytes: int, flags: int) -> int:
        self.calls.append((offset, nbytes, flags))
        if self.fail is None:
            return 0
        ctypes.set_errno(self.fail)
        return -1


def _write(path: Path, sync: FakeSync, chunks: int) -> tuple[HashingWriter, bytes]:
    data = os.urandom(CHUNK)
    with ThreadPoolExecutor(max_workers=1) as pool:
        writer = HashingWriter(path, pool)
        writer._sync_range = sync
        try:
            for _ in range(chunks):
                writer.write(data)
            digest = writer.finish()
        finally:
            writer.close()
    assert digest == hashlib.sha256(data * chunks).hexdigest()
    return writer, data


def test_each_chunk_is_started_at_once_and_what_lies_64_mib_behind_is_waited_for(tmp_path: Path) -> None:
    sync = FakeSync()
    _write(tmp_path / "f", sync, chunks=4)
    started = [(o, n) for o, n, f in sync.calls if f == checkpoint._SFR_WRITE]
    waited = [(o, n) for o, n, f in sync.calls if f == checkpoint._SFR_WAIT_WRITE_WAIT]
    assert started == [(i * CHUNK, CHUNK) for i in range(4)]  # every byte, each once, in order
    behind = checkpoint._WRITE_BEHIND
    assert waited == [(0, 3 * CHUNK - behind), (3 * CHUNK - behind, CHUNK)]
    assert (tmp_path / "f").stat().st_size == 4 * CHUNK


def test_a_file_that_refuses_the_call_falls_back_to_fadvise(tmp_path: Path) -> None:
    sync = FakeSync(errno.ENOSYS)
    writer, data = _write(tmp_path / "f", sync, chunks=3)
    assert len(sync.calls) == 1 and writer._sync_range is None and writer.error is None
    assert (tmp_path / "f").read_bytes() == data * 3


def test_an_io_error_is_raised_and_kept_for_the_caller(tmp_path: Path) -> None:
    sync = FakeSync(errno.EIO)
    data = os.urandom(CHUNK)
    with ThreadPoolExecutor(max_workers=1) as pool:
        writer = HashingWriter(tmp_path / "f", pool)
        writer._sync_range = sync
        try:
            with pytest.raises(OSError) as raised:
                writer.write(data)
        finally:
            writer.close()
    assert raised.value.errno == errno.EIO and writer.error is raised.value


def test_the_real_call_is_found_on_linux() -> None:
    if os.uname().sysname != "Linux":
        pytest.skip("sync_file_range is Linux's")
    assert checkpoint._SYNC_RANGE is not None
