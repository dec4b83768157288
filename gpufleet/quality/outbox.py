"""The webhook outbox: an alert is written down before it is sent, and sent until it is answered.

MLflow's webhooks retry a delivery in memory three times and forget it when the sender stops; an
alert that asks for a retrain must survive a restart of either side. So an event is appended to
``$GPUFLEET_HOME/quality/outbox/outbox.jsonl`` (synced) before any attempt, and every attempt is
recorded there too; the state of an event is what its lines say, read again on each pass:

    {"t": "event",  "key": ..., "url": ..., "secret_file": ..., "payload": {...}, "at": ...}
    {"t": "send",   "key": ..., "n": 3, "at": ..., "retry_at": ...}      synced before the POST
    {"t": "result", "key": ..., "n": 3, "at": ..., "status": 503, "error": ..., "outcome": "retry",
                    "next_at": ...}
    {"t": "replay", "key": ..., "at": ...}                               ``webhook replay``: send again

Why a JSON Lines file and not SQLite: the monitor's own history is JSONL (``standing.py``), the file
is the delivery log a person reads with ``tail``, appends are small and rare, and the one thing
SQLite would add, a transaction across lines, is not needed: every line stands alone. Its costs
are handled here: a line torn by a crash is skipped when read and closed (a newline) before the
next append; appends hold ``outbox.lock`` so two writers never interleave; the whole file is read
on each pass (an outbox holds alerts, a few a day per model).

Delivery (:meth:`Outbox.deliver_due`) holds ``send.lock`` for the pass, so two senders (a ``webhook
send --forever`` and the monitor's drain after a round) never have one event in flight twice; the
second one finds the lock taken and leaves the pass to the first. Each attempt is signed afresh
(the receiver refuses a timestamp older than its replay window) under the event's one idempotency
key, and classified by :func:`classify`: 2xx and 409 "already accepted" are delivered; 408, 409
"being handled", 429, 5xx and network errors are retried; any other 4xx, and a 3xx, fail for good
(the request itself is wrong: retrying cannot help; fix it and ``replay``). Retries back off
exponentially with jitter (:class:`RetryPolicy`); the time of the next try is in the file, so a
restarted sender keeps the schedule. An attempt whose sender was killed before the reply counts
as an attempt, retried at the ``retry_at`` its ``send`` line holds.

Exactly once is the receiver's half: it remembers an accepted key for a day
(:data:`gpufleet.quality.webhook.KEY_TTL_S`, far longer than the default schedule's 3.6 hours),
and ``retrain_once`` keys the job itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import math
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpufleet.errors import GpufleetError, UsageError
from gpufleet.quality.webhook import KEY_RE, AlertPayload, load_secret, send, signed_headers

OUTBOX_FILE = "outbox.jsonl"
SEND_TIMEOUT_S = 10.0
"""How long one POST may take before it counts as a failed attempt (retried)."""
MAX_URL = 2048
_RETRY_STATUSES = frozenset({408, 429})
State = Literal["pending", "delivered", "failed"]
Outcome = Literal["delivered", "retry", "failed"]
Post = Callable[[str, bytes, Mapping[str, str], float], tuple[int, dict[str, Any]]]
"""The transport: ``(url, body, headers, timeout) -> (status, reply)``; raises ``OSError`` when unreachable."""


def outbox_dir(home: Path) -> Path:
    """``$GPUFLEET_HOME/quality/outbox``: the outbox file and its two locks."""
    return home / "quality" / "outbox"


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """When to try again: ``min(cap_s, base_s * 2**(n-1))`` after the n-th attempt, less up to ``jitter`` of it.

    The jitter spreads out senders retrying against one receiver that came back (AWS Architecture
    Blog, "Exponential Backoff and Jitter", 2015). The defaults (2 s, doubling to a 10-minute cap,
    30 attempts) wait 2 + 4 + ... + 512 s, then 20 x 600 s between them: 13,022 s (3.6 hours) at most,
    less with the jitter, before an event fails.
    """

    base_s: float = 2.0
    """The delay after the first attempt."""
    cap_s: float = 600.0
    """The longest delay between two attempts."""
    max_attempts: int = 30
    """Attempts before an event fails for good (``webhook replay`` queues it again)."""
    jitter: float = 0.5
    """The share of each delay drawn at random (0: none; 0.5: between half the delay and all of it)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.base_s) and 0 < self.base_s <= self.cap_s and math.isfinite(self.cap_s)):
            raise UsageError(f"backoff base {self.base_s!r} and cap {self.cap_s!r}: give 0 < base <= cap seconds")
        if not 1 <= self.max_attempts <= 1000:
            raise UsageError(f"max attempts {self.max_attempts!r}: give 1 to 1000")
        if not 0 <= self.jitter < 1:
            raise UsageError(f"jitter {self.jitter!r}: give a share from 0 up to (not including) 1")

    def delay(self, attempt: int, draw: float = 0.0) -> float:
        """Seconds to wait after attempt number ``attempt`` (1-based); ``draw`` in [0, 1) picks the jitter."""
        full = self.cap_s if attempt > 60 else min(self.cap_s, self.base_s * 2 ** (attempt - 1))
        return full * (1 - self.jitter * draw)


