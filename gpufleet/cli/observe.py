"""``gpufleet observe ...``: what a fleet shows, and what it cost.

``rules`` and ``dashboard`` generate the Prometheus alert rules and the Grafana dashboard;
``exporter`` serves a synthetic dcgm-exporter so both can be tried without a GPU; ``diagnose``
reads GPU series the way an on-call engineer would; ``report`` is the fleet report (SLOs, use and
money per team, the jobs that wasted the most GPU time)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from gpufleet.errors import Conflict, parameters_as_flags
from gpufleet.fmt import number
from gpufleet.telemetry.rules import dashboard_json, rules_yaml

if TYPE_CHECKING:
    from gpufleet.cost.fleet import FleetReport
    from gpufleet.telemetry.dcgm import Sample
    from gpufleet.telemetry.diagnose import Finding


observe_app = typer.Typer(
    help="Prometheus rules, a Grafana dashboard, a synthetic exporter, GPU diagnosis, the fleet report.",
    no_args_is_help=True,
)
OutOpt = Annotated[Path | None, typer.Option("--out", help="Write to this file instead of stdout.")]
MAX_SCRAPE_BYTES = 64 << 20
"""Largest scrape read (64 MiB): a node's dcgm-exporter answers with tens of kB."""


def _write(text: str, out: Path | None) -> None:
    from gpufleet.cli.options import check_path_name
    from gpufleet.errors import UsageError
    from gpufleet.outfiles import check_output_file

    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        check_output_file(check_path_name(out, "--out"), "--out").write_text(text, encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write --out {str(out)!r}: {err.strerror or err}; pick a writable file") from None
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
    from gpufleet.telemetry.synthetic import MAX_DURATION_S, MAX_GPUS, MAX_SAMPLE_POINTS
    from gpufleet.yamlio import read_bytes_bounded

    warnings: list[str] = []
    if pattern is not None:
        if pattern not in PATTERNS:
            raise UsageError(f"unknown --pattern {pattern!r}; choose one of: {', '.join(PATTERNS)}")
        if not 1 / 60 <= minutes <= MAX_DURATION_S / 60:  # also NaN
            raise UsageError(f"--minutes {minutes:g} is out of range: give 1/60 (one 1 s step) to 10080 (a week)")
        if gpus > MAX_GPUS:
            raise UsageError(f"--gpus {gpus} is out of range: a synthetic job has at most {MAX_GPUS} GPUs")
        if gpus * round(minutes * 60) > MAX_SAMPLE_POINTS:
            raise UsageError(
                f"--gpus {gpus} for --minutes {minutes:g} is more than {MAX_SAMPLE_POINTS:,} GPU-seconds of samples: "
                f"lower --minutes or --gpus (8 GPUs for up to {MAX_SAMPLE_POINTS // 8 // 60} minutes)"
            )
        with parameters_as_flags({"seed": "--seed", "gpus": "--gpus"}):
            config = SyntheticJobConfig(pattern=pattern, gpus=gpus, duration_s=minutes * 60, seed=seed)
        samples = generate_samples(config)
        source = f"synthetic {pattern} job on {gpus} GPUs, {number(minutes, 6)} min"
    elif scrapes:
        samples, seen = [], set[str]()
        for path in scrapes:
            data = read_bytes_bounded(
                path, what="scrape", error=UsageError, max_bytes=MAX_SCRAPE_BYTES, expect="a dcgm-exporter scrape"
            )
            result = parse_exposition(data.decode("utf-8", errors="replace"))
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
    from gpufleet.telemetry.ranks import RankFinding

    if json_out:
        emit_json({"source": source, "findings": [f.to_dict() for f in findings], "warnings": list(warnings)})
        return
    for line in warnings[:20]:
        console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)
    if not findings:
        console.print(f"{source}: no finding", markup=False)
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
        if isinstance(f, RankFinding) and f.text:  # the rank, its host, what it did and what it cost
            console.print(f.text, markup=False, highlight=False)
    for f in findings:
        console.print(
            f"- {escape(f.rule_id)}: {escape(f.suggestion)} [dim](source: {escape(f.source)})[/]", highlight=False
        )


