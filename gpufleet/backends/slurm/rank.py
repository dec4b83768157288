"""The ranks of a job on Slurm: each rank is a Slurm task that ``srun`` starts from the batch script.

Two halves, both small:

* :func:`run_group`, in the batch script (once per attempt, on the first node of the allocation):
  finds the rendezvous address, runs ``srun`` as a *child* and turns its exit code into the
  attempt's exit status with the same rule as the local launcher
  (``group_launch.exit_status``): a group that saved for a preemption, or found a rank lost,
  exits 75 ("requeue me") even though some of its tasks exited non-zero.
* ``python -m gpufleet.backends.slurm.rank [--per-node] -- ARGV...``, in each task: maps Slurm's
  task variables to the ones torch.distributed reads (:func:`rank_environment`), then ``exec``\\ s
  ``ARGV``. With ``--per-node`` (``distributed.launcher: script``, one task per node) it gives
  only what a per-node launcher needs: ``NODE_RANK``, ``NNODES`` and the rendezvous address.

Signals. At a preemption (``scontrol requeue``, or a higher partition taking the nodes) slurmd
signals every step of the job, the batch step included: measured on Slurm 22.05, each task gets
SIGCONT then exactly one SIGTERM from its own step daemon, the batch script gets the same pair,
and ``srun`` does not pass the SIGTERM on to the tasks a second time. So the batch script must not
forward anything (a rank would see two SIGTERMs, and a second one interrupts its save): it
notes the signal, keeps waiting for ``srun``, and exits with the group's status once every rank
has saved and exited 75. Everything still alive ``KillWait`` seconds after the SIGTERM is
SIGKILLed by Slurm, the batch script too, which is why it does nothing but wait.

The one signal the batch script does pass on is the warning ``sbatch --signal=B:USR1@N`` asks for
(N seconds before the time limit, or at a preemption where ``PreemptParameters=send_user_signal``):
``B:`` sends it to the batch script alone, so :class:`BatchSignals` records a ``preemption_notice``
(source ``slurm``, lead N) and forwards SIGUSR1 once to the attempt (the process it started, or
``srun``, which hands it to every task); the runtime saves at the next step boundary and exits 75.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from gpufleet.backends.slurm.hostlist import expand_hostlist
from gpufleet.jobs.protocol import ENV_EVENTS, REQUEUE_EXIT_CODE
from gpufleet.numpy_cpu import without_own_setting

ENV_MASTER_ADDR = "GPUFLEET_MASTER_ADDR"
"""The rendezvous host as the batch script resolved it (Slurm's ``NodeAddr`` of the first node)."""

PORT_BASE = 61000
PORT_SPAN = 4000
"""``MASTER_PORT`` is ``PORT_BASE + job id % PORT_SPAN``. Every rank computes it alone from the
Slurm job id, so no rank has to tell the others before they can talk; two jobs sharing a node
differ unless their ids are a multiple of 4000 apart; and 61000-64999 lies above Linux's default
ephemeral range (32768-60999), where a random outgoing connection could already hold the port."""

USAGE = "usage: python -m gpufleet.backends.slurm.rank [--per-node] -- ARGV..."


def master_port(job_id: int) -> int:
    """The rendezvous port of Slurm job ``job_id`` (the same for every attempt of the job)."""
    return PORT_BASE + job_id % PORT_SPAN


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist (``node[03-04],gpu1`` -> ``node03``): rank 0's node."""
    names = expand_hostlist(nodelist)
    if not names:
        raise ValueError("the Slurm node list is empty: run this in a job that Slurm started")
    return names[0]


def tasks_on_node(tasks_per_node: str, node: int) -> int:
    """Tasks on node ``node`` from Slurm's compressed count (``2(x3),1``: 2, 2, 2 then 1)."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ValueError(f"cannot read the tasks per node {tasks_per_node!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if not 0 <= node < len(counts):
        raise ValueError(f"node {node} is not among the {len(counts)} nodes of {tasks_per_node!r}")
    return counts[node]


def _int(env: Mapping[str, str], *names: str) -> int:
    for name in names:
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    raise ValueError(f"{names[0]} is not set (or not a number): run this in a task that srun started")


def rank_environment(env: Mapping[str, str], *, per_node: bool = False) -> dict[str, str]:
    """What one Slurm task adds to its environment to be a rank of ``torch.distributed``.

    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``NODE_RANK`` are Slurm's task id, task count, task id
    on the node and node id; ``MASTER_ADDR`` is the node of task 0 (the first of the allocation,
    where the batch script runs), ``MASTER_PORT`` :func:`master_port`. ``PYTHONUNBUFFERED`` so a
    rank's last lines reach the attempt log even when Slurm kills it.
    """
    job_id = _int(env, "SLURM_JOB_ID")
    node = _int(env, "SLURM_NODEID")
    nodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    address = env.get(ENV_MASTER_ADDR) or first_host(nodelist)
    common = {
        "MASTER_ADDR": address,
        "MASTER_PORT": str(master_port(job_id)),
        "NODE_RANK": str(node),
        "PYTHONUNBUFFERED": env.get("PYTHONUNBUFFERED") or "1",
    }
    if per_node:
        return {**common, "NNODES": str(nodes)}
    per_node_tasks = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    return {
        **common,
        "RANK": str(_int(env, "SLURM_PROCID")),
        "WORLD_SIZE": str(_int(env, "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")),
        "LOCAL_RANK": str(_int(env, "SLURM_LOCALID")),
        "LOCAL_WORLD_SIZE": str(tasks_on_node(per_node_tasks, node)),
    }


def node_address(name: str, run: Callable[[list[str]], str] | None = None) -> str:
    """Slurm's ``NodeAddr`` of node ``name``: how the other nodes reach it, where the name may not
    resolve (several nodes on one host, a cluster that sets ``NodeAddr``); the name if unknown."""
    try:
        text = (run or _scontrol)(["scontrol", "-o", "show", "node", name])
    except (OSError, subprocess.SubprocessError):
        return name
    match = re.search(r"\bNodeAddr=(\S+)", text)
    return match.group(1) if match else name


def _scontrol(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


NOTICE_SIGNAL = signal.SIGUSR1
"""What ``sbatch --signal=B:USR1@N`` sends the batch script ahead of the end (see the module docstring)."""
NOTED_SIGNALS = (signal.SIGTERM, signal.SIGINT, NOTICE_SIGNAL)


class BatchSignals:
    """The batch script's handlers: note every stop signal, and turn SIGUSR1 into a notice passed on.

    SIGTERM and SIGINT are only noted (Slurm signals the attempt itself). SIGUSR1 reaches the batch
    script alone: the first one is written to the job's event log as ``preemption_notice`` and every
    one is forwarded to the attempt's process, or to it once it is started (:meth:`adopt`).
    """

    def __init__(self, events: str, attempt: int, lead_s: float) -> None:
        self.events = events
        self.attempt = attempt
        self.lead_s = lead_s
        self.stops: list[int] = []
        self.child: int | None = None
        self._owed = 0
        self._noticed = False

    def install(self, early: list[int] | None = None) -> BatchSignals:
        """Take over the signals; ``early``: those the script's first handlers noted before, acted on now."""
        for sig in NOTED_SIGNALS:
            signal.signal(sig, self.on_signal)
        for signum in list(early or ()):  # a copy: none arrives in that list once the handlers are ours
            self.on_signal(signum, None)
        return self

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stops.append(signum)
        if signum != NOTICE_SIGNAL:
            return
        if not self._noticed:
            self._noticed = True
            self._record()
        if self.child is None:
            self._owed += 1
        else:
            self._forward()

    def adopt(self, pid: int) -> None:
        """The attempt's process started: pass on a warning that came while it was starting."""
        self.child = pid
        if self._owed:
            self._owed = 0
            self._forward()

    def _forward(self) -> None:
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, NOTICE_SIGNAL)

    def _record(self) -> None:
        now = time.time()
        event = {
            "ts": now,
            "attempt": self.attempt,
            "kind": "preemption_notice",
            "source": "slurm",
            "deadline": now + self.lead_s,
            "lead_s": self.lead_s,
            "detail": f"SIGUSR1 from sbatch --signal, {self.lead_s:g} s ahead",
        }
        try:
            with open(self.events, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(event) + "\n")
        except OSError as err:  # the save matters more than its record
            print(f"gpufleet: cannot record the preemption notice: {err.strerror}", file=sys.stderr, flush=True)


