"""The fleet simulator's workload model: what arrives, and how jobs and regions behave.

:class:`WorkloadModel` is what ``gpufleet simulate --workload`` reads (every field has a default):
the arrival cycle, the mix of job sizes, run times, workload classes, teams, priorities, spot and
pinned shares, deadlines, checkpoint intervals and save/restore times, the :class:`Outages` rates
and the :class:`FailoverRule` of ``spot_failover``. From it ``generate_jobs`` draws a
:class:`JobTable` (one row per job, parallel numpy arrays) and ``draw_outages`` the region and
provider :class:`Outage` list; ``jobs_from_specs`` builds a table from JobSpecs instead.

Jobs arrive as a Poisson process whose rate follows a daily cycle ``1 + a cos(2 pi (h - peak) / 24)``
(given the count, arrival times are i.i.d. with that density). Outages are Poisson processes per
region and per provider with exponential durations.

It is apart from :mod:`gpufleet.placement.simulate` so that the inputs can be validated, drawn and
tested without the event loop, and shared by every policy in a comparison (common random numbers).
It is pure: no I/O but ``load_workload``'s read, every draw from the numpy ``Generator`` given.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gpufleet.errors import UsageError
from gpufleet.placement.catalog import Catalog
from gpufleet.placement.quota import NO_QUOTA, QuotaBook
from gpufleet.spec import JobSpec, OfferChoice
from gpufleet.yamlio import read_yaml, validate

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
INF = math.inf
WORKLOAD_REFERENCE = "the WorkloadModel fields in gpufleet/placement/workload.py"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _shares(value: dict[Any, float], what: str | None) -> dict[Any, float]:
    if any(v < 0 for v in value.values()) or (value and sum(value.values()) <= 0):
        raise ValueError(f"{what}: shares must be >= 0 with a positive sum, got {value}")
    return value


class LogNormal(_Frozen):
    """A positive quantity drawn log-normally around ``median`` and clipped to ``[low, high]``."""

    median: float = Field(gt=0)
    sigma: float = Field(default=0.0, ge=0, le=5)
    """Standard deviation of the natural log (0: always the median)."""
    low: float = Field(default=0.0, ge=0)
    high: float | None = Field(default=None, gt=0)

    def draw(self, rng: np.random.Generator, n: int) -> Floats:
        values = self.median * np.exp(self.sigma * rng.standard_normal(n))
        return np.clip(values, self.low, self.high if self.high is not None else INF)


class Outages(_Frozen):
    """Outages as Poisson processes per region and per provider, with exponential durations."""

    region_per_day: float = Field(default=0.02, ge=0)
    region_hours: float = Field(default=2.0, gt=0)
    provider_per_day: float = Field(default=0.005, ge=0)
    provider_hours: float = Field(default=4.0, gt=0)


class FailoverRule(_Frozen):
    """When ``spot_failover`` stops sending jobs to a region (:mod:`gpufleet.placement.failover`).

    A job preempted or killed in a region avoids it for ``cooldown_hours``; after an outage every
    job avoids the region as long. With ``preemptions`` set, that many preemptions in a region within
    ``window_hours`` close its spot market to every job for the cool-down, as ``failover.py`` blocks a
    target. It is off by default: a count that does not grow with the jobs running there closes
    every busy region (60 spot jobs at 0.05 preemptions per hour already see 3 an hour).
    """

    cooldown_hours: float = Field(default=1.0, gt=0)
    preemptions: int | None = Field(default=None, ge=1)
    window_hours: float = Field(default=1.0, gt=0)


class WorkloadModel(_Frozen):
    """What arrives and how it behaves; every field has a default (``gpufleet simulate --workload``)."""

    daily_amplitude: float = Field(default=0.5, ge=0, lt=1)
    """Arrival rate ``1 + a cos(2 pi (hour - peak_hour) / 24)``: 0 is flat, 0.5 peaks at 3x the trough."""
    peak_hour: float = Field(default=15.0, ge=0, lt=24)
    gpus: dict[int, float] = Field(default_factory=lambda: {1: 0.45, 2: 0.25, 4: 0.18, 8: 0.12})
    """GPUs per job -> share of jobs."""
    hours: LogNormal = LogNormal(median=1.0, sigma=1.0, low=0.1, high=240.0)
    """Run time on reference GPUs; the job's work is ``hours * gpus`` GPU-hours."""
    workloads: dict[str, float] = Field(default_factory=lambda: {"training": 0.6, "finetune": 0.4})
    teams: dict[str, float] = Field(default_factory=dict)
    """Team -> share; empty: the catalogue's quota teams, equal shares (``default`` without quotas)."""
    priorities: dict[int, float] = Field(default_factory=lambda: {0: 0.8, 10: 0.2})
    spot_share: float = Field(default=0.7, ge=0, le=1)
    """Share of jobs that may run on spot."""
    pinned_share: float = Field(default=0.3, ge=0, le=1)
    """Share of jobs that need one GPU type (drawn among those the team may use); the rest take any."""
    deadline_share: float = Field(default=0.3, ge=0, le=1)
    deadline_slack: tuple[float, float] = (1.5, 6.0)
    """A deadline is ``slack * hours`` after arrival, ``slack`` uniform in this range."""
    checkpoint_minutes: dict[float, float] = Field(default_factory=lambda: {15.0: 0.3, 30.0: 0.5, 60.0: 0.2})
    save_seconds: LogNormal = LogNormal(median=20.0, sigma=0.5, low=1.0, high=900.0)
    restore_seconds: LogNormal = LogNormal(median=120.0, sigma=0.5, low=5.0, high=3600.0)
    checkpoint_gb: LogNormal = LogNormal(median=20.0, sigma=1.0, low=0.1, high=5000.0)
    outages: Outages = Outages()
    failover: FailoverRule = FailoverRule()
    whole_nodes: bool = False
    """``false``: the fleet's GPUs are pooled and jobs packed onto them, as Kueue admits GPUs on a
    cluster of rented nodes (capacity and quota in GPUs). ``true``: each job rents whole nodes
    (``gpus`` rounded up to ``gpus_per_node``, the idle ones paid too), as ``gpufleet place`` assumes."""
    team_preferences: dict[str, list[OfferChoice]] = Field(default_factory=dict)
    """Team -> offers in order of preference, for the ``ordered`` policy."""
    drain_days: float = Field(default=7.0, ge=0)
    """The simulation runs this long after the arrival window; jobs still unfinished then are counted so."""

    @field_validator("gpus", "workloads", "teams", "priorities", "checkpoint_minutes")
    @classmethod
    def _valid_shares(cls, value: dict[Any, float], info: ValidationInfo) -> dict[Any, float]:
        return _shares(value, info.field_name)

    @field_validator("gpus")
    @classmethod
    def _whole_gpus(cls, value: dict[int, float]) -> dict[int, float]:
        if not value or min(value) < 1:
            raise ValueError(f"give GPU counts >= 1 with their shares, e.g. {{1: 0.5, 8: 0.5}}, got {value}")
        return value

    @model_validator(mode="after")
    def _ranges(self) -> WorkloadModel:
        if not self.workloads or not self.priorities or not self.checkpoint_minutes:
            raise ValueError("workloads, priorities and checkpoint_minutes need at least one entry each")
        if min(self.checkpoint_minutes) <= 0:
            raise ValueError(f"checkpoint_minutes must be > 0, got {sorted(self.checkpoint_minutes)}")
        low, high = self.deadline_slack
        if not 0 < low <= high:
            raise ValueError(f"deadline_slack must be (low, high) with 0 < low <= high, got {self.deadline_slack}")
        return self


