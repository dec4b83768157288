"""``gpufleet serve`` against hostile clients: foreign Host names, unauthenticated bodies, many queries,
half-sent requests, symlinked logs, and bodies that would name the host's paths or a job's secrets.

The app runs under uvicorn on a loopback port (``served``); the slow-client test runs the real
``gpufleet serve`` in a subprocess under a low file-descriptor limit.
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, suppress
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest
from conftest import http, run_cli, served
from starlette.routing import Route

from gpufleet.backends.local import LocalBackend
from gpufleet.paths import attempt_log, checkpoints_dir
from gpufleet.serve.app import ServeConfig, ViewCache, create_app
from gpufleet.serve.guard import SECURITY_HEADERS, accepted_hosts, host_name
from gpufleet.serve.limits import RepeatFilter, connection_cap
from gpufleet.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
TOKEN = "h" * 40
SECRET = "s3cret-token-value-0123456789"
SAFETY_S = 60.0
"""Only a safety net for a loaded machine: every wait below is on a state."""


def raw(url: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, Any]:
    """One request with exactly ``headers`` (no Host unless given): the status and the JSON (or text) body."""
    conn = HTTPConnection(url.split("://", 1)[1], timeout=SAFETY_S)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if body is not None and "Content-Length" not in headers:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        reply = conn.getresponse()
        data = reply.read()
    finally:
        conn.close()
    try:
        return reply.status, json.loads(data)
    except ValueError:
        return reply.status, data.decode("utf-8", errors="replace")


def exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` as it is on a fresh connection; everything the server answers until it closes."""
    host, port = url.split("://", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=SAFETY_S) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def job_spec(**more: Any) -> Any:
    return parse_spec(
        {
            "name": "quiet",
            "team": "vision",
            "entrypoint": "gpufleet.workloads.toy:train",
            "resources": {"gpus": 0, "cpus": 1},
            **more,
        }
    )


@pytest.fixture
def started(local: tuple[LocalBackend, Any], home: Path) -> Iterator[Path]:
    """A home with job 1, never launched but given attempt 1, a log that names the home, a checkpoint folder
    and a secret in its env."""
    backend, _ = local
    job = backend.submit(job_spec(env={"API_TOKEN": SECRET, "MODE": "fast"}))
    backend.store.begin_attempt(job, 1, time.time())
    log = attempt_log(home, job, 1)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"writing to {home}/jobs/{job}/out\n")
    (checkpoints_dir(home, job) / "step-00000005").mkdir(parents=True)
    yield home


# ---- Host ---------------------------------------------------------------------------------------


def test_a_foreign_host_is_refused_on_pages_api_and_webhook(home: Path) -> None:
    cfg = ServeConfig(home=home, token=TOKEN, sync_remote=False, allowed_hosts=("fleet.example.com",))
    with served(create_app(cfg)) as url:
        port = url.rsplit(":", 1)[1]
        for method, path in (("GET", "/"), ("GET", "/api/jobs"), ("GET", "/static/app.js"), ("POST", "/hooks/alerts")):
            status, reply = raw(url, method, path, {"Host": f"rebound.example:{port}"}, b"{}")
            assert status == 400 and "--allowed-host rebound.example" in reply["detail"], (path, status, reply)
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.2", f"[::1]:{port}", "fleet.example.com:80"):
            assert raw(url, "GET", "/api/jobs", {"Host": host})[0] == 200, host
        assert raw(url, "GET", "/api/jobs", {"Host": "FLEET.Example.com."})[0] == 200
        assert raw(url, "GET", "/api/jobs", {"Host": "[::1"})[0] == 400
        assert raw(url, "GET", "/api/jobs", {"Host": "10.1.2.3"})[0] == 400  # not an address of this connection
        no_host = exchange(url, b"GET /api/jobs HTTP/1.0\r\n\r\n")
        assert no_host.startswith(b"HTTP/1.1 400 ") and b"Host header is required" in no_host


