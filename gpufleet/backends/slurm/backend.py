"""The Slurm backend: the same JobSpec, submitted with sbatch, followed with squeue and sacct.

A job becomes one Slurm batch job whose script is a few lines of Python (no shell: values are
embedded as Python literals). The script sets the ``GPUFLEET_*`` contract, numbers the attempt
from ``SLURM_RESTART_COUNT`` (unset on the first run), sends its output to
``logs/attempt-<n>.log`` and ``exec``s the entrypoint, so Slurm's SIGTERM at preemption reaches
the training process itself, which saves and exits. Slurm requeues it (``--requeue`` with
``PreemptMode=REQUEUE``); the next run restores the checkpoint.

A job of several ranks (``distributed`` with ``world_size > 1``) is one Slurm task per rank:
``--nodes=N --ntasks-per-node=G --cpus-per-task=cpus/G``. Its script runs ``srun`` as a child
(``runtime.slurm_rank.run_group``); each task maps Slurm's task variables to torch's
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) and becomes the rank.
At a preemption slurmd signals every task once itself, so the script forwards nothing: it waits
for ``srun`` and exits with the group's status (75 when the ranks saved for the preemption or
one of them was lost), the status the local launcher gives. ``srun`` runs with
``--kill-on-bad-exit=0``, so a rank that exits 75 first does not get the others killed before
rank 0 has written the attempt's end: a rank that dies is found by the others through the
process-group timeout (``distributed.timeout_seconds``), and they leave the lost-rank marker
that requeues the attempt. ``--wait`` is that timeout plus :data:`RANK_EXIT_SPREAD_S`: a rank
still running that long after the first one exited is stuck outside any collective (nothing
will end it), and srun SIGKILLs it, where ``--wait=0`` would hold the nodes forever.
``--label`` prefixes each line of the attempt log with its rank. A job under
``launcher: script`` over several nodes gets one task per node with ``NODE_RANK``, ``NNODES``
and the rendezvous address, and launches its own ranks.

Mapping: ``team`` -> ``--account``; ``priority > 0`` -> the high partition, else the low,
preemptible one (``GPUFLEET_SLURM_HIGH`` / ``GPUFLEET_SLURM_LOW``, default ``high`` / ``low``);
``resources.cpus`` -> ``--cpus-per-task``; ``resources.gpus`` -> ``--gres=gpu:N`` on clusters
with GPUs (``GPUFLEET_SLURM_GRES=0`` leaves it out on CPU-only clusters); it is per node, and
every task of a node sees the node's GPUs (``LOCAL_RANK`` picks one). The grace between
SIGTERM and SIGKILL is the cluster's ``KillWait``/``GraceTime``.

State is pulled: ``sync()`` asks ``sacct --duplicates`` for every run of every active job and
rewrites the attempts in the store, so ``jobs``, ``show``, ``logs`` and ``cost`` work unchanged.
An attempt's wall is its run's sacct ``Start``..``End``, the very seconds Slurm bills, not the
runtime's first and last events: the interpreter start before the first event is start-up the
GPUs were held for (see ``slurm_usage``).
``$GPUFLEET_HOME`` must be on a file system the compute nodes share.

Hold and release (``gpufleet hold``/``release``, :attr:`Feature.HOLD`) are ``scontrol hold`` and
``scontrol release``: a held job is pending with the reason ``JobHeldUser`` (``JobHeldAdmin`` when an
administrator held it), which is what :meth:`SlurmBackend.release` checks. Slurm also accepts a hold
of a running job (its priority drops to 0, which only matters once it is requeued): a job that
started between the check and the hold is released again and the hold refused, as on the local
backend.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from gpufleet import numpy_cpu
from gpufleet.backends import lifecycle
from gpufleet.backends.base import Backend, Feature, ingest_events, register
from gpufleet.backends.lifecycle import AttemptEnd, attempt_end
from gpufleet.backends.slurm.fleet import SlurmPlacement, place_on_slurm
from gpufleet.cost.rates import price_environment
from gpufleet.errors import Conflict, ServiceUnavailable, UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.protocol import REQUEUE_EXIT_CODE, entry_argv, job_environment, rank_argv, threads_per_rank
from gpufleet.jobs.store import TERMINAL, Attempt, Job, Store, SyncPlan
from gpufleet.paths import dev_services_dir, job_dir
from gpufleet.spec import JobSpec

START_HINT = "start the development cluster with `scripts/dev-slurm up` (or set SLURM_CONF for yours)"


class Runner(Protocol):
    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]: ...


def slurm_env() -> dict[str, str]:
    """The environment for Slurm client commands: ``SLURM_CONF`` from the dev cluster if unset.

    A batch job takes this environment to its node, which may not be a Zen 4: gpufleet's own numpy
    setting for this machine (``numpy_cpu``) stays here.
    """
    env = numpy_cpu.without_own_setting(os.environ)
    if "SLURM_CONF" not in env:
        state = Path(env.get("GPUFLEET_SLURM_DIR", dev_services_dir("slurm")))
        if (state / "slurm.conf").exists():
            env["SLURM_CONF"] = str(state / "slurm.conf")
    return env


def run_slurm(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command (argument list, never a shell); a clear error when it fails."""
    if shutil.which(argv[0]) is None:
        raise ServiceUnavailable(f"`{argv[0]}` not found: Slurm's client commands are not installed; {START_HINT}")
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=slurm_env(), timeout=60)
    except subprocess.TimeoutExpired:
        raise ServiceUnavailable(f"`{' '.join(argv)}` timed out: is slurmctld running? {START_HINT}") from None
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().splitlines()
        first = message[-1] if message else f"exit code {proc.returncode}"
        if "Unable to contact slurm controller" in proc.stderr or "Connection refused" in proc.stderr:
            raise ServiceUnavailable(f"Slurm controller unreachable ({first}); {START_HINT}")
        raise UsageError(f"{argv[0]} refused: {first}")
    return proc


