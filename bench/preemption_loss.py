"""Steps lost at a preemption whose grace time is longer than the save: the real thing, end to end.

    .venv/bin/python bench/preemption_loss.py [--json] [--trials 3] [--steps 400] [--grace 30] [--seed N]

Each trial starts the local backend's scheduler in this process on a fresh ``GPUFLEET_HOME``,
submits ``gpufleet.workloads.tinylm:train`` (small model, ``checkpoint.every_steps`` larger than
the run, so the only checkpoint before the signal is the preemption one), waits until the job
reports step >= 30, waits a random moment more, and preempts it (SIGTERM, SIGKILL after the
grace). It keeps ticking until the job is requeued and its second attempt has restored, then
compares, from the store's events:

* completed: the last step the first attempt completed (max ``step`` of its ``checkpoint`` and
  ``session_end`` events), and the step at which SIGTERM arrived (its ``preempt_signal``);
* restored: the ``step`` of the second attempt's ``restore`` event.

Steps lost = completed - restored. Target: 0 in every trial (and no SIGKILL). Also shown: the
time from SIGTERM to the process's exit, against the grace. The job is cancelled afterwards and
the scheduler shut down; the script checks that none of its child processes is left.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _common as common

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.errors import GpufleetError
from gpufleet.jobs.store import TERMINAL, Event, Store, latest_step
from gpufleet.spec import parse_spec

MIN_STEP = 30
PHASE_TIMEOUT_S = 180.0


@dataclass
class Trial:
    n: int
    job_id: int = 0
    preempt_delay_s: float = 0.0
    step_seen_at_preempt: int | None = None
    sigterm_step: int | None = None
    """Step count when the first attempt saw SIGTERM (its ``preempt_signal`` event)."""
    completed_step: int | None = None
    """Last step the first attempt completed (``checkpoint`` / ``session_end`` events)."""
    preempt_checkpoint_step: int | None = None
    attempt1_checkpoints: list[str] = field(default_factory=list)
    """``reason`` of each checkpoint the first attempt wrote (expected: just ``preempt``)."""
    restored_step: int | None = None
    steps_lost: int | None = None
    attempt1_exit_code: int | None = None
    attempt1_outcome: str | None = None
    sigkilled: bool = False
    sigterm_to_exit_s: float | None = None
    """From the scheduler's SIGTERM to the attempt's reaped exit (includes up to one poll)."""
    sigterm_to_session_end_s: float | None = None
    """From the scheduler's SIGTERM to the runtime's last event (``session_end``)."""
    preempt_save_s: float | None = None
    grace_s: float = 0.0
    final_state: str | None = None
    leftover_children: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.steps_lost == 0
            and not self.sigkilled
            and self.sigterm_step is not None
            and self.attempt1_exit_code == 75
            and not self.leftover_children
        )


def child_pids() -> list[int]:
    """PIDs of this process's live children (from ``/proc``)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="utf-8")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def runtime_events(store: Store, job_id: int, attempt: int, kinds: tuple[str, ...]) -> list[Event]:
    return [e for e in store.events(job_id, kinds=kinds) if e.attempt == attempt and e.source == "runtime"]


