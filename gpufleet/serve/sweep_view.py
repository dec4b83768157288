"""The sweeps page's data: each sweep under ``$GPUFLEET_HOME/sweeps`` as ``gpufleet sweep show --json`` tells it.

A sweep is listed when its folder holds the study ``gpufleet sweep run`` keeps there (``study.db``); a
sweep whose ``storage`` is elsewhere (a database server) is not found by looking, and is not listed.
Optuna is the ``sweeps`` extra's: without it, these routes answer what the CLI says (install the extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.errors import GpufleetError
from gpufleet.paths import NAME_RE

STUDY_FILE = "study.db"


def sweep_names(home: Path) -> list[str]:
    """The sweeps whose study lives in this home, by name."""
    root = home / "sweeps"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if NAME_RE.match(p.name) and (p / STUDY_FILE).is_file())


def sweep_view(home: Path, name: str) -> dict[str, Any]:
    """One sweep (``gpufleet sweep show NAME --json``): its trials' parameters, objective, state, job and cost,
    the best trial, the parameters searched and the ledger's currency."""
    from gpufleet.cost.rates import load_rates
    from gpufleet.sweeps.report import load_sweep_study, summary, trial_rows

    study = load_sweep_study(home, name)
    out = summary(study, trial_rows(study, home))
    space = study.user_attrs.get("sweep", {}).get("space", {})
    params = list(space) or sorted({k for r in out["rows"] for k in r["params"]})
    return {**out, "params": params, "currency": load_rates().currency}


def sweeps_view(home: Path) -> dict[str, Any]:
    """Every sweep of the home without its rows; one that cannot be read is listed with the reason."""
    sweeps = []
    for name in sweep_names(home):
        try:
            view = sweep_view(home, name)
        except GpufleetError as err:
            sweeps.append({"sweep": name, "problem": str(err)})
            continue
        view.pop("rows")
        sweeps.append(view)
    return {"sweeps": sweeps}


__all__ = ["STUDY_FILE", "sweep_names", "sweep_view", "sweeps_view"]