def partition_for(spec: JobSpec) -> str:
    if spec.priority > 0:
        return os.environ.get("GPUFLEET_SLURM_HIGH", "high")
    return os.environ.get("GPUFLEET_SLURM_LOW", "low")


RANK_EXIT_SPREAD_S = 60
"""Seconds beyond the process-group timeout that the ranks of an attempt may take to exit after
the first one did: the survivors of a dead rank first wait out the timeout, then mark the group
lost and exit; ranks that finish or save for a preemption exit within moments of each other."""


def _launcher(spec: JobSpec) -> str | None:
    return spec.distributed.launcher if spec.distributed is not None else None


def runs_ranks(spec: JobSpec) -> bool:
    """Whether the job's attempt is several Slurm tasks started by ``srun``, not one process.

    A job under ``launcher: script`` on one node is one process, as on the local backend: it
    starts its own ranks.
    """
    if spec.world_size <= 1:
        return False
    return _launcher(spec) == "torchrun" or spec.resources.nodes > 1


def task_shape(spec: JobSpec) -> tuple[int, int]:
    """Slurm tasks per node and CPUs per task: one task per rank, each with its share of the node's CPUs."""
    if runs_ranks(spec) and _launcher(spec) == "torchrun":
        return spec.ranks_per_node, threads_per_rank(spec)
    return 1, spec.resources.cpus


def allocated_cpus(spec: JobSpec) -> int:
    """The CPUs Slurm allocates to the whole job (``CR_CPU``: tasks times CPUs per task)."""
    tasks, cpus = task_shape(spec)
    return spec.resources.nodes * tasks * cpus


def srun_argv(spec: JobSpec) -> list[str]:
    """The ``srun`` that starts the ranks, each behind ``runtime.slurm_rank`` (see the module docstring)."""
    tasks, cpus = task_shape(spec)
    per_node = ["--per-node"] if _launcher(spec) == "script" else []
    shim = [sys.executable, "-m", "gpufleet.backends.slurm.rank", *per_node]
    timeout = spec.distributed.timeout_seconds if spec.distributed is not None else 0.0
    return [
        "srun",
        "--label",
        "--kill-on-bad-exit=0",
        f"--wait={math.ceil(timeout) + RANK_EXIT_SPREAD_S}",
        f"--nodes={spec.resources.nodes}",
        f"--ntasks={spec.resources.nodes * tasks}",
        f"--ntasks-per-node={tasks}",
        f"--cpus-per-task={cpus}",  # srun no longer takes it from the allocation (Slurm 22.05)
        *shim,
        "--",
        *rank_argv(spec),
    ]


