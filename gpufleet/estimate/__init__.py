"""Back-of-the-envelope planning for a training job: FLOPs and MFU, memory per GPU, the layouts that fit.

Pure functions over frozen values; every formula is cited where it is computed:

- :mod:`~gpufleet.estimate.flops`: FLOPs per token (PaLM appendix B) and what recomputation adds;
- :mod:`~gpufleet.estimate.mfu`: model and hardware FLOPs utilization of a run;
- :mod:`~gpufleet.estimate.peak`: the datasheet peaks and memory of the GPUs;
- :mod:`~gpufleet.estimate.memory`: model states (ZeRO paper) and activations (Korthikanti et al. 2022) per GPU;
- :mod:`~gpufleet.estimate.layout`: the data/tensor/pipeline layouts that fit a GPU, least communication first;
- :mod:`~gpufleet.estimate.network`: link bandwidths and latencies, and what an all-reduce costs on a placement
  (NCCL's ring and tree in the alpha-beta model, nccl-tests' bus bandwidth).

Floor 4 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/.
"""

from __future__ import annotations

from gpufleet.estimate.flops import (
    TransformerShape,
    flops_per_token,
    hardware_flops_per_token,
    recompute_flops_per_token,
)
from gpufleet.estimate.layout import LayoutOption, advise_layout, gradient_sync_seconds, usable_bytes
from gpufleet.estimate.memory import (
    ActivationShape,
    MemoryEstimate,
    MemoryItem,
    activation_bytes_per_layer,
    estimate_memory,
)
from gpufleet.estimate.mfu import MfuEstimate, mfu, tokens_per_second
from gpufleet.estimate.network import (
    AllreduceEstimate,
    LinkSpec,
    NetworkPath,
    Placement,
    allreduce,
    bus_bandwidth,
    estimate_allreduce,
    fleet_placement,
    one_switch_placement,
)
from gpufleet.estimate.peak import GPUS, GpuPeak, gpu_peak, known_gpus

__all__ = [
    "GPUS",
    "ActivationShape",
    "AllreduceEstimate",
    "GpuPeak",
    "LayoutOption",
    "LinkSpec",
    "MemoryEstimate",
    "MemoryItem",
    "MfuEstimate",
    "NetworkPath",
    "Placement",
    "TransformerShape",
    "activation_bytes_per_layer",
    "advise_layout",
    "allreduce",
    "bus_bandwidth",
    "estimate_allreduce",
    "estimate_memory",
    "fleet_placement",
    "flops_per_token",
    "gpu_peak",
    "gradient_sync_seconds",
    "hardware_flops_per_token",
    "known_gpus",
    "mfu",
    "one_switch_placement",
    "recompute_flops_per_token",
    "tokens_per_second",
    "usable_bytes",
]
