"""The server's cache of heavy views: bounded in time, in entries and in locks."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Slot:
    """One cached view: the lock its builders take turns on, its value and when it was built."""

    __slots__ = ("built", "lock", "users", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.built = float("-inf")
        self.value: Any = None
        self.users = 0


class ViewCache:
    """The heavy views (every job's summary) computed at most once per ``ttl_s`` per query, and once at a time.

    Twenty pages polling every 2 s would otherwise rebuild the same objects twenty times over; a
    request that arrives while the same view is being built waits for that build instead of starting
    its own. Objects are at most ``ttl_s`` old; 0 turns the cache off. At most ``max_entries`` views
    (each with its lock) are kept, the least recently used dropped first, so that queries nobody
    repeats cannot grow the server; a view being built is never dropped (then briefly more are kept).
    Callers cache only queries over known values (see ``api_jobs``).
    """

    def __init__(self, ttl_s: float, max_entries: int = 128) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._slots: OrderedDict[tuple[Any, ...], _Slot] = OrderedDict()

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, key: tuple[Any, ...], build: Callable[[], T]) -> T:
        if self.ttl_s <= 0:
            return build()
        slot = self._take(key)
        try:
            with slot.lock:
                if time.monotonic() - slot.built >= self.ttl_s:
                    slot.value = build()
                    slot.built = time.monotonic()
                value: T = slot.value
                return value
        finally:
            with self._lock:
                slot.users -= 1

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


__all__ = ["ViewCache"]
