"""Preemption notices from fake metadata servers on loopback, in each provider's documented format."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends import notices
from gpufleet.backends.notices import (
    LINK_LOCAL,
    AwsSpot,
    AzureScheduledEvents,
    GcpPreempted,
    Notice,
    NoticeDrain,
    NoticeWatcher,
    configured_sources,
)
from gpufleet.errors import ServiceUnavailable, UsageError
from gpufleet.jobs.store import Store
from gpufleet.paths import state_db


@pytest.fixture(autouse=True)
def never_link_local(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test asks the real metadata address: every request must go to a fake on loopback."""
    real = notices._OPENER.open

    def guarded(req: Any, *args: Any, **kwargs: Any) -> Any:
        url = req.full_url if hasattr(req, "full_url") else str(req)
        assert url.startswith("http://127.0.0.1:"), url
        return real(req, *args, **kwargs)

    monkeypatch.setattr(notices._OPENER, "open", guarded)


@dataclass
class Fake:
    """What the fake metadata server answers, and what it was asked."""

    routes: dict[tuple[str, str], Callable[[BaseHTTPRequestHandler, bytes], tuple[int, bytes, dict[str, str]]]] = field(
        default_factory=dict
    )
    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    def answer(self, method: str, path: str, status: int, body: bytes | str = b"", **headers: str) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.routes[(method, path)] = lambda handler, sent: (status, data, headers)


@pytest.fixture
def fake() -> Iterator[Fake]:
    state = Fake()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            sent = self.rfile.read(length) if length else b""
            state.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, sent))
            route = state.routes.get((self.command, self.path.split("?")[0]))
            status, body, headers = route(self, sent) if route else (404, b"", {})
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def aws_token(fake: Fake, token: str = "tok-1") -> None:
    fake.answer("PUT", "/latest/api/token", 200, token)


# --- AWS ----------------------------------------------------------------------------------------


def test_aws_asks_a_token_then_reads_the_instance_action(fake: Fake) -> None:
    aws_token(fake)
    fake.answer("GET", "/latest/meta-data/spot/instance-action", 404)
    clock = [1_800_000_000.0]
    source = AwsSpot(fake.url, clock=lambda: clock[0])
    assert source.poll() is None
    put = next(s for s in fake.seen if s[0] == "PUT")
    assert put[2]["x-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    got = next(s for s in fake.seen if s[0] == "GET")
    assert got[2]["x-aws-ec2-metadata-token"] == "tok-1"

    deadline = clock[0] + 120
    fake.answer(
        "GET", "/latest/meta-data/spot/instance-action", 200, json.dumps({"action": "terminate", "time": iso(deadline)})
    )
    notice = source.poll()
    assert notice == Notice("aws", deadline, 120.0, "terminate")
    assert sum(1 for s in fake.seen if s[0] == "PUT") == 1  # the token is reused while valid


def test_aws_renews_the_token_before_it_expires_and_after_a_401(fake: Fake) -> None:
    aws_token(fake)
    fake.answer("GET", "/latest/meta-data/spot/instance-action", 404)
    clock = [1_800_000_000.0]
    source = AwsSpot(fake.url, clock=lambda: clock[0])
    source.poll()
    clock[0] += notices.AWS_TOKEN_TTL_S - 30  # inside the last minute of its life
    aws_token(fake, "tok-2")
    source.poll()
    assert [s[2].get("x-aws-ec2-metadata-token") for s in fake.seen if s[0] == "GET"] == ["tok-1", "tok-2"]
    fake.answer("GET", "/latest/meta-data/spot/instance-action", 401)
    with pytest.raises(ServiceUnavailable, match="session token"):
        source.poll()
    fake.answer("GET", "/latest/meta-data/spot/instance-action", 404)
    aws_token(fake, "tok-3")
    assert source.poll() is None
    assert fake.seen[-1][2]["x-aws-ec2-metadata-token"] == "tok-3"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        json.dumps({"action": "explode", "time": "2026-01-01T00:00:00Z"}).encode(),
        json.dumps({"action": "terminate", "time": "soon"}).encode(),
        json.dumps({"action": "terminate", "time": 12}).encode(),
        b"\xff\xfe",
        b"x" * (notices.MAX_BODY + 10),
    ],
)
def test_aws_bad_answers_are_errors_not_crashes(fake: Fake, body: bytes) -> None:
    aws_token(fake)
    fake.answer("GET", "/latest/meta-data/spot/instance-action", 200, body)
    with pytest.raises(ServiceUnavailable):
        AwsSpot(fake.url).poll()


