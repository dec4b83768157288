"""A job's history as an OpenTelemetry trace: one root span, one span per attempt, phases inside.

Built after the fact from what the store recorded (attempts plus backend and runtime events), so
any OTLP backend (Jaeger, Tempo, Honeycomb) can show where a job's wall time went::

    job <id> <name>                     submitted -> last attempt end
    └── attempt N                       wait start -> attempt end (outcome attribute)
        ├── queued | requeued           submitted (or the previous attempt's end) -> start
        ├── startup                     process start -> session_start (or restore start)
        ├── restore                     the restore event's ``seconds``, ending at its ts
        ├── train                       train_start -> last step/session_end; sampled step events
        │   └── checkpoint save         each checkpoint event's ``seconds``, ending at its ts
        └── preempted                   SIGTERM -> attempt end

An attempt span starts when the attempt began waiting, so its wait nests inside it. Children are
clamped into their parent: runtime clocks (on another node) may be skewed against the scheduler's.

Ids are derived from the job (sha256, truncated to 16 bytes for the trace and 8 for spans), so
exporting the same job twice gives the same trace and a backend deduplicates instead of doubling.
The JSON follows the OTLP/HTTP JSON encoding of ``ExportTraceServiceRequest``
(opentelemetry-proto ``trace/v1/trace.proto``; int64 as strings, ids as hex).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from gpufleet.errors import ServiceUnavailable, UsageError
from gpufleet.fmt import compact_duration
from gpufleet.jobs.store import Attempt, Event, Job, Store
from gpufleet.paths import job_dir

AttributeValue: TypeAlias = "str | int | float | bool"
StatusCode = Literal["unset", "ok", "error"]

MAX_STEP_EVENTS = 200
"""Step events kept on a train span, evenly sampled; backends reject or truncate huge spans."""
SPAN_KIND_INTERNAL = 1
_STATUS_CODES: dict[str, int] = {"unset": 0, "ok": 1, "error": 2}
_TRAIN_EVENTS = ("unhealthy", "rollback", "preempt_signal", "eval")
_TRAIN_END_KINDS = ("step", "checkpoint", "session_end", "unhealthy", "rollback", "preempt_signal")


@dataclass(frozen=True, slots=True)
class SpanEvent:
    name: str
    ts: float
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Span:
    trace_id: str
    """32 hex digits, the same for every span of a job."""
    span_id: str
    """16 hex digits."""
    parent_id: str | None
    name: str
    start: float
    """Unix seconds."""
    end: float
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()
    status: StatusCode = "unset"
    status_message: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start


def _digest(text: str, hex_digits: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:hex_digits]


def _attrs(data: Mapping[str, Any], prefix: str = "gpufleet.") -> dict[str, AttributeValue]:
    """The scalar entries of an event's data; lists, dicts and ``None`` are left out."""
    return {f"{prefix}{k}": v for k, v in data.items() if isinstance(v, (str, int, float, bool))}


def _num(data: Mapping[str, Any], key: str) -> float:
    value = data.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def sample_evenly(items: Sequence[Event], cap: int) -> list[Event]:
    """At most ``cap`` items spread evenly over ``items``, keeping the first and the last."""
    if len(items) <= cap:
        return list(items)
    if cap <= 1:
        return list(items[-cap:]) if cap == 1 else []
    picks = sorted({round(i * (len(items) - 1) / (cap - 1)) for i in range(cap)})
    return [items[i] for i in picks]


class _Builder:
    def __init__(self, seed: str) -> None:
        self.seed = seed
        self.trace_id = _digest(seed, 32)
        self.spans: list[Span] = []

    def add(
        self,
        path: str,
        name: str,
        parent: Span | None,
        start: float,
        end: float,
        attributes: dict[str, AttributeValue] | None = None,
        events: Sequence[SpanEvent] = (),
        status: StatusCode = "unset",
        message: str = "",
    ) -> Span:
        if parent is not None:
            start = min(max(start, parent.start), parent.end)
            end = min(end, parent.end)
        span = Span(
            trace_id=self.trace_id,
            span_id=_digest(f"{self.seed}/{path}", 16),
            parent_id=parent.span_id if parent else None,
            name=name,
            start=start,
            end=max(end, start),
            attributes=attributes or {},
            events=tuple(events),
            status=status,
            status_message=message,
        )
        self.spans.append(span)
        return span