def test_a_wildcard_listen_address_accepts_this_machines_names_not_any() -> None:
    everywhere = accepted_hosts("0.0.0.0", ["fleet.example.com"])
    assert socket.gethostname().lower() in everywhere and "fleet.example.com" in everywhere
    assert "0.0.0.0" not in everywhere and "::" not in accepted_hosts("::", [])
    assert accepted_hosts("10.0.0.5", []) == {"10.0.0.5"}
    assert host_name("[0:0:0:0:0:0:0:1]:8642") == "::1" and host_name("Fleet.Example.COM.:80") == "fleet.example.com"
    assert host_name("a:b") is None and host_name("[::1]x") is None and host_name("") is None


def test_serve_refuses_a_bad_allowed_host_with_one_line(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "serve", "--no-token", "--port", "0", "--allowed-host", "a b/c")
    assert code == 2 and "--allowed-host 'a b/c' is not a host name" in err and len(err.strip().splitlines()) == 1


# ---- secrets and paths in bodies ----------------------------------------------------------------


def test_env_values_are_never_served_nor_shown_by_show_json(
    started: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with served(create_app(ServeConfig(home=started, token=TOKEN, sync_remote=False))) as url:
        status, job = http("GET", f"{url}/api/jobs/1")
        assert status == 200 and job["spec"]["env"] == {"API_TOKEN": "set", "MODE": "set"}
        for path in ("/api/jobs", "/api/fleet", "/api/jobs/1", "/api/jobs?team=vision"):
            assert SECRET not in json.dumps(http("GET", url + path)[1]), path
    code, out, _ = run_cli(capsys, monkeypatch, "show", "1", "--json")
    assert code == 0 and json.loads(out)["spec"]["env"] == {"API_TOKEN": "set", "MODE": "set"}


def test_no_body_names_the_homes_absolute_path(started: Path) -> None:
    app = create_app(ServeConfig(home=started, token=TOKEN, sync_remote=False))
    fills = {"job_id": ["1", "2", "0"], "name": ["app.js", "style.css", "nope"]}
    queries = ["", "?attempt=1", "?attempt=4", "?team=vision&period=7d", "?team=nobody", "?state=running"]
    with served(app) as url:
        seen = 0
        for route in app.routes:
            if not isinstance(route, Route) or "GET" not in (route.methods or ()):
                continue
            names = re.findall(r"{(\w+)}", route.path)
            for value in fills[names[0]] if names else [""]:
                path = route.path.replace(f"{{{names[0]}}}", value) if names else route.path
                for query in queries:
                    status, body = http("GET", url + path + query)
                    assert str(started) not in json.dumps(body), (path + query, status, body)
                    seen += 1
        bearer = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        status, body = http("POST", f"{url}/api/registry/churn/rollback", b'{"reason": "x"}', bearer)
        assert status == 404 and str(started) not in json.dumps(body)
        status, logs = http("GET", f"{url}/api/jobs/1/logs")
        assert logs["path"] == "$GPUFLEET_HOME/jobs/1/logs/attempt-1.log"
        assert logs["log"] == "writing to $GPUFLEET_HOME/jobs/1/out\n"
    assert seen > 50


@pytest.mark.parametrize("link", ["log", "logs folder"])
def test_a_symlinked_log_is_not_followed(started: Path, tmp_path: Path, link: str) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    log = attempt_log(started, 1, 1)
    if link == "log":
        log.unlink()
        log.symlink_to(secret)
    else:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / log.name).write_text(SECRET)
        for entry in log.parent.iterdir():
            entry.unlink()
        log.parent.rmdir()
        log.parent.symlink_to(elsewhere)
    with served(create_app(ServeConfig(home=started, token=TOKEN, sync_remote=False))) as url:
        status, reply = http("GET", f"{url}/api/jobs/1/logs?attempt=1")
    assert SECRET not in json.dumps(reply)
    assert status == 409 and "not a regular file in a real folder" in reply["detail"]


# ---- bodies and tokens --------------------------------------------------------------------------


