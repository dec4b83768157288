"""States the embedded scheduler must never be stuck in: each pinned by a test that failed before."""

from __future__ import annotations

import json
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import drive

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.errors import SpecError, UsageError
from gpufleet.jobs.events import read_events_checked
from gpufleet.jobs.protocol import REQUEUE_EXIT_CODE
from gpufleet.jobs.store import latest_step
from gpufleet.spec import JobSpec, parse_spec


def command(name: str, code: str, **fields: Any) -> Any:
    return parse_spec({"name": name, "entrypoint": [sys.executable, "-c", code], **fields})


def test_an_infinite_interval_is_refused_at_submit(local: Any) -> None:
    backend, _ = local
    with pytest.raises(SpecError, match="every_seconds"):
        parse_spec({"name": "a", "entrypoint": "m:f", "checkpoint": {"every_steps": None, "every_seconds": "inf"}})
    with pytest.raises(SpecError, match=r"args\.x\[0\]"):  # refused where the spec is read
        parse_spec({"name": "a", "entrypoint": "m:f", "args": {"x": [float("inf")]}})
    unchecked = JobSpec.model_construct(
        **{**parse_spec({"name": "a", "entrypoint": "m:f"}).__dict__, "args": {"x": [float("inf")]}}
    )
    with pytest.raises(SpecError, match="does not read back"):  # and by the store, if it got that far
        backend.submit(unchecked)
    assert backend.store.jobs() == []


def test_one_unreadable_job_does_not_stop_the_others(local: Any, home: Path) -> None:
    backend, scheduler = local
    broken = backend.submit(command("broken", "pass"))
    with sqlite3.connect(home / "state.db") as db:  # what an older gpufleet could have stored
        stored = json.loads(db.execute("SELECT spec FROM jobs WHERE id=?", (broken,)).fetchone()[0])
        stored["checkpoint"] = {"every_steps": None, "every_seconds": None, "keep": 3, "grace_seconds": 30}
        db.execute("UPDATE jobs SET spec=? WHERE id=?", (json.dumps(stored), broken))
    ok = backend.submit(command("fine", "pass"))
    drive(scheduler, lambda: backend.store.job(ok).state == "completed")
    states = {j.id: (j.state, j.reason) for j in backend.store.jobs()}
    assert states[ok] == ("completed", None)
    assert states[broken][0] == "failed" and "broken" in (states[broken][1] or "")
    assert backend.store.attempts(broken) == []


def test_a_hostile_event_line_is_quarantined_not_fatal(local: Any) -> None:
    backend, scheduler = local
    code = (
        "import os\n"
        "with open(os.environ['GPUFLEET_EVENTS'], 'a') as fh:\n"
        "    fh.write('{\"ts\": 1' + '0' * 400 + ', \"kind\": \"x\"}\\n')\n"
        '    fh.write(\'{"ts": 1.5, "kind": "x", "attempt": \' + \'9\' * 31 + \'}\\n\')\n'
        '    fh.write(\'{"ts": 2.5, "kind": "fine", "attempt": 1}\\n\')\n'
    )
    job = backend.submit(command("hostile", code))
    drive(scheduler, lambda: backend.store.job(job).state == "completed")
    kinds = [e.kind for e in backend.store.events(job)]
    assert "fine" in kinds and "x" not in kinds
    rejected = backend.store.last_event(job, "events_rejected")
    assert rejected is not None and rejected.data["lines"] == 2 and rejected.data["reason"] == "ts is out of range"


