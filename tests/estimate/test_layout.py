"""The layout advisor: what fits, in which order, and why the rest does not."""

from __future__ import annotations

import pytest

from gpufleet.errors import UsageError
from gpufleet.estimate.layout import GIB, advise_layout, usable_bytes
from gpufleet.estimate.memory import ActivationShape
from gpufleet.estimate.peak import gpu_peak

LLAMA2_7B = ActivationShape(layers=32, hidden=4096, heads=32, seq=4096, micro_batch=1)


def test_usable_memory_keeps_10_percent_and_1_gib() -> None:
    assert usable_bytes(gpu_peak("h100")) == 71 * GIB
    assert usable_bytes(gpu_peak("a100-40gb"), headroom=0.0, reserve_gib=0.0) == 40 * GIB
    with pytest.raises(UsageError, match=r"^headroom=1\.5 must be in \[0, 1\): "):
        usable_bytes(gpu_peak("h100"), headroom=1.5)


def test_7b_on_8_h100_ddp_is_rejected_with_its_size() -> None:
    options = advise_layout(6_740_000_000, 8, "h100", shape=LLAMA2_7B, recompute="selective")
    ddp = next(o for o in options if (o.strategy, o.offload, o.tp, o.pp) == ("ddp", "none", 1, 1))
    # (2 + 2 + 12) B * 6.74e9 = 100.4 GiB of model states, plus 32 * 34sbh = 17.0 GiB of activations.
    assert not ddp.fits and ddp.reason.startswith("needs 117.4 GiB, more than the 71.0 GiB usable")
    first = options[0]
    assert first.fits and (first.strategy, first.tp, first.pp) == ("zero1", 1, 1)
    fitting = [o for o in options if o.fits]
    assert [o.rank for o in fitting] == sorted(o.rank for o in fitting)
    assert all(o.needed_bytes is not None and o.needed_bytes <= o.usable_bytes for o in fitting)
    assert options.index(fitting[-1]) == len(fitting) - 1  # the rejected ones come after


def test_degrees_that_do_not_divide_the_model_are_rejected_with_the_reason() -> None:
    shape = ActivationShape(layers=6, hidden=768, heads=12, seq=1024, micro_batch=8)
    options = advise_layout(124_000_000, 8, "l4", shape=shape)
    bad = [o for o in options if o.estimate is None]
    assert {(o.tp, o.pp) for o in bad} >= {(8, 1), (1, 4), (1, 8)}
    assert any(o.reason == "heads=12 is not divisible by tp=8" for o in bad)
    assert any(o.reason == "layers=6 is not divisible by pp=4" for o in bad)
    assert all(o.tp <= 8 for o in options)


def test_hybrid_appears_beyond_one_node_and_offload_comes_last() -> None:
    options = advise_layout(70_000_000_000, 16, "a100-80gb", shape=LLAMA2_7B, recompute="full")
    assert any(o.strategy == "fsdp_hybrid" for o in options)
    fitting = [o for o in options if o.fits]
    offloaded = [i for i, o in enumerate(fitting) if o.offload != "none"]
    assert offloaded and offloaded == list(range(len(fitting) - len(offloaded), len(fitting)))


def test_unknown_gpu_lists_the_known_ones() -> None:
    with pytest.raises(UsageError, match=r"unknown GPU 'tpu-v4': use one of a100-40gb, a100-80gb, h100-sxm"):
        advise_layout(1_000_000, 8, "tpu-v4")
