"""Back-of-the-envelope planning for a training job: FLOPs and MFU, memory per GPU, the layouts that fit.

Pure functions over frozen values; every formula is cited where it is computed:

- :mod:`~gpufleet.estimate.flops`: FLOPs per token (PaLM appendix B) and what recomputation adds;
- :mod:`~gpufleet.estimate.mfu`: model and hardware FLOPs utilization of a run;
- :mod:`~gpufleet.estimate.peak`: the datasheet peaks and memory of the GPUs;
- :mod:`~gpufleet.estimate.memory`: model states (ZeRO paper) and activations (Korthikanti et al. 2022) per GPU;
- :mod:`~gpufleet.estimate.layout`: the data/tensor/pipeline layouts that fit a GPU, least communication first.
"""

from __future__ import annotations

from gpufleet.estimate.flops import (
    TransformerShape,
    flops_per_token,
    hardware_flops_per_token,
    recompute_flops_per_token,
)
from gpufleet.estimate.layout import LayoutOption, advise_layout, usable_bytes
from gpufleet.estimate.memory import (
    ActivationShape,
    MemoryEstimate,
    MemoryItem,
    activation_bytes_per_layer,
    estimate_memory,
)
from gpufleet.estimate.mfu import MfuEstimate, mfu, tokens_per_second
from gpufleet.estimate.peak import GPUS, GpuPeak, gpu_peak, known_gpus

__all__ = [
    "GPUS",
    "ActivationShape",
    "GpuPeak",
    "LayoutOption",
    "MemoryEstimate",
    "MemoryItem",
    "MfuEstimate",
    "TransformerShape",
    "activation_bytes_per_layer",
    "advise_layout",
    "estimate_memory",
    "flops_per_token",
    "gpu_peak",
    "hardware_flops_per_token",
    "known_gpus",
    "mfu",
    "recompute_flops_per_token",
    "tokens_per_second",
    "usable_bytes",
]
