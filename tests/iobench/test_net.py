"""``measure_net`` and ``gpufleet bench net`` against the real iperf3, over loopback, one second a test."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import assert_refused, run_cli, service_missing

from gpufleet.errors import ParameterError, ServiceUnavailable, UsageError
from gpufleet.iobench import measure_net
from gpufleet.iobench.net import loopback_server
from gpufleet.iobench.tools import IPERF3_HINT


@pytest.fixture(scope="module")
def iperf3() -> str:
    """The real iperf3; the tests fail under CI (it must be installed there) and skip elsewhere without it."""
    found = shutil.which("iperf3")
    if found is None:
        service_missing("iperf3 is not installed: apt-get install iperf3")
    return found


def our_iperf3() -> list[int]:
    """PIDs of iperf3 processes this test process started and that still exist (zombies included)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        name, _, rest = stat.partition(") ")
        if name.endswith("(iperf3") and int(rest.split()[1]) == os.getpid():
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 where nothing listens: bound (so nobody else takes it) but not listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


def test_loopback(iperf3: str) -> None:
    said: list[str] = []
    report = measure_net(seconds=1, progress=said.append)
    assert report.loopback is True and report.host == "127.0.0.1" and 0 < report.port < 65536
    assert report.iperf3_version.startswith("iperf 3")
    assert (report.seconds, report.streams, report.reverse) == (1.0, 1, False)
    assert report.sender_bytes_per_s > 0 and report.receiver_bytes_per_s > 0
    assert report.local_cpu_percent is not None and report.remote_cpu_percent is not None
    assert said == [f"iperf3: 1 s over loopback (127.0.0.1:{report.port})"]
    assert our_iperf3() == []


def test_loopback_reverse_with_two_streams(iperf3: str) -> None:
    report = measure_net(seconds=1, streams=2, reverse=True)
    assert (report.streams, report.reverse) == (2, True)
    assert report.receiver_bytes_per_s > 0
    assert our_iperf3() == []


def test_server_is_stopped_by_its_pid_after_an_error(iperf3: str) -> None:
    with pytest.raises(RuntimeError), loopback_server(iperf3) as server:
        assert alive(server.pid) and server.pid in our_iperf3()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass  # it listens
        raise RuntimeError("the test failed half way")
    assert not alive(server.pid)
    assert our_iperf3() == []


def test_port_in_use_is_refused(iperf3: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with pytest.raises(UsageError, match=f"did not start on 127.0.0.1:{port}"):
            measure_net(port=port, seconds=1)
    assert our_iperf3() == []


def test_nothing_listening_names_host_port_and_iperf3_s(iperf3: str, closed_port: int) -> None:
    with pytest.raises(ServiceUnavailable) as caught:
        measure_net("127.0.0.1", port=closed_port, seconds=1)
    message = str(caught.value)
    assert f"127.0.0.1:{closed_port}" in message and f"iperf3 -s -p {closed_port}" in message


def test_missing_iperf3_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError) as caught:
        measure_net(seconds=1)
    assert str(caught.value) == IPERF3_HINT


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"seconds": 0}, "seconds=0"),
        ({"seconds": 1.5}, "whole number"),
        ({"seconds": float("nan")}, "seconds=nan"),
        ({"streams": 0}, "streams=0"),
        ({"streams": 129}, "streams=129"),
        ({"port": 0}, "port=0"),
        ({"port": 65536}, "port=65536"),
        ({"host": "-s"}, "host='-s'"),
        ({"host": ""}, "host=''"),
        ({"host": "a b"}, "host='a b'"),
    ],
)
def test_bad_parameters_are_named(kwargs: dict[str, object], needle: str) -> None:
    host = kwargs.pop("host", None)
    with pytest.raises(ParameterError, match=re.escape(needle)):
        measure_net(host, **kwargs)  # type: ignore[arg-type]


def test_cli_json(iperf3: str, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run_cli(capsys, monkeypatch, "bench", "net", "--seconds", "1", "--json")
    assert code == 0, err
    body = json.loads(out)
    assert body["loopback"] is True and body["sender_gbit_per_s"] > 0 and body["receiver_bytes_per_s"] > 0
    assert err == "" and not home.exists()
    assert our_iperf3() == []


def test_cli_table(
    iperf3: str, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(capsys, monkeypatch, "bench", "net", "--seconds", "1", "--streams", "2")
    assert code == 0, err
    assert "Gb/s" in out and "retransmits" in out and "(loopback)" in out and "2 stream(s)" in out
    assert "not a network card" in out
    assert our_iperf3() == []


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--seconds", "0"], ["--seconds 0", "whole number"]),
        (["--seconds", "1.5"], ["--seconds 1.5"]),
        (["--seconds", "inf"], ["--seconds inf"]),
        (["--streams", "0"], ["--streams 0"]),
        (["--port", "70000"], ["--port 70000"]),
        (["--host", "-s"], ["--host '-s'"]),
        (["--host", "[bold]x"], ["--host '[bold]x'"]),
        (["--seconds", "abc"], ["--seconds"]),
    ],
)
def test_cli_bad_options(
    iperf3: str,
    home: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    needles: list[str],
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "bench", "net", *args)
    assert_refused(code, err, home, *needles)
    assert our_iperf3() == []


def test_cli_unreachable_host(
    iperf3: str, home: Path, closed_port: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ("bench", "net", "--host", "127.0.0.1", "--port", str(closed_port), "--seconds", "1")
    code, out, err = run_cli(capsys, monkeypatch, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 3, (code, err)  # a service that does not answer, as Slurm or Ray
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"127.0.0.1:{closed_port}" in lines[0] and "iperf3 -s" in lines[0], lines[0]
    assert out == "" and not home.exists()
