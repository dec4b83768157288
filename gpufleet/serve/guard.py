"""What every request to ``gpufleet serve`` passes before a route sees it: one ASGI middleware, :class:`Guard`.

Each bound names what it protects:

- **Host.** A request whose ``Host`` is not this server's (a loopback name, the ``--host`` value,
  an ``--allowed-host`` name, the machine's own name, or the IP address the connection arrived at)
  is answered 400, pages, API and webhook alike, and so is one without a ``Host`` or with two. A
  page of another site whose name re-resolves to 127.0.0.1 (DNS rebinding) would otherwise run in
  the browser with this server as its own origin and read every job. Listening on every interface
  (``0.0.0.0``, ``::``) widens the addresses, never the names: an IP literal cannot be rebound.
- **Who may act, before the body.** A state-changing request (any method but GET, HEAD and
  OPTIONS under ``/api/``) is refused for a foreign origin (403) or a missing token (401) from its
  headers alone (:func:`gpufleet.serve.auth.action_refusal`): an unauthenticated body is never
  read, parsed or buffered.
- **Body size.** An authorised body is read here, at most :data:`MAX_BODY_BYTES` (413 beyond, on
  ``Content-Length`` and again while it streams), and handed to the route from memory. The webhook
  (``/hooks/``) bounds and signs its own body and is left to do so.
- **Headers.** Every response carries :data:`SECURITY_HEADERS`: a Content-Security-Policy that
  lets the pages load only this server's script and style (no inline script, nothing third-party,
  no framing), ``X-Frame-Options``, ``nosniff`` and no ``Referer``.
- **No host path in a body.** Every JSON body has the home's absolute path replaced by
  ``$GPUFLEET_HOME`` (:class:`HomeScrub`), whatever produced it: a view, an error message, a log.

Connection-level bounds (how long a request may take to arrive, how many connections are open,
how often a repeated error is logged) live in :mod:`gpufleet.serve.limits`.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from gpufleet.errors import UsageError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 64 * 1024
"""The largest body of an API request: the actions take a reason and a version, never more."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
REFUSED_HOST_STATUS = 400
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
WILDCARDS = frozenset({"0.0.0.0", "::"})
HOME_MARK = "$GPUFLEET_HOME"

ActionCheck = Callable[[Mapping[str, str]], "tuple[int, str] | None"]


# ---- Host ---------------------------------------------------------------------------------------


def host_name(value: str) -> str | None:
    """The name in a ``Host`` header or a ``--host`` value: port stripped, brackets removed, lower case,
    an IP address in its canonical spelling; None when it is not one (empty, a bad port, stray brackets)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not _port(rest)):
            return None
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
        if not _port(":" + port):
            return None
    else:
        name = value  # a name, an IPv4 address, or a bare IPv6 address (as --host takes it)
    name = name.rstrip(".")
    if not name or any(c.isspace() or c in "/\\@[]" for c in name):
        return None
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return None if ":" in name else name


def _port(text: str) -> bool:
    digits = text[1:]
    return text.startswith(":") and 0 < len(digits) <= 5 and digits.isascii() and digits.isdigit()


def is_loopback_name(name: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1, or 127.x mapped into IPv6)."""
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def accepted_hosts(listen: str, allowed: Iterable[str]) -> frozenset[str]:
    """The names a request's ``Host`` may give besides loopback ones and the connection's own address.

    ``allowed`` (``--allowed-host``) always; the ``--host`` value unless it is a wildcard, where the
    machine's own host name (and its first label) stands in for every interface's names.
    """
    names = set()
    for value in allowed:
        name = host_name(value)
        if name is None:
            raise UsageError(f"--allowed-host {value[:80]!r} is not a host name: give one such as fleet.example.com")
        names.add(name)
    listen_name = host_name(listen)
    if listen_name is None or listen_name in WILDCARDS:
        own = socket.gethostname().lower().rstrip(".")
        names |= {own, own.split(".", 1)[0]} - {""}
    else:
        names.add(listen_name)
    return frozenset(names)


