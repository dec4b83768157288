"""The data path of a job: where its training data comes from, staged in before the first step.

A JobSpec's ``data`` block lists sources (a local path, ``s3://bucket/prefix``, any fsspec URL) and
the folder each lands in under ``$GPUFLEET_DATA_DIR``. :mod:`gpufleet.data.stage` copies them, in
parallel and checked, once per attempt (one object's checked copy is :mod:`gpufleet.data.transfer`);
:mod:`gpufleet.data.stage_in` is what every rank runs first.

Floor 8 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, tables.py, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet.errors import UsageError


def data_dir(dest: str | None = None) -> Path:
    """The job's data folder (``$GPUFLEET_DATA_DIR``), or one source's folder under it."""
    root = os.environ.get("GPUFLEET_DATA_DIR")
    if not root:
        raise UsageError("GPUFLEET_DATA_DIR is not set: this process is not a job with a `data` block")
    return Path(root) / dest if dest else Path(root)


__all__ = ["data_dir"]
