"""GPU sources (NVML through a fake pynvml, a dcgm-exporter scrape, a live synthetic job), the log, the sampler."""

from __future__ import annotations

import itertools
import json
import logging
import math
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpufleet.errors import UsageError
from gpufleet.telemetry.dcgm import Sample, ScrapeResult, ScrapeWarning
from gpufleet.telemetry.exporter import ExpositionServer
from gpufleet.telemetry.gpu import (
    CHUNK_S,
    ENERGY,
    PROFILING_FIELDS,
    SOURCE_ERROR,
    UNAVAILABLE,
    GpuRecorder,
    GpuSampler,
    NvmlSource,
    ScrapeSource,
    SyntheticSource,
    gpu_log_path,
    job_gpu_samples,
    open_source,
    read_gpu_log,
)
from gpufleet.telemetry.synthetic import SyntheticJobConfig, synthesize

# --- a fake pynvml -------------------------------------------------------------------------------


class NVMLError(Exception):
    """pynvml's base error; its subclasses name the NVML return code."""


@dataclass
class FakeGpu:
    uuid: str
    name: str | bytes
    bus_id: str
    util: int
    mem_util: int
    used_bytes: int
    free_bytes: int
    power_mw: int
    temp_c: int
    sm_mhz: int
    events: int
    pcie_tx_kbs: int
    pcie_rx_kbs: int
    energy_mj: int


