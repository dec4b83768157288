"""The warm spawn server: attempts forked from it are what a new interpreter would be, and leak nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends.lifecycle import attempt_processes, signal_group
from gpufleet.backends.local import warm_server
from gpufleet.backends.local.warm import (
    SERVER_CODE,
    WarmEntry,
    WarmProcess,
    WarmServer,
    serves_world_size,
    start_variables_differ,
    warm_entry,
    warm_start_enabled,
)
from gpufleet.backends.local.warm_server import _Server, refusal

PY = sys.executable

PROBE = textwrap.dedent(
    """
    import os, sys

    def is_open(fd):
        try:
            os.fstat(fd)
        except OSError:
            return False
        return True

    fds = [fd for fd in range(256) if is_open(fd)]
    modules_at_start = sorted(sys.modules)
    import json, random
    import numpy, torch
    import usermod

    out = {
        "fds": fds,
        "modules_at_start": modules_at_start,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "path": list(sys.path),
        "argv": list(sys.argv),
        "name": __name__,
        "random": random.random(),
        "numpy": float(numpy.random.rand()),
        "torch": float(torch.rand(1)),
        "usermod": usermod.VALUE,
        "stdin": os.readlink("/proc/self/fd/0"),
        "sid": os.getsid(0) == os.getpid(),
    }
    os.environ["LEAKED"] = "1"
    leaked = open(os.path.join(os.getcwd(), "left-open.txt"), "w")
    leaked.write("unflushed")
    out["leaked_fd"] = leaked.fileno()
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def server() -> Iterator[WarmServer]:
    warm = WarmServer.start(os.environ)
    assert warm.wait_ready(300), "the warm server never became ready"
    yield warm
    warm.close()


def workdir(tmp_path: Path, name: str, value: int) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE)
    (folder / "usermod.py").write_text(f"VALUE = {value}\n")
    return folder


def run_warm(server: WarmServer, argv: list[str], cwd: Path, log: Path, **env: str) -> WarmProcess:
    with log.open("ab") as fh:
        child = server.spawn(argv, env={**os.environ, **env}, cwd=str(cwd), log=fh, death_signal=signal.SIGTERM)
    assert isinstance(child, WarmProcess), child
    return child


def report(log: Path) -> dict[str, Any]:
    return dict(json.loads(log.read_text().strip().splitlines()[-1]))


def test_which_argv_run_warm() -> None:
    assert warm_entry([PY, "-m", "gpufleet.runtime.launch"]) == WarmEntry(
        "module", "gpufleet.runtime.launch", (), False
    )
    assert warm_entry([PY, "-u", "train.py", "--lr", "3"]) == WarmEntry("script", "train.py", ("--lr", "3"), True)
    assert warm_entry([PY, "-m", "gpufleet.backends.group_launch", "--no-python", "--", "sh"]) is not None
    for cold in (
        [PY, "-c", "print(1)"],
        [PY, "-I", "train.py"],
        [PY, "-m"],
        [PY],
        ["/usr/bin/python3", "train.py"],
        ["/bin/sh", "run.sh"],
        [PY, "-", "x"],
    ):
        assert warm_entry(cold) is None, cold


def test_variables_read_at_start_must_match() -> None:
    assert start_variables_differ({"A": "1"}, {"A": "2", "GPUFLEET_JOB_ID": "3"}) == []
    assert start_variables_differ({}, {"PYTHONHASHSEED": "0", "LANG": "C"}) == ["LANG", "PYTHONHASHSEED"]
    assert warm_start_enabled({}) and warm_start_enabled({"GPUFLEET_WARM_START": "1"})
    assert not warm_start_enabled({"GPUFLEET_WARM_START": "0"})