def parse_workload(data: Any, source: str = "<workload>") -> WorkloadModel:
    """Validate a mapping as a :class:`WorkloadModel`; ``UsageError`` names the first bad field."""
    return validate(
        WorkloadModel,
        data or {},
        source=source,
        what="a workload model",
        reference=WORKLOAD_REFERENCE,
        error=UsageError,
    )


def load_workload(path: str | Path) -> WorkloadModel:
    """Read a workload model from YAML (untrusted input: ``yaml.safe_load`` only)."""
    return parse_workload(read_yaml(Path(path), what="workload model", error=UsageError), source=str(path))


@dataclass(frozen=True, slots=True)
class ChoiceSet:
    """The offers a job accepts: one GPU type (or any), optionally a list of choices, maybe ordered."""

    gpu_type: str | None = None
    choices: tuple[OfferChoice, ...] = ()
    ordered: bool = False


@dataclass(frozen=True, eq=False)
class JobTable:
    """Jobs as parallel arrays (one row per job); ``team``, ``workload`` and ``choice`` index the tuples."""

    arrival_h: Floats
    team: Ints
    gpus: Ints
    work_gpu_hours: Floats
    """Work in GPU-hours of the reference GPU (throughput 1.0)."""
    workload: Ints
    priority: Ints
    deadline_h: Floats
    """Hours after arrival; ``inf`` for none."""
    checkpoint_h: Floats
    """Hours between checkpoints: of wall time, or of reference-GPU time where ``checkpoint_scales``."""
    checkpoint_scales: Bools
    """The interval is a step count (``every_steps * step_seconds``): slower GPUs stretch it."""
    save_h: Floats
    restore_h: Floats
    checkpoint_gb: Floats
    spot: Bools
    choice: Ints
    home: Ints
    """Index of the job's provider in ``Catalog.providers``, or -1."""
    memory_gib: Floats
    """GPU memory a worker needs (0: any); smaller GPU types are not used."""
    teams: tuple[str, ...]
    workloads: tuple[str, ...]
    choice_sets: tuple[ChoiceSet, ...]

    def __len__(self) -> int:
        return len(self.arrival_h)


