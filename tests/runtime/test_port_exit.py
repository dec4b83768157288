"""How a group's attempt ends: a completed job never hangs or fails at exit, a killed rank requeues.

The launcher rules run over tiny rank scripts under the real group launcher and torchrun; the
ported scripts (``tests/ports``: their own ``init_process_group``, a ``DistributedSampler``, their
own final save and ``destroy_process_group()``) run as jobs of the local backend, repeatedly, under
a CPU burner: 5 runs of each by default, 20 under ``make soak`` (``GPUFLEET_SOAK=1``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import drive

from gpufleet.backends.group_launch import exit_status
from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.jobs.protocol import REQUEUE_EXIT_CODE
from gpufleet.runtime import TrainSession
from gpufleet.runtime.group import apply_default_timeout, rank_end_marker
from gpufleet.spec import JobSpec, parse_spec

PORTS = Path(__file__).resolve().parents[1] / "ports"
RUNS = 20 if os.environ.get("GPUFLEET_SOAK") else 1
"""Jobs of each port: 1 in `make test`, the 20 of the soak (`make soak`) under `GPUFLEET_SOAK=1`."""

RANK = """
import os, signal, sys, time
from pathlib import Path
from gpufleet.runtime.group import mark_session_end, rank_end_marker

mode, rank = sys.argv[1], int(os.environ["RANK"])
ready = os.path.join(os.environ["GPUFLEET_JOB_DIR"], f"ready-{rank}")
if mode == "hang":  # completed, then never exits (not even on SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    mark_session_end(rank, "completed")
    while True:
        time.sleep(1)
if mode == "abort":  # completed, then rank 1 dies of SIGABRT in its teardown
    mark_session_end(rank, "completed")
    if rank == 1:  # once rank 0 has completed too: a loaded machine may start rank 0 last
        while not os.path.exists(str(rank_end_marker(Path(os.environ["GPUFLEET_JOB_DIR"]), 1, 0))):
            time.sleep(0.01)
        os.abort()
if mode == "kill":  # rank 1 is killed while rank 0, with the default SIGTERM handler, waits in its step
    open(ready, "w").close()
    if rank == 1:
        while not os.path.exists(ready.replace("ready-1", "ready-0")):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        time.sleep(1)
if mode == "requeue":  # a preemption: every rank saved and asks to be requeued
    if rank == 0:
        with open(os.environ["GPUFLEET_EVENTS"], "a") as fh:
            fh.write('{"ts": 1, "attempt": 1, "kind": "session_end", "status": "requeue"}\\n')
    sys.exit(75)
"""


def group_launch(tmp_path: Path, mode: str) -> tuple[int, str]:
    """Run the group launcher over 2 ranks of the rank script; its exit status and its log."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {
        **os.environ,
        "GPUFLEET_JOB_DIR": str(tmp_path),
        "GPUFLEET_EVENTS": str(tmp_path / "events.jsonl"),
        "GPUFLEET_ATTEMPT": "1",
        "GPUFLEET_EXIT_GRACE_S": "1",
    }
    argv = [sys.executable, "-m", "gpufleet.backends.group_launch", "--nproc-per-node=2", "--", str(script), mode]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, start_new_session=True)
    return proc.returncode, proc.stdout + proc.stderr


def test_ranks_that_completed_but_do_not_exit_are_ended_and_the_attempt_completes(tmp_path: Path) -> None:
    code, log = group_launch(tmp_path, "hang")
    assert code == 0, log
    assert "every rank completed its session" in log
    assert [rank_end_marker(tmp_path, 1, r).read_text().strip() for r in (0, 1)] == ["completed"] * 2


def test_a_rank_aborting_after_its_session_completed_does_not_fail_the_attempt(tmp_path: Path) -> None:
    code, log = group_launch(tmp_path, "abort")
    assert code == 0, log
    assert "rank 1 was killed by SIGABRT" in log  # said in one line of ours, not torchrun's report
    assert "ChildFailedError" not in log and "Traceback" not in log


def test_a_rank_killed_while_the_other_is_sigtermed_requeues_the_attempt(tmp_path: Path) -> None:
    """No lost-rank marker, no session_end: the survivor died of torchrun's SIGTERM first."""
    code, log = group_launch(tmp_path, "kill")
    assert code == REQUEUE_EXIT_CODE, log
    assert "rank 1 was killed by SIGKILL" in log and "the attempt is requeued" in log


def test_a_preempted_attempt_logs_one_line_and_no_torchrun_traceback(tmp_path: Path) -> None:
    code, log = group_launch(tmp_path, "requeue")
    assert code == REQUEUE_EXIT_CODE, log
    # which rank exits first is a race: torchrun then SIGTERMs the other, and the line says so
    told = [line for line in log.splitlines() if line.startswith("gpufleet: torchrun stopped the group: ")]
    assert len(told) == 1 and "exited 75 (requeue)" in told[0], log
    assert "ChildFailedError" not in log and "Traceback" not in log and "-I -c" not in log
    assert "RuntimeWarning" not in log and "found in sys.modules" not in log


