"""Steps lost at preemptions of a 2-rank DDP job whose grace covers the save: the real thing, end to end.

    .venv/bin/python bench/dist_preemption_loss.py [--json] [--preemptions 3] [--steps 5000] [--grace 30] [--seed N]

The local backend's scheduler runs in this process, with 2 virtual GPU slots, on a fresh
``GPUFLEET_HOME``. One job is submitted in the shape of ``examples/tinylm-ddp.yaml``:
``gpufleet.workloads.tinylm:train`` on 2 ranks with DDP (gloo on CPU, under the group launcher),
with ``checkpoint.every_steps`` larger than the run, so the only checkpoints are the ones saved
at a preemption signal (every rank writes its shards, rank 0 commits). The job is preempted
``--preemptions`` times. Each time, once attempt k has reported ``MIN_PROGRESS`` steps past the
step it started from, and a random moment more, the scheduler sends SIGTERM to the attempt's
process group (the group launcher passes it to every rank; SIGKILL after the grace); then it
ticks until attempt k+1 has restored. From the store's events:

* completed: the last step attempt k completed (max ``step`` of its ``checkpoint`` and
  ``session_end`` events; rank 0 writes the events), and the step at which SIGTERM arrived
  (its ``preempt_signal``);
* restored: the ``step`` of attempt k+1's ``restore`` event.

Steps lost = completed - restored. Target: 0 at every preemption (and no SIGKILL). Once the last
attempt has restored, the job's cost ledger (``gpufleet.cost``, while that attempt still runs) gives
the lost GPU-seconds of each preempted attempt and of the job, the steps it counts as redone, and
the preemption overhead (start-up and restore of the restarts, the saves at the signal). The job
is then cancelled and the scheduler shut down; the script checks that no process of any attempt
(ranks included, found by their ``GPUFLEET_*`` variables) is left.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _common as common
from preemption_loss import child_pids, runtime_events, tick_until

from gpufleet.backends.lifecycle import alive, attempt_processes
from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.cost.ledger import build_ledger
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import job_usages
from gpufleet.errors import GpufleetError
from gpufleet.jobs.store import TERMINAL, Store
from gpufleet.spec import parse_spec

RANKS = 2
MIN_PROGRESS = 20
"""Steps an attempt trains past the one it started from before it may be preempted."""
PHASE_TIMEOUT_S = 300.0
"""A safety net only: every wait is on a state of the job (its events and attempts)."""


@dataclass
class Preemption:
    attempt: int
    preempt_delay_s: float = 0.0
    start_step: int | None = None
    """Step attempt ``attempt`` started training from (its ``train_start``)."""
    step_seen_at_preempt: int | None = None
    sigterm_step: int | None = None
    completed_step: int | None = None
    checkpoints: list[str] = field(default_factory=list)
    """``reason`` of each checkpoint the attempt wrote (expected: just ``preempt``)."""
    restored_step: int | None = None
    steps_lost: int | None = None
    preempt_save_s: float | None = None
    sigterm_to_session_end_s: float | None = None
    """From the scheduler's SIGTERM to rank 0's last event (``session_end``)."""
    sigterm_to_exit_s: float | None = None
    """From the scheduler's SIGTERM to the attempt's reaped exit (every rank, torchrun, the launcher)."""
    exit_code: int | None = None
    outcome: str | None = None
    sigkilled: bool = False
    lost_gpu_s: float | None = None
    """The ledger's lost GPU-seconds of the preempted attempt."""

    @property
    def ok(self) -> bool:
        return self.steps_lost == 0 and not self.sigkilled and self.sigterm_step is not None and self.exit_code == 75


@dataclass
class Run:
    job_id: int = 0
    preemptions: list[Preemption] = field(default_factory=list)
    ledger_lost_gpu_s: float | None = None
    ledger_steps_redone: int | None = None
    ledger_preemption_overhead_gpu_s: float | None = None
    ledger_gpu_s: float | None = None
    final_state: str | None = None
    leftover_processes: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and bool(self.preemptions)
            and all(p.ok for p in self.preemptions)
            and not self.leftover_processes
        )