def test_aws_without_a_token_is_an_error(fake: Fake) -> None:
    fake.answer("PUT", "/latest/api/token", 403)
    with pytest.raises(ServiceUnavailable, match="no session token"):
        AwsSpot(fake.url).poll()


def test_a_server_that_does_not_answer_is_an_error(fake: Fake) -> None:
    with pytest.raises(ServiceUnavailable, match="did not answer"):
        AwsSpot("http://127.0.0.1:9", timeout=1.0).poll()  # the discard port: nothing listens


# --- GCP ----------------------------------------------------------------------------------------


def test_gcp_reads_preempted_then_long_polls_with_the_etag(fake: Fake) -> None:
    fake.answer("GET", "/computeMetadata/v1/instance/preempted", 200, "FALSE", ETag="e1")
    source = GcpPreempted(fake.url, wait_s=1)
    assert source.poll() is None
    fake.answer("GET", "/computeMetadata/v1/instance/preempted", 200, "TRUE", ETag="e2")
    assert source.poll() == Notice("gcp", None, None, "preempted")
    first, second = fake.seen
    assert first[1] == "/computeMetadata/v1/instance/preempted"
    assert "wait_for_change=true" in second[1] and "last_etag=e1" in second[1] and "timeout_sec=1" in second[1]
    assert all(s[2]["metadata-flavor"] == "Google" for s in fake.seen)


@pytest.mark.parametrize("status, body", [(200, "MAYBE"), (500, "FALSE"), (200, "\xff")])
def test_gcp_bad_answers_are_errors(fake: Fake, status: int, body: str) -> None:
    fake.answer("GET", "/computeMetadata/v1/instance/preempted", status, body)
    with pytest.raises(ServiceUnavailable):
        GcpPreempted(fake.url).poll()


# --- Azure --------------------------------------------------------------------------------------


def azure_events(*events: dict[str, Any]) -> str:
    return json.dumps({"DocumentIncarnation": 2, "Events": list(events)})


def test_azure_finds_the_preempt_event_and_acknowledges_it(fake: Fake) -> None:
    now = 1_800_000_000.0
    not_before = format_datetime(datetime.fromtimestamp(now + 30, tz=UTC), usegmt=True)
    reboot = {"EventId": "r-1", "EventType": "Reboot", "NotBefore": not_before}
    preempt = {"EventId": "p-1", "EventType": "Preempt", "EventStatus": "Scheduled", "NotBefore": not_before}
    fake.answer("GET", "/metadata/scheduledevents", 200, azure_events())
    fake.answer("POST", "/metadata/scheduledevents", 200, "")
    source = AzureScheduledEvents(fake.url, clock=lambda: now)
    assert source.poll() is None
    fake.answer("GET", "/metadata/scheduledevents", 200, azure_events(reboot, preempt))
    notice = source.poll()
    assert notice == Notice("azure", now + 30, 30.0, "Preempt p-1")
    assert all("api-version=2020-07-01" in s[1] and s[2]["metadata"] == "true" for s in fake.seen)
    source.acknowledge(notice)
    post = fake.seen[-1]
    assert post[0] == "POST" and json.loads(post[3]) == {"StartRequests": [{"EventId": "p-1"}]}


def test_azure_preempt_without_not_before_has_no_deadline(fake: Fake) -> None:
    fake.answer("GET", "/metadata/scheduledevents", 200, azure_events({"EventId": "p", "EventType": "Preempt"}))
    assert AzureScheduledEvents(fake.url).poll() == Notice("azure", None, None, "Preempt p")


@pytest.mark.parametrize(
    "body", ["{}", "[]", '{"Events": 3}', '{"Events": [{"EventType": "Preempt", "EventId": 7}]}', "nope"]
)
def test_azure_bad_answers_are_errors(fake: Fake, body: str) -> None:
    fake.answer("GET", "/metadata/scheduledevents", 200, body)
    with pytest.raises(ServiceUnavailable):
        AzureScheduledEvents(fake.url).poll()


# --- configuration ------------------------------------------------------------------------------


def test_configuration_names_sources_and_their_urls() -> None:
    assert configured_sources({}) == []
    sources = configured_sources(
        {"GPUFLEET_NOTICES": "aws, gcp,azure,aws", "GPUFLEET_NOTICE_URL_GCP": "http://127.0.0.1:1"}
    )
    assert [s.name for s in sources] == ["aws", "gcp", "azure"]
    assert [s.base for s in sources if isinstance(s, AwsSpot | GcpPreempted | AzureScheduledEvents)] == [
        LINK_LOCAL,
        "http://127.0.0.1:1",
        LINK_LOCAL,
    ]


