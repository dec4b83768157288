"""``gpufleet observe ...``: the Prometheus rules and the Grafana dashboard, generated."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.telemetry.rules import dashboard_json, rules_yaml

observe_app = typer.Typer(help="Prometheus rules and a Grafana dashboard for the fleet.", no_args_is_help=True)
OutOpt = Annotated[Path | None, typer.Option("--out", help="Write to this file instead of stdout.")]


def _write(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {out}", err=True)


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
    from gpufleet.cli.render import console, emit_json, fmt, table
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
    if json_out:
        emit_json({"source": source, "findings": [f.to_dict() for f in findings], "warnings": warnings})
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
