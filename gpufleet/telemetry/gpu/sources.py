"""Where a job's GPU series come from: NVML, a dcgm-exporter scrape, a synthetic job.

Every source answers one question, ``read()``: the GPUs' state now, as one round of DCGM-named
``Sample``s with dcgm-exporter's labels (``gpu``, ``UUID``, ``device``, ``modelName``,
``pci_bus_id``, ``hostname``, ``hpc_job``) and a timestamp. So the recorder, the exporter and
``diagnose`` never ask which source they read. A source never raises on a bad round: what went
wrong is a ``ScrapeWarning`` and the round carries whatever could be read.

=================  ===========================================================================
``NvmlSource``     polls NVML (pynvml) on this host: utilisation, memory, power, temperature,
                   clocks and their event reasons, PCIe rates, energy. Not the profiling fields.
``ScrapeSource``   GETs a node's dcgm-exporter ``/metrics``, keeps this job's ``DCGM_FI_*``.
``SyntheticSource`` a synthetic job (``synthetic.py``) advancing in wall-clock time.
=================  ===========================================================================

``open_source`` turns the JobSpec's ``telemetry.gpu_source`` into one of them. Apart from the log
(``log``) and the thread that polls (``sampler``): a source only reads, it neither stores nor
schedules.
"""

from __future__ import annotations

import http.client
import logging
import math
import re
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from gpufleet.errors import UsageError
from gpufleet.spec.gpu_source import check_scrape_url
from gpufleet.telemetry.dcgm import (
    CATALOGUE,
    CounterTracker,
    Sample,
    ScrapeResult,
    ScrapeWarning,
    WarningKind,
    parse_exposition,
)
from gpufleet.telemetry.diagnose import FloatArray, JobSeries
from gpufleet.telemetry.synthetic import PATTERNS, SyntheticJob, SyntheticJobConfig, synthesize

log = logging.getLogger(__name__)

SOURCE_ERROR: WarningKind = "source_error"
"""A round (or one GPU's field) that could not be read: connection refused, an NVML call failed."""
UNAVAILABLE: WarningKind = "unavailable"
"""A field this kind of source cannot provide at all."""

PROFILING_FIELDS = (
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
)
MAX_SCRAPE_BYTES = 64 << 20


class GpuSource(Protocol):
    """One round of GPU samples on demand."""

    description: str
    """What is read, e.g. ``nvml``, ``synthetic:memory_bound``, ``scrape:http://host:9400/metrics``."""

    def read(self) -> ScrapeResult:
        """One round: DCGM-named samples with dcgm-exporter labels and ``timestamp_ms``; never raises."""
        ...

    def close(self) -> None: ...


def derive_seed(seed: int, *parts: int) -> int:
    """A seed for one part (a chunk, a node) of a seeded whole; stable across numpy versions."""
    return int(np.random.SeedSequence([seed, *parts]).generate_state(1, dtype=np.uint64)[0])


def now_ms() -> int:
    """Wall-clock time in whole milliseconds, as rounds and logs are stamped."""
    return round(time.time() * 1000)


def _types_of(samples: Iterable[Sample]) -> dict[str, str]:
    return {s.name: CATALOGUE[s.name].kind for s in samples if s.name in CATALOGUE}


# --- NVML ----------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _clock_events(nvml: Any, h: Any) -> float:
    """NVML >= 535 names them "clocks event reasons"; older drivers and bindings only "throttle"."""
    try:
        return float(nvml.nvmlDeviceGetCurrentClocksEventReasons(h))
    except (AttributeError, getattr(nvml, "NVMLError", AttributeError)):
        return float(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))