def trained_step(store: Store, job_id: int, attempt: int) -> int | None:
    """The newest step attempt ``attempt`` reported (``train_start`` or ``step`` events)."""
    steps = [e.data.get("step") for e in runtime_events(store, job_id, attempt, ("train_start", "step"))]
    known = [s for s in steps if isinstance(s, int)]
    return max(known) if known else None


def preempt_once(
    backend: LocalBackend, scheduler: LocalScheduler, job_id: int, attempt: int, *, grace: float, rng: random.Random
) -> Preemption:
    """Let attempt ``attempt`` train, preempt it at a random moment, tick until the next attempt has restored."""
    store = backend.store
    record = Preemption(attempt=attempt)

    def progressed() -> bool:
        job = store.job(job_id)
        if job.state in TERMINAL:
            raise RuntimeError(f"job ended ({job.state}) before attempt {attempt} trained {MIN_PROGRESS} steps")
        starts = runtime_events(store, job_id, attempt, ("train_start",))
        step = trained_step(store, job_id, attempt)
        if not starts or step is None or job.state != "running":
            return False
        record.start_step = int(starts[0].data.get("step") or 0)
        return step >= record.start_step + MIN_PROGRESS

    tick_until(scheduler, f"attempt {attempt} to train {MIN_PROGRESS} steps", progressed, PHASE_TIMEOUT_S)
    record.preempt_delay_s = rng.uniform(0.0, 2.0)
    deadline = time.monotonic() + record.preempt_delay_s
    tick_until(scheduler, "the random delay", lambda: time.monotonic() >= deadline, PHASE_TIMEOUT_S)
    record.step_seen_at_preempt = trained_step(store, job_id, attempt)
    backend.preempt(job_id, grace=grace)
    common.progress(
        f"preemption {attempt}: job {job_id} at reported step {record.step_seen_at_preempt} "
        f"(+{record.preempt_delay_s:.2f}s after step >= {record.start_step} + {MIN_PROGRESS}), grace {grace:.0f}s"
    )

    def restored() -> bool:
        if store.job(job_id).state in TERMINAL:
            raise RuntimeError(f"job became {store.job(job_id).state} instead of restarting")
        return bool(runtime_events(store, job_id, attempt + 1, ("restore",)))

    tick_until(scheduler, f"attempt {attempt + 1}'s restore", restored, PHASE_TIMEOUT_S)
    measure(store, job_id, record)
    return record


def measure(store: Store, job_id: int, record: Preemption) -> None:
    """Fill in what attempt ``record.attempt`` completed and what the next one restored, from the events."""
    n = record.attempt
    mine = runtime_events(store, job_id, n, ("checkpoint", "session_end", "preempt_signal"))
    completed = [int(e.data["step"]) for e in mine if e.kind in ("checkpoint", "session_end") and "step" in e.data]
    record.completed_step = max(completed) if completed else None
    signals = [e for e in mine if e.kind == "preempt_signal"]
    record.sigterm_step = int(signals[0].data["step"]) if signals else None
    record.checkpoints = [str(e.data.get("reason")) for e in mine if e.kind == "checkpoint"]
    saves = [e for e in mine if e.kind == "checkpoint" and e.data.get("reason") == "preempt"]
    record.preempt_save_s = float(saves[-1].data["seconds"]) if saves else None
    step = runtime_events(store, job_id, n + 1, ("restore",))[0].data.get("step")
    record.restored_step = int(step) if isinstance(step, int) else 0
    if record.completed_step is not None:
        record.steps_lost = record.completed_step - record.restored_step
    attempt = next(a for a in store.attempts(job_id) if a.n == n)
    record.exit_code, record.outcome = attempt.exit_code, attempt.outcome
    record.sigkilled = any(e.attempt == n for e in store.events(job_id, kinds=("sigkill",)))
    if attempt.sigterm_at is not None and attempt.ended_at is not None:
        record.sigterm_to_exit_s = attempt.ended_at - attempt.sigterm_at
    ends = [e for e in mine if e.kind == "session_end"]
    if attempt.sigterm_at is not None and ends:
        record.sigterm_to_session_end_s = ends[-1].ts - attempt.sigterm_at


