"""A fleet the local backend runs: a catalogue whose offers are pools of virtual GPU slots.

``gpufleet fleet use FILE`` gives the local backend of one ``$GPUFLEET_HOME`` a fleet. The file is a
catalogue (docs/placement.md: ``gpu_types``, ``offers``, ``quotas``) with three more keys::

    pools:                                  # the offers the local backend has slots for
      - offer: aws/us-east-1/H100           # provider/region/gpu_type of an offer above
        slots: 2                            # virtual GPU slots (default: the offer's capacity_gpus)
        storms:                             # injected spot preemptions, seconds after `fleet use`
          - {start_s: 30, end_s: 90, preemptions_per_hour: 240}
        outages:                            # the whole pool goes away, then comes back
          - {start_s: 200, end_s: 260, abrupt: true}
    failover: {preemptions: 2, window_minutes: 10, cooldown_minutes: 30}
    seed: 0                                 # the storms' random draws

Without ``pools`` every offer is a pool of ``capacity_gpus`` slots. The catalogue the planner sees is
the pooled offers with their slots as capacity, so quotas are checked against what really exists.
A storm preempts the spot jobs of its pool as a Poisson process at its rate (the catalogue's
``spot_preemptions_per_hour`` stays what the planner *expects*; a storm is what *happens*). An outage
stops every job of the pool (with its grace, or at once when ``abrupt``) and blocks the pool until
it ends, like ``gpufleet fleet down``.

Validation names the bad item: a pool of an unknown offer, the same offer pooled twice, a window
that ends before it starts, a rate that is not finite or not physical, a quota larger than the
pooled slots it draws on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufleet.errors import UsageError
from gpufleet.placement.catalog import Catalog, Offer, parse_catalog
from gpufleet.placement.failover import FailoverPolicy
from gpufleet.yamlio import describe_validation, read_yaml

REFERENCE = "the fleet file format in docs/placement.md"
MAX_SLOTS = 4096
"""Virtual slots of one pool: each is a process slot on this machine."""
MAX_STORM_RATE = 3600.0 * 60
"""Preemptions per hour of a storm: at most one a second."""
MAX_SECONDS = 10 * 365 * 86400.0
FLEET_KEYS = ("pools", "failover", "seed")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class _Window(_Frozen):
    start_s: float = Field(ge=0, le=MAX_SECONDS)
    end_s: float = Field(gt=0, le=MAX_SECONDS)

    @model_validator(mode="after")
    def _ordered(self) -> _Window:
        if self.end_s <= self.start_s:
            raise ValueError(f"end_s {self.end_s:g} is not after start_s {self.start_s:g}: give end_s > start_s")
        return self

    def covers(self, seconds: float) -> bool:
        return self.start_s <= seconds < self.end_s


class Storm(_Window):
    """Spot preemptions at ``preemptions_per_hour`` on the pool's spot jobs, between the two times."""

    preemptions_per_hour: float = Field(gt=0, le=MAX_STORM_RATE)


class Outage(_Window):
    """The pool is gone between the two times: its jobs stop, nothing is placed there."""

    abrupt: bool = False
    """``True``: jobs are killed at once and lose the work since their last checkpoint."""


class Pool(_Frozen):
    offer: str
    """``provider/region/gpu_type`` of an offer of the catalogue."""
    slots: int | None = Field(default=None, ge=0, le=MAX_SLOTS)
    partition: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    """The pool's Slurm partition (default: the offer, ``aws/us-east-1/H100`` -> ``aws-us-east-1-h100``)."""
    storms: list[Storm] = Field(default_factory=list, max_length=1000)
    outages: list[Outage] = Field(default_factory=list, max_length=1000)


class FailoverRule(_Frozen):
    """``preemptions`` within ``window_minutes`` in one region block it for ``cooldown_minutes``."""

    preemptions: int = Field(default=3, ge=1, le=1_000_000)
    window_minutes: float = Field(default=60.0, gt=0, le=MAX_SECONDS / 60)
    cooldown_minutes: float = Field(default=60.0, gt=0, le=MAX_SECONDS / 60)

    def policy(self) -> FailoverPolicy:
        return FailoverPolicy(
            cooldown_hours=self.cooldown_minutes / 60,
            preemptions=self.preemptions,
            window_hours=self.window_minutes / 60,
        )


