"""The I/O edge of traces: a job's trace from the store, written to its folder or POSTed to a collector.

``job_trace`` reads the store and builds the spans (``spans``) and their OTLP/JSON (``otlp``);
``save_trace`` writes ``jobs/<id>/trace.otlp.json``; ``send_otlp`` POSTs to an OTLP/HTTP
collector found by ``traces_url`` (the endpoint given or the OTel exporter environment
variables). Apart from the pure parts so that only this module touches files, the network and
the environment.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.errors import ParameterError, ServiceUnavailable, UsageError
from gpufleet.jobs.store import Store
from gpufleet.paths import job_dir
from gpufleet.telemetry.tracing.otlp import resource_attributes, to_otlp_json
from gpufleet.telemetry.tracing.spans import Span, job_spans


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
    exporter spec; base URLs get ``/v1/traces``. ``None`` when nothing is configured.

    The URL is checked (:func:`otlp_url_problem`) before it is returned, so a caller learns of a
    malformed one before it reads or writes anything: ``ParameterError`` naming ``url`` for the
    endpoint given, ``UsageError`` naming the variable for one from the environment.
    """
    env = os.environ if environ is None else environ
    if endpoint is not None:
        problem = otlp_url_problem(endpoint)
        if problem is not None:
            raise ParameterError("{url} " + _escape_braces(problem), url=endpoint)
        return _signal_url(endpoint)
    for name, full in (("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", True), ("OTEL_EXPORTER_OTLP_ENDPOINT", False)):
        value = env.get(name)
        if value:
            problem = otlp_url_problem(value)
            if problem is not None:
                raise UsageError(f"{name}={value!r} {problem}, or unset it")
            return value if full else _signal_url(value)
    return None


def otlp_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a collector's OTLP/HTTP endpoint (a phrase following the URL), or ``None``."""
    hint = "give an http(s) URL such as http://localhost:4318"
    if not url.strip():
        return f"is empty: {hint}"
    if any(c.isspace() or not c.isprintable() for c in url):
        return f"holds whitespace or a control character: {hint}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises for a port that is not a number from 0 to 65535
    except ValueError as err:
        return f"is not a valid URL ({err}): {hint}"
    if parts.scheme not in ("http", "https"):
        return f"is not an http(s) URL: {hint}"
    if not parts.hostname:
        return f"names no host: {hint}"
    if port == 0:
        return f"has port 0: {hint}"
    return None


def _escape_braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _signal_url(base: str) -> str:
    return base if base.rstrip("/").endswith("/v1/traces") else base.rstrip("/") + "/v1/traces"


def send_otlp(payload: Mapping[str, Any], endpoint: str, timeout: float = 10.0, *, full_url: bool = False) -> int:
    """POST ``payload`` to ``<endpoint>/v1/traces`` (or to ``endpoint`` itself when ``full_url``);
    the HTTP status. Any failure is a ``UsageError`` naming the endpoint and the reason."""
    url = endpoint if full_url else _signal_url(endpoint)
    problem = otlp_url_problem(url)
    if problem is not None:
        raise UsageError(f"OTLP endpoint {endpoint!r} {problem}")
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
    raise ParameterError(
        "cannot send trace to {url!s}: {reason!s}; check the collector is up, or give another {url:name}",
        url=url,
        reason=reason,
    )


__all__ = ["job_trace", "otlp_url_problem", "save_trace", "send_otlp", "traces_url", "write_trace"]
