"""``gpufleet debug determinism|resume-check|spikes``: numerical debugging of a training loop."""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from gpufleet.cli.options import MAX_JOB_ID, JsonOpt, SpecArg, check_path_name, require_positive
from gpufleet.cli.render import console, emit_json, err_console, fmt, table
from gpufleet.errors import GpufleetError, NotFound, UsageError, parameters_as_flags
from gpufleet.fmt import number
from gpufleet.outfiles import check_plot_file
from gpufleet.paths import events_file, gpufleet_home, job_dir, spec_file
from gpufleet.spec import HealthPolicy, load_spec, parse_spec
from gpufleet.yamlio import read_text_bounded

if TYPE_CHECKING:
    from gpufleet.devtools.resumecheck import ResumeReport

debug_app = typer.Typer(
    help="Numerical debugging: determinism across runs and seeds, exact resumption, loss spikes.",
    no_args_is_help=True,
)


SEED_RANGE = "give seeds from 0 to 2**32-1 (what numpy.random.seed and every shipped workload take)"


def _seeds(raw: str | None, spec_args: dict[str, Any]) -> tuple[int, int]:
    """``--seeds A,B``, or the spec's ``args.seed`` and the next; each within ``MAX_SEED`` (exit 2 otherwise)."""
    from gpufleet.workloads import MAX_SEED

    if raw is None:
        first = spec_args.get("seed", 0)
        first = first if isinstance(first, int) and first >= 0 else 0
        if first > MAX_SEED:
            raise UsageError(
                f"args.seed {_shown_number(str(first))} of the spec is out of range: {SEED_RANGE}; "
                "change it, or choose the seeds with --seeds 0,1"
            )
        return first, first + 1 if first < MAX_SEED else first - 1
    parts = [p.strip() for p in raw.split(",")]
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise UsageError(f"--seeds {raw[:60]!r}: give two non-negative integers separated by a comma, e.g. --seeds 0,1")
    for part in parts:
        if len(part) > len(str(MAX_SEED)) or int(part) > MAX_SEED:
            raise UsageError(
                f"--seeds {raw[:60]!r}: seed {_shown_number(part)} is out of range: {SEED_RANGE}, e.g. --seeds 0,1"
            )
    return int(parts[0]), int(parts[1])


def _shown_number(digits: str) -> str:
    return digits if len(digits) <= 30 else f"{digits[:20]}... ({len(digits)} digits)"


