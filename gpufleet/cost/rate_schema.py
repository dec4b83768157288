"""The rate card's YAML as pydantic checks it: imported only when a card's bytes are new (``rates.load_rates``)."""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpufleet.cost.rates import Rate, RateCard
from gpufleet.errors import UsageError
from gpufleet.jobs.protocol import CURRENCY_RE
from gpufleet.yamlio import parse_yaml, utf8_text, validate


class RateRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    gpu_type: str
    provider: str = "*"
    on_demand: float = Field(ge=0)
    spot: float | None = Field(default=None, ge=0)
    source: str | None = None


class RateCardFile(BaseModel):
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

    rates: list[RateRow]


def validated_card(raw: bytes, source: str) -> RateCard:
    """A card's bytes parsed (bounded YAML) and validated; ``UsageError`` naming the first bad field."""
    text = utf8_text(raw, source, what="rate card", error=UsageError)
    data = parse_yaml(text, source=source, error=UsageError)
    model = validate(
        RateCardFile,
        data,
        source=source,
        what="a rate card",
        reference="the rate card format in docs/cost.md",
        error=UsageError,
    )
    rows = tuple(Rate(**row.model_dump()) for row in model.rates)
    return RateCard(currency=model.currency, as_of=model.as_of, rates=rows)


__all__ = ["RateCardFile", "RateRow", "validated_card"]
