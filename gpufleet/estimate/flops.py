"""Training FLOPs per token of a decoder-only transformer: what the model needs (MFU) and what the GPU runs (HFU).

Model FLOPs follow PaLM (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", arXiv:2204.02311,
appendix B)::

    model FLOPs per token = 6N + 12·L·H·Q·T

6N counts the matmuls with the weights (2N forward, 4N backward); 12·L·H·Q·T the attention scores ``QKᵀ`` and their
weighted sum of values (each 2·H·Q·T per token and layer forward, times three for forward + backward), with L
layers, H heads, Q the head size and T the sequence length. N may leave the embedding parameters out, as
torchtitan and nanoGPT do: a lookup costs no FLOPs (a tied LM head is a real matmul; keep it in N then).

Hardware FLOPs add what activation recomputation runs a second time (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", arXiv:2205.05198, section 5)::

    none       6N + 12·L·H·Q·T                   (= model FLOPs)
    selective  6N + 12·L·H·Q·T + 4·L·H·Q·T       (the forward of QKᵀ and of the attention over V, again)
    full       8N + 16·L·H·Q·T                   (one more full forward: 2N + 4·L·H·Q·T)

The full form is the paper's 96·B·s·l·h² against 72·B·s·l·h², a ratio of 4/3. For selective recomputation the paper
quotes "2.7%" for GPT-3, which is s/(6h), the share of *all* attention-score FLOPs (forward and backward); only the
forward is recomputed, so the overhead counted here is a third of that (0.9% for GPT-3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gpufleet.errors import ParameterError

Recompute = Literal["none", "selective", "full"]
RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "full")

MAX_COUNT = 10**15
"""Most parameters (or tokens per step) an estimate takes: a thousand times today's largest models."""
MAX_GPUS = 10**6
"""Most GPUs (and tensor, pipeline, expert degrees) an estimate takes: ten times today's largest clusters."""
MAX_SIZE = 2**31
"""Most layers, heads, hidden size, sequence length or micro-batch an estimate takes (int32 sizes)."""
MAX_TOKENS_PER_SECOND = 1e15
"""Most tokens per second a run's MFU is computed for (a million GPUs at a billion tokens/s each)."""


def require_positive(**values: float) -> None:
    """Raise :class:`ParameterError` naming the first value that is zero, negative or not a number."""
    for name, value in values.items():
        if isinstance(value, bool) or not value > 0:
            raise ParameterError(
                f"{{{name}:name}} must be positive, got {{{name}!r}}: pass a size greater than zero", **{name: value}
            )


def require_at_most(limit: float, bound: str, **values: float) -> None:
    """Raise :class:`ParameterError` naming the first value that is not a finite number of at most ``limit``.

    ``bound`` says the limit in words (``"1e15 parameters"``); huge ints are compared exactly, never as floats.
    """
    for name, value in values.items():
        finite = isinstance(value, int) or math.isfinite(value)
        if isinstance(value, bool) or not finite or value > limit:
            raise ParameterError(
                f"{{{name}}} is out of range: give a finite number of at most {bound}", **{name: value}
            )


def _unknown_recompute(recompute: str) -> ParameterError:
    return ParameterError(f"unknown {{recompute}}: use one of {', '.join(RECOMPUTE)}", recompute=recompute)


def require_recompute(recompute: str) -> Recompute:
    if recompute not in RECOMPUTE:
        raise _unknown_recompute(recompute)
    return recompute


@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerShape:
    """What the FLOPs count needs to know about a decoder-only transformer."""

    params: int
    """N: every parameter, each tied tensor once."""
    layers: int
    """L: transformer blocks."""
    heads: int
    """H: attention heads."""
    head_dim: int
    """Q: size of one head (hidden / heads)."""
    seq: int
    """T: tokens per sequence (the attention span)."""
    embedding_params: int = 0
    """Parameters left out of N because they cost no FLOPs (position and untied token embeddings)."""

    def __post_init__(self) -> None:
        require_positive(params=self.params, layers=self.layers, heads=self.heads, head_dim=self.head_dim, seq=self.seq)
        require_at_most(MAX_COUNT, "1e15 parameters", params=self.params)
        require_at_most(MAX_SIZE, "2**31", layers=self.layers, heads=self.heads, head_dim=self.head_dim, seq=self.seq)
        if not 0 <= self.embedding_params < self.params:
            raise ParameterError(
                "{embedding_params} must be in [0, {params}): give the embedding share of the parameters",
                embedding_params=self.embedding_params,
                params=self.params,
            )

    @property
    def dense_params(self) -> int:
        """N as the PaLM formula uses it: the parameters that take part in matmuls."""
        return self.params - self.embedding_params

    @property
    def attention_flops(self) -> int:
        """12·L·H·Q·T: the attention scores and their weighted sum, forward and backward, per token."""
        return 12 * self.layers * self.heads * self.head_dim * self.seq


def flops_per_token(shape: TransformerShape) -> int:
    """Model FLOPs per token for training, ``6N + 12·L·H·Q·T`` (PaLM appendix B). The numerator of MFU."""
    return 6 * shape.dense_params + shape.attention_flops


def recompute_flops_per_token(shape: TransformerShape, recompute: Recompute) -> int:
    """FLOPs per token that activation recomputation runs again: 0, ``4·L·H·Q·T`` or ``2N + 4·L·H·Q·T``."""
    forward_attention = shape.attention_flops // 3
    if recompute == "none":
        return 0
    if recompute == "selective":
        return forward_attention
    if recompute == "full":
        return 2 * shape.dense_params + forward_attention
    raise _unknown_recompute(recompute)


def hardware_flops_per_token(shape: TransformerShape, recompute: Recompute) -> int:
    """Hardware FLOPs per token: model FLOPs plus recomputation. The numerator of HFU."""
    return flops_per_token(shape) + recompute_flops_per_token(shape, recompute)


__all__ = [
    "MAX_COUNT",
    "MAX_GPUS",
    "MAX_SIZE",
    "MAX_TOKENS_PER_SECOND",
    "RECOMPUTE",
    "Recompute",
    "TransformerShape",
    "flops_per_token",
    "hardware_flops_per_token",
    "recompute_flops_per_token",
    "require_at_most",
    "require_positive",
    "require_recompute",
]
