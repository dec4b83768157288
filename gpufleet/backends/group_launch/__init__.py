"""``python -m gpufleet.backends.group_launch [--nproc-per-node=N] [--no-python] -- ARGV...``: one attempt, N ranks.

A package with a ``__main__``, so that ``python -m`` runs the module the package's imports already
loaded (``backends.ray`` imports :func:`exit_status`) instead of a second copy of it.

The process an attempt of a job with more than one rank runs (``distributed.launcher: torchrun``,
one node). It starts ``torchrun --standalone --nnodes=1 --nproc-per-node=N --max-restarts=0`` as a
child and stays its parent, so that:

* **signals reach every rank.** SIGTERM, SIGINT and SIGUSR1 sent to this process (the scheduler
  signals the attempt's process group) are forwarded once to torchrun, which sends the same signal
  to every rank and SIGKILLs the ranks still alive after its own 30 s. torchrun runs in a process
  group of its own, so it hears each signal once (a second SIGTERM would interrupt its shut-down).
* **nothing outlives the attempt.** torchrun starts each rank in a session of its own, out of reach
  of a SIGKILL to the attempt's process group. torchrun is started with ``PR_SET_PDEATHSIG``
  (SIGKILL) so it dies with this process, and every rank runs behind the death-signal shim
  (``jobs/deathsig.py``) that sets the same for itself, so it dies with torchrun: a SIGKILL of this
  process leaves no rank alive, whatever the script does. This process itself dies with *its*
  parent the way every attempt does (the backend starts it behind the same shim, through
  ``lifecycle.attempt_argv``; its death signal survives the exec).
* **the exit status means what a single process's would.** torchrun exits 1 when any rank fails,
  including a rank that exited 75 after saving ("requeue me"). So when the attempt's last
  ``session_end`` event (``$GPUFLEET_EVENTS``, attempt ``$GPUFLEET_ATTEMPT``; rank 0 writes them)
  says ``requeue``, this exits 75; so it does when a rank left the lost-rank marker
  (``runtime.group.lost_marker``: a collective failed because another rank was killed or is
  stuck, and the attempt is run again from the last complete checkpoint); else 0 when torchrun
  exited 0, else torchrun's status (a signal that killed torchrun kills this process too).
* **a finished attempt ends.** Every rank records how its session ended
  (``runtime.group.rank_end_marker``). Once every rank has recorded ``completed``, the attempt is
  completed: a rank that then dies of a signal (SIGABRT in the interpreter's finalisation) does
  not fail it, and ranks whose processes have not exited ``GPUFLEET_EXIT_GRACE_S`` seconds later
  (default 30) are ended (SIGKILL to torchrun; each rank dies with it) and the attempt exits 0.
* **a rank killed by a signal is a lost rank.** torchrun reports how each failed rank ended; one
  killed by a signal (``kill -9``, the OOM killer) makes the attempt exit 75 (requeue), even when
  the survivors were SIGTERMed by torchrun before they could leave the lost-rank marker. torchrun's
  own failure report (a ``ChildFailedError`` traceback naming the rank shim) is replaced by one
  line saying how each failed rank ended.

With ``GPUFLEET_RECOVERY=wait`` (``distributed.recovery: wait``) the ranks are started by gpufleet's
own rank supervisor instead (``group_launch.supervisor``), which keeps all of the above and replaces
a lost rank in place rather than ending the group; with ``GPUFLEET_RECOVERY=continue`` its elastic
variant (``group_launch.elastic``) runs torchft's Lighthouse and lets the survivors step on.

``ARGV`` is what each rank runs: arguments of gpufleet's own interpreter (``-m gpufleet.runtime.launch``,
``train.py --lr 3e-3``, ``-c CODE``), or with ``--no-python`` a complete command (another
interpreter, a shell script). ``N`` defaults to ``$GPUFLEET_WORLD_SIZE`` (one node).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from gpufleet.jobs.deathsig import PR_SET_PDEATHSIG as PR_SET_PDEATHSIG  # re-exported: it lives with the shim
from gpufleet.jobs.deathsig import die_with_parent, shim_argv
from gpufleet.jobs.events import exit_from_events
from gpufleet.jobs.protocol import ENV_ATTEMPT, ENV_EVENTS, ENV_RECOVERY, ENV_WORLD_SIZE, REQUEUE_EXIT_CODE
from gpufleet.numpy_cpu import without_own_setting
from gpufleet.runtime.group import lost_marker, rank_end_statuses

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
"""Signals passed on to torchrun, and by torchrun to every rank."""

TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
"""torchrun's ``--signals-to-handle`` (given as ``PET_SIGNALS_TO_HANDLE``, which a torchrun too old to
know the option ignores): its default plus SIGUSR1, a preemption signal of the runtime. Without it
torchrun dies of SIGUSR1 instead of passing it on (and the ranks die with it)."""

USAGE = "usage: python -m gpufleet.backends.group_launch [--nproc-per-node=N] [--no-python] -- ARGV..."

ENV_EXIT_GRACE = "GPUFLEET_EXIT_GRACE_S"
"""Seconds the ranks of an attempt whose every session completed get to exit before they are ended."""
DEFAULT_EXIT_GRACE_S = 30.0
ENV_RANK_EXITS = "GPUFLEET_RANK_EXITS"
"""Where torchrun (behind :data:`TORCHRUN_MAIN`) writes how each failed rank ended: ``{rank: code}``."""

# torchrun's own main (``python -c TORCHRUN_MAIN TORCHRUN_ARGS...``) without its error report: how each
# failed rank ended goes to $GPUFLEET_RANK_EXITS (a negative code: killed by that signal) and to one line.
TORCHRUN_MAIN = (
    "import json, os, signal, sys\n"
    "from torch.distributed.elastic.multiprocessing.errors import ChildFailedError\n"
    "from torch.distributed.run import parse_args, run\n"
    "def how(code):\n"
    "    if code < 0:\n"
    "        try:\n"
    "            return 'was killed by ' + signal.Signals(-code).name\n"
    "        except ValueError:\n"
    "            return f'was killed by signal {-code}'\n"
    "    return f'exited {code}' + (' (requeue)' if code == 75 else '')\n"
    "try:\n"
    "    run(parse_args(sys.argv[1:]))\n"
    "except ChildFailedError as err:\n"
    "    codes = {int(rank): int(failure.exitcode) for rank, failure in err.failures.items()}\n"
    "    if os.environ.get('GPUFLEET_RANK_EXITS'):\n"
    "        with open(os.environ['GPUFLEET_RANK_EXITS'], 'w') as fh:\n"
    "            json.dump(codes, fh)\n"
    "    told = ', '.join(f'rank {rank} {how(code)}' for rank, code in sorted(codes.items()))\n"
    "    print(f'gpufleet: torchrun stopped the group: {told}', file=sys.stderr, flush=True)\n"
    "    sys.exit(1)\n"
)


def torchrun_argv(nproc: int, argv: Sequence[str], *, no_python: bool = False) -> list[str]:
    """The torchrun command that runs ``nproc`` ranks of ``argv`` on this node, each behind the death-signal shim."""
    rank = list(argv) if no_python else [sys.executable, "-u", *argv]
    return [
        sys.executable,
        "-c",
        TORCHRUN_MAIN,
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "--no-python",
        *shim_argv(rank, signal.SIGKILL),  # torchrun's PID is not known yet: the shim takes its parent's
    ]


def exit_status(
    code: int,
    events: Path | None,
    attempt: int | None,
    *,
    world_size: int = 0,
    rank_exits: Sequence[int] = (),
) -> int:
    """This attempt's exit status from torchrun's ``code``, the attempt's own ``session_end`` and its ranks.

    ``world_size``: how many ranks record their session's end (0: do not look); ``rank_exits``: how
    the ranks that failed ended, as far as known (a negative code: killed by that signal).
    """
    if events is not None and attempt is not None:
        teardown_only = not any(c > 0 for c in rank_exits)  # a signal in a process's teardown fails no run
        if world_size > 0 and teardown_only and all_completed(events.parent, attempt, world_size):
            return 0
        if exit_from_events(events, attempt) == REQUEUE_EXIT_CODE:
            return REQUEUE_EXIT_CODE
        if code != 0 and lost_marker(events.parent, attempt).exists():
            return REQUEUE_EXIT_CODE  # a rank found the group broken (another rank gone or stuck): run it again
    failed = any(c > 0 and c != REQUEUE_EXIT_CODE for c in rank_exits)  # a rank's own error: torchrun then
    if code != 0 and not failed and any(c < 0 for c in rank_exits):  # SIGTERMs the rest, which is no lost rank
        return REQUEUE_EXIT_CODE  # a rank was killed (kill -9, the OOM killer): a lost rank, run it again
    return 0 if code == 0 else code


def all_completed(job_dir: Path, attempt: int, world_size: int) -> bool:
    """Whether every rank of the attempt recorded a ``completed`` session end."""
    return all(status == "completed" for status in rank_end_statuses(job_dir, attempt, world_size))


def exit_grace(env: dict[str, str] | None = None) -> float:
    """``GPUFLEET_EXIT_GRACE_S`` (0 to 600 s; default 30 s)."""
    raw = (env if env is not None else os.environ).get(ENV_EXIT_GRACE, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_EXIT_GRACE_S
    return min(max(value, 0.0), 600.0) if value == value else DEFAULT_EXIT_GRACE_S


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
    die_with_parent(signal.SIGKILL, parent)


def _attempt() -> tuple[Path | None, int | None]:
    events, attempt = os.environ.get(ENV_EVENTS), os.environ.get(ENV_ATTEMPT, "")
    return (Path(events) if events else None), (int(attempt) if attempt.strip().isdigit() else None)


def _rank_exits(path: Path) -> list[int]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [int(code) for code in found.values()] if isinstance(found, dict) else []


def _wait(child: subprocess.Popen[bytes], nproc: int, events: Path | None, attempt: int | None) -> int:
    """torchrun's exit status; once every rank completed its session, at most the exit grace later."""
    completed_at: float | None = None
    grace = exit_grace()
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if events is None or attempt is None:
            continue
        if completed_at is None:
            if all_completed(events.parent, attempt, nproc):
                completed_at = time.monotonic()
        elif time.monotonic() - completed_at >= grace:
            print(
                f"gpufleet: every rank completed its session, but {grace:g} s later not every rank had exited; "
                "ending them (the attempt is completed)",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)  # torchrun's own group; each rank dies with torchrun
            child.wait()
            return 0


