"""The alert webhook under hostile and unlucky clients, over real sockets on loopback.

Each test starts a real ``WebhookServer`` on 127.0.0.1 (a free port from the kernel) and talks to it
with ``socket`` or ``http.client``. Tests wait on states (a connection closed, ``in_flight``);
timeouts are safety nets only.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import UsageError
from gpufleet.quality.webhook import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    AlertPayload,
    AlertReceiver,
    Reply,
    WebhookServer,
    ascii_int,
    signature,
    signed_headers,
)

SECRET = b"hostile-tests-secret-0123456789abcdef"
ALERT: dict[str, Any] = {
    "schema_version": 1,
    "model": "tabular-demo",
    "action": "retrain",
    "window": "window-7",
    "dataset": "current",
    "reasons": ["dataset drift in 2 consecutive windows"],
    "evidence": {"share_drifted": 0.6},
}
BODY = json.dumps(ALERT).encode()
SAFETY_S = 20.0
"""Only a safety net: every wait below ends on a state long before this."""


class Recorder:
    """A handler that records its calls and can be told to refuse or fail."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: Exception | None = None
        self.lock = threading.Lock()

    def __call__(self, alert: AlertPayload, key: str) -> Mapping[str, Any]:
        with self.lock:
            if self.fail is not None:
                raise self.fail
            self.calls.append(key)
            return {"job_id": len(self.calls)}


@contextmanager
def serving(handler: Recorder, journal: Path | None = None, **options: Any) -> Iterator[WebhookServer]:
    with WebhookServer(AlertReceiver(SECRET, handler, journal=journal), "127.0.0.1", 0, **options) as server:
        yield server


def port_of(server: WebhookServer) -> int:
    return int(server.url.rsplit(":", 1)[1].split("/", 1)[0])


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + SAFETY_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def post(
    server: WebhookServer, body: bytes, headers: Mapping[str, str], *, timeout: float = SAFETY_S
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One POST over ``http.client``: status, reply headers, JSON reply."""
    conn = http.client.HTTPConnection("127.0.0.1", port_of(server), timeout=timeout)
    try:
        conn.request("POST", "/alerts", body=body, headers=dict(headers))
        response = conn.getresponse()
        raw = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(raw or b"{}")
    finally:
        conn.close()


def read_to_eof(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset also counts as closed)."""
    sock.settimeout(SAFETY_S)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError("the server kept the connection open") from None
    return b"".join(chunks)


def exchange(server: WebhookServer, raw: bytes) -> tuple[int, dict[str, Any]]:
    """Send raw request bytes on a fresh socket; the status and JSON of the whole reply."""
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=SAFETY_S) as sock:
        sock.sendall(raw)
        reply = read_to_eof(sock)
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), f"no HTTP reply: {reply!r}"
    return int(head.split()[1]), json.loads(payload)


