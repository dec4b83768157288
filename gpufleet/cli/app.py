"""The ``gpufleet`` command line: parse, call the library, render. Nothing else lives here."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from gpufleet.cli import jobs
from gpufleet.cli.ckpt import ckpt_app
from gpufleet.cli.debug import debug_app
from gpufleet.cli.demo import demo_command
from gpufleet.cli.estimate import estimate_app
from gpufleet.cli.export import export_app
from gpufleet.cli.observe import diagnose_job_command, observe_app
from gpufleet.cli.place import place_command
from gpufleet.cli.profile import profile_command
from gpufleet.cli.quality import drift_command, embedding_lab_command, quality_app, seasonal_lab_command
from gpufleet.cli.registry import registry_app
from gpufleet.cli.render import err_console
from gpufleet.cli.simulate import simulate_command
from gpufleet.cli.slurm import slurm_app
from gpufleet.cli.trace import trace_command
from gpufleet.errors import GpufleetError

app = typer.Typer(
    name="gpufleet",
    help="Run training jobs that survive preemption, and see what they cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Jobs: cli/jobs.py
for command in (jobs.submit, jobs.jobs, jobs.show, jobs.logs, jobs.preempt, jobs.cancel, jobs.resize, jobs.cost):
    app.command()(command)
app.add_typer(ckpt_app, name="ckpt")
app.command("demo")(demo_command)
# Observing and debugging
app.add_typer(observe_app, name="observe")
app.command("diagnose")(diagnose_job_command)
app.command("trace")(trace_command)
app.command("profile")(profile_command)
app.add_typer(debug_app, name="debug")
# Planning and estimating
app.command("place")(place_command)
app.command("simulate")(simulate_command)
app.add_typer(estimate_app, name="estimate")
app.add_typer(export_app, name="export")
app.add_typer(slurm_app, name="slurm")
# Model quality
app.command("drift")(drift_command)
quality_app.command("lab-seasonal")(seasonal_lab_command)
quality_app.command("lab-embeddings")(embedding_lab_command)
app.add_typer(quality_app, name="quality")
app.add_typer(registry_app, name="registry")


def main() -> None:
    try:
        app(standalone_mode=True)
    except GpufleetError as err:
        err_console.print(f"[red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        sys.exit(err.exit_code)


__all__ = ["app", "main"]
