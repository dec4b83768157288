"""How close staging comes to the two paths it is bound by: reading the source, and writing the disk.

:func:`measure_stage` stages a spec's ``data`` cold into a fresh folder (removed afterwards), and
measures in the same run the two ceilings of that copy:

* the **source read rate**: every listed file read through the same file system with the same number
  of workers, the bytes dropped (no hash, no write): the network to the store, and the store;
* the **disk's sequential write rate** in that folder, with fio (:func:`gpufleet.iobench.measure_disk`).

Staging cannot beat the slower of the two; its ratio to it is the staging's own overhead (hashing,
the temporary file, the fsync and rename that make a file verified, the manifest).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.data.stage import CHUNK, Listed, Progress, Stager, StageReport, list_source
from gpufleet.errors import UsageError
from gpufleet.fmt import shown_path
from gpufleet.spec import DataPolicy


@dataclass(frozen=True, slots=True)
class StageBench:
    stage: StageReport
    source_read_bytes_per_s: float
    disk_write_bytes_per_s: float | None
    disk: dict[str, Any] | None
    folder: str

    @property
    def stage_bytes_per_s(self) -> float:
        return self.stage.bytes_copied / self.stage.seconds if self.stage.seconds > 0 else 0.0

    @property
    def slower_path(self) -> tuple[str, float]:
        paths = [("source read", self.source_read_bytes_per_s)]
        if self.disk_write_bytes_per_s:
            paths.append(("disk sequential write", self.disk_write_bytes_per_s))
        return min(paths, key=lambda p: p[1])

    def ratio(self, rate: float | None) -> float | None:
        return self.stage_bytes_per_s / rate if rate else None

    def sentence(self) -> str:
        name, rate = self.slower_path
        parts = [f"stage-in ran at {self.stage_bytes_per_s / 1e6:,.0f} MB/s"]
        if self.disk_write_bytes_per_s:
            parts.append(f"{self.ratio(self.disk_write_bytes_per_s):.2f} of the disk's sequential write")
        parts.append(f"{self.ratio(self.source_read_bytes_per_s):.2f} of the source's read rate")
        return f"{', '.join(parts)}; the slower path is the {name} ({rate / 1e6:,.0f} MB/s)."

    def to_json(self) -> dict[str, Any]:
        name, rate = self.slower_path
        return {
            "folder": self.folder,
            "stage": self.stage.to_json(),
            "stage_bytes_per_s": self.stage_bytes_per_s,
            "source_read_bytes_per_s": self.source_read_bytes_per_s,
            "disk_write_bytes_per_s": self.disk_write_bytes_per_s,
            "slower_path": name,
            "ratio_to_slower_path": self.ratio(rate),
            "ratio_to_disk_write": self.ratio(self.disk_write_bytes_per_s),
            "ratio_to_source_read": self.ratio(self.source_read_bytes_per_s),
            "disk": self.disk,
        }


def read_rate(policy: DataPolicy) -> float:
    """Bytes/s of reading every file of every source with ``policy.workers`` readers, bytes dropped."""
    listings: list[tuple[Any, Listed]] = []
    for source in policy.sources:
        fs, listed = list_source(source)
        listings += [(fs, item) for item in listed]

    def read(job: tuple[Any, Listed]) -> int:
        fs, item = job
        n = 0
        with fs.open(item.path, "rb", block_size=CHUNK, cache_type="none") as src:
            while chunk := src.read(CHUNK):
                n += len(chunk)
        return n

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=policy.workers) as pool:
        total = sum(pool.map(read, listings))
    seconds = time.perf_counter() - started
    return total / seconds if seconds > 0 else 0.0


def stage_cold(policy: DataPolicy, folder: Path, progress: Progress | None = None) -> StageReport:
    """Stage ``policy`` into a fresh folder under ``folder`` (its shared sources into a fresh cache), then remove it."""
    if not folder.is_dir():
        raise UsageError(f"{shown_path(folder)} is not a folder: give the folder to stage into (--dir)")
    scratch = Path(tempfile.mkdtemp(prefix=".gpufleet-stage-bench-", dir=folder))
    try:
        return Stager(policy, scratch / "data", cache_root=scratch / "cache", progress=progress).run()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure_stage(
    policy: DataPolicy,
    folder: Path,
    *,
    disk_size_bytes: int = 256 << 20,
    disk_runtime_s: float = 5.0,
    with_disk: bool = True,
    progress: Progress | None = None,
    say: Any = None,
) -> StageBench:
    """Source read rate, a cold staging, and fio's sequential write in ``folder``, in that order."""
    if say is not None:
        say("reading the sources (no write)")
    source = read_rate(policy)
    if say is not None:
        say("staging cold")
    report = stage_cold(policy, folder, progress)
    disk, disk_rate = None, None
    if with_disk:
        from gpufleet.iobench import measure_disk

        found = measure_disk(
            folder, size_bytes=disk_size_bytes, runtime_s=disk_runtime_s, which=("seqwrite",), progress=say
        )
        disk, disk_rate = found.to_json(), found.seq_write_bytes_per_s
    return StageBench(
        stage=report,
        source_read_bytes_per_s=source,
        disk_write_bytes_per_s=disk_rate,
        disk=disk,
        folder=str(folder),
    )


__all__ = ["StageBench", "measure_stage", "read_rate", "stage_cold"]
