"""Cost of the Prometheus exporter: per training step, and per scrape of 10,000 series.

    .venv/bin/python bench/metrics_overhead.py [--json] [--steps 60] [--series 10000]

1. The exporter is an event listener: everything it adds to a step is one call per logged event.
   The script times the tiny-LM training step (batch 32, context 64, one thread) and, in the same
   run, the listener's work for one step event (gauge updates); overhead = listener / step, for
   the worst case where every step is logged (``GPUFLEET_LOG_EVERY_S=0``). Target <= 1 %.
2. A registry with ``--series`` labelled series is served on 127.0.0.1 and scraped over HTTP
   like Prometheus does; the median scrape time has a target of <= 50 ms, and is shown beside
   the time to render the same text without HTTP.
"""

from __future__ import annotations

import sys
import time
import urllib.request

import _common as common
import torch

from gpufleet.telemetry.metrics import JobMetrics
from gpufleet.workloads.tinylm import build

TARGET_OVERHEAD = 0.01
TARGET_SCRAPE_S = 0.050
LABELS = {
    "job_id": "1",
    "job_name": "lm",
    "team": "perception",
    "attempt": "1",
    "backend": "local",
    "backend_job_id": "",
    "gpu_type": "A100",
    "provider": "local",
}


def step_seconds(steps: int) -> float:
    torch.set_num_threads(1)
    corpus, model, optimizer, schedule = build(
        seed=1, context=64, layers=2, heads=4, embed=128, dropout=0.1, lr=3e-3, steps=steps * 2
    )
    times = []
    for position in range(steps + 5):
        started = time.perf_counter()
        x, y = corpus.batch("train", position, 32, 64, 1)
        _, loss = model(x, y)
        assert loss is not None
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        times.append(time.perf_counter() - started)
    return common.median(times[5:])


def listener_seconds(calls: int = 20_000) -> float:
    metrics = JobMetrics(LABELS)
    event = {"kind": "step", "step": 1, "loss": 2.0, "tokens_per_s": 1000.0, "mfu": 0.3}
    started = time.perf_counter()
    for i in range(calls):
        event["step"] = i
        metrics(event)
    return (time.perf_counter() - started) / calls


def scrape_seconds(series: int, repeats: int = 7) -> tuple[float, float]:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest, start_http_server

    registry = CollectorRegistry()
    gauge = Gauge("dcgm_like_series", "A gauge with many label sets.", ["gpu", "job_id"], registry=registry)
    for i in range(series):
        gauge.labels(gpu=str(i % 8), job_id=str(i)).set(i)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    port = server.server_address[1]
    http, render = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            body = response.read()
        http.append(time.perf_counter() - started)
        started = time.perf_counter()
        generate_latest(registry)
        render.append(time.perf_counter() - started)
    server.shutdown()
    assert body.count(b"dcgm_like_series{") == series
    return common.median(http), common.median(render)


def main() -> int:
    p = common.parser(__doc__ or "")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--series", type=int, default=10_000)
    args = p.parse_args()
    common.progress("timing training steps ...")
    step = step_seconds(args.steps)
    listener = listener_seconds()
    overhead = listener / step
    common.progress(f"timing scrapes of {args.series} series ...")
    http, render = scrape_seconds(args.series)
    ok = overhead <= TARGET_OVERHEAD and http <= TARGET_SCRAPE_S
    rows = [
        ["tiny-LM step (baseline)", f"{step * 1e3:.2f} ms", "", ""],
        ["exporter work per step event", f"{listener * 1e6:.1f} us", f"{overhead:.4%}", "<= 1%"],
        [f"HTTP scrape of {args.series} series", f"{http * 1e3:.1f} ms", "", "<= 50 ms"],
        ["  of which rendering (info)", f"{render * 1e3:.1f} ms", "", ""],
    ]
    table = common.format_table("Prometheus exporter cost", ["what", "time", "of a step", "target"], rows)
    result = {
        "step_s": step,
        "listener_s": listener,
        "overhead": overhead,
        "scrape_s": http,
        "render_s": render,
        "series": args.series,
        "ok": ok,
    }
    verdict = f"overhead {overhead:.4%} (<= 1%), scrape {http * 1e3:.1f} ms (<= 50 ms)"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main())
