"""TCP throughput between this machine and another, measured with iperf3: what a data or checkpoint transfer can get.

With a host, only the iperf3 client runs here, against an ``iperf3 -s`` the user started on that
host (port 5201 unless told). Without one, a one-off server (``iperf3 -s -1``) is started on
127.0.0.1 and measured over loopback: that measures the kernel's TCP stack and memory copies on
this machine, not a network card, a switch or a link; it is an upper bound a real link will not
reach, useful to check that the tool works and that the CPU is not the limit.

iperf3 reports the bytes the sender sent and the receiver received per second over the test
(``sum_sent`` / ``sum_received``), the sender's TCP retransmits (a sign of loss or congestion; Linux
only) and the CPU each side used (a side near 100% means the CPU, not the link, was the limit: try
``streams`` > 1). ``reverse`` makes the server send and this machine receive.

The one-off server is ready once it prints "Server listening": it is not probed with a TCP connect,
because a one-off server takes any connection as its one test and then refuses the real client. It
is stopped by its PID (terminate, then kill) whatever happens.

Limits: one TCP test of a few seconds; a link shared with other traffic, or a cloud network's burst
allowance, gives different numbers from run to run: compare the medians of several runs.
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import IO, Any

from gpufleet.errors import ParameterError, ServiceUnavailable, UsageError
from gpufleet.iobench.tools import IPERF3_HINT, json_object, last_line, require_tool

DEFAULT_PORT = 5201
"""iperf3's own default port."""
MAX_SECONDS = 3600
MAX_STREAMS = 128
"""iperf3's limit on ``-P``."""
CONNECT_TIMEOUT_MS = 5000
SERVER_START_S = 10.0
"""Safety bound on the one-off server's start (it prints "Server listening" within milliseconds)."""
NET_COLUMNS = ("direction", "Gb/s", "MB/s", "retransmits")
"""The header of :meth:`NetReport.rows`; Gb is 10**9 bits and MB 10**6 bytes, as network links are rated."""
_HOST_RE = re.compile(r"[A-Za-z0-9_.:%-]{1,253}")
"""A host name, an IPv4 address or an IPv6 one without brackets (``fe80::1%eth0``), as iperf3 -c takes it."""

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class NetReport:
    """What :func:`measure_net` measured."""

    host: str
    port: int
    loopback: bool
    """Whether this machine started the server on 127.0.0.1 (a loopback test, no network involved)."""
    iperf3_version: str
    seconds: float
    streams: int
    reverse: bool
    """Whether the server sent and this machine received."""
    sender_bytes_per_s: float
    receiver_bytes_per_s: float
    retransmits: int | None
    """The sender's TCP retransmits over the test; ``None`` where iperf3 cannot read them (not Linux)."""
    local_cpu_percent: float | None
    remote_cpu_percent: float | None

    @property
    def sender_gbit_per_s(self) -> float:
        return self.sender_bytes_per_s * 8 / 1e9

    @property
    def receiver_gbit_per_s(self) -> float:
        return self.receiver_bytes_per_s * 8 / 1e9

    def rows(self) -> list[tuple[str, str, str, str]]:
        """Two rows under :data:`NET_COLUMNS`: what the sender sent and what the receiver received."""
        retransmits = "" if self.retransmits is None else f"{self.retransmits:,}"
        return [
            ("sent", f"{self.sender_gbit_per_s:.2f}", f"{self.sender_bytes_per_s / 1e6:,.1f}", retransmits),
            ("received", f"{self.receiver_gbit_per_s:.2f}", f"{self.receiver_bytes_per_s / 1e6:,.1f}", ""),
        ]

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-ready mapping (Gb/s included)."""
        body = asdict(self)
        body["sender_gbit_per_s"] = self.sender_gbit_per_s
        body["receiver_gbit_per_s"] = self.receiver_gbit_per_s
        return body


def measure_net(
    host: str | None = None,
    *,
    port: int | None = None,
    seconds: float = 3.0,
    streams: int = 1,
    reverse: bool = False,
    progress: Progress | None = None,
) -> NetReport:
    """Run one iperf3 TCP test against ``host``'s ``iperf3 -s``, or over loopback against a server started here.

    ``ParameterError`` (naming the parameter) for a bad host, port, duration or stream count;
    ``UsageError`` when iperf3 is missing or the server cannot be reached (naming host:port and
    saying to start ``iperf3 -s`` there).
    """
    _check_parameters(host, port, seconds, streams)
    iperf3 = require_tool("iperf3", IPERF3_HINT)
    if host is not None:
        where = port or DEFAULT_PORT
        if progress is not None:
            progress(f"iperf3: {seconds:g} s to {host}:{where}")
        return _client(iperf3, host, where, seconds, streams, reverse, loopback=False)
    with loopback_server(iperf3, port) as server:
        if progress is not None:
            progress(f"iperf3: {seconds:g} s over loopback (127.0.0.1:{server.port})")
        return _client(iperf3, "127.0.0.1", server.port, seconds, streams, reverse, loopback=True)


def _check_parameters(host: str | None, port: int | None, seconds: float, streams: int) -> None:
    if host is not None and (not _HOST_RE.fullmatch(host) or host.startswith("-")):
        raise ParameterError(
            "{host} is not a host name or IP address: give the machine running `iperf3 -s` (e.g. 10.0.0.7)", host=host
        )
    if port is not None and not 1 <= port <= 65535:
        raise ParameterError("{port} must be from 1 to 65535 (iperf3 -s listens on 5201)", port=port)
    if not (1 <= seconds <= MAX_SECONDS and float(seconds).is_integer()):  # NaN too
        raise ParameterError(
            f"{{seconds}} must be a whole number of seconds from 1 to {MAX_SECONDS}: iperf3 counts whole seconds",
            seconds=seconds,
        )
    if not 1 <= streams <= MAX_STREAMS:
        raise ParameterError(f"{{streams}} must be from 1 to {MAX_STREAMS} (iperf3's limit)", streams=streams)


def _client(
    iperf3: str, host: str, port: int, seconds: float, streams: int, reverse: bool, *, loopback: bool
) -> NetReport:
    argv = [iperf3, "-c", host, "-p", str(port), "-t", str(int(seconds)), "-P", str(streams), "-J"]
    argv += ["--connect-timeout", str(CONNECT_TIMEOUT_MS), *(["-R"] if reverse else [])]
    timeout = seconds + 30 + CONNECT_TIMEOUT_MS / 1000
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ServiceUnavailable(
            f"iperf3 to {host}:{port} did not finish within {timeout:.0f} s: is `iperf3 -s -p {port}` "
            f"on {host} busy or stuck? restart it"
        ) from None
    return parse_iperf3_json(proc.stdout or proc.stderr, host=host, port=port, loopback=loopback)


def parse_iperf3_json(text: str, *, host: str, port: int, loopback: bool) -> NetReport:
    """A :class:`NetReport` from the client's ``iperf3 -J`` report; ``ServiceUnavailable`` (exit 3) for a
    report of an error: a refused or timed-out connection names ``host:port`` and says to start ``iperf3 -s`` there.
    """
    report = json_object(text)
    if report is None:
        raise UsageError(f"iperf3 to {host}:{port} printed no JSON report: {last_line(text) or 'no output'}")
    error = report.get("error")
    if error:
        raise ServiceUnavailable(_why(str(error), host, port))
    start, end = report.get("start", {}), report.get("end", {})
    try:
        sent, received = end["sum_sent"], end["sum_received"]
        cpu = end.get("cpu_utilization_percent", {})
        test = start.get("test_start", {})
        retransmits = sent.get("retransmits")
        return NetReport(
            host=host,
            port=port,
            loopback=loopback,
            iperf3_version=str(start.get("version", "unknown")),
            seconds=float(test.get("duration", sent.get("seconds", 0))),
            streams=int(test.get("num_streams", 1)),
            reverse=bool(test.get("reverse", 0)),
            sender_bytes_per_s=float(sent["bits_per_second"]) / 8,
            receiver_bytes_per_s=float(received["bits_per_second"]) / 8,
            retransmits=None if retransmits is None else int(retransmits),
            local_cpu_percent=_optional_float(cpu.get("host_total")),
            remote_cpu_percent=_optional_float(cpu.get("remote_total")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise UsageError(f"iperf3's report from {host}:{port} lacks {err}: is this iperf3 3.x?") from None


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _why(error: str, host: str, port: int) -> str:
    """iperf3's error, said with what to do about it."""
    error = error.strip().splitlines()[0][:200] if error.strip() else "unknown error"
    start = f"start `iperf3 -s -p {port}` on {host} (or give the --port it listens on)"
    if "refused" in error.lower():
        return f"nothing accepts iperf3 connections on {host}:{port} (connection refused): {start}"
    if any(word in error.lower() for word in ("timed out", "no route", "unreachable")):
        return f"cannot reach {host}:{port} ({error}): check the address and firewalls, and {start}"
    if any(word in error.lower() for word in ("not known", "resolve", "name or service", "no address")):
        return f"cannot resolve the host {host!r} ({error}): give a host name or IP address this machine can resolve"
    if "busy" in error.lower():
        return f"the iperf3 server on {host}:{port} is busy with another test: try again when it is done"
    return f"iperf3 to {host}:{port} failed: {error}"