@pytest.mark.parametrize(
    "env, named",
    [
        ({"GPUFLEET_NOTICES": "aws,oracle"}, "oracle"),
        ({"GPUFLEET_NOTICES": "aws", "GPUFLEET_NOTICE_URL_AWS": "ftp://x"}, "GPUFLEET_NOTICE_URL_AWS"),
        ({"GPUFLEET_NOTICES": "azure", "GPUFLEET_NOTICE_URL_AZURE": "http://"}, "GPUFLEET_NOTICE_URL_AZURE"),
    ],
)
def test_a_bad_configuration_is_one_clear_line(env: dict[str, str], named: str) -> None:
    with pytest.raises(UsageError, match=named) as info:
        configured_sources(env)
    assert "\n" not in str(info.value) and info.value.exit_code == 2


# --- the watcher --------------------------------------------------------------------------------


class Scripted:
    """A source that answers from a list (an exception is raised), then repeats its last answer."""

    name = "aws"

    def __init__(self, answers: list[Notice | Exception | None]) -> None:
        self.answers = answers
        self.polls = 0

    def poll(self) -> Notice | None:
        answer = self.answers[min(self.polls, len(self.answers) - 1)]
        self.polls += 1
        if isinstance(answer, Exception):
            raise answer
        return answer

    def acknowledge(self, notice: Notice) -> None:
        return None


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_watcher_calls_back_once_per_notice_and_survives_bad_answers() -> None:
    first, second = Notice("aws", 100.0, 10.0, "stop"), Notice("aws", 200.0, 10.0, "terminate")
    bad = ServiceUnavailable("garbage")
    source = Scripted([None, bad, bad, first, first, first, None, None, second])
    seen: list[Notice] = []
    gone: list[Notice] = []
    logged: list[str] = []
    watcher = NoticeWatcher([source], seen.append, withdrawn=gone.append, poll_s=0.001, log=logged.append)
    watcher.start()
    try:
        wait_for(lambda: source.polls > 12)
    finally:
        watcher.stop()
    assert seen == [first, second]
    assert gone == [first]
    assert logged == ["aws: garbage; polling again"]  # logged once while it kept failing


def test_watcher_survives_a_source_that_raises_anything_and_a_failing_callback() -> None:
    notice = Notice("aws", None, None, "terminate")
    source = Scripted([RuntimeError("boom"), notice])
    logged: list[str] = []

    def broken(n: Notice) -> None:
        raise OSError("disk full")

    watcher = NoticeWatcher([source], broken, poll_s=0.001, log=logged.append).start()
    try:
        wait_for(lambda: source.polls > 3)
    finally:
        watcher.stop()
    assert logged[0] == "aws: boom; polling again"
    assert "handling the aws notice failed: disk full" in logged


# --- the drain ----------------------------------------------------------------------------------


def test_drain_records_signals_holds_and_acknowledges(tmp_path: Path) -> None:
    from gpufleet.spec import parse_spec

    home = tmp_path / "home"
    store = Store(state_db(home))
    job = store.add_job(parse_spec({"name": "j", "team": "t", "entrypoint": "x:y"}), backend="local")
    store.begin_attempt(job, 1, 1000.0)
    store.set_attempt_pid(job, 1, 4242)
    sent: list[tuple[int | None, int]] = []
    acked: list[Notice] = []
    source = Scripted([None])
    source.acknowledge = acked.append  # type: ignore[method-assign,assignment]
    clock = [1000.0]
    drain = NoticeDrain(home, [source], clock=lambda: clock[0], send=lambda pid, sig: sent.append((pid, sig)))
    assert not drain.draining()
    notice = Notice("aws", 1120.0, 120.0, "terminate")
    drain.notice(notice)
    assert sent == [(4242, signal.SIGUSR1)]
    event = store.events(job, kinds=("preemption_notice",))[0]
    assert (event.attempt, event.data["source"], event.data["lead_s"], event.data["deadline"]) == (
        1,
        "aws",
        120.0,
        1120.0,
    )
    assert drain.draining() and acked == []  # the attempt still runs: not drained yet
    store.end_attempt(
        job, 1, ended_at=1001.0, exit_code=75, outcome="requeued", job_state="queued", reason=None, restarts=1
    )
    assert drain.draining() and acked == [notice]  # drained: told once, still holding until the deadline
    assert drain.draining() and acked == [notice]
    clock[0] = 1120.0
    assert not drain.draining()


def test_drain_ends_when_the_notice_is_withdrawn(tmp_path: Path) -> None:
    drain = NoticeDrain(tmp_path / "home", clock=lambda: 0.0, send=lambda pid, sig: None)
    notice = Notice("gcp", None, None, "preempted")
    drain.notice(notice)
    assert drain.draining()
    drain.withdraw(notice)
    assert not drain.draining()
