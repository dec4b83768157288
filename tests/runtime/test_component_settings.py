"""What the attempt's environment decides of a session: checked before any file opens, priced from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpufleet.errors import UsageError
from gpufleet.runtime import TrainSession
from gpufleet.runtime.components.settings import settings_from_env
from gpufleet.telemetry.metrics import JobMetrics


def test_a_malformed_price_is_refused_before_the_event_log_opens(tmp_path: Path) -> None:
    events = tmp_path / "job" / "events.jsonl"
    env = {"GPUFLEET_EVENTS": str(events), "GPUFLEET_PRICE_PER_GPU_HOUR": "2,50"}
    with pytest.raises(UsageError, match=r"^GPUFLEET_PRICE_PER_GPU_HOUR='2,50' is invalid"):
        settings_from_env(env, ckpt_dir=tmp_path / "ckpt", resume=None)
    assert not events.parent.exists()


def test_from_env_refuses_a_malformed_currency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_PRICE_PER_GPU_HOUR", "1.5")
    monkeypatch.setenv("GPUFLEET_CURRENCY", "1.5")
    with pytest.raises(UsageError, match=r"^GPUFLEET_CURRENCY='1\.5' is invalid"):
        TrainSession.from_env(model=torch.nn.Linear(1, 1), ckpt_dir=tmp_path)


def test_the_exported_metrics_carry_the_price_the_backend_exported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_METRICS_TEXTFILE", str(tmp_path / "job.prom"))
    monkeypatch.setenv("GPUFLEET_PRICE_PER_GPU_HOUR", "2.5")
    monkeypatch.setenv("GPUFLEET_CURRENCY", "EUR")
    session = TrainSession.from_env(model=torch.nn.Linear(1, 1), ckpt_dir=tmp_path / "ckpt")
    (metrics,) = [listener for listener in session.events.listeners if isinstance(listener, JobMetrics)]
    assert (metrics.price, metrics.currency) == (2.5, "EUR")


def test_without_a_price_the_metrics_carry_no_money(tmp_path: Path) -> None:
    settings = settings_from_env({"GPUFLEET_METRICS_TEXTFILE": str(tmp_path / "job.prom")}, ckpt_dir="c", resume=None)
    (metrics,) = [listener for listener in settings.arguments["events"].listeners if isinstance(listener, JobMetrics)]
    assert metrics.price is None


def test_a_training_process_imports_no_rate_card_and_no_placement() -> None:
    code = (
        "import sys, gpufleet.runtime.session\n"
        "print(sorted(m for m in sys.modules if m.startswith(('gpufleet.cost', 'gpufleet.placement'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "[]"
