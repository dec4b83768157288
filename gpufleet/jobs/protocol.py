"""The contract between a backend and the training process it starts (no torch import here).

The backend exports these variables to every attempt; ``TrainSession.from_env`` reads them.
"""

from __future__ import annotations

import math
import re
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.errors import UsageError
from gpufleet.paths import checkpoints_dir, events_file, job_dir, spec_file

if TYPE_CHECKING:
    from gpufleet.spec import JobSpec

REQUEUE_EXIT_CODE = 75
"""Exit status of an attempt that saved its state and asks to be requeued (EX_TEMPFAIL)."""

ENV_JOB_ID = "GPUFLEET_JOB_ID"
ENV_ATTEMPT = "GPUFLEET_ATTEMPT"
ENV_JOB_DIR = "GPUFLEET_JOB_DIR"
ENV_SPEC = "GPUFLEET_SPEC"
ENV_CKPT_DIR = "GPUFLEET_CKPT_DIR"
ENV_TIMEOUT = "GPUFLEET_DIST_TIMEOUT_S"
"""The seconds a collective may wait for the other ranks (``distributed.timeout_seconds``)."""
DEFAULT_TIMEOUT_S = 300.0
ENV_EVENTS = "GPUFLEET_EVENTS"
ENV_DATA_DIR = "GPUFLEET_DATA_DIR"
"""The job's data folder: each ``data`` source lands in its ``dest`` under it (set when the spec has ``data``)."""
ENV_FAULT = "GPUFLEET_FAULT"
ENV_LOG_EVERY_S = "GPUFLEET_LOG_EVERY_S"
ENV_WORLD_SIZE = "GPUFLEET_WORLD_SIZE"
ENV_TORCHRUN_SHUTDOWN = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
"""torchrun's seconds between the SIGTERM it forwards to its ranks and its SIGKILL."""
ENV_STRATEGY = "GPUFLEET_DIST_STRATEGY"
"""The spec's ``distributed.strategy`` (``none``, ``ddp``, ``fsdp``): how a script that asks should wrap its model."""
ENV_PRICE = "GPUFLEET_PRICE_PER_GPU_HOUR"
"""The price of one of the attempt's GPUs for an hour (a number, 0 or more): unset, the metrics carry no money."""
ENV_CURRENCY = "GPUFLEET_CURRENCY"
"""The currency of ``GPUFLEET_PRICE_PER_GPU_HOUR`` (default ``USD``)."""
CURRENCY_RE = re.compile(r"[A-Za-z]{2,10}")
"""A currency code as a rate card and ``GPUFLEET_CURRENCY`` may spell it (``USD``, ``eur``); checked on both sides."""
ENV_RECOVERY = "GPUFLEET_RECOVERY"
"""``wait`` when a lost rank is replaced in place (``JobSpec.recovery``), ``continue`` when the survivors
step on without it while it is replaced (``distributed.recovery: continue``); unset: the attempt is requeued."""
ENV_RECOVERY_TIMEOUT = "GPUFLEET_RECOVERY_TIMEOUT_S"
"""Seconds a group may take to re-form in place before the attempt is requeued
(``distributed.recovery_timeout_seconds``)."""
ENV_RDZV_FILE = "GPUFLEET_RDZV_FILE"
"""The rank supervisor's rendezvous file, ``{"generation": G, "master_port": P}``: where a re-formed group meets."""
ENV_GENERATION = "GPUFLEET_GENERATION"
"""The generation of the group a rank joined (0 at the attempt's start, one more at each re-forming)."""
ENV_ELASTIC_LIGHTHOUSE = "GPUFLEET_ELASTIC_LIGHTHOUSE"
"""Under ``recovery: continue``: the attempt's torchft Lighthouse (``http://127.0.0.1:PORT``), where the
replicas agree on who takes part in each step."""
ENV_REPLICA_RANK = "GPUFLEET_REPLICA_RANK"
"""Under ``recovery: continue``: this rank's place among the replicas (each rank is a replica group of one,
so torch sees ``RANK=0``, ``WORLD_SIZE=1``); it picks the rank's share of the global batch."""
ENV_REPLICAS = "GPUFLEET_REPLICAS"
"""Under ``recovery: continue``: how many replicas the job has when none is missing."""
ENV_ELASTIC_EVENTS = "GPUFLEET_ELASTIC_EVENTS"
"""Under ``recovery: continue``: the job's event log for every replica's short-handed steps (only replica 0
gets ``GPUFLEET_EVENTS``, so one session writes the job's events)."""


def _number(raw: str, *, low: float, integer: bool = False) -> bool:
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        return False
    return math.isfinite(value) and value >= low


