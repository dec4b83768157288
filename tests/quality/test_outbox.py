"""The webhook outbox: written before it is sent, retried across restarts, each retrain started once.

The unit tests drive :class:`Outbox` with a clock the test moves and a receiver called in-process
(:class:`AlertReceiver`, no sockets). The kill test runs a real receiver process (the standalone
``WebhookServer``, whose handler is ``retrain_once`` over the local backend, which queues each job in
its store) and a real sender process (``gpufleet quality webhook send --forever``), SIGKILLs either at
seeded random moments while 200 events are delivered, and checks from the receiver's store that each
retrain was submitted exactly once.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_refused, run_cli

from gpufleet.errors import UsageError
from gpufleet.jobs.store import Store
from gpufleet.paths import state_db
from gpufleet.quality import standing
from gpufleet.quality.outbox import Outbox, RetryPolicy, classify, decision_key, outbox_dir
from gpufleet.quality.standing import RETRAIN_KEY_ENV, model_dir, retrain_once
from gpufleet.quality.webhook import (
    IDEMPOTENCY_HEADER,
    KEY_TTL_S,
    TIMESTAMP_HEADER,
    AlertPayload,
    AlertReceiver,
    WebhookServer,
    load_secret,
    write_secret,
)

SPEC = "name: retrain\nentrypoint: gpufleet.workloads.toy:train\nargs: {steps: 3}\nresources: {gpus: 0}\n"
NOW = 1_800_000_000.0
URL = "http://127.0.0.1:9/alerts"
NO_JITTER = RetryPolicy(jitter=0.0)


def recorder(calls: list[Any], *, with_action: bool = False) -> Callable[[Any, str], dict[str, Any]]:
    """A receiver's handler that records each key it acts on (with the alert's action) and accepts it."""

    def handle(alert: Any, key: str) -> dict[str, Any]:
        calls.append((alert.action, key) if with_action else key)
        return {}

    return handle


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """A submission queues the job in the store; no scheduler process is started to run it."""
    monkeypatch.setattr("gpufleet.backends.local.process.ensure_scheduler", lambda home: None)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    write_secret(path)
    return path


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Killed(BaseException):
    """What a SIGKILL looks like from inside: nothing after it runs."""


class Transport:
    """A receiver in-process: each POST goes to ``receiver`` (a real :class:`AlertReceiver`) or ``script``."""

    def __init__(self, receiver: AlertReceiver | None = None, script: Mapping[str, list[Any]] | None = None) -> None:
        self.receiver = receiver
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.calls: list[dict[str, str]] = []
        self.replies: list[tuple[int, dict[str, Any]]] = []
        self.before: Callable[[], None] | None = None

    def __call__(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> tuple[int, dict[str, Any]]:
        self.calls.append(dict(headers))
        if self.before is not None:
            self.before()
        key = headers[IDEMPOTENCY_HEADER]
        if self.script.get(key):
            answer = self.script[key].pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return answer if isinstance(answer, tuple) else (answer, {"reason": f"scripted {answer}"})
        assert self.receiver is not None
        reply = self.receiver.handle(headers, body)
        self.replies.append((reply.status, reply.body))
        return reply.status, reply.body

    def keys(self) -> list[str]:
        return [c[IDEMPOTENCY_HEADER] for c in self.calls]


def alert(i: int = 0, action: str = "retrain") -> dict[str, Any]:
    return {"model": "churn", "action": action, "window": f"w{i}.csv", "reasons": ["drift"]}


def outbox(tmp_path: Path, transport: Transport, clock: Clock, policy: RetryPolicy = NO_JITTER) -> Outbox:
    return Outbox(tmp_path / "outbox", policy=policy, clock=clock, post=transport, rng=random.Random(0))


def records(box: Outbox) -> list[dict[str, Any]]:
    return [json.loads(line) for line in box.path.read_text().splitlines()]


# ---- the schedule and the answers ---------------------------------------------------------------


def test_the_backoff_doubles_to_its_cap_and_the_jitter_takes_at_most_half() -> None:
    policy = RetryPolicy()
    assert [NO_JITTER.delay(n) for n in range(1, 13)] == [2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600, 600]
    horizon = sum(NO_JITTER.delay(n) for n in range(1, policy.max_attempts))
    assert horizon == 13_022 and horizon < KEY_TTL_S  # the receiver still knows the key at the last retry
    rng = random.Random(7)
    for n in range(1, 40):
        full = NO_JITTER.delay(n)
        assert full / 2 <= policy.delay(n, rng.random()) <= full
    assert NO_JITTER.delay(10_000) == 600  # no float overflow far down the schedule
    for bad in ({"base_s": 0}, {"base_s": 5, "cap_s": 1}, {"max_attempts": 0}, {"jitter": 1.0}, {"cap_s": 1e999}):
        with pytest.raises(UsageError):
            RetryPolicy(**bad)


@pytest.mark.parametrize(
    ("status", "reply", "outcome"),
    [
        (202, {}, "delivered"),
        (200, {}, "delivered"),
        (409, {"replayed": "accepted"}, "delivered"),
        (409, {"replayed": "in_progress"}, "retry"),
        (409, {}, "delivered"),
        (408, {}, "retry"),
        (429, {}, "retry"),
        (500, {}, "retry"),
        (503, {}, "retry"),
        (None, {}, "retry"),
        (400, {}, "failed"),
        (401, {}, "failed"),
        (404, {}, "failed"),
        (413, {}, "failed"),
        (422, {}, "failed"),
        (301, {}, "failed"),
    ],
)
def test_each_answer_means_delivered_retry_or_failed(status: int | None, reply: dict[str, Any], outcome: str) -> None:
    assert classify(status, reply) == outcome


# ---- write ahead, retry, restart ----------------------------------------------------------------


def test_an_event_is_on_disk_before_its_first_attempt_and_sent_once(tmp_path: Path, secret_file: Path) -> None:
    clock, transport = Clock(), Transport(script={"churn:w0.csv": [202]})
    box = outbox(tmp_path, transport, clock)
    seen: list[list[str]] = []
    transport.before = lambda: seen.append([r["t"] for r in records(Outbox(box.folder))])
    assert box.enqueue(alert(), url=URL, key="churn:w0.csv", secret_file=secret_file)
    assert not box.enqueue(alert(), url=URL, key="churn:w0.csv", secret_file=secret_file)  # one event per key
    report = box.deliver_due()
    assert seen == [["event", "send"]]  # queued and its attempt recorded, both synced, before the POST
    assert report.delivered == ["churn:w0.csv"] and report.sent == 1
    assert box.deliver_due().sent == 0 and len(transport.calls) == 1
    [event] = box.events()
    assert (event.state, event.next_at, [a.status for a in event.history]) == ("delivered", None, [202])
    assert oct(box.path.stat().st_mode & 0o777) == "0o600"


def test_a_restarted_sender_keeps_the_schedule_and_signs_each_attempt_afresh(tmp_path: Path, secret_file: Path) -> None:
    clock = Clock()
    receiver = AlertReceiver(load_secret(secret_file), lambda a, k: {"ok": True}, clock=clock)
    transport = Transport(receiver, script={"churn:w0.csv": [503, 503]})
    outbox(tmp_path, transport, clock).enqueue(alert(), url=URL, key="churn:w0.csv", secret_file=secret_file)
    assert outbox(tmp_path, transport, clock).deliver_due().retrying == ["churn:w0.csv"]
    clock.now += 1.9
    assert outbox(tmp_path, transport, clock).deliver_due().sent == 0  # a new sender: due 2 s after the first
    clock.now += 0.1
    assert outbox(tmp_path, transport, clock).deliver_due().retrying == ["churn:w0.csv"]
    clock.now += 3.9
    assert outbox(tmp_path, transport, clock).deliver_due().sent == 0  # then 4 s
    clock.now += 400  # far past the receiver's 300 s window: only a fresh signature is accepted
    assert outbox(tmp_path, transport, clock).deliver_due().delivered == ["churn:w0.csv"]
    [event] = Outbox(tmp_path / "outbox").events()
    assert [a.status for a in event.history] == [503, 503, 202] and event.state == "delivered"
    assert {c[IDEMPOTENCY_HEADER] for c in transport.calls} == {"churn:w0.csv"}
    assert [int(c[TIMESTAMP_HEADER]) for c in transport.calls] == [int(NOW), int(NOW + 2), int(NOW + 405.9)]


def test_an_attempt_cut_short_counts_and_is_retried_at_its_recorded_time(tmp_path: Path, secret_file: Path) -> None:
    clock = Clock()
    transport = Transport(script={"churn:w0.csv": [Killed(), 202]})
    box = outbox(tmp_path, transport, clock, RetryPolicy(jitter=0.0, max_attempts=2))
    box.enqueue(alert(), url=URL, key="churn:w0.csv", secret_file=secret_file)
    with pytest.raises(Killed):
        box.deliver_due()
    [event] = outbox(tmp_path, transport, clock).events()
    assert event.state == "pending" and event.next_at == NOW + 2 and event.history[-1].outcome is None
    assert outbox(tmp_path, transport, clock).deliver_due().sent == 0
    clock.now += 2
    assert outbox(tmp_path, transport, clock).deliver_due().delivered == ["churn:w0.csv"]
    assert [a.n for a in Outbox(box.folder).events()[0].history] == [1, 2]

    transport.script["churn:w1.csv"] = [503, Killed()]  # the last attempt allowed is cut short: failed
    box.enqueue(alert(1), url=URL, key="churn:w1.csv", secret_file=secret_file)
    box.deliver_due()
    clock.now += 2
    with pytest.raises(Killed):
        box.deliver_due()
    clock.now += 10
    report = outbox(tmp_path, transport, clock, box.policy).deliver_due()
    assert report.failed == ["churn:w1.csv"] and report.sent == 0


def test_a_torn_last_line_is_skipped_and_closed_before_the_next_append(tmp_path: Path, secret_file: Path) -> None:
    clock = Clock()
    box = outbox(tmp_path, Transport(script={f"churn:w{i}.csv": [202] for i in range(3)}), clock)
    for i in range(2):
        box.enqueue(alert(i), url=URL, key=f"churn:w{i}.csv", secret_file=secret_file)
    with box.path.open("ab") as fh:
        fh.write(b'{"t": "result", "key": "churn:w0.csv", "outc')  # a writer killed mid-line
    assert [e.state for e in box.events()] == ["pending", "pending"]
    box.enqueue(alert(2), url=URL, key="churn:w2.csv", secret_file=secret_file)
    lines = box.path.read_bytes().splitlines()
    assert lines[2].endswith(b'"outc') and json.loads(lines[3])["key"] == "churn:w2.csv"
    assert box.deliver_due().delivered == ["churn:w0.csv", "churn:w1.csv", "churn:w2.csv"]
    with box.path.open("ab") as fh:
        fh.write(b"\xff\xfe not json\n[1, 2]\n{}\n")
    assert [e.state for e in box.events()] == ["delivered"] * 3


def test_final_failures_retries_and_giving_up(tmp_path: Path, secret_file: Path) -> None:
    clock = Clock()
    script: dict[str, list[Any]] = {
        "k-400-final": [(400, {"reason": "invalid alert"})],
        "k-409-accepted": [(409, {"replayed": "accepted"})],
        "k-409-in-progress": [(409, {"replayed": "in_progress"}), 202],
        "k-429-then-ok": [429, 202],
        "k-network-down": [ConnectionRefusedError(111, "refused"), 202],
        "k-always-503": [503, 503, 503],
        "k-odd-reply": [(502, ["not", "an", "object"]), 202],
    }
    box = outbox(tmp_path, Transport(script=script), clock, RetryPolicy(jitter=0.0, max_attempts=3))
    for i, key in enumerate(script):
        box.enqueue(alert(i), url=URL, key=key, secret_file=secret_file)
    first = box.deliver_due()
    assert first.failed == ["k-400-final"] and first.delivered == ["k-409-accepted"]
    for _ in range(3):
        clock.now += 10
        box.deliver_due()
    state = {e.key: (e.state, len(e.history)) for e in box.events()}
    assert state == {
        "k-400-final": ("failed", 1),
        "k-409-accepted": ("delivered", 1),
        "k-409-in-progress": ("delivered", 2),
        "k-429-then-ok": ("delivered", 2),
        "k-network-down": ("delivered", 2),
        "k-always-503": ("failed", 3),
        "k-odd-reply": ("delivered", 2),
    }
    gave_up = next(e for e in box.events() if e.key == "k-always-503")
    assert gave_up.last is not None and "gave up after 3 attempts" in (gave_up.last.error or "")
    assert "ConnectionRefusedError" in (
        next(e for e in box.events() if e.key == "k-network-down").history[0].error or ""
    )


def test_what_cannot_be_sent_is_refused_when_queued(tmp_path: Path, secret_file: Path) -> None:
    box = outbox(tmp_path, Transport(), Clock())
    with pytest.raises(UsageError, match="webhook URL"):
        box.enqueue(alert(), url="file:///etc/passwd", key="churn:w0.csv")
    with pytest.raises(UsageError, match="idempotency key"):
        box.enqueue(alert(), url=URL, key="short")
    with pytest.raises(ValueError, match="model"):
        box.enqueue({**alert(), "model": "../etc"}, url=URL, key="churn:w0.csv")
    assert not box.path.exists()
    assert decision_key("churn", "w3.csv") == "churn:w3.csv"
    odd = decision_key("churn", "a window with spaces")
    assert odd.startswith("decision-") and odd == decision_key("churn", "a window with spaces")


def test_a_missing_secret_is_retried_once_it_is_there(tmp_path: Path) -> None:
    clock, secret = Clock(), tmp_path / "later-secret"
    receiver = AlertReceiver(b"s" * 32, lambda a, k: {}, clock=clock)
    box = outbox(tmp_path, Transport(receiver), clock)
    box.enqueue(alert(), url=URL, key="churn:w0.csv", secret_file=secret)
    assert box.deliver_due().retrying == ["churn:w0.csv"]
    assert "no secret" in (box.events()[0].history[0].error or "")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"s" * 32)
    os.close(fd)
    clock.now += 2
    assert box.deliver_due().delivered == ["churn:w0.csv"]


def test_replay_sends_again_under_the_same_key_and_the_receiver_acts_once(tmp_path: Path, secret_file: Path) -> None:
    clock, calls = Clock(), list[str]()
    receiver = AlertReceiver(load_secret(secret_file), recorder(calls), clock=clock)
    transport = Transport(receiver, script={"churn:w1.csv": [(422, {"reason": "no retraining configured"})]})
    box = outbox(tmp_path, transport, clock)
    for i in range(2):
        box.enqueue(alert(i), url=URL, key=f"churn:w{i}.csv", secret_file=secret_file)
    report = box.deliver_due()
    assert report.delivered == ["churn:w0.csv"] and report.failed == ["churn:w1.csv"]
    replayed = box.replay("churn:w0.csv")
    assert (replayed.state, replayed.tries, replayed.next_at) == ("pending", 0, NOW)
    assert box.replay_failed() == ["churn:w1.csv"]
    assert box.deliver_due().delivered == ["churn:w0.csv", "churn:w1.csv"]  # a 409 and a 202
    assert calls == ["churn:w0.csv", "churn:w1.csv"]
    assert transport.keys() == ["churn:w0.csv", "churn:w1.csv", "churn:w0.csv", "churn:w1.csv"]
    with pytest.raises(UsageError, match="no event with key"):
        box.replay("churn:nope")


def test_two_senders_never_have_one_event_in_flight_twice(tmp_path: Path, secret_file: Path) -> None:
    clock, gate, inside = Clock(), threading.Event(), threading.Event()
    transport = Transport(script={f"churn:w{i}.csv": [202] for i in range(20)})

    def hold_the_first() -> None:
        inside.set()
        gate.wait()

    transport.before = hold_the_first
    box = outbox(tmp_path, transport, clock)
    for i in range(20):
        box.enqueue(alert(i), url=URL, key=f"churn:w{i}.csv", secret_file=secret_file)
    first = threading.Thread(target=outbox(tmp_path, transport, clock).deliver_due)
    first.start()
    inside.wait()
    second = outbox(tmp_path, transport, clock).deliver_due()
    gate.set()
    first.join()
    assert second.busy and second.sent == 0
    waited = outbox(tmp_path, transport, clock).deliver_due(block=True)
    assert waited.sent == 0 and not waited.busy
    assert sorted(transport.keys()) == sorted(f"churn:w{i}.csv" for i in range(20))  # each POSTed once


# ---- the receiver's half: keys kept, each retrain submitted once ---------------------------------


def test_a_key_is_refused_for_a_day_across_restarts_not_only_for_the_replay_window(
    tmp_path: Path, secret_file: Path
) -> None:
    clock, calls, journal = Clock(), list[str](), tmp_path / "webhook-keys.jsonl"
    secret = load_secret(secret_file)

    def receiver() -> AlertReceiver:
        return AlertReceiver(secret, recorder(calls), clock=clock, journal=journal, key_ttl_s=KEY_TTL_S)

    box = outbox(tmp_path, Transport(receiver()), clock)
    box.enqueue(alert(), url=URL, key="churn:w0.csv", secret_file=secret_file)
    box.deliver_due()
    clock.now += 3 * 3600  # a retry hours later, signed afresh, at a restarted receiver
    box = outbox(tmp_path, Transport(receiver()), clock)
    box.replay("churn:w0.csv")
    assert box.deliver_due().delivered == ["churn:w0.csv"]
    last = box.events()[0].last
    assert calls == ["churn:w0.csv"] and last is not None and last.status == 409
    clock.now += KEY_TTL_S  # a day on, the key is forgotten
    box = outbox(tmp_path, Transport(receiver()), clock)
    box.replay("churn:w0.csv")
    box.deliver_due()
    assert calls == ["churn:w0.csv", "churn:w0.csv"]


def test_a_torn_line_in_the_receivers_journal_costs_no_other_key(tmp_path: Path, secret_file: Path) -> None:
    clock, journal, secret = Clock(), tmp_path / "webhook-keys.jsonl", load_secret(secret_file)
    journal.write_bytes(b'{"key": "churn:w0.csv", "signature": "sha256=ab')  # killed mid-line

    def receiver() -> AlertReceiver:
        return AlertReceiver(secret, lambda a, k: {}, clock=clock, journal=journal, key_ttl_s=KEY_TTL_S)

    box = outbox(tmp_path, Transport(receiver()), clock)
    box.enqueue(alert(1), url=URL, key="churn:w1.csv", secret_file=secret_file)
    assert box.deliver_due().delivered == ["churn:w1.csv"]
    assert [line["key"] for line in json_lines(journal)] == ["churn:w1.csv"]
    restarted = Transport(receiver())
    box = outbox(tmp_path, restarted, clock)
    box.replay("churn:w1.csv")
    box.deliver_due()
    assert restarted.replies[0][0] == 409 and restarted.replies[0][1]["replayed"] == "accepted"


def test_accepted_then_crashed_before_replying_submits_no_second_job(
    tmp_path: Path, home: Path, secret_file: Path
) -> None:
    """The handler submitted, the receiver died before journaling the key: the retry gets the same job."""
    spec = tmp_path / "retrain.yaml"
    spec.write_text(SPEC)

    def handler(a: AlertPayload, key: str) -> dict[str, Any]:
        job, submitted = retrain_once(home, a.model, key, spec)
        return {"job_id": job, "submitted": submitted}

    clock, secret = Clock(), load_secret(secret_file)
    crashed = Transport(AlertReceiver(secret, handler, clock=clock))  # no journal: as if it died before writing it
    box = outbox(tmp_path, crashed, clock)
    box.enqueue(alert(), url=URL, key="churn:w0.csv", secret_file=secret_file)
    box.deliver_due()
    clock.now += 60
    restarted = Transport(AlertReceiver(secret, handler, clock=clock, journal=tmp_path / "keys.jsonl"))
    box = outbox(tmp_path, restarted, clock)
    box.replay("churn:w0.csv")
    assert box.deliver_due().delivered == ["churn:w0.csv"]
    [(status, reply)] = restarted.replies
    assert status == 202 and reply["result"]["submitted"] is False
    assert reply["result"]["job_id"] == crashed.replies[0][1]["result"]["job_id"]
    assert jobs_by_key(home) == {"churn:w0.csv": 1}


def test_a_retrain_killed_between_its_submission_and_its_journal_is_found_not_submitted_again(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "retrain.yaml"
    spec.write_text(SPEC)
    real_append = standing._append

    def die_at_the_journal(path: Path, record: dict[str, Any]) -> None:
        if path.name == "retrains.jsonl":
            raise Killed
        real_append(path, record)

    monkeypatch.setattr(standing, "_append", die_at_the_journal)
    with pytest.raises(Killed):
        retrain_once(home, "churn", "churn:w9.csv", spec)
    monkeypatch.setattr(standing, "_append", real_append)
    assert jobs_by_key(home) == {"churn:w9.csv": 1}
    job, submitted = retrain_once(home, "churn", "churn:w9.csv", spec)
    assert not submitted and jobs_by_key(home) == {"churn:w9.csv": 1}
    [line] = [json.loads(x) for x in (model_dir(home, "churn") / "retrains.jsonl").read_text().splitlines()]
    assert line["job_id"] == job and line["recovered"] is True
    assert retrain_once(home, "churn", "churn:w10.csv", spec)[1] is True  # other keys submit as before


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a journal; a line torn by a kill is left out, as its readers leave it out."""
    found = []
    for line in path.read_bytes().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return [x for x in found if isinstance(x, dict)]