def _attempt_start(payload: str) -> str:
    """The start every batch script shares: the environment, the ``attempt_start`` event, the log."""
    return f"""spec = json.loads({payload!r})
attempt = int(os.environ.get("SLURM_RESTART_COUNT") or 0) + 1
os.environ.update(spec["env"])
os.environ["GPUFLEET_ATTEMPT"] = str(attempt)
folder = spec["folder"]
os.makedirs(os.path.join(folder, "logs"), exist_ok=True)
event = {{"ts": time.time(), "attempt": attempt, "kind": "{EventKind.ATTEMPT_START}", "pid": os.getpid(),
         "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "node": os.uname().nodename,
         "gpus": spec["gpus"], "world_size": spec["world_size"]}}
with open(os.path.join(folder, "events.jsonl"), "a") as fh:
    fh.write(json.dumps(event) + "\\n")
log = os.open(os.path.join(folder, "logs", f"attempt-{{attempt}}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.dup2(log, 1)
os.dup2(log, 2)
"""


def batch_script(spec: JobSpec, job_id: int, home: Path) -> str:
    """The batch script: Python, so nothing the user wrote ever meets a shell.

    It starts the entrypoint as its child (``fork`` and ``exec``), or ``srun`` for a job of several
    ranks, behind handlers that only note SIGTERM and SIGINT (Slurm signals the attempt's processes
    itself) and pass on SIGUSR1, the warning ``--signal=B:USR1@N`` sends the script alone, after
    recording it as a ``preemption_notice`` (``rank.BatchSignals``). It outlives the child to exit
    as it did: its status, or killed by the same signal. Its ``attempt_start`` event names the GPUs
    and world size the attempt runs with (``spec.total_gpus``, ``world_size``).
    """
    folder = job_dir(home, job_id)
    env = {**job_environment(spec, job_id, home, "slurm"), **price_environment(spec)}
    size = {"gpus": spec.total_gpus, "world_size": spec.world_size}
    head = f"#!{sys.executable}\n# Written by gpufleet for job {job_id} ({spec.name}); Slurm runs it once per attempt"
    common = {"env": env, "cwd": spec.workdir, "folder": str(folder), "lead": notice_lead_s(spec), **size}
    if not runs_ranks(spec):
        payload = json.dumps({"argv": entry_argv(spec), **common})
        return f"""{head}.
import json, os, signal, sys, time
{_EARLY_SIGNALS}{_attempt_start(payload)}{_notice_handlers()}if spec["cwd"]:
    os.chdir(spec["cwd"])
if signals.stops:
    sys.exit({REQUEUE_EXIT_CODE})
from gpufleet.numpy_cpu import without_own_setting
own = without_own_setting(os.environ)
child = os.fork()
if child == 0:
    try:
        os.execvpe(spec["argv"][0], spec["argv"], own)
    except OSError as err:
        print(f"gpufleet: cannot start {{spec['argv'][0]!r}}: {{err.strerror}}", file=sys.stderr, flush=True)
        os._exit(127)
signals.adopt(child)
sys.exit(exit_like(os.waitpid(child, 0)[1]))
"""
    payload = json.dumps({"srun": srun_argv(spec), **common})
    return f"""{head}, and srun starts its ranks.
import json, os, signal, sys, time
{_EARLY_SIGNALS}{_attempt_start(payload)}{_notice_handlers()}from gpufleet.backends.slurm.rank import run_group
if spec["cwd"]:
    os.chdir(spec["cwd"])
sys.exit(run_group(spec["srun"], attempt, signals.stops, signals.adopt))
"""


def _notice_handlers() -> str:
    """The handlers every batch script installs once the attempt is numbered (see ``rank.BatchSignals``)."""
    return """from gpufleet.backends.slurm.rank import BatchSignals, exit_like
signals = BatchSignals(os.path.join(folder, "events.jsonl"), attempt, spec["lead"]).install(early)
"""


