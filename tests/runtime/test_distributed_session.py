"""TrainSession over a group of ranks (torchrun, gloo on CPU): one decision per step, sharded saves.

The ranks agree at each step boundary, so a NaN or a SIGTERM that only one rank sees still makes
every rank roll back, or save and stop, at the same step. Through the local backend, a 2-rank
DDP or FSDP job preempted three times by the scheduler ends bit-identical to the same job run
without interruption, and the ledger prices each attempt's two GPUs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_bitwise_equal, drive, final_dcp_state, straight_and_preempted

from gpufleet.backends.lifecycle import attempt_processes
from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.cost.usage import store_usages
from gpufleet.jobs.events import EventLog, read_events
from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.spec import parse_spec
from gpufleet.telemetry.ranks import rank_findings
from gpufleet.workloads.tinylm import TINY

WORKER = Path(__file__).with_name("dist_session_worker.py")


def torchrun(mode: str, root: Path, agree_every: int = 1) -> int:
    """Two ranks of the worker; torchrun's exit status (1 when a rank exits 75)."""
    root.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    with (root / "torchrun.log").open("w") as log:
        proc = subprocess.run(
            [*argv, str(WORKER), mode, str(root), str(agree_every)], stdout=log, stderr=subprocess.STDOUT, timeout=300
        )
    return proc.returncode


