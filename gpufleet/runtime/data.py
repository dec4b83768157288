"""Random batches that a resumed run sees again: sampling as a pure function of the data position.

A training script that draws its batches from the global RNG (``torch.randint(len(data), ...)``)
resumes with different batches whenever anything else touched that RNG between the checkpoint and
the draw (a batch prefetched before the loop, dropout in an evaluation, another library), and a
rollback replays the very batch that spiked. Seeding one generator per batch from ``(seed,
data_position)`` makes batch ``k`` the same in every run, every attempt and every rank, with no
generator state to checkpoint::

    g = batch_generator(seed, s.data_position)
    ix = torch.randint(len(data) - block, (batch_size,), generator=g)

``batch_generator`` mixes the two integers with SplitMix64 (Steele et al., "Fast splittable
pseudorandom number generators", OOPSLA 2014), so neighbouring positions get unrelated streams.
"""

from __future__ import annotations

import torch

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def position_seed(seed: int, position: int) -> int:
    """A 63-bit seed for batch ``position`` of a run seeded with ``seed``."""
    if position < 0:
        raise ValueError(f"data position {position} must be 0 or more")
    return _splitmix64(_splitmix64(seed & _MASK) ^ (position & _MASK)) >> 1


def batch_generator(seed: int, position: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` for batch ``position``: the same numbers in every run."""
    generator = torch.Generator(device=device)
    generator.manual_seed(position_seed(seed, position))
    return generator


def random_batch_indices(seed: int, position: int, high: int, size: int) -> torch.Tensor:
    """``size`` indices in ``[0, high)`` for batch ``position``, as ``torch.randint`` would draw them."""
    if high <= 0:
        raise ValueError(f"cannot sample indices below {high}: the data is shorter than one example")
    return torch.randint(high, (size,), generator=batch_generator(seed, position))


__all__ = ["batch_generator", "position_seed", "random_batch_indices"]
