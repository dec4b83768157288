"""``gpufleet profile SPEC``: where a few steps of a job spend their time, and what to try next."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from gpufleet.cli.options import JsonOpt, SpecArg, require_positive
from gpufleet.cli.render import console, emit_json, table
from gpufleet.errors import UsageError, parameters_as_flags
from gpufleet.spec import load_spec


@parameters_as_flags({"steps": "--steps", "warmup": "--warmup"})
def profile_command(
    spec: SpecArg,
    steps: Annotated[int, typer.Option("--steps", help="Steps recorded.")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="Steps run first and not recorded.")] = 2,
    top: Annotated[int, typer.Option("--top", help="Operators listed.")] = 10,
    json_out: JsonOpt = False,
) -> None:
    """Profile a few steps of a job in-process: time shares, top operators, and what to try next."""
    from gpufleet.devtools.profile import check_counts, profile_job

    require_positive("--steps", steps)
    require_positive("--top", top)
    if warmup < 0:
        raise UsageError(f"--warmup {warmup} must be 0 or more")
    check_counts(steps, warmup)  # before the spec is read: the bounds, then the file
    summary = profile_job(load_spec(spec), steps=steps, warmup=warmup, top=top)
    if json_out:
        emit_json(summary.to_dict())
        return
    console.print(
        f"[bold]{escape(summary.job)}[/]: {summary.steps} steps on {summary.device} ({summary.scope}), "
        f"{summary.wall_s * 1e3:.1f} ms wall",
        highlight=False,
    )
    rows = [[k.replace("_", " "), summary.seconds[k] * 1e3, f"{v:.1%}"] for k, v in summary.shares.items()]
    console.print(table("Where the time goes", ["bucket", "ms", "share"], rows))
    console.print(f"  of which unattributed host time: {summary.unattributed_host_s * 1e3:.1f} ms", highlight=False)
    console.print(
        table(
            "Top operators by self time",
            ["operator", "calls", "self ms", "share"],
            [[o.name[:60], o.calls, o.self_ms, f"{o.share:.1%}"] for o in summary.top_ops],
        )
    )
    for note in summary.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    console.print("[bold]Next steps[/]")
    for i, item in enumerate(summary.checklist, 1):
        console.print(f"  {i}. {item}", highlight=False, soft_wrap=True, markup=False)


__all__ = ["profile_command"]
