"""The README's quickstart, run as written, so the README cannot drift from what the commands do.

The README marks what this test runs: ``<!-- quickstart: file NAME -->`` before the training script
and its JobSpec (written as they are into a fresh folder), and ``<!-- quickstart: run -->`` before
each console block whose ``$ gpufleet ...`` lines a reader types in order. Each command runs as a
real process in a private ``$GPUFLEET_HOME`` with the local backend's own detached scheduler; the
test waits on the job's state where a reader would (the job running before ``preempt``, completed
before ``show``) and asserts states, never durations. ``make demo`` and ``make test`` are not run
here (the demo runs in tests/cli/test_demo.py): the README must open with exactly those two.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
MARKED = re.compile(r"^<!-- quickstart: (run|file (\S+)) -->\n```\w*\n(.*?)^```", re.S | re.M)
RESUME_CHECK = ("debug", "resume-check")


@dataclass(frozen=True)
class Quickstart:
    """What the README's quickstart asks a reader to write and to type."""

    files: dict[str, str]
    """File name -> content, for the blocks marked ``file NAME``."""
    commands: list[list[str]]
    """Each ``$ gpufleet ...`` line of the blocks marked ``run``, split as a shell would, in order."""


def read_quickstart(text: str) -> Quickstart:
    files: dict[str, str] = {}
    commands: list[list[str]] = []
    for kind, name, body in MARKED.findall(text):
        if kind == "run":
            commands += [shlex.split(line[2:], comments=True) for line in body.splitlines() if line.startswith("$ ")]
        else:
            files[name] = body
    return Quickstart(files, commands)


def first_commands(text: str) -> list[str]:
    """The commands of the README's first fenced block, comments dropped."""
    match = FENCE.search(text)
    assert match, "README.md has no fenced block"
    return [line.split("#", 1)[0].strip() for line in match.group(2).splitlines() if line.split("#", 1)[0].strip()]


QUICKSTART = read_quickstart(README.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Reader:
    """Runs ``gpufleet`` commands the way the README's reader does: in the job's folder, on one home."""

    folder: Path
    home: Path

    def run(self, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        assert argv[0] == "gpufleet", f"the quickstart runs gpufleet commands only, not {shlex.join(argv)}"
        env = {**os.environ, "GPUFLEET_HOME": str(self.home), "GPUFLEET_SCHEDULER_IDLE_S": "2", "COLUMNS": "200"}
        return subprocess.run(
            [sys.executable, "-m", "gpufleet.cli", *argv[1:]],
            cwd=self.folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def job(self, job_id: str) -> dict[str, Any]:
        proc = self.run(["gpufleet", "show", job_id, "--json"])
        assert proc.returncode == 0, proc.stderr
        return dict(json.loads(proc.stdout))

    def wait_for(self, job_id: str, until: Callable[[dict[str, Any]], bool], timeout: float = 420) -> None:
        """Poll ``show --json`` until ``until`` holds (the timeout is only a safety net)."""
        deadline = time.monotonic() + timeout
        while not until(job := self.job(job_id)):
            assert job["state"] not in ("failed", "cancelled"), job
            assert time.monotonic() < deadline, f"job {job_id} stayed {job['state']} at step {job['step']}"
            time.sleep(0.2)


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Reader]:
    """A folder holding the quickstart's files, and a private home whose scheduler exits once idle."""
    folder = tmp_path / "job"
    folder.mkdir()
    for name, content in QUICKSTART.files.items():
        (folder / name).write_text(content, encoding="utf-8")
    home = tmp_path / "home"
    yield (reader := Reader(folder, home))
    listed = reader.run(["gpufleet", "jobs", "--json"])
    for job in json.loads(listed.stdout)["jobs"] if listed.returncode == 0 else []:
        if job["state"] not in ("completed", "failed", "cancelled"):  # a failed test leaves no job running
            reader.run(["gpufleet", "cancel", str(job["id"])])
    pid_file = home / "scheduler.pid"
    deadline = time.monotonic() + 60
    while pid_file.exists() and time.monotonic() < deadline:  # the idle scheduler exits by itself
        time.sleep(0.2)


def running(job: dict[str, Any]) -> bool:
    return bool(job["state"] == "running" and (job["step"] or 0) >= 1)


def completed(job: dict[str, Any]) -> bool:
    return bool(job["state"] == "completed")


WAIT_BEFORE: dict[str, Callable[[dict[str, Any]], bool]] = {
    "preempt": running,
    "show": completed,
    "logs": completed,
    "cost": completed,
}
"""Where the README tells its reader to wait: the job running before a preemption, completed after it."""


def test_readme_opens_with_make_demo_and_make_test() -> None:
    assert first_commands(README.read_text(encoding="utf-8")) == ["make demo", "make test"]


def test_quickstart_marks_a_script_a_spec_and_the_commands() -> None:
    assert set(QUICKSTART.files) == {"train.py", "train.yaml"}
    verbs = [argv[1] for argv in QUICKSTART.commands]
    assert verbs[:3] == ["submit", "jobs", "preempt"], verbs
    assert {"show", "logs", "cost"} <= set(verbs), verbs
    assert len(QUICKSTART.files["train.py"].splitlines()) <= 20, "the quickstart's script is meant to be short"


@pytest.mark.timeout(600)  # a minute on an idle machine; a loaded one can take several
def test_quickstart_runs_as_written(reader: Reader) -> None:
    outputs: dict[str, str] = {}
    for argv in QUICKSTART.commands:
        if tuple(argv[1:3]) == RESUME_CHECK:
            continue  # its own test, below
        verb = argv[1]
        if verb in WAIT_BEFORE:
            reader.wait_for("1", WAIT_BEFORE[verb])  # a fresh home: the quickstart's job is job 1
        proc = reader.run(argv)
        assert proc.returncode == 0, (shlex.join(argv), proc.returncode, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        outputs[verb] = outputs.get(verb, "") + proc.stdout  # `logs` runs twice: the latest attempt, then the first

    assert "submitted job 1 (first-job" in outputs["submit"], outputs["submit"]
    job = reader.job("1")
    assert job["state"] == "completed"
    assert [a["outcome"] for a in job["attempts"]] == ["preempted", "completed"], job["attempts"]
    assert job["attempts"][0]["exit_code"] == 75
    assert "state=completed" in outputs["show"] and "preempted at attempt 1" in outputs["show"]
    assert "gpufleet: resumed from" in outputs["logs"], outputs["logs"]
    assert re.search(r"^gpufleet: SIGTERM at step \d+: saved checkpoint step \d+ .* exiting 75", outputs["logs"], re.M)
    assert re.search(r"^ total .*\$\d", outputs["cost"], re.M), outputs["cost"]


@pytest.mark.timeout(600)  # three processes of the loop: a minute idle, several under load
def test_the_quickstart_loop_resumes_bit_for_bit(reader: Reader) -> None:
    checks = [argv for argv in QUICKSTART.commands if tuple(argv[1:3]) == RESUME_CHECK]
    assert checks, "the quickstart no longer shows `gpufleet debug resume-check` on its loop"
    for argv in checks:
        proc = reader.run(argv, timeout=580)
        assert proc.returncode == 0, (shlex.join(argv), proc.stdout, proc.stderr)
