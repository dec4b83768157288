"""``sweep.yaml``: a base JobSpec, a search space, an objective, a budget, a pruner.

::

    name: lm-sweep
    base: job.yaml                      # a JobSpec file (relative to this file), or the JobSpec itself
    space:                              # each parameter goes to the trial's ``args``
      lr: {low: 1.0e-4, high: 1.0e-2, log: true}
      embed: {choices: [16, 32]}
      layers: {low: 1, high: 3, type: int}
    objective: {metric: val_loss, direction: minimize}
    budget: {trials: 12, gpu_hours: 2.0, money: 10.0}
    parallelism: 2
    sampler: {kind: tpe, seed: 0}       # grid (every value a `grid:` list), random, tpe
    pruner: {kind: asha, min_steps: 10, reduction_factor: 3}   # none, median, asha
    max_failures: 3                     # stop after this many failed trials

Validation names the field and the fix: an empty space, a grid value that is not a list, a range
whose ``low`` is not below ``high``, a log range that is not positive, a budget of 0, a grid
sampler over a space that is not all grids, an unknown pruner. It also keeps every number the
samplers compute with bounded, before anything is built or written: a range's bounds lie within
``±MAX_RANGE_MAGNITUDE`` (an int range's within ``±MAX_INT_RANGE``), a ``step`` leaves at most
``MAX_STEP_VALUES`` values, and a grid has at most ``MAX_TRIALS`` points (Optuna's grid sampler
lists every point in memory).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.errors import SpecError
from gpufleet.paths import NAME_HINT, NAME_RE
from gpufleet.spec import JobSpec, load_spec, parse_spec
from gpufleet.yamlio import read_yaml, validate

REFERENCE = "the sweep file format in docs/sweeps.md"
MAX_TRIALS = 100_000
"""The most trials a budget asks for, and the most points a grid sweep has."""
MAX_RANGE_MAGNITUDE = 1e150
"""The largest ``|low|`` or ``|high|`` of a float range: the samplers draw ``high - low`` wide and TPE squares
distances in it, both of which overflow to infinity for bounds near the float limit (1.8e308)."""
MAX_INT_RANGE = 2**53
"""The largest ``|low|`` or ``|high|`` of an int range: every whole number up to it is exact as a float, which
is how the bounds are read and how the samplers draw (beyond it ``low`` and ``high`` are not the numbers given)."""
MAX_STEP_VALUES = 10**9
"""The most values a ``step`` may leave in a range (``(high - low) / step + 1``): a finer step is a continuous
range (drop ``step``), and Optuna's exact arithmetic on the step fails far beyond it."""
Scalar = float | int | str | bool


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Param(_Frozen):
    """One parameter: a ``grid`` or ``choices`` list, or a ``low``..``high`` range (``type: int`` or float)."""

    grid: list[Scalar] | None = Field(default=None, min_length=1, max_length=10_000)
    choices: list[Scalar] | None = Field(default=None, min_length=1, max_length=10_000)
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = Field(default=None, gt=0)
    type: Literal["float", "int"] = "float"

    @model_validator(mode="after")
    def _one_kind(self) -> Param:
        kinds = [k for k, v in (("grid", self.grid), ("choices", self.choices), ("low", self.low)) if v is not None]
        if len(kinds) != 1 or (self.low is None) != (self.high is None):
            raise ValueError("give exactly one of: grid: [values], choices: [values], or low: and high:")
        if self.low is not None and self.high is not None:
            self._check_range(self.low, self.high)
        return self

    def _check_range(self, low: float, high: float) -> None:
        """Bounds every sampler can draw between: ordered, within the magnitude limit, a step it can count."""
        top = MAX_INT_RANGE if self.type == "int" else MAX_RANGE_MAGNITUDE
        for name, value in (("low", low), ("high", high)):
            if abs(value) > top:
                shown = "2**53" if self.type == "int" else f"{top:g}"
                raise ValueError(f"{self.type} range {name} {value:g} is out of range: give -{shown} to {shown}")
        if not low < high:
            raise ValueError(f"low {low:g} is not below high {high:g}: give low < high")
        if self.log and low <= 0:
            raise ValueError(f"a log range needs low > 0, got {low:g}")
        if self.type == "int" and (low != int(low) or high != int(high)):
            raise ValueError("an int range needs whole low and high")
        if self.step is not None:
            self._check_step(low, high, self.step)

    def _check_step(self, low: float, high: float, step: float) -> None:
        if self.log:
            raise ValueError("a log range takes no step: drop step, or log")
        if self.type == "int" and (step != int(step) or step < 1):
            raise ValueError(f"an int range needs a whole step of at least 1, got {step:g}")
        count = (high - low) / step + 1  # infinite for a step far below the width: refused too
        if not count <= MAX_STEP_VALUES:
            many = f"{count:.3g}" if math.isfinite(count) else "more than 1e308"
            raise ValueError(
                f"step {step:g} leaves {many} values between {low:g} and {high:g}, over "
                f"{MAX_STEP_VALUES:,}: give a larger step, or drop step for a continuous range"
            )

    @property
    def values(self) -> list[Scalar] | None:
        return self.grid if self.grid is not None else self.choices


