"""``python -m gpufleet.runtime.launch [--script FILE ARGS... | --module NAME ARGS...]``: run one rank's entrypoint.

Without options it runs the job's ``module:function`` entrypoint: the backend exports
``GPUFLEET_SPEC`` (the job's spec.json); this imports the function, gives torch the spec's CPU
threads (one rank's share under torchrun), and calls it with the spec's ``args``. With
``--script`` / ``--module`` it runs a command entrypoint (``python train.py``, ``python -m pkg.mod``)
with ``runpy``, as the interpreter would: ``sys.argv`` as the script expects, ``__name__ == "__main__"``.
Exit status: 0 when the entrypoint returns, ``REQUEUE_EXIT_CODE`` (75) when it was preempted after
saving, 1 on error.

**In-place recovery** (``GPUFLEET_RECOVERY=wait`` under the rank supervisor, which exports the
rendezvous file ``GPUFLEET_RDZV_FILE``): when the entrypoint raises because its group broke (another
rank killed or stuck: :func:`gpufleet.runtime.group.is_peer_loss`, which also matches the error DDP
raises inside the user's ``backward``), this process asks for a new generation of the group, tears
the broken one down, waits for the supervisor to publish the next generation (up to
``GPUFLEET_RECOVERY_TIMEOUT_S``), points ``MASTER_PORT`` at it and calls the entrypoint again. The
entrypoint builds its model and optimizer again and its ``TrainSession`` restores the last step every
rank committed, so the run goes on bit-exact, in the same interpreter: torch is not imported again and
the process keeps its PID. Without a new generation in time it exits 75 (the attempt is requeued).

Under ``GPUFLEET_RECOVERY=continue`` nothing is re-run: the survivors never see their group break
(each rank is a torchft replica of its own, ``runtime.elastic``), and a lost rank's replacement is a
new process that heals from a peer.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.jobs.protocol import (
    ENV_GENERATION,
    ENV_RDZV_FILE,
    ENV_RECOVERY,
    ENV_RECOVERY_TIMEOUT,
    REQUEUE_EXIT_CODE,
    threads_per_rank,
)
from gpufleet.runtime.components.guard import told_to_stop
from gpufleet.runtime.group import forget_group, is_peer_loss, mark_ready, next_generation, request_reform
from gpufleet.spec import parse_spec

USAGE = "usage: python -m gpufleet.runtime.launch [--script FILE ARGS... | --module NAME ARGS...]"
DEFAULT_RECOVERY_TIMEOUT_S = 120.0

Entry = Callable[[], object]
"""One call of the entrypoint, as many times as the group re-forms."""


def recovers_in_place(env: dict[str, str] | None = None) -> bool:
    """Whether a broken group is re-formed around this process (the rank supervisor runs it under ``wait``)."""
    env = env if env is not None else dict(os.environ)
    return env.get(ENV_RECOVERY) == "wait" and bool(env.get(ENV_RDZV_FILE))


def recovery_timeout(env: dict[str, str] | None = None) -> float:
    """``GPUFLEET_RECOVERY_TIMEOUT_S``: how long to wait for the next generation (default 120 s)."""
    raw = (env if env is not None else os.environ).get(ENV_RECOVERY_TIMEOUT, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_RECOVERY_TIMEOUT_S
    return value if 0 < value < float("inf") else DEFAULT_RECOVERY_TIMEOUT_S


def _command_entry(argv: Sequence[str]) -> Entry:
    """``--script FILE ARGS`` / ``--module NAME ARGS`` as a call that runs it as ``python FILE ARGS`` would."""
    option, target, args = argv[0], argv[1], list(argv[2:])

    def run() -> object:
        sys.argv = [target, *args]
        if option == "--module":
            return runpy.run_module(target, run_name="__main__", alter_sys=True)
        folder = str(Path(target).resolve().parent)  # where `python FILE` looks for the script's own imports
        if folder not in sys.path:
            sys.path.insert(0, folder)
        return runpy.run_path(target, run_name="__main__")

    return run


def _function_entry() -> Entry | int:
    """The spec's ``module:function`` with its ``args``, or the exit status that says why not."""
    spec_path = os.environ.get("GPUFLEET_SPEC")
    if not spec_path:
        print("gpufleet.runtime.launch: GPUFLEET_SPEC is not set; run jobs with `gpufleet submit`", file=sys.stderr)
        return 2
    spec = parse_spec(json.loads(Path(spec_path).read_text(encoding="utf-8")), source=spec_path)
    target = spec.callable_entrypoint
    if target is None:
        print(f"gpufleet.runtime.launch: {spec.entrypoint!r} is not module:function", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(threads_per_rank(spec))  # one rank's share of the node's CPUs
    module_name, func_name = target.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as err:
        print(f"gpufleet: cannot import entrypoint {target!r}: {err}", file=sys.stderr)
        return 1
    args = dict(spec.args)
    return lambda: func(**args)


def _call(entry: Entry, in_place: bool) -> int | None:
    """One call of the entrypoint: its exit status, or ``None`` when its group broke and re-forms in place."""
    try:
        entry()
    except SystemExit:
        raise
    except Exception as err:  # noqa: BLE001 - the user's code failed: log it, exit 1
        if in_place and is_peer_loss(err):
            print(f"gpufleet: the group broke ({str(err).strip()[:200]}); waiting for it to re-form", file=sys.stderr)
            return None
        if isinstance(err, GpufleetError):
            print(f"gpufleet: {err}", file=sys.stderr)
        else:
            traceback.print_exc()
        return 1
    return 0


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM, SIGINT or SIGUSR1 while the rank waits for the next generation.

    No session runs then to save at the signal (the broken one has ended, the next has not begun),
    and the last step every rank committed is already saved: the rank leaves at once (75), instead of
    waiting out its grace until the supervisor's SIGKILL.
    """
    stopped = threading.Event()
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    previous = {signum: signal.signal(signum, lambda *_: stopped.set()) for signum in signals}
    try:
        yield stopped
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def rejoin() -> bool:
    """After a broken group: ask for, and wait for, the next generation; ready to call the entrypoint again."""
    generation = int(os.environ.get(ENV_GENERATION, "0") or 0)
    request_reform()
    if not forget_group():
        print("gpufleet: the broken process group could not be destroyed; the attempt is requeued", file=sys.stderr)
        return False
    timeout = recovery_timeout()
    with _stopped_by_signals() as stopped:

        def stop() -> bool:
            return stopped.is_set() or told_to_stop() is not None

        found = None if stop() else next_generation(Path(os.environ[ENV_RDZV_FILE]), generation, timeout, stop=stop)
    if found is None and stop():
        print(
            "gpufleet: told to stop while the group re-formed: nothing to save (the last step every rank committed "
            f"is saved), exiting {REQUEUE_EXIT_CODE} (requeue)",
            file=sys.stderr,
        )
        return False
    if found is None:
        print(f"gpufleet: the group did not re-form within {timeout:g} s; the attempt is requeued", file=sys.stderr)
        return False
    os.environ[ENV_GENERATION], os.environ["MASTER_PORT"] = str(found[0]), str(found[1])
    gc.collect()  # the broken generation's model, optimizer and session go before the next builds its own
    return True


def run(entry: Entry) -> int:
    """Call ``entry`` until it ends other than by a broken group (or the group cannot re-form: 75)."""
    in_place = recovers_in_place()
    while True:
        code = _call(entry, in_place)
        if code is not None:
            return code
        if not rejoin():
            return REQUEUE_EXIT_CODE


def main(argv: Sequence[str] = ()) -> int:
    if argv and (argv[0] not in ("--script", "--module") or len(argv) < 2 or not argv[1]):
        print(f"gpufleet.runtime.launch: cannot run {' '.join(argv)[:200]!r}\n{USAGE}", file=sys.stderr)
        return 2
    entry = _command_entry(argv) if argv else _function_entry()
    if isinstance(entry, int):
        return entry
    if recovers_in_place():
        import torch  # noqa: F401 - the long part of a rank's start, before the supervisor lets the group meet

        mark_ready()
    return run(entry)


def finish(code: int) -> None:
    """Exit with ``code``. One rank of several leaves with ``os._exit`` once its output is flushed: its
    session has saved, written its events (flushed line by line) and destroyed the process group, and
    what is left to tear down is the interpreter, during whose finalisation a collective backend's
    threads can abort a rank that succeeded (SIGABRT, "terminate called without an active exception").
    So does an elastic replica (``recovery: continue``): torch sees a world of one, but torchft's servers
    and their threads are left to the process's end."""
    alone = int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1
    if alone and os.environ.get(ENV_RECOVERY) != "continue":
        sys.exit(code)
    import logging

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _run() -> None:
    try:
        code = main(sys.argv[1:])
    except SystemExit as exit_:  # the session's preemption (75), or the user's own exit
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finish(code)


if __name__ == "__main__":
    _run()


__all__ = ["USAGE", "finish", "main", "recovers_in_place", "recovery_timeout", "rejoin", "run"]
