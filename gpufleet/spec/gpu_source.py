"""What ``telemetry.gpu_source`` may name: a synthetic pattern's name, or a dcgm-exporter URL to scrape.

The spec checks these when it is read, so a bad value is refused before a job is queued; the
telemetry package that generates the patterns and scrapes the exporter imports them from here.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Literal, get_args

Pattern = Literal[
    "healthy",
    "tensor_idle",
    "memory_bound",
    "comm_bound",
    "host_bound",
    "thermal_throttle",
    "power_throttle",
    "oom_risk",
    "idle",
]
PATTERNS: tuple[Pattern, ...] = get_args(Pattern)


_URL_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")


def check_scrape_url(url: str) -> str:
    """``url`` when it is a dcgm-exporter address to GET: http(s), a host, no whitespace or control character.

    Raises ``ValueError`` naming what is wrong (the spec's ``telemetry.gpu_source`` validator and
    ``ScrapeSource`` both call this, so a bad URL is refused before any job is queued).
    """
    fix = "give http(s)://host[:port]/path, e.g. scrape:http://node:9400/metrics"
    if _URL_UNSAFE.search(url):
        problem = "contains whitespace or a control character"
    else:
        parts = urllib.parse.urlsplit(url)
        try:
            port_ok = parts.port is None or parts.port > 0
        except ValueError:
            port_ok = False
        if parts.scheme not in ("http", "https"):
            problem = "is not http:// or https://"
        elif not parts.hostname:
            problem = "names no host"
        elif not port_ok:
            problem = "has a port that is not 1-65535"
        else:
            return url
    raise ValueError(f"scrape URL {url!r} {problem}; {fix}")


__all__ = ["PATTERNS", "Pattern", "check_scrape_url"]
