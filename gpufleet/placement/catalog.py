"""The offer catalogue: what each provider sells, at what price, and who may use how much of it.

A catalogue is a dated snapshot, written by hand from the providers' pricing pages and the
fleet's contracts, and read as untrusted YAML (``yaml.safe_load``, pydantic, unknown fields are
errors)::

    as_of: 2026-12-01
    currency: USD
    gpu_types:
      H100: {memory_gib: 80, throughput: {training: 1.0, finetune: 1.0}}
      L40S: {memory_gib: 48, throughput: {training: 0.35, finetune: 0.55}}
    offers:
      - {provider: aws, region: us-east-1, gpu_type: H100, gpus_per_node: 8,
         on_demand_per_gpu_hour: 3.93, spot_per_gpu_hour: 2.10, capacity_gpus: 64,
         spot_preemptions_per_hour: 0.05, egress_per_gb: 0.09}
    quotas:
      - {team: perception, gpu_type: H100, provider: "*", nominal: 32, borrowing_limit: 16,
         lending_limit: 8, cohort: research}

Throughput is *relative* per workload class: ``1.0`` is the reference GPU, so a job's
``placement.gpu_hours`` divided by the throughput is its GPU-hours on that type. Quotas follow
Kueue's ClusterQueue model (nominal, borrowingLimit, lendingLimit, cohort), counted in GPUs; one
team is one ClusterQueue, so all of a team's quotas share one cohort.

Validation rejects what would make a plan silently wrong, naming the item: a number outside its
physical range (:data:`MAX_GPUS` GPUs, relative throughput from :data:`MIN_THROUGHPUT` to
:data:`MAX_THROUGHPUT`, at most :data:`MAX_MEMORY_GIB` of GPU memory: a denormal throughput or
a 20-digit capacity would end as infinite costs or an overflow; an absurd price is the planner's
``cost_not_finite``), a negative price, a spot price above on-demand (an error, not a warning: it almost
always means swapped columns, and a spot market dearer than on-demand is never worth choosing, so
write ``spot_per_gpu_hour: null``), an unknown GPU type, a duplicate offer, a quota larger than
the capacity it draws on, and a lending limit above the nominal quota.
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from gpufleet.errors import UsageError
from gpufleet.paths import NAME_HINT, NAME_RE
from gpufleet.spec import JobSpec, parse_spec
from gpufleet.yamlio import describe_validation, read_yaml

WILDCARD = "*"
GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
GPU_TYPE_HINT = "use 1-63 letters, digits, '.', '_' or '-' (e.g. H100, L40S, a100-80gb)"
REFERENCE = "the catalogue format in docs/placement.md"
CURRENCY_RE = re.compile(r"^[A-Z]{3}$")
MAX_GPUS = 1_000_000
"""Most GPUs an offer's capacity or a quota counts: more than any fleet holds."""
MIN_THROUGHPUT, MAX_THROUGHPUT = 1e-3, 1e3
"""Relative throughput, against the reference GPU (1.0): a thousand times slower to a thousand times faster."""
MIN_MEMORY_GIB, MAX_MEMORY_GIB = 1e-3, 10_000.0
"""Memory of a GPU type, in GiB: from a MiB to 10 TiB (today's largest have under 300 GiB)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _name(value: str, what: str) -> str:
    if not NAME_RE.match(value):
        raise ValueError(f"{what} {value!r} is not a valid name: {NAME_HINT}")
    return value


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def _within(value: float, low: float, high: float, what: str, unit: str) -> float:
    """``value`` when ``low <= value <= high``; else a ``ValueError`` naming the field and its range."""
    if not low <= value <= high:
        shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
        raise ValueError(f"{what} {shown} is out of range: give {unit} from {_number(low)} to {_number(high)}")
    return value


def _gpu_type_name(value: str) -> str:
    if not GPU_TYPE_RE.match(value):
        raise ValueError(f"gpu_type {value!r} is not a valid GPU type name: {GPU_TYPE_HINT}")
    return value


class GpuType(_Frozen):
    """One accelerator model: its memory and how fast it runs each workload class."""

    name: str
    """Filled from the key under ``gpu_types`` when omitted."""
    memory_gib: float = Field(gt=0)
    """GiB of memory of one GPU, at most :data:`MAX_MEMORY_GIB`."""
    throughput: dict[str, float]
    """Workload class -> relative throughput (> 0); ``1.0`` is the reference GPU for that class."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return _gpu_type_name(value)

    @field_validator("throughput")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("throughput needs at least one workload class, e.g. {training: 1.0}")
        for workload, rate in value.items():
            if not rate > 0:
                raise ValueError(f"throughput.{workload} must be > 0, got {rate}")
            _within(rate, MIN_THROUGHPUT, MAX_THROUGHPUT, f"throughput.{workload}", "a throughput relative to 1.0")
        return value

    @field_validator("memory_gib")
    @classmethod
    def _memory(cls, value: float) -> float:
        return _within(value, MIN_MEMORY_GIB, MAX_MEMORY_GIB, "memory_gib", "GiB per GPU")