@dataclass(frozen=True, slots=True)
class LoopbackServer:
    """A running one-off iperf3 server: where it listens, and its process id."""

    port: int
    pid: int


@contextmanager
def loopback_server(iperf3: str, port: int | None = None, attempts: int = 3) -> Iterator[LoopbackServer]:
    """A one-off ``iperf3 -s -1`` on 127.0.0.1 (on ``port``, else a free one), ready to take one test.

    On leaving, the server is stopped by its PID (it ends by itself after its test): terminate, then kill.
    """
    for attempt in range(1, attempts + 1):
        bound = port or _free_port()
        argv = [iperf3, "-s", "-1", "--bind", "127.0.0.1", "-p", str(bound), "--forceflush"]
        server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output = _ServerOutput(server.stdout)
        try:
            if output.ready.wait(SERVER_START_S) and not output.ended:
                yield LoopbackServer(bound, server.pid)
                return
            why = output.last() or f'no "Server listening" within {SERVER_START_S:g} s'
            if port is None and "in use" in why and attempt < attempts:
                continue  # another program took the free port first: take another
            raise UsageError(f"the loopback iperf3 server did not start on 127.0.0.1:{bound}: {why}")
        finally:
            stop_process(server)
            output.close()


class _ServerOutput:
    """Reads the server's output to its end on a thread (a full pipe would stall it); ``ready`` once it listens."""

    def __init__(self, stream: IO[bytes] | None) -> None:
        self.ready = threading.Event()
        self.ended = False
        self._stream = stream
        self._lines: deque[str] = deque(maxlen=20)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for raw in self._stream or ():
                line = raw.decode("utf-8", "replace").strip()
                self._lines.append(line)
                if line.startswith("Server listening"):
                    self.ready.set()
        except (OSError, ValueError):  # the pipe closed under the reader
            pass
        finally:
            self.ended = not self.ready.is_set()
            self.ready.set()

    def last(self) -> str:
        return last_line("\n".join(line for line in self._lines if not line.startswith("---")))

    def close(self) -> None:
        """Once the server is gone: wait for the reader to see the end of its output, then close the pipe."""
        self._thread.join(timeout=5)
        if self._stream is not None and not self._thread.is_alive():
            self._stream.close()


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick); another program may take it before iperf3 does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], settle_s: float = 1.0, grace_s: float = 3.0) -> None:
    """Stop ``proc`` by its PID and reap it: ``settle_s`` to end by itself, then SIGTERM, then SIGKILL."""
    for step, wait_s in ((None, settle_s), (proc.terminate, grace_s), (proc.kill, None)):
        if proc.poll() is not None:
            return
        if step is not None:
            step()
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue


__all__ = [
    "DEFAULT_PORT",
    "NET_COLUMNS",
    "LoopbackServer",
    "NetReport",
    "loopback_server",
    "measure_net",
    "parse_iperf3_json",
    "stop_process",
]
