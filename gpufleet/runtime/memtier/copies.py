"""One memory copy of a rank's state: the header that describes it, and its bytes.

A copy holds what a single-process disk checkpoint holds (every object's ``state_dict`` and the
trainer state with its RNG), written with the same ``torch.save`` and read back with
``torch.load(weights_only=True)``, so a restore from RAM gives the same tensors, bit for bit, as
one from disk. The header is JSON, checked field by field: a keeper or a file in shared memory is
untrusted input, and nothing in a copy is unpickled beyond what ``weights_only`` allows.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import math
import re
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import IO, Any

from gpufleet.errors import CheckpointError

MAX_HEADER_BYTES = 64 * 1024
"""A header is a few hundred bytes; anything larger is not one of ours."""
SHA256 = re.compile(r"[0-9a-f]{64}")
RUN_ID = re.compile(r"[0-9a-f]{1,64}")
MAX_STEP = 99_999_999
CHUNK_BYTES = 64 * 1024 * 1024
"""A copy is hashed in chunks of this many bytes, so it can be verified by several threads at once."""
VERIFY_THREADS = 2


class TierError(CheckpointError):
    """A memory copy or keeper that cannot be used; the restore goes on to the next tier."""


class CorruptCopy(TierError):
    """A copy whose header or bytes are not what they claim."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CopyHeader:
    """What a copy claims to be; the sha256 and byte count are checked against the bytes before use."""

    step: int
    sha256: str
    bytes: int
    fingerprint: str | None
    """``model_fingerprint`` of the run that wrote it: a copy of another model is never loaded."""
    created_at: float
    healthy: bool = True
    loss: float | None = None
    job: str | None = None
    rank: int = 0
    world_size: int = 1
    judged: bool = True
    """False: taken at a step the ranks had not judged yet (between two agreements); ``healthy`` is
    then what was known when it was taken, and a rollback never uses it beyond the last healthy step."""
    run: str | None = None
    """The run that wrote it (``runid.run_id``): a job folder reused by a new job (a home reset, its
    id given again) holds copies of the same job id and model that are not this run's. ``None``: a
    copy written before copies carried one."""

    def to_json(self) -> builtins.bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> CopyHeader:
        """The header in ``raw``, each field's type and range checked; ``CorruptCopy`` names the bad one."""
        if not isinstance(raw, dict):
            raise CorruptCopy("copy header is not a JSON object")
        ints = {"step": (0, MAX_STEP), "bytes": (0, 1 << 50), "rank": (0, 99_999), "world_size": (1, 99_999)}
        for name, (low, high) in ints.items():
            value = raw.get(name, 0 if name == "rank" else 1 if name == "world_size" else None)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise CorruptCopy(f"copy header field {name}={value!r} is not an integer from {low} to {high}")
        if not isinstance(raw.get("sha256"), str) or not SHA256.fullmatch(raw["sha256"]):
            raise CorruptCopy("copy header field sha256 is not a sha256 hex digest")
        fingerprint = raw.get("fingerprint")
        if fingerprint is not None and not (isinstance(fingerprint, str) and SHA256.fullmatch(fingerprint)):
            raise CorruptCopy("copy header field fingerprint is not a sha256 hex digest")
        created, loss, job = raw.get("created_at"), raw.get("loss"), raw.get("job")
        if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created):
            raise CorruptCopy("copy header field created_at is not a time")
        if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float))):
            raise CorruptCopy("copy header field loss is not a number")
        if job is not None and not (isinstance(job, str) and len(job) <= 200):
            raise CorruptCopy("copy header field job is not a short string")
        run = raw.get("run")
        if run is not None and not (isinstance(run, str) and RUN_ID.fullmatch(run)):
            raise CorruptCopy("copy header field run is not 1 to 64 lowercase hex digits")
        for flag in ("healthy", "judged"):
            if not isinstance(raw.get(flag, True), bool):
                raise CorruptCopy(f"copy header field {flag} is not true or false")
        return cls(
            step=raw["step"],
            sha256=raw["sha256"],
            bytes=raw["bytes"],
            fingerprint=fingerprint,
            created_at=float(created),
            healthy=raw.get("healthy", True),
            loss=float(loss) if loss is not None else None,
            job=job,
            rank=raw.get("rank", 0),
            world_size=raw.get("world_size", 1),
            judged=raw.get("judged", True),
            run=run,
        )

    @classmethod
    def from_json(cls, raw: builtins.bytes) -> CopyHeader:
        if len(raw) > MAX_HEADER_BYTES:
            raise CorruptCopy(f"copy header of {len(raw)} bytes is larger than {MAX_HEADER_BYTES}")
        try:
            return cls.from_dict(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, ValueError) as err:
            if isinstance(err, CorruptCopy):
                raise
            raise CorruptCopy("copy header is not JSON") from None


