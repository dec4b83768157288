"""The scaling note of a sweep: from one GPU to many, from measurements.

``gpufleet sweep note NAME`` runs the sweep's best trial for ``steps`` steps at 1, 2 and 4
data-parallel ranks (DDP jobs on the sweep's backend: CPU ranks on a laptop, GPUs on a fleet),
reads each one's throughput from its step events, and puts it beside what the sweep itself
measured: GPU-hours per finished and per pruned trial, the share of trials pruned, the price of a
GPU-hour. It then answers the question the note is for: with G GPUs, run G one-GPU trials at
once, or G/r trials of r GPUs each?

For the same trials, r GPUs per trial cost ``1 / efficiency(r)`` times the GPU-hours of one GPU
per trial (``efficiency(r) = throughput(r) / (r * throughput(1))``) and finish each trial
``r * efficiency(r)`` times sooner; G one-GPU trials at once keep the cost and take the
wall time of ``ceil(N / G)`` trials in a row. So extra GPUs go to more trials in parallel unless a
trial needs them: it does not fit in one GPU's memory, or the time to one trial's answer matters
more than money. When a trial does get r data-parallel ranks, its batch changes: keeping the
per-rank batch makes the global batch r times larger, and the learning rate then follows (linearly
for SGD with a warm-up, Goyal et al. 2017; about as the square root for Adam, Malladi et al. 2022),
so the parameters the sweep found must be searched again around the scaled value; keeping the global
batch (as the tiny LM does: each rank takes its rows of the same batch) keeps the learning rate
but gives each rank r times less work, which is where efficiency is lost.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.backends import get_backend
from gpufleet.errors import UsageError
from gpufleet.extras import required
from gpufleet.fmt import markdown_table, money
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import TERMINAL
from gpufleet.sweeps.report import best_spec, summary, trial_rows

with required("optuna", "sweeps", "gpufleet sweep"):
    import optuna
    from optuna.trial import TrialState

MEASURE_TIMEOUT_S = 1800.0


@dataclass(frozen=True, slots=True)
class RankRun:
    """One measurement: the best trial at ``ranks`` data-parallel ranks."""

    ranks: int
    job: int | None
    tokens_per_s: float | None
    problem: str | None = None


def measure(
    home: Path,
    study: optuna.Study,
    ranks: Sequence[int],
    steps: int,
    backend: str = "local",
    on_wait: Callable[[str], None] | None = None,
) -> list[RankRun]:
    """Run the best trial for ``steps`` steps at each rank count, one job after the other."""
    spec = best_spec(study)
    runner = get_backend(backend, home)
    out: list[RankRun] = []
    for r in ranks:
        resources = {**spec.resources.model_dump(), "gpus": r, "cpus": max(r, spec.resources.cpus)}
        distributed = {"strategy": "ddp"} if r > 1 else None
        args = {**spec.args, "steps": steps}
        if "eval_every" in args:
            args["eval_every"] = 0  # throughput only
        job_spec = spec.copy_with(
            name=f"{study.study_name[:48]}-scale-{r}", args=args, resources=resources, distributed=distributed
        )
        try:
            job_id = runner.submit(job_spec)
        except UsageError as err:
            out.append(RankRun(r, None, None, f"not run: {err}"))
            continue
        deadline = time.monotonic() + MEASURE_TIMEOUT_S
        while runner.store.job(job_id).state not in TERMINAL:
            if time.monotonic() > deadline:
                runner.cancel(job_id)
                break
            if on_wait is not None:
                on_wait(f"{r} rank(s): job {job_id} {runner.store.job(job_id).state}")
            runner.sync()
            time.sleep(0.5)
        job = runner.store.job(job_id)
        rate = throughput(runner.store, job_id)
        problem = None if job.state == JobState.COMPLETED else f"job {job_id} {job.state}: {job.reason or ''}".strip()
        out.append(RankRun(r, job_id, rate, problem))
    return out


def throughput(store: Any, job_id: int) -> float | None:
    """The job's tokens per second: the median of its step events after the first (warm-up) one."""
    rates = [
        float(e.data["tokens_per_s"])
        for e in store.events(job_id, kinds=(EventKind.STEP,))
        if isinstance(e.data.get("tokens_per_s"), int | float) and math.isfinite(e.data["tokens_per_s"])
    ]
    if not rates:
        return None
    return statistics.median(rates[1:] if len(rates) > 2 else rates)


