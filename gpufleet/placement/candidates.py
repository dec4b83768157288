"""Which offers each job may use, at which rank: the catalogue as columns, preference shapes, offer groups.

Jobs with the same GPU type, choices (``any_of`` / ``ordered``) and failover home provider share a
*preference shape*: one row of offer ranks (lower wins, -1 no candidate), computed once. A shape's
candidates are offers of the GPU types its choices name, every other column of its jobs' rows is
``inf`` whatever the prices; shapes naming the same set of types share an :class:`OfferGroup`, the
offers of those types in catalogue order with the per class, per team and per provider tables cut
down to them. A block of expected costs is then jobs x the group's candidates rather than jobs x
every candidate (a third of the cells with four GPU types, fewer with more), and the choice loop
scans a few hundred columns. Candidates stay in ascending order, so an argmin's tie still goes to
the lowest catalogue index, as over the whole row.

Private to the placement package; :mod:`gpufleet.placement.costing` builds its tables from these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gpufleet.placement.catalog import Catalog
from gpufleet.spec import JobSpec, OfferChoice

F8 = npt.NDArray[np.float64]
I8 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
Ranks = npt.NDArray[np.signedinteger[Any]]


@dataclass(eq=False)
class OfferColumns:
    """The catalogue's offers as columns (index ``o``); candidate ``c`` is offer ``c // 2``, spot if odd."""

    type_name: npt.NDArray[np.str_]
    provider_name: npt.NDArray[np.str_]
    region_name: npt.NDArray[np.str_]
    provider: I8
    gpus_per_node: I8
    on_demand: F8
    spot: F8
    rate: F8
    memory: F8
    blocked: B
    masks: dict[tuple[str, str | None, str | None], B] = field(default_factory=dict)
    """Offers of a (GPU type, provider, region) choice: thousands of preference shapes share a few hundred."""

    def matching(self, gpu_type: str, provider: str | None, region: str | None) -> B:
        """Which offers a choice matches (``None``: any provider or region); computed once per choice."""
        key = (gpu_type, provider, region)
        mask = self.masks.get(key)
        if mask is None:
            mask = self.type_name == gpu_type
            if provider is not None:
                mask &= self.provider_name == provider
            if region is not None:
                mask &= self.region_name == region
            self.masks[key] = mask
        return mask

    @classmethod
    def of(cls, catalog: Catalog, blocked: Sequence[bool]) -> OfferColumns:
        """``blocked``: per offer, whether a block target covers it."""
        offers, providers = catalog.offers, {p: i for i, p in enumerate(catalog.providers)}
        return cls(
            type_name=np.array([o.gpu_type for o in offers], dtype=str),
            provider_name=np.array([o.provider for o in offers], dtype=str),
            region_name=np.array([o.region for o in offers], dtype=str),
            provider=np.array([providers[o.provider] for o in offers], dtype=np.int64),
            gpus_per_node=np.array([o.gpus_per_node for o in offers], dtype=np.int64),
            on_demand=np.array([o.on_demand_per_gpu_hour for o in offers], dtype=float),
            spot=np.array([np.nan if o.spot_per_gpu_hour is None else o.spot_per_gpu_hour for o in offers]),
            rate=np.array([o.spot_preemptions_per_hour for o in offers], dtype=float),
            memory=np.array([catalog.gpu_types[o.gpu_type].memory_gib for o in offers], dtype=float),
            blocked=np.array(blocked, dtype=bool),
        )


@dataclass(frozen=True, eq=False)
class OfferGroup:
    """The offers of one set of GPU types (``m`` of them) and the planner's tables restricted to them."""

    types: tuple[str, ...]
    offers: I8  # (m,) offer indices, ascending
    candidates: I8  # (2m,) candidate indices, ascending: 2o (on demand) and 2o + 1 (spot) of each offer
    tiers: Ranks  # (S_g, m) offer ranks of the group's preference shapes, -1 not a candidate
    unit_cost: F8  # (K, 2m) cost per unit of work, inf when out
    unit_hours: F8  # (K, m) compute hours per unit of work
    stretch: F8  # (K, m) 1 / (1 - preemption loss)
    alloc: I8  # (K, 2m) GPUs rented
    resources: I8  # (T, 2m) quota row per team
    shut: B  # (T, m) the team has no quota row there, or the offer is blocked
    leaving: F8  # (P + 1, m) egress price per GB from each provider