def read_ledger(store: Store, run: Run) -> None:
    """The job's ledger while its last attempt still runs: lost GPU-seconds per preempted attempt and in all."""
    usages = job_usages(store, store.job(run.job_id))
    lost = {u.attempt: u.seconds()["lost"] * u.gpus for u in usages}
    for record in run.preemptions:
        record.lost_gpu_s = lost.get(record.attempt)
    cost = build_ledger(usages, load_rates()).jobs[run.job_id]
    run.ledger_lost_gpu_s = cost.gpu_hours["lost"] * 3600.0
    run.ledger_steps_redone = cost.steps_redone
    run.ledger_preemption_overhead_gpu_s = cost.preemption_overhead_gpu_hours * 3600.0
    run.ledger_gpu_s = cost.total_gpu_hours * 3600.0


def leftovers(home: Path, job_id: int, attempts: int) -> list[int]:
    """Processes of any attempt still alive a few seconds after the scheduler's shut-down (ranks die with torchrun)."""
    deadline = time.monotonic() + 10.0
    while True:
        found = [p for n in range(1, attempts + 1) for p in attempt_processes(home, job_id, n) if alive(p)]
        found += child_pids()
        if not found or time.monotonic() > deadline:
            return sorted(set(found))
        time.sleep(0.1)


def run_job(*, preemptions: int, steps: int, grace: float, rng: random.Random) -> Run:
    run = Run()
    home = Path(tempfile.mkdtemp(prefix="gpufleet-bench-dist-preempt-"))
    saved = common.set_environ({"GPUFLEET_HOME": str(home), "GPUFLEET_LOCAL_SLOTS": str(RANKS)})
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=RANKS, poll_s=0.05)
    store = backend.store
    try:
        spec = parse_spec(
            {
                "name": "bench-dist-preemption",
                "entrypoint": "gpufleet.workloads.tinylm:train",
                "args": {"steps": steps, "embed": 64, "context": 32, "batch_size": 16, "eval_batches": 2},
                "resources": {"gpus": RANKS, "cpus": RANKS},
                "distributed": {"strategy": "ddp", "timeout_seconds": 120},
                "checkpoint": {"every_steps": 10 * steps, "keep": 3, "grace_seconds": grace},
                "max_restarts": preemptions + 2,
            },
            source="bench",
        )
        run.job_id = backend.submit(spec)
        for attempt in range(1, preemptions + 1):
            record = preempt_once(backend, scheduler, run.job_id, attempt, grace=grace, rng=rng)
            run.preemptions.append(record)
            common.progress(
                f"preemption {attempt}: sigterm at step {record.sigterm_step}, completed {record.completed_step}, "
                f"attempt {attempt + 1} restored {record.restored_step}, lost {record.steps_lost}"
            )
        read_ledger(store, run)
        backend.cancel(run.job_id)
        tick_until(scheduler, "the cancel", lambda: store.job(run.job_id).state in TERMINAL, PHASE_TIMEOUT_S)
        run.final_state = store.job(run.job_id).state
    except (TimeoutError, RuntimeError, GpufleetError) as err:
        run.error = str(err)
    finally:
        scheduler.shutdown(grace_s=5.0)  # SIGTERM, then SIGKILL, whatever still runs; reaps it
        if run.job_id:
            run.leftover_processes = leftovers(home, run.job_id, len(store.attempts(run.job_id)))
        scheduler.store.close()
        store.close()
        common.restore_environ(saved)
        shutil.rmtree(home, ignore_errors=True)
    return run


