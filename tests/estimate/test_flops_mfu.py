"""FLOPs per token and MFU against PaLM's published example, nanoGPT's count and the datasheet table."""

from __future__ import annotations

import pytest

from gpufleet.errors import UsageError
from gpufleet.estimate.flops import TransformerShape, flops_per_token, hardware_flops_per_token
from gpufleet.estimate.mfu import mfu, tokens_per_second
from gpufleet.estimate.peak import GPUS, gpu_peak, known_gpus
from gpufleet.workloads.charlm import CharLM, CharLMConfig

PALM_540B = TransformerShape(params=540_000_000_000, layers=118, heads=48, head_dim=256, seq=2048)


def test_palm_540b_mfu_is_46_percent() -> None:
    # PaLM (arXiv:2204.02311) appendix B: 540B model, 238.3K tokens/s on 6144 TPU v4 chips of 275 peak TFLOP/s,
    # 46.2% MFU.
    est = mfu(PALM_540B, tokens_per_second=238.3e3, peak_flops_per_gpu=275e12, num_gpus=6144)
    assert est.flops_per_token == 6 * 540_000_000_000 + 12 * 118 * 48 * 256 * 2048
    assert est.mfu == pytest.approx(0.462, abs=5e-4)
    assert est.peak_flops == 6144 * 275e12
    assert est.achieved_flops == pytest.approx(238.3e3 * est.flops_per_token)
    assert est.hfu == est.mfu


def test_recompute_adds_a_forward() -> None:
    # Korthikanti et al. 2022 section 5: full recomputation runs 96·Bslh² FLOPs against 72·Bslh², i.e. 4/3.
    model = flops_per_token(PALM_540B)
    assert hardware_flops_per_token(PALM_540B, "full") * 3 == model * 4
    assert hardware_flops_per_token(PALM_540B, "selective") - model == 4 * 118 * 48 * 256 * 2048
    est = mfu(PALM_540B, tokens_per_second=1e5, peak_flops_per_gpu=275e12, num_gpus=6144, recompute="full")
    assert est.hfu == pytest.approx(est.mfu * 4 / 3)


def test_matches_nanogpt_count_of_the_charlm() -> None:
    # nanoGPT's estimate_mfu: N without the position embedding; the tied token embedding stays (it is the LM head).
    config = CharLMConfig(vocab_size=65, context=64, layers=2, heads=4, embed=128)
    model = CharLM(config)
    shape = TransformerShape(
        params=model.num_params(), layers=2, heads=4, head_dim=32, seq=64, embedding_params=64 * 128
    )
    assert flops_per_token(shape) == model.flops_per_token()


def test_step_time_form_and_bad_sizes() -> None:
    assert tokens_per_second(step_time=2.0, tokens_per_step=1_048_576) == 524_288
    with pytest.raises(UsageError, match=r"^step_time must be positive, got 0: "):
        tokens_per_second(step_time=0, tokens_per_step=1)
    with pytest.raises(UsageError, match=r"^layers must be positive, got -1: "):
        TransformerShape(params=10, layers=-1, heads=1, head_dim=1, seq=1)
    with pytest.raises(UsageError, match=r"^embedding_params=10 must be in \[0, params=10\): "):
        TransformerShape(params=10, layers=1, heads=1, head_dim=1, seq=1, embedding_params=10)


def test_peak_table() -> None:
    h100 = gpu_peak("NVIDIA H100 80GB HBM3")  # as torch.cuda.get_device_name says it
    assert h100.name == "h100-sxm" and h100.peak_flops("bf16") == pytest.approx(989.5e12)
    assert gpu_peak("A100-SXM4-40GB").memory_gib == 40 and gpu_peak("a100").tflops("tf32") == 156
    assert gpu_peak("NVIDIA GeForce RTX 4090").tflops("fp16") == 165.2
    assert gpu_peak("h200").memory_gib == 141 and gpu_peak("H100 NVL").memory_gib == 94
    for row in GPUS:
        assert row.bf16 <= row.bf16_sparse / 2 + 1e-9 and row.tf32 <= row.tf32_sparse / 2 + 1e-9
        assert row.source.startswith("NVIDIA") and "https://" in row.source
    assert set(known_gpus()) >= {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h100-nvl", "h200", "l40s", "l4"}
    with pytest.raises(UsageError, match=r"unknown GPU 'b200': use one of a100-40gb, .*rtx-4090"):
        gpu_peak("b200")


def test_package_exports() -> None:
    import gpufleet.estimate as estimate

    assert sorted(estimate.__all__) == sorted(set(estimate.__all__))
    assert all(hasattr(estimate, name) for name in estimate.__all__)
