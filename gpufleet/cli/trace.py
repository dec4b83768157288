"""``gpufleet trace JOB``: a job's history as an OpenTelemetry trace, written, shown and optionally sent."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from gpufleet.backends import sync_remote
from gpufleet.cli.options import MAX_JOB_ID, job_store, warn_on_success
from gpufleet.cli.render import console, emit_json
from gpufleet.errors import GpufleetError, parameters_as_flags
from gpufleet.paths import gpufleet_home
from gpufleet.telemetry.tracing import job_trace, save_trace, send_otlp, span_timeline, traces_url

TraceJobArg = Annotated[int, typer.Argument(help="Job id (see `gpufleet jobs`).", min=1, max=MAX_JOB_ID)]
EndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--endpoint",
        help="OTLP/HTTP collector base URL, e.g. http://localhost:4318 (default: $OTEL_EXPORTER_OTLP_ENDPOINT).",
    ),
]
TraceJsonOpt = Annotated[bool, typer.Option("--json", help="Print the OTLP/JSON payload on stdout.")]


@parameters_as_flags({"url": "--endpoint"})
def trace_command(job_id: TraceJobArg, endpoint: EndpointOpt = None, json_out: TraceJsonOpt = False) -> None:
    """Export a job's attempts and phases as an OpenTelemetry trace (jobs/<id>/trace.otlp.json)."""
    url = traces_url(endpoint)  # a malformed endpoint is refused before anything is read or written
    home = gpufleet_home()
    store = job_store(job_id, sync=False)
    try:
        try:
            sync_remote(home, store)
        except GpufleetError as err:  # a stale trace beats none; say so, as `open_store()` does
            warn_on_success(f"states may be stale: {err}")
        spans, payload = job_trace(store, home, job_id, now=time.time())
    finally:
        store.close()
    path = save_trace(home, job_id, payload)
    if url is not None:
        send_otlp(payload, url, full_url=True)
    if json_out:
        emit_json(payload)
        return
    typer.echo(f"wrote {path}")
    for line in span_timeline(spans):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if url is not None:
        console.print(f"sent {len(spans)} spans to {url}", markup=False, highlight=False, soft_wrap=True)


__all__ = ["EndpointOpt", "TraceJobArg", "TraceJsonOpt", "trace_command"]