class Offer(_Frozen):
    """One GPU type sold in one region of one provider, at on-demand and (maybe) spot prices."""

    provider: str
    region: str
    gpu_type: str
    gpus_per_node: int = Field(ge=1, le=1024)
    on_demand_per_gpu_hour: float
    spot_per_gpu_hour: float | None = None
    """``None``: this region has no spot market for the type."""
    capacity_gpus: int = Field(ge=0)
    """GPUs the fleet can obtain here (reservation, account limit or observed availability), up to :data:`MAX_GPUS`."""
    spot_preemptions_per_hour: float = Field(default=0.0, ge=0)
    """Mean preemptions per hour of a spot node (its inverse is the MTBF of the Young/Daly rule)."""
    egress_per_gb: float = Field(default=0.0, ge=0)
    """Price to move one GB out of this provider (checkpoint transfer when a job leaves)."""
    source: str | None = None
    """Where the prices were read (a pricing page, a contract)."""

    @field_validator("provider")
    @classmethod
    def _provider(cls, value: str) -> str:
        return _name(value, "provider")

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        return _name(value, "region")

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, value: str) -> str:
        return _gpu_type_name(value)

    @field_validator("on_demand_per_gpu_hour", "spot_per_gpu_hour")
    @classmethod
    def _price(cls, value: float | None) -> float | None:
        if value is not None and value < 0:
            raise ValueError(f"a price cannot be negative, got {value}")
        return value

    @field_validator("capacity_gpus")
    @classmethod
    def _capacity(cls, value: int) -> int:
        return int(_within(value, 0, MAX_GPUS, "capacity_gpus", "a number of GPUs"))

    @model_validator(mode="after")
    def _spot_not_dearer(self) -> Offer:
        if self.spot_per_gpu_hour is not None and self.spot_per_gpu_hour > self.on_demand_per_gpu_hour:
            raise ValueError(
                f"spot price {self.spot_per_gpu_hour} is above the on-demand price {self.on_demand_per_gpu_hour}: "
                "swap them if they were swapped, or write spot_per_gpu_hour: null"
            )
        return self

    @property
    def key(self) -> str:
        """``provider/region/gpu_type``: unique in a catalogue, and what ``--block`` matches."""
        return f"{self.provider}/{self.region}/{self.gpu_type}"

    def price(self, *, spot: bool) -> float | None:
        """Price per GPU-hour; ``None`` for spot where there is no spot market."""
        return self.spot_per_gpu_hour if spot else self.on_demand_per_gpu_hour


