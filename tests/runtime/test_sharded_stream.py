"""The stream DCP writes shards through: small writes gathered, offsets and digests still exact.

``sharded._HashedStream`` holds writes under ``_SMALL`` bytes back and writes them as one; what DCP
sees (``tell()`` offsets, the bytes on disk after ``fileno()``-fsync, the sha256 and size reported on
close) must be as if every write had gone straight to the file.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from gpufleet.runtime import sharded
from gpufleet.runtime.sharded import _HashedStream

Reported = list[tuple[str, str, int]]


def open_stream(path: Path, pool: ThreadPoolExecutor, reported: Reported) -> _HashedStream:
    return _HashedStream(path, pool, lambda name, digest, size: reported.append((name, digest, size)))


def test_tensors_saved_one_after_another_load_back_from_their_offsets(tmp_path: Path) -> None:
    tensors = [torch.arange(n, dtype=torch.float32) for n in (3, 40_000, 7, 300_000)]  # small and large records
    reported: Reported = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        stream = open_stream(tmp_path / "__0_0.distcp", pool, reported)
        offsets = []
        for tensor in tensors:  # what DCP's _write_item does: tell(), torch.save, flush
            offsets.append(stream.tell())
            torch.save(tensor, stream)  # type: ignore[arg-type]
            stream.flush()
        offsets.append(stream.tell())
        stream.close()
    data = (tmp_path / "__0_0.distcp").read_bytes()
    assert offsets[-1] == len(data)
    assert reported == [("__0_0.distcp", hashlib.sha256(data).hexdigest(), len(data))]
    for tensor, start, end in zip(tensors, offsets, offsets[1:], strict=False):
        assert torch.equal(torch.load(io.BytesIO(data[start:end]), weights_only=True), tensor)


def test_small_writes_go_out_together_and_reach_the_file_before_an_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real_write = os.write

    def counted(fd: int, data: Any) -> int:
        calls.append(memoryview(data).nbytes)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counted)
    path = tmp_path / ".metadata"
    pieces = [bytes([i]) * (i + 1) for i in range(200)]  # 20,100 bytes in 200 writes
    big = os.urandom(sharded._SMALL)
    reported: Reported = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        stream = open_stream(path, pool, reported)
        for piece in pieces:
            assert stream.write(piece) == len(piece)
        assert stream.tell() == sum(map(len, pieces)) and calls == []  # gathered, none written yet
        os.fsync(stream.fileno())  # DCP fsyncs through fileno(): the gathered bytes are on disk first
        assert path.read_bytes() == b"".join(pieces) and calls == [sum(map(len, pieces))]
        stream.write(b"tail")
        stream.write(big)  # a large write sends what is gathered first, then itself
        stream.close()
    expected = b"".join(pieces) + b"tail" + big
    assert calls[1:] == [4, len(big)]
    assert path.read_bytes() == expected
    assert reported == [(".metadata", hashlib.sha256(expected).hexdigest(), len(expected))]


def test_many_small_writes_go_out_in_blocks_of_the_gathering_size(tmp_path: Path) -> None:
    pieces = [os.urandom(1000 + i) for i in range(300)]  # small tensors: gathered past _SMALL, again and again
    reported: Reported = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        stream = open_stream(tmp_path / "__0_0.distcp", pool, reported)
        for piece in pieces:
            stream.write(piece)
            assert stream.tell() < sharded._SMALL or stream.bytes > 0
        stream.close()
    expected = b"".join(pieces)
    assert (tmp_path / "__0_0.distcp").read_bytes() == expected
    assert reported == [("__0_0.distcp", hashlib.sha256(expected).hexdigest(), len(expected))]


def test_a_full_disk_met_while_writing_gathered_bytes_is_kept_and_nothing_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    reported: Reported = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        stream = open_stream(tmp_path / "__0_0.distcp", pool, reported)
        stream.write(b"header")
        monkeypatch.setattr(os, "write", full)
        with pytest.raises(OSError, match="No space left"):
            stream.flush()
        assert stream.error is not None and stream.error.errno == errno.ENOSPC
        stream.abandon()
    assert stream.closed and reported == []
