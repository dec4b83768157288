"""Preemption notices: a cloud says the node goes soon; the attempts on it save and drain first.

Spot and preemptible machines are taken back with a short warning that only the machine itself can
read, from its provider's link-local metadata service:

- **AWS EC2 spot** (IMDSv2): ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``
  gives a session token; ``GET /latest/meta-data/spot/instance-action`` with
  ``X-aws-ec2-metadata-token`` answers 404 until a notice exists, then
  ``{"action": "terminate"|"stop"|"hibernate", "time": "2026-01-01T00:02:00Z"}`` about two minutes
  ahead. AWS recommends asking every 5 seconds.
- **GCP**: ``GET /computeMetadata/v1/instance/preempted?wait_for_change=true`` with
  ``Metadata-Flavor: Google`` long-polls until the value changes from ``FALSE`` to ``TRUE``; the
  machine then has about 30 seconds (no time is given, so the deadline is unknown).
- **Azure Scheduled Events**: ``GET /metadata/scheduledevents?api-version=2020-07-01`` with
  ``Metadata: true`` lists events; one with ``EventType: "Preempt"`` (a spot eviction, at least
  30 seconds ahead) carries its ``NotBefore`` (RFC 1123). Once the node is drained, a ``POST`` of
  ``{"StartRequests": [{"EventId": ...}]}`` to the same URL tells Azure it may go ahead at once.

Each source turns its answer into a :class:`Notice`; a :class:`NoticeWatcher` thread polls the
configured sources and calls back once per notice. What a notice does to a node's attempts is
:class:`NoticeDrain`: record ``preemption_notice`` for each running attempt, send its process group
SIGUSR1 (the runtime saves at the next step boundary and exits 75, which requeues the job), and hold
new attempts back until the notice is withdrawn or its deadline has passed.

Every answer is untrusted input: reads are bounded, requests time out, JSON is checked field by
field, and a bad answer is logged once and polled again, never the end of the watcher.

Configuration: ``GPUFLEET_NOTICES=aws,gcp,azure`` (empty or unset: no watcher) and
``GPUFLEET_NOTICE_URL_AWS`` / ``_GCP`` / ``_AZURE`` to point a source elsewhere than the
documented ``http://169.254.169.254``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Protocol

from gpufleet.backends.lifecycle import signal_group
from gpufleet.errors import ServiceUnavailable, UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store
from gpufleet.paths import state_db

LINK_LOCAL = "http://169.254.169.254"
"""Where AWS, GCP (``metadata.google.internal``) and Azure all serve instance metadata."""
ENV_NOTICES = "GPUFLEET_NOTICES"
ENV_URL = "GPUFLEET_NOTICE_URL_"
MAX_BODY = 64 * 1024
"""The most bytes read of one answer: a metadata answer is a few hundred; more is not one."""
AWS_TOKEN_TTL_S = 21600
"""Seconds an IMDSv2 token lives (the most AWS allows); it is renewed a minute before it expires."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A provider's warning that this node is taken back."""

    source: str
    """``aws``, ``gcp``, ``azure`` or ``slurm``."""
    deadline: float | None
    """Unix time the node goes, ``None`` when the provider does not say (GCP)."""
    lead_s: float | None
    """Seconds between seeing the notice and the deadline (``None`` without a deadline)."""
    detail: str
    """What the provider said, in a few words (``terminate``, ``Preempt <EventId>``)."""

    def to_event(self) -> dict[str, Any]:
        """The payload of a ``preemption_notice`` event."""
        return {"source": self.source, "deadline": self.deadline, "lead_s": self.lead_s, "detail": self.detail}


class NoticeSource(Protocol):
    """One provider's metadata endpoint; ``poll`` raises :class:`ServiceUnavailable` on a bad answer."""

    name: str

    def poll(self) -> Notice | None:
        """The notice in force now, ``None`` when there is none."""

    def acknowledge(self, notice: Notice) -> None:
        """Tell the provider the node is drained (only Azure listens)."""


