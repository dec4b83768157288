"""Rate card: the price of one GPU-hour by GPU type, provider, and spot or on-demand.

YAML (untrusted; validated)::

    currency: USD
    as_of: 2026-12-01
    rates:
      - {gpu_type: H100, provider: lambda, on_demand: 2.99, spot: 1.60}
      - {gpu_type: L4, provider: "*", on_demand: 0.80}

A ``provider: "*"`` row is the fallback for that GPU type. A missing spot price means spot is
not sold there: the on-demand price is used.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from datetime import date
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpufleet.errors import GpufleetError, UsageError
from gpufleet.jobs.protocol import CURRENCY_RE, ENV_CURRENCY, ENV_PRICE
from gpufleet.yamlio import parse_yaml, read_yaml, validate

if TYPE_CHECKING:
    from gpufleet.spec import JobSpec

ENV_RATES = "GPUFLEET_RATES"
"""A rate card's path, in the environment of the backend (the local scheduler, the Slurm submitter)."""


class Rate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    gpu_type: str
    provider: str = "*"
    on_demand: float = Field(ge=0)
    spot: float | None = Field(default=None, ge=0)
    source: str | None = None


class RateCard(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    currency: str = "USD"
    as_of: str | None = None

    @field_validator("currency")
    @classmethod
    def _currency_code(cls, value: str) -> str:
        if not CURRENCY_RE.fullmatch(value):
            raise ValueError(f"currency {value!r} is not a currency code: give 2 to 10 letters, such as USD or EUR")
        return value

    @field_validator("as_of", mode="before")
    @classmethod
    def _date_as_text(cls, value: object) -> object:
        return value.isoformat() if isinstance(value, date) else value

    rates: list[Rate]

    def price(self, gpu_type: str, provider: str, *, spot: bool) -> float | None:
        """Price per GPU-hour, or ``None`` when the card has no row for this GPU type."""
        exact = [r for r in self.rates if r.gpu_type == gpu_type and r.provider == provider]
        wildcard = [r for r in self.rates if r.gpu_type == gpu_type and r.provider == "*"]
        rows = exact or wildcard
        if not rows:
            return None
        row = rows[0]
        return row.spot if spot and row.spot is not None else row.on_demand


def load_rates(path: str | Path | None = None) -> RateCard:
    """Load a rate card, or the one shipped with gpufleet when ``path`` is ``None`` (read once per process)."""
    if path is None:
        return _shipped_rates()
    data, source = read_yaml(Path(path), what="rate card", error=UsageError), str(path)
    return _validated(data, source)


@functools.cache
def _shipped_rates() -> RateCard:
    shipped = resources.files("gpufleet.cost").joinpath("default_rates.yaml").read_text(encoding="utf-8")
    source = "<default rate card>"
    return _validated(parse_yaml(shipped, source=source, error=UsageError), source)


def _validated(data: object, source: str) -> RateCard:
    return validate(
        RateCard,
        data,
        source=source,
        what="a rate card",
        reference="the rate card format in docs/cost.md",
        error=UsageError,
    )


def price_environment(spec: JobSpec, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The price of one GPU-hour for an attempt's environment: ``GPUFLEET_PRICE_PER_GPU_HOUR`` and its currency.

    The backend prices the attempt when it starts it, so the training process never reads the rate
    card (the runtime sits below ``cost`` in the layers): it exports what it is handed. The card is
    ``$GPUFLEET_RATES`` in ``env`` (the backend's environment), else the shipped one. No row for the
    GPU type, or a card that does not load, prices nothing: an attempt never fails for its price
    (``gpufleet cost`` reports a bad card where it reads it).
    """
    env = os.environ if env is None else env
    path = env.get(ENV_RATES) or None
    try:
        card = load_rates(path)
    except GpufleetError:
        return {}
    price = card.price(spec.resources.gpu_type, spec.provider, spot=spec.spot)
    return {} if price is None else {ENV_PRICE: repr(float(price)), ENV_CURRENCY: card.currency}


__all__ = ["ENV_RATES", "Rate", "RateCard", "load_rates", "price_environment"]
