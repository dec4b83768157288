"""DCGM rounds served as Prometheus text, fast enough for a fleet-sized scrape.

prometheus-client's ``generate_latest`` rebuilds every series' label text on every scrape (about
111 ms for 10,000 labelled series on the development machines); a Prometheus scrape of a node's
endpoint should take a small fraction of the scrape interval. Between two rounds a GPU's series
keep their labels and only the values move, so ``DcgmRenderer`` caches the label part of each
series (``name{gpu="0",UUID="GPU-..."}``) and a round becomes one string join of cached heads and
fresh values. ``bench/dcgm_scrape.py`` holds it to 50 ms for 10,000 series over HTTP.

The text follows dcgm-exporter's: ``# HELP`` and ``# TYPE`` from ``CATALOGUE`` once per metric,
samples grouped by metric, no timestamps (Prometheus stamps them at scrape time). A job's endpoint
can serve ``generate_latest(job_registry) + renderer.render(round)``: the job registry only has
``gpufleet_*`` families and the renderer only the round's ``DCGM_FI_*`` ones, each family in one
block, so the concatenation is one valid exposition.

``ExpositionServer`` serves any ``render()`` on ``/metrics`` (loopback by default), with a 500,
not a dead server, when rendering fails.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpufleet.errors import UsageError
from gpufleet.telemetry.dcgm import CATALOGUE, DcgmField, Sample

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value as exposition text: integers without ``.0``, ``NaN``, ``+Inf``, ``-Inf``."""
    v = float(value)
    if v.is_integer():
        return str(int(v)) if abs(v) < 2**53 else repr(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


class DcgmRenderer:
    """Rounds of DCGM samples as Prometheus text, with each series' label text cached.

    The cache is keyed by metric name and the labels in their given order (a source builds them in
    a fixed order, and not sorting keeps the lookup cheap). It is dropped and rebuilt when it grows
    past four times the round, so series of finished jobs do not pile up. A round given as the same
    tuple as the last call (``ScrapeResult.samples`` scraped twice, by two Prometheus replicas) is
    not rendered again.
    """

    def __init__(self, fields: Mapping[str, DcgmField] = CATALOGUE) -> None:
        self._fields = fields
        self._heads: dict[_SeriesKey, str] = {}
        self._family_heads: dict[str, str] = {}
        self._lock = threading.Lock()
        self._last: tuple[tuple[Sample, ...], bytes] = ((), b"")

    @property
    def cached_series(self) -> int:
        """How many series' label text is cached."""
        return len(self._heads)

    def _head(self, name: str, labels: Mapping[str, str]) -> str:
        if not labels:
            return name + " "
        return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "} "

    def _family(self, name: str) -> str:
        text = self._family_heads.get(name)
        if text is None:
            known = self._fields.get(name)
            text = "" if known is None else f"# HELP {name} {known.help.replace(chr(92), chr(92) * 2)}\n"
            text += "" if known is None else f"# TYPE {name} {known.kind}\n"
            self._family_heads[name] = text
        return text

    def render(self, samples: Sequence[Sample]) -> bytes:
        """One round as exposition text; ``parse_exposition`` reads back the same samples (no timestamps)."""
        with self._lock:  # the HTTP server renders from several threads
            if isinstance(samples, tuple) and samples is self._last[0]:
                return self._last[1]
            if len(self._heads) > 4 * len(samples) + 1024:
                self._heads.clear()
            heads = self._heads
            families: dict[str, list[str]] = {}
            for s in samples:
                key = (s.name, tuple(s.labels.items()))
                head = heads.get(key)
                if head is None:
                    head = heads[key] = self._head(s.name, s.labels)
                lines = families.get(s.name)
                if lines is None:
                    lines = families[s.name] = [self._family(s.name)]
                lines.append(head + format_value(s.value) + "\n")
            text = "".join(["".join(lines) for lines in families.values()]).encode("utf-8")
            if isinstance(samples, tuple):
                self._last = (samples, text)
        return text


class ExpositionServer:
    """``/metrics`` over HTTP from a ``render()`` callable, in a daemon thread."""

    def __init__(self, render: Callable[[], bytes], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.render, self.host, self.port = render, host, port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        render = self.render

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self._answer(404, b"not found: try /metrics\n", "text/plain; charset=utf-8")
                    return
                try:
                    body = render()
                except Exception:
                    log.exception("rendering /metrics failed")
                    self._answer(500, b"rendering the metrics failed; see the exporter's log\n")
                    return
                self._answer(200, body)

            def _answer(self, status: int, body: bytes, content_type: str = CONTENT_TYPE) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s " + format, self.address_string(), *args)

        return Handler

    def start(self) -> int:
        """Bind and serve; the bound port (the chosen one when ``port`` is 0)."""
        try:
            server = ThreadingHTTPServer((self.host, self.port), self._handler())
        except OSError as err:
            raise UsageError(
                f"cannot listen on {self.host}:{self.port} ({err.strerror}); choose another port, or 0 for any"
            ) from None
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="gpufleet-exposition", daemon=True)
        self._thread.start()
        self.port = int(server.server_address[1])
        return self.port

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


__all__ = ["CONTENT_TYPE", "DcgmRenderer", "ExpositionServer", "format_value", "log"]