def trace_seed(job: Job, namespace: str = "") -> str:
    """What a job's ids are hashed from; ``namespace`` (the home folder) and the submission time
    keep job 1 of two different state databases apart."""
    return f"gpufleet-job-{namespace}-{job.id}-{job.submitted_at!r}"


def job_spans(
    job: Job, attempts: Sequence[Attempt], events: Sequence[Event], *, namespace: str = "", now: float | None = None
) -> list[Span]:
    """The job's spans, parents before children (depth-first, in time order).

    ``now`` ends the spans of a job still running; by default, the latest time the store knows.
    """
    known = [job.submitted_at, *(e.ts for e in events), *(a.ended_at or a.started_at for a in attempts)]
    now = max(known) if now is None else now
    ordered = sorted(attempts, key=lambda a: a.n)
    end = max([now if a.ended_at is None else a.ended_at for a in ordered] or [max(known)])
    b = _Builder(trace_seed(job, namespace))
    spec = job.spec
    root_attrs: dict[str, AttributeValue] = {
        "gpufleet.job.id": job.id,
        "gpufleet.job.name": job.name,
        "gpufleet.team": job.team,
        "gpufleet.priority": job.priority,
        "gpufleet.backend": job.backend,
        "gpufleet.state": job.state,
        "gpufleet.restarts": job.restarts,
        "gpufleet.gpu_type": spec.resources.gpu_type,
        "gpufleet.gpus": spec.total_gpus,
        "gpufleet.provider": spec.provider,
        "gpufleet.spot": spec.spot,
    }
    if job.reason:
        root_attrs["gpufleet.reason"] = job.reason
    if job.backend_ref:
        root_attrs["gpufleet.backend_ref"] = job.backend_ref
    status: StatusCode = (
        "error" if job.state == "failed" else "ok" if job.state in ("completed", "cancelled") else "unset"
    )
    root = b.add(
        "job", f"job {job.id} {job.name}", None, job.submitted_at, end, root_attrs, (), status, job.reason or ""
    )
    previous_end = job.submitted_at
    for i, attempt in enumerate(ordered):
        mine = [e for e in events if e.attempt == attempt.n]
        _attempt_spans(b, root, attempt, mine, events, previous_end, "queued" if i == 0 else "requeued", now)
        previous_end = attempt.ended_at if attempt.ended_at is not None else attempt.started_at
    return b.spans