def classify(status: int | None, reply: Mapping[str, Any]) -> Outcome:
    """What an answer means for the event: ``None`` is no answer (the network failed)."""
    if status is None or status >= 500 or status in _RETRY_STATUSES:
        return "retry"
    if 200 <= status < 300:
        return "delivered"
    if status == 409:  # a replay: done unless the first delivery is still being handled (it may yet fail)
        return "retry" if reply.get("replayed") == "in_progress" else "delivered"
    return "failed"


@dataclass(frozen=True, slots=True)
class Attempt:
    n: int
    """The attempt's number since the event was queued or replayed."""
    at: float
    status: int | None
    error: str | None
    outcome: Outcome | None
    """``None``: the sender stopped before the answer (or is waiting for it now)."""


@dataclass(slots=True)
class OutboxEvent:
    """One event as its lines tell it."""

    key: str
    url: str
    secret_file: str | None
    payload: dict[str, Any]
    queued_at: float
    state: State = "pending"
    tries: int = 0
    """Attempts since it was queued or last replayed: the exponent of the backoff."""
    next_at: float | None = None
    """When it is due (``None`` once delivered or failed)."""
    history: list[Attempt] = field(default_factory=list)

    @property
    def last(self) -> Attempt | None:
        return self.history[-1] if self.history else None

    def to_dict(self) -> dict[str, Any]:
        last = self.last
        return {
            "key": self.key,
            "model": self.payload.get("model"),
            "action": self.payload.get("action"),
            "window": self.payload.get("window"),
            "url": self.url,
            "state": self.state,
            "attempts": len(self.history),
            "last_status": last.status if last else None,
            "last_error": last.error if last else None,
            "last_at": last.at if last else None,
            "next_at": self.next_at,
            "queued_at": self.queued_at,
        }


@dataclass(slots=True)
class DeliveryReport:
    """What one pass did."""

    busy: bool = False
    """Another sender held the outbox: this pass sent nothing."""
    sent: int = 0
    delivered: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "busy": self.busy,
            "sent": self.sent,
            "delivered": self.delivered,
            "retrying": self.retrying,
            "failed": self.failed,
        }


def _post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> tuple[int, dict[str, Any]]:
    return send(url, body, headers, timeout=timeout)


