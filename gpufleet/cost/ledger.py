"""The cost ledger: pure arithmetic from attempts and a rate card to GPU-hours and money.

Every second an attempt held its GPUs falls in exactly one bucket::

    wall = startup + restore + checkpoint + lost + useful

- ``startup``: process start to the first training step, restore excluded (imports, data), and
  the shut-down after a session ended on purpose (a preempted process exiting);
- ``restore``: reading and verifying the checkpoint it resumed from (also after a rollback);
- ``checkpoint``: time spent saving checkpoints;
- ``lost``: training that had to be redone: the work after the last durable checkpoint of an
  attempt that did not finish (preempted, killed, lost), plus the steps discarded by a rollback;
- ``useful``: the rest.

GPU-seconds are wall seconds times the attempt's GPUs. Money is GPU-hours times the rate card's
price for the attempt's (gpu_type, provider, spot); ``on_demand_money`` prices the same hours at
the on-demand rate, to show what spot saved (or cost, once preemption losses are counted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpufleet.cost.rates import RateCard

BUCKETS = ("useful", "lost", "checkpoint", "restore", "startup")


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptUsage:
    """What one attempt of one job used, as measured by the runtime and the backend."""

    job_id: int
    job_name: str
    team: str
    attempt: int
    gpu_type: str
    provider: str
    spot: bool
    gpus: int
    start: float
    """Unix time the attempt's process started."""
    end: float
    outcome: str
    """``completed``, ``preempted``, ``requeued``, ``failed``, ``cancelled``, ``lost`` or ``running``."""
    startup_s: float = 0.0
    restore_s: float = 0.0
    checkpoint_s: float = 0.0
    lost_s: float = 0.0
    steps_done: int = 0
    """Optimizer steps this attempt ran, redone ones included."""
    steps_redone: int = 0
    """Of ``steps_done``, the ones whose work was thrown away (rollback, or after the last
    durable checkpoint of an attempt that did not finish)."""
    first_step: int | None = None
    last_step: int | None = None
    checkpoints: tuple[float, ...] = ()
    """Unix times at which checkpoints became durable (for the timeline)."""
    rollbacks: tuple[float, ...] = ()
    """Unix times of rollbacks to the last healthy checkpoint (for the timeline)."""

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end - self.start)

    def seconds(self) -> dict[str, float]:
        """Wall seconds by bucket; ``useful`` absorbs the rest and is never negative."""
        overhead = {
            "lost": self.lost_s,
            "checkpoint": self.checkpoint_s,
            "restore": self.restore_s,
            "startup": self.startup_s,
        }
        spent = sum(overhead.values())
        scale = self.wall_s / spent if spent > self.wall_s and spent > 0 else 1.0
        out = {k: v * scale for k, v in overhead.items()}
        out["useful"] = max(0.0, self.wall_s - sum(out.values()))
        return out


@dataclass(frozen=True, slots=True)
class Cost:
    """GPU-hours by bucket, and money; the unit of every row in the ledger."""

    gpu_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    money: float = 0.0
    on_demand_money: float = 0.0
    attempts: int = 0
    preemptions: int = 0
    steps_redone: int = 0
    unpriced: tuple[str, ...] = ()

    @property
    def total_gpu_hours(self) -> float:
        return sum(self.gpu_hours.values())

    @property
    def lost_money(self) -> float:
        """Money spent on work that was redone (lost GPU-hours at the average rate)."""
        total = self.total_gpu_hours
        return self.money * self.gpu_hours["lost"] / total if total > 0 else 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            gpu_hours={k: self.gpu_hours[k] + other.gpu_hours[k] for k in BUCKETS},
            money=self.money + other.money,
            on_demand_money=self.on_demand_money + other.on_demand_money,
            attempts=self.attempts + other.attempts,
            preemptions=self.preemptions + other.preemptions,
            steps_redone=self.steps_redone + other.steps_redone,
            unpriced=tuple(sorted(set(self.unpriced) | set(other.unpriced))),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "gpu_hours": _sig(self.total_gpu_hours),
            "useful_gpu_hours": _sig(self.gpu_hours["useful"]),
            "lost_gpu_hours": _sig(self.gpu_hours["lost"]),
            "checkpoint_gpu_hours": _sig(self.gpu_hours["checkpoint"]),
            "restore_gpu_hours": _sig(self.gpu_hours["restore"]),
            "startup_gpu_hours": _sig(self.gpu_hours["startup"]),
            "money": _sig(self.money),
            "lost_money": _sig(self.lost_money),
            "on_demand_money": _sig(self.on_demand_money),
            "attempts": self.attempts,
            "preemptions": self.preemptions,
            "steps_redone": self.steps_redone,
            "unpriced": list(self.unpriced),
        }


def _sig(value: float, digits: int = 6) -> float:
    """Round to significant digits: a CPU demo costs millionths of a dollar, and that must show."""
    return float(f"{value:.{digits}g}")


def attempt_cost(usage: AttemptUsage, rates: RateCard) -> Cost:
    """Price one attempt. An attempt with no rate is counted in hours and listed as unpriced."""
    hours = {k: v * usage.gpus / 3600.0 for k, v in usage.seconds().items()}
    total = sum(hours.values())
    price = rates.price(usage.gpu_type, usage.provider, spot=usage.spot)
    on_demand = rates.price(usage.gpu_type, usage.provider, spot=False)
    key = f"{usage.gpu_type}/{usage.provider}/{'spot' if usage.spot else 'on-demand'}"
    return Cost(
        gpu_hours=hours,
        money=total * price if price is not None else 0.0,
        on_demand_money=total * (on_demand if on_demand is not None else price or 0.0),
        attempts=1,
        preemptions=1 if usage.outcome in ("preempted", "requeued", "lost") else 0,
        steps_redone=usage.steps_redone,
        unpriced=() if price is not None else (key,),
    )


def _total(costs: Iterable[Cost]) -> Cost:
    out = Cost()
    for cost in costs:
        out = out + cost
    return out


@dataclass(frozen=True, slots=True)
class Ledger:
    """Costs per job, per team, and in total."""

    jobs: dict[int, Cost]
    teams: dict[str, Cost]
    total: Cost
    currency: str


def build_ledger(usages: Sequence[AttemptUsage], rates: RateCard) -> Ledger:
    """Aggregate attempts into per-job, per-team and total costs."""
    per_attempt = [(u, attempt_cost(u, rates)) for u in usages]
    jobs: dict[int, Cost] = {}
    teams: dict[str, Cost] = {}
    for usage, cost in per_attempt:
        jobs[usage.job_id] = jobs.get(usage.job_id, Cost()) + cost
        teams[usage.team] = teams.get(usage.team, Cost()) + cost
    return Ledger(
        jobs=dict(sorted(jobs.items())),
        teams=dict(sorted(teams.items())),
        total=_total(c for _, c in per_attempt),
        currency=rates.currency,
    )
