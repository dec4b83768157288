"""One memory copy of a rank's state: the header that describes it, and its bytes.

A copy holds what a single-process disk checkpoint holds (every object's ``state_dict`` and the
trainer state with its RNG), in the flat format of ``flat.py``: the tensors' bytes in one region,
the rest a tagged JSON tree, so a restore from RAM gives the same tensors, bit for bit, as one
from disk. The header is JSON, checked field by field: a keeper or a file in shared memory is
untrusted input, and nothing in a copy is unpickled beyond what ``weights_only`` allows.

The checksum is CRC-32 (``zlib.crc32``) of each ``CHUNK_BYTES`` chunk, the chunks' CRCs combined
by one more CRC-32, and the header names that algorithm (``algorithm``): a copy written with
another one (a sha256 of an earlier version) is refused as ``OtherFormat``, never misread. CRC-32
runs at twice sha256's speed and checks every chunk on its own thread, which is what makes a
restore from RAM many times faster than one from disk. It detects what happens to bytes in RAM or
on the way to a keeper: every burst of flipped bits up to 32 bits long, a truncated or extended
copy (the byte count is checked too), a stray write over any part of it (missed with a chance of
1 in 2**32). It is not a seal against someone who can write the copy: whoever runs as the job's
user could rewrite the header as well; the folder being this user's alone (``shm.private_root``)
and the keeper's secret keep everyone else out. Disk checkpoints keep their sha256.
"""

from __future__ import annotations

import builtins
import math
import os
import re
import time
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from gpufleet.errors import CheckpointError

MAX_HEADER_BYTES = 64 * 1024
"""A header is a few hundred bytes; anything larger is not one of ours."""
ALGORITHM = "crc32-chunks-64MiB"
"""The checksum a header's ``checksum`` is (the header says so in ``algorithm``)."""
CHECKSUM = re.compile(r"[0-9a-f]{8}")
SHA256 = re.compile(r"[0-9a-f]{64}")
RUN_ID = re.compile(r"[0-9a-f]{1,64}")
MAX_STEP = 99_999_999
CHUNK_BYTES = 64 * 1024 * 1024
"""A copy is checked in chunks of this many bytes, so it can be verified by several threads at once."""
VERIFY_THREADS = 4
"""At most this many threads verify one copy (no more than the node's cores, nor its chunks)."""


class TierError(CheckpointError):
    """A memory copy or keeper that cannot be used; the restore goes on to the next tier."""


class CorruptCopy(TierError):
    """A copy whose header or bytes are not what they claim."""


class OtherFormat(CorruptCopy):
    """A copy this version does not read: another checksum algorithm or layout (an earlier version's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CopyHeader:
    """What a copy claims to be; the checksum and byte count are checked against the bytes before use."""

    step: int
    checksum: str
    """``ALGORITHM`` over the copy's bytes, 8 lowercase hex digits."""
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
    algorithm: str = ALGORITHM

    def to_json(self) -> builtins.bytes:
        import json

        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> CopyHeader:
        """The header in ``raw``, each field's type and range checked; ``CorruptCopy`` names the bad one."""
        if not isinstance(raw, dict):
            raise CorruptCopy("copy header is not a JSON object")
        if raw.get("algorithm") != ALGORITHM:
            named = raw.get("algorithm", "sha256" if "sha256" in raw else None)
            raise OtherFormat(f"copy header names the checksum {str(named)[:40]!r}, not {ALGORITHM!r}")
        ints = {"step": (0, MAX_STEP), "bytes": (0, 1 << 50), "rank": (0, 99_999), "world_size": (1, 99_999)}
        for name, (low, high) in ints.items():
            value = raw.get(name, 0 if name == "rank" else 1 if name == "world_size" else None)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise CorruptCopy(f"copy header field {name}={value!r} is not an integer from {low} to {high}")
        if not isinstance(raw.get("checksum"), str) or not CHECKSUM.fullmatch(raw["checksum"]):
            raise CorruptCopy("copy header field checksum is not 8 lowercase hex digits")
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
            checksum=raw["checksum"],
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
        import json

        if len(raw) > MAX_HEADER_BYTES:
            raise CorruptCopy(f"copy header of {len(raw)} bytes is larger than {MAX_HEADER_BYTES}")
        try:
            return cls.from_dict(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, ValueError) as err:
            if isinstance(err, CorruptCopy):
                raise
            raise CorruptCopy("copy header is not JSON") from None