def raw_post(port: int, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> bytes:
    lines = [b"POST /alerts HTTP/1.1", b"Host: 127.0.0.1:%d" % port, *(name + b": " + value for name, value in headers)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


# ---- 1. a refused or failed delivery does not consume its idempotency key ---------------------


def test_a_refused_alert_can_be_retried_after_a_restart(tmp_path: Path) -> None:
    journal = tmp_path / "webhook-keys.jsonl"
    handler = Recorder()
    headers = signed_headers(SECRET, BODY, idempotency_key="drift-retry-0001")
    with serving(handler, journal) as server:
        handler.fail = UsageError("unknown dataset 'current'")
        assert post(server, BODY, headers)[0] == 422
        handler.fail = RuntimeError("the scheduler is down")
        assert post(server, BODY, headers)[0] == 500
    assert not journal.exists() or journal.read_text() == "", "a refused delivery was journaled"
    handler.fail = None
    with serving(handler, journal) as restarted:  # the same request, retried after a restart
        status, _, reply = post(restarted, BODY, headers)
        assert status == 202, reply
        assert post(restarted, BODY, headers)[0] == 409
    with serving(handler, journal) as again:  # the accepted key is spent, across restarts too
        status, _, reply = post(again, BODY, headers)
        assert status == 409 and "already accepted" in reply["reason"]
    assert handler.calls == ["drift-retry-0001"]
    assert len(journal.read_text().splitlines()) == 1


def test_200_identical_concurrent_deliveries_are_handled_once_and_journaled_once(tmp_path: Path) -> None:
    journal = tmp_path / "webhook-keys.jsonl"
    handler = Recorder()
    headers = signed_headers(SECRET, BODY, idempotency_key="drift-race-0200")
    with serving(handler, journal, max_handlers=256) as server:
        statuses = fire_concurrently(200, lambda _: post(server, BODY, headers)[0])
    assert sorted(statuses) == [202] + [409] * 199
    assert handler.calls == ["drift-race-0200"]
    assert len(journal.read_text().splitlines()) == 1


def fire_concurrently(n: int, request: Callable[[int], int]) -> list[int]:
    """Run ``request(i)`` on n threads released together; every status, or the first error."""
    gate = threading.Barrier(n)
    statuses: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            gate.wait(timeout=SAFETY_S)
            status = request(i)
        except BaseException as err:  # noqa: BLE001 - reported below, with the others
            with lock:
                errors.append(err)
            return
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=SAFETY_S * 3)
    assert not errors, f"{len(errors)} of {n} requests failed, e.g. {errors[0]!r}"
    assert len(statuses) == n
    return statuses


# ---- 2. numeric headers are ASCII digits; no handler thread dies with a traceback -------------


def test_ascii_int_refuses_what_int_would_take() -> None:
    assert ascii_int("1800000000", 12) == 1800000000
    assert int("\u0663") == 3 and "\u00b3".isdigit()  # why isdigit()/int() are not enough
    for bad in ["\u0663", "\u00b3", "\u0661\u0668\u0660\u0660", "+3", "-1", " 3", "3_0", "", "1" * 13, None]:
        assert ascii_int(bad, 12) is None, bad


@pytest.mark.parametrize(
    "length",
    [b"\xb3", b"\xb9\xb2", "\u0663".encode(), b"+3", b"-1", b"0x10", b"3_0", b"9" * 19],
    ids=["superscript-3", "superscript-12", "arabic-indic-3", "plus", "negative", "hex", "underscore", "19-digits"],
)
def test_a_non_ascii_digit_content_length_is_400_without_a_traceback(
    length: bytes, capfd: pytest.CaptureFixture[str]
) -> None:
    handler = Recorder()
    with serving(handler) as server:
        port = port_of(server)
        status, reply = exchange(server, raw_post(port, [(b"Content-Length", length)]))
        assert status == 400 and "Content-Length" in reply["reason"] and "\n" not in reply["reason"]
        # two Content-Length headers that disagree: a smuggling attempt, refused the same way
        twice = [(b"Content-Length", b"2"), (b"Content-Length", b"3")]
        assert exchange(server, raw_post(port, twice))[0] == 400
        # the receiver is alive and well afterwards
        assert post(server, BODY, signed_headers(SECRET, BODY))[0] == 202
    assert "Traceback" not in capfd.readouterr().err
    assert len(handler.calls) == 1


ARABIC_INDIC_TS = "".join(chr(0x0660 + int(d)) for d in "1800000000")


@pytest.mark.parametrize("timestamp", ["\u00b9800000000", ARABIC_INDIC_TS], ids=["superscript", "arabic-indic"])
def test_a_signed_non_ascii_timestamp_is_400_without_a_traceback(
    timestamp: str, capfd: pytest.CaptureFixture[str]
) -> None:
    handler = Recorder()
    receiver = AlertReceiver(SECRET, handler)
    # in process: Arabic-Indic digits would pass isdigit() and int(), and the HMAC is genuine
    direct = {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature(SECRET, timestamp, BODY)}
    reply = receiver.handle({**direct, IDEMPOTENCY_HEADER: "drift-digits-01"}, BODY)
    assert reply.status == 400 and TIMESTAMP_HEADER in reply.body["reason"]
    with serving(handler) as server:
        port = port_of(server)
        on_wire = timestamp.encode("latin-1", errors="replace")  # what HTTP/1.1 headers can carry
        seen = on_wire.decode("latin-1")  # what the server reads back
        headers = [
            (b"Content-Length", str(len(BODY)).encode()),
            (TIMESTAMP_HEADER.encode(), on_wire),
            (SIGNATURE_HEADER.encode(), signature(SECRET, seen, BODY).encode()),
            (IDEMPOTENCY_HEADER.encode(), b"drift-digits-02"),
        ]
        status, body = exchange(server, raw_post(port, headers, BODY))
        assert status == 400 and TIMESTAMP_HEADER in body["reason"] and "\n" not in body["reason"]
        assert post(server, BODY, signed_headers(SECRET, BODY))[0] == 202
    assert "Traceback" not in capfd.readouterr().err
    assert len(handler.calls) == 1


def test_a_bug_at_the_http_layer_answers_500_once_and_logs_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    handler = Recorder()
    with serving(handler) as server:

        def broken(headers: Mapping[str, str], body: bytes) -> Reply:
            raise ValueError("invalid literal for int()\nwith a second line")

        monkeypatch.setattr(server.receiver, "handle", broken)
        with caplog.at_level(logging.ERROR, logger="gpufleet.quality.webhook"):
            status, _, reply = post(server, BODY, signed_headers(SECRET, BODY))
            wait_until(lambda: server.in_flight == 0, "the request thread finished")
        assert status == 500 and reply["reason"] == "internal error: ValueError"
        monkeypatch.undo()
        assert post(server, BODY, signed_headers(SECRET, BODY))[0] == 202  # still serving
    lines = [r.getMessage() for r in caplog.records if r.name == "gpufleet.quality.webhook"]
    assert len(lines) == 1 and "\n" not in lines[0] and "ValueError" in lines[0]
    assert "Traceback" not in capfd.readouterr().err


# ---- 3. stalled clients are cut off and cannot hold every thread -------------------------------


def test_stalled_uploads_are_closed_after_the_read_timeout_and_others_get_through() -> None:
    handler = Recorder()
    read_timeout = 0.5
    with serving(handler, read_timeout=read_timeout, max_handlers=8) as server:
        port = port_of(server)
        full = raw_post(port, [(b"Content-Length", str(len(BODY)).encode())], BODY)
        stalls = {
            "silent": b"",  # connects and sends nothing
            "mid-headers": full[: full.index(b"\r\n") + 10],  # stops inside the headers
            "mid-body": full[: len(full) - len(BODY) // 2],  # stops halfway through the body
        }
        stalled: list[tuple[str, socket.socket, float]] = []
        try:
            for kind, data in [*stalls.items(), *stalls.items()]:
                sock = socket.create_connection(("127.0.0.1", port), timeout=SAFETY_S)
                sock.sendall(data)
                stalled.append((kind, sock, time.monotonic()))
            wait_until(lambda: server.in_flight == 6, "the six stalled connections are being served")
            status, _, reply = post(server, BODY, signed_headers(SECRET, BODY))
            assert status == 202, reply  # a normal signed post gets through meanwhile
            for kind, sock, sent in stalled:
                reply_bytes = read_to_eof(sock)  # the server closes it: EOF, not our safety net
                assert time.monotonic() - sent >= read_timeout * 0.9
                if kind == "mid-body":
                    assert reply_bytes.startswith(b"HTTP/1.1 408 "), reply_bytes
                else:
                    assert reply_bytes == b""
        finally:
            for _, sock, _ in stalled:
                sock.close()
        wait_until(lambda: server.in_flight == 0, "every handler thread is released")
    assert len(handler.calls) == 1


def test_when_every_handler_is_busy_the_next_connection_gets_503_with_retry_after() -> None:
    handler = Recorder()
    with serving(handler, read_timeout=3.0, max_handlers=2) as server:
        port = port_of(server)
        stalled = [socket.create_connection(("127.0.0.1", port), timeout=SAFETY_S) for _ in range(2)]
        try:
            wait_until(lambda: server.in_flight == 2, "both handler slots are held")
            status, headers, reply = post(server, BODY, signed_headers(SECRET, BODY))
            assert status == 503 and headers.get("retry-after") == "1" and "busy" in reply["reason"]
            assert server.in_flight == 2  # the refusal took no thread
            with socket.create_connection(("127.0.0.1", port), timeout=SAFETY_S) as extra:  # says nothing
                assert read_to_eof(extra).startswith(b"HTTP/1.1 503 ")
            for sock in stalled:
                assert read_to_eof(sock) == b""  # cut off after the read timeout
        finally:
            for sock in stalled:
                sock.close()
        wait_until(lambda: server.in_flight == 0, "the slots are free again")
        assert post(server, BODY, signed_headers(SECRET, BODY))[0] == 202
    assert len(handler.calls) == 1


def test_a_dripping_client_is_cut_off_by_the_request_timeout() -> None:
    handler = Recorder()
    request_timeout = 1.0
    with serving(handler, read_timeout=5.0, request_timeout=request_timeout) as server:
        port = port_of(server)
        data = raw_post(port, [(b"Content-Length", str(len(BODY)).encode())], BODY)
        with socket.create_connection(("127.0.0.1", port), timeout=SAFETY_S) as sock:
            started = time.monotonic()
            closed = False
            for i in range(len(data)):  # one byte per 50 ms: each read is quick, the whole is not
                try:
                    sock.sendall(data[i : i + 1])
                    sock.settimeout(0.05)
                    closed = sock.recv(1024) == b""
                except TimeoutError:
                    pass
                except (ConnectionResetError, BrokenPipeError):
                    closed = True
                if closed or time.monotonic() - started > SAFETY_S:
                    break
            assert closed, "the server let the drip go on"
            assert time.monotonic() - started >= request_timeout * 0.9
        wait_until(lambda: server.in_flight == 0, "the dripping connection's thread is released")
        assert post(server, BODY, signed_headers(SECRET, BODY))[0] == 202
    assert len(handler.calls) == 1


# ---- 4. a burst of senders queues instead of being reset ---------------------------------------


def test_200_concurrent_posts_are_all_answered_none_reset() -> None:
    handler = Recorder()
    with serving(handler, max_handlers=256) as server:
        assert server.backlog >= 128
        bodies = [json.dumps({**ALERT, "window": f"window-{i}"}).encode() for i in range(200)]

        def one(i: int) -> int:
            headers = signed_headers(SECRET, bodies[i], idempotency_key=f"burst-key-{i:04d}")
            return post(server, bodies[i], headers)[0]

        statuses = fire_concurrently(200, one)
    assert statuses == [202] * 200
    assert len(handler.calls) == 200


def test_a_burst_beyond_max_handlers_is_answered_503_not_reset() -> None:
    handler = Recorder()
    headers = signed_headers(SECRET, BODY, idempotency_key="drift-burst-0001")
    with serving(handler, max_handlers=4) as server:
        statuses = fire_concurrently(200, lambda _: post(server, BODY, headers)[0])
    assert statuses.count(202) == 1 and set(statuses) <= {202, 409, 503}
    assert handler.calls == ["drift-burst-0001"]