def _nvml_fields(nvml: Any) -> dict[str, Callable[[Any], Mapping[str, float]]]:
    """NVML queries and the DCGM fields each fills (one query can fill two, like memory info)."""
    temp_gpu = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
    clock_sm = getattr(nvml, "NVML_CLOCK_SM", 1)
    pcie_tx, pcie_rx = getattr(nvml, "NVML_PCIE_UTIL_TX_BYTES", 0), getattr(nvml, "NVML_PCIE_UTIL_RX_BYTES", 1)
    mib = 1024.0 * 1024.0

    def utilization(h: Any) -> Mapping[str, float]:
        rates = nvml.nvmlDeviceGetUtilizationRates(h)
        return {"DCGM_FI_DEV_GPU_UTIL": float(rates.gpu), "DCGM_FI_DEV_MEM_COPY_UTIL": float(rates.memory)}

    def memory(h: Any) -> Mapping[str, float]:
        info = nvml.nvmlDeviceGetMemoryInfo(h)
        return {"DCGM_FI_DEV_FB_USED": round(info.used / mib), "DCGM_FI_DEV_FB_FREE": round(info.free / mib)}

    return {
        "utilization": utilization,
        "memory": memory,
        "power": lambda h: {"DCGM_FI_DEV_POWER_USAGE": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0},
        "temperature": lambda h: {"DCGM_FI_DEV_GPU_TEMP": float(nvml.nvmlDeviceGetTemperature(h, temp_gpu))},
        "sm_clock": lambda h: {"DCGM_FI_DEV_SM_CLOCK": float(nvml.nvmlDeviceGetClockInfo(h, clock_sm))},
        "clock_events": lambda h: {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": _clock_events(nvml, h)},
        # NVML's PCIe counters are KB/s over a 20 ms window; DCGM's PROF_PCIE_* are bytes/s.
        "pcie_tx": lambda h: {"DCGM_FI_PROF_PCIE_TX_BYTES": nvml.nvmlDeviceGetPcieThroughput(h, pcie_tx) * 1024.0},
        "pcie_rx": lambda h: {"DCGM_FI_PROF_PCIE_RX_BYTES": nvml.nvmlDeviceGetPcieThroughput(h, pcie_rx) * 1024.0},
        "energy": lambda h: {
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": float(nvml.nvmlDeviceGetTotalEnergyConsumption(h))
        },
    }


def _import_pynvml() -> Any:
    try:
        import pynvml  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        raise UsageError(
            "gpu_source nvml needs pynvml: pip install 'gpufleet[gpu]' (nvidia-ml-py), or use gpu_source none"
        ) from None
    return pynvml


class NvmlSource:
    """This host's GPUs through NVML, under DCGM's field names.

    Read: ``DEV_GPU_UTIL``, ``DEV_MEM_COPY_UTIL``, ``DEV_FB_USED``/``FB_FREE`` (MiB),
    ``DEV_POWER_USAGE`` (W), ``DEV_GPU_TEMP``, ``DEV_SM_CLOCK`` (MHz), ``DEV_CLOCKS_EVENT_REASONS``,
    ``DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ), and NVML's PCIe throughput as ``PROF_PCIE_TX/RX_BYTES``.

    Not read: the profiling fields (``PROF_SM_ACTIVE``, ``SM_OCCUPANCY``, ``PIPE_TENSOR_ACTIVE``,
    ``DRAM_ACTIVE``, NVLink bytes) come from DCGM's profiling module, which NVML does not expose;
    the first round carries one ``unavailable`` warning saying so (run dcgm-exporter and use
    ``scrape:URL`` for them). XID errors arrive as NVML *events*, not a value to poll, so there is
    no ``DEV_XID_ERRORS`` either. A field a GPU does not support (an ``NVMLError``) is left out
    of that GPU's round with one warning, and the rest is read.
    """

    def __init__(
        self,
        *,
        job_id: str = "",
        hostname: str | None = None,
        indices: Sequence[int] | None = None,
        nvml: Any = None,
    ) -> None:
        self._nvml = nvml if nvml is not None else _import_pynvml()
        error = getattr(self._nvml, "NVMLError", OSError)
        try:
            self._nvml.nvmlInit()
        except error as err:
            raise UsageError(f"NVML did not start ({err}): no NVIDIA driver or GPU here; use gpu_source none") from None
        self._open = True
        self._error = error
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
            chosen = list(range(count)) if indices is None else list(indices)
            if not chosen or any(not 0 <= i < count for i in chosen):
                raise UsageError(f"GPU indices {chosen} are not among the {count} GPU(s) NVML sees")
            host = hostname if hostname is not None else socket.gethostname()
            handles = [(i, self._nvml.nvmlDeviceGetHandleByIndex(i)) for i in chosen]
            self._devices = [(h, self._labels(i, h, host, job_id)) for i, h in handles]
        except error as err:
            self.close()
            raise UsageError(f"NVML could not list the GPUs ({err}); use gpu_source none") from None
        except UsageError:
            self.close()
            raise
        self._fields = _nvml_fields(self._nvml)
        self._warned: set[tuple[str, str]] = set()
        self._first = True
        self.description = "nvml"

    def _labels(self, index: int, handle: Any, hostname: str, job_id: str) -> dict[str, str]:
        nvml = self._nvml

        def text(query: Callable[[], Any]) -> str:
            try:
                return _text(query())
            except (AttributeError, self._error):
                return ""  # left out below; parse_exposition flags a missing UUID

        labels = {
            "gpu": str(index),
            "UUID": text(lambda: nvml.nvmlDeviceGetUUID(handle)),
            "pci_bus_id": text(lambda: nvml.nvmlDeviceGetPciInfo(handle).busId),
            "device": f"nvidia{index}",
            "modelName": text(lambda: nvml.nvmlDeviceGetName(handle)),
            "hostname": hostname,
            "hpc_job": job_id,
        }
        return {k: v for k, v in labels.items() if v}

    def read(self) -> ScrapeResult:
        ts = now_ms()
        samples: list[Sample] = []
        warnings: list[ScrapeWarning] = []
        if self._first:
            self._first = False
            warnings.append(
                ScrapeWarning(
                    UNAVAILABLE,
                    f"NVML polling cannot read the DCGM profiling fields ({', '.join(PROFILING_FIELDS)}) "
                    "nor XID errors; use scrape:URL of a dcgm-exporter for them",
                )
            )
        for handle, labels in self._devices:
            for what, query in self._fields.items():
                try:
                    values = query(handle)
                except (AttributeError, self._error) as err:
                    if (labels["gpu"], what) not in self._warned:
                        self._warned.add((labels["gpu"], what))
                        warnings.append(
                            ScrapeWarning(SOURCE_ERROR, f"GPU {labels['gpu']}: NVML {what} not read ({err}); skipped")
                        )
                    continue
                samples.extend(Sample(name, dict(labels), float(v), ts) for name, v in values.items())
        return ScrapeResult(tuple(samples), tuple(warnings), _types_of(samples))

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except (AttributeError, getattr(self._nvml, "NVMLError", OSError)):
                log.debug("nvmlShutdown failed", exc_info=True)


# --- dcgm-exporter scrape ------------------------------------------------------------------------

_METRIC_NAME = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")


def _dcgm_lines_only(text: str) -> str:
    """Blank out samples of other metric families (go_*, process_*), keeping line numbers.

    Comments and lines that do not start with a metric name stay, so a broken line is still
    reported by ``parse_exposition``.
    """
    lines = text.splitlines()  # as parse_exposition splits, so its line numbers stay those of ``text``
    for i, line in enumerate(lines):
        m = _METRIC_NAME.match(line)
        if m and not m.group(1).startswith("DCGM_FI_"):
            lines[i] = ""
    return "\n".join(lines)


class ScrapeSource:
    """A dcgm-exporter's ``/metrics`` over HTTP, filtered to one job's GPUs.

    dcgm-exporter labels a GPU with the job using it as ``hpc_job`` (with its HPC job mapping) or,
    on Kubernetes, ``pod`` (``exported_pod`` once Prometheus has scraped it); ``LABEL_ALIASES``
    folds both spellings. With ``job_id`` set, only samples whose ``hpc_job`` or ``pod`` equals it
    are kept. Counters that go backwards between rounds (an exporter or driver restart) become
    ``counter_reset`` warnings; a failed request is a ``source_error`` warning and no samples.
    """

    def __init__(self, url: str, *, job_id: str | None = None, timeout: float = 5.0) -> None:
        try:
            check_scrape_url(url)
        except ValueError as err:
            raise UsageError(str(err)) from None
        self.url, self.job_id, self.timeout = url, job_id or None, timeout
        self.description = f"scrape:{url}"
        self._counters = CounterTracker()
        self._warned: set[str] = set()
        self._told_no_job = False

    def _fetch(self) -> str:
        with urllib.request.urlopen(self.url, timeout=self.timeout) as response:
            body: bytes = response.read(MAX_SCRAPE_BYTES + 1)
        if len(body) > MAX_SCRAPE_BYTES:
            raise ValueError(f"answer is larger than {MAX_SCRAPE_BYTES >> 20} MiB")
        return body.decode("utf-8", "replace")

    def read(self) -> ScrapeResult:
        ts = now_ms()
        try:
            text = self._fetch()
        except (OSError, ValueError, http.client.HTTPException) as err:  # refused, timeout, HTTP 5xx, too large
            return ScrapeResult((), (ScrapeWarning(SOURCE_ERROR, f"scrape of {self.url} failed: {err}; no samples"),))
        parsed = parse_exposition(_dcgm_lines_only(text), already_warned=self._warned)
        self._warned.update(s.name for s in parsed.samples if s.name not in CATALOGUE)
        warnings = list(parsed.warnings)
        dcgm = [s for s in parsed.samples if s.name.startswith("DCGM_FI_")]
        kept = dcgm if self.job_id is None else [s for s in dcgm if self._is_ours(s.labels)]
        if self.job_id is not None and dcgm and not kept and not self._told_no_job:
            self._told_no_job = True
            warnings.append(
                ScrapeWarning(
                    "missing_label",
                    f"no DCGM sample at {self.url} has hpc_job or pod {self.job_id!r} ({len(dcgm)} of other or "
                    "no jobs skipped); is dcgm-exporter's HPC job mapping set up on that node?",
                )
            )
        samples = [s if s.timestamp_ms is not None else replace(s, timestamp_ms=ts) for s in kept]
        # The catalogue's kinds win: some dcgm-exporter CSVs declare rates (PCIe, NVLink) "counter".
        types = {s.name: parsed.types[s.name] for s in samples if s.name in parsed.types}
        warnings += self._counters.observe(samples, {k: v for k, v in types.items() if k not in CATALOGUE})
        helps = {n: parsed.helps[n] for n in types if n in parsed.helps}
        return ScrapeResult(tuple(samples), tuple(warnings), types, helps)

    def _is_ours(self, labels: Mapping[str, str]) -> bool:
        return self.job_id in (labels.get("hpc_job"), labels.get("pod"))

    def close(self) -> None:
        pass


# --- synthetic -----------------------------------------------------------------------------------

CHUNK_S = 600.0
"""Seconds synthesized at a time: a multiple of the longest pattern period (comm_bound's 20 s)."""
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"


class SyntheticSource:
    """A synthetic job (``synthesize``) that advances with the clock, for laptops, demos and tests.

    The sample index is the time since construction divided by ``config.step_s``. Series are
    synthesized ``CHUNK_S`` at a time: chunk 0 from ``config.seed`` (so it equals the offline
    ``synthesize`` of the same config), chunk ``k`` from ``derive_seed(config.seed, k)``, so a job
    of any length has series and the same seed gives the same numbers. The GPU labels stay chunk
    0's, the energy counter carries on across chunks, and empty labels (no job id) are left out,
    as Prometheus treats them. Timestamps are the wall-clock time of the sample's index.
    """

    def __init__(self, config: SyntheticJobConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config, self._clock = config, clock
        self.description = f"synthetic:{config.pattern}"
        self._t0 = clock()
        self._per_chunk = max(1, round(CHUNK_S / config.step_s))
        self._lock = threading.Lock()
        self._energy_base: list[FloatArray] = [np.zeros(config.gpus)]
        first = self._synthesize(0)
        self._labels = tuple({k: v for k, v in labels.items() if v} for labels in first.gpu_labels)
        self._chunk = (0, self._with_energy_base(first, 0))

    def _synthesize(self, chunk: int) -> SyntheticJob:
        seed = self.config.seed if chunk == 0 else derive_seed(self.config.seed, chunk)
        return synthesize(replace(self.config, duration_s=self._per_chunk * self.config.step_s, seed=seed))

    def _with_energy_base(self, job: SyntheticJob, chunk: int) -> SyntheticJob:
        metrics = dict(job.series.metrics)
        metrics[ENERGY] = metrics[ENERGY] + self._energy_base[chunk][:, None]
        series = JobSeries(step_s=job.series.step_s, gpus=job.series.gpus, metrics=metrics)
        return SyntheticJob(config=job.config, series=series, gpu_labels=self._labels)

    def _job_for(self, chunk: int) -> SyntheticJob:
        if self._chunk[0] == chunk:
            return self._chunk[1]
        while len(self._energy_base) <= chunk:  # each chunk's energy starts where the previous ended
            k = len(self._energy_base) - 1
            ended = self._with_energy_base(self._synthesize(k), k) if k != self._chunk[0] else self._chunk[1]
            self._energy_base.append(np.asarray(ended.series.metrics[ENERGY][:, -1], dtype=np.float64))
        self._chunk = (chunk, self._with_energy_base(self._synthesize(chunk), chunk))
        return self._chunk[1]

    def index(self) -> int:
        """The sample index the clock is at now (0 before the start)."""
        return max(0, math.floor((self._clock() - self._t0) / self.config.step_s))

    def read(self) -> ScrapeResult:
        with self._lock:
            i = self.index()
            chunk, within = divmod(i, self._per_chunk)
            job = self._job_for(chunk)
        ts = round((self._t0 + i * self.config.step_s) * 1000)
        samples = tuple(Sample(s.name, s.labels, s.value, ts) for s in job.samples_at(within))
        return ScrapeResult(samples, (), _types_of(samples))

    def close(self) -> None:
        pass


# --- choosing a source ---------------------------------------------------------------------------


def open_source(
    spec: str,
    *,
    job_id: str = "",
    gpus: int = 1,
    sample_seconds: float = 5.0,
    hostname: str | None = None,
    seed: int = 0,
) -> GpuSource | None:
    """The source a JobSpec's ``telemetry.gpu_source`` names; ``None`` for ``none`` (or ``auto`` without a GPU)."""
    kind, _, arg = spec.partition(":")
    if spec == "none":
        return None
    if spec == "auto":
        try:
            return NvmlSource(job_id=job_id, hostname=hostname)
        except UsageError:
            return None
    if spec == "nvml":
        return NvmlSource(job_id=job_id, hostname=hostname)
    if kind == "synthetic":
        if arg not in PATTERNS:
            raise UsageError(f"unknown synthetic GPU pattern {arg!r} in {spec!r}; choose one of {', '.join(PATTERNS)}")
        config = SyntheticJobConfig(
            pattern=arg,
            gpus=max(1, gpus),
            step_s=sample_seconds,
            duration_s=max(sample_seconds, CHUNK_S),
            seed=seed,
            job=job_id,
            hostname=hostname if hostname is not None else socket.gethostname(),
        )
        return SyntheticSource(config)
    if kind == "scrape":
        return ScrapeSource(arg, job_id=job_id or None)
    raise UsageError(f"gpu_source {spec!r} is not one of: auto, none, nvml, synthetic:<pattern>, scrape:<http(s) url>")


__all__ = [
    "CHUNK_S",
    "ENERGY",
    "MAX_SCRAPE_BYTES",
    "PROFILING_FIELDS",
    "SOURCE_ERROR",
    "UNAVAILABLE",
    "GpuSource",
    "NvmlSource",
    "ScrapeSource",
    "SyntheticSource",
    "check_scrape_url",
    "derive_seed",
    "log",
    "now_ms",
    "open_source",
]
