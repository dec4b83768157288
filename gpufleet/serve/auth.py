"""Who may change state through ``gpufleet serve``: a bearer token from a file only its owner can read.

Reading is open to whoever can reach the server (loopback by default). Every route that changes
state (preempt, cancel, hold, release, promote, roll back) needs ``Authorization: Bearer <token>``, compared in
constant time. That header is also the CSRF defence: a page of another origin cannot make a browser
send it (a custom header on a cross-origin request needs a CORS preflight, which this server never
grants), and a request that says it comes from another origin (``Origin``, ``Sec-Fetch-Site``) is
refused before the token is looked at. Both are judged from the headers alone
(:func:`action_refusal`, called by :class:`gpufleet.serve.guard.Guard` before any body is read).
The token is never logged or echoed.

The token file is created on first use (``secrets.token_urlsafe``, mode 0600). An existing one that
its group or others may read, or that another user owns, is refused: the server does not start.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from gpufleet.errors import UsageError

MIN_TOKEN_CHARS = 24
"""A token shorter than this (about 144 bits in url-safe base64) is refused as guessable."""

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def load_token(path: Path, *, create: bool = True) -> str:
    """The token in ``path``, created (0600) if missing and ``create``; refused if others may read it."""
    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(secrets.token_urlsafe(32) + "\n")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise UsageError(f"token file {path} does not exist: create it (mode 600) or leave --token-file out") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"token file {path} is not a regular file: point --token-file at one")
    if info.st_mode & 0o077:
        raise UsageError(
            f"token file {path} has mode {stat.S_IMODE(info.st_mode):03o}: others may read it; run `chmod 600 {path}`"
        )
    if info.st_uid != os.getuid():
        raise UsageError(f"token file {path} belongs to uid {info.st_uid}, not to this user: use a file of your own")
    token = path.read_text(encoding="utf-8").strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise UsageError(
            f"token file {path} holds {len(token)} characters: give one line of at least {MIN_TOKEN_CHARS}, "
            "or delete the file to have one made"
        )
    return token


def cross_origin(headers: Mapping[str, str], host: str) -> str | None:
    """Why a request comes from another origin than the server's (``host`` as the client addressed it), or None."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site: {site}"
    origin = headers.get("origin")
    if origin is not None:
        bare = origin.split("://", 1)[-1].rstrip("/")
        if bare != host:
            return "Origin is another site"
    return None


def action_refusal(headers: Mapping[str, str], token: str | None) -> tuple[int, str] | None:
    """The status and reason to refuse a state-changing request with, from its headers; None: it may act."""
    why = cross_origin(headers, headers.get("host", ""))
    if why is not None:
        return 403, f"cross-origin request refused ({why})"
    if token is None:
        return 403, "this server was started without a token: it changes nothing"
    if not bearer_ok(headers, token):
        return 401, "give the server's token: Authorization: Bearer <token>"
    return None


def bearer_ok(headers: Mapping[str, str], token: str | None) -> bool:
    """Whether ``Authorization: Bearer <token>`` carries the token (always False without one configured)."""
    if token is None:
        return False
    given = headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


__all__ = ["LOOPBACK", "MIN_TOKEN_CHARS", "action_refusal", "bearer_ok", "cross_origin", "is_loopback", "load_token"]