_CHECKS: dict[str, tuple[Callable[[str], bool], str]] = {
    "GPUFLEET_SCHEDULER_IDLE_S": (lambda v: _number(v, low=0), "seconds, 0 or more (e.g. 10)"),
    ENV_LOG_EVERY_S: (lambda v: _number(v, low=0), "seconds between step events, 0 or more (e.g. 1)"),
    "GPUFLEET_METRICS_PORT": (
        lambda v: _number(v, low=0, integer=True) and int(v) <= 65535,
        "a TCP port 0-65535 (0 picks a free one)",
    ),
    "GPUFLEET_LOCAL_SLOTS": (lambda v: _number(v, low=1, integer=True), "a positive number of virtual GPU slots"),
    "GPUFLEET_RESUME": (lambda v: v in ("auto", "never", "must"), "auto, never or must"),
}


def check_environment(env: Mapping[str, str]) -> None:
    """Refuse a bad ``GPUFLEET_*`` value where it is first read (submit), not when a process dies of it."""
    for name, (valid, hint) in _CHECKS.items():
        raw = env.get(name)
        if raw is not None and raw != "" and not valid(raw.strip()):
            raise UsageError(f"{name}={raw!r} is invalid: give {hint}, or unset it")
    if env.get(ENV_FAULT):
        from gpufleet.jobs.faults import FaultPlan

        FaultPlan.parse(env[ENV_FAULT])


def threads_per_rank(spec: JobSpec) -> int:
    """CPU threads of one rank: the node's ``resources.cpus`` shared by its ranks, at least 1."""
    return max(1, spec.resources.cpus // spec.ranks_per_node)


ONE_RANK_RENDEZVOUS = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "0",
}
"""What torchrun gives a rank, for a world of one process: a script written for torchrun (it reads
``RANK``, ``LOCAL_RANK``, calls ``init_process_group()``) runs unchanged as one process. Port 0: the
one rank's store binds a free port (no peer ever connects), so nothing is picked before the start."""


def torchrun_launched(spec: JobSpec) -> bool:
    """Whether gpufleet starts the job's ranks with torchrun: a ``distributed`` block whose launcher is torchrun.

    Also at one rank (``distributed.one_rank``, what a resize to one GPU keeps): the rank then sees
    torchrun's variables and the job keeps writing sharded checkpoints that a group reshards again.
    """
    return spec.distributed is not None and spec.distributed.launcher == "torchrun"


def job_environment(spec: JobSpec, job_id: int, home: Path, backend: str) -> dict[str, str]:
    """What every attempt of ``job_id`` gets on top of its environment (``GPUFLEET_ATTEMPT`` aside).

    A job of one rank also gets torchrun's rendezvous variables (:data:`ONE_RANK_RENDEZVOUS`, unless
    its spec's ``env`` sets them), whoever starts it; the ranks of a group get theirs from their launcher.
    """
    folder = job_dir(home, job_id)
    timeout = spec.distributed.timeout_seconds if spec.distributed is not None else DEFAULT_TIMEOUT_S
    group: dict[str, str] = {}
    if spec.world_size == 1:  # torchrun, where it starts the one rank, sets the same for it
        group.update(ONE_RANK_RENDEZVOUS)
    if torchrun_launched(spec) or spec.world_size > 1:
        # torchrun gives its ranks this long between its SIGTERM and its SIGKILL (30 s by default):
        # the job's grace, so a preempted group has the whole grace to save, as one process has.
        group[ENV_TORCHRUN_SHUTDOWN] = str(math.ceil(spec.checkpoint.grace_seconds))
    return {
        **group,
        **spec.env,
        "GPUFLEET_HOME": str(home),
        ENV_JOB_ID: str(job_id),
        "GPUFLEET_JOB_NAME": spec.name,
        "GPUFLEET_TEAM": spec.team,
        ENV_JOB_DIR: str(folder),
        ENV_SPEC: str(spec_file(home, job_id)),
        ENV_CKPT_DIR: str(checkpoints_dir(home, job_id)),
        ENV_EVENTS: str(events_file(home, job_id)),
        **({ENV_DATA_DIR: str(folder / "data")} if spec.data is not None else {}),
        "GPUFLEET_BACKEND": backend,
        ENV_WORLD_SIZE: str(spec.world_size),
        ENV_STRATEGY: spec.distributed.strategy if spec.distributed is not None else "none",
        ENV_TIMEOUT: repr(float(timeout)),
        "OMP_NUM_THREADS": str(threads_per_rank(spec)),
        **recovery_environment(spec),
    }


def recovery_environment(spec: JobSpec) -> dict[str, str]:
    """``GPUFLEET_RECOVERY`` (``wait``, ``continue``) and its timeout for a group that recovers in place, else nothing.

    Only gpufleet's own launcher can replace a rank (``launcher: torchrun``, one node); elsewhere a
    lost rank requeues the attempt whatever the spec asks.
    """
    mode = spec.recovery
    if mode == "requeue" or spec.distributed is None or not torchrun_launched(spec) or spec.resources.nodes > 1:
        return {}
    return {
        ENV_RECOVERY: mode,
        ENV_RECOVERY_TIMEOUT: repr(float(spec.distributed.recovery_timeout_seconds)),
    }