def host_refusal(scope: Scope, accepted: frozenset[str]) -> str | None:
    """Why the request's ``Host`` is not this server's, or None when it is."""
    given = [v for k, v in scope.get("headers", ()) if k == b"host"]
    if len(given) != 1:
        return "give exactly one Host header" if given else "a Host header is required"
    name = host_name(given[0].decode("latin-1"))
    if name is None:
        return "the Host header is malformed"
    if name in accepted or is_loopback_name(name):
        return None
    local = (scope.get("server") or (None, None))[0]
    if local is not None and name == host_name(str(local)):
        return None  # the address the connection arrived at: an IP literal, which DNS cannot rebind
    return f"Host {name[:80]!r} is not a name of this server: start it with --allowed-host {name[:80]}"


# ---- the middleware -----------------------------------------------------------------------------


class Guard:
    """The checks of this module's docstring, in its order, around the app."""

    def __init__(
        self, app: ASGIApp, *, hosts: frozenset[str], check_action: ActionCheck, home: Path, max_body: int
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.check_action = check_action
        self.scrub = HomeScrub(home)
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        why = host_refusal(scope, self.hosts)
        if why is not None and scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        send = self.scrub.wrap(_with_headers(send))
        if why is not None:
            await reply(send, REFUSED_HOST_STATUS, why)
            return
        if scope["type"] == "http" and scope["path"].startswith("/api/") and scope["method"] not in SAFE_METHODS:
            await self._action(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _action(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refused = self.check_action(headers)
        if refused is not None:
            await reply(send, *refused)
            return
        length = headers.get("content-length", "").strip()
        if length and not (length.isascii() and length.isdigit() and int(length) <= self.max_body):
            await reply(send, 413, f"the body exceeds {self.max_body} bytes: send less")
            return
        body = await read_body(receive, self.max_body)
        if body is None:
            await reply(send, 413, f"the body exceeds {self.max_body} bytes: send less")
            return
        await self.app(scope, _replay(body, receive), send)


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request's body, or None as soon as it exceeds ``limit`` (a disconnect ends it early)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return bytes(body)  # the client left: the route sees the disconnect on its next receive
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then whatever the connection says next (a disconnect)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def _with_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {k.lower() for k, _ in message.get("headers", ())}
            extra = [(k, v) for k, v in SECURITY_HEADERS if k not in present]
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sending


async def reply(send: Send, status: int, detail: str) -> None:
    """A JSON ``{"detail": ...}`` answer, as FastAPI's own errors look."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class HomeScrub:
    """Replaces the home's absolute path (as given and resolved) by ``$GPUFLEET_HOME`` in JSON bodies.

    Works on the encoded bytes, so it costs one regular-expression pass whatever built the body. A
    path merely starting with the home's (``/data/home2`` for ``/data/home``) is left alone.
    """

    def __init__(self, home: Path) -> None:
        spellings = {str(home), str(home.resolve())} - {"", "/", "."}
        escaped = sorted((json.dumps(s, ensure_ascii=False)[1:-1].encode() for s in spellings), key=len, reverse=True)
        alternatives = b"|".join(re.escape(s) for s in escaped)
        self.pattern = re.compile(b"(?:" + alternatives + rb")(?![\w.-])") if alternatives else None
        self.mark = json.dumps(HOME_MARK)[1:-1].encode()

    def __call__(self, body: bytes) -> bytes:
        return body if self.pattern is None else self.pattern.sub(self.mark.replace(b"\\", b"\\\\"), body)

    def wrap(self, send: Send) -> Send:
        """``send`` with each whole JSON body scrubbed and its ``Content-Length`` set to match."""
        held: list[Message] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and _is_json(message):
                held.append(message)
                return
            if held and message["type"] == "http.response.body":
                start = held.pop()
                if message.get("more_body", False):  # a stream: passed on as it is
                    await send(start)
                    await send(message)
                    return
                body = self(message.get("body", b""))
                headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"content-length"]
                await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
                await send({**message, "body": body})
                return
            await send(message)

        return sending


def _is_json(message: Message) -> bool:
    return any(k.lower() == b"content-type" and b"json" in v.lower() for k, v in message.get("headers", ()))


__all__ = [
    "MAX_BODY_BYTES",
    "SECURITY_HEADERS",
    "Guard",
    "HomeScrub",
    "accepted_hosts",
    "host_name",
    "host_refusal",
    "is_loopback_name",
]