def exit_like(status: int) -> int:
    """A process's wait status as the batch script's own end: its code, or the same signal killing it.

    Dying of the signal that killed the attempt keeps sacct's ``ExitCode`` what it was when the
    script ``exec``\\ ed the entrypoint (``0:9`` for a SIGKILL), which ``parse_sacct`` reads.
    """
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    return 128 - code  # not reached for a signal that kills


def run_group(
    srun: Sequence[str], attempt: int, stops: Sequence[int], on_start: Callable[[int], None] | None = None
) -> int:
    """In the batch script: run ``srun`` (the ranks) to its end; the attempt's exit status.

    ``stops`` is what the batch script's own handlers recorded: the signals it received, which
    it deliberately does not forward (see the module docstring). One that came before ``srun``
    started means Slurm is already ending this run: no rank is started, and the attempt asks to
    be requeued. ``on_start`` is told ``srun``'s PID (:meth:`BatchSignals.adopt`).
    """
    from gpufleet.backends.group_launch import exit_status

    env = without_own_setting(os.environ)  # srun's, and so the ranks' (each rank's shim steers itself)
    try:
        port = master_port(_int(env, "SLURM_JOB_ID"))
        env[ENV_MASTER_ADDR] = node_address(first_host(env.get("SLURM_JOB_NODELIST", "")))
    except ValueError as err:
        print(f"gpufleet: {err}", file=sys.stderr, flush=True)
        return 1
    if stops:
        return REQUEUE_EXIT_CODE
    print(f"gpufleet: starting the ranks with srun; rendezvous at {env[ENV_MASTER_ADDR]}:{port}", flush=True)
    try:
        child = subprocess.Popen(list(srun), env=env)
    except OSError as err:
        print(f"gpufleet: cannot start {srun[0]!r}: {err.strerror}", file=sys.stderr, flush=True)
        return 127
    if on_start is not None:
        on_start(child.pid)
    code = child.wait()
    events = env.get(ENV_EVENTS)
    # srun reports a task killed by signal N as 128 + N: a lost rank (requeue), even when the others
    # were killed before they could leave the lost-rank marker. Tasks that are the ranks record how
    # their sessions ended; once all of them completed, a signal in their teardown fails nothing.
    killed = [128 - code] if 128 < code < 128 + 65 else []
    tasks = env.get("SLURM_NTASKS", "").strip()
    world = int(tasks) if tasks.isdigit() and "--per-node" not in srun else 0
    status = exit_status(code, Path(events) if events else None, attempt, world_size=world, rank_exits=killed)
    return status if status >= 0 else 128 - status  # srun killed by a signal: as a shell reports it


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if "--" not in args or args.index("--") == len(args) - 1:
        print(f"gpufleet.backends.slurm.rank: give the command of each rank after `--`\n{USAGE}", file=sys.stderr)
        return 2
    options, command = args[: args.index("--")], args[args.index("--") + 1 :]
    if options not in ([], ["--per-node"]):
        print(f"gpufleet.backends.slurm.rank: unknown option(s) {options}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        os.environ.update(rank_environment(os.environ, per_node=bool(options)))
    except ValueError as err:
        print(f"gpufleet.backends.slurm.rank: {err}", file=sys.stderr, flush=True)
        return 2
    try:
        os.execvpe(command[0], command, without_own_setting(os.environ))  # the job's own code: the user's
    except OSError as err:
        print(f"gpufleet: cannot start {command[0]!r}: {err.strerror}", file=sys.stderr, flush=True)
        return 127


__all__ = [
    "NOTED_SIGNALS",
    "NOTICE_SIGNAL",
    "BatchSignals",
    "exit_like",
    "first_host",
    "master_port",
    "node_address",
    "rank_environment",
    "run_group",
    "tasks_on_node",
]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
