"""A fleet on Slurm: pools become partitions, team quotas become QOS limits that Slurm enforces.

The fleet file in use (``gpufleet fleet use FILE``, docs/placement.md) means on Slurm:

- each pool is a **partition**, named by the pool's ``partition:`` or after its offer
  (``aws/us-east-1/H100`` -> ``aws-us-east-1-h100``);
- each team quota is a **QOS** ``gf-<team>-<gpu type>`` (``-<provider>`` when the quota names one)
  with ``GrpTRES=gres/gpu=<nominal>``, in the team account's QOS list: Slurm itself holds a job
  that would take the team over its quota, pending with the reason ``QOSGrpGRES``.

``gpufleet slurm fleet`` prints the ``slurm.conf`` lines and the ``scontrol``/``sacctmgr`` commands
(``--apply`` runs them). ``gpufleet submit --backend slurm`` then asks the planner for the offer
(cheapest expected cost within the job's ``placement``; the next feasible one when the team's
quota or the pool is full with gpufleet's own running jobs, as on the local backend), and passes
that pool's partition, the quota's QOS and ``--gres=gpu:N`` to sbatch. The ``placed`` event and the
ledger price the job at the offer's rate.

Not mapped: Kueue's cohorts. ``GrpTRES`` is a hard cap at the nominal quota, so on Slurm a team
neither borrows nor lends, and nothing is reclaimed; a job larger than its team's nominal quota
would pend forever and is refused at submit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.backends.pools import active_fleet, explain_choice, placed_from, planning_name, read_marks
from gpufleet.errors import UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store
from gpufleet.placement.catalog import WILDCARD, Offer, Quota
from gpufleet.placement.fleetfile import Fleet
from gpufleet.placement.planner import Allocation, plan
from gpufleet.spec import JobSpec

QOS_PREFIX = "gf-"
PARTITION_FLAGS = ("PriorityTier=1", "PreemptMode=REQUEUE", "State=UP")
"""A pool's partition: preemptible like the dev cluster's ``low`` (a ``high`` job requeues its jobs)."""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-")


def partition_of(fleet: Fleet, offer: str) -> str:
    """The Slurm partition of the pool of ``offer``."""
    pool = fleet.pool(offer)
    return pool.partition or _slug(offer)


def qos_of(quota: Quota) -> str:
    """The QOS that carries a team quota's limit."""
    parts = [quota.team, quota.gpu_type] + ([] if quota.provider == WILDCARD else [quota.provider])
    return QOS_PREFIX + "-".join(_slug(p) for p in parts)


def quota_for(fleet: Fleet, team: str, offer: Offer) -> Quota | None:
    """The quota row that governs ``team`` on ``offer`` (its own provider's row first, then ``*``)."""
    rows = [q for q in fleet.catalog.quotas if q.team == team and q.gpu_type == offer.gpu_type]
    return next((q for q in rows if q.provider == offer.provider), None) or next(
        (q for q in rows if q.provider == WILDCARD), None
    )


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    offer: str
    gpus: int


@dataclass(frozen=True, slots=True)
class QosLimit:
    name: str
    team: str
    gpu_type: str
    provider: str
    gpus: int


@dataclass(frozen=True, slots=True)
class SlurmFleet:
    """What a fleet file asks of a Slurm cluster."""

    partitions: tuple[Partition, ...]
    qos: tuple[QosLimit, ...]

    @property
    def teams(self) -> list[str]:
        return list(dict.fromkeys(q.team for q in self.qos))

    def to_dict(self) -> dict[str, Any]:
        return {
            "partitions": [{"name": p.name, "offer": p.offer, "gpus": p.gpus} for p in self.partitions],
            "qos": [
                {"name": q.name, "team": q.team, "gpu_type": q.gpu_type, "provider": q.provider, "grp_gpus": q.gpus}
                for q in self.qos
            ],
        }


def slurm_fleet(fleet: Fleet) -> SlurmFleet:
    partitions = tuple(Partition(partition_of(fleet, o.key), o.key, o.capacity_gpus) for o in fleet.catalog.offers)
    names = [p.name for p in partitions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"pools share the Slurm partition {twice[0]!r}: give each pool its own `partition:`")
    qos = tuple(QosLimit(qos_of(q), q.team, q.gpu_type, q.provider, q.nominal) for q in fleet.catalog.quotas)
    return SlurmFleet(partitions, qos)


def partition_lines(sf: SlurmFleet, nodes: str) -> list[str]:
    """The ``slurm.conf`` lines of the pools' partitions, over ``nodes`` (a hostlist, or ``ALL``)."""
    return [f"PartitionName={p.name} Nodes={nodes} {' '.join(PARTITION_FLAGS)}" for p in sf.partitions]


Runner = Callable[[Sequence[str]], Any]
"""Runs one Slurm command and returns its completed process (``run_slurm``)."""


