"""A job's history as spans: one root span, one span per attempt, phases inside. No I/O, no wire format.

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

Apart from the encoding (``otlp``) and the I/O (``export``) because the span model is also read
directly: ``gpufleet trace`` prints ``span_timeline`` and the cost report takes phase times from
``job_spans``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from gpufleet.fmt import compact_duration
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import Attempt, Event, Job

AttributeValue: TypeAlias = "str | int | float | bool"
StatusCode = Literal["unset", "ok", "error"]

MAX_STEP_EVENTS = 200
"""Step events kept on a train span, evenly sampled; backends reject or truncate huge spans."""
_TRAIN_EVENTS = (EventKind.UNHEALTHY, EventKind.ROLLBACK, EventKind.PREEMPT_SIGNAL, EventKind.EVAL)
_TRAIN_END_KINDS = (
    EventKind.STEP,
    EventKind.CHECKPOINT,
    EventKind.SESSION_END,
    EventKind.UNHEALTHY,
    EventKind.ROLLBACK,
    EventKind.PREEMPT_SIGNAL,
)


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
    """A finite number from an event's data, else 0: the runtime's event log is written by user code."""
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return 0.0
    return number if math.isfinite(number) else 0.0


def _seconds(data: Mapping[str, Any], key: str) -> float:
    """A duration from an event's data: finite and not negative (a phase never ends before it starts)."""
    return max(0.0, _num(data, key))


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
        "error"
        if job.state == JobState.FAILED
        else "ok"
        if job.state in (JobState.COMPLETED, JobState.CANCELLED)
        else "unset"
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
    marks = [
        SpanEvent(e.kind, e.ts, _attrs(e.data))
        for e in mine
        if e.kind in (EventKind.SIGKILL, EventKind.PREEMPTED_BY, EventKind.FAILED)
    ]
    status: StatusCode = "error" if outcome == "failed" else "unset" if attempt.ended_at is None else "ok"
    span = b.add(f"attempt-{n}", f"attempt {n}", root, min(wait_start, start), end, attrs, marks, status)
    b.add(f"attempt-{n}/wait", wait_name, span, wait_start, start)

    runtime = [e for e in mine if e.source == "runtime"]
    first = {k: next((e for e in runtime if e.kind == k), None) for k in ("session_start", "train_start")}
    restore = next((e for e in runtime if e.kind == EventKind.RESTORE and e.data.get("cause") != "rollback"), None)
    restore_start = restore.ts - _seconds(restore.data, "seconds") if restore else None
    session_start, train_start = first["session_start"], first["train_start"]
    ready = session_start.ts if session_start else restore_start if restore_start is not None else None
    if ready is None and train_start is not None:
        ready = train_start.ts
    startup = b.add(f"attempt-{n}/startup", "startup", span, start, ready) if ready is not None else None
    staged = next((e for e in runtime if e.kind in (EventKind.DATA_STAGED, EventKind.DATA_STAGE_FAILED)), None)
    if staged is not None:
        seconds = _seconds(staged.data, "seconds")
        failed = staged.kind == EventKind.DATA_STAGE_FAILED
        b.add(
            f"attempt-{n}/stage_in",
            "stage_in",
            startup or span,
            staged.ts - seconds,
            staged.ts,
            _attrs(staged.data),
            status="error" if failed else "ok",
            message=str(staged.data.get("error", ""))[:500] if failed else "",
        )
    if restore is not None and restore_start is not None:
        b.add(f"attempt-{n}/restore", "restore", span, restore_start, restore.ts, _attrs(restore.data))

    if train_start is not None:
        after = [e for e in runtime if e.ts >= train_start.ts]
        train_end = max([e.ts for e in after if e.kind in _TRAIN_END_KINDS], default=train_start.ts)
        steps = [e for e in after if e.kind == EventKind.STEP]
        kept = sample_evenly(steps, MAX_STEP_EVENTS)
        marks = [SpanEvent("step", e.ts, _attrs(e.data)) for e in kept]
        marks += [SpanEvent(e.kind, e.ts, _attrs(e.data)) for e in after if e.kind in _TRAIN_EVENTS]
        marks.sort(key=lambda m: m.ts)
        ended = next((e for e in after if e.kind == EventKind.SESSION_END), None)
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
        for i, e in enumerate(x for x in runtime if x.kind == EventKind.CHECKPOINT):
            parent = train if e.ts >= train.start else span
            seconds = _seconds(e.data, "seconds")
            b.add(f"attempt-{n}/checkpoint-{i}", "checkpoint save", parent, e.ts - seconds, e.ts, _attrs(e.data))

    if outcome == "preempted":
        sigterm = attempt.sigterm_at
        if sigterm is None:
            hits = [
                e
                for e in everything
                if e.kind == EventKind.SIGTERM and (e.attempt in (n, None)) and start <= e.ts <= end
            ]
            sigterm = hits[0].ts if hits else None
        if sigterm is not None:
            term = next((e for e in mine if e.kind == EventKind.SIGTERM), None)
            extra = _attrs(term.data) if term else {}
            if attempt.kill_at is not None:
                extra["gpufleet.killed"] = True
            b.add(f"attempt-{n}/preempted", "preempted", span, sigterm, end, extra)


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


__all__ = [
    "MAX_STEP_EVENTS",
    "AttributeValue",
    "Span",
    "SpanEvent",
    "StatusCode",
    "job_spans",
    "sample_evenly",
    "span_timeline",
    "trace_seed",
]
