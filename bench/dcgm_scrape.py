"""An HTTP scrape of ~10,000 DCGM series: the lean exporter against prometheus-client.

    .venv/bin/python bench/dcgm_scrape.py [--json] [--nodes 79] [--gpus 8] [--repeats 9]

Both endpoints serve the same samples: ``nodes`` x ``gpus`` synthetic GPUs (``healthy`` pattern)
with every DCGM field the synthetic source has and dcgm-exporter's labels. One is
``ExpositionServer`` + ``DcgmRenderer`` rendering a fresh round per scrape (rounds precomputed,
as the sampler thread would have read them); the other, the baseline measured in the same run,
is a prometheus-client registry of the same gauges served by ``start_http_server``. Each is
scraped over HTTP with urllib, as Prometheus does; the medians of ``--repeats`` scrapes are
compared, after one unmeasured warm-up scrape each. Target: the lean scrape takes <= 50 ms.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from typing import Any

import _common as common

from gpufleet.telemetry.dcgm import CATALOGUE, Sample, parse_exposition
from gpufleet.telemetry.exporter import DcgmRenderer, ExpositionServer
from gpufleet.telemetry.gpu import derive_seed
from gpufleet.telemetry.synthetic import SyntheticJob, SyntheticJobConfig, synthesize

TARGET_SCRAPE_S = 0.050
ROUNDS = 4


def fleet(nodes: int, gpus: int) -> list[SyntheticJob]:
    return [
        synthesize(
            SyntheticJobConfig(
                gpus=gpus, duration_s=ROUNDS, seed=derive_seed(0, n), job=f"job-{n}", hostname=f"node-{n}"
            )
        )
        for n in range(nodes)
    ]


def scrape(port: int) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        body: bytes = response.read()
    return time.perf_counter() - started, body


def time_scrapes(port: int, repeats: int) -> tuple[float, bytes]:
    scrape(port)  # warm-up: first connection, the renderer's label cache
    times, body = [], b""
    for _ in range(repeats):
        seconds, body = scrape(port)
        times.append(seconds)
    return common.median(times), body


def lean(rounds: list[list[Sample]], repeats: int) -> tuple[float, float, bytes]:
    renderer = DcgmRenderer()
    counter = iter(range(1 << 62))
    server = ExpositionServer(lambda: renderer.render(rounds[next(counter) % len(rounds)]))
    port = server.start()
    try:
        http, body = time_scrapes(port, repeats)
    finally:
        server.close()
    render = []
    for i in range(repeats):
        started = time.perf_counter()
        renderer.render(rounds[i % len(rounds)])
        render.append(time.perf_counter() - started)
    return http, common.median(render), body


def baseline(samples: list[Sample], repeats: int) -> tuple[float, bytes]:
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    registry = CollectorRegistry()
    gauges: dict[str, Any] = {}
    for s in samples:
        gauge = gauges.get(s.name)
        if gauge is None:
            doc = CATALOGUE[s.name].help if s.name in CATALOGUE else s.name
            gauge = gauges[s.name] = Gauge(s.name, doc, list(s.labels), registry=registry)
        gauge.labels(**s.labels).set(s.value)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        return time_scrapes(int(server.server_address[1]), repeats)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def main() -> int:
    p = common.parser(__doc__ or "")
    p.add_argument("--nodes", type=int, default=79)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    repeats = max(7, args.repeats)
    jobs = fleet(args.nodes, args.gpus)
    rounds = [[s for job in jobs for s in job.samples_at(i)] for i in range(ROUNDS)]
    series = len(rounds[0])
    common.progress(f"{args.nodes} nodes x {args.gpus} GPUs x {len(jobs[0].series.metrics)} fields = {series} series")
    common.progress("scraping the lean exporter ...")
    lean_s, render_s, lean_body = lean(rounds, repeats)
    common.progress("scraping the prometheus-client baseline ...")
    base_s, base_body = baseline(rounds[0], repeats)
    read = parse_exposition(lean_body.decode())
    if len(read.samples) != series or read.warnings:
        common.progress(
            f"the lean exporter served {len(read.samples)} of {series} series, {len(read.warnings)} warnings"
        )
        return 1
    if base_body.count(b"\nDCGM_FI_") != series:
        common.progress("the baseline did not serve every series")
        return 1
    speedup = common.ratio(base_s, lean_s)
    ok = lean_s <= TARGET_SCRAPE_S
    rows = [
        ["prometheus-client start_http_server (baseline)", f"{base_s * 1e3:.1f} ms", "1.00x", ""],
        ["ExpositionServer + DcgmRenderer", f"{lean_s * 1e3:.1f} ms", f"{speedup:.2f}x", "<= 50 ms"],
        ["  of which rendering (info)", f"{render_s * 1e3:.1f} ms", "", ""],
    ]
    table = common.format_table(
        f"HTTP scrape of {series} DCGM series ({len(lean_body) / 1e6:.1f} MB), median of {repeats}",
        ["endpoint", "scrape", "speed-up", "target"],
        rows,
    )
    result = {
        "series": series,
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "repeats": repeats,
        "bytes": len(lean_body),
        "lean_scrape_s": lean_s,
        "lean_render_s": render_s,
        "baseline_scrape_s": base_s,
        "speedup": common.finite_or_none(speedup),
        "target_s": TARGET_SCRAPE_S,
        "ok": ok,
    }
    verdict = f"lean scrape {lean_s * 1e3:.1f} ms (<= 50 ms), {speedup:.2f}x faster than prometheus-client"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main())