class FakeNvml:
    """The pynvml functions NvmlSource calls, over a table of GPUs; ``unsupported`` raise NVMLError."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def __init__(
        self, gpus: list[FakeGpu], *, unsupported: frozenset[tuple[int, str]] = frozenset(), old_driver: bool = False
    ) -> None:
        self.gpus, self.unsupported, self.old_driver = gpus, unsupported, old_driver
        self.inits = self.shutdowns = 0
        self.event_calls: list[str] = []

    def _gpu(self, h: int, call: str) -> FakeGpu:
        if (h, call) in self.unsupported:
            raise NVMLError("Not Supported")
        return self.gpus[h]

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._gpu(h, "uuid").uuid

    def nvmlDeviceGetName(self, h: int) -> str | bytes:
        return self._gpu(h, "name").name

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._gpu(h, "pci").bus_id.encode())

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        g = self._gpu(h, "util")
        return SimpleNamespace(gpu=g.util, memory=g.mem_util)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        g = self._gpu(h, "memory")
        return SimpleNamespace(used=g.used_bytes, free=g.free_bytes, total=g.used_bytes + g.free_bytes)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h, "power").power_mw

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._gpu(h, "temp").temp_c

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return self._gpu(h, "clock").sm_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        self.event_calls.append("event")
        if self.old_driver:
            raise NVMLError("Function Not Found")
        return self._gpu(h, "events").events

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        self.event_calls.append("throttle")
        return self._gpu(h, "events").events

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        g = self._gpu(h, "pcie")
        return g.pcie_tx_kbs if counter == self.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_kbs

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return self._gpu(h, "energy").energy_mj


class BrokenNvml(FakeNvml):
    def nvmlInit(self) -> None:
        raise NVMLError("Driver Not Loaded")


MIB = 1024 * 1024
GPUS = [
    FakeGpu("GPU-aaaa", "NVIDIA H100 80GB HBM3", "00000000:18:00.0", 97, 40, 60_000 * MIB, 21_559 * MIB, 650_500,
            71, 1980, 0x4, 1000, 2000, 5_000_000),
    FakeGpu("GPU-bbbb", b"NVIDIA H100 80GB HBM3", "00000000:2A:00.0", 12, 3, 1_000 * MIB, 80_559 * MIB, 90_250,
            40, 345, 0x1, 10, 20, 7_000_000),
]  # fmt: skip


def expected_fields(g: FakeGpu) -> dict[str, float]:
    return {
        "DCGM_FI_DEV_GPU_UTIL": g.util,
        "DCGM_FI_DEV_MEM_COPY_UTIL": g.mem_util,
        "DCGM_FI_DEV_FB_USED": g.used_bytes / MIB,
        "DCGM_FI_DEV_FB_FREE": g.free_bytes / MIB,
        "DCGM_FI_DEV_POWER_USAGE": g.power_mw / 1000,
        "DCGM_FI_DEV_GPU_TEMP": g.temp_c,
        "DCGM_FI_DEV_SM_CLOCK": g.sm_mhz,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": g.events,
        "DCGM_FI_PROF_PCIE_TX_BYTES": g.pcie_tx_kbs * 1024,
        "DCGM_FI_PROF_PCIE_RX_BYTES": g.pcie_rx_kbs * 1024,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": g.energy_mj,
    }


def by_gpu(result: ScrapeResult) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for s in result.samples:
        out.setdefault(s.labels["gpu"], {})[s.name] = s.value
    return out


def test_nvml_maps_fields_and_labels_like_dcgm_exporter() -> None:
    fake = FakeNvml(GPUS)
    source = NvmlSource(job_id="42", hostname="node-7", nvml=fake)
    first = source.read()
    assert by_gpu(first) == {str(i): expected_fields(g) for i, g in enumerate(GPUS)}
    for s in first.samples:
        g = GPUS[int(s.labels["gpu"])]
        assert s.labels == {
            "gpu": s.labels["gpu"],
            "UUID": g.uuid,
            "pci_bus_id": g.bus_id,
            "device": f"nvidia{s.labels['gpu']}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "hostname": "node-7",
            "hpc_job": "42",
        }
        assert s.timestamp_ms is not None
    assert first.types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    # the profiling fields are said to be missing once, and never invented
    assert [w.kind for w in first.warnings] == [UNAVAILABLE]
    assert all(f in first.warnings[0].message for f in PROFILING_FIELDS)
    assert not any(s.name in PROFILING_FIELDS or s.name == "DCGM_FI_DEV_XID_ERRORS" for s in first.samples)
    assert source.read().warnings == ()
    source.close()
    source.close()
    assert (fake.inits, fake.shutdowns) == (1, 1)


def test_nvml_unsupported_field_is_skipped_for_that_gpu_only() -> None:
    fake = FakeNvml(GPUS, unsupported=frozenset({(1, "power"), (1, "pcie")}))
    source = NvmlSource(nvml=fake, hostname="h")
    first, second = source.read(), source.read()
    gpu1 = set(expected_fields(GPUS[1])) - {
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    }
    assert set(by_gpu(second)["1"]) == gpu1
    assert by_gpu(second)["0"] == expected_fields(GPUS[0])
    errors = [w.message for w in first.warnings if w.kind == SOURCE_ERROR]
    assert len(errors) == 3 and all(m.startswith("GPU 1:") for m in errors)
    assert second.warnings == ()  # once per GPU and field
    assert all("hpc_job" not in s.labels for s in second.samples)


def test_nvml_old_driver_falls_back_to_throttle_reasons() -> None:
    fake = FakeNvml(GPUS[:1], old_driver=True)
    result = NvmlSource(nvml=fake).read()
    assert by_gpu(result)["0"]["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == GPUS[0].events
    assert fake.event_calls == ["event", "throttle"]


def test_nvml_chosen_indices_and_bad_ones() -> None:
    source = NvmlSource(nvml=FakeNvml(GPUS), indices=[1])
    assert {s.labels["UUID"] for s in source.read().samples} == {"GPU-bbbb"}
    fake = FakeNvml(GPUS)
    with pytest.raises(UsageError, match=r"\[5\]"):
        NvmlSource(nvml=fake, indices=[5])
    assert fake.shutdowns == 1
    with pytest.raises(UsageError, match="NVML did not start"):
        NvmlSource(nvml=BrokenNvml(GPUS))
    with pytest.raises(UsageError, match="among the 0"):
        NvmlSource(nvml=FakeNvml([]))


def test_open_source_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert open_source("none") is None
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(GPUS))
    auto = open_source("auto", job_id="3")
    assert isinstance(auto, NvmlSource) and auto.description == "nvml"
    assert {s.labels["hpc_job"] for s in auto.read().samples} == {"3"}
    assert isinstance(open_source("nvml"), NvmlSource)
    monkeypatch.setitem(sys.modules, "pynvml", BrokenNvml(GPUS))
    assert open_source("auto") is None
    with pytest.raises(UsageError, match="no NVIDIA driver"):
        open_source("nvml")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]))
    assert open_source("auto") is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert open_source("auto") is None
    with pytest.raises(UsageError, match=r"gpufleet\[gpu\]"):
        open_source("nvml")

    synthetic = open_source("synthetic:memory_bound", job_id="12", gpus=0, sample_seconds=2.5, hostname="box")
    assert isinstance(synthetic, SyntheticSource) and synthetic.description == "synthetic:memory_bound"
    assert synthetic.config.step_s == 2.5 and synthetic.config.gpus == 1
    labels = synthetic.read().samples[0].labels
    assert labels["hpc_job"] == "12" and labels["hostname"] == "box" and labels["gpu"] == "0"
    scrape = open_source("scrape:http://127.0.0.1:9/metrics", job_id="12")
    assert isinstance(scrape, ScrapeSource) and scrape.job_id == "12"
    assert scrape.description == "scrape:http://127.0.0.1:9/metrics"
    for bad in ("synthetic:nope", "dcgm", "scrape:ftp://x"):
        with pytest.raises(UsageError):
            open_source(bad)


# --- scraping dcgm-exporter ----------------------------------------------------------------------


def exporter_text(energy: int, pcie: int) -> str:
    return f"""# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",Hostname="n1",hpc_job="7"}} 97
DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-b",Hostname="n1",hpc_job="7"}} 95
DCGM_FI_DEV_GPU_UTIL{{gpu="2",UUID="GPU-c",Hostname="n1",hpc_job="8"}} 10
DCGM_FI_DEV_GPU_UTIL{{gpu="3",UUID="GPU-d",Hostname="n1",exported_pod="7"}} 50
DCGM_FI_DEV_BRAND_NEW{{gpu="0",UUID="GPU-a",Hostname="n1",hpc_job="7"}} 1
DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="GPU-a",hpc_job="7" 60
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0",UUID="GPU-a",Hostname="n1",hpc_job="7"}} {energy}
# TYPE DCGM_FI_PROF_PCIE_TX_BYTES counter
DCGM_FI_PROF_PCIE_TX_BYTES{{gpu="0",UUID="GPU-a",Hostname="n1",hpc_job="7"}} {pcie}
# TYPE go_goroutines gauge
go_goroutines 12
"""


@pytest.fixture
def exporter() -> Iterator[tuple[str, list[str], ExpositionServer]]:
    """A local endpoint serving whatever text is last in the list."""
    texts = [exporter_text(energy=5000, pcie=900)]
    server = ExpositionServer(lambda: texts[-1].encode())
    port = server.start()
    yield f"http://127.0.0.1:{port}/metrics", texts, server
    server.close()


def kinds(result: ScrapeResult) -> list[str]:
    return sorted(w.kind for w in result.warnings)


def test_scrape_keeps_this_jobs_dcgm_samples_and_warns(exporter: tuple[str, list[str], ExpositionServer]) -> None:
    url, texts, server = exporter
    source = ScrapeSource(url, job_id="7")
    first = source.read()
    util = {s.labels["gpu"]: s.value for s in first.samples if s.name == "DCGM_FI_DEV_GPU_UTIL"}
    assert util == {"0": 97, "1": 95, "3": 50}  # GPU 2 runs job 8; GPU 3 is a Kubernetes pod named 7
    names = {s.name for s in first.samples}
    assert "go_goroutines" not in names and "DCGM_FI_DEV_BRAND_NEW" in names
    assert all(s.timestamp_ms is not None and s.labels.get("hostname") == "n1" for s in first.samples)
    assert kinds(first) == ["broken_line", "unknown_metric"]
    assert "DCGM_FI_DEV_BRAND_NEW" in next(w.message for w in first.warnings if w.kind == "unknown_metric")
    assert first.warnings[0].line == 8 or first.warnings[1].line == 8  # line numbers of the original text

    texts.append(exporter_text(energy=100, pcie=10))  # exporter restarted; PCIe is a rate, not a counter
    second = source.read()
    assert kinds(second) == ["broken_line", "counter_reset"]
    reset = next(w.message for w in second.warnings if w.kind == "counter_reset")
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in reset and "PCIE" not in reset

    server.close()
    down = source.read()
    assert down.samples == () and [w.kind for w in down.warnings] == [SOURCE_ERROR]
    assert url in down.warnings[0].message


def test_scrape_without_job_keeps_every_gpu_and_flags_a_job_with_no_gpus(
    exporter: tuple[str, list[str], ExpositionServer],
) -> None:
    url, _, _ = exporter
    util = [s for s in ScrapeSource(url).read().samples if s.name == "DCGM_FI_DEV_GPU_UTIL"]
    assert sorted(s.labels["gpu"] for s in util) == ["0", "1", "2", "3"]
    other = ScrapeSource(url, job_id="99")
    first, second = other.read(), other.read()
    assert first.samples == () and "missing_label" in kinds(first) and "'99'" in first.warnings[-1].message
    assert "missing_label" not in kinds(second)
    with pytest.raises(UsageError, match="not http"):
        ScrapeSource("file:///etc/passwd")


# --- the synthetic job, live ---------------------------------------------------------------------


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def values(result: ScrapeResult) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels["gpu"]): s.value for s in result.samples}


CONFIG = SyntheticJobConfig(pattern="comm_bound", gpus=2, step_s=1.0, seed=3, job="", hostname="laptop")


def test_synthetic_source_follows_the_clock() -> None:
    clock = FakeClock()
    t0 = clock.now
    source = SyntheticSource(CONFIG, clock=clock)
    offline = synthesize(replace(CONFIG, duration_s=CHUNK_S))
    first = source.read()
    assert {(s.name, s.labels["gpu"]): s.value for s in offline.samples_at(0)} == values(first)
    assert {s.timestamp_ms for s in first.samples} == {round(t0 * 1000)}
    assert all("hpc_job" not in s.labels for s in first.samples)  # no job id, no empty label
    clock.now = t0 + 5.7
    later = source.read()
    assert values(later) == {(s.name, s.labels["gpu"]): s.value for s in offline.samples_at(5)}
    assert {s.timestamp_ms for s in later.samples} == {round((t0 + 5) * 1000)}
    clock.now = t0 - 100  # a clock stepping back never gives a negative index
    assert source.index() == 0


def test_synthetic_source_crosses_chunks_deterministically() -> None:
    clock = FakeClock()
    t0 = clock.now
    source = SyntheticSource(CONFIG, clock=clock)
    labels0 = [s.labels for s in source.read().samples]
    energy = []
    for i in (598, 599, 600, 601, 3 * 600 + 7):
        clock.now = t0 + i
        result = source.read()
        assert [s.labels for s in result.samples] == labels0  # same GPUs, same UUIDs
        energy.append([s.value for s in result.samples if s.name == ENERGY])
    assert all(a < b for earlier, later in itertools.pairwise(energy) for a, b in zip(earlier, later, strict=True))
    clock.now = t0 + 600 + 2
    in_chunk1 = values(source.read())
    chunk0 = {(s.name, s.labels["gpu"]): s.value for s in synthesize(replace(CONFIG, duration_s=CHUNK_S)).samples_at(2)}
    assert {k: v for k, v in in_chunk1.items() if k[0] != ENERGY} != {k: v for k, v in chunk0.items() if k[0] != ENERGY}

    twin_clock = FakeClock(t0)
    twin = SyntheticSource(CONFIG, clock=twin_clock)
    twin_clock.now = t0 + 600 + 2  # straight to chunk 1: the energy carried over must match too
    assert values(twin.read()) == in_chunk1
    other = SyntheticSource(replace(CONFIG, seed=4), clock=twin_clock)
    assert values(other.read()) != in_chunk1


def test_synthetic_source_step_size() -> None:
    clock = FakeClock()
    source = SyntheticSource(replace(CONFIG, step_s=5.0), clock=clock)
    clock.now += 14.9
    assert source.index() == 2
    clock.now += 0.1
    assert source.index() == 3


# --- the log -------------------------------------------------------------------------------------


def rounds(n: int, start: float = 1_700_000_000.0) -> list[ScrapeResult]:
    clock = FakeClock(start)
    source = SyntheticSource(replace(CONFIG, job="5"), clock=clock)
    out = []
    for _ in range(n):
        out.append(source.read())
        clock.now += 1
    return out


def key(s: Sample) -> tuple[str, tuple[tuple[str, str], ...], str, int | None]:
    return s.name, tuple(sorted(s.labels.items())), repr(s.value), s.timestamp_ms


def test_recorder_round_trip_with_torn_line_and_odd_values(tmp_path: Path) -> None:
    path = gpu_log_path(tmp_path / "jobs" / "5", 1)
    assert path == tmp_path / "jobs" / "5" / "gpu" / "attempt-1.jsonl"
    written = rounds(3)
    odd = ScrapeResult(
        (
            Sample("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "UUID": "GPU-x"}, math.inf, 1_700_000_010_000),
            Sample("DCGM_FI_DEV_POWER_USAGE", {"gpu": "0", "UUID": "GPU-x"}, -math.inf, 1_700_000_010_000),
            Sample("DCGM_FI_DEV_FB_USED", {"gpu": "0", "UUID": "GPU-x"}, 12.5, 1_700_000_010_500),
        ),
        (ScrapeWarning(SOURCE_ERROR, "partial round"),),
    )
    recorder = GpuRecorder(path, "synthetic:comm_bound")
    for r in [*written, odd]:
        recorder.write(r)
    recorder.close()
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["source"] == "synthetic:comm_bound"
    assert sum(1 for line in lines if '"series"' in line) == 2  # labels once per series
    assert json.loads(lines[-1])["w"] == [[SOURCE_ERROR, "partial round"]]
    expected = [key(s) for r in [*written, odd] for s in r.samples]
    assert [key(s) for s in read_gpu_log(path)] == expected

    with path.open("a") as f:  # a crash in the middle of a round
        f.write('{"t":1700000099000,"v":[[0,1.0],[1,')
    assert [key(s) for s in read_gpu_log(path)] == expected
    again = GpuRecorder(path, "synthetic:comm_bound")  # the same attempt's log, reopened
    more = rounds(1, start=1_700_000_500.0)
    again.write(more[0])
    again.close()
    headers = [line for line in path.read_text().splitlines() if line.startswith('{"gpufleet_gpu_log"')]
    assert len(headers) == 2  # the second writer's header is on a line of its own
    assert [key(s) for s in read_gpu_log(path)] == expected + [key(s) for s in more[0].samples]
    with pytest.raises(ValueError, match="closed"):
        again.write(more[0])


def test_reader_skips_bad_lines(tmp_path: Path) -> None:
    """Including a value whose series only an earlier writer declared: each writer numbers afresh."""
    path = tmp_path / "log.jsonl"
    path.write_text(
        "\n".join(
            [
                '{"gpufleet_gpu_log":1,"source":"x"}',
                "not json",
                "[1, 2]",
                '{"series":[[0,"DCGM_FI_DEV_GPU_UTIL",{"gpu":"0"}],["bad"]]}',
                '{"t":1000,"v":[[0,50],[7,1.0],[0,"lots"],"x",[0,true]]}',
                '{"t":"late","v":[[0,1]]}',
                '{"gpufleet_gpu_log":1,"source":"x"}',
                '{"t":2000,"v":[[0,60]]}',
            ]
        )
        + "\n"
    )
    assert [key(s) for s in read_gpu_log(path)] == [("DCGM_FI_DEV_GPU_UTIL", (("gpu", "0"),), "50.0", 1000)]


def test_job_gpu_samples_in_attempt_order(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "5"
    per_attempt = {n: rounds(2, start=1_700_000_000.0 + 1000 * n) for n in (10, 1, 2)}
    for n, written in per_attempt.items():
        recorder = GpuRecorder(gpu_log_path(job, n), "synthetic:comm_bound")
        for r in written:
            recorder.write(r)
        recorder.close()
    (job / "gpu" / "attempt-x.jsonl").write_text("ignored\n")
    samples = job_gpu_samples(job)
    assert [s.labels["attempt"] for s in samples] == [
        str(n) for n in (1, 2, 10) for r in per_attempt[n] for _ in r.samples
    ]
    assert [s.value for s in samples] == [s.value for n in (1, 2, 10) for r in per_attempt[n] for s in r.samples]
    assert job_gpu_samples(tmp_path / "nothing") == []
    with pytest.raises(UsageError):
        gpu_log_path(job, 0)


# --- the sampler ---------------------------------------------------------------------------------


class CountingSource:
    description = "counting"

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.reads = fail, 0

    def read(self) -> ScrapeResult:
        self.reads += 1
        if self.fail:
            raise RuntimeError("sensor fell off")
        return ScrapeResult(
            (Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "UUID": "GPU-0"}, float(self.reads), 1000 * self.reads),), ()
        )

    def close(self) -> None:
        pass


def after(n: int) -> tuple[threading.Event, Callable[[ScrapeResult], None]]:
    done, seen = threading.Event(), []

    def on_round(result: ScrapeResult) -> None:
        seen.append(result)
        if len(seen) >= n:
            done.set()

    return done, on_round


def test_sampler_records_rounds_and_stops_promptly(tmp_path: Path) -> None:
    source = CountingSource()
    recorder = GpuRecorder(tmp_path / "gpu.jsonl", source.description)
    done, on_round = after(3)
    sampler = GpuSampler(source, 0.01, recorder=recorder, on_round=on_round)
    assert sampler.latest() is None
    sampler.start()
    assert done.wait(30)
    sampler.close()
    assert not sampler._thread.is_alive()
    latest = sampler.latest()
    assert latest is not None and latest.samples[0].value == source.reads
    assert [s.value for s in read_gpu_log(tmp_path / "gpu.jsonl")] == [float(i) for i in range(1, source.reads + 1)]
    with pytest.raises(ValueError, match="closed"):  # close() closed the recorder too
        recorder.write(source.read())

    idle = GpuSampler(CountingSource(), 3600.0)  # a long period: stop must not wait it out
    idle.start()
    idle.stop(timeout=10)
    assert not idle._thread.is_alive()
    with pytest.raises(UsageError):
        GpuSampler(source, 0)


def test_sampler_survives_a_failing_source(caplog: pytest.LogCaptureFixture) -> None:
    source = CountingSource(fail=True)
    sampler = GpuSampler(source, 0.01)
    with caplog.at_level(logging.WARNING, logger="gpufleet.telemetry.gpu"):
        sampler.start()
        for _ in range(3000):
            if sampler.errors >= 3:
                break
            threading.Event().wait(0.01)
        sampler.stop()
    assert sampler.errors >= 3 and sampler.latest() is None
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1


def test_sampler_survives_a_failing_callback() -> None:
    calls: list[Any] = []

    def on_round(result: ScrapeResult) -> None:
        calls.append(result)
        raise OSError("disk full")

    sampler = GpuSampler(CountingSource(), 0.01, on_round=on_round)
    sampler.start()
    for _ in range(3000):
        if len(calls) >= 3:
            break
        threading.Event().wait(0.01)
    sampler.stop()
    assert len(calls) >= 3 and sampler.errors >= 3
