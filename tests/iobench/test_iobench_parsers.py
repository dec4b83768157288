"""fio's and iperf3's JSON reports (recorded from real runs in data/) read into reports; sizes as typed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpufleet.errors import ServiceUnavailable, UsageError
from gpufleet.iobench import (
    DISK_COLUMNS,
    NET_COLUMNS,
    DiskReport,
    format_bytes,
    parse_fio_json,
    parse_iperf3_json,
    parse_size,
)
from gpufleet.iobench.disk import file_system_type, io_mode, latency
from gpufleet.iobench.tools import json_object

DATA = Path(__file__).parent / "data"


def sample(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_fio_direct_libaio_random_read() -> None:
    version, test = parse_fio_json(sample("fio-randread-direct-libaio.json"), "randread")
    assert version == "fio-3.33"
    assert test.name == "randread"
    assert test.bytes_per_s == 329258524.0
    assert test.iops == pytest.approx(80385.38206)
    assert test.mean_latency_us == pytest.approx(194.080231071)  # clat, not lat (which adds submission)
    assert test.p99_latency_us == pytest.approx(268.288)
    assert (test.direct, test.block_bytes, test.iodepth) == (True, 4096, 16)


def test_fio_buffered_psync_sequential_write_reads_the_write_side() -> None:
    version, test = parse_fio_json(sample("fio-seqwrite-buffered-psync.json"), "seqwrite")
    assert version == "fio-3.33"
    assert test.bytes_per_s == 30297227481.0
    assert test.p99_latency_us == pytest.approx(61.184)
    assert (test.direct, test.block_bytes, test.iodepth) == (False, 1 << 20, 1)


def test_fio_warnings_before_the_report_are_skipped() -> None:
    text = "fio: note: both iodepth >= 1 and synchronous I/O engine are selected\n" + sample(
        "fio-seqwrite-buffered-psync.json"
    )
    assert parse_fio_json(text, "seqwrite")[1].iops == pytest.approx(28893.687708)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "fio printed no report of seqwrite: no output"),
        ("fio: pid=1, err=28/file:io_u.c:1845, func=io_u error, error=No space left on device", "No space left"),
        ('{"fio version": "fio-3.33", "jobs": []}', "no report of seqwrite"),
        ('{"jobs": [{"jobname": "seqwrite", "error": 28}]}', "No space left on device"),
        ('{"jobs": [{"jobname": "seqwrite", "error": 0, "write": {}}]}', "lacks 'bw_bytes'"),
    ],
)
def test_fio_report_without_a_result_is_refused(text: str, needle: str) -> None:
    with pytest.raises(UsageError, match=re.escape(needle)):
        parse_fio_json(text, "seqwrite")


def test_fio_report_of_another_job_is_refused() -> None:
    with pytest.raises(UsageError, match="no report of seqread"):
        parse_fio_json(sample("fio-seqwrite-buffered-psync.json"), "seqread")


def test_iperf3_two_streams() -> None:
    report = parse_iperf3_json(sample("iperf3-client-2-streams.json"), host="127.0.0.1", port=5201, loopback=True)
    assert report.iperf3_version == "iperf 3.12"
    assert (report.streams, report.seconds, report.reverse, report.loopback) == (2, 1.0, False, True)
    assert report.sender_bytes_per_s == pytest.approx(26234209291.07476 / 8)
    assert report.receiver_bytes_per_s == pytest.approx(26232924448.247013 / 8)
    assert report.sender_gbit_per_s == pytest.approx(26.23420929107476)
    assert report.retransmits == 12
    assert report.local_cpu_percent == pytest.approx(92.2668980619315)
    assert report.remote_cpu_percent == pytest.approx(51.072314914857486)
    assert [row[0] for row in report.rows()] == ["sent", "received"]
    assert all(len(row) == len(NET_COLUMNS) for row in report.rows())
    body = json.loads(json.dumps(report.to_json()))
    assert body["receiver_gbit_per_s"] == pytest.approx(report.receiver_gbit_per_s)
    assert body["host"] == "127.0.0.1" and body["port"] == 5201


def test_iperf3_reverse() -> None:
    report = parse_iperf3_json(sample("iperf3-client-reverse.json"), host="10.0.0.7", port=5201, loopback=False)
    assert report.reverse is True and report.streams == 1 and report.loopback is False
    assert report.remote_cpu_percent == pytest.approx(99.3835373381248)


def test_iperf3_refused_names_host_port_and_the_server_to_start() -> None:
    with pytest.raises(ServiceUnavailable) as caught:
        parse_iperf3_json(sample("iperf3-client-refused.json"), host="10.0.0.7", port=5202, loopback=False)
    message = str(caught.value)
    assert "10.0.0.7:5202" in message and "iperf3 -s -p 5202" in message and "refused" in message


@pytest.mark.parametrize(
    ("error", "needle"),
    [
        ("unable to connect to server: Connection timed out", "cannot reach 10.0.0.7:5201"),
        ("unable to connect to server: No route to host", "cannot reach 10.0.0.7:5201"),
        ("unable to connect to server: Name or service not known", "cannot resolve the host '10.0.0.7'"),
        ("the server is busy running a test. try again later", "busy"),
        ("some new error\nwith a second line", "failed: some new error"),
    ],
)
def test_iperf3_errors_say_what_to_do(error: str, needle: str) -> None:
    text = json.dumps({"start": {}, "end": {}, "error": error})
    with pytest.raises(ServiceUnavailable, match=re.escape(needle)) as caught:
        parse_iperf3_json(text, host="10.0.0.7", port=5201, loopback=False)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text", ["", "iperf3: error - not json", '{"start": {}, "end": {}}', "[1, 2]"])
def test_iperf3_without_a_result_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match=re.escape("10.0.0.7:5201")):
        parse_iperf3_json(text, host="10.0.0.7", port=5201, loopback=False)


def test_json_object_finds_the_first_object() -> None:
    assert json_object('noise { not json\n{"a": 1} tail') == {"a": 1}
    assert json_object("no object") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256MiB", 256 << 20),
        ("1GiB", 1 << 30),
        ("512M", 512 << 20),
        ("512m", 512 << 20),
        ("4096", 4096),
        ("8 MiB", 8 << 20),
        ("1.5K", 1536),
        ("2Gi", 2 << 30),
        ("1MB", 1_000_000),
        ("10B", 10),
        (" 1KiB ", 1024),
        ("2e9", 2_000_000_000),
        ("2.5e3", 2500),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    ["10 potatoes", "0", "-1", "", "1e400", "-2GB", "MiB", "1iB", "nan", "\u0661\u0662", "9" * 5000, "0.0001K", "2PiB"],
)
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--size ") as caught:
        parse_size(text, "--size")
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 256 << 20, 3 << 39, 5 << 50)] == [
        "0 B",
        "1023 B",
        "1 KiB",
        "256 MiB",
        "1.5 TiB",
        "5120 TiB",
    ]


def test_latency_cells() -> None:
    assert [latency(v) for v in (None, 12.4, 1740.0, 2_100_000.0, float("nan"))] == [
        "",
        "12 µs",
        "1.74 ms",
        "2.1 s",
        "",
    ]


def test_io_mode_says_why_it_is_buffered() -> None:
    assert io_mode(None, True, "ext4") == "direct (O_DIRECT)"
    assert io_mode(None, False, "tmpfs") == "buffered (O_DIRECT refused by tmpfs)"
    assert io_mode(False, False, "ext4") == "buffered (as asked)"


def test_disk_report_rows_and_json() -> None:
    _, write = parse_fio_json(sample("fio-seqwrite-buffered-psync.json"), "seqwrite")
    _, read = parse_fio_json(sample("fio-randread-direct-libaio.json"), "randread")
    report = DiskReport("/data", "ext4", "fio-3.33", "psync", False, "buffered (as asked)", 8 << 20, 1.0, (write, read))
    assert report.seq_write_bytes_per_s == write.bytes_per_s
    assert report.seq_read_bytes_per_s is None  # no seqread among the tests
    assert report.rows()[0] == ("seqwrite", "30,297.2", "28,894", "25 µs", "61 µs")
    assert all(len(row) == len(DISK_COLUMNS) for row in report.rows())
    body = json.loads(json.dumps(report.to_json()))
    assert [t["name"] for t in body["tests"]] == ["seqwrite", "randread"]
    assert body["seq_write_bytes_per_s"] == write.bytes_per_s and body["fs_type"] == "ext4"


def test_file_system_type() -> None:
    assert file_system_type(Path("/proc/self")) == "proc"
    assert file_system_type(Path(__file__).parent) not in ("", "unknown")
