"""The alert webhook: only signed, fresh, well-formed, unique alerts reach the handler, once each."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
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
    WebhookServer,
    load_secret,
    post_alert,
    send,
    signature,
    signed_headers,
    write_secret,
)

SECRET = b"s3cret-for-tests-only-0123456789"
NOW = 1_800_000_000.0
ALERT: dict[str, Any] = {
    "schema_version": 1,
    "model": "tabular-demo",
    "action": "retrain",
    "window": "window-2",
    "dataset": "current",
    "reasons": ["dataset drift in 2 consecutive windows"],
    "evidence": {"share_drifted": 0.6, "drifted_columns": ["x0", "x1"]},
}


class Recorder:
    """A handler that records its calls (and can be told to fail)."""

    def __init__(self) -> None:
        self.calls: list[tuple[AlertPayload, str]] = []
        self.fail: Exception | None = None
        self.lock = threading.Lock()

    def __call__(self, alert: AlertPayload, key: str) -> Mapping[str, Any]:
        with self.lock:
            if self.fail is not None:
                raise self.fail
            self.calls.append((alert, key))
            return {"job_id": len(self.calls)}


@pytest.fixture
def handler() -> Recorder:
    return Recorder()


@pytest.fixture
def receiver(handler: Recorder) -> AlertReceiver:
    return AlertReceiver(SECRET, handler, clock=lambda: NOW)


def body_of(data: Mapping[str, Any] = ALERT) -> bytes:
    return json.dumps(data).encode()


def headers_for(body: bytes, key: str = "alert-0001", ts: float = NOW, secret: bytes = SECRET) -> dict[str, str]:
    return signed_headers(secret, body, idempotency_key=key, timestamp=int(ts))


def test_a_valid_alert_is_accepted_and_handled_once(receiver: AlertReceiver, handler: Recorder) -> None:
    body = body_of()
    reply = receiver.handle(headers_for(body), body)
    assert reply.status == 202 and reply.body["result"] == {"job_id": 1}
    (alert, key), *_ = handler.calls
    assert alert.model == "tabular-demo" and alert.action == "retrain" and key == "alert-0001"
    assert len(handler.calls) == 1


def test_header_names_are_case_insensitive(receiver: AlertReceiver, handler: Recorder) -> None:
    body = body_of()
    lowered = {k.lower(): v for k, v in headers_for(body).items()}
    assert receiver.handle(lowered, body).status == 202


@pytest.mark.parametrize("missing", [TIMESTAMP_HEADER, SIGNATURE_HEADER])
def test_unsigned_is_rejected(receiver: AlertReceiver, handler: Recorder, missing: str) -> None:
    body = body_of()
    headers = {k: v for k, v in headers_for(body).items() if k != missing}
    reply = receiver.handle(headers, body)
    assert reply.status == 401 and "unsigned" in reply.body["reason"]
    assert handler.calls == []


def test_forged_signature_tampered_body_and_malformed_header_are_rejected(
    receiver: AlertReceiver, handler: Recorder
) -> None:
    body = body_of()
    forged = headers_for(body, secret=b"another-secret-of-enough-length")
    assert receiver.handle(forged, body).status == 401
    tampered = body_of({**ALERT, "action": "alert"})
    assert receiver.handle(headers_for(body), tampered).status == 401
    malformed = {**headers_for(body), SIGNATURE_HEADER: "md5=abc"}
    assert receiver.handle(malformed, body).status == 401
    assert handler.calls == []


@pytest.mark.parametrize("offset", [-301.0, 301.0])
def test_stale_or_future_timestamps_are_rejected(receiver: AlertReceiver, handler: Recorder, offset: float) -> None:
    body = body_of()
    reply = receiver.handle(headers_for(body, ts=NOW + offset), body)
    assert reply.status == 401 and "stale" in reply.body["reason"]
    assert receiver.handle(headers_for(body, ts=NOW - 299), body).status == 202
    assert len(handler.calls) == 1


def test_replayed_key_and_replayed_signature_are_rejected(receiver: AlertReceiver, handler: Recorder) -> None:
    body = body_of()
    headers = headers_for(body)
    assert receiver.handle(headers, body).status == 202
    replay = receiver.handle(headers, body)
    assert replay.status == 409 and "already accepted" in replay.body["reason"]
    # the same signed request under a fresh key: still a replay
    assert receiver.handle({**headers, IDEMPOTENCY_HEADER: "another-key-01"}, body).status == 409
    # a retry of the same alert with the same key and a new signature: not acted on twice
    assert receiver.handle(headers_for(body, ts=NOW - 5), body).status == 409
    assert len(handler.calls) == 1


def test_keys_expire_with_the_replay_window(handler: Recorder) -> None:
    clock = [NOW]
    receiver = AlertReceiver(SECRET, handler, clock=lambda: clock[0])
    body = body_of()
    assert receiver.handle(headers_for(body), body).status == 202
    clock[0] = NOW + 400  # the old request is stale now, and its key forgotten
    assert receiver.handle(headers_for(body), body).status == 401
    assert receiver.handle(headers_for(body, ts=clock[0]), body).status == 202
    assert len(handler.calls) == 2


def test_oversized_body_is_rejected_before_anything_else(handler: Recorder) -> None:
    receiver = AlertReceiver(SECRET, handler, clock=lambda: NOW, max_body=1024)
    body = body_of({**ALERT, "reasons": ["x" * 400] * 3})
    assert len(body) > 1024
    reply = receiver.handle(headers_for(body), body)
    assert reply.status == 413
    assert handler.calls == []


@pytest.mark.parametrize(
    "change",
    [
        {"action": "delete-everything"},
        {"dataset": "../../etc/passwd"},
        {"model": "bad name; rm -rf"},
        {"unexpected": 1},
        {"schema_version": 2},
        {"reasons": ["x" * 501]},
    ],
)
def test_schema_violations_are_400_and_never_handled(
    receiver: AlertReceiver, handler: Recorder, change: dict[str, Any]
) -> None:
    body = body_of({**ALERT, **change})
    reply = receiver.handle(headers_for(body), body)
    assert reply.status == 400 and reply.body["reason"].startswith("invalid alert")
    assert handler.calls == []


def test_signed_non_json_and_missing_key_are_400(receiver: AlertReceiver, handler: Recorder) -> None:
    junk = b"\xff not json"
    assert receiver.handle(headers_for(junk), junk).status == 400
    body = body_of()
    no_key = {k: v for k, v in headers_for(body).items() if k != IDEMPOTENCY_HEADER}
    assert receiver.handle(no_key, body).status == 400
    assert handler.calls == []


def test_a_failing_handler_releases_the_key_for_a_retry(receiver: AlertReceiver, handler: Recorder) -> None:
    body = body_of()
    handler.fail = UsageError("unknown dataset")
    assert receiver.handle(headers_for(body), body).status == 422
    handler.fail = RuntimeError("boom")
    assert receiver.handle(headers_for(body, ts=NOW - 1), body).status == 500
    handler.fail = None
    assert receiver.handle(headers_for(body, ts=NOW - 2), body).status == 202
    assert len(handler.calls) == 1


def test_the_journal_keeps_keys_across_restarts(tmp_path: Path, handler: Recorder) -> None:
    journal = tmp_path / "keys.jsonl"
    body = body_of()
    first = AlertReceiver(SECRET, handler, clock=lambda: NOW, journal=journal)
    assert first.handle(headers_for(body), body).status == 202
    restarted = AlertReceiver(SECRET, handler, clock=lambda: NOW, journal=journal)
    assert restarted.handle(headers_for(body, ts=NOW - 3), body).status == 409
    assert len(handler.calls) == 1


def test_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    import hashlib
    import hmac

    expected = hmac.new(SECRET, b"1800000000.{}", hashlib.sha256).hexdigest()
    assert signature(SECRET, 1800000000, b"{}") == f"sha256={expected}"


def test_secret_from_env_or_file_never_short(tmp_path: Path) -> None:
    assert load_secret(env={"GPUFLEET_WEBHOOK_SECRET": SECRET.decode()}) == SECRET
    path = tmp_path / "secret"
    written = write_secret(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_secret(env={"GPUFLEET_WEBHOOK_SECRET_FILE": str(path)}) == written
    assert load_secret(path, env={}) == written
    with pytest.raises(UsageError, match="no webhook secret"):
        load_secret(env={})
    with pytest.raises(UsageError, match="16 or more"):
        load_secret(env={"GPUFLEET_WEBHOOK_SECRET": "short"})
    with pytest.raises(UsageError, match="cannot read"):
        load_secret(tmp_path / "absent", env={})


# ---- over real HTTP on loopback ---------------------------------------------------------------


@pytest.fixture
def server(handler: Recorder) -> Iterator[WebhookServer]:
    with WebhookServer(AlertReceiver(SECRET, handler, max_body=4096)) as srv:
        yield srv


def test_http_round_trip_and_replay(server: WebhookServer, handler: Recorder) -> None:
    status, reply, headers = post_alert(server.url, ALERT, SECRET, idempotency_key="http-key-001")
    assert status == 202 and reply["result"] == {"job_id": 1}
    body = json.dumps(ALERT, sort_keys=True).encode()
    again, reply = send(server.url, body, headers)
    assert again == 409
    assert [entry["status"] for entry in server.receiver.log] == [202, 409]
    assert len(handler.calls) == 1


def test_concurrent_duplicates_are_handled_once(server: WebhookServer, handler: Recorder) -> None:
    body = json.dumps(ALERT).encode()
    headers = signed_headers(SECRET, body, idempotency_key="race-key-001")
    statuses: list[int] = []

    def fire() -> None:
        statuses.append(send(server.url, body, headers)[0])

    threads = [threading.Thread(target=fire) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [202] + [409] * 7
    assert len(handler.calls) == 1


def test_http_unsigned_oversized_and_wrong_route(server: WebhookServer, handler: Recorder) -> None:
    body = json.dumps(ALERT).encode()
    assert send(server.url, body, {"Content-Type": "application/json"})[0] == 401
    big = json.dumps({**ALERT, "reasons": ["x" * 499] * 10}).encode()
    assert send(server.url, big, signed_headers(SECRET, big))[0] == 413
    other = server.url.replace("/alerts", "/other")
    assert send(other, body, signed_headers(SECRET, body))[0] == 404
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server.url, timeout=10)
    assert err.value.code == 405
    err.value.close()
    assert handler.calls == []


def test_binds_loopback_unless_told_otherwise(handler: Recorder) -> None:
    with pytest.raises(UsageError, match="loopback"):
        WebhookServer(AlertReceiver(SECRET, handler), host="0.0.0.0")
