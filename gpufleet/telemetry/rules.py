"""Prometheus recording and alert rules, and a Grafana dashboard, for gpufleet and DCGM metrics.

The same files serve a laptop (the synthetic DCGM exporter) and a GPU fleet (dcgm-exporter):
both expose dcgm-exporter's metric names and labels. Thresholds follow the DCGM user guide's
profiling metrics (SM_ACTIVE below 0.5 is ineffective use; DRAM_ACTIVE about 0.8 is the
practical peak) and NVML's clock-event reason bits. PromQL has no bitwise operators, so bit
``2**k`` of the clock-event mask is tested as ``floor(x / 2**k) % 2 == 1``.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

SM = "DCGM_FI_PROF_SM_ACTIVE"
TENSOR = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DRAM = "DCGM_FI_PROF_DRAM_ACTIVE"
GPU_KEYS = "hostname, gpu, hpc_job"

CLOCK_BITS = {
    "0x8": ("hardware slowdown", 8),
    "0x20": ("software thermal slowdown", 32),
    "0x40": ("hardware thermal slowdown", 64),
    "0x80": ("hardware power brake", 128),
}


def _alert(name: str, expr: str, duration: str, severity: str, summary: str, source: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": duration,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "source": source},
    }


RL_PANELS: dict[str, tuple[str, str]] = {
    "env_steps_per_second": ("environment steps/s per job", "short"),
    "updates_per_second": ("learner updates/s per job", "short"),
    "policy_lag": ("policy lag (updates)", "short"),
    "episode_return": ("episode return (mean of 100)", "short"),
    "buffer_fill": ("replay buffer fill", "percentunit"),
    "sample_reuse": ("sample reuse", "short"),
}
"""``gpufleet_rl_<name>`` gauges of actor-learner jobs (:mod:`gpufleet.rl.report`), a panel each: title and unit."""


def recording_rules() -> list[dict[str, str]]:
    return [
        {"record": "gpufleet:gpu_sm_active:avg5m", "expr": f"avg by ({GPU_KEYS}) (avg_over_time({SM}[5m]))"},
        {"record": "gpufleet:gpu_tensor_active:avg5m", "expr": f"avg by ({GPU_KEYS}) (avg_over_time({TENSOR}[5m]))"},
        {"record": "gpufleet:gpu_dram_active:avg5m", "expr": f"avg by ({GPU_KEYS}) (avg_over_time({DRAM}[5m]))"},
        {"record": "gpufleet:fleet_sm_active:avg5m", "expr": f"avg(avg_over_time({SM}[5m]))"},
        {
            "record": "gpufleet:job_tokens_per_second:avg5m",
            "expr": "avg by (job_id, job_name, team) (avg_over_time(gpufleet_job_tokens_per_second[5m]))",
        },
        {
            "record": "gpufleet:job_mfu:avg5m",
            "expr": "avg by (job_id, job_name, team) (avg_over_time(gpufleet_job_mfu[5m]))",
        },
        {
            "record": "gpufleet:rank_phase_seconds:avg5m",
            "expr": f"avg by (job_id, job_name, team, rank, host, phase) (avg_over_time({RANK_PHASE}[5m]))",
        },
        *(
            {
                "record": f"gpufleet:job_rl_{name}:avg5m",
                "expr": f"avg by (job_id, job_name, team) (avg_over_time(gpufleet_rl_{name}[5m]))",
            }
            for name in RL_PANELS
        ),
        {
            "record": "gpufleet:team_preemptions:increase1h",
            "expr": "sum by (team) (increase(gpufleet_job_preemptions_total[1h]))",
        },
        {"record": "gpufleet:team_gpus_in_use", "expr": "sum by (team) (gpufleet_job_gpus)"},
        {
            "record": "gpufleet:team_gpu_hours:increase1h",
            "expr": "sum by (team) (increase(gpufleet_job_gpu_seconds_total[1h])) / 3600",
        },
        {
            "record": "gpufleet:team_cost_per_hour:rate5m",
            "expr": "sum by (team, currency) (rate(gpufleet_job_cost_total[5m])) * 3600",
        },
        {
            "record": "gpufleet:checkpoint_save_seconds:p95_1h",
            "expr": "histogram_quantile(0.95, sum by (le, team) (rate(gpufleet_checkpoint_save_seconds_bucket[1h])))",
        },
    ]


RANK_PHASE = "gpufleet_rank_phase_seconds"
"""Seconds a step each rank spends in each phase (labels: the job's, plus ``rank``, ``host``, ``phase``)."""
STRAGGLER_FACTOR = 1.5
"""How far over its job's median a rank's compute or data wait must be (``distributed.straggler_factor``)."""
STRAGGLER_MIN_SECONDS = 0.001
"""And by how much at least, a step: a data wait that goes from 0.1 ms to 0.3 ms is 3x but costs nothing."""
JOB_PHASE = "job_id, attempt, phase"


def straggler_expr(factor: float = STRAGGLER_FACTOR, min_seconds: float = STRAGGLER_MIN_SECONDS) -> str:
    """A rank whose ``compute`` or ``data_wait`` a step exceeds ``factor`` x the median of its job's ranks.

    The median is over all the ranks of the job's attempt, the rank itself included (PromQL cannot leave
    one out), which makes it a little less sensitive than the runtime's own detector for two ranks.
    """
    series = f'{RANK_PHASE}{{phase=~"compute|data_wait"}}'
    median = f"quantile by ({JOB_PHASE}) (0.5, {series})"
    return (
        f"({series} > on ({JOB_PHASE}) group_left () ({factor:g} * {median}))\n"
        f"and ({series} - on ({JOB_PHASE}) group_left () {median} > {min_seconds:g})"
    )


def alert_rules() -> list[dict[str, Any]]:
    guide = "DCGM user guide, profiling metrics"
    alerts = [
        _alert(
            "GpuIneffectiveUse",
            f'avg_over_time({SM}{{hpc_job!=""}}[10m]) < 0.5',
            "30m",
            "warning",
            "SM active below 0.5 on a GPU running a job: the GPU is used ineffectively",
            guide,
        ),
        _alert(
            "GpuTensorCoresIdle",
            f"avg_over_time({SM}[10m]) >= 0.5 and avg_over_time({TENSOR}[10m]) < 0.1",
            "15m",
            "warning",
            "SMs busy but tensor pipes idle: check bf16/fp16 autocast and matmul shapes",
            guide,
        ),
        _alert(
            "GpuMemoryBandwidthBound",
            f"avg_over_time({DRAM}[10m]) >= 0.8",
            "15m",
            "info",
            "DRAM active at the practical peak: the job is memory-bandwidth bound",
            guide,
        ),
        _alert(
            "GpuOomRisk",
            "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) > 0.95",
            "10m",
            "warning",
            "Framebuffer above 95% for 10 minutes: out-of-memory risk",
            "dcgm-exporter FB_USED/FB_FREE",
        ),
        _alert(
            "GpuIdle",
            "max_over_time(DCGM_FI_DEV_GPU_UTIL[60m]) == 0",
            "5m",
            "info",
            "GPU at 0% utilisation for an hour: release it",
            "DCGM_FI_DEV_GPU_UTIL",
        ),
        _alert(
            "GpuXidErrors",
            "DCGM_FI_DEV_XID_ERRORS > 0",
            "0m",
            "critical",
            "An XID error was reported: check the driver log and drain the node if it repeats",
            "NVIDIA XID error catalogue",
        ),
        _alert(
            "JobPreemptedOften",
            "increase(gpufleet_job_preemptions_total[1h]) > 3",
            "0m",
            "warning",
            "A job was preempted more than 3 times in an hour: move it to on-demand or another provider",
            "gpufleet runtime",
        ),
        _alert(
            "JobRankStraggler",
            straggler_expr(),
            "5m",
            "warning",
            "Rank {{ $labels.rank }} on {{ $labels.host }} holds job {{ $labels.job_id }} up: its "
            f"{{{{ $labels.phase }}}} takes over {STRAGGLER_FACTOR:g}x the median of the job's ranks a step "
            "(gpufleet diagnose JOB names the tax)",
            "gpufleet runtime: per-rank phase times",
        ),
        _alert(
            "JobCheckpointSlow",
            "gpufleet:checkpoint_save_seconds:p95_1h > 60",
            "15m",
            "warning",
            "Checkpoint saves take over a minute at p95: preemptions will lose work",
            "gpufleet runtime",
        ),
    ]
    for bit, (meaning, value) in CLOCK_BITS.items():
        alerts.append(
            _alert(
                f"GpuClockEvent{bit}",
                f"floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS / {value}) % 2 == 1",
                "5m",
                "warning",
                f"Clocks reduced by {meaning} (clock-event bit {bit})",
                "NVML nvmlClocksEventReasons",
            )
        )
    return alerts


def rules_yaml() -> str:
    doc = {
        "groups": [
            {"name": "gpufleet.recording", "interval": "15s", "rules": recording_rules()},
            {"name": "gpufleet.alerts", "rules": alert_rules()},
        ]
    }
    return "# Generated by `gpufleet observe rules`; load with rule_files in prometheus.yml.\n" + yaml.safe_dump(
        doc, sort_keys=False, width=120
    )


def _panel(panel_id: int, title: str, expr: str, legend: str, unit: str, x: int, y: int) -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": "A", "expr": expr, "legendFormat": legend}],
    }