def _arrivals(rng: np.random.Generator, n: int, days: float, amplitude: float, peak: float) -> Floats:
    """``n`` i.i.d. times on ``[0, 24 * days)`` with density ``1 + a cos(...)``, by rejection, sorted."""
    out: list[Floats] = [np.zeros(0)]
    have = 0
    while have < n:
        t = rng.uniform(0.0, 24.0 * days, size=max(2 * (n - have), 64))
        keep = rng.uniform(0.0, 1.0 + amplitude, size=t.size) < 1.0 + amplitude * np.cos(2 * np.pi * (t - peak) / 24)
        out.append(t[keep])
        have += int(keep.sum())
    return np.sort(np.concatenate(out)[:n])


def _pick(rng: np.random.Generator, mix: dict[Any, float], n: int) -> tuple[list[Any], Ints]:
    keys = list(mix)
    p = np.array([mix[k] for k in keys], dtype=float)
    return keys, rng.choice(len(keys), size=n, p=p / p.sum()).astype(np.int64)


def generate_jobs(
    catalog: Catalog, workload: WorkloadModel, *, jobs: int, days: float, rng: np.random.Generator
) -> JobTable:
    """Draw ``jobs`` jobs arriving over ``days`` days from the workload model."""
    if jobs < 0 or not days > 0:
        raise UsageError(f"need jobs >= 0 and days > 0, got jobs={jobs}, days={days}")
    known = {w for g in catalog.gpu_types.values() for w in g.throughput}
    for name in workload.workloads:
        if name not in known:
            raise UsageError(f"workload class {name!r} has no throughput in the catalogue; classes: {sorted(known)}")
    teams = workload.teams or dict.fromkeys(dict.fromkeys(q.team for q in catalog.quotas), 1.0) or {"default": 1.0}
    book = QuotaBook(catalog.quotas)
    for name in teams:
        if all(book.resource(name, o.gpu_type, o.provider) == NO_QUOTA for o in catalog.offers):
            raise UsageError(f"team {name!r} has no quota row for any offer in the catalogue: add one or drop the team")
    arrival = _arrivals(rng, jobs, days, workload.daily_amplitude, workload.peak_hour)
    team_names, team = _pick(rng, teams, jobs)
    sizes, size = _pick(rng, workload.gpus, jobs)
    gpus = np.array(sizes, dtype=np.int64)[size] if jobs else np.zeros(0, np.int64)
    hours = workload.hours.draw(rng, jobs)
    wl_names, wl = _pick(rng, workload.workloads, jobs)
    prios, prio = _pick(rng, workload.priorities, jobs)
    spot = rng.random(jobs) < workload.spot_share
    pinned = rng.random(jobs) < workload.pinned_share
    which = rng.random(jobs)
    low, high = workload.deadline_slack
    deadline = np.where(rng.random(jobs) < workload.deadline_share, rng.uniform(low, high, jobs) * hours, INF)
    minutes, ckpt = _pick(rng, workload.checkpoint_minutes, jobs)
    choice_sets: list[ChoiceSet] = [ChoiceSet()]
    for name in catalog.gpu_types:
        choice_sets.append(ChoiceSet(gpu_type=name))
    usable = {  # (team, workload) -> indices into choice_sets of the types the team may run it on
        (t, w): [
            i + 1
            for i, g in enumerate(catalog.gpu_types)
            if catalog.throughput(g, wl_names[w])
            and any(book.resource(team_names[t], g, o.provider) != NO_QUOTA for o in catalog.offers_for(gpu_type=g))
        ]
        for t in range(len(team_names))
        for w in range(len(wl_names))
    }
    choice = np.zeros(jobs, dtype=np.int64)
    for j in np.flatnonzero(pinned):
        options = usable[(int(team[j]), int(wl[j]))]
        if options:
            choice[j] = options[int(which[j] * len(options))]
    return JobTable(
        arrival_h=arrival,
        team=team,
        gpus=gpus,
        work_gpu_hours=hours * gpus,
        workload=wl,
        priority=np.array(prios, dtype=np.int64)[prio] if jobs else np.zeros(0, np.int64),
        deadline_h=deadline,
        checkpoint_h=np.array(minutes, dtype=float)[ckpt] / 60.0 if jobs else np.zeros(0),
        checkpoint_scales=np.zeros(jobs, dtype=bool),
        save_h=workload.save_seconds.draw(rng, jobs) / 3600.0,
        restore_h=workload.restore_seconds.draw(rng, jobs) / 3600.0,
        checkpoint_gb=workload.checkpoint_gb.draw(rng, jobs),
        spot=spot,
        choice=choice,
        home=np.full(jobs, -1, dtype=np.int64),
        memory_gib=np.zeros(jobs),
        teams=tuple(team_names),
        workloads=tuple(wl_names),
        choice_sets=tuple(choice_sets),
    )


