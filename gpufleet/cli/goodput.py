"""``gpufleet goodput``: the effective training time of one synchronous job of N GPUs, and what each policy buys.

Parse, call :mod:`gpufleet.estimate.goodput`, render. Two engines: ``analytic`` (Daly's closed form,
generalised to a failure mix) and ``montecarlo`` (seeded, vectorised over trials; also non-exponential
failures). ``--plot-interval FILE.png`` and ``--plot-fleet FILE.png`` draw the effective fraction against
the checkpoint interval and against the fleet size (matplotlib, Agg backend). A job that cannot make
progress (its effective fraction would be under 1 %, or its save outlasts its MTBF) exits 2 with one
line naming the flags, instead of a number.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from gpufleet.cli.options import JsonOpt, check_path_name
from gpufleet.cli.render import console, emit_json, table
from gpufleet.errors import UsageError, parameters_as_flags
from gpufleet.fmt import number
from gpufleet.outfiles import check_plot_file
from gpufleet.plotting import figure, save_figure

if TYPE_CHECKING:
    from gpufleet.estimate.goodput import Engine, Goodput, Policy, PolicyKnobs, Scenario

FLEET_SIZES = (1_000, 100_000)
"""The GPU counts ``--plot-fleet`` spans."""

_PARAMS = (
    "gpus",
    "gpu_mtbf_hours",
    "work_hours",
    "save_seconds",
    "restart_seconds",
    "interval_seconds",
    "restore_seconds",
    "reschedule_seconds",
    "planned_per_day",
    "signal_save_seconds",
    "spares",
    "gpus_per_node",
    "spare_repair_hours",
    "spare_swap_seconds",
    "weibull_shape",
    "trials",
    "seed",
    "engine",
    "async_stall_seconds",
    "fast_restore_seconds",
    "policy_spares",
)
FLAGS = {p: "--" + p.replace("_", "-") for p in _PARAMS}
"""Parameter of :mod:`gpufleet.estimate.goodput` -> the flag this command takes it as."""


def _interval(text: str) -> float | None:
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--interval-seconds {text!r} is not a number of seconds: give one, or auto") from None


def _pct(x: float) -> str:
    return "" if not math.isfinite(x) else f"{x:.2%}"


def _h(x: float) -> str:
    return f"{x:,.1f} h"


def _mtbf(x: float) -> str:
    return f"{number(x)} h" if x < 100 else f"{x:,.0f} h"


def _secs(x: float) -> str:
    if x < 120:
        return f"{x:,.0f} s"
    if x < 7200:
        return f"{x / 60:,.1f} min"
    return f"{x / 3600:,.2f} h"


@parameters_as_flags(FLAGS)
def goodput(
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs of the synchronous job (up to 10,000,000).")],
    work_hours: Annotated[float, typer.Option("--work-hours", help="Hours of compute the job needs, T_s.")],
    save_seconds: Annotated[float, typer.Option("--save-seconds", help="Seconds a checkpoint stalls training.")],
    restart_seconds: Annotated[
        float, typer.Option("--restart-seconds", help="Seconds to relaunch after any interruption (NCCL init etc.).")
    ],
    gpu_mtbf_hours: Annotated[
        float | None,
        typer.Option("--gpu-mtbf-hours", help="Hours between unexpected interruptions per GPU (default: the mix's)."),
    ] = None,
    interval: Annotated[
        str,
        typer.Option(
            "--interval-seconds", "--interval", help="Seconds of compute between checkpoints, or auto (Daly's optimum)."
        ),
    ] = "auto",
    restore_seconds: Annotated[float, typer.Option("--restore-seconds", help="Seconds to load a checkpoint.")] = 0.0,
    reschedule_seconds: Annotated[
        float, typer.Option("--reschedule-seconds", help="Extra seconds when a cause needs a new node.")
    ] = 0.0,
    planned_per_day: Annotated[
        float | None,
        typer.Option("--planned-per-day", help="Planned interruptions of the job per day (default: the mix's, or 0)."),
    ] = None,
    mix: Annotated[
        str | None,
        typer.Option("--mix", help="Failure mix: llama3 (Llama 3 paper, Table 5) or a YAML file (docs/goodput.md)."),
    ] = None,
    save_on_signal: Annotated[
        bool, typer.Option("--save-on-signal", help="Planned interruptions save at the signal and lose no work.")
    ] = False,
    signal_save_seconds: Annotated[
        float | None,
        typer.Option("--signal-save-seconds", help="Seconds of the save at a signal (default --save-seconds)."),
    ] = None,
    spares: Annotated[int, typer.Option("--spares", help="Hot spare nodes.")] = 0,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node (a spare is a node).")] = 8,
    spare_repair_hours: Annotated[
        float, typer.Option("--spare-repair-hours", help="Hours before a failed node is a spare again.")
    ] = 48.0,
    spare_swap_seconds: Annotated[
        float, typer.Option("--spare-swap-seconds", help="Seconds to swap a hot spare in (instead of rescheduling).")
    ] = 0.0,
    weibull_shape: Annotated[
        float, typer.Option("--weibull-shape", help="Weibull shape of the times between interruptions (montecarlo).")
    ] = 1.0,
    engine: Annotated[str, typer.Option("--engine", help="analytic (Daly's closed form) or montecarlo.")] = "analytic",
    trials: Annotated[int, typer.Option("--trials", help="Monte Carlo runs (up to 100,000).")] = 1000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the Monte Carlo.")] = 0,
    async_stall_seconds: Annotated[
        float | None,
        typer.Option("--async-stall-seconds", help="Policy 'async checkpoints': the stall (default 10% of the save)."),
    ] = None,
    fast_restore_seconds: Annotated[
        float | None,
        typer.Option("--fast-restore-seconds", help="Policy 'fast restore': the restore (default 10% of it)."),
    ] = None,
    policy_spares: Annotated[
        int | None,
        typer.Option("--policy-spares", help="Policy 'hot spares': spare nodes (default: free 99% of the time)."),
    ] = None,
    show_policies: Annotated[
        bool, typer.Option("--policies/--no-policies", help="Also evaluate each policy alone and all together.")
    ] = True,
    plot_interval: Annotated[
        Path | None, typer.Option("--plot-interval", help="Write a PNG of the effective fraction against the interval.")
    ] = None,
    plot_fleet: Annotated[
        Path | None, typer.Option("--plot-fleet", help="Write a PNG of the effective fraction against 1k-100k GPUs.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Effective training time of one synchronous job under failures: Daly's closed form or a Monte Carlo."""
    from gpufleet.estimate import goodput as model

    if engine not in model.ENGINES:
        raise UsageError(f"--engine {engine!r}: use analytic or montecarlo")
    for flag, plot in (("--plot-interval", plot_interval), ("--plot-fleet", plot_fleet)):
        if plot is not None:
            check_plot_file(check_path_name(plot, flag), flag)
    chosen: Engine = "analytic" if engine == "analytic" else "montecarlo"
    if chosen == "analytic" and weibull_shape != 1.0:
        raise UsageError(f"--weibull-shape {weibull_shape:g} needs --engine montecarlo: the closed form is exponential")
    failure_mix = model.SIMPLE if mix is None else model.resolve_mix(mix)
    if gpu_mtbf_hours is None:
        gpu_mtbf_hours = failure_mix.gpu_mtbf_hours()
        if gpu_mtbf_hours is None:
            raise UsageError("give --gpu-mtbf-hours (or a --mix with reference_gpus and reference_hours)")
    if planned_per_day is None:
        planned_per_day = failure_mix.planned_per_day() or 0.0
    scenario = model.Scenario(
        gpus=gpus,
        gpu_mtbf_hours=gpu_mtbf_hours,
        work_hours=work_hours,
        save_seconds=save_seconds,
        restart_seconds=restart_seconds,
        interval_seconds=_interval(interval),
        restore_seconds=restore_seconds,
        reschedule_seconds=reschedule_seconds,
        planned_per_day=planned_per_day,
        save_on_signal=save_on_signal,
        signal_save_seconds=signal_save_seconds,
        mix=failure_mix,
        spares=spares,
        gpus_per_node=gpus_per_node,
        spare_repair_hours=spare_repair_hours,
        spare_swap_seconds=spare_swap_seconds,
        weibull_shape=weibull_shape,
    )
    knobs = model.PolicyKnobs(
        async_stall_seconds=async_stall_seconds, fast_restore_seconds=fast_restore_seconds, spares=policy_spares
    )
    result = model.evaluate(scenario, chosen, trials=trials, seed=seed)
    closed = model.analytic(scenario) if chosen == "montecarlo" and weibull_shape == 1.0 else None
    pols: list[tuple[Policy, Goodput]] = []
    if show_policies:
        pols = [
            (p, model.evaluate(p.scenario, chosen, trials=trials, seed=seed)) for p in model.policies(scenario, knobs)
        ]
    files: dict[str, str] = {}
    if plot_interval is not None:
        files["interval"] = _plot_interval(plot_interval, scenario, knobs, chosen, trials, seed)
    if plot_fleet is not None:
        files["fleet"] = _plot_fleet(plot_fleet, scenario, knobs, chosen, trials, seed)
    lossy = scenario.lossy_mtbf_seconds
    report: dict[str, Any] = {
        **result.to_dict(),
        "inputs": {
            "gpus": gpus,
            "gpu_mtbf_hours": gpu_mtbf_hours,
            "work_hours": work_hours,
            "save_seconds": save_seconds,
            "restart_seconds": restart_seconds,
            "restore_seconds": restore_seconds,
            "reschedule_seconds": reschedule_seconds,
            "interval": interval,
            "planned_per_day": planned_per_day,
            "save_on_signal": save_on_signal,
            "signal_save_seconds": scenario.signal_save,
            "spares": spares,
            "gpus_per_node": gpus_per_node,
            "spare_repair_hours": spare_repair_hours,
            "spare_swap_seconds": spare_swap_seconds,
            "weibull_shape": weibull_shape,
            "engine": chosen,
            "trials": trials if chosen == "montecarlo" else None,
            "seed": seed if chosen == "montecarlo" else None,
        },
        "mix": {"name": failure_mix.name, "source": failure_mix.source},
        "unexpected_mtbf_hours": 1.0 / scenario.unexpected_per_second / 3600.0,
        "lossy_mtbf_hours": lossy / 3600.0,
        "young_interval_seconds": model.young_interval(save_seconds, lossy) if math.isfinite(lossy) else None,
        "daly_interval_seconds": model.daly_interval(save_seconds, lossy) if math.isfinite(lossy) else None,
        "analytic": None
        if closed is None
        else {
            "wall_hours": closed.wall_hours,
            "effective_fraction": closed.effective_fraction,
            "montecarlo_minus_analytic_wall": result.wall_hours / closed.wall_hours - 1.0,
        },
        "policies": [_policy_dict(p, g, pols[0][1]) for p, g in pols],
        "files": files,
    }
    if json_out:
        emit_json(report)
        return
    _print(report, result, closed, pols)


