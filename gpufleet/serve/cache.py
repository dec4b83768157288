"""The server's cache of heavy views: bounded in time, in entries and in locks."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("gpufleet.serve")

REFRESH_SHARE = 0.1
"""A view is rebuilt ahead of its expiry once it is this share of ``ttl_s`` from it. Not sooner for a view slow
to build: it would be rebuilt more often, and a build that outlasts the margin is waited for, as without it."""
REFRESH_THREADS = 2
"""Threads that rebuild views ahead of expiry: builds contend for the GIL, more would not finish sooner."""


class _Slot:
    """One cached view: the lock its builders take turns on, its value, when it was built, whether it is rebuilt."""

    __slots__ = ("built", "lock", "refreshing", "users", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.built = float("-inf")
        self.value: Any = None
        self.users = 0
        self.refreshing = False


class ViewCache:
    """The heavy views (every job's summary) computed at most once per ``ttl_s`` per query, and once at a time.

    Twenty pages polling every 2 s would otherwise rebuild the same objects twenty times over; a
    request that arrives while the same view is being built waits for that build instead of starting
    its own. Objects are at most ``ttl_s`` old; 0 turns the cache off. At most ``max_entries`` views
    (each with its lock) are kept, the least recently used dropped first, so that queries nobody
    repeats cannot grow the server; a view being built is never dropped (then briefly more are kept).
    Callers cache only queries over known values (see ``api_jobs``).

    :meth:`fresh` answers from the event loop itself: a view built less than ``ttl_s`` ago is served
    without a thread of the pool, and without waiting on a lock that a build may hold. Given the view's
    ``build``, it also rebuilds the view shortly *before* it expires (:data:`REFRESH_SHARE`), on a thread
    of its own, while the current one is still served: under steady polling no request waits for a
    build, and none is served a view older than ``ttl_s`` (a build that is not done by the expiry is
    waited for, as without it). The view is then built a little more often than once per ``ttl_s``.
    """

    def __init__(self, ttl_s: float, max_entries: int = 128, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._slots: OrderedDict[tuple[Any, ...], _Slot] = OrderedDict()
        self._refresher: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, key: tuple[Any, ...], build: Callable[[], T]) -> T:
        """The view of ``key``: the cached one while it is fresh, else built now (or waited for while built)."""
        if self.ttl_s <= 0:
            return build()
        slot = self._take(key)
        try:
            with slot.lock:
                if self.clock() - slot.built >= self.ttl_s:
                    self._build(slot, build)
                value: T = slot.value
                return value
        finally:
            with self._lock:
                slot.users -= 1

    def fresh(self, key: tuple[Any, ...], build: Callable[[], Any] | None = None) -> Any | None:
        """The view of ``key`` if one was built less than ``ttl_s`` ago, else ``None``; never waits for a build.

        With ``build``, a view close to its expiry is rebuilt in the background meanwhile (see the class)."""
        if self.ttl_s <= 0:
            return None
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                return None
            age = self.clock() - slot.built
            if age >= self.ttl_s:
                return None
            self._slots.move_to_end(key)
            value = slot.value  # this one: a rebuild started below may replace it at once
            if build is not None and age >= self.ttl_s * (1 - REFRESH_SHARE) and not slot.refreshing:
                slot.refreshing = True
                slot.users += 1  # not dropped while it is rebuilt
                self._refresh_pool().submit(self._refresh, slot, build, slot.built)
            return value

    def _refresh(self, slot: _Slot, build: Callable[[], Any], seen: float) -> None:
        try:
            with slot.lock:
                if slot.built == seen:  # not rebuilt meanwhile by a request that found it expired
                    self._build(slot, build)
        except Exception as err:  # noqa: BLE001 - the request that finds the view expired builds it again, and answers
            log.debug("rebuilding a view ahead of its expiry failed: %s", err)
        finally:
            with self._lock:
                slot.refreshing = False
                slot.users -= 1

    def _build(self, slot: _Slot, build: Callable[[], Any]) -> None:
        value = build()
        slot.value = value  # before ``built``: a reader that sees the new time sees the new value
        slot.built = self.clock()

    def _refresh_pool(self) -> ThreadPoolExecutor:
        if self._refresher is None:
            self._refresher = ThreadPoolExecutor(REFRESH_THREADS, thread_name_prefix="view-refresh")
        return self._refresher

    def close(self) -> None:
        """Stop the background rebuilds (those under way finish first)."""
        if self._refresher is not None:
            self._refresher.shutdown(wait=True)
            self._refresher = None

    def _take(self, key: tuple[Any, ...]) -> _Slot:
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot()
            self._slots.move_to_end(key)
            slot.users += 1
            idle = [k for k, s in self._slots.items() if s.users == 0]
            for old in idle[: max(0, len(self._slots) - self.max_entries)]:
                del self._slots[old]
            return slot


__all__ = ["REFRESH_SHARE", "REFRESH_THREADS", "ViewCache"]
