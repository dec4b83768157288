"""Job traces: span tree from the store, OTLP/JSON shape, stable ids, and sending to a collector."""

from __future__ import annotations

import json
import math
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpufleet.cli.trace import trace_command
from gpufleet.errors import ServiceUnavailable, UsageError
from gpufleet.jobs.store import Store
from gpufleet.spec import parse_spec
from gpufleet.telemetry.tracing import (
    MAX_STEP_EVENTS,
    Span,
    job_spans,
    job_trace,
    send_otlp,
    span_timeline,
    to_otlp_json,
    traces_url,
    write_trace,
)


def preempted_then_completed(store: Store) -> tuple[int, float]:
    """A job preempted once (300 step reports) and completed on its second attempt."""
    job_id = store.add_job(parse_spec({"name": "lm", "team": "vision", "entrypoint": "m:f", "spot": True}), "local")
    t0 = store.job(job_id).submitted_at

    def runtime(n: int, *events: tuple[float, str, dict[str, Any]]) -> None:
        rows = [{"ts": t0 + dt, "attempt": n, "kind": kind, **data} for dt, kind, data in events]
        store.add_runtime_events(job_id, rows, offset=0)

    store.add_attempt(job_id, 1, pid=101, started_at=t0 + 2)
    store.add_event(job_id, "attempt_start", attempt=1, ts=t0 + 2, pid=101)
    steps = [(4 + i * 0.02, "step", {"step": i + 1, "loss": 3.0 - i / 200, "tokens_per_s": 1000.0}) for i in range(300)]
    runtime(
        1,
        (3, "session_start", {"pid": 101, "total_steps": 400}),
        (3.6, "restore", {"step": None, "seconds": 0.5, "cause": "start"}),
        (3.7, "train_start", {"step": 0, "data_position": 0}),
        *steps,
        (8, "checkpoint", {"step": 200, "seconds": 0.4, "bytes": 1024, "healthy": True, "reason": "periodic"}),
        (10.2, "preempt_signal", {"signal": "SIGTERM", "step": 300}),
        (10.5, "checkpoint", {"step": 300, "seconds": 0.3, "bytes": 1024, "healthy": True, "reason": "preempt"}),
        (10.6, "session_end", {"status": "requeue", "step": 300}),
    )
    store.update_attempt(job_id, 1, state="stopping", sigterm_at=t0 + 10)
    store.add_event(job_id, "sigterm", attempt=1, ts=t0 + 10, reason="preempted", grace=30.0)
    store.update_attempt(job_id, 1, state="ended", ended_at=t0 + 11, exit_code=75, outcome="preempted")
    store.add_event(job_id, "attempt_end", attempt=1, ts=t0 + 11, exit_code=75, outcome="preempted")
    store.add_event(job_id, "requeued", attempt=1, ts=t0 + 11)

    store.add_attempt(job_id, 2, pid=102, started_at=t0 + 15)
    runtime(
        2,
        (15.5, "session_start", {"pid": 102, "total_steps": 400}),
        (16.6, "restore", {"step": 300, "seconds": 1.0, "cause": "start"}),
        (16.7, "train_start", {"step": 300, "data_position": 300}),
        (17, "step", {"step": 320, "loss": 1.5, "tokens_per_s": 900.0, "mfu": 0.31}),
        (18, "unhealthy", {"step": 321, "loss": math.nan, "reason": "nan", "zscore": None}),
        (18.1, "rollback", {"from_step": 321, "to_step": 300, "redone_seconds": 0.5, "restore_seconds": 0.1}),
        (19.5, "step", {"step": 400, "loss": 1.2, "tokens_per_s": 950.0}),
        (20, "checkpoint", {"step": 400, "seconds": 0.2, "bytes": 2048, "healthy": True, "reason": "final"}),
        (20.2, "session_end", {"status": "completed", "step": 400}),
    )
    store.update_attempt(job_id, 2, state="ended", ended_at=t0 + 20.5, exit_code=0, outcome="completed")
    store.add_event(job_id, "completed", attempt=2, ts=t0 + 20.5)
    store.set_job_state(job_id, "completed")
    return job_id, t0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def spans_of(store: Store, job_id: int, namespace: str = "") -> list[Span]:
    return job_spans(store.job(job_id), store.attempts(job_id), store.events(job_id), namespace=namespace)


