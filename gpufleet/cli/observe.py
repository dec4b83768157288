"""``gpufleet observe ...``: the Prometheus rules and the Grafana dashboard, generated."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpufleet.cli.gpu import exporter_command
from gpufleet.telemetry.rules import dashboard_json, rules_yaml

if TYPE_CHECKING:
    from gpufleet.telemetry.diagnose import Finding

observe_app = typer.Typer(help="Prometheus rules and a Grafana dashboard for the fleet.", no_args_is_help=True)
OutOpt = Annotated[Path | None, typer.Option("--out", help="Write to this file instead of stdout.")]


def _write(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {out}", err=True)


observe_app.command("exporter")(exporter_command)


@observe_app.command()
def rules(out: OutOpt = None) -> None:
    """Recording and alert rules (DCGM thresholds, preemptions, checkpoint time) as Prometheus YAML."""
    _write(rules_yaml(), out)


@observe_app.command()
def dashboard(out: OutOpt = None) -> None:
    """A Grafana dashboard JSON: fleet GPU use, per-job efficiency and throughput, checkpoints, preemptions."""
    _write(dashboard_json(), out)


@observe_app.command("diagnose")
def diagnose_command(
    scrapes: Annotated[
        list[Path] | None, typer.Argument(help="dcgm-exporter scrapes (text format), in time order.")
    ] = None,
    pattern: Annotated[str | None, typer.Option(help="Diagnose a synthetic job with this GPU pattern instead.")] = None,
    gpus: Annotated[int, typer.Option(help="GPUs of the synthetic job.", min=1)] = 8,
    minutes: Annotated[float, typer.Option(help="Length of the synthetic job in minutes.")] = 10.0,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic job.")] = 0,
    precision: Annotated[
        str, typer.Option(help="Training dtype (bf16, fp16, fp8, fp32): tensor-core rules need it.")
    ] = "bf16",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Find GPU bottlenecks (DCGM rules with their evidence) in scrapes, or in a synthetic job."""
    from gpufleet.errors import UsageError
    from gpufleet.telemetry import (
        PATTERNS,
        JobContext,
        SyntheticJobConfig,
        diagnose,
        generate_samples,
        parse_exposition,
        series_from_samples,
    )

    warnings: list[str] = []
    if pattern is not None:
        if pattern not in PATTERNS:
            raise UsageError(f"unknown --pattern {pattern!r}; choose one of: {', '.join(PATTERNS)}")
        samples = generate_samples(SyntheticJobConfig(pattern=pattern, gpus=gpus, duration_s=minutes * 60, seed=seed))
        source = f"synthetic {pattern} job on {gpus} GPUs, {minutes:g} min"
    elif scrapes:
        samples, seen = [], set[str]()
        for path in scrapes:
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError as err:
                raise UsageError(f"cannot read scrape {str(path)!r}: {err.strerror}") from None
            result = parse_exposition(text)
            samples.extend(result.samples)
            for w in result.warnings:
                if w.message not in seen:
                    seen.add(w.message)
                    warnings.append(f"{path}: {w.message}")
        source = f"{len(scrapes)} scrape(s)"
    else:
        raise UsageError("give scrape files, or --pattern NAME for a synthetic job (see --help)")
    if precision not in ("bf16", "fp16", "fp8", "fp32", "tf32"):
        raise UsageError(f"unknown --precision {precision!r}; choose bf16, fp16, fp8, tf32 or fp32")
    findings = diagnose(series_from_samples(samples), JobContext(precision=precision))
    print_findings(source, findings, warnings, json_out)


def print_findings(source: str, findings: Sequence[Finding], warnings: Sequence[str], json_out: bool) -> None:
    """Findings as one JSON object, or as a table followed by each finding's suggestion and source."""
    from gpufleet.cli.render import console, emit_json, fmt, table

    if json_out:
        emit_json({"source": source, "findings": [f.to_dict() for f in findings], "warnings": list(warnings)})
        return
    for line in warnings[:20]:
        console.print(f"[yellow]warning:[/] {line}", highlight=False)
    if not findings:
        console.print(f"{source}: no finding")
        return
    rows = [
        [
            f.rule_id,
            f.title,
            f.metric,
            f"{fmt(f.observed)} {f.comparison} {fmt(f.threshold)}",
            f"{f.duration_s:.0f}s",
            ",".join(f.gpus),
        ]
        for f in findings
    ]
    console.print(table(f"{source}: findings", ["rule", "finding", "metric", "evidence", "for", "gpus"], rows))
    for f in findings:
        console.print(f"- {f.rule_id}: {f.suggestion} [dim](source: {f.source})[/]", highlight=False)


def diagnose_job_command(
    job_id: Annotated[int, typer.Argument(help="Job id (see `gpufleet jobs`).", min=1)],
    window: Annotated[
        float, typer.Option("--window", help="Seconds each condition is averaged over.", min=0.001)
    ] = 60.0,
    min_duration: Annotated[
        float, typer.Option("--min-duration", help="Seconds a condition must hold to be a finding.", min=0.001)
    ] = 300.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Find what holds a job back: GPU bottlenecks in its own GPU series (recorded by every attempt) and,
    for a distributed job, a rank that hung or holds the others up; each finding with its evidence."""
    from gpufleet.errors import UsageError
    from gpufleet.jobs.events import iter_events
    from gpufleet.jobs.store import Store
    from gpufleet.paths import gpufleet_home, job_dir
    from gpufleet.telemetry import DiagnosisConfig, JobContext, diagnose, series_from_samples
    from gpufleet.telemetry.gpu import job_gpu_samples
    from gpufleet.telemetry.ranks import rank_findings

    home = gpufleet_home()
    store = Store(home / "state.db")
    try:
        job = store.job(job_id)
    finally:
        store.close()
    folder = job_dir(home, job_id)
    samples = job_gpu_samples(folder)
    telemetry = job.spec.telemetry
    ranked = rank_findings(iter_events(folder / "events.jsonl")) if job.spec.world_size > 1 else []
    if not samples and job.spec.world_size > 1:
        source = f"job {job_id} {job.name}: {job.spec.world_size} ranks, no GPU series"
        note = f"no GPU series (telemetry.gpu_source is {telemetry.gpu_source!r}): only the ranks were judged"
        print_findings(source, ranked, [note], json_out)
        return
    if not samples:
        raise UsageError(
            f"job {job_id} has no GPU series (telemetry.gpu_source is {telemetry.gpu_source!r}); set "
            "telemetry.gpu_source to nvml, scrape:<url> or synthetic:<pattern> in its spec"
        )
    attempts = sorted({s.labels.get("attempt", "?") for s in samples})
    gpus = sorted({s.labels.get("gpu", "?") for s in samples}, key=lambda g: (len(g), g))
    series = series_from_samples(samples)
    source = (
        f"job {job_id} {job.name}: {len(gpus)} GPU(s), {len(attempts)} attempt(s), "
        f"{series.duration_s:.0f} s of GPU series"
    )
    config = DiagnosisConfig(window_s=window, min_duration_s=min_duration)
    findings = ranked + diagnose(series, JobContext(precision=telemetry.precision), config)
    notes = []
    if series.duration_s < min_duration:
        notes.append(
            f"the series cover {series.duration_s:.0f} s, less than the {min_duration:g} s a condition must hold; "
            "lower --min-duration (and --window) to judge a short job"
        )
    print_findings(source, findings, notes, json_out)
