"""The fleet simulator's placement policies: how a job's options are ranked.

An option is an offer in one market, ``2 * offer`` on-demand and ``2 * offer + 1`` spot, indices
into a :class:`Fleet` (the catalogue compiled to indices, with the price of each option). A
:class:`Policy` ranks a job's options from its :class:`Need` alone, never from the fleet's state,
so :mod:`gpufleet.placement.simulate` ranks once per kind of job and starts the first option that
fits now. Four are built in: ``cheapest``, ``on_demand``, ``ordered`` and ``spot_failover``;
``register`` adds a subclass to ``POLICIES``, the names ``--policy`` accepts.

They are apart from the engine so that a policy is read, written and tested against this module
only: a new one is a small subclass of :class:`Policy`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from gpufleet.errors import UsageError
from gpufleet.placement.catalog import Catalog, Offer
from gpufleet.placement.quota import NO_QUOTA, QuotaBook
from gpufleet.placement.workload import ChoiceSet, FailoverRule, WorkloadModel
from gpufleet.spec import OfferChoice


@dataclass(frozen=True, slots=True)
class Fleet:
    """The catalogue compiled to indices. Option ``2 * i`` is offer ``i`` on-demand, ``2 * i + 1`` spot."""

    catalog: Catalog
    region: tuple[str, ...]
    """``provider/region`` of each offer."""
    price: tuple[float, ...]
    """Per option; ``nan`` for spot where there is no spot market."""
    whole_nodes: bool = False

    @classmethod
    def of(cls, catalog: Catalog, *, whole_nodes: bool = False) -> Fleet:
        price: list[float] = []
        for o in catalog.offers:
            price += [o.on_demand_per_gpu_hour, math.nan if o.spot_per_gpu_hour is None else o.spot_per_gpu_hour]
        regions = tuple(f"{o.provider}/{o.region}" for o in catalog.offers)
        return cls(catalog, regions, tuple(price), whole_nodes)

    def rented(self, offer: int, gpus: int) -> int:
        """GPUs a job of ``gpus`` holds on an offer: whole nodes, or exactly ``gpus`` in a pooled fleet."""
        per_node = self.catalog.offers[offer].gpus_per_node
        return -(-gpus // per_node) * per_node if self.whole_nodes else gpus

    def unit_price(self, option: int, need: Need) -> float:
        """Price per reference GPU-hour of work, idle GPUs of a partly used node included (the planner's cost)."""
        offer = self.catalog.offers[option >> 1]
        rate = (self.catalog.throughput(offer.gpu_type, need.workload) or math.nan) * need.gpus
        return self.price[option] * self.rented(option >> 1, need.gpus) / rate


@dataclass(frozen=True, slots=True)
class Need:
    """What a policy ranks options for: a job's requirements and, for history-aware policies, its past."""

    team: str
    gpus: int
    workload: str
    spot: bool
    choice: ChoiceSet
    memory_gib: float = 0.0
    home: str | None = None
    last_provider: str | None = None
    avoid: frozenset[str] = frozenset()
    """``provider/region`` names the job stays away from for now."""


def _matches(c: OfferChoice, offer: Offer) -> bool:
    return all(
        want is None or want == have
        for want, have in ((c.gpu_type, offer.gpu_type), (c.provider, offer.provider), (c.region, offer.region))
    )


def eligible(fleet: Fleet, need: Need, book: QuotaBook) -> list[int]:
    """Offers the job can ever use: its GPU type or choices, a throughput, the memory, the capacity, a quota row."""
    cat, cs = fleet.catalog, need.choice
    return [
        i
        for i, o in enumerate(cat.offers)
        if (cs.gpu_type is None or o.gpu_type == cs.gpu_type)
        and (not cs.choices or any(_matches(c, o) for c in cs.choices))
        and cat.throughput(o.gpu_type, need.workload)
        and cat.gpu_types[o.gpu_type].memory_gib >= need.memory_gib
        and o.capacity_gpus >= fleet.rented(i, need.gpus)
        and book.resource(need.team, o.gpu_type, o.provider) != NO_QUOTA
    ]


class Policy(ABC):
    """Ranks a job's options (``2 * offer + spot``); the simulator starts the first that fits now.

    A policy sees a :class:`Need`, never the fleet's state, so its ranking is cached per kind of
    job. ``uses_history`` asks for ``Need.last_provider`` and ``Need.avoid``; a ``failover`` rule
    makes the simulator keep interrupted jobs, and after outages or bursts of preemptions every job,
    away from a region for a while.
    """

    name: ClassVar[str]
    uses_history: ClassVar[bool] = False

    def __init__(self, workload: WorkloadModel | None = None) -> None:
        self.workload = workload or WorkloadModel()
        self.failover: FailoverRule | None = None

    @abstractmethod
    def options(self, fleet: Fleet, need: Need, book: QuotaBook) -> tuple[int, ...]:
        """Options in order of preference."""


POLICIES: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name`` (``--policy``)."""
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str, workload: WorkloadModel | None = None) -> Policy:
    """The policy called ``name``; ``UsageError`` listing the valid names otherwise."""
    if name not in POLICIES:
        raise UsageError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name](workload)


def _by_price(fleet: Fleet, need: Need, options: Iterable[int]) -> list[int]:
    return sorted(options, key=lambda o: (fleet.unit_price(o, need), o))


def _markets(fleet: Fleet, offer: int, spot: bool) -> list[int]:
    return [2 * offer + 1, 2 * offer] if spot and not math.isnan(fleet.price[2 * offer + 1]) else [2 * offer]


@register
class Cheapest(Policy):
    """The cheapest option per unit of work, spot when the job allows it; no memory of preemptions."""

    name = "cheapest"

    def options(self, fleet: Fleet, need: Need, book: QuotaBook) -> tuple[int, ...]:
        return tuple(
            _by_price(fleet, need, (m for i in eligible(fleet, need, book) for m in _markets(fleet, i, need.spot)))
        )


@register
class OnDemand(Policy):
    """The cheapest on-demand option: never preempted, always the full price."""

    name = "on_demand"

    def options(self, fleet: Fleet, need: Need, book: QuotaBook) -> tuple[int, ...]:
        return tuple(_by_price(fleet, need, (2 * i for i in eligible(fleet, need, book))))


@register
class Ordered(Policy):
    """SkyPilot's ``ordered``: the job's ``placement.ordered`` list, else its team's preference list,
    else the catalogue's own order; the first listed offer with room, spot before on-demand."""

    name = "ordered"

    def options(self, fleet: Fleet, need: Need, book: QuotaBook) -> tuple[int, ...]:
        prefs = need.choice.choices if need.choice.ordered else self.workload.team_preferences.get(need.team, [])
        offers = eligible(fleet, need, book)
        groups = [[i for i in offers if _matches(c, fleet.catalog.offers[i])] for c in prefs] if prefs else [offers]
        ranked: dict[int, None] = {}
        for group in groups:
            hits = _by_price(fleet, need, (2 * i for i in group)) if prefs else [2 * i for i in group]
            ranked.update((m, None) for o in hits for m in _markets(fleet, o >> 1, need.spot))
        return tuple(ranked)


@register
class SpotFailover(Policy):
    """Spot first, as SkyPilot's EAGER_NEXT_REGION recovery and :mod:`gpufleet.placement.failover`: a
    job preempted or killed in a region avoids it (spot and on-demand) for the cool-down and tries
    the next region of its provider, then the next provider (cheapest first), then on-demand,
    cheapest first; an outage, or a burst of preemptions, keeps every job away from the region."""

    name = "spot_failover"
    uses_history = True

    def __init__(self, workload: WorkloadModel | None = None) -> None:
        super().__init__(workload)
        self.failover = self.workload.failover

    def options(self, fleet: Fleet, need: Need, book: QuotaBook) -> tuple[int, ...]:
        offers = [i for i in eligible(fleet, need, book) if fleet.region[i] not in need.avoid]
        spot = [2 * i + 1 for i in offers if need.spot and not math.isnan(fleet.price[2 * i + 1])]
        spot = _by_price(fleet, need, spot)
        first = need.last_provider or need.home
        providers = list(dict.fromkeys([first, *(fleet.catalog.offers[o >> 1].provider for o in spot)]))
        rank = {p: i for i, p in enumerate(providers)}
        spot.sort(key=lambda o: rank[fleet.catalog.offers[o >> 1].provider])
        return (*spot, *_by_price(fleet, need, (2 * i for i in offers)))


__all__ = [
    "POLICIES",
    "Cheapest",
    "Fleet",
    "Need",
    "OnDemand",
    "Ordered",
    "Policy",
    "SpotFailover",
    "eligible",
    "make_policy",
    "register",
]