def jobs_by_key(home: Path) -> dict[str, int]:
    """How many jobs the store holds per retrain key: what was really submitted."""
    if not state_db(home).exists():
        return {}
    store = Store(state_db(home))
    try:
        return dict(collections.Counter(j.env.get(RETRAIN_KEY_ENV, "") for j in store.jobs()))
    finally:
        store.close()


# ---- the standing monitor and the command line --------------------------------------------------


def table(path: Path, *, shift: float, seed: int) -> None:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"f0": rng.normal(shift, 1.0, 800), "f1": rng.normal(0.0, 1.0 + shift, 800)})
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)


@pytest.fixture
def receiving(tmp_path: Path) -> Iterator[tuple[WebhookServer, list[tuple[str, str]]]]:
    """A real webhook server on loopback whose handler records (action, key)."""
    calls: list[tuple[str, str]] = []
    write_secret(tmp_path / "hook.secret")
    secret = load_secret(tmp_path / "hook.secret")
    receiver = AlertReceiver(secret, recorder(calls, with_action=True), key_ttl_s=KEY_TTL_S)
    with WebhookServer(receiver) as server:
        yield server, calls


def monitor_file(tmp_path: Path, webhook: dict[str, Any]) -> Path:
    table(tmp_path / "data" / "reference.csv", shift=0.0, seed=1)
    for i, shift in enumerate((0.0, 1.0, 1.0), start=1):
        table(tmp_path / "data" / "windows" / f"w{i}.csv", shift=shift, seed=20 + i)
    (tmp_path / "retrain.yaml").write_text(SPEC)
    model = {
        "name": "churn",
        "reference": "data/reference.csv",
        "current": "data/windows/",
        "policy": {"persistence": 2, "alert_share": 0.2, "cooldown_s": 86400},
        "retrain": "retrain.yaml",
    }
    path = tmp_path / "monitor.yaml"
    path.write_text(json.dumps({"models": [model], "webhook": webhook}))
    return path


