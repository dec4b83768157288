"""Cost of a job's Prometheus exporter: per training step, and per scrape of its endpoint.

    .venv/bin/python bench/metrics_overhead.py [--json] [--steps 60] [--gpus 8]

1. The exporter is an event listener: everything it adds to a step is one call per logged event.
   The script times the tiny-LM training step (batch 32, context 64, one thread) and, in the same
   run, the listener's work for one step event (gauge updates); overhead = listener / step, for
   the worst case where every step is logged (``GPUFLEET_LOG_EVERY_S=0``). Target <= 1 %.
2. One attempt's endpoint (its job metrics and a round of ``--gpus`` synthetic DCGM GPUs, as a
   job with ``telemetry.gpu_source`` serves them) is scraped over HTTP like Prometheus does; the
   median scrape has a target of <= 50 ms. A whole fleet's 10,000 DCGM series: bench/dcgm_scrape.py.
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


def scrape_seconds(gpus: int, repeats: int = 9) -> tuple[float, int]:
    """Median HTTP scrape of one attempt's endpoint: its job metrics plus a round of ``gpus`` synthetic GPUs."""
    from gpufleet.telemetry.gpu import GpuSampler, SyntheticSource
    from gpufleet.telemetry.metrics import serve
    from gpufleet.telemetry.synthetic import SyntheticJobConfig

    metrics = JobMetrics(LABELS, gpus=gpus, price_per_gpu_hour=2.0)
    sampler = GpuSampler(SyntheticSource(SyntheticJobConfig(gpus=gpus, job="1")), 0.05)
    sampler.start()
    while sampler.latest() is None:
        time.sleep(0.01)
    port = serve(metrics, 0, gpu=sampler)
    times, body = [], b""
    for _ in range(repeats + 1):
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            body = response.read()
        times.append(time.perf_counter() - started)
    sampler.close()
    assert metrics.server is not None
    metrics.server.close()
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    return common.median(times[1:]), series


def main() -> int:
    p = common.parser(__doc__ or "")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--gpus", type=int, default=8)
    args = p.parse_args()
    common.progress("timing training steps ...")
    step = step_seconds(args.steps)
    listener = listener_seconds()
    overhead = listener / step
    common.progress(f"timing scrapes of a job endpoint with {args.gpus} GPUs ...")
    http, series = scrape_seconds(args.gpus)
    ok = overhead <= TARGET_OVERHEAD and http <= TARGET_SCRAPE_S
    rows = [
        ["tiny-LM step (baseline)", f"{step * 1e3:.2f} ms", "", ""],
        ["exporter work per step event", f"{listener * 1e6:.1f} us", f"{overhead:.4%}", "<= 1%"],
        [f"HTTP scrape of the job endpoint ({series} series)", f"{http * 1e3:.1f} ms", "", "<= 50 ms"],
    ]
    table = common.format_table("Prometheus exporter cost", ["what", "time", "of a step", "target"], rows)
    result = {
        "step_s": step,
        "listener_s": listener,
        "overhead": overhead,
        "scrape_s": http,
        "series": series,
        "ok": ok,
    }
    verdict = f"overhead {overhead:.4%} (<= 1%), scrape {http * 1e3:.1f} ms (<= 50 ms)"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main())
