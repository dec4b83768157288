"""The shipped workloads (``toy``, ``tinylm``, ``tabular``) and the seed range they share.

Floor 8 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/.
"""

from __future__ import annotations

from gpufleet.errors import ParameterError

MAX_SEED = 2**32 - 1
"""The largest seed every consumer of a workload's seed takes: ``numpy.random.seed`` (``tinylm``) stops at
2**32-1, ``torch.manual_seed`` at 2**64-1 (``toy`` and ``tabular`` also seed a generator with
``seed * 100_003 + position``, which stays below that), ``numpy.random.default_rng`` has no limit."""


def check_seed(seed: int) -> int:
    """``seed`` if every generator a workload seeds takes it; otherwise one line naming the range."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ParameterError("{seed} is out of range: give a whole number from 0 to 2**32-1 (4294967295)", seed=seed)
    return seed


__all__ = ["MAX_SEED", "check_seed"]