def _policy_dict(p: Policy, g: Goodput, given: Goodput) -> dict[str, Any]:
    s = p.scenario
    return {
        "name": p.name,
        "change": p.change,
        "interval_seconds": g.interval_seconds,
        "save_seconds": s.save_seconds,
        "restore_seconds": s.restore_seconds,
        "save_on_signal": s.save_on_signal,
        "spares": s.spares,
        "spare_availability": g.spare_availability,
        "effective_fraction": g.effective_fraction,
        "gain_points": 100.0 * (g.effective_fraction - given.effective_fraction),
        "wall_hours": g.wall_hours,
        "lost_gpu_hours": g.lost_gpu_hours,
        "spare_gpu_hours": g.spare_gpu_hours,
        "loss_hours": {"saves": g.save_hours, "rework": g.rework_hours, "restarts": g.restart_hours},
    }


def _print(report: dict[str, Any], g: Goodput, closed: Goodput | None, pols: list[tuple[Policy, Goodput]]) -> None:
    inputs = report["inputs"]
    title = f"goodput: {g.gpus:,} GPUs, {g.work_hours:,g} h of work, mix {report['mix']['name']}, {g.engine} engine" + (
        f" ({g.spread.trials:,} trials, seed {g.spread.seed})" if g.spread is not None else ""
    )
    interval_how = "Daly's optimum" if g.interval_source == "daly" else "given"
    if report["young_interval_seconds"] is not None:
        interval_how += (
            f"; Young {_secs(report['young_interval_seconds'])}, Daly {_secs(report['daly_interval_seconds'])}"
        )
    rows: list[list[object]] = [
        [
            "job MTBF",
            _mtbf(g.mtbf_hours),
            f"every interruption; {_mtbf(report['lossy_mtbf_hours'])} for those losing work",
        ],
        ["interval", _secs(g.interval_seconds), interval_how],
        [
            "save stall",
            _secs(g.save_seconds),
            "per checkpoint" + (", saves at a signal" if inputs["save_on_signal"] else ""),
        ],
        ["interruptions", f"{g.interruptions:,.1f}", "expected over the run"],
        ["wall time", _h(g.wall_hours), f"{g.wall_hours / 24:,.1f} days"],
        ["effective fraction", _pct(g.effective_fraction), "work / wall time"],
        ["lost GPU-hours", f"{g.lost_gpu_hours:,.0f}", f"{g.gpus:,} GPUs x (wall - work)"],
    ]
    if g.spares:
        rows.append(
            [
                "spares",
                f"{g.spares} nodes",
                f"free {g.spare_availability:.1%} of the time, {g.spare_gpu_hours:,.0f} GPU-h idle",
            ]
        )
    if g.spread is not None:
        s = g.spread
        rows.append(
            ["trials p5-p95", f"{_pct(s.effective_p05)} - {_pct(s.effective_p95)}", f"wall std {_h(s.wall_hours_std)}"]
        )
    if closed is not None:
        rows.append(
            [
                "analytic",
                _pct(closed.effective_fraction),
                f"Monte Carlo wall {report['analytic']['montecarlo_minus_analytic_wall']:+.3%}",
            ]
        )
    console.print(f"[bold]{escape(title)}[/]", highlight=False)
    console.print(table(None, ["", "value", "note"], rows))
    wall = g.wall_hours
    where = [
        ["training", _h(g.work_hours), _pct(g.work_hours / wall), f"{g.gpus * g.work_hours:,.0f}"],
        ["checkpoint saves", _h(g.save_hours), _pct(g.save_hours / wall), f"{g.gpus * g.save_hours:,.0f}"],
        [
            "rework (lost since last checkpoint)",
            _h(g.rework_hours),
            _pct(g.rework_hours / wall),
            f"{g.gpus * g.rework_hours:,.0f}",
        ],
        [
            "restart, restore, reschedule",
            _h(g.restart_hours),
            _pct(g.restart_hours / wall),
            f"{g.gpus * g.restart_hours:,.0f}",
        ],
    ]
    console.print(table("where the wall time goes", ["", "hours", "share", "GPU-hours"], where))
    causes = sorted(g.causes, key=lambda c: -(c.rework_hours + c.restart_hours + c.signal_save_hours))
    cause_rows = [
        [
            c.name,
            f"{number(c.rate_per_day)}",
            f"{c.interruptions:,.1f}",
            _secs(c.mean_restart_seconds),
            f"{c.rework_hours:,.1f}",
            f"{c.restart_hours:,.1f}",
            f"{c.signal_save_hours:,.1f}" if c.save_on_signal else "",
        ]
        for c in causes
    ]
    head = ["cause", "per day", "interruptions", "recovery", "rework h", "restart h", "signal save h"]
    console.print(table("loss by cause", head, cause_rows))
    if pols:
        prow = [
            [
                d["name"],
                d["change"],
                _secs(d["interval_seconds"]),
                _pct(d["effective_fraction"]),
                f"{d['gain_points']:+.2f}",
                _h(d["wall_hours"]),
                f"{d['lost_gpu_hours']:,.0f}",
                f"{d['spare_gpu_hours']:,.0f}" if d["spares"] else "",
            ]
            for d in report["policies"]
        ]
        head = ["policy", "change", "interval", "effective", "gain (pts)", "wall", "lost GPU-h", "spare GPU-h"]
        console.print(table("policies (each alone, then all together)", head, prow))
    for path in report["files"].values():
        console.print(f"wrote {path}")


