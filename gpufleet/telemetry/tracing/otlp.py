"""Spans in the OTLP/HTTP JSON encoding of ``ExportTraceServiceRequest``. Pure: no I/O.

The JSON follows opentelemetry-proto ``trace/v1/trace.proto`` as proto3 JSON: int64 (times in
nanoseconds, integer attributes) as strings, ids as hex, non-finite doubles by name. Apart from
the span model (``spans``) because it is one wire format among possible others, and from the
file and HTTP edges (``export``) so it can be checked without either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.jobs.store import Job
from gpufleet.telemetry.tracing.spans import AttributeValue, Span

SPAN_KIND_INTERNAL = 1
_STATUS_CODES: dict[str, int] = {"unset": 0, "ok": 1, "error": 2}


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
    from gpufleet._version import __version__

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


__all__ = ["SPAN_KIND_INTERNAL", "resource_attributes", "to_otlp_json"]