class Quota(_Frozen):
    """A team's nominal GPUs of one type (at one provider, or ``*`` for all), in Kueue's terms."""

    team: str
    gpu_type: str
    provider: str = WILDCARD
    nominal: int = Field(ge=0)
    """GPUs guaranteed to the team (Kueue ``nominalQuota``)."""
    borrowing_limit: int | None = Field(default=None, ge=0)
    """Most GPUs the team may borrow from its cohort above its nominal; ``None``: no limit."""
    lending_limit: int | None = Field(default=None, ge=0)
    """Most of its unused nominal GPUs the team lends to the cohort; ``None``: all of them."""
    cohort: str | None = None
    """Teams in one cohort borrow each other's unused nominal; ``None``: no borrowing."""

    @field_validator("team")
    @classmethod
    def _team(cls, value: str) -> str:
        return _name(value, "team")

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, value: str) -> str:
        return _gpu_type_name(value)

    @field_validator("provider")
    @classmethod
    def _provider(cls, value: str) -> str:
        return value if value == WILDCARD else _name(value, "provider")

    @field_validator("cohort")
    @classmethod
    def _cohort(cls, value: str | None) -> str | None:
        return None if value is None else _name(value, "cohort")

    @field_validator("nominal", "borrowing_limit", "lending_limit")
    @classmethod
    def _gpus(cls, value: int | None, info: ValidationInfo) -> int | None:
        return None if value is None else int(_within(value, 0, MAX_GPUS, str(info.field_name), "a number of GPUs"))

    @model_validator(mode="after")
    def _lend_what_it_has(self) -> Quota:
        if self.lending_limit is not None and self.lending_limit > self.nominal:
            raise ValueError(f"lending_limit {self.lending_limit} exceeds nominal {self.nominal}: lower it")
        return self

    @property
    def label(self) -> str:
        """``team/gpu_type@provider``, how errors and plans name the quota."""
        return f"{self.team}/{self.gpu_type}@{self.provider}"


class Catalog(_Frozen):
    """A dated snapshot of GPU types, offers and team quotas."""

    as_of: date
    currency: str = "USD"
    gpu_types: dict[str, GpuType]
    offers: list[Offer] = Field(min_length=1)
    quotas: list[Quota] = Field(default_factory=list)

    @field_validator("currency")
    @classmethod
    def _currency(cls, value: str) -> str:
        if not CURRENCY_RE.match(value):
            raise ValueError(f"currency {value!r} is not a currency code: write three capital letters, e.g. USD or EUR")
        return value

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: Any) -> Any:
        types = data.get("gpu_types") if isinstance(data, dict) else None
        if isinstance(types, dict):
            filled = {k: ({"name": k, **v} if isinstance(v, dict) and "name" not in v else v) for k, v in types.items()}
            data = {**data, "gpu_types": filled}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Catalog:
        for key, gpu in self.gpu_types.items():
            if gpu.name != key:
                raise ValueError(f"gpu_types.{key}: name {gpu.name!r} differs from its key {key!r}")
        known = ", ".join(self.gpu_types) or "none"
        seen: set[str] = set()
        for i, offer in enumerate(self.offers):
            where = f"offers[{i}] ({offer.key})"
            if offer.gpu_type not in self.gpu_types:
                raise ValueError(f"{where}: unknown gpu_type {offer.gpu_type!r}; known types: {known}")
            if offer.key in seen:
                raise ValueError(f"{where}: duplicate offer {offer.key!r}: merge the two rows")
            seen.add(offer.key)
        labels: set[str] = set()
        cohorts: dict[str, str | None] = {}
        for i, quota in enumerate(self.quotas):
            where = f"quotas[{i}] ({quota.label})"
            if quota.gpu_type not in self.gpu_types:
                raise ValueError(f"{where}: unknown gpu_type {quota.gpu_type!r}; known types: {known}")
            if quota.label in labels:
                raise ValueError(f"{where}: duplicate quota for {quota.label}: merge the two rows")
            labels.add(quota.label)
            provider = None if quota.provider == WILDCARD else quota.provider
            capacity = sum(o.capacity_gpus for o in self.offers_for(gpu_type=quota.gpu_type, provider=provider))
            if quota.nominal > capacity:
                raise ValueError(
                    f"{where}: nominal {quota.nominal} exceeds the {capacity} {quota.gpu_type} GPUs offered at "
                    f"provider {quota.provider!r}: lower it or add capacity"
                )
            if cohorts.setdefault(quota.team, quota.cohort) != quota.cohort:
                raise ValueError(
                    f"{where}: team {quota.team!r} is in cohort {cohorts[quota.team]!r} in an earlier quota; "
                    "a team belongs to one cohort"
                )
        return self

    def offers_for(
        self, *, gpu_type: str | None = None, provider: str | None = None, region: str | None = None
    ) -> list[Offer]:
        """Offers matching every given field, in catalogue order."""
        return [
            o
            for o in self.offers
            if (gpu_type is None or o.gpu_type == gpu_type)
            and (provider is None or o.provider == provider)
            and (region is None or o.region == region)
        ]

    def throughput(self, gpu_type: str, workload: str) -> float | None:
        """Relative throughput of ``gpu_type`` for ``workload``; ``None`` when either is unknown."""
        gpu = self.gpu_types.get(gpu_type)
        return None if gpu is None else gpu.throughput.get(workload)

    def quotas_for(self, team: str) -> list[Quota]:
        """The team's quotas, in catalogue order."""
        return [q for q in self.quotas if q.team == team]

    def offer(self, key: str) -> Offer:
        """The offer whose key is ``provider/region/gpu_type``; ``UsageError`` listing the keys otherwise."""
        for o in self.offers:
            if o.key == key:
                return o
        raise UsageError(f"no offer {key!r} in the catalogue; offers: {', '.join(o.key for o in self.offers)}")

    @property
    def providers(self) -> list[str]:
        """Providers in order of first appearance."""
        return list(dict.fromkeys(o.provider for o in self.offers))


