"""gpufleet: run training on a preemptible GPU fleet, resume at the last healthy step, see the cost."""

from __future__ import annotations

from gpufleet._version import __version__
from gpufleet.errors import GpufleetError
from gpufleet.spec import JobSpec, load_spec

__all__ = ["GpufleetError", "JobSpec", "__version__", "load_spec"]