_EARLY_SIGNALS = """early = []
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(sig, lambda signum, frame: early.append(signum))
"""
"""Noted before anything else runs: a stop or a warning during the script's start-up is not lost (nor
kills it), and ``BatchSignals.install`` then acts on each as if it had come after."""


NOTICE_SIGNAL_MAX_S = 65535
"""The most seconds ahead ``sbatch --signal`` takes (Slurm keeps it in 16 bits)."""


def notice_lead_s(spec: JobSpec) -> int:
    """How long before its end Slurm warns the attempt (``--signal=B:USR1@N``): the job's grace time.

    The grace is what the job says a save and exit needs; a warning that much ahead lets the save
    finish before the end. Slurm may send it up to a minute earlier than asked (its timer's step).
    """
    return min(NOTICE_SIGNAL_MAX_S, max(1, math.ceil(spec.checkpoint.grace_seconds)))


def sbatch_argv(
    spec: JobSpec, job_id: int, home: Path, script: Path, placement: SlurmPlacement | None = None
) -> list[str]:
    """The sbatch of one job; ``placement``: the fleet's partition and QOS the planner chose (see ``fleet``)."""
    folder = job_dir(home, job_id)
    tasks, cpus = task_shape(spec)
    shape = ["--nodes=1", "--ntasks=1", f"--cpus-per-task={cpus}"]
    if runs_ranks(spec):
        shape = [f"--nodes={spec.resources.nodes}", f"--ntasks-per-node={tasks}", f"--cpus-per-task={cpus}"]
    argv = [
        "sbatch",
        "--parsable",
        "--requeue",
        "--open-mode=append",
        f"--job-name=gpufleet-{job_id}-{spec.name}",
        f"--account={spec.team}",
        f"--partition={placement.partition if placement else partition_for(spec)}",
        *([f"--qos={placement.qos}"] if placement and placement.qos else []),
        *shape,
        f"--output={folder / 'logs' / 'slurm-%j.out'}",
        "--export=ALL",
        f"--signal=B:USR1@{notice_lead_s(spec)}",
    ]
    # A fleet's quotas are GrpTRES on gres/gpu: its jobs always ask for their GPUs.
    if spec.resources.gpus > 0 and (placement is not None or os.environ.get("GPUFLEET_SLURM_GRES", "1") != "0"):
        argv.append(f"--gres=gpu:{spec.resources.gpus}")
    return [*argv, str(script)]


@dataclass(frozen=True, slots=True)
class SacctRun:
    """One run (attempt) of a Slurm job, as ``sacct --duplicates`` reports it."""

    job_ref: str
    state: str
    start: float | None
    end: float | None
    exit_code: int
    elapsed_s: int
    """``ElapsedRaw``: the seconds Slurm bills, ``End - Start`` for a run that ended."""
    alloc_tres: str
    account: str
    reason: str = ""
    """Why a pending run waits (``QOSGrpGRES``, ``Resources``, ``Priority``...); ``None`` once it runs."""


SACCT_FIELDS = "JobIDRaw,State,Start,End,ExitCode,ElapsedRaw,AllocTRES,Account,Reason"
WAIT_REASONS_SHOWN_AS_QUEUED = frozenset({"", "None", "Priority"})
"""Slurm's reasons that mean only "in the queue": ``gpufleet jobs`` shows no reason for them."""


def _epoch(text: str) -> float | None:
    if text in ("", "Unknown", "None"):
        return None
    return datetime.fromisoformat(text).timestamp()


def parse_sacct(text: str) -> list[SacctRun]:
    """Parse ``sacct -X --duplicates --parsable2 --noheader -o SACCT_FIELDS`` output."""
    runs = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) not in (8, 9) or not parts[0].isdigit():
            continue
        code, _, sig = parts[4].partition(":")
        status = int(code) if code.isdigit() else 0
        if status == 0 and sig.isdigit() and 0 < int(sig) < 128:
            status = -int(sig)  # killed by a signal: negative, as Python reports a child's
        ran = bool(parts[6])  # a job cancelled while pending has a Start (its cancel time) but no AllocTRES
        runs.append(
            SacctRun(
                job_ref=parts[0],
                state=parts[1].split()[0],
                start=_epoch(parts[2]) if ran else None,
                end=_epoch(parts[3]),
                exit_code=status,
                elapsed_s=int(parts[5] or 0),
                alloc_tres=parts[6],
                account=parts[7],
                reason=parts[8] if len(parts) > 8 else "",
            )
        )
    return runs


