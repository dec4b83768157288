"""The real Prometheus that `scripts/dev-prometheus up` starts scrapes an exporter registered by a targets file.

This test does not start Prometheus itself: the Makefile runs `scripts/dev-prometheus up` first, and the
`prometheus` fixture (tests/conftest.py) finds it, failing under CI and skipping elsewhere when it is not up.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

SCRAPE_TIMEOUT_S = 30.0


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def test_scrapes_exporter_registered_by_targets_file(
    prometheus: str, prometheus_targets: Path, promql: Callable[[str], list[dict[str, Any]]]
) -> None:
    targets = prometheus_targets
    run_id = uuid.uuid4().hex
    registry = CollectorRegistry()
    gauge = Gauge("gpufleet_test_gauge", "set by tests/integration/test_prometheus.py", ["team"], registry=registry)
    gauge.labels(team="perception").set(42)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    port = server.server_port
    instance = f"127.0.0.1:{port}"
    target_file = targets / f"test-{run_id}.json"
    try:
        # Write elsewhere and rename in: Prometheus must never read half a file.
        tmp = targets / f".test-{run_id}.tmp"
        tmp.write_text(json.dumps([{"targets": [instance], "labels": {"gpufleet_test_run": run_id}}]))
        os.replace(tmp, target_file)

        deadline = time.monotonic() + SCRAPE_TIMEOUT_S
        sample: dict[str, Any] | None = None
        last: object = None
        while sample is None:
            try:
                results = promql("gpufleet_test_gauge")
            except (OSError, ValueError) as exc:
                results, last = [], exc
            else:
                last = results
            for res in results:
                if res["metric"].get("gpufleet_test_run") == run_id:
                    sample = res
            if sample is None:
                if time.monotonic() > deadline:
                    pytest.fail(f"no gpufleet_test_gauge from {instance} after {SCRAPE_TIMEOUT_S:.0f}s; last: {last}")
                time.sleep(0.25)
        assert sample["metric"]["team"] == "perception"
        assert sample["metric"]["job"] == "gpufleet"
        assert sample["metric"]["instance"] == instance
        assert float(sample["value"][1]) == 42.0

        body = _get_json(f"{prometheus}/api/v1/targets?state=active")
        assert body["status"] == "success", body
        ours = [t for t in body["data"]["activeTargets"] if t["labels"].get("gpufleet_test_run") == run_id]
        assert len(ours) == 1, body["data"]["activeTargets"]
        assert ours[0]["health"] == "up", ours[0]
        assert ours[0]["labels"]["job"] == "gpufleet"
        assert ours[0]["scrapePool"] == "gpufleet"
    finally:
        target_file.unlink(missing_ok=True)
        (targets / f".test-{run_id}.tmp").unlink(missing_ok=True)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
