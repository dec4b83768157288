"""How fast a folder's disk writes and reads, measured with fio: what a checkpoint save or a data loader can expect.

Up to four fio runs, one after the other, on one test file in a fresh temporary folder under the
path (removed afterwards, also on Ctrl-C or an error):

* ``seqwrite`` / ``seqread``: sequential, in large blocks (1 MiB): a checkpoint save and restore;
* ``randwrite`` / ``randread``: random, in small blocks (4 KiB): a data loader reading many samples.

Each run is time-based: it goes over a file of ``size_bytes`` for ``runtime_s`` seconds, wrapping
around, and fio reports bytes/s, IOPS and the completion latency (mean and 99th percentile) of one
I/O (fio's ``clat``: from submission to completion).

The runs use direct I/O (``O_DIRECT``, fio's ``direct=1``) when the file system takes it: the page
cache is bypassed and the numbers are the device's. Some file systems refuse ``O_DIRECT`` (tmpfs
before Linux 6.6, overlayfs on older kernels, some FUSE and network file systems): there the runs are
buffered, writes end with an fsync (``end_fsync=1``, counted in the run's time) so that the data did
reach the file system, but reads may be served from memory; the report says which (``mode``). The
I/O engine is libaio with ``iodepth`` I/Os in flight where it works with direct I/O, else psync (one
I/O at a time).

Limits: one job and one file; a file much smaller than a checkpoint may fit a device's cache (a RAID
controller, a cloud disk's burst credits) and look faster than a 100 GB save will; shared and cloud
disks vary a lot between runs, so compare the medians of several runs, never one.
"""

from __future__ import annotations

import contextlib
import errno
import math
import mmap
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpufleet.errors import ParameterError, UsageError
from gpufleet.fmt import shown_path
from gpufleet.iobench.tools import FIO_HINT, json_object, last_line, require_tool
from gpufleet.units import MAX_SIZE, format_bytes

KiB = 1 << 10
MiB = 1 << 20
TESTS: dict[str, str] = {"seqwrite": "write", "seqread": "read", "randwrite": "randwrite", "randread": "randread"}
"""Test name -> fio's ``rw``; the sequential ones use ``block_seq``, the random ones ``block_rand``."""
MAX_RUNTIME_S = 3600.0
MIN_RUNTIME_S = 0.1
MAX_BLOCK = 64 * MiB
MAX_IODEPTH = 1024
DISK_COLUMNS = ("test", "MB/s", "IOPS", "mean latency", "p99 latency")
"""The header of :meth:`DiskReport.rows`; MB is 10**6 bytes, as fio and disk datasheets count."""

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class DiskTest:
    """One fio run, as fio reported it."""

    name: str
    """``seqwrite``, ``seqread``, ``randwrite`` or ``randread``."""
    bytes_per_s: float
    iops: float
    mean_latency_us: float
    """Mean completion latency of one I/O (fio's ``clat``), in microseconds."""
    p99_latency_us: float | None
    """99th percentile of the completion latency; ``None`` when fio reported no percentiles."""
    direct: bool
    """Whether the run used ``O_DIRECT`` (the page cache bypassed)."""
    block_bytes: int
    iodepth: int