def note_figures(study: optuna.Study, home: Path, runs: Sequence[RankRun], price: float | None) -> dict[str, Any]:
    """The numbers of the note: scaling per rank count, the sweep's GPU-hours, pruning, and the choice."""
    result = summary(study, trial_rows(study, home))
    rows = result["rows"]
    finished = [r for r in rows if r["state"] == "finished"]
    pruned = [r for r in rows if r["state"] == "pruned"]
    ended = len(finished) + len(pruned)
    base = next((r.tokens_per_s for r in runs if r.ranks == 1 and r.tokens_per_s), None)
    scaling = []
    for run in runs:
        eff = run.tokens_per_s / (run.ranks * base) if base and run.tokens_per_s else None
        scaling.append(
            {
                "ranks": run.ranks,
                "job": run.job,
                "tokens_per_s": run.tokens_per_s,
                "speedup": run.tokens_per_s / base if base and run.tokens_per_s else None,
                "efficiency": eff,
                "cost_factor": 1.0 / eff if eff else None,
                "problem": run.problem,
            }
        )
    per_finished = statistics.mean(r["gpu_hours"] for r in finished) if finished else None
    per_pruned = statistics.mean(r["gpu_hours"] for r in pruned) if pruned else None
    return {
        "sweep": study.study_name,
        "trials": len(rows),
        "finished": len(finished),
        "pruned": len(pruned),
        "pruned_share": len(pruned) / ended if ended else None,
        "gpu_hours": result["gpu_hours"],
        "money": result["money"],
        "gpu_hours_per_finished_trial": per_finished,
        "gpu_hours_per_pruned_trial": per_pruned,
        "gpu_hours_per_trial": result["gpu_hours"] / ended if ended else None,
        "price_per_gpu_hour": price,
        "currency": _currency(),
        "best": result["best"],
        "scaling": scaling,
    }