def dashboard() -> dict[str, Any]:
    """A Grafana dashboard (JSON model, importable as is) over the rules above."""
    specs = [
        ("Fleet SM active", "gpufleet:fleet_sm_active:avg5m", "fleet", "percentunit"),
        ("SM active per GPU", "gpufleet:gpu_sm_active:avg5m", "{{hostname}} gpu{{gpu}} {{hpc_job}}", "percentunit"),
        ("Tensor pipe active per GPU", "gpufleet:gpu_tensor_active:avg5m", "{{hostname}} gpu{{gpu}}", "percentunit"),
        ("DRAM active per GPU", "gpufleet:gpu_dram_active:avg5m", "{{hostname}} gpu{{gpu}}", "percentunit"),
        ("Throughput per job", "gpufleet:job_tokens_per_second:avg5m", "#{{job_id}} {{job_name}}", "short"),
        ("MFU per job", "gpufleet:job_mfu:avg5m", "#{{job_id}} {{job_name}}", "percentunit"),
        (
            "Seconds a step per rank and phase",
            "gpufleet:rank_phase_seconds:avg5m",
            "#{{job_id}} rank {{rank}}@{{host}} {{phase}}",
            "s",
        ),
        ("Checkpoint save p95", "gpufleet:checkpoint_save_seconds:p95_1h", "{{team}}", "s"),
        ("Preemptions per team (1h)", "gpufleet:team_preemptions:increase1h", "{{team}}", "short"),
        ("GPUs in use per team", "gpufleet:team_gpus_in_use", "{{team}}", "short"),
        ("GPU-hours per team (1h)", "gpufleet:team_gpu_hours:increase1h", "{{team}}", "short"),
        ("Cost per team (per hour)", "gpufleet:team_cost_per_hour:rate5m", "{{team}} {{currency}}", "currencyUSD"),
        *(
            (f"RL {title}", f"gpufleet:job_rl_{name}:avg5m", "#{{job_id}} {{job_name}}", unit)
            for name, (title, unit) in RL_PANELS.items()
        ),
    ]
    panels = [
        _panel(i + 1, title, expr, legend, unit, 12 * (i % 2), 8 * (i // 2))
        for i, (title, expr, legend, unit) in enumerate(specs)
    ]
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "pluginId": "prometheus"}],
        "title": "gpufleet",
        "uid": "gpufleet-fleet",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "tags": ["gpufleet", "dcgm"],
        "panels": panels,
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


__all__ = [
    "CLOCK_BITS",
    "DRAM",
    "GPU_KEYS",
    "RANK_PHASE",
    "SM",
    "STRAGGLER_FACTOR",
    "TENSOR",
    "alert_rules",
    "dashboard",
    "dashboard_json",
    "recording_rules",
    "rules_yaml",
    "straggler_expr",
]
