"""``python -m gpufleet.backends.group_launch [--nproc-per-node=N] [--no-python] -- ARGV...``: one attempt, N ranks.

The process an attempt of a job with more than one rank runs (``distributed.launcher: torchrun``,
one node). It starts ``torchrun --standalone --nnodes=1 --nproc-per-node=N --max-restarts=0`` as a
child and stays its parent, so that:

* **signals reach every rank.** SIGTERM, SIGINT and SIGUSR1 sent to this process (the scheduler
  signals the attempt's process group) are forwarded once to torchrun, which sends the same signal
  to every rank and SIGKILLs the ranks still alive after its own 30 s. torchrun runs in a process
  group of its own, so it hears each signal once (a second SIGTERM would interrupt its shut-down).
* **nothing outlives the attempt.** torchrun starts each rank in a session of its own, out of reach
  of a SIGKILL to the attempt's process group. torchrun is started with ``PR_SET_PDEATHSIG``
  (SIGKILL) so it dies with this process, and every rank runs behind a small shim that sets the same
  for itself, so it dies with torchrun: a SIGKILL of this process leaves no rank alive, whatever the
  script does. This process itself dies with *its* parent the way every attempt does (the backend
  starts it behind ``lifecycle.attempt_argv``'s shim, whose death signal survives the exec).
* **the exit status means what a single process's would.** torchrun exits 1 when any rank fails,
  including a rank that exited 75 after saving ("requeue me"). So when the attempt's last
  ``session_end`` event (``$GPUFLEET_EVENTS``, attempt ``$GPUFLEET_ATTEMPT``; rank 0 writes them)
  says ``requeue``, this exits 75; so it does when a rank left the lost-rank marker
  (``runtime.group.lost_marker``: a collective failed because another rank was killed or is
  stuck, and the attempt is run again from the last complete checkpoint); else 0 when torchrun
  exited 0, else torchrun's status (a signal that killed torchrun kills this process too).

``ARGV`` is what each rank runs: arguments of gpufleet's own interpreter (``-m gpufleet.runtime.launch``,
``train.py --lr 3e-3``, ``-c CODE``), or with ``--no-python`` a complete command (another
interpreter, a shell script). ``N`` defaults to ``$GPUFLEET_WORLD_SIZE`` (one node).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from gpufleet.jobs.events import exit_from_events
from gpufleet.jobs.protocol import ENV_ATTEMPT, ENV_EVENTS, ENV_WORLD_SIZE, REQUEUE_EXIT_CODE
from gpufleet.runtime.group import lost_marker

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
"""Signals passed on to torchrun, and by torchrun to every rank."""

TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
"""torchrun's ``--signals-to-handle`` (given as ``PET_SIGNALS_TO_HANDLE``, which a torchrun too old to
know the option ignores): its default plus SIGUSR1, a preemption signal of the runtime. Without it
torchrun dies of SIGUSR1 instead of passing it on (and the ranks die with it)."""

PR_SET_PDEATHSIG = 1

# Each rank runs behind this (``python -I -c RANK_SHIM ARGV...``): die with torchrun, then become ARGV.
RANK_SHIM = (
    "import ctypes, os, sys\n"
    "parent = os.getppid()\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, 9)\n"  # PR_SET_PDEATHSIG, SIGKILL
    "os.getppid() == parent or os._exit(137)\n"
    "try:\n"
    "    os.execvp(sys.argv[1], sys.argv[1:])\n"
    "except OSError as err:\n"
    "    print(f'gpufleet: cannot start {sys.argv[1]!r}: {err.strerror}', file=sys.stderr, flush=True)\n"
    "    os._exit(127)\n"
)

USAGE = "usage: python -m gpufleet.backends.group_launch [--nproc-per-node=N] [--no-python] -- ARGV..."


def torchrun_argv(nproc: int, argv: Sequence[str], *, no_python: bool = False) -> list[str]:
    """The torchrun command that runs ``nproc`` ranks of ``argv`` on this node, each behind the rank shim."""
    rank = list(argv) if no_python else [sys.executable, "-u", *argv]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "--no-python",
        sys.executable,
        "-I",
        "-c",
        RANK_SHIM,
        *rank,
    ]


def exit_status(code: int, events: Path | None, attempt: int | None) -> int:
    """This attempt's exit status from torchrun's ``code`` and the attempt's own ``session_end``."""
    if events is not None and attempt is not None and exit_from_events(events, attempt) == REQUEUE_EXIT_CODE:
        return REQUEUE_EXIT_CODE
    if code != 0 and events is not None and attempt is not None and lost_marker(events.parent, attempt).exists():
        return REQUEUE_EXIT_CODE  # a rank found the group broken (another rank gone or stuck): run it again
    return 0 if code == 0 else code


def _parse(argv: Sequence[str]) -> tuple[int, bool, list[str]]:
    if "--" not in argv:
        raise ValueError("give the command of each rank after `--`")
    split = list(argv).index("--")
    options, command = list(argv[:split]), list(argv[split + 1 :])
    nproc_raw, no_python = os.environ.get(ENV_WORLD_SIZE, ""), False
    while options:
        option = options.pop(0)
        if option == "--no-python":
            no_python = True
        elif option.startswith("--nproc-per-node="):
            nproc_raw = option.partition("=")[2]
        elif option == "--nproc-per-node" and options:
            nproc_raw = options.pop(0)
        else:
            raise ValueError(f"unknown option {option!r}")
    if not nproc_raw.strip().isdigit() or int(nproc_raw) < 1:
        raise ValueError(f"--nproc-per-node={nproc_raw!r} is invalid: give a positive number of ranks")
    if not command:
        raise ValueError("the command of each rank after `--` is empty")
    return int(nproc_raw), no_python, command


def _die_with_parent(parent: int) -> None:
    """In torchrun, before it starts: a group of its own, and SIGKILL when this launcher dies."""
    os.setpgid(0, 0)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(137)


def _attempt() -> tuple[Path | None, int | None]:
    events, attempt = os.environ.get(ENV_EVENTS), os.environ.get(ENV_ATTEMPT, "")
    return (Path(events) if events else None), (int(attempt) if attempt.strip().isdigit() else None)


def main(argv: Sequence[str]) -> int:
    try:
        nproc, no_python, command = _parse(argv)
    except ValueError as err:
        print(f"gpufleet.backends.group_launch: {err}\n{USAGE}", file=sys.stderr)
        return 2
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    me = os.getpid()
    try:
        child = subprocess.Popen(
            torchrun_argv(nproc, command, no_python=no_python),
            env={**os.environ, "PET_SIGNALS_TO_HANDLE": TORCHRUN_SIGNALS},
            preexec_fn=lambda: _die_with_parent(me),  # safe: the launcher runs no threads
        )
    except OSError as err:
        print(f"gpufleet.backends.group_launch: cannot start torchrun: {err.strerror}", file=sys.stderr, flush=True)
        return 127
    for signum in pending:
        forward(signum, None)
    code = child.wait()
    status = exit_status(code, *_attempt())
    if status < 0:  # torchrun was killed by a signal: so is this process, as a plain attempt would be
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = [
    "FORWARDED",
    "PR_SET_PDEATHSIG",
    "RANK_SHIM",
    "TORCHRUN_SIGNALS",
    "USAGE",
    "exit_status",
    "main",
    "torchrun_argv",
]