def main(argv: list[str]) -> int:
    p = common.parser("Steps lost when a 2-rank DDP tinylm job is preempted with a grace longer than its save.")
    p.add_argument("--preemptions", type=int, default=3, help="preemptions of the job (default 3)")
    p.add_argument("--steps", type=int, default=5000, help="steps of the job, more than it reaches (default 5000)")
    p.add_argument("--grace", type=float, default=30.0, help="grace seconds between SIGTERM and SIGKILL (default 30)")
    p.add_argument("--seed", type=int, default=None, help="seed of the random preemption moments")
    args = p.parse_args(argv)
    if args.preemptions < 1 or args.steps <= MIN_PROGRESS * (args.preemptions + 1) or args.grace <= 0:
        p.error(f"need --preemptions >= 1, --steps > {MIN_PROGRESS} x (preemptions + 1), --grace > 0")
    run = run_job(preemptions=args.preemptions, steps=args.steps, grace=args.grace, rng=random.Random(args.seed))
    if run.error:
        common.progress(f"error: {run.error}")

    def show(value: float | int | None, fmt: str = "{}") -> str:
        return "-" if value is None else fmt.format(value)

    rows = [
        [
            str(r.attempt),
            show(r.start_step),
            show(r.step_seen_at_preempt),
            show(r.sigterm_step),
            show(r.completed_step),
            show(r.restored_step),
            show(r.steps_lost),
            show(r.preempt_save_s, "{:.3f}"),
            show(r.sigterm_to_session_end_s, "{:.2f}"),
            show(r.sigterm_to_exit_s, "{:.2f}"),
            show(r.exit_code),
            "yes" if r.sigkilled else "no",
            show(r.lost_gpu_s, "{:.3f}"),
            "ok" if r.ok else "FAIL",
        ]
        for r in run.preemptions
    ]
    table = common.format_table(
        f"Preemptions of tinylm on {RANKS} DDP ranks (gloo; {args.steps} steps, embed 64, context 32, batch 16, "
        f"no periodic checkpoint), grace {args.grace:.0f}s",
        [
            "attempt",
            "from",
            "seen",
            "sigterm@",
            "completed",
            "restored",
            "lost",
            "save s",
            "term->end s",
            "term->exit s",
            "exit",
            "kill",
            "lost GPU-s",
            "",
        ],
        rows,
    )
    table += (
        "\nfrom: step the attempt started from; seen: step the store showed when preempting; sigterm@: step count"
        "\nwhen SIGTERM arrived; completed: last step the attempt completed; restored: step the next attempt"
        "\nrestored; lost GPU-s: the ledger's lost bucket of the preempted attempt x its GPUs; target: lost = 0"
        "\nat every preemption, no SIGKILL"
    )
    table += (
        f"\nledger of the job (last attempt running): lost {show(run.ledger_lost_gpu_s, '{:.3f}')} GPU-s, "
        f"steps redone {show(run.ledger_steps_redone)}, preemption overhead "
        f"{show(run.ledger_preemption_overhead_gpu_s, '{:.1f}')} of {show(run.ledger_gpu_s, '{:.1f}')} GPU-s"
    )
    table += f"\nprocesses left behind: {len(run.leftover_processes)}" + (f"\nerror: {run.error}" if run.error else "")
    result: dict[str, Any] = {
        "benchmark": "dist_preemption_loss",
        "ranks": RANKS,
        "steps": args.steps,
        "grace_s": args.grace,
        "preemptions": [{**asdict(r), "ok": r.ok} for r in run.preemptions],
        **{k: v for k, v in asdict(run).items() if k != "preemptions"},
        "max_steps_lost": max((r.steps_lost for r in run.preemptions if r.steps_lost is not None), default=None),
        "target": {"steps_lost": 0},
    }
    verdict = f"steps lost per preemption: {[r.steps_lost for r in run.preemptions]} (target 0 at every one)"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=run.ok)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
