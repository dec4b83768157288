"""A submit while a local scheduler runs with another environment is never silently run with the old one.

The running scheduler keeps the environment it started with (its slots, and what its attempts
inherit): a submit whose checked variables differ says so on stderr, with the way to restart it,
and a job bigger than the running scheduler's slots is refused instead of waiting for ever.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpufleet.backends.local import LocalBackend, scheduler_pid, scheduler_slots, settings_drift, settings_file
from gpufleet.errors import UsageError
from gpufleet.spec import parse_spec


@pytest.fixture
def running(home: Path) -> Iterator[int]:
    """A real scheduler for ``home``, started with 2 slots and a log interval of 5 s; stopped at the end."""
    home.mkdir(parents=True)
    env = {**os.environ, "GPUFLEET_LOCAL_SLOTS": "2", "GPUFLEET_SCHEDULER_IDLE_S": "120", "GPUFLEET_LOG_EVERY_S": "5"}
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.backends.local", str(home)], env=env)
    try:
        deadline = time.monotonic() + 120  # a safety net: it records its settings as it starts
        while scheduler_pid(home) != proc.pid or not settings_file(home).exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the scheduler did not start"
            time.sleep(0.05)
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def test_the_scheduler_records_its_settings_without_their_values(home: Path, running: int) -> None:
    data = json.loads(settings_file(home).read_text())
    assert data["pid"] == running and data["slots"] == 2 and data["idle_exit_s"] == 120
    assert "GPUFLEET_LOG_EVERY_S" in data["env"] and "5" not in data["env"].values()
    assert settings_file(home).stat().st_mode & 0o077 == 0
    assert scheduler_slots(home) == (2, running)


def test_a_changed_variable_is_named_with_the_way_to_restart(
    home: Path, running: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    monkeypatch.setenv("GPUFLEET_SCHEDULER_IDLE_S", "120")
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "5")
    assert settings_drift(home, os.environ) is None  # the same environment: nothing to say
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0.5")
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "4")
    note = settings_drift(home, os.environ)
    assert note is not None and "GPUFLEET_LOCAL_SLOTS, GPUFLEET_LOG_EVERY_S differ" in note
    assert f"`kill {running}` stops it now" in note and "0.5" not in note


def test_a_job_bigger_than_the_running_schedulers_slots_is_refused(
    home: Path, running: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "4")  # this shell's, not the running scheduler's
    spec = parse_spec(
        {"name": "big", "entrypoint": [sys.executable, "-c", "pass"], "resources": {"gpus": 3, "cpus": 1}}
    )
    with pytest.raises(
        UsageError,
        match=rf"exceeds the local backend's 2 virtual GPU slot\(s\) \(those of its running scheduler, pid {running}",
    ):
        LocalBackend(home).submit(spec)
    assert LocalBackend(home).store.jobs() == []


def test_the_cli_submit_warns_on_stderr(home: Path, running: int, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "j", "entrypoint": [sys.executable, "-c", "pass"]}))
    env = {**os.environ, "GPUFLEET_HOME": str(home), "GPUFLEET_LOCAL_SLOTS": "2", "GPUFLEET_SCHEDULER_IDLE_S": "120"}
    same = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "submit", str(spec), "--json"],
        env={**env, "GPUFLEET_LOG_EVERY_S": "5"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert same.returncode == 0 and same.stderr == "", same.stderr
    changed = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "submit", str(spec), "--json"],
        env={**env, "GPUFLEET_LOG_EVERY_S": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["id"] == 2
    assert "warning: the local scheduler of" in changed.stderr and "GPUFLEET_LOG_EVERY_S differs" in changed.stderr