OUTCOME = {
    "COMPLETED": "completed",
    "PREEMPTED": "preempted",
    "REQUEUED": "requeued",
    "NODE_FAIL": "lost",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "OUT_OF_MEMORY": "failed",
    "CANCELLED": "cancelled",
    "BOOT_FAIL": "lost",
    "DEADLINE": "failed",
}
"""The Slurm states of a run that ended (any other: it has not, or it never started)."""
STOP = {"PREEMPTED": "preempted", "REQUEUED": "preempted", "NODE_FAIL": "lost", "BOOT_FAIL": "lost"}


def run_end(run: SacctRun, *, n: int, max_restarts: int) -> AttemptEnd | None:
    """What run ``n`` of a job means under the one rule of :func:`attempt_end`; ``None`` while it goes on.

    Exit 75 asks for a requeue whatever Slurm called the run (``FAILED``, or ``REQUEUED`` once it
    was); a run Slurm preempted, requeued or lost with its node requeues; a time or memory limit
    fails with Slurm's word for it.
    """
    if run.state not in OUTCOME:
        return None
    if run.state == "CANCELLED":
        return attempt_end(None, "cancelled", attempt=n, restarts=n - 1, max_restarts=max_restarts)
    if run.exit_code == REQUEUE_EXIT_CODE and run.state in ("FAILED", "REQUEUED"):
        return attempt_end(REQUEUE_EXIT_CODE, None, attempt=n, restarts=n - 1, max_restarts=max_restarts)
    if run.state in STOP:
        return attempt_end(None, STOP[run.state], attempt=n, restarts=n - 1, max_restarts=max_restarts)
    if run.state == "COMPLETED":
        return attempt_end(0, None, attempt=n, restarts=n - 1, max_restarts=max_restarts)
    end = attempt_end(run.exit_code or 1, None, attempt=n, restarts=n - 1, max_restarts=max_restarts)
    if run.state != "FAILED":
        return AttemptEnd(end.outcome, end.state, f"Slurm ended the run {run.state}", False)
    return end


def plan_slurm(
    job: Job,
    stored: Sequence[Attempt],
    runs: Sequence[SacctRun],
    now: float,
    placed: Mapping[str, Any] | None = None,
) -> tuple[SyncPlan, str | None]:
    """The store rows for a job's sacct runs, and what Slurm must be told: ``requeue``, ``cancel`` or nothing.

    Attempt ``n`` is the ``n``-th run that started; its wall is sacct's ``Start`` and ``End`` of
    that run, unchanged: whole seconds (slurmctld keeps ``time_t``, truncated), exactly those
    whose difference Slurm bills as ``ElapsedRaw``. The runtime's events fall inside it and only
    split it into buckets. Slurm and gpufleet's rule can disagree on what comes next: a run that
    exited 75 on a cluster without ``RequeueExit=75`` has ended for Slurm (gpufleet requeues it);
    a job preempted once more than its ``max_restarts`` is pending again for Slurm (gpufleet
    cancels it).
    """
    started = sorted((r for r in runs if r.start is not None and r.state != "PENDING"), key=lambda r: r.start or 0)
    pending = any(r.state == "PENDING" for r in runs)
    seen = []
    end: AttemptEnd | None = None
    for n, run in enumerate(started, start=1):
        end = run_end(run, n=n, max_restarts=job.spec.max_restarts)
        start = run.start or 0.0
        stop = None if end is None else (run.end if run.end is not None else start + run.elapsed_s)
        seen.append(
            Attempt(
                job_id=job.id,
                n=n,
                state="ended" if end else "running",
                pid=None,
                started_at=start,
                ended_at=max(stop, start) if stop is not None else None,
                exit_code=run.exit_code if end else None,
                outcome=end.outcome if end else None,
                sigterm_at=None,
                kill_at=None,
            )
        )
    action = None
    reason = f"slurm state {started[-1].state}" if started else None
    if not started:
        cancelled = any(r.state == "CANCELLED" for r in runs)
        state, reason = ("cancelled", "cancelled while queued") if cancelled else ("queued", None)
        waiting = next((r.reason for r in runs if r.state == "PENDING"), "")
        if state == "queued" and waiting not in WAIT_REASONS_SHOWN_AS_QUEUED:
            reason = waiting_reason(waiting, placed, job.team)
    elif end is None:
        state = "running"
    else:
        state, reason = end.state, end.reason or reason
        if end.requeued and not pending and started[-1].state == "FAILED":
            action = "requeue"
        elif state == "failed" and pending:
            action = "cancel"
    # Every run is the same sbatch request (Slurm jobs are not resized): the GPUs the ledger prices it at.
    size = {"gpus": job.spec.total_gpus, "world_size": job.spec.world_size}
    if placed:  # a fleet's job: every run is priced at the offer the planner placed it on
        size.update({k: placed[k] for k in PLACEMENT_KEYS if k in placed})
    details: dict[tuple[int, str], dict[str, Any]] = {
        (n, EventKind.ATTEMPT_START): size for n in range(1, len(seen) + 1)
    }
    plan = lifecycle.plan_sync(
        job, stored, seen, state=state, reason=reason, restarts=max(0, len(started) - 1), now=now, details=details
    )
    return plan, action


