"""``gpufleet sweep ...``: hyper-parameter sweeps whose trials are gpufleet jobs (docs/sweeps.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape

from gpufleet.cli.options import JsonOpt
from gpufleet.cli.render import console, emit_json, err_console, fmt, table
from gpufleet.errors import Conflict, UsageError
from gpufleet.fmt import gpu_time, money, number
from gpufleet.outfiles import check_output_file, check_plot_file
from gpufleet.paths import gpufleet_home

sweep_app = typer.Typer(help="Hyper-parameter sweeps: each trial is a preemptible fleet job.", no_args_is_help=True)

StorageOpt = Annotated[
    str | None, typer.Option("--storage", help="The sweep's Optuna RDB URL, when it is not the default SQLite file.")
]


def _value(value: Any) -> str:
    return "-" if value is None else fmt(value) if isinstance(value, float) else escape(str(value))


def _params(params: dict[str, Any]) -> str:
    """A trial's parameters as people read them: ``lr=0.0265 batch=32``."""
    return " ".join(f"{escape(str(name))}={_value(value)}" for name, value in params.items())


def _print(summary: dict[str, Any]) -> None:
    from gpufleet.cost.rates import load_rates

    currency = load_rates().currency
    rows = summary["rows"]
    params = list(dict.fromkeys(k for r in rows for k in r["params"]))
    metric = summary["metric"] or "objective"
    body = []
    for r in rows:
        shown = r["value"] if r["value"] is not None else r["last_value"]
        note = f"at step {r['pruned_at']}" if r["state"] == "pruned" else (r["reason"] or "")
        body.append(
            [str(r["trial"]), str(r["job"] or "-"), r["state"]]
            + [_value(r["params"].get(p)) for p in params]
            + [_value(shown), gpu_time(r["gpu_hours"]), money(r["money"], currency), escape(note[:80])]
        )
    title = f"sweep {summary['sweep']} ({summary['direction']} {metric})"
    console.print(table(title, ["trial", "job", "state", *params, metric, "GPU time", "cost", "note"], body))
    best = summary["best"]
    console.print(
        f"{summary['finished']} finished, {summary['pruned']} pruned, {summary['failed']} failed, "
        f"{summary['running']} running; {gpu_time(summary['gpu_hours'])}, {money(summary['money'], currency)} in all"
        + (f"; best: trial {best['trial']} {metric} {fmt(best['value'])} {_params(best['params'])}" if best else ""),
        highlight=False,
    )


def _write_out(out: Path, text: str) -> None:
    """Write ``text`` to ``--out`` whole (a temporary file renamed over it), or refuse in one line."""
    from gpufleet.outfiles import replace_output

    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write --out {str(out)!r}: {err.strerror}") from None
    replace_output(tmp, out, "--out")


