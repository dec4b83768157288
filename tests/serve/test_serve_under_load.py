"""What keeps ``gpufleet serve`` fast under many readers: encoded views, their refresh ahead of expiry, kept stores.

The figures themselves are ``bench/serve_load.py``'s; these tests pin the behaviour those figures rest on:
a cached body is the one FastAPI would have sent, a view is rebuilt before it expires and never served
older than the cache allows, and a thread's kept store follows ``state.db`` when it is replaced.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

from conftest import http, served
from pydantic import BaseModel

from gpufleet.jobs.store import Store
from gpufleet.serve.app import ServeConfig, create_app
from gpufleet.serve.body import JsonEncoder
from gpufleet.serve.cache import REFRESH_SHARE, ViewCache
from gpufleet.serve.stores import forget_thread_stores, thread_store
from gpufleet.spec import parse_spec


class _Row(BaseModel):
    id: int
    note: str | None = None
    score: float = 0.0


class _Page(BaseModel):
    rows: list[_Row]
    total: int


def test_an_encoded_view_is_the_body_fastapi_would_send() -> None:
    from fastapi import FastAPI
    from starlette.testclient import TestClient

    value: dict[str, Any] = {"rows": [{"id": 1}, {"id": 2, "note": 'é\n"x"', "score": float("inf")}], "total": 2}
    app = FastAPI()

    @app.get("/unset", response_model=_Page, response_model_exclude_unset=True)
    def unset() -> dict[str, Any]:
        return value

    @app.get("/plain")
    def plain() -> dict[str, Any]:
        return value

    with TestClient(app) as client:
        assert client.get("/unset").content == JsonEncoder(lambda: _Page, exclude_unset=True)(value)
        assert client.get("/plain").content == JsonEncoder(lambda: dict[str, Any])(value)
    assert json.loads(JsonEncoder(lambda: _Page)(value))["rows"][0] == {"id": 1, "note": None, "score": 0.0}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_view_is_rebuilt_ahead_of_its_expiry_and_never_served_older() -> None:
    clock = _Clock()
    cache = ViewCache(ttl_s=10.0, clock=clock)
    builds: list[float] = []
    rebuilt = threading.Event()

    def build() -> float:
        builds.append(clock.now)
        if len(builds) > 1:
            rebuilt.set()
        return clock.now

    assert cache.fresh(("v",), build) is None  # nothing yet: the caller builds it
    assert cache.get(("v",), build) == 100.0
    clock.now += 10.0 * (1 - REFRESH_SHARE) - 0.5  # fresh, and not yet near its expiry
    assert cache.fresh(("v",), build) == 100.0 and builds == [100.0]
    clock.now += 1.0  # within the last REFRESH_SHARE of its life: served, and rebuilt meanwhile
    assert cache.fresh(("v",), build) == 100.0
    assert rebuilt.wait(30)
    cache.close()
    assert builds == [100.0, clock.now] and cache.fresh(("v",)) == clock.now
    clock.now += 10.0  # expired: never served, whatever is cached
    assert cache.fresh(("v",), build) is None
    assert cache.get(("v",), build) == clock.now and len(builds) == 3


def test_a_failed_rebuild_ahead_leaves_the_view_to_the_next_request() -> None:
    clock = _Clock()
    cache = ViewCache(ttl_s=10.0, clock=clock)
    assert cache.get(("v",), lambda: "old") == "old"
    clock.now += 9.5

    def broken() -> str:
        raise RuntimeError("store is gone")

    assert cache.fresh(("v",), broken) == "old"
    cache.close()  # the rebuild has run, and failed
    assert cache.fresh(("v",)) == "old"  # still fresh: served until it expires
    clock.now += 1.0
    assert cache.fresh(("v",)) is None


def _job_spec(name: str) -> Any:
    return parse_spec(
        {"name": name, "team": "vision", "entrypoint": "gpufleet.workloads.toy:train", "resources": {"gpus": 0}}
    )


def test_a_threads_store_is_kept_and_follows_a_replaced_database(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    assert thread_store(db) is None and not db.exists()  # a read creates no store
    db.touch()
    assert thread_store(db) is None  # an empty file is no store
    Store(db).close()
    first = thread_store(db)
    assert first is not None and thread_store(db) is first
    first.add_job(_job_spec("one"), "local")
    other = tmp_path / "other.db"
    writer = Store(other)
    writer.add_job(_job_spec("two"), "local")
    writer.add_job(_job_spec("three"), "local")
    writer.close()
    for stale in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):  # the home made anew: another file, a new connection
        stale.unlink(missing_ok=True)
    shutil.move(other, db)
    second = thread_store(db)
    assert second is not None and second is not first
    assert [j.name for j in second.jobs()] == ["two", "three"]
    db.unlink()
    assert thread_store(db) is None
    forget_thread_stores()


def test_the_api_answers_from_a_kept_store_what_was_written_since(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    store = Store(home / "state.db")
    store.add_job(_job_spec("first"), "local")
    with served(create_app(ServeConfig(home=home, token=None, sync_remote=False, cache_s=0))) as url:
        assert [j["name"] for j in http("GET", f"{url}/api/jobs")[1]["jobs"]] == ["first"]
        second = store.add_job(_job_spec("second"), "local")
        for _ in range(8):  # whichever thread of the pool answers, with the store it keeps
            assert [j["name"] for j in http("GET", f"{url}/api/jobs")[1]["jobs"]] == ["first", "second"]
            assert http("GET", f"{url}/api/jobs/{second}")[1]["name"] == "second"
    store.close()