def diagnose_job_command(
    job_id: Annotated[int, typer.Argument(help="Job id (see `gpufleet jobs`).", min=1, max=2**63 - 1)],
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
    from gpufleet.cli.options import job_store
    from gpufleet.paths import gpufleet_home
    from gpufleet.telemetry import DiagnosisConfig
    from gpufleet.views import job_diagnosis

    with parameters_as_flags({"window_s": "--window", "min_duration_s": "--min-duration"}):
        config = DiagnosisConfig(window_s=window, min_duration_s=min_duration)
    store = job_store(job_id, sync=False)
    try:
        job = store.job(job_id)
    finally:
        store.close()
    try:
        source, findings, notes = job_diagnosis(gpufleet_home(), job, config)
    except Conflict as err:  # its one refusal: a one-rank job that recorded no GPU series has nothing to judge
        _nothing_to_diagnose(f"job {job.id} {job.name}", f"nothing to diagnose: {err}", json_out)
        return
    print_findings(source, findings, notes, json_out)


def _nothing_to_diagnose(source: str, message: str, json_out: bool) -> None:
    """Not an error: the job ran, but without the GPU series a diagnosis reads (exit 0, no finding)."""
    from gpufleet.cli.render import console, emit_json

    if json_out:
        emit_json({"source": source, "findings": [], "warnings": [message]})
    else:
        console.print(message, markup=False, highlight=False, soft_wrap=True)


EXPORTER_MIN_STEP_S, EXPORTER_MAX_STEP_S = 0.01, 3600.0
"""The synthetic exporter's sample interval: from 10 ms (a real dcgm-exporter samples every 1 s or more) to 1 h."""
EXPORTER_MAX_GPUS = 8192
"""The most GPUs (nodes x GPUs per node) one synthetic exporter serves: each holds 600 s of samples in memory."""


def exporter_command(
    pattern: Annotated[str, typer.Option(help="GPU pattern to serve (see `observe diagnose --help`).")] = "healthy",
    gpus: Annotated[int, typer.Option(help="GPUs per node.", min=1)] = 8,
    nodes: Annotated[int, typer.Option(help="Nodes (hostnames node-0, node-1, ...).", min=1)] = 1,
    job: Annotated[str, typer.Option(help="hpc_job label of every GPU; empty for none.")] = "",
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1; 0 picks a free one.", min=0, max=65535)] = 9400,
    port_file: Annotated[Path | None, typer.Option(help="Write the bound port to this file.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic series.", min=0)] = 0,
    step_seconds: Annotated[float, typer.Option(help="Seconds between two synthetic samples.")] = 1.0,
) -> None:
    """Serve a synthetic dcgm-exporter /metrics on 127.0.0.1 until Ctrl-C or SIGTERM."""
    from gpufleet.cli.render import console
    from gpufleet.errors import UsageError
    from gpufleet.telemetry.exporter import DcgmRenderer, ExpositionServer
    from gpufleet.telemetry.gpu import SyntheticSource, derive_seed
    from gpufleet.telemetry.synthetic import MAX_POINTS, PATTERNS, SyntheticJobConfig

    if pattern not in PATTERNS:
        raise UsageError(f"unknown --pattern {pattern!r}; choose one of: {', '.join(PATTERNS)}")
    if not EXPORTER_MIN_STEP_S <= step_seconds <= EXPORTER_MAX_STEP_S:  # also NaN
        raise UsageError(
            f"--step-seconds {step_seconds:g} is out of range: give {EXPORTER_MIN_STEP_S:g} to "
            f"{EXPORTER_MAX_STEP_S:g} seconds"
        )
    if nodes * gpus > EXPORTER_MAX_GPUS:
        raise UsageError(
            f"--nodes {nodes} x --gpus {gpus} is more than {EXPORTER_MAX_GPUS:,} GPUs to serve: "
            "give fewer nodes or GPUs"
        )
    held = nodes * gpus * round(max(step_seconds, 600.0) / step_seconds)
    if held > MAX_POINTS:
        raise UsageError(
            f"--nodes {nodes} x --gpus {gpus} at --step-seconds {step_seconds:g} hold {held:,} GPU-samples, "
            f"over {MAX_POINTS:,}: lengthen the step or serve fewer GPUs"
        )
    if port_file is not None:
        from gpufleet.cli.options import check_path_name

        check_path_name(port_file, "--port-file")
        from gpufleet.outfiles import check_replaceable_file

        check_replaceable_file(port_file, "--port-file")  # written by a rename: never over a device
    sources = [
        SyntheticSource(
            SyntheticJobConfig(
                pattern=pattern,
                gpus=gpus,
                step_s=step_seconds,
                duration_s=max(step_seconds, 600.0),
                seed=derive_seed(seed, node),
                job=job,
                hostname=f"node-{node}",
            )
        )
        for node in range(nodes)
    ]
    renderer = DcgmRenderer()
    stop = threading.Event()

    def read_round() -> bytes:
        return renderer.render(tuple(s for src in sources for s in src.read().samples))

    # A round is read and rendered every step, off the scrape: a scrape sends the last page (at most a step
    # old, as dcgm-exporter's own collection interval makes it), 10,000 series in a few milliseconds.
    page = [read_round()]

    def keep_rendering() -> None:
        while not stop.wait(step_seconds):
            page[0] = read_round()

    threading.Thread(target=keep_rendering, name="gpufleet-dcgm-render", daemon=True).start()
    server = ExpositionServer(lambda: page[0], port=port)
    bound = server.start()
    previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    try:
        console.print(
            f"serving a synthetic dcgm-exporter ({pattern}, {nodes} node(s) x {gpus} GPU(s)) "
            f"on http://127.0.0.1:{bound}/metrics; Ctrl-C to stop",
            highlight=False,
            soft_wrap=True,
        )
        if port_file is not None:  # last: its appearance says the exporter is ready
            from gpufleet.outfiles import write_port_file

            write_port_file(port_file, bound)
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()


WORST_JOBS = 10


@parameters_as_flags({"since": "--since", "out_dir": "--out"})
def report_command(
    since: Annotated[
        str | None, typer.Option(help="Window start: 90m, 24h, 7d, or an ISO date/time (UTC). Default: all history.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    out: Annotated[
        Path | None, typer.Option(help="Also write report.md, report.json and PNG charts into this folder.")
    ] = None,
    rates: Annotated[Path | None, typer.Option(help="Rate card YAML (default: the shipped example card).")] = None,
    slo: Annotated[Path | None, typer.Option(help="SLO targets YAML (default: the built-in targets).")] = None,
    team: Annotated[str | None, typer.Option(help="Only this team's jobs.")] = None,
    fail_on_breach: Annotated[
        bool, typer.Option("--fail-on-breach", help="Exit 1 when an objective with data misses its target.")
    ] = False,
) -> None:
    """Fleet report: SLOs with their error budgets, GPU-hours and money per team, waste per job."""
    from gpufleet.cli.options import check_path_name, existing_store
    from gpufleet.cost.fleet import build_fleet_report, parse_since
    from gpufleet.cost.fleet_page import write_report
    from gpufleet.cost.rates import load_rates
    from gpufleet.outfiles import check_output_dir
    from gpufleet.paths import gpufleet_home
    from gpufleet.telemetry.slo import load_slo

    now = time.time()
    start = parse_since(since, now) if since is not None else None
    card, objectives = load_rates(rates), load_slo(slo)
    if out is not None:
        check_output_dir(check_path_name(out, "--out"), "--out")
    home = gpufleet_home()
    store = existing_store()  # a home without a store has no jobs: reporting on them creates none
    try:
        report = build_fleet_report(
            store,
            home,
            since=start,
            now=now,
            rates=card,
            gpu_samples=_gpu_samples(home),
            slo=objectives,
            team=team,
        )
    finally:
        if store is not None:
            store.close()
    written = write_report(report, out) if out is not None else []
    if json_out:
        from gpufleet.cli.render import emit_json

        emit_json({**report.to_dict(), "files": [str(p) for p in written]})
    else:
        print_report(report, written)
    if fail_on_breach and report.breached:
        raise typer.Exit(1)


def _gpu_samples(home: Path) -> Callable[[int], Sequence[Sample]]:
    """Each job's recorded GPU series, or none where this gpufleet cannot read them."""
    import importlib

    from gpufleet.paths import job_dir

    try:
        reader = getattr(importlib.import_module("gpufleet.telemetry.gpu"), "job_gpu_samples", None)
    except ImportError:
        reader = None
    if reader is None:
        return lambda job_id: []
    return lambda job_id: list(reader(job_dir(home, job_id)))


def print_report(report: FleetReport, written: Sequence[Path] = ()) -> None:
    """The SLO table (met or breached in colour), the team table and the worst jobs by waste."""
    from gpufleet.cli.render import console, gpu_time, money, styled, table
    from gpufleet.cost.fleet import WASTE_PARTS

    window = "all history" if report.since is None else f"since {_minute_utc(report.since)}"
    states = ", ".join(f"{n} {s}" for s, n in report.jobs_by_state.items()) or "no jobs"
    who = f"team {report.team}" if report.team else "all teams"
    console.print(f"[bold]fleet report[/], {window}, {escape(who)}: {escape(states)}", highlight=False)
    rows = []
    for s in report.slos:
        status = styled("[dim]no data[/]" if s.measured is None else "[dim]no target[/]")
        if s.met is not None:
            status = styled("[green]met[/]" if s.met else "[bold red]BREACHED[/]")
        budget = "" if s.error_budget_remaining is None else f"{s.error_budget_remaining:.0%}"
        target = "" if s.target is None else f"{s.comparison} {_value(s.target, s.unit)}"
        rows.append([s.name, _value(s.measured, s.unit), target, status, budget, s.count])
    console.print(table("objectives", ["slo", "measured", "target", "status", "budget left", "based on"], rows))
    cur = report.currency
    rows = [
        [
            t.team,
            t.jobs,
            t.attempts,
            "" if t.failure_rate is None else f"{t.failure_rate:.1%}",
            t.preemptions,
            gpu_time(t.gpu_hours),
            gpu_time(t.lost_to_preemption_gpu_hours),
            money(t.money, cur),
        ]
        for t in report.teams
    ]
    total = report.total
    rows.append([styled("[bold]total[/]"), sum(t.jobs for t in report.teams), total.attempts, "", total.preemptions,
                 gpu_time(total.total_gpu_hours), "", money(total.money, cur)])  # fmt: skip
    head = ["team", "jobs", "attempts", "failure rate", "preempted", "GPU time", "lost", "cost"]
    console.print(table("teams", head, rows))
    job_rows: list[list[object]] = [
        [f"#{j.job_id} {j.name}", j.team, j.state, gpu_time(j.gpu_hours), gpu_time(j.waste_gpu_hours)]
        + [_share(j.breakdown[p], j.gpu_hours) for p in WASTE_PARTS]
        + ["yes" if j.gpu_series else styled("[dim]none[/]")]
        for j in report.jobs[:WORST_JOBS]
    ]
    head = ["job", "team", "state", "GPU time", "waste", *(p.replace("_", " ") for p in WASTE_PARTS), "gpu series"]
    console.print(table(f"worst {min(WORST_JOBS, len(report.jobs))} jobs by waste", head, job_rows))
    if report.unpriced:
        console.print(f"[yellow]no rate for {escape(', '.join(report.unpriced))}: counted in hours, not money[/]")
    if written:
        console.print(f"report: {escape(str(written[0]))}")


def _value(value: float | None, unit: str) -> str:
    from gpufleet.cli.render import duration

    if value is None:
        return ""
    if unit == "ratio":
        return f"{value:.2%}"
    return duration(value) if unit == "s" else f"{value:,.0f} {unit}"


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else ""


def _minute_utc(ts: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


observe_app.command("exporter")(exporter_command)
observe_app.command("report")(report_command)


__all__ = [
    "MAX_SCRAPE_BYTES",
    "WORST_JOBS",
    "OutOpt",
    "dashboard",
    "diagnose_command",
    "diagnose_job_command",
    "exporter_command",
    "observe_app",
    "print_findings",
    "print_report",
    "report_command",
    "rules",
]