PLACEMENT_KEYS = ("offer", "provider", "region", "gpu_type", "spot", "price_per_gpu_hour", "on_demand_per_gpu_hour")
"""What a ``placed`` event gives each attempt's start, for the ledger (``cost.usage.attempt_placement``)."""


HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
"""Slurm's reasons of a pending job that was held (``scontrol hold``): it waits for ``scontrol release``."""
HELD = "held: `gpufleet release` lets it start"
"""A held job's reason, the words the local backend gives it too."""


def waiting_reason(slurm_reason: str, placed: Mapping[str, Any] | None, team: str) -> str:
    """``gpufleet jobs``' words for a pending Slurm job: Slurm's reason, and the quota behind a QOS limit."""
    if slurm_reason in HELD_REASONS:
        return f"{HELD} (Slurm {slurm_reason})"
    text = f"waiting: Slurm {slurm_reason}"
    if placed and slurm_reason.startswith("QOS") and placed.get("qos"):
        text += f" (QOS {placed['qos']}: team {team}'s {placed.get('gpu_type', '?')} quota is full)"
    elif placed and placed.get("partition"):
        text += f" (partition {placed['partition']})"
    return text


@register("slurm")
class SlurmBackend(Backend):
    """Submit to a real Slurm; attempts and states come back through ``sync``."""

    features = frozenset({Feature.MULTI_RANK, Feature.MULTI_NODE, Feature.HOLD})

    def __init__(self, home: Path, runner: Runner = run_slurm) -> None:
        super().__init__(home)
        self.run = runner

    def _admit(self, spec: JobSpec, env: dict[str, str] | None) -> JobSpec:
        return spec.copy_with(env={**spec.env, **(env or {})}) if spec.env or env else spec

    def _start(self, job_id: int, folder: Path, spec: JobSpec) -> None:
        placement = place_on_slurm(self.home, self.store, job_id, spec)
        script = folder / "job.sbatch"
        script.write_text(batch_script(spec, job_id, self.home), encoding="utf-8")
        script.chmod(0o700)
        out = self.run(sbatch_argv(spec, job_id, self.home, script, placement))
        ref = out.stdout.strip().split(";")[0]
        self.store.set_backend_ref(job_id, ref)
        partition = placement.partition if placement else partition_for(spec)
        self.store.add_event(job_id, EventKind.SUBMITTED, slurm_job_id=ref, partition=partition)
        if placement is not None:
            self.store.add_event(job_id, EventKind.PLACED, **placement.event)

    def _refresh(self, job: Job) -> Job:
        self.sync()  # Slurm's view, not the last one stored
        return self.store.job(job.id)

    def _ref(self, job: Job) -> str:
        if not job.backend_ref:
            raise Conflict(f"job {job.id} has no Slurm job id: it was never accepted by sbatch")
        return job.backend_ref

    def _preempt(self, job: Job, grace: float | None) -> None:
        """``scontrol requeue``: Slurm sends SIGTERM, then SIGKILL after KillWait, and requeues."""
        self.run(["scontrol", "requeue", self._ref(job)])
        self.store.add_event(job.id, EventKind.SIGTERM, reason="preempted", via="scontrol requeue")

    def _cancel(self, job: Job) -> None:
        self.run(["scancel", self._ref(job)])

    def _pending_reason(self, job: Job) -> str | None:
        """slurmctld's reason the job waits, now (squeue); ``None`` when it is not pending."""
        ref = self._ref(job)
        try:
            out = self.run(["squeue", "-h", "-t", "PD", "-j", ref, "-o", "%i|%r"])
        except UsageError:  # a job slurmctld no longer knows is not pending
            return None
        for line in out.stdout.splitlines():
            found, _, reason = line.partition("|")
            if found.strip() == ref:
                return reason.strip()
        return None

    def _held(self, job: Job) -> bool:
        return self._pending_reason(job) in HELD_REASONS

    def _hold(self, job: Job, *, held: bool) -> None:
        """``scontrol hold`` / ``scontrol release``; a job that started meanwhile is released again, and refused."""
        ref = self._ref(job)
        if not held:
            self.run(["scontrol", "release", ref])
            self.store.set_reason(job.id, None)
            self.store.add_event(job.id, EventKind.RELEASED, via="scontrol release")
            return
        self.run(["scontrol", "hold", ref])
        if self._pending_reason(job) not in HELD_REASONS:  # it started: Slurm would hold its next run
            self.run(["scontrol", "release", ref])
            raise Conflict(f"job {job.id} started meanwhile: preempt it, then hold it")
        self.store.set_reason(job.id, f"{HELD} (Slurm JobHeldUser)")
        self.store.add_event(job.id, EventKind.HELD, via="scontrol hold")

    # ---- following ---------------------------------------------------------------------------
    def sync(self) -> None:
        """Pull states and runs from Slurm for every active Slurm job; ingest runtime events."""
        jobs = [j for j in self.store.jobs() if j.backend == self.name and j.backend_ref and j.state not in TERMINAL]
        if not jobs:
            return
        refs = ",".join(j.backend_ref or "" for j in jobs)
        out = self.run(["sacct", "-X", "--duplicates", "--parsable2", "--noheader", "-j", refs, "-o", SACCT_FIELDS])
        runs = self._pending_reasons(parse_sacct(out.stdout))
        for job in jobs:
            ingest_events(self.store, self.home, job)
            self._apply(job, sorted((r for r in runs if r.job_ref == job.backend_ref), key=lambda r: r.start or 0))

    def _pending_reasons(self, runs: list[SacctRun]) -> list[SacctRun]:
        """Pending runs with slurmctld's current reason (squeue): sacct keeps the one of the last state change."""
        pending = sorted({r.job_ref for r in runs if r.state == "PENDING"})
        if not pending:
            return runs
        try:
            out = self.run(["squeue", "-h", "-t", "PD", "-j", ",".join(pending), "-o", "%i|%r"])
        except UsageError:  # a job slurmctld no longer knows: sacct's reason stands
            return runs
        now = dict(line.split("|", 1) for line in out.stdout.splitlines() if line.count("|") == 1)
        return [
            dataclasses.replace(r, reason=now[r.job_ref].strip()) if r.state == "PENDING" and r.job_ref in now else r
            for r in runs
        ]

    def _apply(self, job: Job, runs: list[SacctRun]) -> None:
        """Record what sacct says of the job's runs, after telling Slurm what gpufleet's rule decided.

        Slurm is told first: a sync that dies after a requeue finds the job pending next time, and
        one that dies after a cancellation finds it cancelled (which a failed job stays).
        """
        placed = self.store.last_event(job.id, EventKind.PLACED)
        plan, action = plan_slurm(job, self.store.attempts(job.id), runs, time.time(), placed.data if placed else None)
        if action == "requeue":
            try:
                self.run(["scontrol", "requeue", self._ref(job)])
            except UsageError as err:
                if "pending" not in str(err).lower():  # already requeued, its record not yet in sacct
                    raise
        elif action == "cancel":
            self.run(["scancel", self._ref(job)])
        self.store.apply_sync(job, plan)