@sweep_app.command("run")
def run_command(
    file: Annotated[Path, typer.Argument(help="A sweep file (docs/sweeps.md); examples/sweep.yaml.")],
    backend: Annotated[str, typer.Option(help="Where the trials run: local, slurm or ray.")] = "local",
    poll: Annotated[float, typer.Option(help="Seconds between looks at the trials.", min=0.05, max=60)] = 1.0,
    once: Annotated[
        bool, typer.Option("--once", help="One pass (follow the trials, launch what fits) and exit: for cron.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run a sweep to its budget; started again after a crash, it goes on with the same study.

    Exit 1 when it stopped because max_failures trials failed (each one's reason is in the table).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gpufleet.sweeps.driver import SweepDriver
    from gpufleet.sweeps.report import summary, trial_rows
    from gpufleet.sweeps.spec import load_sweep

    home = gpufleet_home()
    sweep, base = load_sweep(file)
    driver = SweepDriver(home, sweep, base, backend, poll_s=poll)  # a bad backend or storage: refused here
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, disable=json_out, transient=False) as bar:
        task = bar.add_task(f"sweep {sweep.name}", total=None)

        def tick(driver: SweepDriver, p: Any) -> None:
            best = "-" if p.best is None else f"{number(p.best, 4)}"
            bar.update(
                task,
                total=driver.target(),
                completed=p.finished + p.pruned,
                description=f"sweep {sweep.name}: {p.running} running, {p.pruned} pruned, "
                f"{p.failed} failed, best {best}",
            )

        driver.on_tick = tick
        progress = driver.run(once=once)
    result = summary(driver.study, trial_rows(driver.study, home))
    result["stop"] = progress.stop
    failed = progress.failed >= sweep.max_failures
    if json_out:
        emit_json(result)
    else:
        _print(result)
        console.print(f"stopped: {escape(progress.stop or 'done')}", highlight=False)
    if failed:  # the trials fail for a reason the sweep cannot fix: each row says it
        raise typer.Exit(1)


@sweep_app.command("show")
def show_command(
    name: Annotated[str, typer.Argument(help="The sweep's name.")],
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG: objective by trial and against each parameter.")
    ] = None,
    storage: StorageOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The trials: parameters, objective, state, GPU-hours and money; best so far."""
    from gpufleet.sweeps.report import load_sweep_study, plot_sweep, summary, trial_rows

    if plot is not None:
        check_plot_file(plot, "--plot")
    home = gpufleet_home()
    study = load_sweep_study(home, name, storage)
    result = summary(study, trial_rows(study, home))
    if plot is not None:
        result["plot"] = plot_sweep(study, result["rows"], plot)
    if json_out:
        emit_json(result)
        return
    _print(result)
    if plot is not None:
        console.print(f"plot: {escape(str(plot))}", highlight=False)


@sweep_app.command("best")
def best_command(
    name: Annotated[str, typer.Argument(help="The sweep's name.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the JobSpec (YAML).")],
    storage: StorageOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write the best trial as a JobSpec, to run at full length (gpufleet submit OUT)."""
    from gpufleet.sweeps.report import best_spec, load_sweep_study

    check_output_file(out, "--out")
    spec = best_spec(load_sweep_study(gpufleet_home(), name, storage))
    data = spec.model_dump(mode="json", exclude_defaults=True)
    _write_out(out, yaml.safe_dump(data, sort_keys=False))
    if json_out:
        emit_json({"out": str(out), "spec": data})
    else:
        console.print(
            f"best trial as a JobSpec: {escape(str(out))} (gpufleet submit {escape(str(out))})", highlight=False
        )


@sweep_app.command("note")
def note_command(
    name: Annotated[str, typer.Argument(help="The sweep's name.")],
    ranks: Annotated[str, typer.Option(help="The rank counts to measure the best trial at.")] = "1,2,4",
    steps: Annotated[int, typer.Option(help="Steps of each measurement run.", min=5, max=1_000_000)] = 200,
    gpus: Annotated[int, typer.Option(help="The fleet size the note plans for.", min=1, max=1_000_000)] = 64,
    backend: Annotated[str, typer.Option(help="Where the measurement jobs run: local, slurm or ray.")] = "local",
    out: Annotated[Path | None, typer.Option("--out", help="Write the note (Markdown) here.")] = None,
    storage: StorageOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The note on going from one GPU to many: the best trial measured at 1, 2, 4 ranks, and what to do with N GPUs."""
    from gpufleet.sweeps.note import finished_trials, measure, note_figures, render, sweep_price
    from gpufleet.sweeps.report import load_sweep_study

    counts = []
    for part in ranks.split(","):
        if not (part.strip().isdigit() and 1 <= int(part) <= 64):
            raise UsageError(f"invalid --ranks {ranks[:40]!r}: give rank counts from 1 to 64, e.g. 1,2,4")
        counts.append(int(part))
    counts = sorted(set(counts) | {1})
    if out is not None:
        check_output_file(out, "--out")
    home = gpufleet_home()
    study = load_sweep_study(home, name, storage)
    if not finished_trials(study):
        raise Conflict(f"sweep {name!r} has no finished trial yet: the note measures the best one")
    with err_console.status("measuring the best trial") as status:
        runs = measure(home, study, counts, steps, backend, on_wait=lambda what: status.update(f"measuring: {what}"))
    figures = note_figures(study, home, runs, sweep_price(study))
    text = render(figures, gpus)
    if out is not None:
        _write_out(out, text)
    if json_out:
        emit_json({**figures, "gpus": gpus, "out": str(out) if out else None})
    elif out is None:
        typer.echo(text, nl=False)
    else:
        console.print(f"scaling note: {escape(str(out))}", highlight=False)


__all__ = ["best_command", "note_command", "run_command", "show_command", "sweep_app"]
