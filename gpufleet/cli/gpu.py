"""``gpufleet observe exporter``: a synthetic dcgm-exporter for dashboards, alert rules and demos.

It serves what a fleet of ``nodes`` x ``gpus`` GPUs running one pattern would show a Prometheus
scraping dcgm-exporter, advancing in real time, so rules and dashboards can be tried without a GPU.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer


def exporter_command(
    pattern: Annotated[str, typer.Option(help="GPU pattern to serve (see `observe diagnose --help`).")] = "healthy",
    gpus: Annotated[int, typer.Option(help="GPUs per node.", min=1)] = 8,
    nodes: Annotated[int, typer.Option(help="Nodes (hostnames node-0, node-1, ...).", min=1)] = 1,
    job: Annotated[str, typer.Option(help="hpc_job label of every GPU; empty for none.")] = "",
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1; 0 picks a free one.", min=0, max=65535)] = 9400,
    port_file: Annotated[Path | None, typer.Option(help="Write the bound port to this file.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic series.", min=0)] = 0,
    step_seconds: Annotated[float, typer.Option(help="Seconds between two synthetic samples.")] = 1.0,
) -> None:
    """Serve a synthetic dcgm-exporter /metrics on 127.0.0.1 until Ctrl-C or SIGTERM."""
    from gpufleet.cli.render import console
    from gpufleet.errors import UsageError
    from gpufleet.telemetry.exporter import DcgmRenderer, ExpositionServer
    from gpufleet.telemetry.gpu import SyntheticSource, derive_seed
    from gpufleet.telemetry.synthetic import PATTERNS, SyntheticJobConfig

    if pattern not in PATTERNS:
        raise UsageError(f"unknown --pattern {pattern!r}; choose one of: {', '.join(PATTERNS)}")
    if not step_seconds > 0:
        raise UsageError(f"--step-seconds {step_seconds} must be positive")
    sources = [
        SyntheticSource(
            SyntheticJobConfig(
                pattern=pattern,
                gpus=gpus,
                step_s=step_seconds,
                duration_s=max(step_seconds, 600.0),
                seed=derive_seed(seed, node),
                job=job,
                hostname=f"node-{node}",
            )
        )
        for node in range(nodes)
    ]
    renderer = DcgmRenderer()
    server = ExpositionServer(lambda: renderer.render([s for src in sources for s in src.read().samples]), port=port)
    bound = server.start()
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    try:
        console.print(
            f"serving a synthetic dcgm-exporter ({pattern}, {nodes} node(s) x {gpus} GPU(s)) "
            f"on http://127.0.0.1:{bound}/metrics; Ctrl-C to stop",
            highlight=False,
            soft_wrap=True,
        )
        if port_file is not None:  # last: its appearance says the exporter is ready
            tmp = port_file.with_name(f".{port_file.name}.{os.getpid()}.tmp")
            tmp.write_text(str(bound), encoding="utf-8")
            tmp.replace(port_file)  # a reader never sees a half-written port
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
