"""The alert webhook: signed, fresh, unique alerts only, each acted on once.

A monitor (``gpufleet quality``, Evidently, Alertmanager behind a relay) POSTs a JSON alert::

    X-Gpufleet-Timestamp: 1796231675                  unix seconds when it was signed
    X-Gpufleet-Signature: sha256=<hex>                HMAC-SHA256(secret, timestamp + "." + body)
    Idempotency-Key: drift-2026-12-02T10:00Z          one key per alert; a retry reuses it

as Stripe and GitHub sign theirs. The receiver checks, in this order, and answers the first
failure: body size (413, before reading it), signature headers present and well-formed (401),
HMAC in constant time (401), timestamp within ``tolerance_s`` of now (401: stale), idempotency
key (400), JSON and schema (400), replay (409: a key *or* a signature already accepted; the
signature check stops a captured request replayed under a new key). Only then does the handler
run, once per key: a failing handler (422 for a refused alert, 500 for a bug) releases the key
so the sender may retry.

Nothing unauthenticated is parsed: the JSON is read only after the HMAC matched. The secret
comes from ``$GPUFLEET_WEBHOOK_SECRET`` or a file (``$GPUFLEET_WEBHOOK_SECRET_FILE`` or an
explicit path), never from the code; the server binds the loopback interface unless told
otherwise. Accepted keys live for the replay window, in memory and, with ``journal``, in an
append-only file so that a restarted receiver still refuses them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
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
MAX_BODY_BYTES = 64 * 1024
DRAIN_LIMIT = 1024 * 1024
"""An oversized body up to this size is read and dropped so the sender sees the 413."""
TOLERANCE_S = 300.0
KEY_RE = re.compile(r"^[A-Za-z0-9._:@-]{8,128}$")
_SIGNATURE_RE = re.compile(r"^sha256=([0-9a-f]{64})$")
_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# ---- the secret and the signature ----------------------------------------------------------


def load_secret(path: Path | None = None, env: Mapping[str, str] | None = None) -> bytes:
    """The shared secret: ``path``, else ``$GPUFLEET_WEBHOOK_SECRET``, else the file in ``..._FILE``."""
    env = os.environ if env is None else env
    if path is None and env.get(SECRET_ENV):
        raw = env[SECRET_ENV].strip().encode()
        source = f"${SECRET_ENV}"
    else:
        file = path or (Path(env[SECRET_FILE_ENV]) if env.get(SECRET_FILE_ENV) else None)
        if file is None:
            raise UsageError(f"no webhook secret: set ${SECRET_ENV} or ${SECRET_FILE_ENV} (a file holding it)")
        try:
            raw = file.read_bytes().strip()
        except OSError as err:
            raise UsageError(f"cannot read the webhook secret file {str(file)!r}: {err.strerror}") from None
        source = str(file)
    if len(raw) < MIN_SECRET_BYTES:
        raise UsageError(f"the webhook secret from {source} is {len(raw)} bytes; use {MIN_SECRET_BYTES} or more")
    return raw


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
    ) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise UsageError(f"webhook secret of {len(secret)} bytes; use {MIN_SECRET_BYTES} or more")
        self._secret = secret
        self.handler = handler
        self.tolerance_s = tolerance_s
        self.max_body = max_body
        self.clock = clock
        self.journal = journal
        self._lock = threading.Lock()
        self._keys: dict[str, float] = {}
        self._signatures: dict[str, float] = {}
        self.log: list[dict[str, Any]] = []
        """One entry per request: status, reason, key (what the demo prints)."""
        self._load_journal()

    def _load_journal(self) -> None:
        if self.journal is None or not self.journal.exists():
            return
        now = self.clock()
        for line in self.journal.read_text(encoding="utf-8").splitlines():
            try:
                item = json.loads(line)
                if float(item["expires"]) > now:
                    self._keys[str(item["key"])] = float(item["expires"])
                    self._signatures[str(item["signature"])] = float(item["expires"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line after a crash: the rest still counts

    def _remember(self, key: str, sig: str, expires: float) -> None:
        self._keys[key] = expires
        self._signatures[sig] = expires
        if self.journal is not None:
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            with self.journal.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"key": key, "signature": sig, "expires": expires}) + "\n")

    def _forget(self, key: str, sig: str) -> None:
        self._keys.pop(key, None)
        self._signatures.pop(sig, None)

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
        if not ts_raw.isdigit() or not _SIGNATURE_RE.match(sig):
            return self.respond(401, "malformed signature headers: want unix seconds and sha256=<64 hex>")
        if not hmac.compare_digest(signature(self._secret, ts_raw, body), sig):
            return self.respond(401, "signature does not match")
        now = self.clock()
        if abs(now - int(ts_raw)) > self.tolerance_s:
            age = now - int(ts_raw)
            when = f"{age:.0f}s ago" if age > 0 else f"{-age:.0f}s in the future"
            return self.respond(401, f"stale: signed {when}, outside the {self.tolerance_s:g}s replay window")
        key = h.get(IDEMPOTENCY_HEADER.lower(), "")
        if not KEY_RE.match(key):
            return self.respond(400, f"{IDEMPOTENCY_HEADER} must be 8-128 characters of [A-Za-z0-9._:@-]")
        try:
            data = json.loads(body)
            alert = AlertPayload.model_validate(data)
        except ValueError as err:
            message = describe_validation(err, "alert", "the alert schema") if isinstance(err, ValidationError) else err
            return self.respond(400, f"invalid alert: {message}", key)
        with self._lock:
            for table in (self._keys, self._signatures):
                for item in [k for k, exp in table.items() if exp <= now]:
                    del table[item]
            if key in self._keys:
                return self.respond(409, f"replayed: {IDEMPOTENCY_HEADER} {key!r} was already accepted", key)
            if sig in self._signatures:
                return self.respond(409, "replayed: this signed request was already accepted under another key", key)
            self._remember(key, sig, int(ts_raw) + self.tolerance_s + 1)
        try:
            result = dict(self.handler(alert, key))
        except GpufleetError as err:
            with self._lock:
                self._forget(key, sig)
            return self.respond(422, f"alert refused: {err}", key)
        except Exception as err:  # noqa: BLE001 - the handler's bug must not kill the server
            with self._lock:
                self._forget(key, sig)
            return self.respond(500, f"handler failed: {type(err).__name__}: {err}", key)
        return self.respond(202, "accepted", key, result=result)


# ---- the HTTP server and the client -----------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return  # requests are in AlertReceiver.log; stderr stays clean

    def _send(self, reply: Reply) -> None:
        payload = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
        self.close_connection = True

    def do_POST(self) -> None:
        receiver = self.server.receiver
        if self.path.split("?", 1)[0] != self.server.route:
            self._send(Reply(404, {"status": 404, "reason": f"POST alerts to {self.server.route}"}))
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit() or "chunked" in (self.headers.get("Transfer-Encoding") or ""):
            self._send(Reply(411, {"status": 411, "reason": "a Content-Length is required"}))
            return
        if int(length) > receiver.max_body:
            # Drain a modest excess so the client reads the 413 instead of a reset; never buffer it.
            remaining = int(length) if int(length) <= DRAIN_LIMIT else 0
            while remaining > 0:
                chunk = self.rfile.read(min(remaining, 65536))
                if not chunk:
                    break
                remaining -= len(chunk)
            self._send(receiver.respond(413, f"body of {length} bytes exceeds {receiver.max_body}"))
            return
        body = self.rfile.read(int(length))
        self._send(receiver.handle(dict(self.headers.items()), body))

    def do_GET(self) -> None:
        self._send(Reply(405, {"status": 405, "reason": "POST signed alerts"}))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    receiver: AlertReceiver
    route: str


class WebhookServer:
    """``AlertReceiver`` behind HTTP on a background thread; loopback unless ``allow_remote``."""

    def __init__(
        self,
        receiver: AlertReceiver,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        route: str = "/alerts",
        allow_remote: bool = False,
    ) -> None:
        try:
            loopback = ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback and not allow_remote:
            raise UsageError(f"refusing to listen on {host!r}: the webhook binds loopback unless allow_remote is set")
        self._server = _Server((host, port), _Handler)
        self._server.receiver = receiver
        self._server.route = route
        self._server.timeout = 10
        self.receiver = receiver
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpufleet-webhook", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self._server.route}"

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
    "DRAIN_LIMIT",
    "IDEMPOTENCY_HEADER",
    "KEY_RE",
    "MAX_BODY_BYTES",
    "MIN_SECRET_BYTES",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "TOLERANCE_S",
    "AlertPayload",
    "AlertReceiver",
    "Handler",
    "Reply",
    "WebhookServer",
    "load_secret",
    "post_alert",
    "send",
    "signature",
    "signed_headers",
    "write_secret",
]
