from __future__ import annotations

import numpy as np
import pytest

from gpufleet.errors import UsageError
from gpufleet.telemetry import (
    PATTERNS,
    RULES,
    DiagnosisConfig,
    JobContext,
    JobSeries,
    SyntheticJobConfig,
    diagnose,
    parse_exposition,
    render_exposition,
    series_from_samples,
    synthesize,
)

EXPECTED = {
    "healthy": set(),
    "tensor_idle": {"tensor_idle"},
    "memory_bound": {"memory_bandwidth_bound"},
    "comm_bound": {"comm_bound"},
    "host_bound": {"host_bound"},
    "thermal_throttle": {"thermal_throttle"},
    "power_throttle": {"power_throttle"},
    "oom_risk": {"oom_risk"},
    "idle": {"gpu_idle"},
}
BF16 = JobContext(precision="bf16")
SHORT_IDLE = DiagnosisConfig(idle_window_s=120)


def test_every_pattern_has_an_expectation() -> None:
    assert set(EXPECTED) == set(PATTERNS)
    assert all(ids <= set(RULES) for ids in EXPECTED.values())


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_gives_exactly_its_finding(pattern: str) -> None:
    job = synthesize(SyntheticJobConfig(pattern=pattern, seed=11))  # type: ignore[arg-type]
    findings = diagnose(job.series, BF16, SHORT_IDLE)
    assert {f.rule_id for f in findings} == EXPECTED[pattern]
    for f in findings:
        assert f.gpus == job.series.gpus
        assert f.duration_s >= SHORT_IDLE.min_duration_s
        assert f.source and f.suggestion and f.metric


def test_seed_example_85_percent_util_but_dram_at_99_percent() -> None:
    shape = (2, 900)
    series = JobSeries(
        step_s=1.0,
        gpus=("0", "1"),
        metrics={"DCGM_FI_DEV_GPU_UTIL": np.full(shape, 85.0), "DCGM_FI_PROF_DRAM_ACTIVE": np.full(shape, 0.99)},
    )
    (finding,) = diagnose(series)
    assert finding.rule_id == "memory_bandwidth_bound"
    assert finding.observed == pytest.approx(0.99)
    assert finding.threshold == 0.8 and finding.comparison == ">="
    assert finding.duration_s == 900.0
    assert "DCGM user guide" in finding.source


def test_short_episodes_do_not_flap() -> None:
    job = synthesize(SyntheticJobConfig(pattern="memory_bound", duration_s=200))
    assert diagnose(job.series) == []  # 200 s < min_duration_s (300 s)


def test_idle_needs_the_idle_window() -> None:
    job = synthesize(SyntheticJobConfig(pattern="idle", duration_s=600))
    assert "gpu_idle" not in {f.rule_id for f in diagnose(job.series)}  # default window: 60 minutes


def test_tensor_rule_needs_a_low_precision_job() -> None:
    job = synthesize(SyntheticJobConfig(pattern="tensor_idle"))
    assert diagnose(job.series, JobContext(precision="fp32")) == []


def test_context_findings() -> None:
    job = synthesize(SyntheticJobConfig(pattern="healthy", gpus=2))
    ids = [f.rule_id for f in diagnose(job.series, JobContext(data_loading_fraction=0.12, allocator_retries=3))]
    assert ids == ["data_loading_slow", "oom_risk"]
    assert diagnose(job.series, JobContext(data_loading_fraction=0.04)) == []


def test_diagnosis_through_an_exposition_round_trip() -> None:
    job = synthesize(SyntheticJobConfig(pattern="thermal_throttle", gpus=2, duration_s=400))
    text = "".join(render_exposition(job.samples_at(i)) for i in range(job.n_times))
    scrape = parse_exposition(text, already_warned=())
    series = series_from_samples(scrape.samples, job="synthetic-job")
    assert series.step_s == 1.0 and series.gpus == ("0", "1")
    np.testing.assert_array_equal(series.metrics["DCGM_FI_DEV_GPU_TEMP"], job.series.metrics["DCGM_FI_DEV_GPU_TEMP"])
    assert [f.rule_id for f in diagnose(series)] == ["thermal_throttle"]
    assert series_from_samples(scrape.samples, job="other").metrics == {}


def test_same_seed_same_series() -> None:
    a = synthesize(SyntheticJobConfig(pattern="host_bound", seed=5, gpus=2, duration_s=30))
    b = synthesize(SyntheticJobConfig(pattern="host_bound", seed=5, gpus=2, duration_s=30))
    assert a.samples() == b.samples()


def test_bad_config_names_the_value() -> None:
    with pytest.raises(UsageError, match="unknown pattern 'slow'"):
        SyntheticJobConfig(pattern="slow")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="window_s=0"):
        DiagnosisConfig(window_s=0)
