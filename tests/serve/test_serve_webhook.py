"""``POST /hooks/alerts`` on ``gpufleet serve``: the signed webhook, acting through the monitor file's retrain spec.

200 identical deliveries released at once submit exactly one retraining job; the receiver's other
checks (signature, size, unknown model, no secret) answer as the standalone receiver does.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Literal

import pytest
from conftest import http, served

from gpufleet.backends.local import LocalBackend
from gpufleet.quality.webhook import AlertPayload, signed_headers
from gpufleet.serve.app import ServeConfig, create_app

SECRET = b"s" * 40


def monitor_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reference.csv").write_text("x,y\n" + "".join(f"{i},{i % 3}\n" for i in range(50)))
    (folder / "windows").mkdir()
    (folder / "retrain.yaml").write_text(
        "name: retrain-churn\nteam: ml\nentrypoint: gpufleet.workloads.toy:train\n"
        "args: {steps: 5, step_seconds: 0}\nresources: {gpus: 0, cpus: 1}\n"
    )
    path = folder / "monitor.yaml"
    path.write_text("models:\n  - {name: churn, reference: reference.csv, current: windows, retrain: retrain.yaml}\n")
    return path


def alert(model: str = "churn", action: Literal["alert", "retrain"] = "retrain") -> bytes:
    payload = AlertPayload(model=model, action=action, window="w-7", dataset="current", reasons=["drift"], evidence={})
    return json.dumps(payload.model_dump(), sort_keys=True).encode()


def deliver(url: str, body: bytes, key: str, secret: bytes = SECRET) -> tuple[int, Any]:
    headers = {**signed_headers(secret, body, idempotency_key=key), "Content-Type": "application/json"}
    return http("POST", f"{url}/hooks/alerts", body, headers)


@pytest.mark.timeout(300)
def test_200_identical_deliveries_retrain_once(local_daemon: LocalBackend, home: Path, tmp_path: Path) -> None:
    cfg = ServeConfig(
        home=home, token=None, monitor=monitor_file(tmp_path / "m"), webhook_secret=SECRET, sync_remote=False
    )
    body = alert()
    headers = {**signed_headers(SECRET, body, idempotency_key="churn:w-7:1"), "Content-Type": "application/json"}
    with served(create_app(cfg)) as url:
        gate = threading.Barrier(200)
        replies: list[tuple[int, Any]] = []
        lock = threading.Lock()

        def one() -> None:
            gate.wait()
            reply = http("POST", f"{url}/hooks/alerts", body, headers)
            with lock:
                replies.append(reply)

        threads = [threading.Thread(target=one) for _ in range(200)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    statuses = sorted(status for status, _ in replies)
    assert statuses.count(202) == 1 and statuses.count(409) == 199, statuses
    accepted = next(reply for status, reply in replies if status == 202)
    assert accepted["result"]["acted"] is True and accepted["result"]["submitted"] is True
    jobs = [j for j in local_daemon.store.jobs() if j.name == "retrain-churn"]
    assert [j.id for j in jobs] == [accepted["result"]["job_id"]]


def test_the_webhook_checks_what_the_receiver_checks(home: Path, tmp_path: Path) -> None:
    cfg = ServeConfig(
        home=home, token=None, monitor=monitor_file(tmp_path / "m"), webhook_secret=SECRET, sync_remote=False
    )
    with served(create_app(cfg)) as url:
        body = alert(action="alert")
        assert deliver(url, body, "churn:alert:1")[0] == 202  # an alert without retrain acts on nothing
        assert deliver(url, body, "churn:alert:1")[0] == 409
        assert deliver(url, alert(), "churn:forged:1", secret=b"x" * 40)[0] == 401
        status, reply = deliver(url, alert(model="fraud"), "fraud:w:1")
        assert status == 422 and "no retraining is configured for model 'fraud'" in reply["reason"]
        big = b"{" + b" " * (70 * 1024) + b"}"
        assert deliver(url, big, "churn:big:1")[0] == 413
        old = {**signed_headers(SECRET, body, idempotency_key="churn:old:1", timestamp=int(time.time()) - 3600)}
        assert http("POST", f"{url}/hooks/alerts", body, old)[0] == 401
    with served(create_app(ServeConfig(home=home, token=None, sync_remote=False))) as url:
        assert deliver(url, alert(), "churn:none:1")[0] == 503