@dataclass(frozen=True, slots=True)
class DiskReport:
    """What :func:`measure_disk` measured, and where."""

    path: str
    fs_type: str
    """The file system type of ``path`` (``ext4``, ``xfs``, ``tmpfs``...), ``unknown`` if it cannot be read."""
    fio_version: str
    ioengine: str
    direct: bool
    mode: str
    """``direct (O_DIRECT)``, or ``buffered (O_DIRECT refused by <fs type>)``: how to read the numbers."""
    size_bytes: int
    runtime_s: float
    tests: tuple[DiskTest, ...]

    def test(self, name: str) -> DiskTest | None:
        return next((t for t in self.tests if t.name == name), None)

    @property
    def seq_write_bytes_per_s(self) -> float | None:
        found = self.test("seqwrite")
        return None if found is None else found.bytes_per_s

    @property
    def seq_read_bytes_per_s(self) -> float | None:
        found = self.test("seqread")
        return None if found is None else found.bytes_per_s

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """One row a test under :data:`DISK_COLUMNS`: name, MB/s, IOPS, mean and p99 latency."""
        return [
            (
                t.name,
                f"{t.bytes_per_s / 1e6:,.1f}",
                f"{t.iops:,.0f}",
                latency(t.mean_latency_us),
                latency(t.p99_latency_us),
            )
            for t in self.tests
        ]

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-ready mapping (the conveniences included)."""
        body = asdict(self)
        body["tests"] = [asdict(t) for t in self.tests]
        body["seq_write_bytes_per_s"] = self.seq_write_bytes_per_s
        body["seq_read_bytes_per_s"] = self.seq_read_bytes_per_s
        return body


def latency(us: float | None) -> str:
    """A latency for a table cell: ``412 µs``, ``1.74 ms``, ``2.1 s``; empty when unknown."""
    if us is None or not math.isfinite(us):
        return ""
    if us < 1000:
        return f"{us:.0f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.3g} ms"
    return f"{us / 1e6:.3g} s"


def measure_disk(
    path: Path,
    *,
    size_bytes: int = 256 * MiB,
    runtime_s: float = 5.0,
    block_seq: int = 1 * MiB,
    block_rand: int = 4 * KiB,
    iodepth: int = 16,
    which: Sequence[str] = ("seqwrite", "seqread", "randwrite", "randread"),
    direct: bool | None = None,
    progress: Progress | None = None,
) -> DiskReport:
    """Run the fio tests ``which`` in a temporary folder under ``path`` and return what fio measured.

    ``UsageError`` for fio missing, ``path`` missing, not a folder, not writable or without
    ``size_bytes`` free; ``ParameterError`` (naming the parameter) for a bad size, runtime, block or
    test name. ``direct``: ``None`` uses ``O_DIRECT`` where the file system takes it, ``False`` never
    (the page cache's rate), ``True`` always (``UsageError`` where it is refused). ``progress`` gets a
    line before each run (``fio: seqwrite 1/4 (5 s)``).
    """
    _check_parameters(size_bytes, runtime_s, block_seq, block_rand, iodepth, which)
    fio = require_tool("fio", FIO_HINT)
    _check_folder(path)
    fs_type = file_system_type(path)
    _check_free_space(path, size_bytes)
    try:
        scratch = Path(tempfile.mkdtemp(prefix=".gpufleet-bench-", dir=path))
    except OSError as err:
        raise UsageError(
            f"cannot create a folder in {shown_path(path)}: {err.strerror}: give a folder you can write to"
        ) from None
    try:
        works = direct is not False and o_direct_works(scratch)
        if direct and not works:
            raise UsageError(f"{shown_path(path)} ({fs_type}) refuses O_DIRECT: measure it buffered, or another folder")
        engine = "libaio" if works and _libaio_works(fio, scratch) else "psync"
        mode = io_mode(direct, works, fs_type)
        runner = _FioRunner(fio, scratch, path, size_bytes, runtime_s, engine, works, iodepth)
        tests, version = [], ""
        for n, name in enumerate(which, 1):
            if progress is not None:
                progress(f"fio: {name} {n}/{len(which)} ({runtime_s:g} s)")
            block = block_seq if name.startswith("seq") else block_rand
            version, result = runner.run(name, block)
            tests.append(result)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return DiskReport(str(path), fs_type, version, engine, works, mode, size_bytes, runtime_s, tuple(tests))


def io_mode(asked: bool | None, works: bool, fs_type: str) -> str:
    """How the runs did their I/O, for the report: direct, or buffered and why."""
    if works:
        return "direct (O_DIRECT)"
    return "buffered (as asked)" if asked is False else f"buffered (O_DIRECT refused by {fs_type})"


def _check_parameters(
    size_bytes: int, runtime_s: float, block_seq: int, block_rand: int, iodepth: int, which: Sequence[str]
) -> None:
    if not 1 <= size_bytes <= MAX_SIZE:
        raise ParameterError(f"{{size_bytes}} must be from 1 byte to {format_bytes(MAX_SIZE)}", size_bytes=size_bytes)
    if not MIN_RUNTIME_S <= runtime_s <= MAX_RUNTIME_S:  # NaN too
        raise ParameterError(
            f"{{runtime_s}} must be from {MIN_RUNTIME_S:g} to {MAX_RUNTIME_S:g} seconds", runtime_s=runtime_s
        )
    for name, block in (("block_seq", block_seq), ("block_rand", block_rand)):
        if not (512 <= block <= MAX_BLOCK and block % 512 == 0):
            raise ParameterError(
                f"{{{name}}} must be a multiple of 512 bytes (direct I/O's sector) up to {format_bytes(MAX_BLOCK)}",
                **{name: block},
            )
        if block > size_bytes:
            raise ParameterError(
                f"{{size_bytes}} is smaller than one block ({{{name}}}): give at least {format_bytes(block)}",
                size_bytes=size_bytes,
                **{name: block},
            )
    if not 1 <= iodepth <= MAX_IODEPTH:
        raise ParameterError(f"{{iodepth}} must be from 1 to {MAX_IODEPTH}", iodepth=iodepth)
    unknown = [name for name in which if name not in TESTS]
    if unknown or not which or len(set(which)) != len(which):
        raise ParameterError(
            f"{{which}} must name each test at most once, from: {', '.join(TESTS)}", which=",".join(map(str, which))
        )


def _check_folder(path: Path) -> None:
    shown = shown_path(path)
    try:
        path.stat()
    except FileNotFoundError:
        raise UsageError(f"{shown} does not exist: give an existing folder on the disk to measure") from None
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UsageError(f"cannot use {shown}: {reason}: give an existing folder on the disk to measure") from None
    if not path.is_dir():
        raise UsageError(f"{shown} is not a folder: give a folder on the disk to measure")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{shown} is not writable: give a folder you can write to")


def _check_free_space(path: Path, size_bytes: int) -> None:
    try:
        free = shutil.disk_usage(path).free
    except OSError as err:
        raise UsageError(f"cannot read the free space of {shown_path(path)}: {err.strerror}") from None
    if free < size_bytes:
        raise ParameterError(
            f"{{size_bytes}} ({format_bytes(size_bytes)}) is more than the {format_bytes(free)} free under "
            f"{shown_path(path)}: free space or give a smaller size",
            size_bytes=size_bytes,
        )


def file_system_type(path: Path) -> str:
    """The type of the file system ``path`` is on, from the longest mount point above it in /proc/self/mountinfo."""
    try:
        real = os.path.realpath(path)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            lines = mounts.read().splitlines()
    except (OSError, ValueError):
        return "unknown"
    best, fs_type = -1, "unknown"
    for line in lines:
        fields, sep, rest = line.partition(" - ")
        parts = fields.split()
        if not sep or len(parts) < 5 or not rest.split():
            continue
        point = parts[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # the last of stacked mounts on one point is the visible one
            best, fs_type = len(point), rest.split()[0]
    return fs_type


def o_direct_works(folder: Path) -> bool:
    """Whether a file in ``folder`` can be opened with ``O_DIRECT`` and written one aligned page through it.

    tmpfs refuses the open (``EINVAL``); some file systems accept it and refuse the write, hence both.
    """
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    probe = folder / "o_direct_probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flag, 0o600)
    except OSError as err:
        if err.errno == errno.EINVAL:
            return False
        raise UsageError(f"cannot write in {shown_path(folder.parent)}: {err.strerror}") from None
    try:
        with mmap.mmap(-1, mmap.PAGESIZE) as page:  # page-aligned, as O_DIRECT needs
            os.write(fd, page)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise UsageError(f"cannot write in {shown_path(folder.parent)}: {err.strerror}") from None
        return False
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            probe.unlink()
    return True


def _libaio_works(fio: str, folder: Path) -> bool:
    """Whether fio's libaio engine runs here: listed by this fio, and one 4 KiB direct write goes through."""
    try:
        engines = subprocess.run(
            [fio, "--enghelp"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    if "libaio" not in engines.stdout.split():
        return False
    probe = folder / "libaio_probe"
    argv = [fio, "--name=probe", "--filename=libaio_probe", "--size=4096", "--bs=4096", "--rw=write"]
    argv += ["--ioengine=libaio", "--direct=1", "--iodepth=1", "--thread", "--output-format=json"]
    try:
        proc = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    report = json_object(proc.stdout)
    jobs = report.get("jobs") if report else None
    return proc.returncode == 0 and isinstance(jobs, list) and bool(jobs) and jobs[0].get("error") == 0


@dataclass(frozen=True, slots=True)
class _FioRunner:
    """Runs fio in ``folder`` on the file ``testfile``: a relative name, as fio reads ':' in a path as a list."""

    fio: str
    folder: Path
    path: Path
    size_bytes: int
    runtime_s: float
    engine: str
    direct: bool
    iodepth: int

    def argv(self, name: str, block: int) -> list[str]:
        rw = TESTS[name]
        depth = self.iodepth if self.engine == "libaio" else 1
        argv = [self.fio, "--output-format=json", f"--name={name}", "--filename=testfile"]
        argv += [f"--size={self.size_bytes}", f"--rw={rw}", f"--bs={block}", f"--ioengine={self.engine}"]
        argv += [f"--iodepth={depth}", f"--direct={int(self.direct)}", "--time_based=1"]
        argv += [f"--runtime={max(1, round(self.runtime_s * 1000))}ms", "--thread", "--randrepeat=0"]
        if not self.direct and rw.endswith("write"):
            argv.append("--end_fsync=1")
        return argv

    def run(self, name: str, block: int) -> tuple[str, DiskTest]:
        # A generous bound: laying out the file for a read at 10 MB/s, the run, an fsync.
        timeout = self.runtime_s + 120 + self.size_bytes / 10e6
        try:
            proc = subprocess.run(
                self.argv(name, block),
                cwd=self.folder,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise UsageError(
                f"fio {name} did not finish within {timeout:.0f} s in {shown_path(self.path)}: "
                "is the disk hanging (a network file system)? try a smaller size"
            ) from None
        if proc.returncode != 0:
            why = last_line(proc.stderr) or last_line(proc.stdout) or f"exit status {proc.returncode}"
            raise UsageError(f"fio {name} failed in {shown_path(self.path)}: {why}")
        return parse_fio_json(proc.stdout, name)


def parse_fio_json(text: str, name: str) -> tuple[str, DiskTest]:
    """fio's version and the result of job ``name`` from fio's ``--output-format=json`` report.

    ``UsageError`` when the report is not there or lacks the job, or the job ended with an error.
    """
    report = json_object(text)
    jobs = report.get("jobs") if report else None
    job = (
        next((j for j in jobs if isinstance(j, dict) and j.get("jobname") == name), None)
        if isinstance(jobs, list)
        else None
    )
    if report is None or job is None:
        raise UsageError(f"fio printed no report of {name}: {last_line(text) or 'no output'}")
    if job.get("error"):
        raise UsageError(f"fio {name} failed: error {job['error']} ({os.strerror(int(job['error']))})")
    options = job.get("job options", {})
    rw = str(options.get("rw", TESTS.get(name, "read")))
    side = job.get("write" if rw.endswith("write") else "read", {})
    clat = side.get("clat_ns", {})
    p99 = clat.get("percentile", {}).get("99.000000")
    try:
        result = DiskTest(
            name=name,
            bytes_per_s=float(side["bw_bytes"]),
            iops=float(side["iops"]),
            mean_latency_us=float(clat["mean"]) / 1000,
            p99_latency_us=None if p99 is None else float(p99) / 1000,
            direct=str(options.get("direct", "0")) == "1",
            block_bytes=int(options.get("bs", 0)),
            iodepth=int(options.get("iodepth", 1)),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"fio's report of {name} lacks {err}: is this fio 3.x?") from None
    return str(report.get("fio version", "unknown")), result


__all__ = [
    "DISK_COLUMNS",
    "TESTS",
    "DiskReport",
    "DiskTest",
    "file_system_type",
    "io_mode",
    "latency",
    "measure_disk",
    "o_direct_works",
    "parse_fio_json",
]