# --- HTTP -------------------------------------------------------------------------------------

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""No proxy: a metadata service answers on the node itself, and a proxy would ask on its own behalf."""


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: bytes
    etag: str | None


def _request(
    url: str, *, method: str = "GET", headers: Mapping[str, str], body: bytes | None = None, timeout: float
) -> _Answer:
    """Status, (bounded) body and ETag; 404 is an answer, not an error. Raises ``ServiceUnavailable``."""
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            data = _bounded(resp.read(MAX_BODY + 1), url)
            return _Answer(int(resp.status), data, resp.headers.get("ETag"))
    except urllib.error.HTTPError as err:
        with err:
            return _Answer(int(err.code), _bounded(err.read(MAX_BODY + 1), url), None)
    except (OSError, ValueError) as err:  # refused, timed out, a bad URL, a broken answer
        raise ServiceUnavailable(f"{url} did not answer ({err})") from None


def _bounded(data: bytes, url: str) -> bytes:
    if len(data) > MAX_BODY:
        raise ServiceUnavailable(f"{url} answered more than {MAX_BODY} bytes: not a metadata answer")
    return data


def _json(data: bytes, url: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ServiceUnavailable(f"{url} answered something that is not JSON") from None


def _lead(deadline: float | None, now: float) -> float | None:
    return None if deadline is None else round(max(0.0, deadline - now), 3)


# --- sources ----------------------------------------------------------------------------------


class AwsSpot:
    """EC2 spot's ``instance-action`` over IMDSv2, with a session token renewed before it expires."""

    name = "aws"

    def __init__(self, base: str = LINK_LOCAL, *, timeout: float = 2.0, clock: Callable[[], float] = time.time) -> None:
        self.base = base.rstrip("/")
        self.timeout = timeout
        self.clock = clock
        self._token: str | None = None
        self._token_until = 0.0

    def _session(self) -> str:
        now = self.clock()
        if self._token is None or now >= self._token_until:
            url = f"{self.base}/latest/api/token"
            ttl = {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)}
            answer = _request(url, method="PUT", headers=ttl, timeout=self.timeout)
            status, token = answer.status, answer.body.decode("ascii", "replace").strip()
            if status != 200 or not token or len(token) > 512 or not token.isprintable():
                raise ServiceUnavailable(f"{url} gave no session token (HTTP {status})")
            self._token, self._token_until = token, now + AWS_TOKEN_TTL_S - 60
        return self._token

    def poll(self) -> Notice | None:
        url = f"{self.base}/latest/meta-data/spot/instance-action"
        answer = _request(url, headers={"X-aws-ec2-metadata-token": self._session()}, timeout=self.timeout)
        status, body = answer.status, answer.body
        if status == 401:  # the token expired early (the instance was stopped and started): a new one next time
            self._token = None
            raise ServiceUnavailable(f"{url} refused the session token; a new one is asked for")
        if status == 404:
            return None
        if status != 200:
            raise ServiceUnavailable(f"{url} answered HTTP {status}")
        data = _json(body, url)
        action = data.get("action") if isinstance(data, dict) else None
        when = data.get("time") if isinstance(data, dict) else None
        if action not in ("terminate", "stop", "hibernate") or not isinstance(when, str):
            raise ServiceUnavailable(f"{url} answered {body[:120]!r}, not an action and a time")
        try:
            deadline = datetime.strptime(when, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise ServiceUnavailable(f"{url} gave the time {when[:40]!r}, not YYYY-MM-DDTHH:MM:SSZ") from None
        return Notice("aws", deadline, _lead(deadline, self.clock()), action)

    def acknowledge(self, notice: Notice) -> None:
        return None


class GcpPreempted:
    """GCP's ``instance/preempted``, long-polled: the first ask returns at once, later ones on a change."""

    name = "gcp"

    def __init__(self, base: str = LINK_LOCAL, *, wait_s: int = 30, timeout: float = 2.0) -> None:
        self.base = base.rstrip("/")
        self.wait_s = wait_s
        self.timeout = timeout
        self._etag: str | None = None

    def poll(self) -> Notice | None:
        """The value now; once an ETag is known, ask again only when it changes (or ``wait_s`` passed)."""
        url = f"{self.base}/computeMetadata/v1/instance/preempted"
        asked, wait = url, 0
        if self._etag:
            query = {"wait_for_change": "true", "last_etag": self._etag, "timeout_sec": str(self.wait_s)}
            asked, wait = f"{url}?{urllib.parse.urlencode(query)}", self.wait_s
        answer = _request(asked, headers={"Metadata-Flavor": "Google"}, timeout=self.timeout + wait)
        if answer.status != 200:
            self._etag = None
            raise ServiceUnavailable(f"{url} answered HTTP {answer.status}")
        value = answer.body.decode("ascii", "replace").strip().upper()
        if value not in ("TRUE", "FALSE"):
            self._etag = None
            raise ServiceUnavailable(f"{url} answered {answer.body[:40]!r}, not TRUE or FALSE")
        etag = answer.etag
        self._etag = etag if etag and len(etag) <= 128 and etag.isprintable() else None
        return Notice("gcp", None, None, "preempted") if value == "TRUE" else None

    def acknowledge(self, notice: Notice) -> None:
        return None


class AzureScheduledEvents:
    """Azure's Scheduled Events: a ``Preempt`` event and its ``NotBefore``; acknowledged once drained."""

    name = "azure"
    API = "api-version=2020-07-01"

    def __init__(self, base: str = LINK_LOCAL, *, timeout: float = 2.0, clock: Callable[[], float] = time.time) -> None:
        self.base = base.rstrip("/")
        self.timeout = timeout
        self.clock = clock
        self.url = f"{self.base}/metadata/scheduledevents?{self.API}"

    def poll(self) -> Notice | None:
        answer = _request(self.url, headers={"Metadata": "true"}, timeout=self.timeout)
        if answer.status != 200:
            raise ServiceUnavailable(f"{self.url} answered HTTP {answer.status}")
        data = _json(answer.body, self.url)
        events = data.get("Events") if isinstance(data, dict) else None
        if not isinstance(events, list):
            raise ServiceUnavailable(f"{self.url} answered without an Events list")
        for event in events:
            if isinstance(event, dict) and event.get("EventType") == "Preempt":
                event_id = event.get("EventId")
                if not isinstance(event_id, str) or not event_id or len(event_id) > 128:
                    raise ServiceUnavailable(f"{self.url} gave a Preempt event without an EventId")
                deadline = _rfc1123(event.get("NotBefore"))
                return Notice("azure", deadline, _lead(deadline, self.clock()), f"Preempt {event_id}")
        return None

    def acknowledge(self, notice: Notice) -> None:
        """``StartRequests`` for the notice's event: the drain is done, Azure need not wait for ``NotBefore``."""
        event_id = notice.detail.removeprefix("Preempt ")
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        headers = {"Metadata": "true", "Content-Type": "application/json"}
        answer = _request(self.url, method="POST", headers=headers, body=body, timeout=self.timeout)
        if answer.status != 200:
            raise ServiceUnavailable(f"{self.url} refused the acknowledgement (HTTP {answer.status})")


def _rfc1123(value: object) -> float | None:
    """``NotBefore`` as Unix time; empty (the event has started) or unreadable: no deadline."""
    if not isinstance(value, str) or not value.strip() or len(value) > 64:
        return None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    stamp = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    return stamp if math.isfinite(stamp) else None


SOURCES: dict[str, Callable[[str], NoticeSource]] = {
    "aws": AwsSpot,
    "gcp": GcpPreempted,
    "azure": AzureScheduledEvents,
}


def configured_sources(env: Mapping[str, str] | None = None) -> list[NoticeSource]:
    """The sources ``GPUFLEET_NOTICES`` names, at their ``GPUFLEET_NOTICE_URL_*`` (a ``UsageError`` if bad)."""
    env = os.environ if env is None else env
    raw = env.get(ENV_NOTICES, "").strip()
    names = [n.strip().lower() for n in raw.split(",") if n.strip()] if raw else []
    out: list[NoticeSource] = []
    for name in dict.fromkeys(names):
        if name not in SOURCES:
            raise UsageError(f"{ENV_NOTICES}={raw!r}: unknown source {name!r}; use a list of {', '.join(SOURCES)}")
        key = ENV_URL + name.upper()
        base = env.get(key, "").strip() or LINK_LOCAL
        parts = urllib.parse.urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise UsageError(f"{key}={base!r} is not an http:// base URL; give one like {LINK_LOCAL}")
        out.append(SOURCES[name](base))
    return out


# --- the watcher ------------------------------------------------------------------------------


class NoticeWatcher:
    """Polls sources in a thread each, calls ``on_notice`` once per notice; ``stop()`` ends it.

    A notice stays in force while its source keeps answering it; ``withdrawn`` is called when the
    source answers "none" again. A source that fails is logged once (until it answers again) and
    asked again after ``poll_s``.
    """

    def __init__(
        self,
        sources: Sequence[NoticeSource],
        on_notice: Callable[[Notice], None],
        *,
        poll_s: float = 5.0,
        withdrawn: Callable[[Notice], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.sources = list(sources)
        self.on_notice = on_notice
        self.withdrawn = withdrawn
        self.poll_s = poll_s
        self.log = log or (lambda line: print(f"gpufleet notices: {line}", file=sys.stderr, flush=True))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.current: dict[str, Notice] = {}
        """The notice each source has in force (read under no lock: a dict lookup is atomic)."""

    def start(self) -> NoticeWatcher:
        for source in self.sources:
            thread = threading.Thread(target=self._run, args=(source,), name=f"notices-{source.name}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def _run(self, source: NoticeSource) -> None:
        failing: str | None = None
        while not self._stop.is_set():
            try:
                notice = source.poll()
            except Exception as err:  # noqa: BLE001 - an answer of any shape must not end the watcher
                if str(err) != failing:
                    failing = str(err)
                    self.log(f"{source.name}: {failing}; polling again")
            else:
                failing = None
                self._update(source.name, notice)
            self._stop.wait(self.poll_s)

    def _update(self, name: str, notice: Notice | None) -> None:
        with self._lock:
            before = self.current.get(name)
            if notice is None:
                self.current.pop(name, None)
                if before is not None and self.withdrawn is not None:
                    self._call(self.withdrawn, before)
                return
            if before is not None and (before.deadline, before.detail) == (notice.deadline, notice.detail):
                return
            if self._call(self.on_notice, notice):  # one that failed (a busy store) is handled at the next poll
                self.current[name] = notice

    def _call(self, callback: Callable[[Notice], None], notice: Notice) -> bool:
        """Whether ``callback`` handled ``notice``; a failure is logged, never the end of the watcher."""
        try:
            callback(notice)
        except Exception as err:  # noqa: BLE001 - a failing callback is logged; the next notice still comes
            self.log(f"handling the {notice.source} notice failed: {err}")
            return False
        return True


# --- the local backend's drain ----------------------------------------------------------------


class NoticeDrain:
    """What a notice does to the attempts of one ``$GPUFLEET_HOME`` on this node.

    ``notice`` (the watcher's callback, on its thread) records ``preemption_notice`` for every
    running attempt and sends its process group SIGUSR1; ``draining()`` (the scheduler's question
    before it starts an attempt) holds new attempts back until the notice is withdrawn or its
    deadline has passed. Once the attempts it signalled have ended, the provider is told
    (Azure's ``StartRequests``). The drain opens its own store: a SQLite handle is one thread's.
    """

    def __init__(
        self,
        home: Path,
        sources: Iterable[NoticeSource] = (),
        *,
        clock: Callable[[], float] = time.time,
        send: Callable[[int | None, int], None] = signal_group,
    ) -> None:
        self.home = home
        self.sources = {s.name: s for s in sources}
        self.clock = clock
        self.send = send
        self._lock = threading.Lock()
        self._active: dict[str, Notice] = {}
        self._signalled: dict[str, list[tuple[int, int]]] = {}
        self.watcher: NoticeWatcher | None = None
        """The thread that feeds it (set by :func:`attach`)."""

    def notice(self, notice: Notice) -> None:
        store = Store(state_db(self.home))
        try:
            signalled = []
            for attempt in store.running_attempts():
                if attempt.pid is None:
                    continue
                data = notice.to_event()
                store.add_event(attempt.job_id, EventKind.PREEMPTION_NOTICE, attempt=attempt.n, **data)
                self.send(attempt.pid, signal.SIGUSR1)
                signalled.append((attempt.job_id, attempt.n))
        finally:
            store.close()
        with self._lock:
            self._active[notice.source] = notice
            self._signalled[notice.source] = signalled

    def withdraw(self, notice: Notice) -> None:
        with self._lock:
            self._active.pop(notice.source, None)

    def draining(self) -> bool:
        """Whether a notice in force forbids starting an attempt now; also acknowledges a finished drain."""
        now = self.clock()
        with self._lock:
            for name, notice in list(self._active.items()):
                if notice.deadline is not None and now >= notice.deadline:
                    del self._active[name]
            active = list(self._active.values())
        for notice in active:
            self._acknowledge_when_drained(notice)
        return bool(active)

    def _acknowledge_when_drained(self, notice: Notice) -> None:
        with self._lock:
            signalled = self._signalled.get(notice.source)
        if signalled is None:
            return
        store = Store(state_db(self.home))
        try:
            running = {(a.job_id, a.n) for a in store.running_attempts()}
        finally:
            store.close()
        if running.intersection(signalled):
            return
        with self._lock:
            self._signalled.pop(notice.source, None)
        source = self.sources.get(notice.source)
        if source is not None:
            try:
                source.acknowledge(notice)
            except ServiceUnavailable as err:
                print(f"gpufleet notices: {notice.source}: {err}", file=sys.stderr, flush=True)


def attach(home: Path, env: Mapping[str, str] | None = None, *, poll_s: float = 5.0) -> NoticeDrain | None:
    """Start watching the sources ``GPUFLEET_NOTICES`` names for the scheduler of ``home``.

    ``None`` when none is configured. The watcher thread is the drain's ``watcher``; the scheduler
    asks ``drain.draining()`` before it starts attempts and calls ``drain.watcher.stop()`` on exit.
    """
    sources = configured_sources(env)
    if not sources:
        return None
    drain = NoticeDrain(home, sources)
    drain.watcher = NoticeWatcher(sources, drain.notice, withdrawn=drain.withdraw, poll_s=poll_s).start()
    return drain


__all__ = [
    "ENV_NOTICES",
    "LINK_LOCAL",
    "SOURCES",
    "AwsSpot",
    "AzureScheduledEvents",
    "GcpPreempted",
    "Notice",
    "NoticeDrain",
    "NoticeSource",
    "NoticeWatcher",
    "attach",
    "configured_sources",
]