def test_span_tree_names_parents_and_outcomes(store: Store) -> None:
    job_id, t0 = preempted_then_completed(store)
    spans = spans_of(store, job_id)
    by_id = {s.span_id: s for s in spans}
    tree = [(s.name, by_id[s.parent_id].name if s.parent_id else None) for s in spans]
    assert tree == [
        (f"job {job_id} lm", None),
        ("attempt 1", f"job {job_id} lm"),
        ("queued", "attempt 1"),
        ("startup", "attempt 1"),
        ("restore", "attempt 1"),
        ("train", "attempt 1"),
        ("checkpoint save", "train"),
        ("checkpoint save", "train"),
        ("preempted", "attempt 1"),
        ("attempt 2", f"job {job_id} lm"),
        ("requeued", "attempt 2"),
        ("startup", "attempt 2"),
        ("restore", "attempt 2"),
        ("train", "attempt 2"),
        ("checkpoint save", "train"),
    ]
    root, a1, a2 = spans[0], spans[1], spans[9]
    assert (root.start, root.end, root.status) == (t0, t0 + 20.5, "ok")
    assert root.attributes["gpufleet.spot"] is True and root.attributes["gpufleet.team"] == "vision"
    assert (a1.attributes["gpufleet.outcome"], a1.attributes["gpufleet.exit_code"]) == ("preempted", 75)
    assert (a2.attributes["gpufleet.outcome"], a2.status) == ("completed", "ok")
    named = {(s.name, by_id[s.parent_id or ""].name if s.parent_id else ""): s for s in spans[9:]}
    assert spans[2].duration == pytest.approx(2.0) and spans[10].duration == pytest.approx(4.0)  # queued, requeued
    assert spans[3].end == pytest.approx(t0 + 3) and spans[4].start == pytest.approx(t0 + 3.1)  # startup, restore
    assert spans[8].start == pytest.approx(t0 + 10) and spans[8].end == pytest.approx(t0 + 11)  # preempted
    assert spans[8].attributes["gpufleet.grace"] == 30.0
    assert spans[6].duration == pytest.approx(0.4) and spans[6].attributes["gpufleet.reason"] == "periodic"
    train2 = named[("train", "attempt 2")]
    assert [e.name for e in train2.events] == ["step", "unhealthy", "rollback", "step"]
    assert train2.end == pytest.approx(t0 + 20.2)


def test_spans_are_nested_non_negative_and_sampled(store: Store) -> None:
    job_id, _ = preempted_then_completed(store)
    spans = spans_of(store, job_id)
    by_id = {s.span_id: s for s in spans}
    for s in spans:
        assert s.duration >= 0, s.name
        if s.parent_id:
            parent = by_id[s.parent_id]
            assert parent.start <= s.start <= s.end <= parent.end, (s.name, parent.name)
    train1 = spans[5]
    steps = [e for e in train1.events if e.name == "step"]
    assert len(steps) == MAX_STEP_EVENTS
    assert (steps[0].attributes["gpufleet.step"], steps[-1].attributes["gpufleet.step"]) == (1, 300)
    assert train1.attributes["gpufleet.steps.reported"] == 300
    assert "preempt_signal" in [e.name for e in train1.events]


def test_ids_are_deterministic_and_distinct(store: Store) -> None:
    job_id, _ = preempted_then_completed(store)
    first, again = spans_of(store, job_id, "/h"), spans_of(store, job_id, "/h")
    assert [(s.trace_id, s.span_id, s.parent_id) for s in first] == [
        (s.trace_id, s.span_id, s.parent_id) for s in again
    ]
    assert len({s.span_id for s in first}) == len(first)
    assert len({s.trace_id for s in first}) == 1
    assert spans_of(store, job_id, "/elsewhere")[0].trace_id != first[0].trace_id


