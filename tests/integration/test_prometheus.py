"""The real Prometheus that `scripts/dev-prometheus up` starts scrapes an exporter registered by a targets file.

This test does not start Prometheus itself: the Makefile runs `scripts/dev-prometheus up` first. It finds the
server through `$GPUFLEET_PROMETHEUS_URL`, else `$GPUFLEET_PROMETHEUS_DIR/url` (default `.dev/prometheus/url`).
When it is not up the test fails under CI (the env var CI is set) and is skipped otherwise, with the command
that starts it.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

REPO = Path(__file__).resolve().parents[2]
START_CMD = "scripts/dev-prometheus up"
SCRAPE_TIMEOUT_S = 30.0


def _state_dir() -> Path:
    return Path(os.environ.get("GPUFLEET_PROMETHEUS_DIR") or REPO / ".dev" / "prometheus")


def _url() -> str | None:
    url = os.environ.get("GPUFLEET_PROMETHEUS_URL", "").strip()
    if url:
        return url.rstrip("/")
    try:
        return (_state_dir() / "url").read_text().strip().rstrip("/") or None
    except OSError:
        return None


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


@pytest.fixture(scope="module")
def prometheus() -> str:
    """The base URL of the dev Prometheus, once it answers /-/ready; skip or fail when it does not."""
    url = _url()
    problem = ""
    if url is None:
        problem = f"no $GPUFLEET_PROMETHEUS_URL and no {_state_dir() / 'url'}"
    else:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as resp:
                if resp.status != 200:
                    problem = f"{url}/-/ready answered {resp.status}"
        except (OSError, ValueError) as exc:
            problem = f"{url}/-/ready failed: {exc}"
    if problem:
        message = f"dev Prometheus is not up ({problem}); start it with `{START_CMD}`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    assert url is not None
    return url


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    body = _get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_scrapes_exporter_registered_by_targets_file(prometheus: str) -> None:
    targets = _state_dir() / "targets"
    if not targets.is_dir():
        pytest.fail(f"{targets} does not exist: was Prometheus started by `{START_CMD}` with this state dir?")
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
                results = _query(prometheus, "gpufleet_test_gauge")
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
