"""An S3 object's copy when the connection drops mid-body, or the object is replaced after it was listed.

The stager reads each object with one ``GetObject`` conditional on its listed ETag and resumes a dropped
body from the byte it reached (:class:`gpufleet.data.transfer._ObjectReader`). These tests put a TCP proxy
between the stager and the moto server that cuts one connection once a set number of response bytes
has passed: a real dropped connection, seen by the HTTP client as a short body. Where the client then
resumes depends on how much of its buffer it had consumed, so one test instead fails the body stream
once at a set byte inside a chunk, to pin the offset a resumed read starts from.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import S3

from gpufleet.data.stage import StageError, Stager
from gpufleet.data.transfer import CHUNK
from gpufleet.spec import DataPolicy, parse_spec

BIG = 2 * CHUNK + 12_345
"""An object of three chunks, the last one short: the drop below falls inside the second."""
CUT_AT = CHUNK + CHUNK // 2
"""Response bytes a connection carries before the proxy cuts it: half-way through the second chunk."""
RANGE = re.compile(rb"^range:\s*bytes=(\d+)-", re.IGNORECASE | re.MULTILINE)


class CuttingProxy:
    """Forwards loopback TCP to the S3 server; cuts the first connection whose responses pass ``cut_at`` bytes.

    It records the ``Range`` of every request it forwards, so a test can tell a resumed read (a ranged
    ``GetObject``) from one started again from the first byte. ``on_cut`` runs before the connection
    closes, so whatever it changes on the server is there when the client asks again.
    """

    def __init__(self, upstream: str, cut_at: int, on_cut: Callable[[], None] | None = None) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._cut_at = cut_at
        self._on_cut = on_cut
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.cuts = 0
        self.ranges: list[int] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._responses, args=(server, client), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        with client, server, contextlib.suppress(OSError):
            while data := client.recv(1 << 16):
                with self._lock:
                    self.ranges.extend(int(m) for m in RANGE.findall(data))
                server.sendall(data)

    def _responses(self, server: socket.socket, client: socket.socket) -> None:
        sent = 0
        with contextlib.suppress(OSError):
            while data := server.recv(1 << 16):
                with self._lock:
                    cut = self.cuts == 0 and sent + len(data) > self._cut_at
                    if cut:
                        self.cuts += 1
                if cut:
                    client.sendall(data[: self._cut_at - sent])
                    if self._on_cut is not None:
                        self._on_cut()
                    break
                client.sendall(data)
                sent += len(data)
        for sock in (client, server):  # a closed connection, mid-body where it was cut
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def objects(s3: S3) -> dict[str, bytes]:
    """A bucket with an object of :data:`BIG` bytes and an empty one."""
    s3.client.create_bucket(Bucket="corpus")
    bodies = {"big.bin": os.urandom(BIG), "empty.bin": b""}
    for name, body in bodies.items():
        s3.put("corpus", f"p/{name}", body)
    return bodies


@pytest.fixture
def proxy(s3: S3) -> Iterator[Callable[..., CuttingProxy]]:
    made: list[CuttingProxy] = []

    def make(on_cut: Callable[[], None] | None = None, cut_at: int = CUT_AT) -> CuttingProxy:
        made.append(CuttingProxy(s3.endpoint, cut_at, on_cut))
        return made[-1]

    yield make
    for each in made:
        each.close()


def policy(endpoint: str, **options: Any) -> DataPolicy:
    source = {"source": "s3://corpus/p", "dest": "train", "endpoint_url": endpoint}
    spec = parse_spec({"name": "x", "entrypoint": "m:f", "data": {"sources": [source], **options}})
    assert spec.data is not None
    return spec.data


def manifest(data: Path) -> dict[str, dict[str, Any]]:
    lines = (data / ".gpufleet" / "manifest-train.jsonl").read_text().splitlines()
    return {entry["key"]: entry for entry in map(json.loads, lines)}


def test_a_connection_dropped_mid_body_is_resumed_from_the_byte_reached(
    objects: dict[str, bytes], proxy: Callable[..., CuttingProxy], tmp_path: Path
) -> None:
    cutting = proxy()
    data = tmp_path / "data"

    report = Stager(policy(cutting.endpoint), data).run()

    assert cutting.cuts == 1
    # One ranged GetObject, from the byte reached (where the client's buffer stood when the connection
    # went): not from the first byte again, and not past what the server had sent.
    assert len(cutting.ranges) == 1 and 0 < cutting.ranges[0] < CUT_AT, cutting.ranges
    assert (report.files_copied, report.bytes_copied) == (2, BIG)
    assert report.sources[0].checksums == {"crc32": 2}  # the objects' own CRC32s, from their answers
    for name, body in objects.items():
        assert (data / "train" / name).read_bytes() == body
        assert manifest(data)[name]["algo"] == "crc32"
        assert manifest(data)[name]["digest"] == f"{zlib.crc32(body):08x}"
    assert not list((data / "train").glob("*gfpart*"))


def test_a_drop_inside_a_chunk_resumes_at_exactly_that_byte(
    objects: dict[str, bytes], proxy: Callable[..., CuttingProxy], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body stream fails once, as aiohttp's does on a short body, after a byte inside the second chunk."""
    import aiohttp

    from gpufleet.data import transfer

    at = CHUNK + 3 * 2**20 + 7  # part of the second chunk is in the buffer, not yet written
    passed, dropped = [0], threading.Event()
    stream = transfer._ObjectReader._stream

    class DropsOnce:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def read(self, n: int) -> bytes:
            if not dropped.is_set() and passed[0] == at:
                dropped.set()
                raise aiohttp.ClientPayloadError("Response payload is not completed")
            piece: bytes = await self.inner.read(n if dropped.is_set() else min(n, at - passed[0]))
            passed[0] += len(piece)
            return piece

    monkeypatch.setattr(transfer._ObjectReader, "_stream", lambda self: DropsOnce(stream(self)))
    counting = proxy(cut_at=1 << 62)  # cuts nothing: it only records the reads asked for
    data = tmp_path / "data"

    report = Stager(policy(counting.endpoint), data).run()

    assert dropped.is_set() and counting.ranges == [at]
    assert report.sources[0].checksums == {"crc32": 2}
    assert (data / "train" / "big.bin").read_bytes() == objects["big.bin"]


