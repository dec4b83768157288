"""A sweep's trials as rows (parameters, objective, state, job, GPU-hours, money), its plot, its best JobSpec."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpufleet.errors import Conflict, NotFound, UsageError
from gpufleet.extras import required
from gpufleet.jobs.store import Store
from gpufleet.paths import check_name, state_db
from gpufleet.plotting import figure, save_figure
from gpufleet.spec import JobSpec, parse_spec
from gpufleet.sweeps.driver import FAILURE, JOB_ID, LOST, PRUNED_AT, storage_errors, sweep_dir

with required("optuna", "sweeps", "gpufleet sweep"):
    import optuna
    from optuna.trial import TrialState

STATES = {
    TrialState.COMPLETE: "finished",
    TrialState.PRUNED: "pruned",
    TrialState.RUNNING: "running",
    TrialState.FAIL: "failed",
    TrialState.WAITING: "waiting",
}


def load_sweep_study(home: Path, name: str, storage: str | None = None) -> optuna.Study:
    """The study of sweep ``name`` (default storage: the SQLite file under ``$GPUFLEET_HOME/sweeps``)."""
    check_name(name, "sweep")
    if storage is None:
        storage = f"sqlite:///{sweep_dir(home, name) / 'study.db'}"
    # Opening a SQLite URL creates its file: look first, so a wrong name or URL leaves nothing behind.
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        where = str(home) if storage.endswith(f"/sweeps/{name}/study.db") else storage[:120]
        raise NotFound(f"no sweep named {name!r} in {where}: run `gpufleet sweep run SWEEP.yaml` first")
    with storage_errors(storage):
        try:
            return optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            raise NotFound(f"no sweep named {name!r} in {storage[:120]}") from None


def trial_rows(study: optuna.Study, home: Path) -> list[dict[str, Any]]:
    """One row per trial, with its job's GPU-hours and money from the ledger."""
    trials = study.get_trials(deepcopy=False)
    jobs = [int(t.user_attrs[JOB_ID]) for t in trials if JOB_ID in t.user_attrs]
    costs: dict[int, tuple[float, float]] = {}
    if jobs and state_db(home).exists():
        from gpufleet.cost.ledger import build_ledger
        from gpufleet.cost.rates import load_rates
        from gpufleet.cost.usage import store_usages

        ledger = build_ledger(store_usages(Store(state_db(home)), job_ids=jobs), load_rates())
        costs = {j: (c.total_gpu_hours, c.money) for j, c in ledger.jobs.items()}
    rows = []
    for t in trials:
        job = t.user_attrs.get(JOB_ID)
        gpu_hours, money = costs.get(int(job), (0.0, 0.0)) if job is not None else (0.0, 0.0)
        value = t.value if t.state == TrialState.COMPLETE else None
        last = max(t.intermediate_values, default=None)
        rows.append(
            {
                "trial": t.number,
                "state": STATES.get(t.state, t.state.name.lower()),
                "params": dict(t.params),
                "value": value,
                "last_step": last,
                "last_value": t.intermediate_values[last] if last is not None else None,
                "pruned_at": t.user_attrs.get(PRUNED_AT),
                "job": job,
                "gpu_hours": gpu_hours,
                "money": money,
                "reason": t.user_attrs.get(FAILURE) or t.user_attrs.get(LOST),
            }
        )
    return rows


def summary(study: optuna.Study, rows: list[dict[str, Any]]) -> dict[str, Any]:
    finished = [r for r in rows if r["state"] == "finished"]
    best = study.best_trial if finished else None
    sweep = study.user_attrs.get("sweep", {})
    return {
        "sweep": study.study_name,
        "direction": study.direction.name.lower(),
        "metric": sweep.get("objective", {}).get("metric"),
        "trials": len(rows),
        "finished": len(finished),
        "pruned": sum(r["state"] == "pruned" for r in rows),
        "failed": sum(r["state"] == "failed" for r in rows),
        "running": sum(r["state"] == "running" for r in rows),
        "best": None if best is None else {"trial": best.number, "value": best.value, "params": dict(best.params)},
        "gpu_hours": sum(r["gpu_hours"] for r in rows),
        "money": sum(r["money"] for r in rows),
        "rows": rows,
    }


def best_spec(study: optuna.Study) -> JobSpec:
    """The base JobSpec with the best trial's parameters: the run to make at full length."""
    base = study.user_attrs.get("base")
    if not isinstance(base, dict):
        raise UsageError(f"sweep {study.study_name!r} has no base JobSpec recorded")
    finished = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not finished:
        raise Conflict(f"sweep {study.study_name!r} has no finished trial yet: nothing is best")
    best = study.best_trial
    spec = parse_spec(base, source=f"sweep {study.study_name}: base")
    return spec.copy_with(name=f"{study.study_name[:58]}-best", args={**spec.args, **best.params})


def plot_sweep(study: optuna.Study, rows: list[dict[str, Any]], path: Path) -> str:
    """Objective by trial with the best so far, and the objective against each parameter."""
    import matplotlib.ticker

    params = list(study.user_attrs.get("sweep", {}).get("space", {})) or sorted({k for r in rows for k in r["params"]})
    fig, axes = figure(1, 1 + len(params), size=(4.2 * (1 + len(params)), 3.8))
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    minimize = study.direction == optuna.study.StudyDirection.MINIMIZE
    done = [r for r in rows if r["value"] is not None]
    cut = [r for r in rows if r["state"] == "pruned" and r["last_value"] is not None]
    ax = axes[0]
    ax.scatter([r["trial"] for r in done], [r["value"] for r in done], color="tab:blue", label="finished")
    ax.scatter([r["trial"] for r in cut], [r["last_value"] for r in cut], color="tab:grey", marker="x", label="pruned")
    best, line = math.inf if minimize else -math.inf, []
    for r in sorted(done, key=lambda r: r["trial"]):
        best = min(best, r["value"]) if minimize else max(best, r["value"])
        line.append((r["trial"], best))
    if line:
        line.append((max(r["trial"] for r in rows), line[-1][1]))  # the best holds to the last trial
        ax.step([x for x, _ in line], [y for _, y in line], where="post", color="tab:red", label="best so far")
    metric = study.user_attrs.get("sweep", {}).get("objective", {}).get("metric", "objective")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(f"sweep {study.study_name}")
    ax.legend(fontsize=8)
    for ax, name in zip(axes[1:], params, strict=True):
        xs = [r["params"].get(name) for r in done]
        ax.scatter([str(x) if isinstance(x, str) else x for x in xs], [r["value"] for r in done], color="tab:blue")
        ax.scatter([r["params"].get(name) for r in cut], [r["last_value"] for r in cut], color="tab:grey", marker="x")
        space = study.user_attrs.get("sweep", {}).get("space", {}).get(name, {})
        if space.get("log"):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(name)
        ax.set_ylabel(metric)
    return save_figure(fig, path)


__all__ = ["best_spec", "load_sweep_study", "plot_sweep", "summary", "trial_rows"]