def _attempt_spans(
    b: _Builder,
    root: Span,
    attempt: Attempt,
    mine: Sequence[Event],
    everything: Sequence[Event],
    wait_start: float,
    wait_name: str,
    now: float,
) -> None:
    n, start = attempt.n, attempt.started_at
    end = attempt.ended_at if attempt.ended_at is not None else now
    outcome = attempt.outcome or attempt.state
    attrs: dict[str, AttributeValue] = {
        "gpufleet.attempt": n,
        "gpufleet.outcome": outcome,
        "gpufleet.attempt.wait_seconds": max(0.0, start - wait_start),
        "gpufleet.attempt.run_seconds": max(0.0, end - start),
    }
    if attempt.exit_code is not None:
        attrs["gpufleet.exit_code"] = attempt.exit_code
    if attempt.pid is not None:
        attrs["process.pid"] = attempt.pid
    marks = [SpanEvent(e.kind, e.ts, _attrs(e.data)) for e in mine if e.kind in ("sigkill", "preempted_by", "failed")]
    status: StatusCode = "error" if outcome == "failed" else "unset" if attempt.ended_at is None else "ok"
    span = b.add(f"attempt-{n}", f"attempt {n}", root, min(wait_start, start), end, attrs, marks, status)
    b.add(f"attempt-{n}/wait", wait_name, span, wait_start, start)

    runtime = [e for e in mine if e.source == "runtime"]
    first = {k: next((e for e in runtime if e.kind == k), None) for k in ("session_start", "train_start")}
    restore = next((e for e in runtime if e.kind == "restore" and e.data.get("cause") != "rollback"), None)
    restore_start = restore.ts - _num(restore.data, "seconds") if restore else None
    session_start, train_start = first["session_start"], first["train_start"]
    ready = session_start.ts if session_start else restore_start if restore_start is not None else None
    if ready is None and train_start is not None:
        ready = train_start.ts
    if ready is not None:
        b.add(f"attempt-{n}/startup", "startup", span, start, ready)
    if restore is not None and restore_start is not None:
        b.add(f"attempt-{n}/restore", "restore", span, restore_start, restore.ts, _attrs(restore.data))

    if train_start is not None:
        after = [e for e in runtime if e.ts >= train_start.ts]
        train_end = max([e.ts for e in after if e.kind in _TRAIN_END_KINDS], default=train_start.ts)
        steps = [e for e in after if e.kind == "step"]
        kept = sample_evenly(steps, MAX_STEP_EVENTS)
        marks = [SpanEvent("step", e.ts, _attrs(e.data)) for e in kept]
        marks += [SpanEvent(e.kind, e.ts, _attrs(e.data)) for e in after if e.kind in _TRAIN_EVENTS]
        marks.sort(key=lambda m: m.ts)
        ended = next((e for e in after if e.kind == "session_end"), None)
        failed = ended is not None and ended.data.get("status") == "failed"
        train_attrs: dict[str, AttributeValue] = {
            "gpufleet.first_step": int(_num(train_start.data, "step")),
            "gpufleet.steps.reported": len(steps),
            "gpufleet.steps.sampled": len(kept),
        }
        if ended is not None:
            train_attrs["gpufleet.session_status"] = str(ended.data.get("status"))
        train = b.add(
            f"attempt-{n}/train",
            "train",
            span,
            train_start.ts,
            train_end,
            train_attrs,
            marks,
            "error" if failed else "unset",
            str(ended.data.get("error", "")) if ended is not None and failed else "",
        )
        for i, e in enumerate(x for x in runtime if x.kind == "checkpoint"):
            parent = train if e.ts >= train.start else span
            seconds = _num(e.data, "seconds")
            b.add(f"attempt-{n}/checkpoint-{i}", "checkpoint save", parent, e.ts - seconds, e.ts, _attrs(e.data))

    if outcome == "preempted":
        sigterm = attempt.sigterm_at
        if sigterm is None:
            hits = [e for e in everything if e.kind == "sigterm" and (e.attempt in (n, None)) and start <= e.ts <= end]
            sigterm = hits[0].ts if hits else None
        if sigterm is not None:
            term = next((e for e in mine if e.kind == "sigterm"), None)
            extra = _attrs(term.data) if term else {}
            if attempt.kill_at is not None:
                extra["gpufleet.killed"] = True
            b.add(f"attempt-{n}/preempted", "preempted", span, sigterm, end, extra)


# ---- OTLP/JSON ----------------------------------------------------------------------------------
def _any_value(value: AttributeValue) -> dict[str, Any]:
    """An OTLP ``AnyValue``; int64 is a string and non-finite doubles are named, per proto3 JSON."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isnan(value):
            return {"doubleValue": "NaN"}
        if math.isinf(value):
            return {"doubleValue": "Infinity" if value > 0 else "-Infinity"}
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _key_values(attributes: Mapping[str, AttributeValue]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in attributes.items()]


def _nanos(ts: float) -> str:
    # Microseconds first: a double holds ~16 digits, so the last three of a nanosecond time are noise.
    return str(round(ts * 1_000_000) * 1000)


def to_otlp_json(spans: Sequence[Span], resource_attributes: Mapping[str, AttributeValue]) -> dict[str, Any]:
    """An OTLP/JSON ``ExportTraceServiceRequest`` holding ``spans`` under one resource."""
    from gpufleet import __version__

    out = []
    for s in spans:
        item: dict[str, Any] = {"traceId": s.trace_id, "spanId": s.span_id}
        if s.parent_id:
            item["parentSpanId"] = s.parent_id
        status: dict[str, Any] = {"code": _STATUS_CODES[s.status]}
        if s.status_message:
            status["message"] = s.status_message
        item |= {
            "name": s.name,
            "kind": SPAN_KIND_INTERNAL,
            "startTimeUnixNano": _nanos(s.start),
            "endTimeUnixNano": _nanos(s.end),
            "attributes": _key_values(s.attributes),
            "events": [
                {"timeUnixNano": _nanos(e.ts), "name": e.name, "attributes": _key_values(e.attributes)}
                for e in s.events
            ],
            "status": status,
        }
        out.append(item)
    scope = {"name": "gpufleet", "version": __version__}
    resource = {"attributes": _key_values(resource_attributes)}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": scope, "spans": out}]}]}


def resource_attributes(job: Job) -> dict[str, AttributeValue]:
    return {"service.name": "gpufleet", "gpufleet.job.id": job.id, "gpufleet.team": job.team}


# ---- I/O edge -------------------------------------------------------------------------------------
def job_trace(store: Store, home: Path, job_id: int, now: float | None = None) -> tuple[list[Span], dict[str, Any]]:
    """The job's spans and their OTLP/JSON payload, ids namespaced by ``home``."""
    job = store.job(job_id)
    spans = job_spans(job, store.attempts(job_id), store.events(job_id), namespace=str(home), now=now)
    return spans, to_otlp_json(spans, resource_attributes(job))