def cut_group(types: tuple[str, ...], offers: I8, tiers: Ranks, tables: Mapping[str, npt.NDArray[Any]]) -> OfferGroup:
    """The group of ``offers``: each of ``tables`` (``OfferGroup`` fields by name, per offer ``(.., O)``
    or per candidate ``(.., 2 O)``) cut to its columns, contiguous."""
    candidates = np.stack([2 * offers, 2 * offers + 1], axis=-1).reshape(-1)
    n_offers = len(tables["leaving"][0])

    def cut(name: str) -> npt.NDArray[Any]:
        table = tables[name]
        return np.ascontiguousarray(table[:, offers] if table.shape[1] == n_offers else table[:, candidates])

    return OfferGroup(
        types=types,
        offers=offers,
        candidates=candidates,
        tiers=tiers,
        unit_cost=cut("unit_cost"),
        unit_hours=cut("unit_hours"),
        stretch=cut("stretch"),
        alloc=cut("alloc"),
        resources=cut("resources"),
        shut=cut("shut"),
        leaving=cut("leaving"),
    )


def _tiers(job: JobSpec, cols: OfferColumns, home: int | None, tier: Ranks) -> None:
    """Fill ``tier`` (per offer, preset to -1): the offer's rank among the job's preferences (lower
    wins), -1 when it is no candidate.

    With ``ordered`` the rank is the index of the first choice the offer matches, otherwise 0.
    With a failover ``home`` provider index, ranks become ``2 * rank + (offer not at home)``.
    """
    p = job.placement
    choices = p.ordered or p.any_of or [OfferChoice()]
    for i, choice in enumerate(choices):
        mask = cols.matching(choice.gpu_type or job.resources.gpu_type, choice.provider, choice.region) & (tier < 0)
        tier[mask] = i if p.ordered else 0
    if home is not None:
        np.copyto(tier, tier * 2 + (cols.provider != home), where=tier >= 0)


def _rank_dtype(most_choices: int) -> np.dtype[Any]:
    """The narrowest signed integer that holds every rank (``2 * choices - 1`` with a home provider) and -1:
    there is a row of ranks per preference shape, and a batch may have a shape per job."""
    return np.result_type(np.int8, np.min_scalar_type(2 * max(1, most_choices)))


def index(keys: Sequence[Any]) -> tuple[list[Any], I8]:
    """Distinct keys in first-seen order, and each item's position among them."""
    seen: dict[Any, int] = {}
    rows = np.array([seen.setdefault(k, len(seen)) for k in keys], dtype=np.int64)
    return list(seen), rows


@dataclass(frozen=True, eq=False)
class Preferences:
    """Every job's preference shape and offer group; the ranks live in the groups."""

    group_types: list[tuple[str, ...]]
    """The GPU types of each group, in order of first appearance."""
    group_offers: list[I8]
    group_tiers: list[Ranks]
    job_group: I8  # (J,) group of each job
    job_slot: I8  # (J,) row of the job's shape in its group's ``tiers``
    ranked: B  # (J,) more than one rank among the job's candidates


def preferences(
    jobs: Sequence[JobSpec], cols: OfferColumns, providers: list[str], stay: Mapping[str, str]
) -> Preferences:
    """Each job's preference shape (GPU type, choices, failover home), grouped by the GPU types it names."""
    shapes, shape_of = index(
        [(j.resources.gpu_type, bool(j.placement.ordered),
          tuple((c.gpu_type, c.provider, c.region) for c in j.placement.ordered or j.placement.any_of),
          stay.get(j.name))
         for j in jobs]
    )  # fmt: skip
    group_types, shape_group = index([tuple(sorted({c[0] or s[0] for c in s[2]} or {s[0]})) for s in shapes])
    dtype = _rank_dtype(max((len(s[2]) for s in shapes), default=1))
    first: dict[int, int] = {}
    for i, s in enumerate(shape_of.tolist()):
        first.setdefault(s, i)
    home = {p: i for i, p in enumerate(providers)}
    row = np.empty(len(cols.provider), dtype=dtype)
    shape_slot = np.zeros(len(shapes), dtype=np.int64)
    group_offers, group_tiers, ranked = [], [], np.zeros(len(shapes), dtype=bool)
    for g, types in enumerate(group_types):
        offers = np.flatnonzero(np.isin(cols.type_name, types))
        members = np.flatnonzero(shape_group == g)
        tiers = np.empty((len(members), len(offers)), dtype=dtype)
        for slot, s in enumerate(members.tolist()):
            row.fill(-1)
            _tiers(jobs[first[s]], cols, None if shapes[s][3] is None else home.get(shapes[s][3]), row)
            tiers[slot] = row[offers]
        lowest = np.where(tiers >= 0, tiers, np.iinfo(dtype).max).min(axis=1, initial=np.iinfo(dtype).max)
        ranked[members] = tiers.max(axis=1, initial=-1) > lowest
        shape_slot[members] = np.arange(len(members))
        group_offers.append(offers)
        group_tiers.append(tiers)
    return Preferences(
        group_types=group_types,
        group_offers=group_offers,
        group_tiers=group_tiers,
        job_group=shape_group[shape_of],
        job_slot=shape_slot[shape_of],
        ranked=ranked[shape_of],
    )


__all__ = ["OfferColumns", "OfferGroup", "Preferences", "cut_group", "index", "preferences"]
