"""A job's history as an OpenTelemetry trace: one root span, one span per attempt, phases inside.

Built after the fact from what the store recorded, so any OTLP backend (Jaeger, Tempo,
Honeycomb) can show where a job's wall time went. Split by concern; every name below is
importable from ``gpufleet.telemetry.tracing``:

- ``spans``: the span model built from the store's job, attempts and events (stable ids, the
  phase tree, ``span_timeline`` for a terminal);
- ``otlp``: the OTLP/HTTP JSON encoding of ``ExportTraceServiceRequest``;
- ``export``: the I/O edge, ``jobs/<id>/trace.otlp.json`` and the HTTP POST to a collector.
"""

from __future__ import annotations

from gpufleet.telemetry.tracing.export import job_trace, save_trace, send_otlp, traces_url, write_trace
from gpufleet.telemetry.tracing.otlp import resource_attributes, to_otlp_json
from gpufleet.telemetry.tracing.spans import (
    MAX_STEP_EVENTS,
    Span,
    SpanEvent,
    job_spans,
    sample_evenly,
    span_timeline,
    trace_seed,
)

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
    "span_timeline",
    "to_otlp_json",
    "trace_seed",
    "traces_url",
    "write_trace",
]
