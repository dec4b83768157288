"""The webhook secret file is held to the serve token's rules: a private regular file, bounded, read without blocking.

``gpufleet serve --webhook-secret-file`` (and ``$GPUFLEET_WEBHOOK_SECRET_FILE``) refuses a device, a FIFO, a link
and a file others may read with exit 2 and one line naming the file and the fix, before it listens or writes
anything. The CLI runs in a subprocess so that a FIFO that blocked the start-up would fail the test (by its
safety timeout) instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, assert_refused

from gpufleet.errors import UsageError
from gpufleet.quality.webhook import MAX_SECRET_FILE_BYTES, load_secret, write_secret

SAFETY_TIMEOUT_S = 120.0
"""Only a safety net: a refused start-up ends long before; a blocked one would otherwise hang the suite."""
SECRET = b"0123456789abcdef0123456789abcdef\n"


def serve(home: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``gpufleet serve`` with ``args`` in a subprocess: its exit code and stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "serve", "--port", "0", "--no-token", *args],
        cwd=REPO,
        env={**os.environ, "GPUFLEET_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "400", **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SAFETY_TIMEOUT_S,
    )
    return proc.returncode, proc.stderr


def private_file(path: Path, content: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(content)
    path.chmod(mode)
    return path


def test_dev_zero_is_refused_unread(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a regular file"):
        load_secret(Path("/dev/zero"), env={})
    code, err = serve(tmp_path / "home", "--webhook-secret-file", "/dev/zero")
    assert_refused(code, err, tmp_path / "home", "/dev/zero", "not a regular file")


def test_a_fifo_is_refused_without_blocking_the_start_up(tmp_path: Path) -> None:
    fifo = tmp_path / "secret.fifo"
    os.mkfifo(fifo, 0o600)
    code, err = serve(tmp_path / "home", "--webhook-secret-file", str(fifo))
    assert_refused(code, err, tmp_path / "home", str(fifo), "not a regular file")
    code, err = serve(tmp_path / "home", env={"GPUFLEET_WEBHOOK_SECRET_FILE": str(fifo)})
    assert_refused(code, err, tmp_path / "home", str(fifo), "not a regular file")


def test_a_file_others_may_read_is_refused_with_the_chmod_to_run(tmp_path: Path) -> None:
    path = private_file(tmp_path / "secret", SECRET, 0o644)
    with pytest.raises(UsageError, match="mode 644"):
        load_secret(path, env={})
    code, err = serve(tmp_path / "home", "--webhook-secret-file", str(path))
    assert_refused(code, err, tmp_path / "home", str(path), "mode 644", f"chmod 600 {path}")
    path.chmod(0o640)  # the group alone is too many readers
    code, err = serve(tmp_path / "home", env={"GPUFLEET_WEBHOOK_SECRET_FILE": str(path)})
    assert_refused(code, err, tmp_path / "home", str(path), "mode 640", f"chmod 600 {path}")


def test_a_link_an_oversized_and_an_empty_file_are_refused(tmp_path: Path) -> None:
    target = private_file(tmp_path / "secret", SECRET)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UsageError, match="symbolic link"):
        load_secret(link, env={})
    big = private_file(tmp_path / "big", b"s" * (MAX_SECRET_FILE_BYTES + 1))
    with pytest.raises(UsageError, match="over 4,096"):
        load_secret(big, env={})
    empty = private_file(tmp_path / "empty", b"")
    with pytest.raises(UsageError, match="is 0 bytes; use 16 or more"):
        load_secret(empty, env={})
    code, err = serve(tmp_path / "home", "--webhook-secret-file", str(link))
    assert_refused(code, err, tmp_path / "home", str(link), "symbolic link")


def test_a_private_file_of_this_users_is_read_and_the_server_starts(tmp_path: Path) -> None:
    path = private_file(tmp_path / "secret", SECRET)
    assert load_secret(path, env={}) == SECRET.strip()
    assert load_secret(env={"GPUFLEET_WEBHOOK_SECRET_FILE": str(path)}) == SECRET.strip()
    made = tmp_path / "made.secret"
    written = write_secret(made)
    assert load_secret(made, env={}) == written
    port_file = tmp_path / "port"
    secret_and_port = ["--webhook-secret-file", str(path), "--port-file", str(port_file)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "serve", "--port", "0", "--no-token", *secret_and_port],
        cwd=REPO,
        env={**os.environ, "GPUFLEET_HOME": str(tmp_path / "home")},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + SAFETY_TIMEOUT_S
        while not port_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert port_file.exists(), proc.stderr.read() if proc.poll() is not None and proc.stderr else "no port file"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=SAFETY_TIMEOUT_S)
    assert "webhook POST /hooks/alerts" in out