def ranks(root: Path) -> list[dict[str, Any]]:
    return [json.loads((root / f"rank-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("agree_every", [1, 4])
def test_a_nan_on_one_rank_rolls_every_rank_back(tmp_path: Path, agree_every: int) -> None:
    """Agreeing every 4 steps, the NaN of step 6 is judged at step 8 and rolled back the same way."""
    assert torchrun("nan", tmp_path, agree_every) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    first, second = ranks(tmp_path)
    assert first == second and first["rollbacks"] == 1 and first["step"] == 12
    events, _ = read_events(tmp_path / "events.jsonl")
    assert [e["kind"] for e in events].count("rollback") == 1
    unhealthy = next(e for e in events if e["kind"] == "unhealthy")
    assert unhealthy["step"] == 6 and unhealthy["micro_batch"] == 1  # the ranks' mean of that micro-batch: NaN


@pytest.mark.parametrize(("agree_every", "stop"), [(1, 8), pytest.param(4, 8, marks=pytest.mark.slow)])
def test_a_sigterm_on_one_rank_stops_every_rank_at_the_same_saved_step(
    tmp_path: Path, agree_every: int, stop: int
) -> None:
    """SIGTERM during step 7 on rank 1: every rank stops at the same step and saves it (nothing lost).

    Agreeing at every step, step 7's agreement is read at step 8's boundary, which then waits for its
    own agreement and stops there; agreeing every 4, the agreement of step 8 (a checkpoint is due) stops."""
    assert torchrun("signal", tmp_path, agree_every) != 0  # each rank exited 75; torchrun reports a failure
    first, second = ranks(tmp_path)
    assert first == second and first["step"] == stop
    newest = CheckpointDir(tmp_path / "ckpt").scan()[-1]
    assert newest.step == stop and newest.manifest is not None and newest.manifest.world_size == 2
    events, _ = read_events(tmp_path / "events.jsonl")
    assert [e["status"] for e in events if e["kind"] == "session_end"] == ["requeue"]
    # Run again: both ranks resume from step 7 and finish.
    assert torchrun("plain", tmp_path, agree_every) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    resumed = ranks(tmp_path)
    assert [r["step"] for r in resumed] == [12, 12]
    # A resumed rank loaded a sharded checkpoint, and its group still dies with it: no gloo thread
    # is left to take the GIL during the interpreter's finalisation (which aborts the rank).
    assert [r["native_threads"] for r in resumed] == [0, 0]


def test_a_group_refuses_a_single_process_checkpoint_instead_of_starting_over(tmp_path: Path) -> None:
    """A checkpoint written by one process cannot be resharded: the attempt fails saying so, nothing is lost."""
    one = subprocess.run([sys.executable, str(WORKER), "plain", str(tmp_path)], capture_output=True, timeout=300)
    assert one.returncode == 0, one.stderr.decode()[-2000:]
    assert [i.step for i in CheckpointDir(tmp_path / "ckpt").scan()] == [4, 8, 12]
    (tmp_path / "events.jsonl").unlink()
    assert torchrun("plain", tmp_path) != 0
    events, _ = read_events(tmp_path / "events.jsonl")
    end = [e for e in events if e["kind"] == "session_end"]
    assert [e["status"] for e in end] == ["failed"]
    assert "step-00000012 (step 12) was written by a single process" in end[0]["error"]
    assert "resume: never" in end[0]["error"]
    assert [i.step for i in CheckpointDir(tmp_path / "ckpt").scan()] == [4, 8, 12]  # untouched


def test_a_slow_rank_is_found_from_the_waits_of_the_others(tmp_path: Path) -> None:
    """Rank 1 sleeps 60 ms a step after its optimizer: rank 0 waits for it, and diagnosis names it from the
    attempt's phase totals (12 steps are too few for the runtime's online detector, which also compares only
    the forward and backward's own work)."""
    assert torchrun("slow", tmp_path) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    events, _ = read_events(tmp_path / "events.jsonl")
    steps = [e for e in events if e["kind"] == "step"]
    assert all(len(e["rank_wait_s"]) == 2 and len(e["rank_step_s"]) == 2 for e in steps)
    found = rank_findings(events)
    assert [f.rule_id for f in found] == ["straggler"] and found[0].gpus[0].startswith("rank1@")
    named = found[0].to_dict()
    assert named["kind"] == "straggler" and named["rank"] == 1 and named["phase"] == "compute"
    assert named["tax_gpu_seconds"] > 0 and "over attempt 1" in named["text"]


def test_fsdp_on_a_model_without_parameters_fails_the_attempt_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_DIST_STRATEGY", "fsdp")
    assert torchrun("noparams", tmp_path) != 0
    events, _ = read_events(tmp_path / "events.jsonl")
    end = [e for e in events if e["kind"] == "session_end"]
    assert [e["status"] for e in end] == ["failed"] and "no parameters to shard" in end[0]["error"]
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").iterdir())


def backend_steps(home: Path, job: int) -> int:
    spec = parse_spec(json.loads((home / "jobs" / str(job) / "spec.json").read_text()))
    return int(spec.args["steps"])


def tinylm(strategy: str, name: str, agree_every: int = 4) -> Any:
    return parse_spec(
        {
            "name": name,
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": {**TINY, "steps": 30},
            "resources": {"nodes": 1, "gpus": 2, "cpus": 2},
            "distributed": {"strategy": strategy, "timeout_seconds": 120, "agree_every": agree_every},
            "checkpoint": {"every_steps": 5, "grace_seconds": 60},
            "max_restarts": 10,
        }
    )


def final_state(home: Path, job: int) -> dict[str, Any]:
    return final_dcp_state(home, job, step=backend_steps(home, job))


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("strategy", "agree_every"),
    # DDP at the default agreement in `make soak`: FSDP covers it here, DDP agreeing at every step the lag.
    [pytest.param("ddp", 4, marks=pytest.mark.slow), ("fsdp", 4), pytest.param("ddp", 1, id="ddp-agree-every-step")],
)
def test_a_group_preempted_three_times_ends_bit_identical(
    strategy: str, agree_every: int, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agreeing at every step, each agreement is read a step late (``RankAgreement.send``): a SIGTERM is
    acted on one step later, on a step the ranks judged first, and still nothing is lost or changed."""
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=2, poll_s=0.05)
    try:
        targets = random.Random(13).sample(range(3, 26), 3)
        straight, cut = straight_and_preempted(
            backend,
            scheduler,
            tinylm(strategy, "straight", agree_every),
            tinylm(strategy, "cut", agree_every),
            targets,
        )
    finally:
        scheduler.shutdown(grace_s=30)
    job = backend.store.job(cut)
    assert job.state == "completed" and job.restarts == 3, job.reason
    assert [a.outcome for a in backend.store.attempts(cut)] == ["preempted"] * 3 + ["completed"]
    assert_bitwise_equal(final_state(home, cut), final_state(home, straight), strategy)
    steps = backend.store.events(cut, kinds=["step"])
    for n in (1, 2, 3):  # no step lost: a preempted attempt saved its last step, and the next one went on from it
        took = [e.data["step"] for e in steps if e.attempt == n]
        later = [e.data["step"] for e in steps if (e.attempt or 0) > n]
        saved = [e.data["step"] for e in backend.store.events(cut, kinds=["checkpoint"]) if e.attempt == n]
        if took:  # (an attempt preempted as it started, its target already passed, takes none)
            going_on = [took[-1] + 1] if took[-1] < backend_steps(home, cut) else []
            assert saved and took[-1] == max(saved) and later[:1] == going_on, (n, took[-1], saved, later[:1])
    usages = store_usages(backend.store, job_ids=[cut])
    assert len(usages) == 4 and all(u.gpus == 2 for u in usages)  # GPU-hours = wall x 2 ranks


def rank_pid(home: Path, job: int, attempt: int, rank: int) -> int | None:
    """The PID of one rank of an attempt (found by the variables every rank carries)."""
    for pid in attempt_processes(home, job, attempt):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"TORCHELASTIC_RUN_ID" in b"\0".join(environ):
            return pid
    return None


@pytest.mark.timeout(1200)
def test_kill_9_of_any_rank_at_any_moment_requeues_the_group_and_loses_nothing(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three times (ten under ``make soak``), a random rank of the running attempt is SIGKILLed at a
    random moment (saves every 2 steps, so some kills land in a save): the other rank finds the group
    broken, the attempt ends "requeued", the next one resumes from the last complete checkpoint, and
    the job ends bitwise equal to the same job run without a kill."""
    kills = 10 if os.environ.get("GPUFLEET_SOAK") else 3
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    monkeypatch.setenv("GPUFLEET_LOCAL_SLOTS", "2")
    rng = random.Random(2026)
    base = json.loads(tinylm("ddp", "straight").model_dump_json())
    spec = parse_spec(
        {
            **base,
            "args": {**TINY, "steps": 60},
            "checkpoint": {"every_steps": 2, "grace_seconds": 60},
            "max_restarts": 30,
        }
    )
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=2, poll_s=0.05)
    try:
        straight = backend.submit(spec)
        drive(scheduler, lambda: backend.store.job(straight).state in ("completed", "failed"), timeout=600)
        assert backend.store.job(straight).state == "completed", backend.store.job(straight).reason
        cut = backend.submit(spec.copy_with(name="killed"))
        for n in range(1, kills + 1):

            def stepping(n: int = n) -> bool:
                steps = [e for e in backend.store.events(cut, kinds=["step"]) if e.attempt == n]
                return len(steps) >= 2

            drive(scheduler, stepping, timeout=600)
            time.sleep(rng.uniform(0.0, 0.4))  # a random moment of the attempt: a step, a save, a report
            victim = rank_pid(home, cut, n, rng.randrange(2))
            assert victim is not None, f"no rank of attempt {n} found"
            os.kill(victim, signal.SIGKILL)

            def moved_on(n: int = n) -> bool:
                return len(backend.store.attempts(cut)) > n or backend.store.job(cut).state in ("completed", "failed")

            drive(scheduler, moved_on, timeout=600)
            assert backend.store.job(cut).state != "failed", backend.store.job(cut).reason
        drive(scheduler, lambda: backend.store.job(cut).state in ("completed", "failed"), timeout=600)
    finally:
        scheduler.shutdown(grace_s=30)
    job = backend.store.job(cut)
    assert job.state == "completed", job.reason
    attempts = backend.store.attempts(cut)
    assert [a.outcome for a in attempts[:kills]] == ["requeued"] * kills and attempts[-1].outcome == "completed"
    assert_bitwise_equal(final_state(home, cut), final_state(home, straight), f"after {kills} kills")
    assert len(store_usages(backend.store, job_ids=[cut])) == len(attempts)  # every attempt is priced


def test_a_rank_without_the_event_log_keeps_only_its_newest_events() -> None:
    log = EventLog(None, keep_last=3)
    for i in range(1000):
        log.emit("step", step=i)
    assert 3 <= len(log.memory) <= 6 and log.memory[-1]["step"] == 999
    assert len(EventLog(None).memory) == 0  # without keep_last nothing is dropped (tests, plain scripts)
