"""How much of the server a slow or numerous client can hold: time, connections, descriptors, log lines.

uvicorn alone waits forever for a request's head, accepts connections until the process runs out
of file descriptors, and then logs the failed ``accept()`` again and again. ``gpufleet serve`` runs
it with these bounds instead, as the standalone webhook receiver (:mod:`gpufleet.quality.webhook`)
bounds its own clients:

- **A deadline per request** (``request_timeout_s``, ``--request-timeout``): a request's head and
  body must have arrived within it, counted from the connection's opening or the end of the
  previous response on it. A half-sent or dripping request is then answered 408 (one that sent
  nothing is not answered) and its connection closed, so it no longer holds a descriptor.
- **Idle keep-alive connections** close after :data:`KEEP_ALIVE_S`.
- **A cap on open connections** (:func:`connection_cap`): at most ``--max-connections``, and never
  more than half of the descriptors the process may open (less a reserve for the store, logs and
  threads). A connection past the cap is answered 503 and closed as soon as it is accepted, without
  reading it; a full server still answers once the deadline has closed the slow ones. The listen
  backlog, which is also how many connections are accepted at a time, is the cap too: a burst
  cannot take more descriptors at once than the server may keep.
- **Descriptors**: the soft ``RLIMIT_NOFILE`` is raised to the hard limit at start
  (:func:`raise_fd_limit`), so the cap is as high as the system allows.
- **Repeated errors** (``socket.accept() out of system resource`` when descriptors run out
  anyway) are logged once per :data:`REPEAT_LOG_S` per message with the count of those not shown
  (:class:`RepeatFilter`), on the ``asyncio`` and ``uvicorn.error`` loggers: a flood of failures
  cannot fill the disk with tracebacks.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import TYPE_CHECKING, Any

from gpufleet.extras import required
from gpufleet.serve.guard import SECURITY_HEADERS

if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_TIMEOUT_S = 10.0
"""How long a request (line, headers, body) may take to arrive."""
KEEP_ALIVE_S = 5.0
"""How long an idle keep-alive connection is kept for its next request."""
MAX_CONNECTIONS = 512
"""Connections open at once, by default; fewer where the descriptor limit is low."""
FD_RESERVE = 64
"""Descriptors kept for everything but clients: the store (SQLite and its WAL), logs, threads' files."""
REPEAT_LOG_S = 60.0
"""A repeated log message is shown at most once per this many seconds."""
LOUD_LOGGERS = ("asyncio", "uvicorn.error")

_HEADERS = b"".join(b"%s: %s\r\n" % pair for pair in SECURITY_HEADERS)
"""The headers every response carries (:data:`~gpufleet.serve.guard.SECURITY_HEADERS`), these raw ones too."""
_TIMEOUT_REPLY = b"HTTP/1.1 408 Request Timeout\r\n%sContent-Length: 0\r\nConnection: close\r\n\r\n" % _HEADERS
_BUSY_BODY = b'{"detail": "too many connections: retry in a second"}'
_BUSY_REPLY = (
    b"HTTP/1.1 503 Service Unavailable\r\n%sContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (_HEADERS, len(_BUSY_BODY), _BUSY_BODY)
)


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard one (where allowed); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # a kernel cap below the hard limit (nr_open): keep the soft limit
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(wanted: int, fd_limit: int) -> int:
    """At most ``wanted`` connections, and at most half of what the descriptors left after the reserve allow."""
    return max(4, min(wanted, (fd_limit - FD_RESERVE) // 2))


def bounded_protocol(request_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the deadline and the connection cap of this module's docstring."""
    with required("uvicorn", "serve", "gpufleet serve"):
        import h11
        from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _refused = False
        _heard = False
        """Whether a byte of the request now awaited has arrived (a 408 is then owed, not a silent close)."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                self._refused = True
                self.transport = transport
                transport.write(_BUSY_REPLY)
                transport.close()
                return
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._refused:
                return
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            self._heard = True
            super().data_received(data)
            if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE):
                self._disarm()  # the whole request is in: the route's time is its own

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request on this connection has the same time to arrive
                if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE):
                    self._disarm()  # a pipelined request already in full

        def _arm(self) -> None:
            self._disarm()
            self._heard = False
            self._deadline = self.loop.call_later(request_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if self._heard and self._unanswered():
                self.transport.write(_TIMEOUT_REPLY)
            self.transport.close()

        def _unanswered(self) -> bool:
            """Whether nothing has been answered to the request arriving now (a 408 may still be sent)."""
            if self.conn.our_state is h11.IDLE:
                return True
            started = self.cycle is not None and self.cycle.response_started
            return self.conn.our_state is h11.SEND_RESPONSE and not started

    return BoundedH11Protocol


class RepeatFilter(logging.Filter):
    """Lets one record per message through every ``every_s`` seconds; the next one shown says how many were not.

    A message is its logger, level and first line (asyncio's context lines after it vary). At most
    ``max_keys`` messages are remembered, the oldest forgotten first.
    """

    def __init__(self, every_s: float = REPEAT_LOG_S, max_keys: int = 256, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.every_s, self.max_keys, self.clock = every_s, max_keys, clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg).split("\n", 1)[0][:200])
        now = self.clock()
        shown, hidden = self._seen.get(key, (float("-inf"), 0))
        if now - shown < self.every_s:
            self._seen[key] = (shown, hidden + 1)
            return False
        self._seen.pop(key, None)
        self._seen[key] = (now, 0)
        if len(self._seen) > self.max_keys:
            del self._seen[next(iter(self._seen))]
        if hidden:
            record.msg = f"{record.msg} ({hidden} more like this in the last {self.every_s:g} s not shown)"
        return True


def quiet_repeats(every_s: float = REPEAT_LOG_S) -> RepeatFilter:
    """Install one :class:`RepeatFilter` on each of :data:`LOUD_LOGGERS` (once; again: the same filter)."""
    for name in LOUD_LOGGERS:
        for existing in logging.getLogger(name).filters:
            if isinstance(existing, RepeatFilter):
                return existing
    repeat = RepeatFilter(every_s)
    for name in LOUD_LOGGERS:
        logging.getLogger(name).addFilter(repeat)
    return repeat


def uvicorn_config(app: Any, *, request_timeout_s: float, max_connections: int) -> Any:
    """A ``uvicorn.Config`` for ``app`` with the bounds above (the socket is the caller's)."""
    with required("uvicorn", "serve", "gpufleet serve"):
        import uvicorn

    cap = connection_cap(max_connections, raise_fd_limit())
    config = uvicorn.Config(
        app,
        http=bounded_protocol(request_timeout_s, cap),
        loop="asyncio",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=int(KEEP_ALIVE_S),
        backlog=min(cap, 2048),
    )
    quiet_repeats()  # after uvicorn configured its loggers
    return config


__all__ = [
    "FD_RESERVE",
    "KEEP_ALIVE_S",
    "MAX_CONNECTIONS",
    "REQUEST_TIMEOUT_S",
    "RepeatFilter",
    "bounded_protocol",
    "connection_cap",
    "quiet_repeats",
    "raise_fd_limit",
    "uvicorn_config",
]