def jobs_from_specs(
    catalog: Catalog, specs: Sequence[JobSpec], arrivals_h: Sequence[float], *, default_checkpoint_minutes: float = 30.0
) -> JobTable:
    """A table from JobSpecs, arriving at the given hours, read as the planner reads them.

    A job runs on ``resources.gpu_type``, or on its ``placement.any_of`` / ``ordered`` choices (whose
    unset ``gpu_type`` is the job's); it checkpoints every ``checkpoint.every_seconds``, else every
    ``every_steps * placement.step_seconds`` of reference-GPU time, else every
    ``default_checkpoint_minutes``; ``placement.memory_gib`` rules out smaller GPU types."""
    if len(specs) != len(arrivals_h):
        raise UsageError(f"{len(specs)} jobs but {len(arrivals_h)} arrival times: give one per job")
    teams: dict[str, int] = {}
    workloads: dict[str, int] = {}
    sets: dict[ChoiceSet, int] = {}
    col: dict[str, list[Any]] = defaultdict(list)
    for spec in specs:
        p, ck, own = spec.placement, spec.checkpoint, spec.resources.gpu_type
        if p.gpu_hours is None or spec.resources.gpus < 1:
            raise UsageError(f"job {spec.name!r}: simulating it needs placement.gpu_hours and resources.gpus >= 1")
        picks = tuple(c if c.gpu_type else c.model_copy(update={"gpu_type": own}) for c in p.ordered or p.any_of)
        for gpu_type in {c.gpu_type for c in picks} if picks else {own}:
            if gpu_type not in catalog.gpu_types:
                raise UsageError(
                    f"job {spec.name!r}: gpu_type {gpu_type!r} is not in the catalogue {list(catalog.gpu_types)}"
                )
        if not any(catalog.throughput(g, p.workload) for g in catalog.gpu_types):
            raise UsageError(f"job {spec.name!r}: no GPU type in the catalogue has a throughput for {p.workload!r}")
        choice = ChoiceSet(None if picks else own, picks, bool(p.ordered))
        stepped = ck.every_seconds is None and ck.every_steps is not None and p.step_seconds is not None
        every = ck.every_seconds or (ck.every_steps or 0) * (p.step_seconds or 0) or default_checkpoint_minutes * 60
        for name, value in (
            ("team", teams.setdefault(spec.team, len(teams))),
            ("gpus", spec.resources.gpus),
            ("work", p.gpu_hours),
            ("workload", workloads.setdefault(p.workload, len(workloads))),
            ("priority", spec.priority),
            ("deadline", p.deadline_hours or INF),
            ("checkpoint", every / 3600.0),
            ("scales", stepped),
            ("save", (p.save_seconds or 0.0) / 3600.0),
            ("restore", p.restore_seconds / 3600.0),
            ("gb", p.checkpoint_gb),
            ("spot", spec.spot),
            ("choice", sets.setdefault(choice, len(sets))),
            ("home", catalog.providers.index(spec.provider) if spec.provider in catalog.providers else -1),
            ("memory", p.memory_gib or 0.0),
        ):
            col[name].append(value)

    def ints(name: str) -> Ints:
        return np.array(col[name], dtype=np.int64)

    def floats(name: str) -> Floats:
        return np.array(col[name], dtype=float)

    return JobTable(
        arrival_h=np.array(arrivals_h, dtype=float),
        team=ints("team"),
        gpus=ints("gpus"),
        work_gpu_hours=floats("work"),
        workload=ints("workload"),
        priority=ints("priority"),
        deadline_h=floats("deadline"),
        checkpoint_h=floats("checkpoint"),
        checkpoint_scales=np.array(col["scales"], dtype=bool),
        save_h=floats("save"),
        restore_h=floats("restore"),
        checkpoint_gb=floats("gb"),
        spot=np.array(col["spot"], dtype=bool),
        choice=ints("choice"),
        home=ints("home"),
        memory_gib=floats("memory"),
        teams=tuple(teams),
        workloads=tuple(workloads),
        choice_sets=tuple(sets),
    )