@debug_app.command("determinism")
@parameters_as_flags({"steps": "--steps", "seeds": "--seeds"})
def determinism(
    spec: SpecArg,
    steps: Annotated[int, typer.Option("--steps", help="Steps per run.")] = 10,
    seeds: Annotated[
        str | None, typer.Option("--seeds", help="A,B: A is run twice, B once (default: the spec's seed and the next).")
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the loss curves and seed band as a PNG.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run the loop twice with one seed (bitwise comparison) and once with another (spread); exit 1 if they differ."""
    from gpufleet.devtools.debug import check_determinism, plot_losses

    require_positive("--steps", steps)
    if plot is not None:
        check_plot_file(check_path_name(plot, "--plot"), "--plot")
    job = load_spec(spec)
    report = check_determinism(job, steps=steps, seeds=_seeds(seeds, job.args))
    if plot is not None:
        plot_losses(report, plot)
    if json_out:
        emit_json({**report.to_dict(), "plot": str(plot) if plot else None})
    else:
        a, b = report.seeds
        if report.identical:
            console.print(
                f"[green]identical[/]: seed {a} twice, {report.steps} steps: losses and all "
                f"{report.tensors_compared} checkpoint tensors are bitwise equal",
                highlight=False,
                soft_wrap=True,
            )
        else:
            console.print(
                f"[red]differ[/]: seed {a} twice: first loss difference at step {report.first_loss_step}; "
                f"first differing tensor {escape(str(report.first_tensor))} "
                f"(max |diff| {fmt(report.first_tensor_max_abs_diff)}), "
                f"{report.tensors_differing} of {report.tensors_compared} tensors and "
                f"{report.other_entries_differing} other entries differ",
                highlight=False,
                soft_wrap=True,
            )
        final = report.seed_spread[-1] if report.seed_spread else 0.0
        console.print(
            f"seed {a} vs seed {b}: loss spread max {number(report.max_seed_spread, 4)}, "
            f"at the last step {number(final, 4)}",
            highlight=False,
        )
        if plot is not None:
            console.print(f"plot: {plot}", highlight=False, markup=False)
    if not report.identical:
        raise typer.Exit(1)


@debug_app.command("resume-check")
@parameters_as_flags({"at": "--at", "rollback_at": "--rollback-at", "steps": "--steps", "keep": "--keep"})
def resume_check(
    spec: Annotated[
        Path,
        typer.Argument(
            help="JobSpec YAML: a `module:function` or a command entrypoint; one process, or ranks of one node."
        ),
    ],
    at: Annotated[
        int | None, typer.Option("--at", help="Preempt at this step (default: half the uninterrupted run's last step).")
    ] = None,
    rollback_at: Annotated[
        int | None, typer.Option("--rollback-at", help="Also roll back once after this step, replaying its batches.")
    ] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", help="Replace args.steps (module:function only; a command sets its own).")
    ] = None,
    keep: Annotated[
        Path | None, typer.Option("--keep", help="Keep the two job folders here (DIR/jobs/1 and DIR/jobs/2).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run the job uninterrupted and preempted-then-resumed, each attempt a process; exit 1 unless bitwise equal.

    A distributed job runs its ranks here, as the local backend would; its sharded final checkpoints are
    gathered and compared whole, every rank's RNG states included. A job of several nodes is refused.
    """
    from gpufleet.devtools.resumecheck import check_resume

    if keep is not None:
        check_path_name(keep, "--keep")
    report = check_resume(
        load_spec(spec),
        at=at,
        rollback_at=rollback_at,
        steps=steps,
        keep=keep,
        progress=lambda line: err_console.print(f"[dim]{escape(line)}[/]", highlight=False, soft_wrap=True),
    )
    if json_out:
        emit_json(report.to_dict())
    else:
        _print_resume_report(report)
    if not report.exact:
        raise typer.Exit(1)


def _print_resume_report(report: ResumeReport) -> None:
    say = partial(console.print, highlight=False, soft_wrap=True)
    failure = report.failure
    if failure is not None:
        say(
            f"[red]failed[/]: the {failure.run} run's attempt {failure.attempt} exited {failure.exit_code}; "
            f"expected {escape(str(failure.expected))}. Last lines of {escape(str(failure.log))}:"
        )
        for line in failure.tail:
            say(f"  {escape(line)}")
        return
    also = f" and rolled back once after step {report.rollback_at}" if report.rollback_at else ""
    ranks = f" ({report.world_size} ranks)" if report.world_size > 1 else ""
    what = f"{ranks} preempted at step {report.preempt_at} of {report.final_step}{also}, resumed in a new process"
    ignored = ", ".join(report.ignored)
    gathered = (
        f", gathered from the {report.world_size} ranks' shards with every rank's RNG states,"
        if report.world_size > 1
        else ""
    )
    if report.exact:
        rng = report.tensors_differing  # with warnings: RNG states, the only tensors that differ
        compared = report.tensors_compared
        tensors = f"{compared - rng} of {compared} checkpoint tensors" if rng else f"all {compared} checkpoint tensors"
        but = " (all but the RNG states below)" if report.warnings else ""
        say(
            f"[green]exact[/]: {escape(report.job)}{what}: all {report.steps_compared} step losses and {tensors}"
            f"{gathered}{but} are bitwise equal to the uninterrupted run's (ignored: {escape(ignored)})"
        )
        for warning in report.warnings:
            say(f"[yellow]warning:[/] {escape(warning)}")
    else:
        say(f"[red]differs[/]: {escape(report.job)}{what}:")
        if report.first_loss_step is not None:
            old, new = report.first_loss or (None, None)
            say(
                f"  first loss difference at step {report.first_loss_step}: {_loss(old)} uninterrupted, "
                f"{_loss(new)} resumed"
            )
        if report.first_difference is not None:
            say(
                f"  first differing tensor: {escape(report.first_difference)}; "
                f"{report.tensors_differing} of {report.tensors_compared} tensors differ"
            )
        if report.other_entries:
            more = f" and {len(report.other_entries) - 3} more" if len(report.other_entries) > 3 else ""
            say(f"  other entries that differ: {escape(', '.join(report.other_entries[:3]))}{more}")
        if report.first_loss_step is None and report.first_tensor is None and not report.other_entries:
            say("  the two runs logged different steps")
        say(f"  (ignored: {escape(ignored)})")
        for hint in report.hints:
            say(f"[yellow]hint:[/] {escape(hint)}")
    if report.folder:
        folder = escape(str(report.folder))
        say(f"job folders: {folder}/jobs/1 (uninterrupted), {folder}/jobs/2 (preempted)")


def _loss(value: float | None) -> str:
    return "not logged" if value is None else repr(value)


def _resolve_run(run: str) -> tuple[Path, Path | None]:
    """The losses' source and, when there is one, the job's spec.json (for its health policy)."""
    if run.isascii() and run.isdigit():
        if len(run) > len(str(MAX_JOB_ID)) or int(run) > MAX_JOB_ID:
            shown = run if len(run) <= 30 else f"{run[:20]}... ({len(run)} digits)"
            raise UsageError(f"job id {shown} is out of range: job ids are at most 2**63-1 (see `gpufleet jobs`)")
        home, job_id = gpufleet_home(), int(run)
        folder = job_dir(home, job_id)
        if not events_file(home, job_id).is_file():
            raise NotFound(f"job {run} has no events under {folder}: check the id with `gpufleet jobs`")
        return events_file(home, job_id), spec_file(home, job_id)
    path = check_path_name(Path(run), "RUN")
    if not path.exists():
        raise UsageError(f"{run!r} is neither a job id nor an existing job folder, events.jsonl or CSV")
    spec = (path if path.is_dir() else path.parent) / "spec.json"
    return path, spec


def _policy(spec_path: Path | None, zscore: float | None, window: int | None) -> HealthPolicy:
    base = HealthPolicy()
    if spec_path is not None and spec_path.is_file():
        with contextlib.suppress(ValueError, GpufleetError):  # an unreadable spec next to the log: use defaults
            text = read_text_bounded(spec_path, what="spec", error=UsageError)
            base = parse_spec(json.loads(text), source=str(spec_path)).health
    if zscore is not None and not (zscore > 0 and math.isfinite(zscore)):
        raise UsageError(f"--zscore {zscore} must be a positive number (the runtime's default is 8)")
    most = HealthPolicy.model_fields["window"].metadata
    top = next((int(m.le) for m in most if getattr(m, "le", None) is not None), 100_000)
    if window is not None and not 5 <= window <= top:
        raise UsageError(f"--window {window} must be from 5 to {top:,} losses")
    window = window or base.window
    try:
        return HealthPolicy(
            spike_zscore=zscore or base.spike_zscore or 8.0, window=window, min_history=min(base.min_history, window)
        )
    except ValueError as err:  # pydantic's ValidationError: a bound this check does not know of
        raise UsageError(f"--zscore {zscore} / --window {window}: {str(err).splitlines()[-1].strip()}") from None


@debug_app.command("spikes")
def spikes(
    run: Annotated[str, typer.Argument(help="Job id, job folder, events.jsonl, or a CSV with step,loss columns.")],
    zscore: Annotated[
        float | None, typer.Option("--zscore", help="Robust z-score threshold (default: the job's, or 8).")
    ] = None,
    window: Annotated[
        int | None, typer.Option("--window", help="Healthy losses in the window (default: the job's, or 50).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Find loss spikes and NaN/inf losses in a logged run with the runtime's own detector."""
    from gpufleet.devtools.debug import detect_spikes, read_losses

    source, spec_path = _resolve_run(run)
    policy = _policy(spec_path, zscore, window)
    points = read_losses(source)
    found = detect_spikes(points, policy)
    logged = sum(p.loss is not None for p in points)
    if json_out:
        rows = [
            {**asdict(s), "loss": s.loss if s.loss is None or math.isfinite(s.loss) else str(s.loss)} for s in found
        ]
        emit_json({"source": str(source), "policy": policy.model_dump(), "losses": logged, "spikes": rows})
        return
    if found:
        console.print(
            table(
                None,
                ["step", "loss", "z-score", "reason", "found by"],
                [[s.step, s.loss, s.zscore, s.reason, s.source] for s in found],
            )
        )
    by_runtime = sum(s.source == "runtime" for s in found)
    console.print(
        f"{len(found)} unhealthy ({by_runtime} logged by the runtime) of {logged} logged losses "
        f"(z > {policy.spike_zscore:g} against up to {policy.window} healthy losses, judged after "
        f"{policy.min_history}) in {escape(str(source))}",
        highlight=False,
        soft_wrap=True,
    )


__all__ = ["debug_app"]