class _FleetPart(_Frozen):
    pools: list[Pool] | None = Field(default=None, max_length=10_000)
    failover: FailoverRule = Field(default_factory=FailoverRule)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)


@dataclass(frozen=True, slots=True)
class Fleet:
    """A validated fleet: the catalogue the planner sees (pooled offers, slots as capacity) and the pools."""

    catalog: Catalog
    pools: tuple[Pool, ...]
    failover: FailoverRule
    seed: int

    def pool(self, offer: str) -> Pool:
        for pool in self.pools:
            if pool.offer == offer:
                return pool
        raise UsageError(f"no pool for offer {offer!r}; pools: {', '.join(p.offer for p in self.pools)}")

    def offer(self, key: str) -> Offer:
        return self.catalog.offer(key)

    def region_of(self, offer: str) -> str:
        """``provider/region``: where a pool keeps its checkpoints."""
        o = self.catalog.offer(offer)
        return f"{o.provider}/{o.region}"

    def targets(self) -> list[str]:
        """Everything ``fleet down`` accepts: providers, provider/regions and offers, in file order."""
        seen: dict[str, None] = {}
        for o in self.catalog.offers:
            seen.update({o.provider: None, f"{o.provider}/{o.region}": None, o.key: None})
        return list(seen)

    def storm_rate(self, offer: str, seconds: float) -> float:
        """Injected preemptions per hour on the pool's spot jobs at ``seconds`` after the fleet began."""
        return sum(s.preemptions_per_hour for s in self.pool(offer).storms if s.covers(seconds))

    def outage(self, offer: str, seconds: float) -> Outage | None:
        for outage in self.pool(offer).outages:
            if outage.covers(seconds):
                return outage
        return None


def _pooled(catalog: Catalog, pools: Sequence[Pool], source: str) -> Catalog:
    by_key = {o.key: o for o in catalog.offers}
    seen: set[str] = set()
    offers: list[dict[str, Any]] = []
    for i, pool in enumerate(pools):
        where = f"{source}: pools[{i}].offer"
        if pool.offer not in by_key:
            raise UsageError(f"{where}: unknown offer {pool.offer!r}; offers: {', '.join(by_key)}")
        if pool.offer in seen:
            raise UsageError(f"{where}: offer {pool.offer!r} is pooled twice: merge the two pools")
        seen.add(pool.offer)
        offer = by_key[pool.offer].model_dump()
        if pool.slots is not None:
            offer["capacity_gpus"] = pool.slots
        offers.append(offer)
    return parse_catalog({**catalog.model_dump(), "offers": offers}, source=f"{source} (pooled offers)")


def parse_fleet(data: Any, source: str = "<fleet>") -> Fleet:
    """Validate a mapping as a fleet file; ``UsageError`` naming the bad item."""
    if not isinstance(data, dict):
        raise UsageError(f"{source}: a fleet file must be a YAML mapping, got {type(data).__name__}")
    catalog = parse_catalog({k: v for k, v in data.items() if k not in FLEET_KEYS}, source=source)
    try:
        part = _FleetPart.model_validate({k: v for k, v in data.items() if k in FLEET_KEYS})
    except ValidationError as err:
        raise UsageError(describe_validation(err, source, REFERENCE)) from None
    pools = part.pools if part.pools is not None else [Pool(offer=o.key) for o in catalog.offers]
    if not pools:
        raise UsageError(f"{source}: pools is empty: list at least one offer, or leave pools out to pool every offer")
    pooled = _pooled(catalog, pools, source)
    if sum(o.capacity_gpus for o in pooled.offers) == 0:
        raise UsageError(f"{source}: every pool has 0 slots: give at least one pool some slots")
    return Fleet(pooled, tuple(pools), part.failover, part.seed)


def load_fleet(path: str | Path) -> Fleet:
    """Read and validate a fleet file (untrusted input: bounded, ``yaml.safe_load`` only)."""
    path = Path(path)
    return parse_fleet(read_yaml(path, what="fleet file", error=UsageError), source=str(path))


__all__ = [
    "MAX_SLOTS",
    "MAX_STORM_RATE",
    "REFERENCE",
    "FailoverRule",
    "Fleet",
    "Outage",
    "Pool",
    "Storm",
    "load_fleet",
    "parse_fleet",
]
