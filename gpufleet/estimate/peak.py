"""Announced peak throughput and memory of the GPUs gpufleet plans for, each figure with its datasheet.

MFU divides achieved FLOP/s by the *dense* peak: NVIDIA datasheets print the tensor-core figures "with sparsity"
(2:4 structured sparsity, which dense training never uses), so where a sheet prints only that figure the dense one
is its half. Each :class:`GpuPeak` keeps the printed sparse figure next to the dense one, so a reader can check both
against the source. FP32 is the non-tensor-core figure (there is no sparse FP32).

Memory is the datasheet's "GB", read as GiB: the HBM parts really carry binary gigabytes (an A100 80GB reports
81920 MiB); the GDDR parts report slightly less than their label once ECC and the driver take their share, which the
layout advisor's headroom covers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gpufleet.errors import ParameterError, UsageError

Dtype = Literal["bf16", "fp16", "tf32", "fp32"]
DTYPES: tuple[Dtype, ...] = ("bf16", "fp16", "tf32", "fp32")

A100_SHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet (SXM column), "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
H100_SHEET = "NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
H200_SHEET = "NVIDIA H200 Tensor Core GPU datasheet (SXM column), https://www.nvidia.com/en-us/data-center/h200/"
L40S_SHEET = "NVIDIA L40S datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
L4_SHEET = (
    "NVIDIA L4 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"
)
A10_SHEET = "NVIDIA A10 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/products/a10-gpu/"
ADA_WHITEPAPER = (
    "NVIDIA Ada GPU Architecture whitepaper v2.1, appendix A (RTX 4090, FP32 accumulate), "
    "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
)


def parse_dtype(name: str) -> Dtype:
    if name not in DTYPES:
        raise ParameterError(f"unknown {{dtype}}: use one of {', '.join(DTYPES)}", dtype=name)
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuPeak:
    """One GPU model's datasheet row. Throughputs are in TFLOP/s, dense unless the name says sparse."""

    name: str
    """Canonical name, as ``gpufleet estimate --gpu`` accepts it."""
    bf16: float
    """Dense BF16 tensor-core TFLOP/s (FP16 is the same figure on every GPU here)."""
    bf16_sparse: float
    """The datasheet's BF16 figure "with sparsity": twice the dense one."""
    tf32: float
    """Dense TF32 tensor-core TFLOP/s."""
    tf32_sparse: float
    fp32: float
    """Non-tensor-core FP32 TFLOP/s."""
    memory_gib: float
    source: str
    """The datasheet (name and URL) every figure of the row comes from."""
    aliases: tuple[str, ...] = ()

    def tflops(self, dtype: Dtype = "bf16") -> float:
        """Dense peak TFLOP/s for ``dtype``."""
        return {"bf16": self.bf16, "fp16": self.bf16, "tf32": self.tf32, "fp32": self.fp32}[parse_dtype(dtype)]

    def peak_flops(self, dtype: Dtype = "bf16") -> float:
        """Dense peak in FLOP/s for ``dtype``: the denominator of MFU for one GPU."""
        return self.tflops(dtype) * 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


def _row(
    name: str, bf16: tuple[float, float], tf32: tuple[float, float], fp32: float, mem: float, src: str, *aliases: str
) -> GpuPeak:
    """``bf16`` and ``tf32`` are (dense, sparse) as printed; where a sheet prints only the sparse figure the dense
    one is its half, written as such."""
    return GpuPeak(
        name=name,
        bf16=bf16[0],
        bf16_sparse=bf16[1],
        tf32=tf32[0],
        tf32_sparse=tf32[1],
        fp32=fp32,
        memory_gib=mem,
        source=src,
        aliases=aliases,
    )


GPUS: tuple[GpuPeak, ...] = (
    _row("a100-40gb", (312, 624), (156, 312), 19.5, 40, A100_SHEET, "a100-sxm4-40gb", "a100-40gb-sxm"),
    _row("a100-80gb", (312, 624), (156, 312), 19.5, 80, A100_SHEET, "a100", "a100-sxm4-80gb", "a100-sxm"),
    _row("h100-sxm", (1979 / 2, 1979), (989 / 2, 989), 67, 80, H100_SHEET, "h100", "h100-80gb-hbm3", "h100-sxm5"),
    _row("h100-pcie", (1513 / 2, 1513), (756 / 2, 756), 51, 80, H100_SHEET, "h100-80gb-pcie"),
    _row("h100-nvl", (1671 / 2, 1671), (835 / 2, 835), 60, 94, H100_SHEET),
    _row("h200", (1979 / 2, 1979), (989 / 2, 989), 67, 141, H200_SHEET, "h200-sxm", "h200-141gb", "h200-141gb-hbm3e"),
    _row("l40s", (362.05, 733), (183, 366), 91.6, 48, L40S_SHEET),
    _row("l4", (242 / 2, 242), (120 / 2, 120), 30.3, 24, L4_SHEET),
    _row("a10", (125, 250), (62.5, 125), 31.2, 24, A10_SHEET),
    _row("rtx-4090", (165.2, 330.4), (82.6, 165.2), 82.6, 24, ADA_WHITEPAPER, "4090", "rtx4090", "rtx-4090-24gb"),
)


def _normalise(name: str) -> str:
    """``"NVIDIA A100-SXM4-80GB"`` (as ``torch.cuda.get_device_name`` says it) -> ``"a100-sxm4-80gb"``."""
    key = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    for prefix in ("nvidia-", "geforce-"):
        key = key.removeprefix(prefix)
    return key


_BY_NAME: dict[str, GpuPeak] = {_normalise(n): g for g in GPUS for n in (g.name, *g.aliases)}


def known_gpus() -> tuple[str, ...]:
    """Canonical names, in table order."""
    return tuple(g.name for g in GPUS)


def gpu_peak(name: str) -> GpuPeak:
    """The datasheet row of ``name``: case, spaces and an ``NVIDIA``/``GeForce`` prefix do not matter."""
    row = _BY_NAME.get(_normalise(name))
    if row is None:
        raise UsageError(f"unknown GPU {name!r}: use one of {', '.join(known_gpus())}")
    return row


__all__ = ["DTYPES", "GPUS", "Dtype", "GpuPeak", "gpu_peak", "known_gpus", "parse_dtype"]
