"""The alert webhook: signed, fresh, unique alerts only, each acted on once.

A monitor (``gpufleet quality``, Evidently, Alertmanager behind a relay) POSTs a JSON alert::

    X-Gpufleet-Timestamp: 1796231675                  unix seconds when it was signed
    X-Gpufleet-Signature: sha256=<hex>                HMAC-SHA256(secret, timestamp + "." + body)
    Idempotency-Key: drift-2026-12-02T10:00Z          one key per alert; a retry reuses it

as Stripe and GitHub sign theirs. The receiver checks, in this order, and answers the first
failure: body size (413, before reading it), signature headers present (401), the timestamp as
ASCII digits (400) and the signature well-formed (401), HMAC in constant time (401), timestamp
within ``tolerance_s`` of now (401: stale), idempotency key (400), JSON and schema (400), replay
(409: a key *or* a signature already accepted or being handled; the signature check stops a
captured request replayed under a new key; the reply's ``replayed`` says which: ``accepted``,
``in_progress`` (retry later: the first delivery may still fail) or ``signature``). Only then
does the handler run, once per key: only an accepted delivery consumes its key. A refused one
(422, the handler said no) or a failed one (500, a bug) releases it, in memory and in the journal
alike, so the sender may retry, even after a restart.

Nothing unauthenticated is parsed: the JSON is read only after the HMAC matched, and numeric
headers (``Content-Length``, the timestamp) are taken as ASCII digits only (``int()`` also takes
other scripts' digits, such as U+0663). The secret comes from ``$GPUFLEET_WEBHOOK_SECRET`` or a file
(``$GPUFLEET_WEBHOOK_SECRET_FILE`` or an explicit path), never from the code; the server binds the
loopback interface unless told otherwise. Accepted signatures live for the replay window, accepted
keys as long too, or for ``key_ttl_s`` where that is longer (``gpufleet serve`` gives
:data:`KEY_TTL_S`, a day: longer than an outbox's retries last, see :mod:`gpufleet.quality.outbox`),
in memory and, with ``journal``, in an append-only file (written once the handler succeeded) so
that a restarted receiver still refuses them.

The HTTP server bounds what a hostile client can hold: each socket read waits at most
``read_timeout`` (a stalled upload is answered 408 and closed), a whole request must arrive within
``request_timeout`` (a byte-a-second drip is cut off), at most ``max_handlers`` connections are
served at once (the next ones are answered 503 with ``Retry-After`` without a thread), and the
listen backlog is ``BACKLOG`` so that a burst of senders queues instead of being reset. A bug in
the HTTP layer answers 500 and logs one line; no request thread dies with a traceback.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import socket
import stat
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_address
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpufleet.errors import GpufleetError, UsageError
from gpufleet.paths import NAME_HINT, NAME_RE
from gpufleet.yamlio import describe_validation

TIMESTAMP_HEADER = "X-Gpufleet-Timestamp"
SIGNATURE_HEADER = "X-Gpufleet-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SECRET_ENV = "GPUFLEET_WEBHOOK_SECRET"
SECRET_FILE_ENV = "GPUFLEET_WEBHOOK_SECRET_FILE"
MIN_SECRET_BYTES = 16
MAX_SECRET_FILE_BYTES = 4096
"""A secret file longer than this is refused unread (a secret is a line of 16 to a few hundred bytes)."""
MAX_BODY_BYTES = 64 * 1024
DRAIN_LIMIT = 1024 * 1024
"""An oversized body up to this size is read and dropped so the sender sees the 413."""
TOLERANCE_S = 300.0
KEY_TTL_S = 86400.0
"""How long an accepted idempotency key is refused (409): a day, as Stripe keeps its keys, and longer than
the outbox's whole retry schedule, so that a retry signed afresh hours later is still answered 409."""
KEY_RE = re.compile(r"^[A-Za-z0-9._:@-]{8,128}$")
_SIGNATURE_RE = re.compile(r"^sha256=([0-9a-f]{64})$")
_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TIMESTAMP_DIGITS = 12
"""A timestamp header longer than this many digits is malformed (unix seconds have 10 until 2286)."""
LENGTH_DIGITS = 18
"""A ``Content-Length`` longer than this many digits is malformed rather than merely too large."""
READ_TIMEOUT_S = 10.0
"""How long one socket read or write may wait; a stalled upload is then answered 408 and closed."""
REQUEST_TIMEOUT_S = 30.0
"""How long a whole request (line, headers, body) may take to arrive, however slowly it drips."""
MAX_HANDLERS = 64
"""Connections served at once; the next ones are answered 503 with ``Retry-After`` and no thread."""
BACKLOG = max(128, socket.SOMAXCONN)
"""The listen backlog: a burst of senders waits in the kernel's queue instead of being reset."""
RETRY_AFTER_S = 1
_POLL_S = 0.1
"""How often the server thread enforces ``request_timeout`` and drains refused connections."""
_REFUSED_CAP = 256
_REFUSED_GRACE_S = 2.0

