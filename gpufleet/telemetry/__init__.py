"""GPU telemetry: dcgm-exporter's metrics, a synthetic DCGM source, and diagnosis over the series.

``dcgm`` holds the field catalogue, the alias table and a tolerant Prometheus text-format reader;
``synthetic`` generates DCGM-shaped series for a job with a chosen bottleneck; ``diagnose`` turns a
job's series into findings with their evidence and sources.

Floor 5 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/.
"""

from __future__ import annotations

from gpufleet.telemetry.dcgm import (
    CATALOGUE,
    LABEL_ALIASES,
    METRIC_ALIASES,
    ClocksEventReason,
    CounterTracker,
    DcgmField,
    Sample,
    ScrapeResult,
    ScrapeWarning,
    parse_exposition,
    render_exposition,
)
from gpufleet.telemetry.diagnose import (
    RULES,
    DiagnosisConfig,
    Finding,
    JobContext,
    JobSeries,
    diagnose,
    series_from_samples,
)
from gpufleet.telemetry.synthetic import PATTERNS, SyntheticJob, SyntheticJobConfig, generate_samples, synthesize

__all__ = [
    "CATALOGUE",
    "LABEL_ALIASES",
    "METRIC_ALIASES",
    "PATTERNS",
    "RULES",
    "ClocksEventReason",
    "CounterTracker",
    "DcgmField",
    "DiagnosisConfig",
    "Finding",
    "JobContext",
    "JobSeries",
    "Sample",
    "ScrapeResult",
    "ScrapeWarning",
    "SyntheticJob",
    "SyntheticJobConfig",
    "diagnose",
    "generate_samples",
    "parse_exposition",
    "render_exposition",
    "series_from_samples",
    "synthesize",
]
