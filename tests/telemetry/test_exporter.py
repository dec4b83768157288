"""The lean DCGM exposition: rendering, the HTTP server, and `observe exporter` as a process."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.cli.observe import exporter_command
from gpufleet.errors import UsageError
from gpufleet.telemetry.dcgm import CATALOGUE, Sample, parse_exposition, render_exposition
from gpufleet.telemetry.exporter import CONTENT_TYPE, DcgmRenderer, ExpositionServer
from gpufleet.telemetry.metrics import JobMetrics
from gpufleet.telemetry.synthetic import SyntheticJobConfig, synthesize

REPO = Path(__file__).resolve().parents[2]


def job_round(index: int = 0, gpus: int = 2) -> list[Sample]:
    return synthesize(SyntheticJobConfig(pattern="host_bound", gpus=gpus, duration_s=20, seed=1)).samples_at(index)


def odd_samples() -> list[Sample]:
    return [
        Sample("DCGM_FI_DEV_GPU_TEMP", {"gpu": "9", "UUID": 'GPU-"q"\\back\nline', "modelName": "A,B=C"}, math.nan),
        Sample("DCGM_FI_DEV_POWER_USAGE", {"gpu": "9", "UUID": "GPU-9"}, math.inf),
        Sample("DCGM_FI_DEV_FB_FREE", {"gpu": "9", "UUID": "GPU-9"}, -math.inf),
        Sample("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", {"gpu": "9", "UUID": "GPU-9"}, 2.0**60),
        Sample("DCGM_FI_DEV_FB_USED", {"UUID": "GPU-9", "gpu": "9"}, -0.125),
        Sample("fleet_custom_total", {}, 3.0),
    ]


def key(s: Sample) -> tuple[str, tuple[tuple[str, str], ...], str]:
    return s.name, tuple(sorted(s.labels.items())), repr(s.value)


def test_render_round_trips_through_the_parser() -> None:
    renderer = DcgmRenderer()
    for index in (0, 7, 0):  # cold, then values change on cached series, then back
        samples = job_round(index) + odd_samples()
        parsed = parse_exposition(renderer.render(samples).decode())
        assert sorted(key(s) for s in parsed.samples) == sorted(key(s) for s in samples)
        assert all(s.timestamp_ms is None for s in parsed.samples)  # like dcgm-exporter
        assert [w.kind for w in parsed.warnings] == ["unknown_metric"]  # fleet_custom_total only
        assert parsed.types == {s.name: CATALOGUE[s.name].kind for s in samples if s.name in CATALOGUE}
        assert parsed.helps == {s.name: CATALOGUE[s.name].help for s in samples if s.name in CATALOGUE}
    assert renderer.render([]) == b""
    same = tuple(job_round(2))
    assert renderer.render(same) == renderer.render(same) == renderer.render(list(same))
    changed = (*same[:-1], Sample(same[-1].name, same[-1].labels, same[-1].value + 1))
    assert renderer.render(changed) != renderer.render(same)


def test_render_writes_each_family_once_in_one_block() -> None:
    samples = job_round(3, gpus=3)
    text = DcgmRenderer().render(list(reversed(samples))).decode()
    assert text.encode() == DcgmRenderer().render(list(reversed(samples)))
    families = [f.name for f in text_string_to_metric_families(text)]
    assert sorted(families) == sorted({s.name for s in samples})
    for name in families:
        assert text.count(f"# TYPE {name} ") == 1 and text.count(f"# HELP {name} ") == 1
    # same series and values as the reference renderer
    reference = parse_exposition(render_exposition(samples)).samples
    assert sorted(key(s) for s in parse_exposition(text).samples) == sorted(
        key(Sample(s.name, s.labels, s.value)) for s in reference
    )


def test_job_registry_plus_dcgm_round_is_one_valid_exposition() -> None:
    metrics = JobMetrics({"job_id": "7", "attempt": "1", "team": "vision"})
    metrics({"kind": "step", "step": 3, "loss": 2.0, "tokens_per_s": 10.0})
    samples = job_round(1)
    text = (generate_latest(metrics.registry) + DcgmRenderer().render(samples)).decode()
    families = [f.name for f in text_string_to_metric_families(text)]
    assert len(families) == len(set(families))
    assert {s.name for s in samples} <= set(families) and "gpufleet_job_step" in families
    dcgm = [s for f in text_string_to_metric_families(text) if f.name.startswith("DCGM_FI_") for s in f.samples]
    assert len(dcgm) == len(samples)


def test_label_cache_follows_changing_series() -> None:
    renderer = DcgmRenderer()
    a = [Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "UUID": "GPU-a", "hpc_job": "1"}, 5.0)]
    b = [Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "UUID": "GPU-a", "hpc_job": "2"}, 6.0)]
    assert parse_exposition(renderer.render(a).decode()).samples[0].labels["hpc_job"] == "1"
    again = parse_exposition(renderer.render(b).decode()).samples
    assert [(s.labels["hpc_job"], s.value) for s in again] == [("2", 6.0)]
    for i in range(3000):  # many short-lived series, then a small round: still right
        renderer.render([Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": str(i), "UUID": f"GPU-{i}"}, float(i))])
    assert parse_exposition(renderer.render(a).decode()).samples[0].value == 5.0
    assert renderer.cached_series < 3000  # the finished series were let go


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


def test_server_serves_metrics_404s_and_survives_a_failing_render() -> None:
    body = DcgmRenderer().render(job_round())
    failing = [False]

    def render() -> bytes:
        if failing[0]:
            raise RuntimeError("source broke")
        return body

    server = ExpositionServer(render)
    assert server.host == "127.0.0.1"
    port = server.start()
    try:
        assert get(f"http://127.0.0.1:{port}/metrics") == (200, CONTENT_TYPE, body)
        assert get(f"http://127.0.0.1:{port}/metrics?x=1")[0] == 200
        assert get(f"http://127.0.0.1:{port}/")[0] == 404
        assert get(f"http://127.0.0.1:{port}/metricsx")[0] == 404
        failing[0] = True
        status, _, text = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 500 and b"source broke" not in text
        failing[0] = False
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        with pytest.raises(UsageError, match=f"{port}"):
            ExpositionServer(render, port=port).start()
    finally:
        server.close()
    with pytest.raises(urllib.error.URLError):
        get(f"http://127.0.0.1:{port}/metrics")


# --- `observe exporter` ----------------------------------------------------------------------------

APP = """
import signal
import sys
import typer
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even when started in the background
from gpufleet.cli.observe import exporter_command
from gpufleet.errors import GpufleetError
app = typer.Typer(pretty_exceptions_enable=False)
app.command()(exporter_command)
try:
    app()
