"""What data staging adds to gpufleet: the payloads of its two events and the exporter's staging gauges.

``data_staged`` and ``data_stage_failed`` stay members of :class:`~gpufleet.jobs.events.EventKind`: the
core reads them too (the cost ledger's staging bucket, the trace's staging span, ``gpufleet watch``).
What only staging knows, their fields and the gauges made from them, is declared here. Data staging
adds nothing to a job's view: its events are listed among the notable ones.

Registered on import (:mod:`gpufleet.features` lists this module); imports neither fsspec nor pyarrow.
"""

from __future__ import annotations

from typing import Any

from gpufleet.jobs.events import EventKind
from gpufleet.jobs.features import EventType, Feature, MetricFamily, Number, Payload, from_field, register

DATA_STAGED = str(EventKind.DATA_STAGED)
DATA_STAGE_FAILED = str(EventKind.DATA_STAGE_FAILED)


class DataStaged(Payload):
    """``data_staged`` (:meth:`gpufleet.data.stage.StageReport.to_json`): the attempt's data, staged in."""

    seconds: Number | None = None
    workers: Number | None = None
    files: Number | None = None
    bytes: Number | None = None
    files_copied: Number | None = None
    bytes_copied: Number | None = None
    files_reused: Number | None = None
    """Files found already staged and verified, not copied again."""
    copy_bytes_per_s: Number | None = None
    sources: list[dict[str, Any]] | None = None


class DataStageFailed(Payload):
    """``data_stage_failed``: the file staging stopped at, and why; the attempt exits without training."""

    error: str | None = None
    file: str | None = None
    seconds: Number | None = None


def _gauge(name: str, doc: str, key: str) -> MetricFamily:
    """A staging gauge; a report without ``key`` sets it to 0 (nothing copied, nothing reused)."""
    return MetricFamily(name=name, type="gauge", help=doc, kind=DATA_STAGED, values=from_field(key, missing=0.0))


FEATURE = register(
    Feature(
        name="data",
        events=(
            EventType(
                kind=DATA_STAGED,
                doc="An attempt's data was staged in before its first step: seconds, files and bytes copied, reused.",
                payload=DataStaged,
                notable=True,
            ),
            EventType(
                kind=DATA_STAGE_FAILED,
                doc="Staging the data failed (the file and why); the attempt exits without training.",
                payload=DataStageFailed,
                notable=True,
            ),
        ),
        metrics=(
            _gauge(
                "gpufleet_data_stage_seconds",
                "Seconds this attempt spent staging its data in before the first step.",
                "seconds",
            ),
            _gauge(
                "gpufleet_data_staged_bytes", "Bytes this attempt's staging copied (0: all reused).", "bytes_copied"
            ),
            _gauge(
                "gpufleet_data_reused_files", "Files this attempt's staging found verified and reused.", "files_reused"
            ),
            _gauge(
                "gpufleet_data_stage_bytes_per_second",
                "Copy throughput of this attempt's staging (0 when it copied nothing).",
                "copy_bytes_per_s",
            ),
        ),
    )
)

__all__ = ["DATA_STAGED", "DATA_STAGE_FAILED", "FEATURE", "DataStageFailed", "DataStaged"]