class ChunkedSha256:
    """sha256 over the sha256 of each ``CHUNK_BYTES`` chunk: fed in pieces of any size, as a writer writes."""

    def __init__(self) -> None:
        self._digests: list[bytes] = []
        self._chunk = hashlib.sha256()
        self._filled = 0
        self.bytes = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), CHUNK_BYTES - self._filled)
            self._chunk.update(view[:take])
            self._filled += take
            self.bytes += take
            view = view[take:]
            if self._filled == CHUNK_BYTES:
                self._digests.append(self._chunk.digest())
                self._chunk, self._filled = hashlib.sha256(), 0

    def hexdigest(self) -> str:
        tail = [self._chunk.digest()] if self._filled or not self._digests else []
        return _combine([*self._digests, *tail])


def _combine(digests: Iterable[bytes]) -> str:
    outer = hashlib.sha256()
    for digest in digests:
        outer.update(digest)
    return outer.hexdigest()


def chunked_sha256(data: bytes | bytearray | memoryview, threads: int = VERIFY_THREADS) -> str:
    """The checksum of ``data`` (see :class:`ChunkedSha256`), its chunks hashed by ``threads`` threads."""
    view = memoryview(data).cast("B")
    starts = range(0, max(len(view), 1), CHUNK_BYTES)
    if threads <= 1 or len(starts) == 1:
        return _combine(hashlib.sha256(view[i : i + CHUNK_BYTES]).digest() for i in starts)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gpufleet-memtier-hash") as pool:
        return _combine(pool.map(lambda i: hashlib.sha256(view[i : i + CHUNK_BYTES]).digest(), starts))


class HashingWriter:
    """A file for ``torch.save`` that hashes every byte on its way to ``sink``: one pass, no copy in between."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink = sink
        self.hash = ChunkedSha256()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.hash.update(data)
        return self.sink.write(data)

    def flush(self) -> None:
        self.sink.flush()


def save_into(state: Any, sink: IO[bytes]) -> tuple[str, int]:
    """``torch.save`` of ``state`` straight into ``sink``; its checksum and byte count."""
    import torch

    from gpufleet.runtime.checkpoint import torch_crc32_off

    writer = HashingWriter(sink)
    with torch_crc32_off():
        torch.save(state, writer)  # type: ignore[arg-type]
    return writer.hash.hexdigest(), writer.hash.bytes


def encode(state: Any) -> bytes:
    """The ``torch.save`` bytes of ``state`` (the checksum is ``chunked_sha256`` over them)."""
    buffer = io.BytesIO()
    save_into(state, buffer)
    return buffer.getvalue()


def header_for(step: int, payload: bytes | bytearray | memoryview, **fields: Any) -> CopyHeader:
    return CopyHeader(
        step=step,
        sha256=chunked_sha256(payload),
        bytes=len(payload),
        created_at=time.time(),
        **fields,
    )


def verify(header: CopyHeader, payload: bytes | bytearray | memoryview) -> None:
    """``CorruptCopy`` unless ``payload`` has the byte count and checksum its header claims."""
    if len(payload) != header.bytes:
        raise CorruptCopy(f"copy of step {header.step} holds {len(payload)} bytes, its header says {header.bytes}")
    if chunked_sha256(payload) != header.sha256:
        raise CorruptCopy(f"copy of step {header.step} fails its sha256 check")


def check_state(header: CopyHeader, state: Any) -> dict[str, Any]:
    """The loaded state when it holds the trainer state of the header's step; else ``CorruptCopy``."""
    if not isinstance(state, dict) or not isinstance(state.get("trainer"), dict):
        raise CorruptCopy(f"copy of step {header.step} holds no trainer state")
    if state["trainer"].get("step") != header.step:
        raise CorruptCopy(f"copy of step {header.step} holds the trainer state of another step")
    return state


def decode(header: CopyHeader, payload: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The state of a copy whose bytes match its header, loaded with ``weights_only``; else ``CorruptCopy``."""
    import torch

    verify(header, payload)
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
        raise CorruptCopy(f"copy of step {header.step} does not load ({err.__class__.__name__})") from None
    return check_state(header, state)


__all__ = [
    "CHUNK_BYTES",
    "ChunkedSha256",
    "CopyHeader",
    "CorruptCopy",
    "TierError",
    "check_state",
    "chunked_sha256",
    "decode",
    "encode",
    "header_for",
    "save_into",
    "verify",
]