def test_the_token_is_checked_before_the_body_is_read_and_bodies_are_capped(home: Path) -> None:
    with served(create_app(ServeConfig(home=home, token=TOKEN, sync_remote=False))) as url:
        host = url.split("://", 1)[1]
        promote = "/api/registry/churn/promote"
        json_type = {"Host": host, "Content-Type": "application/json"}
        assert raw(url, "POST", promote, json_type, b'{"version": ')[0] == 401  # malformed: never parsed
        head = f"POST {promote} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        unread = exchange(url, (head + "Content-Length: 1048576\r\nConnection: close\r\n\r\n").encode())
        assert unread.startswith(b"HTTP/1.1 401 ")  # answered with none of the megabyte sent
        bearer = f"Authorization: Bearer {TOKEN}\r\n"
        big = exchange(url, (head + bearer + "Content-Length: 1048576\r\nConnection: close\r\n\r\n").encode())
        assert big.startswith(b"HTTP/1.1 413 ")
        chunks = (head + bearer + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
        streamed = exchange(url, chunks + b"11170\r\n" + b" " * 0x11170 + b"\r\n0\r\n\r\n")
        assert streamed.startswith(b"HTTP/1.1 413 ")  # 70,000 bytes without a Content-Length: counted as read
        with_token = {**json_type, "Authorization": f"Bearer {TOKEN}"}
        assert (
            raw(url, "POST", promote, with_token, b'{"version": ')[0] == 422
        )  # with the token, the body is read and found malformed


def test_bad_input_is_422_not_409(home: Path) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with served(create_app(ServeConfig(home=home, token=TOKEN, sync_remote=False))) as url:
        body = b'{"version": "1", "reason": "x"}'
        assert http("POST", f"{url}/api/registry/%00/promote", body, bearer)[0] == 422
        non_finite = b'{"version": NaN, "reason": Infinity}'  # Python's json reads them; no reply may hold them
        status, reply = http("POST", f"{url}/api/registry/m/promote", non_finite, bearer)
        assert status == 422 and [e["loc"] for e in reply["detail"]] == [["body", "version"], ["body", "reason"]]
        for query in ("window=inf", "window=nan", "min_duration=-inf", "window=1e999"):
            assert http("GET", f"{url}/api/jobs/1/diagnosis?{query}")[0] == 422, query
        assert http("GET", f"{url}/api/jobs?state=sleeping")[0] == 422
        for query in (f"team={'t' * 129}", f"period={'p' * 129}"):
            assert http("GET", f"{url}/api/cost?{query}")[0] == 422, query
        assert http("GET", f"{url}/api/jobs?team={'t' * 129}")[0] == 422


def test_every_response_carries_the_security_headers_and_the_pages_run_no_inline_script(home: Path) -> None:
    with served(create_app(ServeConfig(home=home, token=TOKEN, sync_remote=False))) as url:
        for path in ("/", "/api/jobs", "/api/nothing", "/static/app.js", "/api/openapi.json"):
            with closing(HTTPConnection(url.split("://", 1)[1], timeout=SAFETY_S)) as conn:
                conn.request("GET", path)
                reply = conn.getresponse()
                reply.read()
                for name, value in SECURITY_HEADERS:
                    assert reply.getheader(name.decode()) == value.decode(), (path, name)
        status, docs = http("GET", f"{url}/api/docs")  # the API reference: this server's scripts only
        assert status == 200 and re.findall(r'<script src="([^"]*)"', docs) == re.findall(
            r'<script src="(/static/[a-z]+\.js)"', docs
        )
        status, page = http("GET", f"{url}/")
    assert status == 200 and "<script src=" in page
    assert not re.search(r"<script(?![^>]*\bsrc=)", page) and not re.search(r"\son[a-z]+=", page)
    for js in (REPO / "gpufleet" / "serve" / "static").glob("*.js"):
        script = js.read_text()
        assert not re.search(r"\son[a-z]+=\"", script) and "style=" not in script, js.name


# ---- memory -------------------------------------------------------------------------------------


def test_the_view_cache_keeps_at_most_its_bound() -> None:
    cache = ViewCache(ttl_s=3600, max_entries=16)
    for i in range(5000):
        assert cache.get(("jobs", f"team-{i}", None), lambda i=i: i) == i  # type: ignore[misc]
    assert len(cache) == 16
    assert cache.get(("jobs", "team-4999", None), lambda: -1) == 4999  # the recent ones are kept


def test_thousands_of_unknown_teams_leave_the_servers_cache_alone(started: Path) -> None:
    app = create_app(ServeConfig(home=started, token=TOKEN, sync_remote=False, cache_s=3600))
    with served(app) as url:
        for i in range(2000):
            status, body = http("GET", f"{url}/api/jobs?team=t{i}")
            assert (status, body["jobs"], body["total"]) == (200, [], 0)
        assert http("GET", f"{url}/api/cost?team=t{i}&period=24h")[0] == 200
        assert len(http("GET", f"{url}/api/jobs?team=vision")[1]["jobs"]) == 1
    assert len(app.state.view_cache) == 1  # the one known team's page (a team is looked up by an indexed count)


# ---- connections and logs -----------------------------------------------------------------------

FD_LIMIT = 128


def test_half_sent_requests_are_closed_and_the_server_keeps_answering(tmp_path: Path) -> None:
    port_file, err_file = tmp_path / "port", tmp_path / "stderr"
    argv = [sys.executable, "-m", "gpufleet.cli", "serve", "--port", "0", "--no-token", "--port-file", str(port_file)]
    with err_file.open("wb") as err:
        proc = subprocess.Popen(
            [*argv, "--request-timeout", "1"],
            cwd=REPO,
            env={**os.environ, "GPUFLEET_HOME": str(tmp_path / "home")},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT)),
        )
    try:
        deadline = time.monotonic() + SAFETY_S
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, err_file.read_text()
            time.sleep(0.05)
        port = int(port_file.read_text())
        half = [half_sent(port) for _ in range(FD_LIMIT + 72)]  # more than the server may open
        replies = [closed_by_server(sock) for sock in half]
        assert all(reply is not None for reply in replies)
        answered_ones = [r for r in replies if r]  # the 408s and 503s: written raw, with the same headers as the rest
        assert answered_ones and all(b"x-content-type-options: nosniff" in r.lower() for r in answered_ones)
        status, jobs = answered(f"http://127.0.0.1:{port}/api/jobs")
        assert (status, jobs["jobs"], jobs["total"]) == (200, [], 0)
    finally:
        proc.terminate()
        proc.wait(timeout=SAFETY_S)
    lines = err_file.read_text(errors="replace").splitlines()
    assert len(lines) < 100, lines[:20]


