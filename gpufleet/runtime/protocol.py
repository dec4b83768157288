"""The contract between a backend and the training process it starts (no torch import here).

The backend exports these variables to every attempt; ``TrainSession.from_env`` reads them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.paths import job_dir

if TYPE_CHECKING:
    from gpufleet.spec import JobSpec

REQUEUE_EXIT_CODE = 75
"""Exit status of an attempt that saved its state and asks to be requeued (EX_TEMPFAIL)."""

ENV_JOB_ID = "GPUFLEET_JOB_ID"
ENV_ATTEMPT = "GPUFLEET_ATTEMPT"
ENV_JOB_DIR = "GPUFLEET_JOB_DIR"
ENV_SPEC = "GPUFLEET_SPEC"
ENV_CKPT_DIR = "GPUFLEET_CKPT_DIR"
ENV_EVENTS = "GPUFLEET_EVENTS"
ENV_FAULT = "GPUFLEET_FAULT"
ENV_LOG_EVERY_S = "GPUFLEET_LOG_EVERY_S"


def job_environment(spec: JobSpec, job_id: int, home: Path, backend: str) -> dict[str, str]:
    """What every attempt of ``job_id`` gets on top of its environment (``GPUFLEET_ATTEMPT`` aside)."""
    folder = job_dir(home, job_id)
    return {
        **spec.env,
        "GPUFLEET_HOME": str(home),
        ENV_JOB_ID: str(job_id),
        "GPUFLEET_JOB_NAME": spec.name,
        "GPUFLEET_TEAM": spec.team,
        ENV_JOB_DIR: str(folder),
        ENV_SPEC: str(folder / "spec.json"),
        ENV_CKPT_DIR: str(folder / "checkpoints"),
        ENV_EVENTS: str(folder / "events.jsonl"),
        "GPUFLEET_BACKEND": backend,
        "OMP_NUM_THREADS": str(spec.resources.cpus),
    }


PYTHON_RE = re.compile(r"^python(?:3(?:\.\d+)?)?$")
"""A bare ``python``, ``python3`` or ``python3.X``: gpufleet's own interpreter, not the first on PATH."""


def entry_argv(spec: JobSpec) -> list[str]:
    """The process an attempt runs: the launcher for ``module:function``, else the command.

    A command that starts with a bare ``python`` (``python train.py``) runs under the interpreter
    gpufleet itself runs in, so it sees the same packages (torch, gpufleet); give a path
    (``/usr/bin/python3``, ``.venv/bin/python``) to choose another.
    """
    if spec.callable_entrypoint:
        return [sys.executable, "-m", "gpufleet.runtime.launch"]
    argv = list(spec.command or [])
    if argv and PYTHON_RE.match(argv[0]):
        argv[0] = sys.executable
    return argv