class ChunkedCrc32:
    """The copy checksum (``ALGORITHM``), fed in pieces of any size, as a writer writes."""

    def __init__(self) -> None:
        self._crcs: list[int] = []
        self._crc = 0
        self._filled = 0
        self.bytes = 0

    def update(self, data: builtins.bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), CHUNK_BYTES - self._filled)
            self._crc = zlib.crc32(view[:take], self._crc)
            self._filled += take
            self.bytes += take
            view = view[take:]
            if self._filled == CHUNK_BYTES:
                self._crcs.append(self._crc)
                self._crc, self._filled = 0, 0

    def hexdigest(self) -> str:
        tail = [self._crc] if self._filled or not self._crcs else []
        return _combine([*self._crcs, *tail])


def _combine(crcs: Iterable[int]) -> str:
    return f"{zlib.crc32(b''.join(crc.to_bytes(4, 'big') for crc in crcs)):08x}"


def checksum(data: builtins.bytes | bytearray | memoryview, threads: int = VERIFY_THREADS) -> str:
    """The checksum of ``data`` (see :class:`ChunkedCrc32`), its chunks checked by up to ``threads`` threads."""
    view = memoryview(data).cast("B")
    starts = range(0, max(len(view), 1), CHUNK_BYTES)
    workers = min(threads, len(starts), os.cpu_count() or 1)
    if workers <= 1:
        return _combine(zlib.crc32(view[i : i + CHUNK_BYTES]) for i in starts)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpufleet-memtier-check") as pool:
        return _combine(pool.map(lambda i: zlib.crc32(view[i : i + CHUNK_BYTES]), starts))


def encode(state: Any) -> builtins.bytes:
    """A copy's bytes of ``state`` (``flat.py``; the checksum is ``checksum`` over them)."""
    from gpufleet.runtime.memtier.flat import Stager

    staged = Stager().stage(state)
    return b"".join(staged.pieces(staged.tail()))


def header_for(step: int, payload: builtins.bytes | bytearray | memoryview, **fields: Any) -> CopyHeader:
    return CopyHeader(step=step, checksum=checksum(payload), bytes=len(payload), created_at=time.time(), **fields)


def verify(header: CopyHeader, payload: builtins.bytes | bytearray | memoryview) -> None:
    """``CorruptCopy`` unless ``payload`` has the byte count and checksum its header claims."""
    if len(payload) != header.bytes:
        raise CorruptCopy(f"copy of step {header.step} holds {len(payload)} bytes, its header says {header.bytes}")
    if checksum(payload) != header.checksum:
        raise CorruptCopy(f"copy of step {header.step} fails its checksum ({header.algorithm})")


def check_state(header: CopyHeader, state: Any) -> dict[str, Any]:
    """The loaded state when it holds the trainer state of the header's step; else ``CorruptCopy``."""
    if not isinstance(state, dict) or not isinstance(state.get("trainer"), dict):
        raise CorruptCopy(f"copy of step {header.step} holds no trainer state")
    if state["trainer"].get("step") != header.step:
        raise CorruptCopy(f"copy of step {header.step} holds the trainer state of another step")
    return state


def decode(header: CopyHeader, payload: builtins.bytes | bytearray | memoryview) -> dict[str, Any]:
    """The state of a copy whose bytes match its header, every tensor its own; else ``CorruptCopy``.

    The tensors are cloned out of ``payload``: a restore's optimizer keeps the tensors it is given,
    and one view would keep the whole payload (the weights' bytes too) alive.
    """
    from gpufleet.runtime.memtier.flat import load, own_tensors

    verify(header, payload)
    writable = payload if isinstance(payload, bytearray) else bytearray(payload)
    return check_state(header, own_tensors(load(writable)))


__all__ = [
    "ALGORITHM",
    "CHUNK_BYTES",
    "ChunkedCrc32",
    "CopyHeader",
    "CorruptCopy",
    "OtherFormat",
    "TierError",
    "check_state",
    "checksum",
    "decode",
    "encode",
    "header_for",
    "verify",
]