def half_sent(port: int) -> socket.socket:
    """A connection that sends part of a request's head and then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=SAFETY_S)
    with suppress(OSError):  # already refused and closed by a full server
        sock.sendall(b"GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    return sock


def closed_by_server(sock: socket.socket) -> bytes | None:
    """What the server answered before it closed ``sock`` (a 408 or a 503; empty for a silent close or a
    reset), or None when it did not close it within the safety net."""
    got = b""
    with sock:
        end = time.monotonic() + SAFETY_S
        while time.monotonic() < end:
            ready, _, _ = select.select([sock], [], [], end - time.monotonic())
            try:
                chunk = sock.recv(65536) if ready else None
            except OSError:
                return got
            if chunk == b"":
                return got
            got += chunk or b""
        return None


def answered(url: str) -> tuple[int, Any]:
    """The first answer that is not a refusal for being busy (503), or a connection cut, within the safety net."""
    end = time.monotonic() + SAFETY_S
    while True:
        try:
            status, body = http("GET", url, timeout=SAFETY_S)
            if status != 503 or time.monotonic() > end:
                return status, body
        except OSError:
            assert time.monotonic() < end, "the server never answered"
        time.sleep(0.1)


def test_a_repeated_log_message_is_shown_once_per_period_with_a_count() -> None:
    now = [0.0]
    repeat = RepeatFilter(every_s=60, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    shown = [
        r
        for r in (record("socket.accept() out of system resource\nsocket: 6") for _ in range(1000))
        if repeat.filter(r)
    ]
    assert len(shown) == 1 and repeat.filter(record("another message"))
    now[0] = 61.0
    later = record("socket.accept() out of system resource\nsocket: 7")
    assert repeat.filter(later) and "(999 more like this" in later.getMessage()


def test_connections_stay_well_below_the_descriptor_limit() -> None:
    assert connection_cap(512, 128) == 32 and connection_cap(512, 1 << 20) == 512 and connection_cap(512, 50) == 4
