"""DCGM rounds served as Prometheus text, fast enough for a fleet-sized scrape.

prometheus-client's ``generate_latest`` rebuilds every series' label text on every scrape (about
111 ms for 10,000 labelled series on the development machines); a Prometheus scrape of a node's
endpoint should take a small fraction of the scrape interval. Between two rounds a GPU's series
keep their labels and only the values move, so ``DcgmRenderer`` keeps the last round's page with
holes for the values: a round of the same series in the same order (names, labels and label
order are compared, in C loops) only has its values formatted, also in C loops
(``format_values``), and poured into the holes with one ``bytes.join``. No Python code runs per
series unless the series change.

Rendering can also leave the scrape: a sampler that calls ``render`` on each round's tuple when
the round arrives (``GpuSampler``'s ``on_round``) makes the scrape's ``render`` of the same tuple
return those bytes, so a scrape only sends them. The page is then as old as the round it shows,
at most one sampling period, as it is when rendering at scrape time. ``bench/dcgm_scrape.py``
holds that scrape of 10,112 series to 10 ms over HTTP and also times rendering in the scrape.

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
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from operator import attrgetter, itemgetter

from gpufleet.errors import UsageError
from gpufleet.telemetry.dcgm import CATALOGUE, DcgmField, Sample

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LabelsKey = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_NAME, _LABELS, _VALUE = attrgetter("name"), attrgetter("labels"), attrgetter("value")
_EXACT = 2.0**53
"""Integer values below this print as integers (``format_value``); every float from it on is an integer."""


def format_value(value: float) -> str:
    """A sample value as exposition text: integers without ``.0``, ``NaN``, ``+Inf``, ``-Inf``."""
    v = float(value)
    if v.is_integer():
        return str(int(v)) if abs(v) < _EXACT else repr(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def format_values(values: Sequence[float]) -> list[bytes]:
    """``format_value`` of each value (ASCII), in a few loops that run in C rather than a call per value.

    ``repr`` gives the text of a finite float, and an integer below 2**53 is its ``repr`` less the
    ``.0`` (``repr`` only switches to an exponent from 1e16, past 2**53). The rest (NaN, the
    infinities, -0.0, magnitudes from 2**53 on) are rare, and a round holding one goes through
    ``format_value`` value by value.
    """
    floats = list(map(float, values))
    if not floats:
        return []
    text = "\n".join(map(float.__repr__, floats)) + "\n"
    if "n" in text or "-0.0\n" in text or max(floats) >= _EXACT or min(floats) <= -_EXACT:
        return [format_value(v).encode() for v in floats]
    return text.encode().replace(b".0\n", b"\n").split(b"\n")[:-1]


@dataclass(frozen=True, slots=True)
class _Layout:
    """The page of one round with holes for the values, good for any round of the same series in the same order.

    ``parts`` alternates text and holes: the text before a value (a newline, the family's ``# HELP``
    and ``# TYPE`` before its first series, the series' ``name{labels} ``), a hole, ..., the final
    newline. ``order`` picks the values in page order (families in one block each) from the round's
    order; ``None`` when the round is already grouped. ``labels`` are copies and ``label_names``
    the keys in order, so a dict changed in place, or relabelled in another order, is noticed.
    """

    names: list[str]
    labels: list[dict[str, str]]
    label_names: list[tuple[str, ...]]
    parts: list[bytes]
    order: Callable[[list[bytes]], Sequence[bytes]] | None

    def fits(self, names: list[str], labels: list[dict[str, str]]) -> bool:
        """Whether a round of these series (in this order) has this page."""
        return names == self.names and labels == self.labels and list(map(tuple, labels)) == self.label_names

    def fill(self, values: list[bytes]) -> bytes:
        """The page with ``values`` (in the round's order, formatted) in its holes."""
        parts = self.parts.copy()
        parts[1::2] = values if self.order is None else self.order(values)
        return b"".join(parts)


class DcgmRenderer:
    """Rounds of DCGM samples as Prometheus text, each round filling the last round's page.

    A round with the same series in the same order as the last one (the usual case: a source
    reads the same GPUs and fields every round) only has its values formatted and poured into
    the cached page (``_Layout``); any other round plans a new page, in Python, from a cache of
    label text (``gpu="0",UUID="GPU-..."``, one per GPU, shared by its fields). That cache is keyed
    by the labels in their given order (a source builds them in a fixed order), and it is dropped
    and rebuilt when it grows past four times the round, so the GPUs of finished jobs do not pile
    up. A round given as the same tuple as the last call (``ScrapeResult.samples`` scraped twice,
    or rendered by the sampler's ``on_round`` and then scraped) is not rendered again.
    """

    def __init__(self, fields: Mapping[str, DcgmField] = CATALOGUE) -> None:
        self._fields = fields
        self._label_texts: dict[_LabelsKey, str] = {}
        self._family_heads: dict[str, str] = {}
        self._layout: _Layout | None = None
        self._lock = threading.Lock()
        self._last: tuple[tuple[Sample, ...], bytes] = ((), b"")

    @property
    def cached_series(self) -> int:
        """How many label sets' text is cached (one per GPU: its fields share it)."""
        return len(self._label_texts)

    def _head(self, name: str, labels: Mapping[str, str]) -> str:
        if not labels:
            return name + " "
        key = tuple(labels.items())
        text = self._label_texts.get(key)
        if text is None:
            text = self._label_texts[key] = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        return name + "{" + text + "} "

    def _family(self, name: str) -> str:
        text = self._family_heads.get(name)
        if text is None:
            known = self._fields.get(name)
            text = "" if known is None else f"# HELP {name} {known.help.replace(chr(92), chr(92) * 2)}\n"
            text += "" if known is None else f"# TYPE {name} {known.kind}\n"
            self._family_heads[name] = text
        return text

    def _plan(self, names: list[str], labels: list[dict[str, str]]) -> _Layout:
        if len(self._label_texts) > 4 * len(names) + 1024:
            self._label_texts.clear()
        families: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            families.setdefault(name, []).append(i)
        texts: list[bytes] = []
        for name, rows in families.items():
            header = self._family(name)
            for i in rows:
                texts.append((header + self._head(name, labels[i])).encode("utf-8"))
                header = ""
        parts = [texts[0]]
        for text in texts[1:]:
            parts += (b"", b"\n" + text)
        parts += (b"", b"\n")
        order = [i for rows in families.values() for i in rows]
        pick = None if order == list(range(len(order))) else itemgetter(*order)
        return _Layout(names, list(map(dict, labels)), list(map(tuple, labels)), parts, pick)

    def render(self, samples: Sequence[Sample]) -> bytes:
        """One round as exposition text; ``parse_exposition`` reads back the same samples (no timestamps)."""
        with self._lock:  # the HTTP server renders from several threads
            if isinstance(samples, tuple) and samples is self._last[0]:
                return self._last[1]
            text = self._render(samples)
            if isinstance(samples, tuple):
                self._last = (samples, text)
        return text

    def _render(self, samples: Sequence[Sample]) -> bytes:
        if not samples:
            return b""
        names, labels = list(map(_NAME, samples)), list(map(_LABELS, samples))
        layout = self._layout
        if layout is None or not layout.fits(names, labels):
            layout = self._layout = self._plan(names, labels)
        return layout.fill(format_values(list(map(_VALUE, samples))))


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


__all__ = ["CONTENT_TYPE", "DcgmRenderer", "ExpositionServer", "format_value", "format_values", "log"]
