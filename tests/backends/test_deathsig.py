"""One death-signal shim (``jobs.deathsig``) for every process gpufleet starts: attempts, torchrun and its ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.backends.group_launch import torchrun_argv
from gpufleet.backends.lifecycle import NOT_STARTED, attempt_argv
from gpufleet.jobs import deathsig

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout  # a safety net only
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@linux_only
def test_the_attempt_and_the_ranks_run_behind_the_same_shim() -> None:
    attempt = attempt_argv(["train"], signal.SIGTERM)
    assert attempt[:4] == [sys.executable, "-I", "-c", deathsig.SHIM]
    assert attempt[4:] == [str(os.getpid()), str(int(signal.SIGTERM)), "train"]  # this process is the parent
    torchrun = torchrun_argv(2, ["-m", "x"])
    at = torchrun.index(deathsig.SHIM)
    assert torchrun[at + 1 : at + 3] == ["0", str(int(signal.SIGKILL))]  # torchrun's PID is not known yet
    assert torchrun[at + 3 :] == [sys.executable, "-u", "-m", "x"]
    assert NOT_STARTED == deathsig.NOT_STARTED


@linux_only
@pytest.mark.parametrize("parent", ["given", "its own at start"])
def test_a_child_behind_the_shim_dies_with_the_thread_that_started_it(tmp_path: Path, parent: str) -> None:
    started: list[subprocess.Popen[bytes]] = []
    ready = tmp_path / "ready"
    child = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    pid = os.getpid() if parent == "given" else None

    def start() -> None:
        started.append(subprocess.Popen(deathsig.shim_argv([sys.executable, "-c", child], parent=pid)))
        wait_for(ready.exists)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    try:
        assert started[0].wait(timeout=10) == -signal.SIGKILL
    finally:
        started[0].kill()
        started[0].wait()


@linux_only
def test_die_with_parent_exits_at_once_when_the_parent_is_already_gone() -> None:
    code = "from gpufleet.jobs.deathsig import die_with_parent; die_with_parent(parent=1); print('alive')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (deathsig.PARENT_GONE, "")


def test_elsewhere_than_linux_the_command_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert deathsig.shim_argv(["train", "--x"]) == ["train", "--x"]