def test_read_events_checked_names_each_problem(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('not json\n[1]\n{"ts": "x", "kind": "a"}\n{"ts": 1, "kind": "ok"}\n{"ts": 2, "kind"')
    events, rejected, offset = read_events_checked(path)
    assert [e["kind"] for e in events] == ["ok"]
    assert [r.reason for r in rejected] == ["not valid JSON", "not a JSON object", "ts is not a number"]
    assert offset == path.read_bytes().rfind(b"\n") + 1  # the torn last line waits


def test_a_real_time_signal_does_not_kill_the_scheduler(local: Any) -> None:
    backend, scheduler = local
    job = backend.submit(command("rt", "import os, signal; os.kill(os.getpid(), signal.SIGRTMIN + 1)"))
    drive(scheduler, lambda: backend.store.job(job).state == "failed")
    assert (backend.store.job(job).reason or "").startswith("killed by signal ")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GPUFLEET_SCHEDULER_IDLE_S", "abc"),
        ("GPUFLEET_LOG_EVERY_S", "-1"),
        ("GPUFLEET_METRICS_PORT", "70000"),
        ("GPUFLEET_FAULT", "nan@x"),
        ("GPUFLEET_RESUME", "sometimes"),
    ],
)
def test_bad_environment_values_are_refused_at_submit(
    local: Any, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    backend, _ = local
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=name if name != "GPUFLEET_FAULT" else "invalid fault"):
        backend.submit(command("a", "pass"))
    assert backend.store.jobs() == []