def tick_until(scheduler: LocalScheduler, what: str, done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        scheduler.tick()
        time.sleep(scheduler.poll_s)


def run_trial(n: int, *, steps: int, grace: float, rng: random.Random, threads: int) -> Trial:
    trial = Trial(n=n, grace_s=grace)
    home = Path(tempfile.mkdtemp(prefix=f"gpufleet-bench-preempt-{n}-"))
    old_home = os.environ.get("GPUFLEET_HOME")
    os.environ["GPUFLEET_HOME"] = str(home)
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=1, poll_s=0.05)
    store = backend.store
    try:
        spec = parse_spec(
            {
                "name": "bench-preemption",
                "entrypoint": "gpufleet.workloads.tinylm:train",
                "args": {"steps": steps, "embed": 64, "eval_batches": 2},
                "resources": {"gpus": 1, "cpus": threads},
                "checkpoint": {"every_steps": 1000, "keep": 3, "grace_seconds": grace},
                "max_restarts": 3,
            },
            source="bench",
        )
        job_id = trial.job_id = backend.submit(spec)

        def attempts() -> int:
            return len(store.attempts(job_id))

        def progressed() -> bool:
            step = latest_step(store, job_id)
            if store.job(job_id).state in TERMINAL:
                raise RuntimeError(f"job ended ({store.job(job_id).state}) before step {MIN_STEP}")
            return attempts() == 1 and step is not None and step >= MIN_STEP

        tick_until(scheduler, f"step >= {MIN_STEP}", progressed, PHASE_TIMEOUT_S)
        trial.preempt_delay_s = rng.uniform(0.0, 1.5)
        deadline = time.monotonic() + trial.preempt_delay_s
        tick_until(scheduler, "the random delay", lambda: time.monotonic() >= deadline, PHASE_TIMEOUT_S)
        trial.step_seen_at_preempt = latest_step(store, job_id)
        backend.preempt(job_id, grace=grace)
        common.progress(
            f"trial {n}: preempting job {job_id} at reported step {trial.step_seen_at_preempt} "
            f"(+{trial.preempt_delay_s:.2f}s after step >= {MIN_STEP}), grace {grace:.0f}s"
        )

        def restored() -> bool:
            if store.job(job_id).state in TERMINAL:
                raise RuntimeError(f"job became {store.job(job_id).state} instead of restarting")
            return bool(runtime_events(store, job_id, 2, ("restore",)))

        tick_until(scheduler, "the second attempt's restore", restored, PHASE_TIMEOUT_S)
        measure(store, trial)
        backend.cancel(job_id)
        tick_until(scheduler, "the cancel", lambda: store.job(job_id).state in TERMINAL, PHASE_TIMEOUT_S)
        trial.final_state = store.job(job_id).state
    except (TimeoutError, RuntimeError, GpufleetError) as err:
        trial.error = str(err)
    finally:
        scheduler.shutdown(grace_s=5.0)  # SIGTERM, then SIGKILL, whatever still runs; reaps it
        trial.leftover_children = child_pids()
        scheduler.store.close()
        store.close()
        if old_home is None:
            os.environ.pop("GPUFLEET_HOME", None)
        else:
            os.environ["GPUFLEET_HOME"] = old_home
        shutil.rmtree(home, ignore_errors=True)
    return trial


def measure(store: Store, trial: Trial) -> None:
    job_id = trial.job_id
    first = runtime_events(store, job_id, 1, ("checkpoint", "session_end", "preempt_signal"))
    completed = [int(e.data["step"]) for e in first if e.kind in ("checkpoint", "session_end") and "step" in e.data]
    trial.completed_step = max(completed) if completed else None
    signals = [e for e in first if e.kind == "preempt_signal"]
    trial.sigterm_step = int(signals[0].data["step"]) if signals else None
    trial.attempt1_checkpoints = [str(e.data.get("reason")) for e in first if e.kind == "checkpoint"]
    saves = [e for e in first if e.kind == "checkpoint" and e.data.get("reason") == "preempt"]
    if saves:
        trial.preempt_checkpoint_step = int(saves[-1].data["step"])
        trial.preempt_save_s = float(saves[-1].data["seconds"])
    restores = runtime_events(store, job_id, 2, ("restore",))
    step = restores[0].data.get("step")
    trial.restored_step = int(step) if isinstance(step, int) else 0
    if trial.completed_step is not None:
        trial.steps_lost = trial.completed_step - trial.restored_step
    attempt1 = store.attempts(job_id)[0]
    trial.attempt1_exit_code = attempt1.exit_code
    trial.attempt1_outcome = attempt1.outcome
    trial.sigkilled = bool([e for e in store.events(job_id, kinds=("sigkill",)) if e.attempt == 1])
    if attempt1.sigterm_at is not None and attempt1.ended_at is not None:
        trial.sigterm_to_exit_s = attempt1.ended_at - attempt1.sigterm_at
    ends = [e for e in first if e.kind == "session_end"]
    if attempt1.sigterm_at is not None and ends:
        trial.sigterm_to_session_end_s = ends[-1].ts - attempt1.sigterm_at