def test_otlp_json_shape_and_value_types(store: Store) -> None:
    job_id, t0 = preempted_then_completed(store)
    spans = spans_of(store, job_id)
    payload = json.loads(json.dumps(to_otlp_json(spans, {"service.name": "gpufleet", "n": 3, "x": 0.5, "b": False})))
    (rs,) = payload["resourceSpans"]
    assert rs["resource"]["attributes"] == [
        {"key": "service.name", "value": {"stringValue": "gpufleet"}},
        {"key": "n", "value": {"intValue": "3"}},
        {"key": "x", "value": {"doubleValue": 0.5}},
        {"key": "b", "value": {"boolValue": False}},
    ]
    (scope_spans,) = rs["scopeSpans"]
    assert scope_spans["scope"]["name"] == "gpufleet"
    out = scope_spans["spans"]
    assert len(out) == len(spans)
    for item in out:
        assert len(item["traceId"]) == 32 and len(item["spanId"]) == 16
        int(item["traceId"], 16), int(item["spanId"], 16)
        assert item["kind"] == 1 and item["status"]["code"] in (0, 1, 2)
        assert isinstance(item["startTimeUnixNano"], str) and isinstance(item["endTimeUnixNano"], str)
        assert int(item["startTimeUnixNano"]) <= int(item["endTimeUnixNano"])
        for ev in item["events"]:
            assert set(ev) == {"timeUnixNano", "name", "attributes"} and isinstance(ev["timeUnixNano"], str)
    root = out[0]
    assert "parentSpanId" not in root and all(len(s["parentSpanId"]) == 16 for s in out[1:])
    assert int(root["startTimeUnixNano"]) == round(t0 * 1e6) * 1000 and root["status"] == {"code": 1}
    attrs = {a["key"]: a["value"] for a in out[1]["attributes"]}
    assert attrs["gpufleet.attempt"] == {"intValue": "1"} and attrs["gpufleet.outcome"] == {"stringValue": "preempted"}
    train2 = next(s for s in out if s["name"] == "train" and s["parentSpanId"] == out[9]["spanId"])
    unhealthy = next(e for e in train2["events"] if e["name"] == "unhealthy")
    loss = {a["key"]: a["value"] for a in unhealthy["attributes"]}["gpufleet.loss"]
    assert loss == {"doubleValue": "NaN"}  # proto3 JSON names non-finite doubles


def test_write_trace_is_stable(store: Store, tmp_path: Path) -> None:
    job_id, _ = preempted_then_completed(store)
    home = tmp_path / "home"
    path = write_trace(home, job_id, store)
    assert path == home / "jobs" / str(job_id) / "trace.otlp.json"
    assert json.loads(path.read_text()) == job_trace(store, home, job_id)[1]
    assert write_trace(home, job_id, store).read_bytes() == path.read_bytes()


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}" if self.status == 200 else b"bad spans")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, type[_Collector]]]:
    handler = type("Handler", (_Collector,), {"received": [], "status": 200})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_send_otlp_posts_json(store: Store, collector: tuple[str, type[_Collector]]) -> None:
    url, handler = collector
    job_id, _ = preempted_then_completed(store)
    payload = to_otlp_json(spans_of(store, job_id), {"service.name": "gpufleet"})
    assert send_otlp(payload, url + "/", timeout=5) == 200
    ((path, ctype, body),) = handler.received
    assert (path, ctype) == ("/v1/traces", "application/json")
    assert json.loads(body) == json.loads(json.dumps(payload))
    handler.status = 500
    with pytest.raises(UsageError, match=r"HTTP 500.*bad spans"):
        send_otlp(payload, url, timeout=5)


def test_send_otlp_failures_name_the_endpoint() -> None:
    """No collector listening is a service that does not answer (exit 3); a bad URL is bad input (exit 2)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ServiceUnavailable, match=f"127.0.0.1:{port}/v1/traces") as caught:
        send_otlp({}, f"http://127.0.0.1:{port}", timeout=2)
    assert caught.value.exit_code == 3
    with pytest.raises(UsageError, match="not an http"):
        send_otlp({}, "file:///etc/passwd")


def test_traces_url_follows_the_otel_variables() -> None:
    assert traces_url(None, {}) is None
    assert traces_url("http://c:4318/", {}) == "http://c:4318/v1/traces"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318"}
    assert traces_url(None, env) == "http://base:4318/v1/traces"
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "http://full:4318/custom"
    assert traces_url(None, env) == "http://full:4318/custom"
    assert traces_url("https://flag:4318", env) == "https://flag:4318/v1/traces"


def test_trace_command(home: Path, collector: tuple[str, type[_Collector]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    store = Store(home / "state.db")
    job_id, _ = preempted_then_completed(store)
    store.close()
    app = typer.Typer()
    app.command("trace")(trace_command)
    app.command("noop")(lambda: None)
    out = CliRunner().invoke(app, ["trace", str(job_id)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == f"wrote {home / 'jobs' / str(job_id) / 'trace.otlp.json'}"
    assert lines[1].startswith(f"job {job_id} lm") and lines[2].startswith("  attempt 1")
    assert "preempted" in lines[2] and lines[3].startswith("    queued")
    url, handler = collector
    out = CliRunner().invoke(app, ["trace", str(job_id), "--endpoint", url, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"] == f"job {job_id} lm"
    assert len(handler.received) == 1
    assert span_timeline([]) == []
