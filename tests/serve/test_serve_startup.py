"""Start-up checks of ``gpufleet serve`` and ``gpufleet observe exporter``: a bad ``--port-file`` is refused first.

A port file is written by a temporary file and a rename once the port is bound; a path that cannot
take that rename (a folder, a path in a missing folder, a symbolic link, a FIFO) is refused before the
port is bound and before anything is created: exit 2, one line, no ``serve.token``, no temporary file.
The commands run in subprocesses whose working folder and ``$GPUFLEET_HOME`` are fresh folders of the
test, listed before and after.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from gpufleet.errors import UsageError
from gpufleet.outfiles import check_replaceable_file, write_port_file

SAFETY_TIMEOUT_S = 120.0
"""Only a safety net: a refused start-up ends at once; one that went on to serve would hang here."""
COMMANDS = {
    "serve": ["serve", "--port", "0"],
    "exporter": ["observe", "exporter", "--port", "0"],
}


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def start(cwd: Path, *args: str) -> tuple[int, str]:
    """The CLI with ``args`` run in ``cwd`` over ``cwd/home``: its exit code and stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", *args],
        cwd=cwd,
        env={
            **os.environ,
            "GPUFLEET_HOME": str(cwd / "home"),
            "NO_COLOR": "1",
            "COLUMNS": "400",
            "PYTHONPATH": str(REPO),
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SAFETY_TIMEOUT_S,
    )
    return proc.returncode, proc.stderr


def assert_one_line(code: int, err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("port_file", "needle"),
    [("taken", "is a directory"), ("missing/dir/port.txt", "does not exist; create it first")],
)
def test_a_port_file_that_cannot_be_written_is_refused_before_anything_is_made(
    tmp_path: Path, command: str, port_file: str, needle: str
) -> None:
    (tmp_path / "taken").mkdir()
    before = tree(tmp_path)
    code, err = start(tmp_path, *COMMANDS[command], "--port-file", port_file)
    assert_one_line(code, err, "--port-file", port_file, needle)
    assert tree(tmp_path) == before  # no serve.token, no home, no temporary file
    assert not (tmp_path / "home" / "serve.token").exists()


def test_a_link_and_a_fifo_are_refused_as_port_files(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("1")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")
    before = tree(tmp_path)
    code, err = start(tmp_path, *COMMANDS["serve"], "--port-file", "link")
    assert_one_line(code, err, "--port-file", "symbolic link")
    code, err = start(tmp_path, *COMMANDS["serve"], "--port-file", "fifo")
    assert_one_line(code, err, "--port-file", "a FIFO")
    assert tree(tmp_path) == before


def test_the_checks_name_the_flag_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="a folder above it is a file"):
        check_replaceable_file(tmp_path / "file" / "port", "--port-file")
    with pytest.raises(UsageError, match="is a device"):
        check_replaceable_file(Path("/dev/null"), "--port-file")
    assert check_replaceable_file(tmp_path / "file", "--port-file") == tmp_path / "file"
    assert check_replaceable_file(tmp_path / "new", "--port-file") == tmp_path / "new"


def test_a_failed_port_file_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    taken = tmp_path / "port"
    (taken / "inside").mkdir(parents=True)  # became a folder after the check: the rename fails
    before = tree(tmp_path)
    with pytest.raises(UsageError, match="cannot write the port file"):
        write_port_file(taken, 8642)
    assert tree(tmp_path) == before
    write_port_file(tmp_path / "ok", 8642)
    assert (tmp_path / "ok").read_text() == "8642" and tree(tmp_path) == sorted([*before, "ok"])