_log = logging.getLogger(__name__)


def ascii_int(value: str | None, max_digits: int) -> int | None:
    """``value`` as an int if it is 1 to ``max_digits`` ASCII digits, else None.

    ``int()`` and ``str.isdigit()`` accept other scripts' digits (U+0663) and superscripts, which no
    HTTP header may carry; this does not.
    """
    if value is None or not 0 < len(value) <= max_digits or not (value.isascii() and value.isdigit()):
        return None
    return int(value)


def _one_line(err: BaseException) -> str:
    """``Type: message`` on one line, at most 300 characters (for a log line or a reply)."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}"[:300]


# ---- the secret and the signature ----------------------------------------------------------


def load_secret(path: Path | None = None, env: Mapping[str, str] | None = None) -> bytes:
    """The shared secret: ``path``, else ``$GPUFLEET_WEBHOOK_SECRET``, else the file in ``..._FILE``.

    A file is held to the serve token's rules (:func:`read_secret_file`), so that a secret others may
    read, or a path that is not a file, stops the receiver before it starts.
    """
    env = os.environ if env is None else env
    if path is None and env.get(SECRET_ENV):
        raw = env[SECRET_ENV].strip().encode()
        source = f"${SECRET_ENV}"
    else:
        file = path or (Path(env[SECRET_FILE_ENV]) if env.get(SECRET_FILE_ENV) else None)
        if file is None:
            raise UsageError(f"no webhook secret: set ${SECRET_ENV} or ${SECRET_FILE_ENV} (a file holding it)")
        raw = read_secret_file(file).strip()
        source = str(file)
    if len(raw) < MIN_SECRET_BYTES:
        raise UsageError(f"the webhook secret from {source} is {len(raw)} bytes; use {MIN_SECRET_BYTES} or more")
    return raw


def read_secret_file(file: Path) -> bytes:
    """The bytes of the secret file ``file``: a regular file (not a link), owned by this user, that only its
    owner may read or write, and at most :data:`MAX_SECRET_FILE_BYTES` long.

    The file is opened without following a link and without blocking (a FIFO would hang the start-up),
    checked again on the open descriptor (it may have been swapped since the ``lstat``), and read with a
    bounded read: ``/dev/zero`` or a growing file cannot exhaust memory.
    """
    try:
        _check_secret_stat(file, os.lstat(file))
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise UsageError(f"cannot read the webhook secret file {str(file)!r}: {err.strerror}") from None
    try:
        _check_secret_stat(file, os.fstat(fd))
        chunks: list[bytes] = []
        left = MAX_SECRET_FILE_BYTES + 1
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as err:
        raise UsageError(f"cannot read the webhook secret file {str(file)!r}: {err.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise UsageError(
            f"webhook secret file {str(file)!r} is over {MAX_SECRET_FILE_BYTES:,} bytes: put the secret alone in it"
        )
    return data


def _check_secret_stat(file: Path, info: os.stat_result) -> None:
    """Refuse what ``info`` says ``file`` is when it is not a private regular file of this user's."""
    shown = str(file)
    if stat.S_ISLNK(info.st_mode):
        raise UsageError(f"webhook secret file {shown!r} is a symbolic link: point at the file itself")
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"webhook secret file {shown!r} is not a regular file: point at a file holding the secret")
    if info.st_mode & 0o077:
        raise UsageError(
            f"webhook secret file {shown!r} has mode {stat.S_IMODE(info.st_mode):03o}: others may read it; "
            f"run `chmod 600 {shown}`"
        )
    if info.st_uid != os.getuid():
        raise UsageError(
            f"webhook secret file {shown!r} belongs to uid {info.st_uid}, not to this user: use a file of your own"
        )
    if info.st_size > MAX_SECRET_FILE_BYTES:
        raise UsageError(
            f"webhook secret file {shown!r} is {info.st_size:,} bytes, over {MAX_SECRET_FILE_BYTES:,}: "
            "put the secret alone in it"
        )


