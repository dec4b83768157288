"""The keeper's protocol: length-prefixed frames of a JSON header and opaque bytes.

::

    magic "GFK1" | op (1 byte) | header length (4 bytes) | payload length (8 bytes) | header | payload

Big-endian. Every request's header carries the keeper's secret (``token``): the keeper compares it
(``hmac.compare_digest``) as soon as the header is read and refuses a request without it before a
byte of its payload is read. Requests: ``PUT`` (header ``{key, rank, copy}``, payload: the copy's bytes), ``GET``
(``{key, rank, step?}``: that step, else the newest), ``LIST`` (``{key}``), ``DROP``
(``{key, rank?, after_step?}``), ``PING``, ``PUT_FILE`` (``{key, rank, copy, path}``, no payload:
the job's own keeper, on the rank's node, reads the copy from the rank's file in shared memory,
which must be exactly that rank's file of that step under the keeper's own private root).
Replies: ``OK`` or ``ERR`` (``{error}``). The lengths are checked before a byte of the body is
read, so an oversized or garbage frame costs nothing; the payload is never interpreted by the
keeper, and headers are JSON (no pickle crosses the wire).

A rank sends a copy straight from its file in shared memory (``send_file_frame``: ``sendfile``, no
byte through Python). A request whose secret checked out gets a buffer of its payload's length at
once; any other frame's buffer grows with the bytes that arrive.
"""

from __future__ import annotations

import enum
import hmac
import json
import socket
import struct
from typing import Any

from gpufleet.runtime.memtier.copies import MAX_HEADER_BYTES, TierError

MAGIC = b"GFK1"
_PREFIX = struct.Struct(">4sBIQ")


class Op(enum.IntEnum):
    PUT = 1
    GET = 2
    LIST = 3
    DROP = 4
    PING = 5
    PUT_FILE = 6
    OK = 100
    ERR = 101


class WireError(TierError):
    """A frame that is not one of ours, or larger than allowed."""


class Closed(WireError):
    """The other side closed the connection between frames."""


class Unauthorized(WireError):
    """A request without the keeper's secret: refused before its payload is read."""


FILE_REFUSED = "refused a copy by its file"
"""How a keeper's refusal of ``PUT_FILE`` begins: the rank sends the copy's bytes instead."""
TOKEN = "token"
"""The header field of a request that carries the keeper's secret."""


def send_frame(
    sock: socket.socket, op: Op, header: dict[str, Any], payload: bytes | bytearray | memoryview = b""
) -> None:
    head = json.dumps(header).encode("utf-8")
    sock.sendall(_PREFIX.pack(MAGIC, int(op), len(head), len(payload)) + head)
    if len(payload):
        sock.sendall(payload)


def send_file_frame(sock: socket.socket, op: Op, header: dict[str, Any], fd: int, nbytes: int) -> None:
    """A frame whose payload is the first ``nbytes`` of the open file ``fd`` (the kernel copies it)."""
    head = json.dumps(header).encode("utf-8")
    sock.sendall(_PREFIX.pack(MAGIC, int(op), len(head), nbytes) + head)
    if nbytes:
        with open(fd, "rb", closefd=False) as fh:
            sent = sock.sendfile(fh, 0, nbytes)
        if sent != nbytes:
            raise WireError(f"sent {sent} of the copy's {nbytes} bytes: its file got shorter")


GROW_BYTES = 1 << 22
"""A frame's buffer grows by at most this much ahead of the bytes that arrived (then doubles with them)."""


def _recv_exact(sock: socket.socket, n: int, *, first: bool = False, trusted: bool = False) -> bytearray:
    """``n`` bytes; the buffer grows with the bytes that arrive, so a length that lies costs nothing.

    A frame's lengths are only a claim: a buffer of the claimed size allocated up front lets any
    client (or a peer that answers a rank) take that much memory with a 17-byte prefix. ``trusted``
    (the sender proved it holds the secret, and the length is within the limit): allocated at once.
    """
    buffer = bytearray(n if trusted else min(n, GROW_BYTES))
    got = 0
    while got < n:
        if got == len(buffer):
            buffer.extend(bytes(min(n, max(2 * len(buffer), GROW_BYTES)) - len(buffer)))
        with memoryview(buffer) as view:
            k = sock.recv_into(view[got:])
        if k == 0:
            raise Closed("connection closed") if first and got == 0 else WireError("connection closed mid-frame")
        got += k
    return buffer


def recv_frame(
    sock: socket.socket, max_payload: int, *, secret: str | None = None
) -> tuple[Op, dict[str, Any], bytearray]:
    """One frame, its lengths checked before its body is read (``WireError`` otherwise).

    ``secret``: the header must carry it (``Unauthorized`` otherwise, the payload left unread); the
    field is removed from the header returned.
    """
    magic, op, head_len, payload_len = _PREFIX.unpack(_recv_exact(sock, _PREFIX.size, first=True))
    if magic != MAGIC:
        raise WireError("not a keeper frame (bad magic)")
    if op not in Op._value2member_map_:
        raise WireError(f"unknown operation {op}")
    if head_len > MAX_HEADER_BYTES:
        raise WireError(f"header of {head_len} bytes is larger than {MAX_HEADER_BYTES}")
    if payload_len > max_payload:
        raise WireError(f"payload of {payload_len} bytes is larger than the limit of {max_payload}")
    try:
        header = json.loads(_recv_exact(sock, head_len).decode("utf-8")) if head_len else {}
    except (UnicodeDecodeError, ValueError):
        raise WireError("header is not JSON") from None
    if not isinstance(header, dict):
        raise WireError("header is not a JSON object")
    if secret is not None:
        _check_secret(header.pop(TOKEN, None), secret)
    return Op(op), header, _recv_exact(sock, payload_len, trusted=secret is not None)


def _check_secret(given: Any, secret: str) -> None:
    """``Unauthorized`` unless ``given`` is ``secret``, compared in constant time."""
    if not isinstance(given, str) or not hmac.compare_digest(given.encode("utf-8"), secret.encode("utf-8")):
        raise Unauthorized("unauthorized: a request must carry this keeper's secret (its token)")


__all__ = [
    "FILE_REFUSED",
    "TOKEN",
    "Closed",
    "Op",
    "Unauthorized",
    "WireError",
    "recv_frame",
    "send_file_frame",
    "send_frame",
]
