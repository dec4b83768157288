"""Measure the disk and the network a training job depends on, with the standard tools (fio, iperf3).

A checkpoint save is bounded by the disk's sequential write rate, a restore by its read rate, a data
loader by small random reads, and a transfer between nodes by the network: :func:`measure_disk` and
:func:`measure_net` run fio and iperf3 (never through a shell), parse their JSON reports into frozen
values, and clean up what they start (the test file, the loopback server) whatever happens. Each
module's docstring says what exactly is measured and where the numbers stop meaning anything.

Floor 4 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/.
"""

from __future__ import annotations

from gpufleet.iobench.disk import DISK_COLUMNS, DiskReport, DiskTest, measure_disk, parse_fio_json
from gpufleet.iobench.net import NET_COLUMNS, NetReport, measure_net, parse_iperf3_json
from gpufleet.units import format_bytes, parse_size

__all__ = [
    "DISK_COLUMNS",
    "NET_COLUMNS",
    "DiskReport",
    "DiskTest",
    "NetReport",
    "format_bytes",
    "measure_disk",
    "measure_net",
    "parse_fio_json",
    "parse_iperf3_json",
    "parse_size",
]