def test_nothing_of_one_attempt_reaches_the_next(server: WarmServer, tmp_path: Path) -> None:
    first, second = workdir(tmp_path, "a", 1), workdir(tmp_path, "b", 1)
    one = run_warm(server, [PY, "probe.py"], first, tmp_path / "1.log", ONLY_ONE="yes")
    assert one.wait(timeout=120) == 0
    (second / "usermod.py").write_text("VALUE = 2\n")  # changed on disk between the attempts
    two = run_warm(server, [PY, "probe.py"], second, tmp_path / "2.log")
    assert two.wait(timeout=120) == 0
    a, b = report(tmp_path / "1.log"), report(tmp_path / "2.log")
    assert a["env"]["ONLY_ONE"] == "yes" and "ONLY_ONE" not in b["env"] and "LEAKED" not in b["env"]
    assert b["env"] == {k: v for k, v in os.environ.items()}
    assert (a["cwd"], b["cwd"]) == (str(first), str(second))
    for rng in ("random", "numpy", "torch"):
        assert a[rng] != b[rng], rng
    assert a["fds"] == b["fds"] == [0, 1, 2]
    assert b["leaked_fd"] not in b["fds"] and a["leaked_fd"] not in b["fds"]
    assert (first / "left-open.txt").read_text() == "unflushed"  # flushed at exit, as an interpreter would
    assert "usermod" not in b["modules_at_start"] and "numpy" in b["modules_at_start"]
    assert (a["usermod"], b["usermod"]) == (1, 2)
    assert b["path"][0] == str(second) and str(first) not in b["path"]
    assert b["stdin"] == "/dev/null" and b["sid"] and b["name"] == "__main__"


def test_a_warm_attempt_sees_what_a_new_interpreter_sees(server: WarmServer, tmp_path: Path) -> None:
    folder = workdir(tmp_path, "w", 5)
    warm = run_warm(server, [PY, "probe.py", "--flag", "x"], folder, tmp_path / "warm.log")
    assert warm.wait(timeout=120) == 0
    with (tmp_path / "cold.log").open("wb") as log:
        cold = subprocess.run(
            [PY, "probe.py", "--flag", "x"], cwd=folder, stdout=log, stdin=subprocess.DEVNULL, env=dict(os.environ)
        )
    assert cold.returncode == 0
    w, c = report(tmp_path / "warm.log"), report(tmp_path / "cold.log")
    for key in ("path", "argv", "cwd", "fds", "name", "usermod", "env"):
        assert w[key] == c[key], key


@pytest.mark.parametrize(
    ("code", "status", "logged"),
    [
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('bad input')", 1, "bad input"),
        ("raise ValueError('boom')", 1, "ValueError: boom"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, ""),
        ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
        ("print('done')", 0, "done"),
    ],
)
def test_the_exit_status_is_a_new_interpreters(
    server: WarmServer, tmp_path: Path, code: str, status: int, logged: str
) -> None:
    (tmp_path / "main.py").write_text(code + "\n")
    child = run_warm(server, [PY, "main.py"], tmp_path, tmp_path / "out.log")
    assert child.wait(timeout=120) == status
    cold = subprocess.run([PY, "main.py"], cwd=tmp_path, capture_output=True, text=True)
    assert cold.returncode == status
    assert logged in (tmp_path / "out.log").read_text()


def test_a_module_runs_as_with_dash_m(server: WarmServer, tmp_path: Path) -> None:
    (tmp_path / "pkgmain.py").write_text("import sys, json; print(json.dumps([__name__, sys.argv[1:]]))\n")
    child = run_warm(server, [PY, "-u", "-m", "pkgmain", "a", "b"], tmp_path, tmp_path / "m.log")
    assert child.wait(timeout=120) == 0
    assert json.loads((tmp_path / "m.log").read_text()) == ["__main__", ["a", "b"]]


def test_a_warm_attempt_is_found_by_its_variables_and_signalled_as_a_group(server: WarmServer, tmp_path: Path) -> None:
    (tmp_path / "sleep.py").write_text("import time\nwhile True:\n    time.sleep(0.05)\n")
    home = tmp_path / "home"
    child = run_warm(
        server,
        [PY, "sleep.py"],
        tmp_path,
        tmp_path / "s.log",
        GPUFLEET_JOB_ID="41",
        GPUFLEET_ATTEMPT="2",
        GPUFLEET_HOME=str(home),
    )
    deadline = time.monotonic() + 120
    while attempt_processes(home, 41, 2) != [child.pid]:  # the child writes its environment as it starts
        assert time.monotonic() < deadline, attempt_processes(home, 41, 2)
        time.sleep(0.02)
    assert os.getsid(child.pid) == child.pid
    signal_group(child.pid, signal.SIGTERM)
    assert child.wait(timeout=120) == -signal.SIGTERM