def _item_name(data: Any, loc: tuple[int | str, ...]) -> str:
    """``offers[3] (aws/us-east-1/H100)`` for a validation error inside a list item, else ``""``."""
    if len(loc) < 2 or loc[0] not in ("offers", "quotas") or not isinstance(loc[1], int):
        return ""
    try:
        raw = data[loc[0]][loc[1]]
    except (KeyError, IndexError, TypeError):
        return ""
    if not isinstance(raw, dict):
        return ""
    if loc[0] == "offers":
        label = "/".join(str(raw.get(k, "?")) for k in ("provider", "region", "gpu_type"))
    else:
        label = f"{raw.get('team', '?')}/{raw.get('gpu_type', '?')}@{raw.get('provider', WILDCARD)}"
    return f"{loc[0]}[{loc[1]}] ({label})"


def parse_catalog(data: Any, source: str = "<catalog>") -> Catalog:
    """Validate a mapping as a :class:`Catalog`; raise ``UsageError`` naming the bad item."""
    if not isinstance(data, dict):
        raise UsageError(f"{source}: a catalogue must be a YAML mapping, got {type(data).__name__}")
    try:
        return Catalog.model_validate(data)
    except ValidationError as err:
        message = describe_validation(err, source, REFERENCE).replace(": (top level): ", ": ", 1)
        item = _item_name(data, tuple(err.errors()[0]["loc"]))
        raise UsageError(f"{message} [{item}]" if item else message) from None


def load_catalog(path: str | Path) -> Catalog:
    """Read and validate a catalogue YAML file (untrusted input: ``yaml.safe_load`` only)."""
    path = Path(path)
    return parse_catalog(read_yaml(path, what="catalogue", error=UsageError), source=str(path))


def parse_batch(data: Any, source: str = "<batch>") -> list[JobSpec]:
    """A batch of jobs: a YAML list of JobSpecs, or a mapping whose ``jobs`` key holds the list."""
    items = data.get("jobs") if isinstance(data, dict) and set(data) == {"jobs"} else data
    if not isinstance(items, list) or not items:
        raise UsageError(f"{source}: a batch must be a non-empty YAML list of JobSpecs (or a mapping with key 'jobs')")
    return [parse_spec(item, source=f"{source}: jobs[{i}]") for i, item in enumerate(items)]


def load_batch(path: str | Path) -> list[JobSpec]:
    """Read and validate a batch file (untrusted input: ``yaml.safe_load`` only)."""
    path = Path(path)
    return parse_batch(read_yaml(path, what="batch", error=UsageError), source=str(path))


__all__ = [
    "CURRENCY_RE",
    "GPU_TYPE_HINT",
    "GPU_TYPE_RE",
    "MAX_GPUS",
    "MAX_MEMORY_GIB",
    "MAX_THROUGHPUT",
    "MIN_MEMORY_GIB",
    "MIN_THROUGHPUT",
    "REFERENCE",
    "WILDCARD",
    "Catalog",
    "GpuType",
    "Offer",
    "Quota",
    "load_batch",
    "load_catalog",
    "parse_batch",
    "parse_catalog",
]
