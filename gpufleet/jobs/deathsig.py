"""Dying with the parent: ``PR_SET_PDEATHSIG``, the one place gpufleet asks the kernel for it.

A process that starts another (the local scheduler an attempt, a Ray actor its process, the
group launcher torchrun, torchrun a rank) wants the child gone when it dies itself, or the child
trains on unwatched. Linux delivers a chosen signal to a process whose parent dies, once it asks
(``prctl(PR_SET_PDEATHSIG, sig)``); the request survives ``exec``. Two ways to ask, both here:

- :func:`die_with_parent`, in the child's own Python (a ``preexec_fn``, or a rank at start-up);
- :func:`shim_argv`, a command that asks first and then becomes the real one (``exec``): a few lines
  run by ``python -I -c`` (:data:`SHIM`), so the child pays no import of gpufleet for it.

Either way, a parent that died before the request is found by its PID having changed, and the
child exits at once with :data:`PARENT_GONE` (a SIGKILL's status). Elsewhere than Linux nothing is asked.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1
"""``prctl``'s option number (``<linux/prctl.h>``)."""
PARENT_GONE = 137
"""The exit status of a child whose parent died before it could ask (128 + SIGKILL)."""
NOT_STARTED = 127
"""The shim's exit status when the command cannot be executed (as a shell's)."""

SHIM = (
    "import ctypes, os, sys\n"
    "parent = int(sys.argv[1]) or os.getppid()\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[2]))\n"  # PR_SET_PDEATHSIG
    "os.getppid() == parent or os._exit(137)\n"
    "try:\n"
    "    os.execvp(sys.argv[3], sys.argv[3:])\n"
    "except OSError as err:\n"
    "    print(f'gpufleet: cannot start {sys.argv[3]!r}: {err.strerror}', file=sys.stderr, flush=True)\n"
    "    os._exit(127)\n"
)
"""``python -I -c SHIM PARENT SIGNAL ARGV...``: ask for ``SIGNAL`` when ``PARENT`` dies, then become ``ARGV``.

``PARENT`` 0 means the shim's parent as it starts (for a command line written before the parent
exists, as torchrun's rank command is)."""


def supported() -> bool:
    """Whether this platform has ``PR_SET_PDEATHSIG`` (Linux)."""
    return sys.platform.startswith("linux")


def die_with_parent(death_signal: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Ask for ``death_signal`` when the parent dies; exit now if ``parent`` (default: the current one) is gone."""
    if not supported():
        return
    expected = os.getppid() if parent is None else parent
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(death_signal))
    if os.getppid() != expected:  # it died before the request: no signal will come
        os._exit(PARENT_GONE)


def shim_argv(argv: Sequence[str], death_signal: int = signal.SIGKILL, parent: int | None = None) -> list[str]:
    """``argv`` behind :data:`SHIM`: it gets ``death_signal`` when ``parent`` dies (default: its parent at start)."""
    if not supported():
        return list(argv)
    return [sys.executable, "-I", "-c", SHIM, str(parent or 0), str(int(death_signal)), *argv]


__all__ = ["NOT_STARTED", "PARENT_GONE", "PR_SET_PDEATHSIG", "SHIM", "die_with_parent", "shim_argv", "supported"]