class Outbox:
    """The outbox in ``folder``; ``clock``, ``rng`` and ``post`` are passed in so tests need no network or waiting."""

    def __init__(
        self,
        folder: Path,
        *,
        policy: RetryPolicy | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        post: Post = _post,
        timeout_s: float = SEND_TIMEOUT_S,
    ) -> None:
        self.folder = folder
        self.path = folder / OUTBOX_FILE
        self.policy = policy or RetryPolicy()
        self.clock = clock
        self.rng = rng or random.Random()
        self.post = post
        self.timeout_s = timeout_s
        self._down: dict[str, float] = {}
        """URLs that did not answer, and when to try them again: their other events wait as long."""

    # ---- the file ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self, name: str, *, block: bool = True) -> Iterator[bool]:
        """Hold ``folder/name`` (an ``flock``: it dies with the process); False if taken, unless ``block``."""
        from gpufleet.paths import private_dir

        private_dir(self.folder)
        fd = os.open(self.folder / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def _append(self, record: Mapping[str, Any], *, new_key: bool = False) -> bool:
        """One synced line; a torn last line (a writer killed mid-line) is closed first, so it stays one bad line.

        With ``new_key``, nothing is written (False) when an event with the record's key exists.
        """
        line = json.dumps(record, sort_keys=True, allow_nan=False).encode() + b"\n"
        with self._lock("outbox.lock"):
            if new_key and any(e.key == record["key"] for e in self.events()):
                return False
            created = not self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _sync_dir(self.folder)
        return True

    def _lines(self) -> Iterator[dict[str, Any]]:
        """The records, oldest first; a torn, foreign or non-UTF-8 line is skipped."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as err:
            raise UsageError(f"cannot read the outbox {self.path}: {err.strerror}") from None
        for line in raw.splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict) and isinstance(record.get("key"), str):
                yield record

    def events(self) -> list[OutboxEvent]:
        """Every event, in the order queued, with its state folded from its lines."""
        found: dict[str, OutboxEvent] = {}
        for record in self._lines():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                _fold(found, record)
        return list(found.values())

    # ---- queueing ---------------------------------------------------------------------------

    def enqueue(
        self, payload: AlertPayload | Mapping[str, Any], *, url: str, key: str, secret_file: Path | None = None
    ) -> bool:
        """Write the event down (synced) before anyone sends it; False if ``key`` was queued already.

        The payload is validated here, so what is queued is what a receiver accepts; the secret is
        not copied: the file is named, and read afresh at each attempt.
        """
        alert = payload if isinstance(payload, AlertPayload) else AlertPayload.model_validate(dict(payload))
        check_key(key)
        check_url(url)
        record = {
            "t": "event",
            "key": key,
            "url": url,
            "secret_file": None if secret_file is None else str(secret_file),
            "payload": alert.model_dump(mode="json"),
            "at": self.clock(),
        }
        return self._append(record, new_key=True)

    def replay(self, key: str) -> OutboxEvent:
        """Queue ``key`` again, due now, backoff restarted; the receiver remembers the key, so it does not act twice."""
        event = next((e for e in self.events() if e.key == key), None)
        if event is None:
            raise UsageError(f"no event with key {key[:130]!r} in {self.path}: see `gpufleet quality webhook log`")
        self._append({"t": "replay", "key": key, "at": self.clock()})
        return next(e for e in self.events() if e.key == key)

    def replay_failed(self) -> list[str]:
        """Queue every failed event again; their keys."""
        keys = [e.key for e in self.events() if e.state == "failed"]
        for key in keys:
            self._append({"t": "replay", "key": key, "at": self.clock()})
        return keys

    # ---- sending ----------------------------------------------------------------------------

    def deliver_due(self, *, block: bool = False, until: float | None = None) -> DeliveryReport:
        """Send each due event, until none is; ``busy`` if another sender holds the outbox (unless ``block``)."""
        report = DeliveryReport()
        with self._lock("send.lock", block=block) as held:
            if not held:
                report.busy = True
                return report
            secrets: dict[str | None, bytes | str] = {}
            while (until is None or self.clock() < until) and (due := self.due()):
                for event in due:
                    if until is not None and self.clock() >= until:
                        break  # the caller's time is up: what is left stays due for the next pass
                    if self._down.get(event.url, 0.0) <= self.clock():
                        self._attempt(event, report, secrets)
        return report

    def due(self) -> list[OutboxEvent]:
        """Pending events whose time has come, the most overdue first."""
        now = self.clock()
        due = [e for e in self.events() if (when := self._due_at(e)) is not None and when <= now]
        return sorted(due, key=lambda e: e.next_at or 0.0)

    def next_due(self) -> float | None:
        """When the next pending event is due (``None``: nothing pending)."""
        return min((t for t in map(self._due_at, self.events()) if t is not None), default=None)

    def _due_at(self, event: OutboxEvent) -> float | None:
        """When ``event`` is tried next: its own time, or later while its receiver does not answer at all.

        One unreachable receiver costs one attempt per backoff step, not one per queued event (this
        sender's memory only: a restarted sender tries it again at once).
        """
        if event.state != "pending" or event.next_at is None:
            return None
        return max(event.next_at, self._down.get(event.url, 0.0))

    def _attempt(self, event: OutboxEvent, report: DeliveryReport, secrets: dict[str | None, bytes | str]) -> None:
        n = event.tries + 1
        if n > self.policy.max_attempts:  # its last attempt was cut short: no answer, no more tries
            self._result(event, n - 1, None, "interrupted, and no attempt left", "failed", report)
            return
        now = self.clock()
        retry_at = now + self.policy.delay(n, self.rng.random())
        self._append({"t": "send", "key": event.key, "n": n, "at": now, "retry_at": retry_at})
        report.sent += 1
        status, reply, error, final = self._post_signed(event, secrets, retry_at)
        outcome: Outcome = classify(status, reply) if status is not None else "failed" if final else "retry"
        if outcome == "retry" and n >= self.policy.max_attempts:
            outcome, error = "failed", f"gave up after {n} attempts: {error or status}"
        self._result(event, n, status, error, outcome, report, next_at=retry_at if outcome == "retry" else None)

    def _post_signed(
        self, event: OutboxEvent, secrets: dict[str | None, bytes | str], retry_at: float
    ) -> tuple[int | None, dict[str, Any], str | None, bool]:
        """POST the event signed now: ``(status, reply, error, final)``; ``final``: no retry can help (a bad URL).

        A receiver that does not answer is not tried again, for any event, before ``retry_at``.
        """
        if event.secret_file not in secrets:
            try:
                secrets[event.secret_file] = load_secret(None if event.secret_file is None else Path(event.secret_file))
            except GpufleetError as err:
                secrets[event.secret_file] = str(err)  # read once a pass; the attempt is retried later
        secret = secrets[event.secret_file]
        if isinstance(secret, str):
            return None, {}, f"no secret: {secret}", False
        body = json.dumps(event.payload, sort_keys=True).encode()
        headers = signed_headers(secret, body, idempotency_key=event.key, timestamp=int(self.clock()))
        try:
            status, reply = self.post(event.url, body, headers, self.timeout_s)
        except UsageError as err:
            return None, {}, str(err), True
        except (OSError, http.client.HTTPException, ValueError) as err:
            self._down[event.url] = retry_at
            return None, {}, _one_line(err), False
        self._down.pop(event.url, None)
        reply = reply if isinstance(reply, dict) else {}  # the body is the receiver's: any JSON at all
        error = None if 200 <= status < 300 else str(reply.get("reason", ""))[:300] or f"HTTP {status}"
        return status, reply, error, False

    def _result(
        self,
        event: OutboxEvent,
        n: int,
        status: int | None,
        error: str | None,
        outcome: Outcome,
        report: DeliveryReport,
        *,
        next_at: float | None = None,
    ) -> None:
        record = {"t": "result", "key": event.key, "n": n, "at": self.clock(), "status": status, "error": error}
        self._append({**record, "outcome": outcome, "next_at": next_at})
        {"delivered": report.delivered, "retry": report.retrying, "failed": report.failed}[outcome].append(event.key)

    def run_forever(
        self, stop: threading.Event, *, poll_s: float = 1.0, on_pass: Callable[[DeliveryReport], None] | None = None
    ) -> None:
        """Deliver what is due, then sleep until the next event is due (at most ``poll_s``), until ``stop``."""
        while not stop.is_set():
            report = self.deliver_due()
            if on_pass is not None and (report.sent or report.failed):
                on_pass(report)
            upcoming = self.next_due()
            wait = poll_s if upcoming is None else min(poll_s, max(0.0, upcoming - self.clock()))
            stop.wait(max(wait, 0.01))


def _fold(found: dict[str, OutboxEvent], record: Mapping[str, Any]) -> None:
    """Apply one line to the events it concerns (a line about an unknown key, or a second ``event``, is ignored)."""
    kind, key = record["t"], record["key"]
    if kind == "event":
        if key not in found and isinstance(record["payload"], dict):
            secret = record.get("secret_file")
            found[key] = OutboxEvent(
                key=key,
                url=str(record["url"]),
                secret_file=secret if isinstance(secret, str) else None,
                payload=record["payload"],
                queued_at=float(record["at"]),
                next_at=float(record["at"]),
            )
        return
    event = found.get(key)
    if event is None:
        return
    if kind == "send":
        n, at, retry_at = int(record["n"]), float(record["at"]), float(record["retry_at"])  # all read, then applied
        event.tries, event.next_at = n, retry_at
        event.history.append(Attempt(n, at, None, None, None))
    elif kind == "result":
        outcome = record["outcome"]
        if outcome not in ("delivered", "retry", "failed"):
            return
        status = record.get("status")
        status = status if isinstance(status, int) and not isinstance(status, bool) else None
        attempt = Attempt(int(record["n"]), float(record["at"]), status, _text(record.get("error")), outcome)
        next_at = float(record["next_at"]) if outcome == "retry" else None
        if event.history and event.history[-1].outcome is None and event.history[-1].n == attempt.n:
            event.history[-1] = attempt  # the answer to the attempt its send line opened
        else:
            event.history.append(attempt)
        event.state = "pending" if outcome == "retry" else outcome
        event.next_at = next_at
    elif kind == "replay":
        event.state, event.tries, event.next_at = "pending", 0, float(record["at"])


def _text(value: object) -> str | None:
    return None if value is None else str(value)[:300]


def decision_key(model: str, window: str) -> str:
    """A monitor decision's key: ``model:window``, as :func:`~gpufleet.quality.standing.retrain_once` keys
    the retrain, so that a receiver on the same home submits one job whichever path asks first; hashed
    where a receiver would refuse it as an ``Idempotency-Key`` (a window name with a space, a long name)."""
    key = f"{model}:{window}"
    if KEY_RE.fullmatch(key):
        return key
    return "decision-" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:40]


def check_key(key: str) -> str:
    """``key`` if a receiver takes it as an ``Idempotency-Key``, else a ``UsageError`` saying what one is."""
    if not KEY_RE.fullmatch(key):
        raise UsageError(f"idempotency key {key[:130]!r}: give 8-128 characters of letters, digits and ._:@-")
    return key


def check_url(url: str) -> str:
    if not re.match(r"^https?://[^\s/]+", url) or len(url) > MAX_URL:
        raise UsageError(f"webhook URL {url[:100]!r}: give an http:// or https:// URL of at most {MAX_URL} characters")
    return url


def _sync_dir(folder: Path) -> None:
    """Make a new file's name durable (its folder's entry), as a synced line is useless if the file is lost."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}"[:300]


__all__ = [
    "OUTBOX_FILE",
    "SEND_TIMEOUT_S",
    "Attempt",
    "DeliveryReport",
    "Outbox",
    "OutboxEvent",
    "RetryPolicy",
    "check_key",
    "check_url",
    "classify",
    "decision_key",
    "outbox_dir",
]