def test_home_and_job_folders_are_private(local: Any, home: Path) -> None:
    backend, _ = local
    job = backend.submit(command("secret", "pass", env={"TOKEN": "s3cr3t"}))
    folder = home / "jobs" / str(job)
    for path in (home, home / "jobs", folder):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in (folder / "spec.json", home / "state.db"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


def toy(name: str, steps: int, step_seconds: float = 0.02) -> Any:
    return parse_spec(
        {
            "name": name,
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": steps, "step_seconds": step_seconds},
            "checkpoint": {"every_steps": 10, "grace_seconds": 20},
        }
    )


def test_a_crash_while_stopping_is_recovered(home: Path) -> None:
    """The scheduler dies after SIGTERM (attempt 'stopping'): the next one finishes the job."""
    backend = LocalBackend(home, spawn=False)
    crashed = LocalScheduler(home, slots=1, poll_s=0.02)
    job = backend.submit(toy("stopping", 200))
    drive(crashed, lambda: (latest_step(backend.store, job) or 0) >= 5)
    backend.preempt(job)
    drive(crashed, lambda: backend.store.attempts(job)[0].state == "stopping")
    crashed.running[job].proc.wait(timeout=60)  # it saves and exits; nobody records it
    crashed.running[job].log.close()
    survivor = LocalScheduler(home, slots=1, poll_s=0.02)
    survivor.adopt_orphans()
    assert backend.store.attempts(job)[0].outcome == "preempted"
    drive(survivor, lambda: backend.store.job(job).state == "completed")
    assert [a.outcome for a in backend.store.attempts(job)] == ["preempted", "completed"]
    survivor.shutdown()


def test_a_crash_before_the_pid_is_recorded_does_not_launch_the_attempt_twice(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LocalBackend(home, spawn=False)
    crashed = LocalScheduler(home, slots=1, poll_s=0.02)
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def keep(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        return proc

    def crash(*args: Any) -> None:
        raise KeyboardInterrupt("the scheduler dies here")

    monkeypatch.setattr(subprocess, "Popen", keep)
    monkeypatch.setattr(crashed.store, "set_attempt_pid", crash)
    job = backend.submit(toy("twice", 40))
    with pytest.raises(KeyboardInterrupt):
        crashed.tick()
    assert backend.store.attempts(job)[0].state == "launching" and backend.store.attempts(job)[0].pid is None
    survivor = LocalScheduler(home, slots=1, poll_s=0.02)
    survivor.adopt_orphans()  # finds the process by its GPUFLEET_* variables and stops it
    assert started[0].wait(timeout=60) in (REQUEUE_EXIT_CODE, -signal.SIGTERM, -signal.SIGKILL)
    for run in crashed.running.values():
        run.log.close()
    drive(survivor, lambda: backend.store.job(job).state == "completed")
    assert [a.n for a in backend.store.attempts(job)] == [1, 2]
    assert len(started) == 2  # attempt 1 once (by the crashed scheduler), attempt 2 once
    survivor.shutdown()


def test_an_attempt_that_finished_unwatched_is_adopted_not_rerun(home: Path) -> None:
    backend = LocalBackend(home, spawn=False)
    crashed = LocalScheduler(home, slots=1, poll_s=0.02)
    job = backend.submit(toy("unwatched", 15, 0.0))
    drive(crashed, lambda: backend.store.attempts(job) != [])
    assert crashed.running[job].proc.wait(timeout=60) == 0  # done while "nobody" watched
    crashed.running[job].log.close()
    survivor = LocalScheduler(home, slots=1, poll_s=0.02)
    survivor.adopt_orphans()
    assert backend.store.job(job).state == "completed"
    assert [a.outcome for a in backend.store.attempts(job)] == ["completed"]


def test_slurm_refuses_a_grace_it_would_ignore_and_a_preemption_of_a_queued_job(home: Path) -> None:
    from gpufleet.backends.slurm.backend import SlurmBackend

    calls: list[list[str]] = []

    def fake(argv: Any) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        out = "4242\n" if argv[0] == "sbatch" else "4242|PENDING|Unknown|Unknown|0:0|0||default\n"
        return subprocess.CompletedProcess(list(argv), 0, out if argv[0] in ("sbatch", "sacct") else "", "")

    backend = SlurmBackend(home, runner=fake)
    job = backend.submit(command("queued", "pass"))
    with pytest.raises(UsageError, match="slurm backend does not support a grace time"):
        backend.preempt(job, grace=5)
    with pytest.raises(UsageError, match="is queued, not running"):
        backend.preempt(job)
    assert not any(c[0] == "scontrol" for c in calls)


def test_a_backend_name_is_registered_once() -> None:
    from gpufleet.backends import Backend, LocalBackend, register, registered

    assert registered()["local"] is LocalBackend
    with pytest.raises(ValueError, match="already registered by LocalBackend"):

        @register("local")
        class Impostor(Backend):  # pragma: no cover - refused at definition
            def _start(self, job_id: int, folder: Path, spec: Any) -> None: ...
            def _preempt(self, job: Any, grace: float | None) -> None: ...
            def _cancel(self, job: Any) -> None: ...

    assert registered()["local"] is LocalBackend


def test_a_dead_local_scheduler_is_noticed_and_replaced(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler that died left its pid file; reading the store starts a new one, which runs the job."""
    from gpufleet.backends import sync_remote
    from gpufleet.backends.local import scheduler_pid

    monkeypatch.setenv("GPUFLEET_SCHEDULER_IDLE_S", "1")
    backend = LocalBackend(home, spawn=False)
    job = backend.submit(command("waiting", "pass"))
    (home / "scheduler.pid").write_text("999999999")  # what a killed scheduler leaves behind
    with pytest.raises(UsageError, match="was not running"):
        sync_remote(home, backend.store)
    deadline = time.monotonic() + 90
    while backend.store.job(job).state != "completed":
        assert time.monotonic() < deadline, "the new scheduler did not run the job"
        time.sleep(0.05)
    while scheduler_pid(home) is not None and time.monotonic() < deadline:  # it idles out by itself
        time.sleep(0.05)


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 4 MiB tmpfs (root only), unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write zeros until the disk is full. Unbuffered: a buffered file would keep the part of its last write the
    disk refused and fail again when closed, depending on how full the disk was to begin with."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass
    return filler


def test_a_full_home_is_one_clear_error_and_scheduling_resumes(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufleet.errors import StoreError

    home = small_disk / "home"
    monkeypatch.setenv("GPUFLEET_HOME", str(home))
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=1, poll_s=0.02)
    job = backend.submit(command("before", "print('x' * 1000)"))
    filler = fill(small_disk)
    with pytest.raises(StoreError, match=f"no space left on {home}"):
        for _ in range(50):  # whatever write hits the full disk first: a submit, an event
            backend.submit(command("during", "pass"))
    with pytest.raises(StoreError, match="no space left"):
        for _ in range(200):
            scheduler.tick()  # the one-line error the daemon loop logs and retries, never a crash
            time.sleep(0.01)
    filler.unlink()
    drive(scheduler, lambda: backend.store.job(job).state == "completed")
    scheduler.shutdown()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_loses_event_lines_not_the_training(capsys: pytest.CaptureFixture[str]) -> None:
    from gpufleet.jobs.events import EventLog

    log = EventLog(Path("/dev/full"))
    log.emit("step", step=1)
    log.emit("step", step=2)
    log.close()
    assert log.dropped == 2
    assert capsys.readouterr().err.count("events not recorded") == 1