def test_an_object_replaced_after_its_listing_fails_naming_it_and_leaves_nothing(
    s3: S3, objects: dict[str, bytes], proxy: Callable[..., CuttingProxy], tmp_path: Path
) -> None:
    """Replaced between the listing and the read: its ``GetObject``, conditional on the old ETag, is refused."""
    cutting = proxy()  # cuts nothing here: the read is refused before a body is sent
    data = tmp_path / "data"
    replaced = b"replaced after the listing"

    listed = threading.Event()

    def replace_once(done: int, total: int) -> None:  # first called once the sources are listed, before any copy
        if not listed.is_set():
            listed.set()
            s3.put("corpus", "p/big.bin", replaced)

    with pytest.raises(StageError) as err:
        Stager(policy(cutting.endpoint), data, progress=replace_once).run()

    assert err.value.file == "s3://corpus/p/big.bin" and err.value.exit_code == 1
    assert "s3://corpus/p/big.bin" in str(err.value)
    assert "changed since it was listed" in str(err.value) and "stage again" in str(err.value)
    assert not (data / "train" / "big.bin").exists()
    assert not list((data / "train").glob("*gfpart*"))
    kept = set(manifest(data))
    assert "big.bin" not in kept

    again = Stager(policy(cutting.endpoint), data).run()  # what the message says to do
    assert (data / "train" / "big.bin").read_bytes() == replaced
    assert (again.files_copied, again.files_reused) == (2 - len(kept), len(kept))


def test_an_object_replaced_while_its_body_was_cut_is_not_spliced(
    s3: S3, objects: dict[str, bytes], proxy: Callable[..., CuttingProxy], tmp_path: Path
) -> None:
    """Replaced while the connection was down: the resumed read, still conditional on the ETag, is refused."""
    replaced = bytes(BIG)  # the same size: only the ETag tells the two apart
    cutting = proxy(on_cut=lambda: s3.put("corpus", "p/big.bin", replaced))
    data = tmp_path / "data"

    with pytest.raises(StageError) as err:
        Stager(policy(cutting.endpoint, workers=1), data).run()

    assert cutting.cuts == 1 and len(cutting.ranges) == 1
    assert err.value.file == "s3://corpus/p/big.bin"
    assert "changed since it was listed" in str(err.value)
    assert not (data / "train" / "big.bin").exists()
    assert not list((data / "train").glob("*gfpart*"))
    assert "big.bin" not in manifest(data)


def test_a_rerun_after_a_resumed_copy_copies_nothing_and_checks_by_the_manifests_checksum(
    objects: dict[str, bytes], proxy: Callable[..., CuttingProxy], tmp_path: Path
) -> None:
    """The listing gives only the ETag (an MD5); the manifest names the CRC32 the copy was checked by."""
    cutting = proxy()
    data = tmp_path / "data"
    Stager(policy(cutting.endpoint), data).run()
    assert cutting.cuts == 1

    for verify in ("stat", "full"):
        again = Stager(policy(cutting.endpoint, verify=verify), data).run()
        assert (again.files_copied, again.files_reused, again.bytes_copied) == (0, 2, 0), verify
        assert again.sources[0].checksums == {"crc32": 2}, verify

    big = data / "train" / "big.bin"
    before = big.stat()
    with big.open("r+b") as fh:  # rot one byte, keeping the size and the modification time
        fh.seek(CHUNK + 1)
        fh.write(bytes([objects["big.bin"][CHUNK + 1] ^ 0xFF]))
    os.utime(big, ns=(before.st_atime_ns, before.st_mtime_ns))
    trusted = Stager(policy(cutting.endpoint, verify="stat"), data).run()
    assert trusted.files_copied == 0  # stat trusts size and time, as documented
    full = Stager(policy(cutting.endpoint, verify="full"), data).run()
    assert (full.files_copied, full.files_reused) == (1, 1)  # the CRC32 found the rotten byte
    assert big.read_bytes() == objects["big.bin"]