def main(argv: list[str]) -> int:
    p = common.parser("Steps lost when a tinylm job is preempted with a grace longer than its save.")
    p.add_argument("--trials", type=int, default=3, help="preemptions to run (default 3)")
    p.add_argument("--steps", type=int, default=400, help="steps of the job (default 400)")
    p.add_argument("--grace", type=float, default=30.0, help="grace seconds between SIGTERM and SIGKILL (default 30)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of the job (default 1)")
    p.add_argument("--seed", type=int, default=None, help="seed of the random preemption moments")
    args = p.parse_args(argv)
    if args.trials < 1 or args.steps <= MIN_STEP + 20 or args.grace <= 0 or args.threads < 1:
        p.error(f"need --trials >= 1, --steps > {MIN_STEP + 20}, --grace > 0, --threads >= 1")
    rng = random.Random(args.seed)
    trials = []
    for n in range(1, args.trials + 1):
        trial = run_trial(n, steps=args.steps, grace=args.grace, rng=rng, threads=args.threads)
        trials.append(trial)
        common.progress(
            f"trial {n}: sigterm at step {trial.sigterm_step}, completed {trial.completed_step}, "
            f"restored {trial.restored_step}, lost {trial.steps_lost}"
            + (f", error: {trial.error}" if trial.error else "")
        )
    ok = all(t.ok for t in trials) and not child_pids()

    def show(value: float | int | None, fmt: str = "{}") -> str:
        return "-" if value is None else fmt.format(value)

    rows = [
        [
            str(t.n),
            show(t.step_seen_at_preempt),
            show(t.sigterm_step),
            show(t.completed_step),
            show(t.restored_step),
            show(t.steps_lost),
            show(t.preempt_save_s, "{:.3f}"),
            show(t.sigterm_to_session_end_s, "{:.2f}"),
            show(t.sigterm_to_exit_s, "{:.2f}"),
            f"{t.grace_s:.0f}",
            show(t.attempt1_exit_code),
            "yes" if t.sigkilled else "no",
            "ok" if t.ok else (t.error or "FAIL"),
        ]
        for t in trials
    ]
    table = common.format_table(
        f"Preemption of tinylm ({args.steps} steps, embed 64, checkpoint every 1000 steps), {args.trials} trial(s)",
        [
            "trial",
            "seen",
            "sigterm@",
            "completed",
            "restored",
            "lost",
            "save s",
            "term->end s",
            "term->exit s",
            "grace s",
            "exit",
            "kill",
            "",
        ],
        rows,
    )
    table += (
        "\nseen: step the store showed when preempting; sigterm@: step count when SIGTERM arrived; completed: last"
        "\nstep attempt 1 completed; restored: step attempt 2 restored; target: lost = 0 in every trial, no SIGKILL"
    )
    leftover = child_pids()
    table += "\ncheckpoints written by attempt 1: " + "; ".join(
        f"trial {t.n}: {', '.join(t.attempt1_checkpoints) or 'none'}" for t in trials
    )
    table += f"\nchild processes left behind: {len(leftover)}"
    worst = max((t.steps_lost for t in trials if t.steps_lost is not None), default=None)
    exits = [t.sigterm_to_exit_s for t in trials if t.sigterm_to_exit_s is not None]
    result: dict[str, Any] = {
        "benchmark": "preemption_loss",
        "steps": args.steps,
        "grace_s": args.grace,
        "trials": [{**asdict(t), "ok": t.ok} for t in trials],
        "max_steps_lost": worst,
        "max_sigterm_to_exit_s": max(exits) if exits else None,
        "leftover_children": leftover,
        "target": {"steps_lost": 0},
    }
    verdict = f"steps lost per trial: {[t.steps_lost for t in trials]} (target 0 in every trial)"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
