"""Every top-level command of ``gpufleet``, as data: its name, where it lives, its one-line help, its help panel.

The strings are written here, not read from the commands, so that ``gpufleet --help`` lists them all
without importing one: a command's module (and what it pulls in: pydantic, numpy, torch) is imported
only when that command runs (:mod:`gpufleet.cli.lazy`). ``tests/cli/test_cli_fast.py`` checks that each
line here is the first paragraph of its command's own help and that the panels hold every command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["COMMANDS", "PANELS", "CommandEntry"]

START, JOBS, ANALYSIS, OPERATE, QUALITY = "Start", "Jobs", "Cost and analysis", "Operate", "Quality"
PANELS: Final = (START, JOBS, ANALYSIS, OPERATE, QUALITY)
"""The help panels, in the order ``gpufleet --help`` prints them."""


@dataclass(frozen=True, slots=True)
class CommandEntry:
    """One command: ``target`` is ``module:attribute`` under ``gpufleet.cli`` (a function or a ``typer.Typer``)."""

    name: str
    target: str
    panel: str
    help: str

    @property
    def module(self) -> str:
        return f"gpufleet.cli.{self.target.partition(':')[0]}"

    @property
    def attribute(self) -> str:
        return self.target.partition(":")[2]


_ALL = (
    CommandEntry(
        "demo",
        "demo:demo_command",
        START,
        "The headline job: a preempted training run resumes at its last healthy step and is priced.",
    ),
    CommandEntry("submit", "jobs:submit", START, "Queue a training job."),
    CommandEntry("validate", "jobs:validate", START, "Check a JobSpec file without submitting it."),
    CommandEntry(
        "serve",
        "serve:serve_command",
        START,
        "Serve the fleet: pages (fleet, jobs, cost, quality), the JSON API and the signed alert webhook.",
    ),
    CommandEntry("jobs", "jobs:jobs", JOBS, "List jobs."),
    CommandEntry("show", "jobs:show", JOBS, "One job: its attempts, notable events and checkpoints."),
    CommandEntry("logs", "jobs:logs", JOBS, "Print an attempt's stdout and stderr."),
    CommandEntry("preempt", "jobs:preempt", JOBS, "Preempt a running job: it saves, exits and goes back to the queue."),
    CommandEntry("cancel", "jobs:cancel", JOBS, "Cancel a job for good."),
    CommandEntry(
        "hold",
        "jobs:hold",
        JOBS,
        "Keep a queued job from starting until `gpufleet release` (local and Slurm backends).",
    ),
    CommandEntry("release", "jobs:release", JOBS, "Let a held job start again, in its turn."),
    CommandEntry(
        "resize",
        "jobs:resize",
        JOBS,
        "Change a job's GPUs for its next attempts: it resumes from its checkpoint on the new world size.",
    ),
    CommandEntry("ckpt", "ckpt:ckpt_app", JOBS, "Inspect and verify checkpoint directories."),
    CommandEntry(
        "cost",
        "jobs:cost",
        ANALYSIS,
        "GPU-hours and money per team and for the costliest jobs, with the work lost to preemption and the goodput.",
    ),
    CommandEntry(
        "goodput",
        "goodput:goodput",
        ANALYSIS,
        "Effective training time of one synchronous job under failures: Daly's closed form or a Monte Carlo.",
    ),
    CommandEntry(
        "advise",
        "advise:advise_command",
        ANALYSIS,
        "The checkpoint interval JOB should use (Young, Daly) from its measured save, restore, start-up and "
        "preemptions, and the share of time lost at today's interval and at the recommended one.",
    ),
    CommandEntry(
        "diagnose",
        "observe:diagnose_job_command",
        ANALYSIS,
        "Find what holds a job back: GPU bottlenecks in its own GPU series (recorded by every attempt) and, "
        "for a distributed job, a rank that hung or holds the others up; each finding with its evidence.",
    ),
    CommandEntry(
        "profile",
        "profile:profile_command",
        ANALYSIS,
        "Profile a few steps of a job in-process: time shares, top operators, and what to try next.",
    ),
    CommandEntry(
        "trace",
        "trace:trace_command",
        ANALYSIS,
        "Export a job's attempts and phases as an OpenTelemetry trace (jobs/<id>/trace.otlp.json).",
    ),
    CommandEntry(
        "estimate",
        "estimate:estimate_app",
        ANALYSIS,
        "Estimate MFU, memory per GPU, the parallel layouts that fit (PaLM, ZeRO, Korthikanti et al.) and what an "
        "all-reduce costs (NCCL's ring and tree, nccl-tests' bus bandwidth).",
    ),
    CommandEntry(
        "place",
        "place:place_command",
        ANALYSIS,
        "Choose a provider, region, GPU type and market for each job at the lowest expected cost.",
    ),
    CommandEntry(
        "simulate",
        "simulate:simulate_command",
        ANALYSIS,
        "Simulate a fleet under each placement policy: cost, wasted GPU-hours, queue waits, deadline misses.",
    ),
    CommandEntry(
        "fleet",
        "fleet:fleet_app",
        OPERATE,
        "The local backend's fleet: pools of offers, team quotas, outages and failover.",
    ),
    CommandEntry(
        "slurm", "slurm:slurm_app", OPERATE, "Operate a Slurm cluster: accounts, holds, drains, requeues, topology."
    ),
    CommandEntry("sweep", "sweep:sweep_app", OPERATE, "Hyper-parameter sweeps: each trial is a preemptible fleet job."),
    CommandEntry(
        "observe",
        "observe:observe_app",
        OPERATE,
        "Prometheus rules, a Grafana dashboard, a synthetic exporter, GPU diagnosis, the fleet report.",
    ),
    CommandEntry(
        "debug",
        "debug:debug_app",
        OPERATE,
        "Numerical debugging: determinism across runs and seeds, exact resumption, loss spikes.",
    ),
    CommandEntry("bench", "bench:bench_app", OPERATE, "Measure the disk and the network a job depends on."),
    CommandEntry(
        "export",
        "export:export_app",
        OPERATE,
        "Write a JobSpec as another scheduler's files: a SkyPilot task, or Kueue manifests.",
    ),
    CommandEntry(
        "drift",
        "quality:drift_command",
        QUALITY,
        "Compare current data with a reference, column by column (KS, chi-squared, PSI, Wasserstein, JS, MMD).",
    ),
    CommandEntry(
        "quality",
        "quality:quality_app",
        QUALITY,
        "The model-quality loop: drift, retraining, champion and challenger.",
    ),
    CommandEntry(
        "registry",
        "registry:registry_app",
        QUALITY,
        "The model registry (MLflow): alias history, promotion, rollback.",
    ),
)
COMMANDS: Final[dict[str, CommandEntry]] = {entry.name: entry for entry in _ALL}
"""The commands by name, in the order ``--help`` lists them (grouped by :data:`PANELS`)."""