def test_the_monitor_sends_its_alert_and_retrain_through_the_outbox(
    tmp_path: Path,
    home: Path,
    receiving: tuple[WebhookServer, list[tuple[str, str]]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, calls = receiving
    config = monitor_file(tmp_path, {"url": server.url, "secret_file": "hook.secret"})
    code, out, err = run_cli(capsys, monkeypatch, "quality", "monitor", "run", str(config), "--once", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert [c["action"] for c in result["rounds"][0]["checks"]] == ["pass", "alert", "retrain"]
    assert result["webhook"]["delivered"] == ["churn:w2.csv", "churn:w3.csv"]
    assert calls == [("alert", "churn:w2.csv"), ("retrain", "churn:w3.csv")]
    code, out, _ = run_cli(capsys, monkeypatch, "quality", "webhook", "log", "--json")
    log = json.loads(out)
    assert code == 0 and log["counts"] == {"pending": 0, "delivered": 2, "failed": 0}
    assert [(e["key"], e["action"], e["state"], e["attempts"], e["last_status"]) for e in log["events"]] == [
        ("churn:w2.csv", "alert", "delivered", 1, 202),
        ("churn:w3.csv", "retrain", "delivered", 1, 202),
    ]
    assert log["events"][1]["model"] == "churn" and log["events"][1]["next_at"] is None
    code, out, _ = run_cli(capsys, monkeypatch, "quality", "webhook", "log", "--limit", "1")
    assert code == 0 and "churn:w3.csv" in out and "churn:w2.csv" not in out and "2 delivered" in out
    code, out, _ = run_cli(capsys, monkeypatch, "quality", "webhook", "replay", "churn:w3.csv", "--json")
    assert code == 0 and json.loads(out) == {"replayed": ["churn:w3.csv"]}
    code, out, _ = run_cli(capsys, monkeypatch, "quality", "webhook", "send", "--json")
    assert code == 0 and json.loads(out)["delivered"] == ["churn:w3.csv"]  # a 409: acted on once
    assert len(calls) == 2


def test_send_exits_1_when_an_event_fails_for_good_and_replay_failed_queues_it(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_secret(tmp_path / "other.secret")  # not the receiver's: 401, a final failure
    calls: list[str] = []
    with WebhookServer(AlertReceiver(b"r" * 32, recorder(calls))) as server:
        box = Outbox(outbox_dir(home))
        box.enqueue(alert(), url=server.url, key="churn:w0.csv", secret_file=tmp_path / "other.secret")
        code, out, _ = run_cli(capsys, monkeypatch, "quality", "webhook", "send", "--json")
        assert code == 1 and json.loads(out)["failed"] == ["churn:w0.csv"]
        code, out, _ = run_cli(capsys, monkeypatch, "quality", "webhook", "send")
        assert code == 0 and "sent 0" in out
        code, out, _ = run_cli(capsys, monkeypatch, "quality", "webhook", "replay", "--failed")
        assert code == 0 and "churn:w0.csv" in out
        code, out, _ = run_cli(capsys, monkeypatch, "quality", "webhook", "log")
        assert code == 0 and "pending" in out and "401" in out
    assert calls == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("replay",), "give one event's KEY or --failed"),
        (("replay", "churn:w0.csv", "--failed"), "give one event's KEY or --failed"),
        (("replay", "churn:nothing"), "no event with key 'churn:nothing'"),
        (("log", "--limit", "0"), "--limit"),
        (("send", "--backoff-base", "0"), "backoff base 0.0"),
        (("send", "--max-attempts", "0"), "max attempts 0"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], needle: str
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "quality", "webhook", *args)
    assert_refused(code, err, home, needle)


@pytest.mark.parametrize(
    ("webhook", "needle"),
    [
        ({"url": "ftp://example.org/x", "secret_file": "hook.secret"}, "webhook.url"),
        ({"url": "http://127.0.0.1:1/hooks/alerts", "secret_file": "missing.secret"}, "webhook.secret_file"),
        ({"url": "http://127.0.0.1:1/hooks/alerts", "secret": "inline"}, "webhook.secret"),
    ],
)
def test_a_bad_webhook_in_the_monitor_file_exits_2(
    tmp_path: Path,
    home: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    webhook: dict[str, Any],
    needle: str,
) -> None:
    write_secret(tmp_path / "hook.secret")
    config = monitor_file(tmp_path, webhook)
    code, _, err = run_cli(capsys, monkeypatch, "quality", "monitor", "run", str(config), "--once")
    assert_refused(code, err, home, needle)


# ---- the kill test ------------------------------------------------------------------------------

SOAK = bool(os.environ.get("GPUFLEET_SOAK"))
RUNS = 5 if SOAK else 1
"""Seeds: 1 in `make test`, 5 under `GPUFLEET_SOAK=1` (`make soak`)."""
KILLS = 30 if SOAK else 4
EVENTS = 200
RECEIVER = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path

    import gpufleet.backends.local.process as process
    from gpufleet.quality.standing import retrain_once
    from gpufleet.quality.webhook import KEY_TTL_S, AlertReceiver, WebhookServer, load_secret

    process.ensure_scheduler = lambda home: None  # the retrain is queued in the store; nothing runs it
    home, port, spec, secret = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])

    def handler(alert, key):
        if alert.action != "retrain":
            return {"acted": False}
        job, submitted = retrain_once(home, alert.model, key, spec)
        return {"job_id": job, "submitted": submitted}

    journal = home / "quality" / "webhook-keys.jsonl"
    receiver = AlertReceiver(load_secret(secret), handler, journal=journal, key_ttl_s=KEY_TTL_S)
    WebhookServer(receiver, "127.0.0.1", port).start()
    threading.Event().wait()
    """
)
SENDER = "from gpufleet.cli.app import main; main()"
SEND_OPTIONS = ("--backoff-base", "0.05", "--backoff-cap", "0.5", "--max-attempts", "1000")
"""Short waits (a receiver restarts in a second or two), and no giving up while it is down."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("seed", range(RUNS))
def test_sender_and_receiver_killed_at_random_every_event_delivered_each_retrain_once(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    sender_home, receiver_home = tmp_path / "sender", tmp_path / "receiver"
    secret, spec, script = tmp_path / "hook.secret", tmp_path / "retrain.yaml", tmp_path / "receiver.py"
    write_secret(secret)
    spec.write_text(SPEC)
    script.write_text(RECEIVER)
    port = free_port()
    box = Outbox(outbox_dir(sender_home))
    retrains = set()
    for i in range(EVENTS):
        action = "alert" if i % 10 == 0 else "retrain"
        key = f"m{i % 4}:window-{i:04d}"
        retrains |= {key} if action == "retrain" else set()
        payload = {"model": f"m{i % 4}", "action": action, "window": f"window-{i:04d}"}
        box.enqueue(payload, url=f"http://127.0.0.1:{port}/alerts", key=key, secret_file=secret)
    commands = {
        "receiver": ([sys.executable, str(script), *map(str, (receiver_home, port, spec, secret))], receiver_home),
        "sender": (
            [sys.executable, "-c", SENDER, "quality", "webhook", "send", "--forever", *SEND_OPTIONS],
            sender_home,
        ),
    }
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(name: str, n: int) -> subprocess.Popen[bytes]:
        argv, home = commands[name]
        with (logs / f"{name}-{n}.log").open("wb") as out:
            return subprocess.Popen(argv, env={**os.environ, "GPUFLEET_HOME": str(home)}, stdout=out, stderr=out)

    def delivered() -> int:
        return sum(e.state == "delivered" for e in box.events())

    def wait_for(done: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout  # a safety net, not a measurement
        while not done():
            if time.monotonic() > deadline:
                tails = {p.name: p.read_text()[-2000:] for p in sorted(logs.iterdir())}
                pytest.fail(f"timed out waiting for {what}; {delivered()} delivered; logs: {tails}")
            time.sleep(0.05)

    kills: collections.Counter[str] = collections.Counter()
    procs = {name: start(name, 0) for name in commands}
    try:
        for _ in range(KILLS):
            target = min(EVENTS, delivered() + rng.randint(1, EVENTS // (KILLS + 1)))
            wait_for(functools.partial(lambda n: delivered() >= n, target), f"{target} deliveries")
            if delivered() >= EVENTS:
                break
            time.sleep(rng.uniform(0.0, 0.03))  # somewhere inside the next delivery
            victim = rng.choice(sorted(procs))
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            kills[victim] += 1
            procs[victim] = start(victim, kills[victim])
        wait_for(lambda: delivered() == EVENTS, "every event delivered")
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    figures = check_exactly_once(box, receiver_home, retrains)
    print(json.dumps({"seed": seed, "events": EVENTS, "kills": dict(kills), **figures}))
    assert sum(kills.values()) >= min(KILLS, 1)


def check_exactly_once(box: Outbox, receiver_home: Path, retrains: set[str]) -> dict[str, Any]:
    """Assert each event delivered, accepted once, each retrain in the receiver's store once; the figures."""
    events = box.events()
    assert [e.key for e in events if e.state != "delivered"] == []
    journal = json_lines(receiver_home / "quality" / "webhook-keys.jsonl")
    accepted = collections.Counter(line["key"] for line in journal)
    assert set(accepted) == {e.key for e in events} and set(accepted.values()) == {1}
    submitted = jobs_by_key(receiver_home)
    assert submitted == dict.fromkeys(retrains, 1)  # in the store once each: none lost, none twice
    statuses = collections.Counter(str(a.status) for e in events for a in e.history)
    lines = [line for m in range(4) for line in json_lines(model_dir(receiver_home, f"m{m}") / "retrains.jsonl")]
    return {
        "retrains": len(retrains),
        "attempts": sum(statuses.values()),
        "answers": dict(sorted(statuses.items())),
        "recovered_retrains": sum(line.get("recovered") is True for line in lines),
        "duplicate_retrains": sum(n - 1 for n in submitted.values()),
    }