class Objective(_Frozen):
    metric: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")
    """A value the trial logs (``session.log("eval", val_loss=...)`` or ``session.report(..., val_loss=...)``)."""
    direction: Literal["minimize", "maximize"] = "minimize"


class Budget(_Frozen):
    trials: int = Field(ge=1, le=MAX_TRIALS)
    """Trials that finish or are pruned (failed ones are not counted)."""
    gpu_hours: float | None = Field(default=None, gt=0)
    money: float | None = Field(default=None, gt=0)


class Sampler(_Frozen):
    kind: Literal["grid", "random", "tpe"] = "tpe"
    seed: int = Field(default=0, ge=0, le=2**32 - 1)


class Pruner(_Frozen):
    kind: Literal["none", "median", "asha"] = "none"
    min_steps: int = Field(default=1, ge=1)
    """No trial is pruned before it reported at this step (median: warm-up steps; asha: min resource)."""
    reduction_factor: int = Field(default=3, ge=2)
    startup_trials: int = Field(default=2, ge=0)
    """Median: trials that finish before any is pruned."""


class SweepSpec(_Frozen):
    name: str
    base: str | dict[str, Any]
    space: dict[str, Param] = Field(min_length=1, max_length=64)
    objective: Objective
    budget: Budget
    parallelism: int = Field(default=1, ge=1, le=1024)
    sampler: Sampler = Sampler()
    pruner: Pruner = Pruner()
    max_failures: int = Field(default=3, ge=1, le=MAX_TRIALS)
    storage: str | None = None
    """An Optuna RDB URL; default ``sqlite:///$GPUFLEET_HOME/sweeps/<name>/study.db``."""

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if not NAME_RE.match(self.name):
            raise ValueError(f"name {self.name[:70]!r} is not a valid name: {NAME_HINT}")
        for key in self.space:
            if not key.isidentifier():
                raise ValueError(f"space: parameter {key[:70]!r} is not a Python identifier (it becomes an arg)")
        if self.sampler.kind == "grid":
            loose = [k for k, p in self.space.items() if p.grid is None]
            if loose:
                raise ValueError(f"sampler grid: parameter {loose[0]!r} is not a grid: give it grid: [values]")
            _check_grid([len(p.grid or []) for p in self.space.values()])
        return self

    @property
    def grid_size(self) -> int | None:
        """The number of points of a grid sweep (at most ``MAX_TRIALS``: validation refuses more)."""
        if self.sampler.kind != "grid":
            return None
        return math.prod(len(p.grid or []) for p in self.space.values())


def _check_grid(lengths: list[int]) -> None:
    """Refuse a grid of more than ``MAX_TRIALS`` points, from the lengths alone (the points are never built)."""
    points = 1
    for length in lengths:
        points *= length
        if points > MAX_TRIALS:
            break
    else:
        return
    shown = " x ".join(str(n) for n in lengths[:8]) + (
        f" x ... ({len(lengths)} parameters)" if len(lengths) > 8 else ""
    )
    total = math.prod(lengths)  # at most 64 lengths of at most 10,000 each: a quick product of ints
    raise ValueError(
        f"grid of {shown} = {total:.3g} trials exceeds the ceiling of {MAX_TRIALS:,}: "
        "give fewer grid values, or sample the space (sampler: random or tpe, with low/high ranges)"
    )


def load_sweep(path: str | Path) -> tuple[SweepSpec, JobSpec]:
    """The sweep and its base JobSpec, both validated (exit 2 naming the field on bad input)."""
    path = Path(path)
    data = read_yaml(path, what="sweep file", error=SpecError)
    sweep = validate(SweepSpec, data, source=str(path), what="a sweep", reference=REFERENCE, error=SpecError)
    return sweep, base_spec(sweep, path.parent)


def base_spec(sweep: SweepSpec, folder: Path) -> JobSpec:
    if isinstance(sweep.base, dict):
        spec = parse_spec(sweep.base, source=f"sweep {sweep.name}: base")
    else:
        target = Path(sweep.base)
        spec = load_spec(target if target.is_absolute() else folder / target)
    if spec.callable_entrypoint is None:
        raise SpecError(
            f"sweep {sweep.name}: base entrypoint {spec.entrypoint!r} is not module:function; "
            "a sweep passes each trial's parameters as the function's args"
        )
    return spec


__all__ = [
    "MAX_INT_RANGE",
    "MAX_RANGE_MAGNITUDE",
    "MAX_STEP_VALUES",
    "MAX_TRIALS",
    "Budget",
    "Objective",
    "Param",
    "Pruner",
    "Sampler",
    "SweepSpec",
    "base_spec",
    "load_sweep",
]
