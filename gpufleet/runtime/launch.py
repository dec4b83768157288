"""``python -m gpufleet.runtime.launch``: run a ``module:function`` entrypoint as one attempt.

The backend exports ``GPUFLEET_SPEC`` (the job's spec.json); this imports the function, gives
torch the spec's CPU threads (one rank's share under torchrun), and calls it with the spec's
``args``. Exit status: 0 when the function returns, ``REQUEUE_EXIT_CODE`` (75) when it was
preempted after saving, 1 on error.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.jobs.protocol import threads_per_rank
from gpufleet.spec import parse_spec


def main() -> int:
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
    try:
        func(**spec.args)
    except GpufleetError as err:
        print(f"gpufleet: {err}", file=sys.stderr)
        return 1
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001 - the user's code failed: log it, exit 1
        traceback.print_exc()
        return 1
    return 0


def finish(code: int) -> None:
    """Exit with ``code``. One rank of several leaves with ``os._exit`` once its output is flushed: its
    session has saved, written its events (flushed line by line) and destroyed the process group, and
    what is left to tear down is the interpreter, during whose finalisation a collective backend's
    threads can abort a rank that succeeded (SIGABRT, "terminate called without an active exception")."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        sys.exit(code)
    import logging

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _run() -> None:
    try:
        code = main()
    except SystemExit as exit_:  # the session's preemption (75), or the user's own exit
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finish(code)


if __name__ == "__main__":
    _run()


__all__ = ["finish", "main"]