def test_the_exit_status_rule(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    assert exit_status(1, events, 1, rank_exits=[-9, -15]) == REQUEUE_EXIT_CODE  # a killed rank: lost
    assert exit_status(1, events, 1, rank_exits=[3]) == 1  # a rank's own failure stays one
    assert exit_status(1, events, 1, rank_exits=[1, -15]) == 1  # ... also when torchrun then SIGTERMs the other
    assert exit_status(1, events, 1, rank_exits=[75, -9]) == REQUEUE_EXIT_CODE  # a survivor that saw it go
    for rank in (0, 1):
        marker = rank_end_marker(tmp_path, 1, rank)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("completed\n")
    assert exit_status(1, events, 1, world_size=2, rank_exits=[-6]) == 0  # SIGABRT after completing
    assert exit_status(1, events, 1, world_size=2, rank_exits=[1]) == 1  # the script failed after the session
    assert exit_status(1, events, 1, world_size=3, rank_exits=[-6]) == REQUEUE_EXIT_CODE  # rank 2 never completed


def test_the_preemption_handler_stays_until_session_end_is_written(tmp_path: Path) -> None:
    """A SIGTERM while the session writes its end only sets a flag; it cannot kill the rank first."""
    model = __import__("torch").nn.Linear(2, 1)
    seen: list[object] = []
    session = TrainSession(ckpt_dir=tmp_path / "ckpt", model=model, total_steps=1)
    emit = session.events.emit

    def spy(kind: str, **data: object) -> None:
        if kind == "session_end":
            seen.append(signal.getsignal(signal.SIGTERM))
        emit(kind, **data)

    session.events.emit = spy  # type: ignore[method-assign,assignment]
    before = signal.getsignal(signal.SIGTERM)
    with session:
        for _ in session.steps():
            session.report(1.0)
    assert seen and seen[0] not in (signal.SIG_DFL, before)
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_scripts_own_init_process_group_gets_the_jobs_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.distributed_c10d as c10d

    monkeypatch.setattr(c10d, "default_pg_timeout", c10d.default_pg_timeout)
    apply_default_timeout({"GPUFLEET_DIST_TIMEOUT_S": "42"})
    assert c10d._get_default_timeout(c10d.Backend("gloo")) == timedelta(seconds=42)


def _burn(stop: object) -> None:
    while not stop.is_set():  # type: ignore[attr-defined]
        sum(i * i for i in range(10_000))


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """One process spinning on a core for the test's duration (started and stopped here)."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    burner = ctx.Process(target=_burn, args=(stop,), daemon=True)
    burner.start()
    yield
    stop.set()
    burner.join(10)
    if burner.is_alive() and burner.pid is not None:
        os.kill(burner.pid, signal.SIGKILL)


def port_spec(name: str, strategy: str, argv: list[str], workdir: Path) -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "entrypoint": ["python", *argv],
            "workdir": str(workdir),
            "resources": {"gpus": 2, "cpus": 2},
            "distributed": {"strategy": strategy, "timeout_seconds": 120},
            "checkpoint": {"every_steps": 8, "grace_seconds": 30},
            "max_restarts": 0,
        }
    )


@pytest.mark.timeout(3600)
@pytest.mark.parametrize(
    ("strategy", "argv", "saved"),
    [
        ("ddp", [str(PORTS / "ddp_sampler_port.py"), "1", "--samples", "512"], ["snapshot.pt"]),
        ("fsdp", [str(PORTS / "fsdp2_port.py"), "--steps", "8"], ["checkpoints/model_state_dict.pt"]),
    ],
)
def test_the_ported_scripts_complete_every_run_under_load(
    strategy: str,
    argv: list[str],
    saved: list[str],
    home: Path,
    tmp_path: Path,
    cpu_load: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    monkeypatch.setenv("GPUFLEET_EXIT_GRACE_S", "10")
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=2, poll_s=0.05)
    try:
        for run in range(RUNS):
            workdir = tmp_path / f"run-{run}"
            workdir.mkdir()
            job = backend.submit(port_spec(f"{strategy}-port-{run}", strategy, argv, workdir))

            def ended(job: int = job) -> bool:
                return backend.store.job(job).state in ("completed", "failed")

            drive(scheduler, ended, timeout=600)
            log = "\n".join(p.read_text(errors="replace")[-3000:] for p in (home / "jobs" / str(job)).rglob("*.log"))
            assert backend.store.job(job).state == "completed", (backend.store.job(job).reason, log)
            assert [a.outcome for a in backend.store.attempts(job)] == ["completed"]
            assert all((workdir / name).is_file() for name in saved), log
            assert "RuntimeWarning" not in log, log
    finally:
        scheduler.shutdown(grace_s=30)


def test_slurm_a_task_killed_by_a_signal_requeues_and_a_teardown_abort_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """srun (``--kill-on-bad-exit=0``) reports a task killed by signal N as 128 + N."""
    from gpufleet.backends.slurm.rank import run_group

    events = tmp_path / "events.jsonl"
    for name, value in {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GPUFLEET_EVENTS", str(events))
    assert run_group(["sh", "-c", "exit 137"], 1, []) == REQUEUE_EXIT_CODE  # kill -9 of a rank: lost
    assert run_group(["sh", "-c", "exit 3"], 1, []) == 3
    for rank in (0, 1):
        marker = rank_end_marker(tmp_path, 1, rank)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("completed\n")
    assert run_group(["sh", "-c", "exit 134"], 1, []) == 0  # SIGABRT after every rank completed
