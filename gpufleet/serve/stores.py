"""The store each of the server's threads reads: one connection per thread, kept while ``state.db`` stays the same file.

Opening the store costs more than most of what a request then reads from it: the connection, its
pragmas, the schema check (:class:`gpufleet.jobs.store.Store`), and SQLite parsing the schema again at
the first statement of every new connection. ``GET /api/jobs/{id}`` spent about half its time there
(2.6 ms fresh, 1.2 ms on a kept connection, at 200 jobs). SQLite connections belong to the thread that
opened them, so each thread of the pool keeps its own, and a thread that ends (the pool lets idle ones
go) takes its connection with it. At most one per thread: the descriptors held are those that as many
requests in flight held already.

Reads stay fresh: the connection is in autocommit mode, so every statement sees the last commit, and
no transaction spans two requests. A ``state.db`` that is removed, emptied or replaced by another file
(another inode) is noticed at the next request (one ``stat``): the kept connection is closed, and a new
one opened on the file now there, if any.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from gpufleet.jobs.store import Store

_KEPT = threading.local()
"""Per thread: ``{database path: ((device, inode), Store)}``."""


def thread_store(path: Path) -> Store | None:
    """This thread's store on the database at ``path``; ``None`` where there is none (no file, or an empty one,
    which :func:`gpufleet.paths.has_store` counts as no store: a read never creates one). Never closed by
    the caller."""
    kept: dict[str, tuple[tuple[int, int], Store]] | None = getattr(_KEPT, "stores", None)
    if kept is None:
        kept = _KEPT.stores = {}
    try:
        st = os.stat(path)
    except OSError:
        st = None
    held = kept.get(str(path))
    file_key = None if st is None or st.st_size == 0 else (st.st_dev, st.st_ino)
    if held is not None:
        if held[0] == file_key:
            return held[1]
        del kept[str(path)]
        held[1].close()
    if file_key is None:
        return None
    store = Store(path)
    kept[str(path)] = (file_key, store)
    return store


def forget_thread_stores() -> None:
    """Close this thread's kept stores (a thread that is about to end, or a test)."""
    kept: dict[str, tuple[tuple[int, int], Store]] = getattr(_KEPT, "stores", None) or {}
    while kept:
        _, (_, store) = kept.popitem()
        store.close()


__all__ = ["forget_thread_stores", "thread_store"]
