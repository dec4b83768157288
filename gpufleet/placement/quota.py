"""Team quotas with Kueue's semantics: nominal, borrowing limit, lending limit, cohort.

Each team is one Kueue ClusterQueue and each (GPU type, provider) one resource flavor; a quota row
with ``provider: "*"`` covers every provider of its type that has no row of its own for the team.
For one team and one flavor (``kueue.x-k8s.io/v1beta1`` ClusterQueue ``resourceGroups``):

- the team may always use up to its ``nominal`` GPUs, unless it lent them out first;
- beyond that it borrows the unused nominal of the other teams in its ``cohort``, up to its
  ``borrowing_limit`` above nominal (``None``: no limit); a team without a cohort never borrows;
- a team lends at most ``lending_limit`` of its nominal (``None``: all of it). The rest,
  ``nominal - lending_limit``, is guaranteed to it and never borrowed by anyone.

So the cohort shares a pool of ``sum(lendable)`` GPUs, where ``lendable`` is the lending limit, or
the nominal when unset. A team draws on the pool for whatever it uses beyond its guaranteed part,
and the sum of draws never exceeds the pool: that is how no lender ever lends more than its limit.
A flavor that no quota row mentions is ungoverned (capacity is the only limit); a governed flavor
admits nothing for a team that has no row for it, as in Kueue.

:class:`QuotaBook` holds the usage while one plan is built: it is the only mutable object in the
planner, created and thrown away inside ``plan()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.placement.catalog import WILDCARD, Quota

UNGOVERNED = -1
"""Resource id of a flavor no quota row mentions."""
NO_QUOTA = -2
"""Resource id of a governed flavor for which the team has no row."""


@dataclass(frozen=True, slots=True)
class Admission:
    """How a placement fits the team's quota: GPUs within nominal, GPUs borrowed from the cohort."""

    quota: str
    nominal_gpus: int
    borrowed_gpus: int

    def to_dict(self) -> dict[str, Any]:
        return {"quota": self.quota, "nominal_gpus": self.nominal_gpus, "borrowed_gpus": self.borrowed_gpus}


def _lendable(q: Quota) -> int:
    return q.nominal if q.lending_limit is None else q.lending_limit


class QuotaBook:
    """Usage of every quota row while jobs are admitted one by one (O(1) per check)."""

    def __init__(self, quotas: Sequence[Quota]) -> None:
        self.quotas = list(quotas)
        self.usage = [0] * len(self.quotas)
        self._index = {(q.team, q.gpu_type, q.provider): i for i, q in enumerate(self.quotas)}
        self._governed = {(q.gpu_type, q.provider) for q in self.quotas}
        self._guaranteed = [q.nominal - _lendable(q) for q in self.quotas]
        pools: dict[tuple[str, str, str], int] = {}
        self._pool = [-1] * len(self.quotas)
        for i, q in enumerate(self.quotas):
            if q.cohort is not None:
                self._pool[i] = pools.setdefault((q.cohort, q.gpu_type, q.provider), len(pools))
        self._pool_size = [0] * len(pools)
        self._pool_drawn = [0] * len(pools)
        for i, q in enumerate(self.quotas):
            if self._pool[i] >= 0:
                self._pool_size[self._pool[i]] += _lendable(q)

    def resource(self, team: str, gpu_type: str, provider: str) -> int:
        """The quota row governing ``team`` on this flavor, :data:`UNGOVERNED` or :data:`NO_QUOTA`."""
        for prov in (provider, WILDCARD):
            i = self._index.get((team, gpu_type, prov))
            if i is not None:
                return i
        if (gpu_type, provider) in self._governed or (gpu_type, WILDCARD) in self._governed:
            return NO_QUOTA
        return UNGOVERNED

    def headroom(self, i: int) -> int:
        """GPUs the row's team can still be admitted on it (own nominal plus what it may borrow)."""
        q, used, pool = self.quotas[i], self.usage[i], self._pool[i]
        if pool < 0:
            return max(0, q.nominal - used)
        room = self._pool_size[pool] - self._pool_drawn[pool] + max(0, self._guaranteed[i] - used)
        if q.borrowing_limit is not None:
            room = min(room, q.nominal + q.borrowing_limit - used)
        return max(0, room)

    def why_not(self, i: int, gpus: int) -> str | None:
        """``None`` when ``gpus`` more fit on row ``i``, else the reason in words."""
        room = self.headroom(i)
        if gpus <= room:
            return None
        q, used = self.quotas[i], self.usage[i]
        if q.cohort is None:
            return f"quota {q.label}: {used} of nominal {q.nominal} in use, no cohort to borrow from"
        if q.borrowing_limit is not None and used + gpus > q.nominal + q.borrowing_limit:
            return (
                f"quota {q.label}: {used} in use, +{gpus} passes nominal {q.nominal} + borrowing limit "
                f"{q.borrowing_limit}"
            )
        return f"quota {q.label}: {used} in use, cohort {q.cohort} has only {room} GPUs left for it"

    def hold(self, i: int, gpus: int) -> None:
        """Record ``gpus`` on row ``i`` without checking (GPUs already held; negative releases)."""
        used = self.usage[i]
        new = max(0, used + gpus)
        self.usage[i] = new
        pool = self._pool[i]
        if pool >= 0:
            g = self._guaranteed[i]
            self._pool_drawn[pool] += max(0, new - g) - max(0, used - g)

    def admit(self, i: int, gpus: int) -> Admission:
        """Record ``gpus`` more on row ``i``; :class:`ValueError` when they do not fit (check first)."""
        reason = self.why_not(i, gpus)
        if reason is not None:
            raise ValueError(reason)
        q, used = self.quotas[i], self.usage[i]
        own = min(gpus, max(0, q.nominal - used))
        self.hold(i, gpus)
        return Admission(q.label, own, gpus - own)

    def release(self, i: int, gpus: int) -> None:
        """Give back ``gpus`` on row ``i`` (a job ended or moved)."""
        self.hold(i, -gpus)


__all__ = ["NO_QUOTA", "UNGOVERNED", "Admission", "QuotaBook"]