def _tres_units(tres: str) -> tuple[str, int]:
    """``("gpu", N)`` when the run held GPUs, else ``("cpu", N)``, from sacct's AllocTRES."""
    fields = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
    gpus = fields.get("gres/gpu")
    if gpus and gpus.isdigit() and int(gpus) > 0:
        return "gpu", int(gpus)
    cpus = fields.get("cpu", "0")
    return "cpu", int(cpus) if cpus.isdigit() else 0


def slurm_usage(store: Store, runner: Runner = run_slurm) -> dict[str, Any]:
    """Resource-hours per account from sacct (every run), beside the same from gpufleet's ledger.

    They agree by construction, not within a tolerance: ``sync`` takes each attempt's wall from
    its run's sacct ``Start`` and ``End``, and Slurm bills ``ElapsedRaw = End - Start``, in whole
    seconds that gpufleet neither rounds nor shifts. So a finished run counts the same seconds
    on both sides, however long the interpreter took to write its first event (that time is the
    attempt's start-up). The one allowed gap is a run still going: sacct measures it to its own
    "now" and the ledger to a later one, so each may differ by the seconds between the two
    readings plus one (sacct truncates to the second). Sync the store first (the CLI does):
    an attempt that ended after the last sync is still running in the ledger.
    """
    from gpufleet.cost.usage import store_usages

    jobs = {j.backend_ref: j for j in store.jobs() if j.backend == "slurm" and j.backend_ref}
    if not jobs:
        return {"accounts": [], "ok": True}
    asked = time.time()
    argv = ["sacct", "-X", "--duplicates", "--parsable2", "--noheader", "-j", ",".join(jobs), "-o", SACCT_FIELDS]
    runs = [r for r in parse_sacct(runner(argv).stdout) if r.job_ref in jobs and r.state != "PENDING"]
    sacct: dict[tuple[str, str], int] = {}
    resource_of: dict[int, str] = {}
    running: dict[tuple[str, str], int] = {}
    for run in runs:
        resource, units = _tres_units(run.alloc_tres)
        key = (run.account, resource)
        sacct[key] = sacct.get(key, 0) + run.elapsed_s * units
        resource_of[jobs[run.job_ref].id] = resource
        if OUTCOME.get(run.state) is None:
            running[key] = running.get(key, 0) + units
    ledger: dict[tuple[str, str], float] = {}
    for usage in store_usages(store, job_ids=[j.id for j in jobs.values()]):
        job = store.job(usage.job_id)
        resource = resource_of.get(job.id, "gpu" if job.spec.resources.gpus > 0 else "cpu")
        units = job.spec.total_gpus if resource == "gpu" else allocated_cpus(job.spec)
        key = (job.team, resource)
        ledger[key] = ledger.get(key, 0.0) + usage.wall_s * units
    between = time.time() - asked
    rows = []
    for account, resource in sorted(set(sacct) | set(ledger)):
        billed, mine = sacct.get((account, resource), 0), ledger.get((account, resource), 0.0)
        allowed = running.get((account, resource), 0) * (1.0 + between)
        rows.append(
            {
                "account": account,
                "resource": resource,
                "sacct_hours": round(billed / 3600.0, 6),
                "ledger_hours": round(mine / 3600.0, 6),
                "difference_hours": round((mine - billed) / 3600.0, 6),
                "sacct_seconds": billed,
                "ledger_seconds": round(mine, 3),
                "allowed_seconds": round(allowed, 3),
                "ok": abs(mine - billed) <= allowed + 1e-6,
            }
        )
    return {"accounts": rows, "ok": all(r["ok"] for r in rows)}


__all__ = [
    "HELD",
    "HELD_REASONS",
    "OUTCOME",
    "RANK_EXIT_SPREAD_S",
    "SACCT_FIELDS",
    "START_HINT",
    "STOP",
    "Runner",
    "SacctRun",
    "SlurmBackend",
    "allocated_cpus",
    "batch_script",
    "notice_lead_s",
    "parse_sacct",
    "partition_for",
    "plan_slurm",
    "run_end",
    "run_slurm",
    "runs_ranks",
    "sbatch_argv",
    "slurm_env",
    "slurm_usage",
    "srun_argv",
    "task_shape",
]