def save_trace(home: Path, job_id: int, payload: Mapping[str, Any]) -> Path:
    """Write ``jobs/<id>/trace.otlp.json`` (temp file and rename: readers never see half a file)."""
    path = job_dir(home, job_id) / "trace.otlp.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_trace(home: Path, job_id: int, store: Store, now: float | None = None) -> Path:
    return save_trace(home, job_id, job_trace(store, home, job_id, now)[1])


def traces_url(endpoint: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """Where to POST traces: ``endpoint`` (a base URL), else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    (a full URL, used as is), else ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL), per the OTel
    exporter spec; base URLs get ``/v1/traces``. ``None`` when nothing is configured."""
    env = os.environ if environ is None else environ
    if endpoint:
        return _signal_url(endpoint)
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return _signal_url(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    return None


def _signal_url(base: str) -> str:
    return base if base.rstrip("/").endswith("/v1/traces") else base.rstrip("/") + "/v1/traces"


def send_otlp(payload: Mapping[str, Any], endpoint: str, timeout: float = 10.0, *, full_url: bool = False) -> int:
    """POST ``payload`` to ``<endpoint>/v1/traces`` (or to ``endpoint`` itself when ``full_url``);
    the HTTP status. Any failure is a ``UsageError`` naming the endpoint and the reason."""
    url = endpoint if full_url else _signal_url(endpoint)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"OTLP endpoint {endpoint!r} is not an http(s) URL; use e.g. http://localhost:4318")
    body = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        try:
            detail = err.read(300).decode("utf-8", "replace").strip()
        finally:
            err.close()
        reason = f"HTTP {err.code} {err.reason}" + (f": {detail}" if detail else "")
    except urllib.error.URLError as err:
        raise ServiceUnavailable(
            f"no trace collector answers at {url} ({err.reason}): start one there, or send to another endpoint"
        ) from None
    except (OSError, ValueError) as err:
        reason = str(err) or type(err).__name__
    raise UsageError(f"cannot send trace to {url}: {reason}; check the collector is up (--endpoint)")


__all__ = [
    "MAX_STEP_EVENTS",
    "Span",
    "SpanEvent",
    "job_spans",
    "job_trace",
    "resource_attributes",
    "sample_evenly",
    "save_trace",
    "send_otlp",
    "to_otlp_json",
    "trace_seed",
    "traces_url",
    "write_trace",
]


def span_timeline(spans: Sequence[Span]) -> list[str]:
    """One line a span: name indented by depth, start offset from the root, duration."""
    if not spans:
        return []
    depth: dict[str, int] = {}
    t0 = spans[0].start
    rows = []
    for s in spans:
        depth[s.span_id] = depth[s.parent_id] + 1 if s.parent_id in depth else 0
        rows.append(("  " * depth[s.span_id] + s.name, f"+{s.start - t0:.1f}s", compact_duration(s.duration), s))
    width = max(len(r[0]) for r in rows)
    lines = []
    for name, offset, took, s in rows:
        note = s.attributes.get("gpufleet.outcome", "")
        if s.status == "error":
            note = f"{note} ERROR {s.status_message}".strip()
        lines.append(f"{name:<{width}}  {offset:>9}  {took:>8}  {note}".rstrip())
    return lines
