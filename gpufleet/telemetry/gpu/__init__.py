"""Where a job's GPU series come from (NVML, a dcgm-exporter scrape, a synthetic job), and their log.

Split by concern; every name below is importable from ``gpufleet.telemetry.gpu``:

- ``sources``: ``NvmlSource``, ``ScrapeSource``, ``SyntheticSource`` (each ``read()`` gives one
  round of DCGM-named samples with dcgm-exporter's labels) and ``open_source``, which turns the
  JobSpec's ``telemetry.gpu_source`` into one of them;
- ``log``: the per-attempt GPU log ``jobs/<id>/gpu/attempt-<N>.jsonl`` (its format, the
  ``GpuRecorder`` that appends rounds, and the readers);
- ``sampler``: ``GpuSampler``, which reads a source every few seconds in a daemon thread and hands
  each round to a ``GpuRecorder``.
"""

from __future__ import annotations

from gpufleet.telemetry.gpu.log import GpuRecorder, gpu_log_path, job_gpu_samples, read_gpu_log
from gpufleet.telemetry.gpu.sampler import GpuSampler
from gpufleet.telemetry.gpu.sources import (
    CHUNK_S,
    ENERGY,
    MAX_SCRAPE_BYTES,
    PROFILING_FIELDS,
    SOURCE_ERROR,
    UNAVAILABLE,
    GpuSource,
    NvmlSource,
    ScrapeSource,
    SyntheticSource,
    derive_seed,
    open_source,
)

__all__ = [
    "CHUNK_S",
    "ENERGY",
    "MAX_SCRAPE_BYTES",
    "PROFILING_FIELDS",
    "SOURCE_ERROR",
    "UNAVAILABLE",
    "GpuRecorder",
    "GpuSampler",
    "GpuSource",
    "NvmlSource",
    "ScrapeSource",
    "SyntheticSource",
    "derive_seed",
    "gpu_log_path",
    "job_gpu_samples",
    "open_source",
    "read_gpu_log",
]