def exit_reason(code: int) -> str:
    """``exit code 3`` or ``killed by SIGKILL``; a signal outside Python's enum (a real-time one) by number."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


PYTHON_RE = re.compile(r"^python(?:3(?:\.\d+)?)?$")
"""A bare ``python``, ``python3`` or ``python3.X``: gpufleet's own interpreter, not the first on PATH."""


def rerun_argv(command: list[str]) -> list[str] | None:
    """``python train.py ARGS`` / ``python -m pkg.mod ARGS`` as arguments of ``gpufleet.runtime.launch``.

    ``--script train.py ARGS`` / ``--module pkg.mod ARGS``: the launcher runs the script with ``runpy``
    and can run it again in the same process when its group re-forms. ``None`` for any other command
    (another interpreter, options before the script, a shell script): it cannot be re-run in process.
    """
    if len(command) < 2 or not PYTHON_RE.match(command[0]):
        return None
    if command[1] == "-m":
        if len(command) < 3 or not command[2] or command[2].startswith("-"):
            return None
        return ["--module", *command[2:]]
    if command[1].startswith("-"):
        return None
    return ["--script", *command[1:]]


def rank_argv(spec: JobSpec) -> list[str]:
    """The process one rank runs: the launcher for ``module:function``, else the command.

    A command that starts with a bare ``python`` (``python train.py``) runs under the interpreter
    gpufleet itself runs in, so it sees the same packages (torch, gpufleet); give a path
    (``/usr/bin/python3``, ``.venv/bin/python``) to choose another. Under ``distributed.recovery:
    wait`` such a command runs through ``gpufleet.runtime.launch`` (:func:`rerun_argv`).
    """
    rerun = rerun_argv(spec.command or []) if recovery_environment(spec) else None
    if spec.callable_entrypoint:
        argv = [sys.executable, "-m", "gpufleet.runtime.launch"]
    elif rerun is not None:  # ``distributed.recovery: wait``: the launcher re-runs it in process
        argv = [sys.executable, "-m", "gpufleet.runtime.launch", *rerun]
    else:
        argv = list(spec.command or [])
        if argv and PYTHON_RE.match(argv[0]):
            argv[0] = sys.executable
    if spec.data is not None:
        # Stage the data first (once per attempt and node: the other ranks wait, then go on), then
        # become the rank's process.
        return [sys.executable, "-m", "gpufleet.data.stage_in", "--", *argv]
    return argv


def entry_argv(spec: JobSpec) -> list[str]:
    """The process an attempt runs: one rank (:func:`rank_argv`), or the group launcher over its ranks.

    A job with a ``distributed`` block under ``launcher: torchrun`` (one rank too, see
    :func:`torchrun_launched`) runs ``gpufleet.backends.group_launch``, which starts torchrun with
    ``resources.gpus`` ranks of :func:`rank_argv`: what follows ``--`` is the arguments of
    gpufleet's interpreter (``-m gpufleet.runtime.launch``, ``train.py --lr 3e-3``), or, after
    ``--no-python``, a command run as it is (another interpreter, a shell script).
    """
    argv = rank_argv(spec)
    if not torchrun_launched(spec):
        return argv
    group = [sys.executable, "-m", "gpufleet.backends.group_launch", f"--nproc-per-node={spec.ranks_per_node}"]
    if argv and argv[0] == sys.executable:
        return [*group, "--", *argv[1:]]
    return [*group, "--no-python", "--", *argv]


__all__ = [
    "CURRENCY_RE",
    "DEFAULT_TIMEOUT_S",
    "ENV_ATTEMPT",
    "ENV_CKPT_DIR",
    "ENV_CURRENCY",
    "ENV_DATA_DIR",
    "ENV_ELASTIC_EVENTS",
    "ENV_ELASTIC_LIGHTHOUSE",
    "ENV_EVENTS",
    "ENV_FAULT",
    "ENV_GENERATION",
    "ENV_JOB_DIR",
    "ENV_JOB_ID",
    "ENV_LOG_EVERY_S",
    "ENV_PRICE",
    "ENV_RDZV_FILE",
    "ENV_RECOVERY",
    "ENV_RECOVERY_TIMEOUT",
    "ENV_REPLICAS",
    "ENV_REPLICA_RANK",
    "ENV_SPEC",
    "ENV_STRATEGY",
    "ENV_TIMEOUT",
    "ENV_TORCHRUN_SHUTDOWN",
    "ENV_WORLD_SIZE",
    "ONE_RANK_RENDEZVOUS",
    "PYTHON_RE",
    "REQUEUE_EXIT_CODE",
    "check_environment",
    "entry_argv",
    "exit_reason",
    "job_environment",
    "rank_argv",
    "recovery_environment",
    "rerun_argv",
    "threads_per_rank",
    "torchrun_launched",
]