def test_a_warm_attempt_shows_its_variables_by_the_time_its_pid_is_known(server: WarmServer, tmp_path: Path) -> None:
    # A scheduler that dies between starting an attempt and recording its PID leaves the next one to find
    # the attempt by its GPUFLEET_* variables: they must be there as soon as the PID is known, or the
    # attempt is taken for lost and run a second time beside itself.
    (tmp_path / "sleep.py").write_text("import time\nwhile True:\n    time.sleep(0.05)\n")
    home = tmp_path / "home"
    for n in range(20):
        child = run_warm(
            server,
            [PY, "sleep.py"],
            tmp_path,
            tmp_path / "s.log",
            GPUFLEET_JOB_ID="42",
            GPUFLEET_ATTEMPT=str(n + 1),
            GPUFLEET_HOME=str(home),
        )
        try:
            assert attempt_processes(home, 42, n + 1) == [child.pid]
        finally:
            signal_group(child.pid, signal.SIGKILL)
            child.wait(timeout=120)


def test_a_refused_request_says_why(server: WarmServer, tmp_path: Path) -> None:
    with (tmp_path / "r.log").open("ab") as log:
        env = {**os.environ, "PYTHONHASHSEED": "123"}
        answer = server.spawn([PY, "x.py"], env=env, cwd=str(tmp_path), log=log, death_signal=signal.SIGTERM)
        assert isinstance(answer, str) and "PYTHONHASHSEED" in answer
        answer = server.spawn([PY, "-c", "1"], env=os.environ, cwd=str(tmp_path), log=log, death_signal=15)
        assert isinstance(answer, str)


def test_the_plain_server_refuses_a_rank_of_a_group(server: WarmServer, tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("pass\n")
    with (tmp_path / "r.log").open("ab") as log:
        env = {**os.environ, "WORLD_SIZE": "2"}
        answer = server.spawn([PY, "x.py"], env=env, cwd=str(tmp_path), log=log, death_signal=signal.SIGTERM)
    assert answer == "a rank of a group starts as a new process"


def judged(world_size: int, request_world_size: str, tmp_path: Path) -> str | None:
    """What a server for ``world_size`` says of a request whose ``WORLD_SIZE`` is ``request_world_size``."""
    (tmp_path / "x.py").write_text("pass\n")
    server = _Server(socket.socket(), -1, -1, [], 1 << 16, {}, world_size)
    request = {"argv": [PY, "x.py"], "env": {"WORLD_SIZE": request_world_size}, "cwd": str(tmp_path)}
    try:
        return refusal(server, request, [1])
    finally:
        server.sock.close()


def test_a_server_forks_only_the_world_size_it_was_started_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm_server, "threads", lambda: 1)  # this test's process: as a server about to fork
    assert serves_world_size(1, "") and serves_world_size(1, "1") and serves_world_size(2, "2")
    assert not serves_world_size(1, "2") and not serves_world_size(2, "3") and not serves_world_size(2, "")
    assert judged(1, "2", tmp_path) == "a rank of a group starts as a new process"
    assert judged(2, "3", tmp_path) == (
        "WORLD_SIZE '3' is not the warm rank server's '2', which the runtime read at import"
    )
    assert judged(2, "1", tmp_path) == (
        "WORLD_SIZE '1' is not the warm rank server's '2', which the runtime read at import"
    )
    assert judged(2, "2", tmp_path) is None
    assert judged(1, "", tmp_path) is None and judged(1, "1", tmp_path) is None


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["3", "--world-size", "2"], {}, "WORLD_SIZE '' in its environment is not the world size 2"),
        (["3"], {"WORLD_SIZE": "4"}, "WORLD_SIZE '4' in its environment is not the world size 1"),
        (["3", "--world-size", "0"], {}, "usage: python -c SERVER_CODE FD [--world-size N]"),
        (["three"], {}, "usage: python -c SERVER_CODE FD [--world-size N]"),
    ],
)
def test_a_server_started_for_another_world_size_than_its_environment_names_exits_2(
    args: list[str], env: dict[str, str], says: str
) -> None:
    base = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    done = subprocess.run([PY, "-c", SERVER_CODE, *args], env={**base, **env}, capture_output=True, text=True)
    assert done.returncode == 2
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1