@dataclass(frozen=True, slots=True)
class Outage:
    """A region (or, with ``region=None``, a whole provider) down from ``start_h`` to ``end_h``."""

    start_h: float
    end_h: float
    provider: str
    region: str | None = None


def draw_outages(catalog: Catalog, model: Outages, *, horizon_h: float, rng: np.random.Generator) -> tuple[Outage, ...]:
    """Outages over ``[0, horizon_h)``: Poisson counts, uniform starts, exponential durations."""
    places: list[tuple[str, str | None]] = list(dict.fromkeys((o.provider, o.region) for o in catalog.offers))
    units = [(p, r, model.region_per_day, model.region_hours) for p, r in places]
    units += [(p, None, model.provider_per_day, model.provider_hours) for p in catalog.providers]
    out = []
    for provider, region, per_day, mean_h in units:
        n = int(rng.poisson(per_day * horizon_h / 24.0))
        starts, lengths = rng.uniform(0.0, horizon_h, n), rng.exponential(mean_h, n)
        out += [Outage(float(s), float(s + d), provider, region) for s, d in zip(starts, lengths, strict=True)]
    return tuple(sorted(out, key=lambda o: (o.start_h, o.provider, o.region or "")))


__all__ = [
    "INF",
    "WORKLOAD_REFERENCE",
    "Bools",
    "ChoiceSet",
    "FailoverRule",
    "Floats",
    "Ints",
    "JobTable",
    "LogNormal",
    "Outage",
    "Outages",
    "WorkloadModel",
    "draw_outages",
    "generate_jobs",
    "jobs_from_specs",
    "load_workload",
    "parse_workload",
]
