"""``distributed.recovery: wait`` on the local backend: a lost rank is replaced, the survivors keep their processes.

A 2-rank DDP job (gloo on CPU) loses a rank to ``kill -9`` mid-run: the rank supervisor starts a
replacement, the survivor re-runs its entrypoint in the same process, the group re-forms, and the
job completes in its first attempt, bitwise equal to the same job run without a kill. A rank's own
error still fails the job, a SIGTERM still requeues it, and a group that cannot re-form in time
falls back to the requeue.
"""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_bitwise_equal, drive, final_dcp_state

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.jobs.events import EventKind
from gpufleet.spec import JobSpec, parse_spec
from gpufleet.workloads.tinylm import TINY

STEPS = 16
_REFERENCE: dict[str, dict[str, Any]] = {}
"""The final state of the uninterrupted tinylm job, run once for every test of this module that needs it."""

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from gpufleet.runtime import TrainSession

    steps, fail_at = int(sys.argv[1]), int(os.environ.get("FAIL_AT", "0"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = DistributedDataParallel(layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with TrainSession.from_env(model=model, optimizer=optimizer, total_steps=steps) as session:
        for step in session.steps():
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1000 * step + rank))
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.report(loss)
            if rank == 1 and session.step == fail_at:
                raise ValueError(f"a bad batch at step {fail_at}")
            time.sleep(0.15)
    dist.destroy_process_group()
    """
)


def spec_of(name: str, **distributed: Any) -> JobSpec:
    """tinylm with DDP over 2 ranks, a checkpoint every step, paced so that a kill lands mid-run."""
    return parse_spec(
        {
            "name": name,
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": {**TINY, "steps": STEPS, "step_seconds": 0.15},
            "resources": {"nodes": 1, "gpus": 2, "cpus": 2},
            "distributed": {"strategy": "ddp", "timeout_seconds": 30, "recovery": "wait", **distributed},
            "checkpoint": {"every_steps": 1, "grace_seconds": 60},
            "max_restarts": 3,
        }
    )


@pytest.fixture
def local2(home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=2, poll_s=0.05)
    yield backend, scheduler
    scheduler.shutdown(grace_s=30)


def events(backend: LocalBackend, job: int, kind: str) -> list[dict[str, Any]]:
    return [{**e.data, "attempt": e.attempt, "ts": e.ts} for e in backend.store.events(job, kinds=[kind])]


def finish(backend: LocalBackend, scheduler: LocalScheduler, job: int) -> None:
    drive(scheduler, lambda: backend.store.job(job).state in ("completed", "failed"), timeout=600)


def rank_pids(backend: LocalBackend, job: int) -> dict[int, int]:
    """Rank -> PID, from the first ``group`` event of the job's first attempt."""
    group = next(e for e in events(backend, job, EventKind.GROUP) if e["attempt"] == 1)
    return {int(r["rank"]): int(r["pid"]) for r in group["ranks"]}


def stepped_past(backend: LocalBackend, job: int, step: int) -> bool:
    return any(e["step"] >= step for e in events(backend, job, EventKind.STEP))


def straight(backend: LocalBackend, scheduler: LocalScheduler, spec: JobSpec) -> dict[str, Any]:
    """The final state of ``spec`` run without interruption (tinylm's: once per module)."""
    key = f"{spec.entrypoint} {sorted(spec.args.items())}" if spec.callable_entrypoint else ""
    if key not in _REFERENCE or not key:
        job = backend.submit(spec.copy_with(name="straight"))
        finish(backend, scheduler, job)
        assert backend.store.job(job).state == "completed", backend.store.job(job).reason
        _REFERENCE[key] = final(backend.home, job)
    return _REFERENCE[key]


def final(home: Path, job: int) -> dict[str, Any]:
    return final_dcp_state(home, job, step=STEPS)


def script_spec(folder: Path, name: str, **env: str) -> JobSpec:
    """The script above as a `python train.py` command, under `recovery: wait`."""
    (folder / "train.py").write_text(SCRIPT)
    return parse_spec(
        {
            "name": name,
            "entrypoint": f"python train.py {STEPS}",
            "workdir": str(folder),
            "env": env,
            "resources": {"nodes": 1, "gpus": 2, "cpus": 2},
            "distributed": {"strategy": "ddp", "timeout_seconds": 30, "recovery": "wait"},
            "checkpoint": {"every_steps": 1, "grace_seconds": 60},
            "max_restarts": 0,
        }
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("victim", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_a_killed_rank_is_replaced_and_the_job_completes_in_its_first_attempt_bit_exact(
    home: Path, local2: Any, victim: int
) -> None:
    backend, scheduler = local2
    spec = spec_of("cut")
    reference = straight(backend, scheduler, spec)
    job = backend.submit(spec)
    drive(scheduler, lambda: stepped_past(backend, job, 5), timeout=600)
    pids = rank_pids(backend, job)
    os.kill(pids[victim], signal.SIGKILL)
    finish(backend, scheduler, job)
    done = backend.store.job(job)
    assert done.state == "completed" and done.restarts == 0, done.reason
    assert [a.outcome for a in backend.store.attempts(job)] == ["completed"]
    reformed = events(backend, job, EventKind.GROUP_REFORMED)
    assert len(reformed) == 1 and reformed[0]["replaced"] == [victim] and reformed[0]["generation"] == 1
    survivor = 1 - victim
    assert reformed[0]["pids"][str(survivor)] == pids[survivor]  # the survivor kept its process
    assert reformed[0]["pids"][str(victim)] != pids[victim]
    assert reformed[0]["tier"] == "disk"  # the restore the new generation made (this job has no memory tier)
    log = (home / "jobs" / str(job) / "logs" / "attempt-1.log").read_text()
    assert f"rank {victim} forked from the warm rank server (pid {reformed[0]['pids'][str(victim)]})" in log
    assert_bitwise_equal(final(home, job), reference, f"rank {victim} killed")


@pytest.mark.timeout(900)
def test_a_python_script_entrypoint_recovers_in_process(home: Path, local2: Any, tmp_path: Path) -> None:
    """`python train.py` runs through the launcher (runpy): the survivor runs the script again in its process."""
    backend, scheduler = local2
    spec = script_spec(tmp_path, "script")
    reference = straight(backend, scheduler, spec)
    job = backend.submit(spec)
    drive(scheduler, lambda: stepped_past(backend, job, 5), timeout=600)
    pids = rank_pids(backend, job)
    os.kill(pids[1], signal.SIGKILL)
    finish(backend, scheduler, job)
    assert [a.outcome for a in backend.store.attempts(job)] == ["completed"], backend.store.job(job).reason
    reformed = events(backend, job, EventKind.GROUP_REFORMED)
    assert [e["replaced"] for e in reformed] == [[1]] and reformed[0]["pids"]["0"] == pids[0]
    assert_bitwise_equal(final(home, job), reference, "script, rank 1 killed")


@pytest.mark.slow  # make soak
@pytest.mark.timeout(600)
def test_a_rank_that_fails_with_its_own_error_still_fails_the_job(home: Path, local2: Any, tmp_path: Path) -> None:
    backend, scheduler = local2
    job = backend.submit(script_spec(tmp_path, "fails", FAIL_AT="4"))
    finish(backend, scheduler, job)
    done = backend.store.job(job)
    assert done.state == "failed" and [a.outcome for a in backend.store.attempts(job)] == ["failed"], done.reason
    assert events(backend, job, EventKind.GROUP_REFORMED) == []
    log = (home / "jobs" / str(job) / "logs" / "attempt-1.log").read_text()
    assert "ValueError: a bad batch at step 4" in log and "rank 1 exit code 1" in log


@pytest.mark.timeout(900)
def test_a_sigterm_of_the_group_still_requeues_and_resumes_exactly(home: Path, local2: Any) -> None:
    backend, scheduler = local2
    spec = spec_of("preempted")
    reference = straight(backend, scheduler, spec)
    job = backend.submit(spec)
    drive(scheduler, lambda: stepped_past(backend, job, 5), timeout=600)
    backend.preempt(job)
    finish(backend, scheduler, job)
    assert [a.outcome for a in backend.store.attempts(job)] == ["preempted", "completed"], backend.store.job(job).reason
    assert backend.store.attempts(job)[0].exit_code == 75
    assert events(backend, job, EventKind.GROUP_REFORMED) == []
    assert_bitwise_equal(final(home, job), reference, "preempted once")


@pytest.mark.slow  # make soak
@pytest.mark.timeout(900)
def test_a_group_that_cannot_re_form_in_time_falls_back_to_the_requeue(home: Path, local2: Any) -> None:
    """Rank 0 stopped (SIGSTOP) and rank 1 killed: the group cannot meet; after the recovery timeout
    every rank is ended, the attempt is requeued and the next one resumes from the checkpoint, exactly."""
    backend, scheduler = local2
    spec = spec_of("stuck", recovery_timeout_seconds=3)
    reference = straight(backend, scheduler, spec)
    job = backend.submit(spec)
    drive(scheduler, lambda: stepped_past(backend, job, 5), timeout=600)
    pids = rank_pids(backend, job)
    os.kill(pids[0], signal.SIGSTOP)
    os.kill(pids[1], signal.SIGKILL)
    finish(backend, scheduler, job)
    attempts = backend.store.attempts(job)
    assert [a.outcome for a in attempts] == ["requeued", "completed"], backend.store.job(job).reason
    assert events(backend, job, EventKind.GROUP_REFORMED) == []
    assert "did not re-form within 3 s" in (home / "jobs" / str(job) / "logs" / "attempt-1.log").read_text()
    assert_bitwise_equal(final(home, job), reference, "requeued after the recovery timeout")


@pytest.mark.slow  # make soak
@pytest.mark.timeout(900)
def test_a_stuck_rank_is_found_by_the_others_ended_and_replaced(home: Path, local2: Any) -> None:
    """Rank 1 stopped (alive, silent): rank 0's collective times out, it asks for a new generation, and
    rank 1, silent while rank 0 asked, is SIGKILLed and replaced; the job completes in its first attempt."""
    backend, scheduler = local2
    spec = spec_of("hung", timeout_seconds=8)
    reference = straight(backend, scheduler, spec)
    job = backend.submit(spec)
    drive(scheduler, lambda: stepped_past(backend, job, 5), timeout=600)
    pids = rank_pids(backend, job)
    os.kill(pids[1], signal.SIGSTOP)
    finish(backend, scheduler, job)
    assert [a.outcome for a in backend.store.attempts(job)] == ["completed"], backend.store.job(job).reason
    reformed = events(backend, job, EventKind.GROUP_REFORMED)
    assert [e["replaced"] for e in reformed] == [[1]] and reformed[0]["pids"]["0"] == pids[0]
    log = (home / "jobs" / str(job) / "logs" / "attempt-1.log").read_text()
    assert (
        log.count("stopped answering") == 1 and "rank 1 forked from the warm rank server" in log
    )  # once, not its replacement
    assert_bitwise_equal(final(home, job), reference, "rank 1 stuck")