def _f(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _money(value: float | None, currency: str) -> str:
    return "-" if value is None else money(value, currency)


def _currency() -> str:
    from gpufleet.cost.rates import load_rates

    return load_rates().currency


def render(fig: dict[str, Any], gpus: int = 64) -> str:
    """The note, in Markdown."""
    cur = str(fig.get("currency") or "USD")
    lines = [
        f"# Sweep {fig['sweep']}: from one GPU to many",
        "",
        "## What the sweep measured",
        "",
        f"- {fig['trials']} trials: {fig['finished']} finished, {fig['pruned']} pruned "
        f"({_f(100 * fig['pruned_share'] if fig['pruned_share'] is not None else None, '.0f')} % of those that ended).",
        f"- {_f(fig['gpu_hours'], '.4g')} GPU-hours in all, {_money(fig['money'], cur)} in money; "
        f"{_f(fig['gpu_hours_per_finished_trial'], '.3g')} GPU-hours per finished trial, "
        f"{_f(fig['gpu_hours_per_pruned_trial'], '.3g')} per pruned one "
        f"({_f(fig['gpu_hours_per_trial'], '.3g')} per trial on average).",
    ]
    if fig["best"]:
        lines.append(
            f"- Best: trial {fig['best']['trial']}, {_f(fig['best']['value'], '.5g')} with {fig['best']['params']}."
        )
    lines += [
        "",
        "## One trial on 1, 2 and 4 data-parallel ranks (measured)",
        "",
    ]
    rows = [
        [
            str(s["ranks"]),
            str(s["job"] or "-"),
            _f(s["tokens_per_s"], ".4g"),
            _f(s["speedup"], ".2f"),
            _f(s["efficiency"], ".0%"),
            f"{_f(s['cost_factor'], '.2f')}x",
            str(s["problem"] or "").replace("|", "\\|"),
        ]
        for s in fig["scaling"]
    ]
    head = ["ranks", "job", "tokens/s", "speed-up", "efficiency", "GPU-hours for the same trial", "note"]
    lines += markdown_table(head, rows, right_from=0)
    scaling = [s for s in fig["scaling"] if s["efficiency"] is not None and s["ranks"] > 1]
    worst = min(scaling, key=lambda s: s["efficiency"]) if scaling else None
    per_trial = fig["gpu_hours_per_trial"]
    price = fig["price_per_gpu_hour"]
    lines += ["", f"## {gpus} GPUs: more trials at once, or more GPUs per trial?", ""]
    if per_trial is not None:
        lines.append(
            f"- {gpus} one-GPU trials at once: {gpus} trials in the time of one, at "
            f"{_f(per_trial, '.3g')} GPU-hours a trial"
            + (f" ({money(per_trial * price, cur)} a trial at {money(price, cur)} a GPU-hour)." if price else ".")
        )
    for s in scaling:
        lines.append(
            f"- {gpus // s['ranks']} trials of {s['ranks']} GPUs: each trial at {_f(s['speedup'], '.2f')}x the speed, "
            f"{_f(s['cost_factor'], '.2f')}x the GPU-hours"
            + (f" ({_f(per_trial * s['cost_factor'], '.3g')} GPU-hours a trial)." if per_trial is not None else ".")
        )
    if worst is not None:
        verdict = (
            "more trials in parallel: every GPU given to a trial beyond the first buys less than it costs"
            if worst["efficiency"] < 0.9
            else "either: data parallelism is nearly free here, so give trials more GPUs when their wall time matters"
        )
        lines.append(f"- Measured efficiency at {worst['ranks']} ranks is {worst['efficiency']:.0%}: {verdict}.")
    lines += [
        "",
        "## When a trial gets r data-parallel ranks",
        "",
        "- Keep the per-rank batch: the global batch is r times larger and the learning rate must follow "
        "(linear scaling with a warm-up for SGD, Goyal et al. 2017; about the square root for Adam, Malladi et al. "
        "2022). The sweep's best learning rate is then a starting point to search around, not the answer.",
        "- Keep the global batch (each rank takes its share, as the tiny LM does): the learning rate stands, each "
        "rank does r times less work per step, and the measured efficiency above is what that costs.",
        f"- Pruning: {_f(100 * fig['pruned_share'] if fig['pruned_share'] is not None else None, '.0f')} % of "
        "the trials were pruned early, so finished trials carry most of the GPU-hours; ASHA decides at fixed "
        "steps, so it works the same with more trials in flight, and more trials at once reach its rungs sooner.",
        "",
        "Measured on this machine; on CPU ranks that share cores the efficiency is the machine's, not a GPU "
        "fleet's. Run `gpufleet sweep note` where the trials run to get that fleet's figures.",
        "",
    ]
    return "\n".join(lines)


def sweep_price(study: optuna.Study) -> float | None:
    """The rate card's price of a GPU-hour of the sweep's base GPU type (on-demand)."""
    from gpufleet.cost.rates import load_rates

    base = study.user_attrs.get("base") or {}
    resources = base.get("resources") or {}
    gpu_type = str(resources.get("gpu_type", "cpu"))
    return load_rates().price(gpu_type, str(base.get("provider", "local")), spot=bool(base.get("spot", False)))


def finished_trials(study: optuna.Study) -> int:
    return sum(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False))


__all__ = ["RankRun", "finished_trials", "measure", "note_figures", "render", "sweep_price", "throughput"]
