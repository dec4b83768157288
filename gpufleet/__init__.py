"""gpufleet: run training on a preemptible GPU fleet, resume at the last healthy step, see the cost.

``JobSpec`` and ``load_spec`` are imported on first use (PEP 562): importing ``gpufleet`` (as every
command of the CLI does) costs the version and the errors, not pydantic and the spec's models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet import numpy_cpu
from gpufleet._version import __version__
from gpufleet.errors import GpufleetError

numpy_cpu.steer()  # before anything imports numpy: its AVX-512 sort is slow on AMD Zen 4

if TYPE_CHECKING:
    from gpufleet.spec import JobSpec, load_spec

__all__ = ["GpufleetError", "JobSpec", "__version__", "load_spec"]

_FROM_SPEC = frozenset({"JobSpec", "load_spec"})


def __getattr__(name: str) -> Any:
    if name in _FROM_SPEC:
        import gpufleet.spec

        return getattr(gpufleet.spec, name)
    raise AttributeError(f"module 'gpufleet' has no attribute {name!r}")