# --- plots --------------------------------------------------------------------------------------------------------


def _plot_interval(path: Path, s: Scenario, knobs: PolicyKnobs, engine: Engine, trials: int, seed: int) -> str:
    import numpy as np

    from gpufleet.estimate import goodput as model

    lossy = s.lossy_mtbf_seconds
    work = s.work_hours * 3600.0
    daly = model.daly_interval(s.save_seconds, lossy) if math.isfinite(lossy) else work
    given, _ = s.interval()
    lo, hi = min(daly, given) / 20, min(max(daly, given) * 20, work)
    taus = np.geomspace(lo, max(hi, lo * 1.01), 80)
    fig, ax = figure()
    pols = {p.name: p.scenario for p in model.policies(s, knobs)}
    for name in ("as given", "async checkpoints", "all of the above"):
        ys = model.interval_sweep(pols[name], [float(t) for t in taus])
        ax.plot(taus / 60, [100 * y for y in ys], label=f"{name} (analytic)")
    if engine == "montecarlo":
        points = np.geomspace(lo, max(hi, lo * 1.01), 7)
        fractions = model.monte_carlo_sweep(s, intervals=[float(t) for t in points], trials=trials, seed=seed)
        ys = [100 * y for y in fractions]
        ax.plot(points / 60, ys, "o", color="black", label=f"as given (Monte Carlo, {trials} trials)")
    here = model.analytic(s)
    ax.plot(
        [here.interval_seconds / 60], [100 * here.effective_fraction], "s", color="tab:blue", label="the interval used"
    )
    if math.isfinite(lossy):
        stall = f"{number(s.save_seconds, 6)} s stall"
        ax.axvline(model.young_interval(s.save_seconds, lossy) / 60, color="grey", ls=":", label=f"Young ({stall})")
        ax.axvline(daly / 60, color="grey", ls="--", label=f"Daly ({stall})")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes of compute)")
    ax.set_ylabel("effective training time (%)")
    ax.set_title(
        f"{s.gpus:,} GPUs, save stall {number(s.save_seconds, 6)} s, job MTBF {number(s.mtbf_seconds / 3600)} h"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _plot_fleet(path: Path, s: Scenario, knobs: PolicyKnobs, engine: Engine, trials: int, seed: int) -> str:
    import numpy as np

    from gpufleet.estimate import goodput as model

    sizes = [round(n) for n in np.geomspace(*FLEET_SIZES, 40)]
    curves = model.fleet_sweep(s, sizes, knobs)
    fig, ax = figure()
    for name, ys in curves.items():
        style: dict[str, Any] = {"lw": 1.2}
        if name == "as given":
            style = {"lw": 2.5, "color": "black"}
        elif name == "all of the above":
            style = {"lw": 2.5, "color": "black", "ls": "--"}
        ax.plot(sizes, [100 * y for y in ys], label=name, **style)
    if engine == "montecarlo":
        points = [round(n) for n in np.geomspace(*FLEET_SIZES, 6)]
        ys = [100 * y for y in model.monte_carlo_sweep(s, sizes=points, trials=trials, seed=seed)]
        ax.plot(points, ys, "o", color="black", label=f"as given (Monte Carlo, {trials} trials)")
    for level in (90, 95):
        ax.axhline(level, color="grey", ls=":", lw=1)
    ax.axvline(s.gpus, color="grey", ls="--", lw=1, label=f"{s.gpus:,} GPUs")
    ax.set_xscale("log")
    ax.set_xlabel("GPUs in the job")
    ax.set_ylabel("effective training time (%)")
    ax.set_title(f"per-GPU MTBF {s.gpu_mtbf_hours:,.0f} h, {number(s.planned_per_day)} planned/day, mix {s.mix.name}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


__all__ = ["FLAGS", "FLEET_SIZES", "goodput"]
