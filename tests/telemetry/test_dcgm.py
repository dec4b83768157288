from __future__ import annotations

import math

from gpufleet.telemetry import (
    CATALOGUE,
    CounterTracker,
    Sample,
    SyntheticJobConfig,
    parse_exposition,
    render_exposition,
    synthesize,
)

GOOD = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"} 85
DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-a",Hostname="n1"} 0.99 1700000000000
"""


def test_reads_samples_help_and_type() -> None:
    result = parse_exposition(GOOD)
    assert result.warnings == ()
    util, dram = result.samples
    assert util == Sample(
        "DCGM_FI_DEV_GPU_UTIL",
        {"gpu": "0", "UUID": "GPU-a", "modelName": "NVIDIA H100 80GB HBM3", "hostname": "n1"},
        85.0,
    )
    assert dram.value == 0.99 and dram.timestamp_ms == 1_700_000_000_000
    assert result.types["DCGM_FI_DEV_GPU_UTIL"] == "gauge"
    assert result.helps["DCGM_FI_DEV_GPU_UTIL"] == "GPU utilization (in %)."


def test_unknown_metric_is_kept_and_warned_once() -> None:
    text = 'DCGM_FI_DEV_MADE_UP{gpu="0",UUID="u"} 1\nDCGM_FI_DEV_MADE_UP{gpu="1",UUID="v"} 2\n'
    result = parse_exposition(text)
    assert [s.value for s in result.samples] == [1.0, 2.0]
    assert [w.kind for w in result.warnings] == ["unknown_metric"]
    assert "DCGM_FI_DEV_MADE_UP" in result.warnings[0].message
    assert parse_exposition(text, already_warned={"DCGM_FI_DEV_MADE_UP"}).warnings == ()


def test_broken_lines_are_skipped_and_the_rest_is_read() -> None:
    text = "\n".join(
        [
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="u"} 60',
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="u" 61',  # unclosed brace
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="u"} sixty',  # not a number
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="u"} 1_0',  # python float() would accept it
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="u\\q"} 62',  # invalid escape
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",gpu="1"} 63',  # duplicate label
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="u"} 64 12.5',  # non-integer timestamp
            "{} 3",
            'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="v"} 65',
        ]
    )
    result = parse_exposition(text)
    assert [s.value for s in result.samples] == [60.0, 65.0]
    broken = [w for w in result.warnings if w.kind == "broken_line"]
    assert [w.line for w in broken] == [2, 3, 4, 5, 6, 7, 8]


def test_escaped_label_values_and_special_values() -> None:
    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="u",note="say \\"hi\\"\\\\ \\nnext",} NaN\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="v"} +Inf\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="2",UUID="w"} -Inf -5\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="3",UUID="x"} 1.5e3\n'
    )
    result = parse_exposition(text)
    assert result.warnings == ()
    first, pos, neg, sci = result.samples
    assert first.labels["note"] == 'say "hi"\\ \nnext'
    assert math.isnan(first.value)
    assert pos.value == math.inf and neg.value == -math.inf and neg.timestamp_ms == -5
    assert sci.value == 1500.0


def test_aliases_rename_metrics_and_labels() -> None:
    text = (
        'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0",uuid="u",Hostname="n",exported_pod="p",exported_namespace="ns",'
        'pod="dcgm-exporter-x"} 32\n'
        'DCGM_FI_PROF_SM_UTIL_RATIO{gpu="0",UUID="u"} 0.7\n'
    )
    result = parse_exposition(text)
    assert result.warnings == ()
    clocks, sm = result.samples
    assert clocks.name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
    assert clocks.labels == {"gpu": "0", "UUID": "u", "hostname": "n", "pod": "p", "namespace": "ns"}
    assert sm.name == "DCGM_FI_PROF_SM_ACTIVE"


def test_missing_gpu_labels_warned_and_sample_kept() -> None:
    result = parse_exposition('DCGM_FI_DEV_GPU_UTIL{Hostname="n"} 3\n')
    assert len(result.samples) == 1
    (warning,) = result.warnings
    assert warning.kind == "missing_label" and "gpu, UUID" in warning.message


def test_counter_going_backwards_is_a_reset_warning() -> None:
    tracker = CounterTracker()
    name = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    labels = {"gpu": "0", "UUID": "u"}
    assert tracker.observe([Sample(name, labels, 100.0)]) == []
    assert tracker.observe([Sample(name, labels, 150.0)]) == []
    (warning,) = tracker.observe([Sample(name, labels, 10.0), Sample(name, {"gpu": "1", "UUID": "v"}, 5.0)])
    assert warning.kind == "counter_reset" and "150" in warning.message
    assert tracker.observe([Sample(name, labels, 20.0)]) == []
    # a gauge going down is normal; a counter declared by # TYPE is tracked too
    assert (
        tracker.observe([Sample("DCGM_FI_DEV_GPU_TEMP", labels, 1.0), Sample("DCGM_FI_DEV_GPU_TEMP", labels, 0.0)])
        == []
    )
    types = {"my_total": "counter"}
    assert len(tracker.observe([Sample("my_total", {}, 2.0), Sample("my_total", {}, 1.0)], types)) == 1


def test_synthetic_scrape_round_trips() -> None:
    job = synthesize(SyntheticJobConfig(pattern="comm_bound", gpus=4, duration_s=5, seed=3))
    for index in range(job.n_times):
        samples = job.samples_at(index)
        text = render_exposition(samples)
        result = parse_exposition(text)
        assert result.warnings == ()
        assert list(result.samples) == samples
        assert set(result.types) == {s.name for s in samples} <= set(CATALOGUE)


def test_render_escapes_awkward_labels() -> None:
    sample = Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "UUID": 'a"b\\c\nd'}, 0.1 + 0.2, 7)
    assert parse_exposition(render_exposition([sample])).samples == (sample,)