def write_secret(path: Path) -> bytes:
    """Create a random secret file readable by its owner only (``0600``); return the secret."""
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(value + b"\n")
    return value


def signature(secret: bytes, timestamp: int | str, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256 over ``timestamp + "." + body``."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def signed_headers(
    secret: bytes, body: bytes, *, idempotency_key: str | None = None, timestamp: int | None = None
) -> dict[str, str]:
    """The headers a sender attaches to ``body`` (a fresh key and the current time by default)."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: str(ts),
        SIGNATURE_HEADER: signature(secret, ts, body),
        IDEMPOTENCY_HEADER: idempotency_key or f"alert-{secrets.token_hex(12)}",
    }


# ---- the payload ------------------------------------------------------------------------------


class AlertPayload(BaseModel):
    """What an alert may say; anything else is refused (400)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    model: str = Field(max_length=128)
    """The registered model the alert is about."""
    action: Literal["alert", "retrain"]
    window: str = Field(min_length=1, max_length=128)
    dataset: str | None = None
    """A dataset *name*, resolved by the receiver inside its own data folder (never a path)."""
    reasons: list[str] = Field(default_factory=list, max_length=20)
    evidence: dict[str, float | int | str | bool | list[str] | None] = Field(default_factory=dict, max_length=64)

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not _MODEL_RE.match(value):
            raise ValueError(f"{value!r} is not a model name (letters, digits, '.', '_' or '-')")
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str | None) -> str | None:
        if value is not None and not NAME_RE.match(value):
            raise ValueError(f"{value!r} is not a dataset name: {NAME_HINT}")
        return value

    @field_validator("reasons")
    @classmethod
    def _short(cls, value: list[str]) -> list[str]:
        if any(len(r) > 500 for r in value):
            raise ValueError("each reason must be at most 500 characters")
        return value


# ---- the receiver (no sockets) --------------------------------------------------------------