except GpufleetError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(err.exit_code)
"""


def start_exporter(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-c", APP, "--port", "0", "--port-file", str(port_file), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    deadline = time.monotonic() + 120
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"exporter did not start: {out} {err}")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_exporter_command_serves_nodes_and_exits_cleanly(tmp_path: Path, stop: signal.Signals) -> None:
    proc, port = start_exporter(tmp_path, "--pattern", "memory_bound", "--nodes", "2", "--gpus", "3", "--job", "j-1")
    try:
        status, content_type, body = get(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"http://127.0.0.1:{port}/metrics" in out
    assert (status, content_type) == (200, CONTENT_TYPE)
    parsed = parse_exposition(body.decode())
    assert parsed.warnings == ()
    gpus = {(s.labels["hostname"], s.labels["gpu"]) for s in parsed.samples}
    assert gpus == {(f"node-{n}", str(g)) for n in range(2) for g in range(3)}
    assert {s.labels["hpc_job"] for s in parsed.samples} == {"j-1"}
    assert len({s.labels["UUID"] for s in parsed.samples}) == 6
    fields = synthesize(SyntheticJobConfig(gpus=1, duration_s=1)).series.metrics
    assert {s.name for s in parsed.samples} == set(fields) and len(parsed.samples) == 6 * len(fields)
    dram = [s.value for s in parsed.samples if s.name == "DCGM_FI_PROF_DRAM_ACTIVE"]
    assert sum(dram) / len(dram) >= 0.8  # the memory_bound pattern


def test_exporter_command_bad_input() -> None:
    with pytest.raises(UsageError, match="nope"):
        exporter_command(pattern="nope")
    with pytest.raises(UsageError, match="step"):
        exporter_command(step_seconds=0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(UsageError, match="cannot listen"):
            exporter_command(gpus=1, port=taken.getsockname()[1])