@dataclass(frozen=True, slots=True)
class ClusterHas:
    """The partitions, accounts and QOS a cluster has already."""

    partitions: frozenset[str] = frozenset()
    accounts: frozenset[str] = frozenset()
    qos: frozenset[str] = frozenset()

    @staticmethod
    def ask(run: Runner) -> ClusterHas:
        def lines(argv: Sequence[str]) -> list[str]:
            return [line.strip() for line in str(run(argv).stdout).splitlines() if line.strip()]

        names = {
            m.group(1)
            for m in (re.match(r"PartitionName=(\S+)", x) for x in lines(["scontrol", "-o", "show", "partition"]))
            if m
        }
        return ClusterHas(
            partitions=frozenset(names),
            accounts=frozenset(lines(["sacctmgr", "-n", "-P", "show", "account", "format=account"])),
            qos=frozenset(lines(["sacctmgr", "-n", "-P", "show", "qos", "format=name"])),
        )


def fleet_commands(sf: SlurmFleet, has: ClusterHas, *, nodes: str, cluster: str, user: str) -> list[list[str]]:
    """The commands that make a cluster that ``has`` what it has match ``sf`` (what exists is updated, not re-added)."""
    todo: list[list[str]] = []
    for p in sf.partitions:
        verb = "update" if p.name in has.partitions else "create"
        todo.append(["scontrol", verb, f"PartitionName={p.name}", f"Nodes={nodes}", *PARTITION_FLAGS])
    for team in sf.teams:
        if team not in has.accounts:
            about = f"Description=gpufleet team {team}"
            todo.append(["sacctmgr", "-i", "add", "account", team, f"cluster={cluster}", about])
            todo.append(["sacctmgr", "-i", "add", "user", user, f"account={team}", f"cluster={cluster}"])
    for q in sf.qos:
        if q.name not in has.qos:
            todo.append(["sacctmgr", "-i", "add", "qos", q.name])
        todo.append(["sacctmgr", "-i", "modify", "qos", "where", f"name={q.name}", "set", f"GrpTRES=gres/gpu={q.gpus}"])
        where = ["where", f"name={q.team}", f"cluster={cluster}"]
        todo.append(["sacctmgr", "-i", "modify", "account", *where, "set", f"qos+={q.name}"])
    return todo


# ---- submit ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmPlacement:
    """Where a job of a fleet goes on Slurm, and the ``placed`` event that says why."""

    partition: str
    qos: str | None
    event: dict[str, Any]


def _held(store: Store, fleet: Fleet) -> list[Allocation]:
    """GPUs gpufleet's own Slurm jobs of this fleet hold or wait for: what the planner sees as taken."""
    keys = {o.key for o in fleet.catalog.offers}
    held = []
    for job in store.jobs(states=("queued", "running")):
        if job.backend != "slurm":
            continue
        placed = store.last_event(job.id, EventKind.PLACED)
        if placed is None or placed.data.get("offer") not in keys:
            continue
        held.append(Allocation(team=job.team, offer=str(placed.data["offer"]), gpus=job.spec.total_gpus))
    return held


def place_on_slurm(home: Path, store: Store, job_id: int, spec: JobSpec) -> SlurmPlacement | None:
    """The partition and QOS of a job when this home uses a fleet (``None`` without one, or for a CPU job)."""
    fleet = active_fleet(home)
    if fleet is None or spec.total_gpus <= 0:
        return None
    name = planning_name(job_id)
    mine = spec.copy_with(name=name)
    blocked = sorted(read_marks(home).down)
    result = plan([mine], fleet.catalog, blocked=blocked, running=_held(store, fleet))
    decision = result.decision(name)
    waits = ""
    if decision.choice is None:  # full with our own jobs: wait in Slurm's queue of the offer it would pick empty
        result = plan([mine], fleet.catalog, blocked=blocked)
        decision = result.decision(name)
        waits = "; every pool is full with gpufleet's jobs: it waits in Slurm's queue of the empty fleet's pick"
    choice = decision.choice
    if choice is None:
        reasons = "; ".join(decision.reasons) or "no offer matches"
        raise UsageError(f"job {spec.name!r} fits no pool of the fleet even when it is empty: {reasons}")
    offer = fleet.offer(choice.offer)
    quota = quota_for(fleet, spec.team, offer)
    if quota is not None and spec.total_gpus > quota.nominal:
        raise UsageError(
            f"job {spec.name!r} needs {spec.total_gpus} GPUs but team {spec.team}'s {quota.gpu_type} quota on Slurm is "
            f"{quota.nominal} (QOS {qos_of(quota)}, GrpTRES=gres/gpu={quota.nominal}; Slurm does not lend within a "
            "cohort): ask for fewer GPUs or raise the quota's nominal"
        )
    partition = partition_of(fleet, choice.offer)
    qos = qos_of(quota) if quota is not None else None
    why = f"{explain_choice(result, name)}{waits}; partition {partition}, QOS {qos or '-'}"
    placed = placed_from(choice, fleet, spec.team, why)
    return SlurmPlacement(partition, qos, {**placed.to_event(), "partition": partition, "qos": qos})


__all__ = [
    "ClusterHas",
    "Partition",
    "QosLimit",
    "SlurmFleet",
    "SlurmPlacement",
    "fleet_commands",
    "partition_lines",
    "partition_of",
    "place_on_slurm",
    "qos_of",
    "quota_for",
    "slurm_fleet",
]