def main(argv: Sequence[str]) -> int:
    try:
        nproc, no_python, command = _parse(argv)
    except ValueError as err:
        print(f"gpufleet.backends.group_launch: {err}\n{USAGE}", file=sys.stderr)
        return 2
    if os.environ.get(ENV_RECOVERY) in ("wait", "continue"):  # a lost rank is replaced: our own supervisor
        from gpufleet.backends.group_launch.supervisor import supervise

        return supervise(nproc, command, no_python=no_python)
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
    events, attempt = _attempt()
    exits = (events.parent if events is not None else Path(".")) / f"rank-exits-attempt-{attempt or 0}-{me}.json"
    try:
        child = subprocess.Popen(
            torchrun_argv(nproc, command, no_python=no_python),
            env={
                **without_own_setting(os.environ),
                "PET_SIGNALS_TO_HANDLE": TORCHRUN_SIGNALS,
                ENV_RANK_EXITS: str(exits),
            },
            preexec_fn=lambda: _die_with_parent(me),  # safe: the launcher runs no threads
        )
    except OSError as err:
        print(f"gpufleet.backends.group_launch: cannot start torchrun: {err.strerror}", file=sys.stderr, flush=True)
        return 127
    for signum in pending:
        forward(signum, None)
    code = _wait(child, nproc, events, attempt)
    rank_exits = _rank_exits(exits)
    exits.unlink(missing_ok=True)
    status = exit_status(code, events, attempt, world_size=nproc, rank_exits=rank_exits)
    if status == REQUEUE_EXIT_CODE and code != 0 and any(c < 0 for c in rank_exits):
        print("gpufleet: a rank of the group was killed: the attempt is requeued", file=sys.stderr, flush=True)
    if status < 0:  # torchrun was killed by a signal: so is this process, as a plain attempt would be
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


__all__ = [
    "DEFAULT_EXIT_GRACE_S",
    "ENV_EXIT_GRACE",
    "ENV_RANK_EXITS",
    "FORWARDED",
    "PR_SET_PDEATHSIG",
    "TORCHRUN_MAIN",
    "TORCHRUN_SIGNALS",
    "USAGE",
    "all_completed",
    "exit_grace",
    "exit_status",
    "main",
    "torchrun_argv",
]