Handler = Callable[[AlertPayload, str], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: dict[str, Any]


class AlertReceiver:
    """Verifies requests and calls ``handler(alert, idempotency_key)`` once per accepted key."""

    def __init__(
        self,
        secret: bytes,
        handler: Handler,
        *,
        tolerance_s: float = TOLERANCE_S,
        max_body: int = MAX_BODY_BYTES,
        clock: Callable[[], float] = time.time,
        journal: Path | None = None,
        key_ttl_s: float = 0.0,
    ) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise UsageError(f"webhook secret of {len(secret)} bytes; use {MIN_SECRET_BYTES} or more")
        self._secret = secret
        self.handler = handler
        self.tolerance_s = tolerance_s
        self.max_body = max_body
        self.clock = clock
        if not key_ttl_s >= 0:
            raise UsageError(f"key_ttl_s {key_ttl_s!r}: give the seconds an accepted key is remembered (0 or more)")
        self.journal = journal
        self.key_ttl_s = key_ttl_s
        self._lock = threading.Lock()
        self._keys: dict[str, float] = {}
        self._signatures: dict[str, float] = {}
        self._pending: dict[str, str] = {}
        """Keys (and their signatures) whose handler is running: reserved, not yet consumed."""
        self.log: list[dict[str, Any]] = []
        """One entry per request: status, reason, key (what the demo prints)."""
        self._load_journal()

    def _load_journal(self) -> None:
        if self.journal is None or not self.journal.exists():
            return
        now = self.clock()
        try:
            raw = self.journal.read_bytes()
        except OSError as err:
            raise UsageError(f"{self.journal}: cannot read the webhook journal: {_one_line(err)}") from None
        corrupt = 0
        for line in raw.splitlines():
            if not line.strip():
                continue
            try:
                item = json.loads(line.decode("utf-8"))
                expires = float(item["expires"])
                key_expires = max(expires, float(item.get("key_expires", expires)))
                if key_expires > now:
                    self._keys[str(item["key"])] = key_expires
                if expires > now:
                    self._signatures[str(item["signature"])] = expires
            except (ValueError, KeyError, TypeError, RecursionError):
                # a torn last line after a crash, bytes that are not UTF-8, nesting too deep to
                # parse: the line is corrupt, the rest still counts
                corrupt += 1
        if corrupt:
            _log.warning("webhook: skipped %d corrupt line(s) in the journal %s", corrupt, self.journal)

    def _reserve(self, key: str, sig: str, expires: float) -> None:
        """Hold ``key`` while its handler runs (in memory only: a crash or a refusal frees it)."""
        self._keys[key] = max(expires, self.clock() + self.key_ttl_s)
        self._signatures[sig] = expires
        self._pending[key] = sig

    def _release(self, key: str, sig: str) -> None:
        """The handler refused or failed: the key was never consumed, a retry may use it."""
        self._pending.pop(key, None)
        self._keys.pop(key, None)
        self._signatures.pop(sig, None)

    def _consume(self, key: str, sig: str, expires: float) -> str | None:
        """The handler succeeded: the key is spent, journaled durably; the journal error, if any."""
        self._pending.pop(key, None)
        key_expires = max(expires, self.clock() + self.key_ttl_s)
        self._keys[key] = key_expires
        self._signatures[sig] = expires
        if self.journal is None:
            return None
        line = json.dumps({"key": key, "signature": sig, "expires": expires, "key_expires": key_expires}).encode()
        try:
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            _append_line(self.journal, line)
        except OSError as err:
            _log.error("webhook: accepted %r but could not journal it: %s", key, _one_line(err))
            return _one_line(err)
        return None

    def respond(self, status: int, reason: str, key: str | None = None, **extra: Any) -> Reply:
        """A reply, recorded in ``log``."""
        self.log.append({"status": status, "reason": reason, "key": key, "at": self.clock()})
        return Reply(status, {"status": status, "reason": reason, **extra})

    def handle(self, headers: Mapping[str, str], body: bytes) -> Reply:
        """The reply to one request; the handler runs only for a valid, fresh, unique alert."""
        h = {k.lower(): v.strip() for k, v in headers.items()}
        if len(body) > self.max_body:
            return self.respond(413, f"body of {len(body)} bytes exceeds {self.max_body}")
        ts_raw, sig = h.get(TIMESTAMP_HEADER.lower()), h.get(SIGNATURE_HEADER.lower())
        if not ts_raw or not sig:
            return self.respond(401, f"unsigned: {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} are required")
        ts = ascii_int(ts_raw, TIMESTAMP_DIGITS)
        if ts is None:
            return self.respond(
                400, f"malformed {TIMESTAMP_HEADER}: want unix seconds, 1 to {TIMESTAMP_DIGITS} ASCII digits"
            )
        if not _SIGNATURE_RE.fullmatch(sig):
            return self.respond(401, f"malformed {SIGNATURE_HEADER}: want sha256=<64 lowercase hex>")
        if not hmac.compare_digest(signature(self._secret, ts_raw, body), sig):
            return self.respond(401, "signature does not match")
        now = self.clock()
        if abs(now - ts) > self.tolerance_s:
            age = now - ts
            when = f"{age:.0f}s ago" if age > 0 else f"{-age:.0f}s in the future"
            return self.respond(401, f"stale: signed {when}, outside the {self.tolerance_s:g}s replay window")
        key = h.get(IDEMPOTENCY_HEADER.lower(), "")
        if not KEY_RE.fullmatch(key):
            return self.respond(400, f"{IDEMPOTENCY_HEADER} must be 8-128 characters of [A-Za-z0-9._:@-]")
        try:
            data = json.loads(body)
            alert = AlertPayload.model_validate(data)
        except ValueError as err:
            message = describe_validation(err, "alert", "the alert schema") if isinstance(err, ValidationError) else err
            return self.respond(400, f"invalid alert: {message}", key)
        except RecursionError:
            return self.respond(400, "invalid alert: JSON nested too deeply", key)
        expires = ts + self.tolerance_s + 1
        with self._lock:
            for table in (self._keys, self._signatures):
                for item in [k for k, exp in table.items() if exp <= now]:
                    del table[item]
            if key in self._pending or sig in self._pending.values():
                reason = f"replayed: {IDEMPOTENCY_HEADER} {key!r} is being handled; retry later"
                return self.respond(409, reason, key, replayed="in_progress")
            if key in self._keys:
                reason = f"replayed: {IDEMPOTENCY_HEADER} {key!r} was already accepted"
                return self.respond(409, reason, key, replayed="accepted")
            if sig in self._signatures:
                reason = "replayed: this signed request was already accepted under another key"
                return self.respond(409, reason, key, replayed="signature")
            self._reserve(key, sig, expires)
        try:
            result = dict(self.handler(alert, key))
        except GpufleetError as err:
            with self._lock:
                self._release(key, sig)
            return self.respond(422, f"alert refused: {err}", key)
        except Exception as err:  # noqa: BLE001 - the handler's bug must not kill the server
            with self._lock:
                self._release(key, sig)
            return self.respond(500, f"handler failed: {_one_line(err)}", key)
        with self._lock:
            journal_error = self._consume(key, sig, expires)
        if journal_error is not None:
            return self.respond(202, "accepted", key, result=result, journal_error=journal_error)
        return self.respond(202, "accepted", key, result=result)


def _append_line(path: Path, line: bytes) -> None:
    """Append ``line`` and sync it; a last line torn by a crash is closed first, so it stays one bad line, not two."""
    with path.open("ab+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                line = b"\n" + line
        fh.write(line + b"\n")  # append mode: at the end, wherever the read left the position
        fh.flush()
        os.fsync(fh.fileno())


# ---- the HTTP server and the client -----------------------------------------------------------


_Request = socket.socket | tuple[bytes, socket.socket]


def _raw_reply(status: int, phrase: str, body: Mapping[str, Any], extra: Mapping[str, str] | None = None) -> bytes:
    """A whole ``Connection: close`` HTTP/1.1 response, for a connection no handler serves."""
    payload = json.dumps(dict(body)).encode()
    lines = [
        f"HTTP/1.1 {status} {phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{name}: {value}" for name, value in (extra or {}).items()),
        "Connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    _replied = False

    def log_message(self, format: str, *args: Any) -> None:
        return  # requests are in AlertReceiver.log; stderr stays clean

    def log_error(self, format: str, *args: Any) -> None:
        _log.debug("webhook %s: %s", self.client_address[0], " ".join((format % args).split()))

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.read_timeout)
        self.server.watch(self.connection)

    def handle(self) -> None:
        """The boundary: whatever goes wrong below is answered (500, once) and logged in one line."""
        try:
            super().handle()
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the peer left, stalled or was cut off: no one to answer
        except Exception as err:  # noqa: BLE001 - a bug must cost one request, not the thread
            self.close_connection = True
            _log.error("webhook %s: request failed: %s", self.client_address[0], _one_line(err))
            if not self._replied:
                reply = self.server.receiver.respond(500, f"internal error: {type(err).__name__}")
                with contextlib.suppress(OSError):
                    self._send(reply)

    def finish(self) -> None:
        self.server.unwatch(self.connection)
        with contextlib.suppress(OSError):  # flushing to a peer that left
            super().finish()

    def _send(self, reply: Reply, extra: Mapping[str, str] | None = None) -> None:
        self._replied = True
        self.close_connection = True
        self.server.unwatch(self.connection)  # the request is in; the reply may take its time
        payload = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:
        receiver = self.server.receiver
        if self.path.split("?", 1)[0] != self.server.route:
            self._send(Reply(404, {"status": 404, "reason": f"POST alerts to {self.server.route}"}))
            return
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths or self.headers.get("Transfer-Encoding") is not None:
            self._send(Reply(411, {"status": 411, "reason": "a Content-Length is required (no Transfer-Encoding)"}))
            return
        length = ascii_int(lengths[0].strip(), LENGTH_DIGITS)
        if length is None or any(other.strip() != lengths[0].strip() for other in lengths[1:]):
            reason = f"malformed Content-Length: want one value of 1 to {LENGTH_DIGITS} ASCII digits"
            self._send(receiver.respond(400, reason))
            return
        if length > receiver.max_body:
            # Drain a modest excess so the client reads the 413 instead of a reset; never buffer it.
            remaining = length if length <= DRAIN_LIMIT else 0
            while remaining > 0:
                chunk = self.rfile.read(min(remaining, 65536))
                if not chunk:
                    break
                remaining -= len(chunk)
            self._send(receiver.respond(413, f"body of {length} bytes exceeds {receiver.max_body}"))
            return
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            reason = f"timed out reading the body: no data for {self.server.read_timeout:g}s"
            self._send(receiver.respond(408, reason))
            return
        if len(body) < length:
            self._send(receiver.respond(400, f"the body ended after {len(body)} of {length} bytes"))
            return
        self._send(receiver.handle(dict(self.headers.items()), body))

    def do_GET(self) -> None:
        self._send(Reply(405, {"status": 405, "reason": "POST signed alerts"}))


class _Server(ThreadingHTTPServer):
    """Bounded: ``max_handlers`` threads, ``request_timeout`` per request, a ``backlog``-deep queue."""

    daemon_threads = True
    receiver: AlertReceiver
    route: str

    def __init__(
        self,
        address: tuple[str, int],
        *,
        read_timeout: float,
        request_timeout: float,
        max_handlers: int,
        backlog: int,
    ) -> None:
        self.read_timeout = read_timeout
        self.request_timeout = request_timeout
        self.max_handlers = max_handlers
        self.request_queue_size = backlog
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._reading: dict[socket.socket, float] = {}
        """Connections still sending their request, and when they must be done."""
        self._refused: list[tuple[socket.socket, float]] = []
        """Connections answered 503, drained (so the reply is not lost to a reset) until this time."""
        super().__init__(address, _Handler)

    @property
    def busy(self) -> int:
        return self._busy

    # -- at most max_handlers threads; the rest are answered 503 by the accepting thread ------------

    def process_request(self, request: _Request, client_address: Any) -> None:
        with self._busy_lock:
            full = self._busy >= self.max_handlers
            if not full:
                self._busy += 1
        if full:
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done()
            raise

    def process_request_thread(self, request: _Request, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done()

    def _done(self) -> None:
        with self._busy_lock:
            self._busy -= 1

    def _refuse(self, request: _Request) -> None:
        if not isinstance(request, socket.socket):
            return
        reason = f"busy: {self.max_handlers} requests in progress; retry after {RETRY_AFTER_S}s"
        reply = self.receiver.respond(503, reason)
        raw = _raw_reply(503, "Service Unavailable", reply.body, {"Retry-After": str(RETRY_AFTER_S)})
        try:
            request.setblocking(False)
            request.send(raw)  # a few hundred bytes into an empty send buffer: never blocks
            request.shutdown(socket.SHUT_WR)
        except OSError:
            request.close()
            return
        if len(self._refused) >= _REFUSED_CAP:
            request.close()
        else:
            self._refused.append((request, time.monotonic() + _REFUSED_GRACE_S))

    # -- the server thread's chores, every _POLL_S ------------------------------------------------

    def watch(self, conn: socket.socket) -> None:
        with self._busy_lock:
            self._reading[conn] = time.monotonic() + self.request_timeout

    def unwatch(self, conn: socket.socket) -> None:
        with self._busy_lock:
            self._reading.pop(conn, None)

    def service_actions(self) -> None:
        super().service_actions()
        now = time.monotonic()
        with self._busy_lock:
            late = [conn for conn, deadline in self._reading.items() if deadline <= now]
            for conn in late:
                del self._reading[conn]
                _cut(conn)  # the handler's blocked read returns: its request is cut off
        kept: list[tuple[socket.socket, float]] = []
        for conn, deadline in self._refused:
            if _drained(conn) or deadline <= now:
                conn.close()
            else:
                kept.append((conn, deadline))
        self._refused = kept

    def handle_error(self, request: _Request, client_address: Any) -> None:
        err = sys.exc_info()[1]
        _log.error("webhook %s: %s", client_address[0], _one_line(err) if err else "unknown error")

    def server_close(self) -> None:
        super().server_close()
        for conn, _ in self._refused:
            conn.close()
        self._refused = []
        with self._busy_lock:
            for conn in self._reading:
                _cut(conn)
            self._reading.clear()


def _cut(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        conn.shutdown(socket.SHUT_RDWR)


def _drained(conn: socket.socket) -> bool:
    """Read what a refused client sent without blocking; True once it closed (or failed)."""
    for _ in range(16):
        try:
            if not conn.recv(65536):
                return True
        except BlockingIOError:
            return False
        except OSError:
            return True
    return False


class WebhookServer:
    """``AlertReceiver`` behind HTTP on a background thread; loopback unless ``allow_remote``.

    ``read_timeout`` bounds each socket read, ``request_timeout`` a whole request, ``max_handlers``
    the connections served at once (more are answered 503 with ``Retry-After``) and ``backlog`` the
    kernel's queue of connections not yet accepted.
    """

    def __init__(
        self,
        receiver: AlertReceiver,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        route: str = "/alerts",
        allow_remote: bool = False,
        read_timeout: float = READ_TIMEOUT_S,
        request_timeout: float = REQUEST_TIMEOUT_S,
        max_handlers: int = MAX_HANDLERS,
        backlog: int = BACKLOG,
    ) -> None:
        try:
            loopback = ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback and not allow_remote:
            raise UsageError(f"refusing to listen on {host!r}: the webhook binds loopback unless allow_remote is set")
        if not (read_timeout > 0 and request_timeout > 0):
            raise UsageError(f"timeouts must be positive, not {read_timeout!r} and {request_timeout!r}")
        if max_handlers < 1 or backlog < 1:
            raise UsageError(f"max_handlers ({max_handlers}) and backlog ({backlog}) must be at least 1")
        self._server = _Server(
            (host, port),
            read_timeout=read_timeout,
            request_timeout=request_timeout,
            max_handlers=max_handlers,
            backlog=backlog,
        )
        self._server.receiver = receiver
        self._server.route = route
        self.receiver = receiver
        self._thread = threading.Thread(target=self._serve, name="gpufleet-webhook", daemon=True)

    def _serve(self) -> None:
        self._server.serve_forever(poll_interval=_POLL_S)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self._server.route}"

    @property
    def in_flight(self) -> int:
        """Connections being served now (each holds one thread, at most ``max_handlers``)."""
        return self._server.busy

    @property
    def backlog(self) -> int:
        return self._server.request_queue_size

    def start(self) -> WebhookServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> WebhookServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def post_alert(
    url: str,
    payload: AlertPayload | Mapping[str, Any],
    secret: bytes,
    *,
    idempotency_key: str | None = None,
    timestamp: int | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Sign and POST an alert; the status, the JSON reply and the headers sent (to replay them)."""
    data = payload.model_dump() if isinstance(payload, AlertPayload) else dict(payload)
    body = json.dumps(data, sort_keys=True).encode()
    headers = signed_headers(secret, body, idempotency_key=idempotency_key, timestamp=timestamp)
    status, reply = send(url, body, headers, timeout=timeout)
    return status, reply, headers


def send(url: str, body: bytes, headers: Mapping[str, str], *, timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
    """POST raw bytes with the given headers; the status and the JSON reply (4xx/5xx included)."""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"webhook URL {url!r} must start with http:// or https://")
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        raw = err.read()
        err.close()
        try:
            return int(err.code), json.loads(raw or b"{}")
        except ValueError:
            return int(err.code), {"reason": raw.decode(errors="replace")}


__all__ = [
    "BACKLOG",
    "DRAIN_LIMIT",
    "IDEMPOTENCY_HEADER",
    "KEY_RE",
    "KEY_TTL_S",
    "LENGTH_DIGITS",
    "MAX_BODY_BYTES",
    "MAX_HANDLERS",
    "MAX_SECRET_FILE_BYTES",
    "MIN_SECRET_BYTES",
    "READ_TIMEOUT_S",
    "REQUEST_TIMEOUT_S",
    "RETRY_AFTER_S",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "SIGNATURE_HEADER",
    "TIMESTAMP_DIGITS",
    "TIMESTAMP_HEADER",
    "TOLERANCE_S",
    "AlertPayload",
    "AlertReceiver",
    "Handler",
    "Reply",
    "WebhookServer",
    "ascii_int",
    "load_secret",
    "post_alert",
    "read_secret_file",
    "send",
    "signature",
    "signed_headers",
    "write_secret",
]
