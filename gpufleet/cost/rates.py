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

import contextlib
import functools
import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet._version import __version__
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.jobs.protocol import CURRENCY_RE, ENV_CURRENCY, ENV_PRICE
from gpufleet.paths import gpufleet_home, has_store
from gpufleet.yamlio import MAX_BYTES, read_bytes_bounded

if TYPE_CHECKING:
    from gpufleet.spec import JobSpec

ENV_RATES = "GPUFLEET_RATES"
"""A rate card's path, in the environment of the backend (the local scheduler, the Slurm submitter)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rate:
    """One row of a rate card (validated by ``gpufleet.cost.rate_schema`` when the card is read)."""

    gpu_type: str
    provider: str = "*"
    on_demand: float
    spot: float | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RateCard:
    """A validated rate card. Its YAML is checked by the pydantic models of ``gpufleet.cost.rate_schema``
    the first time these bytes are read, and kept (:func:`load_rates`): reading a known card imports neither
    pydantic nor PyYAML, a third of what `gpufleet cost` takes to start."""

    currency: str = "USD"
    as_of: str | None = None
    rates: Sequence[Rate]  # kept as a tuple

    def __post_init__(self) -> None:
        object.__setattr__(self, "rates", tuple(self.rates))  # a list given (as pydantic took) is kept as a tuple

    def price(self, gpu_type: str, provider: str, *, spot: bool) -> float | None:
        """Price per GPU-hour, or ``None`` when the card has no row for this GPU type."""
        exact = [r for r in self.rates if r.gpu_type == gpu_type and r.provider == provider]
        wildcard = [r for r in self.rates if r.gpu_type == gpu_type and r.provider == "*"]
        rows = exact or wildcard
        if not rows:
            return None
        row = rows[0]
        return row.spot if spot and row.spot is not None else row.on_demand

    def to_dict(self) -> dict[str, Any]:
        rows = [
            {
                "gpu_type": r.gpu_type,
                "provider": r.provider,
                "on_demand": r.on_demand,
                "spot": r.spot,
                "source": r.source,
            }
            for r in self.rates
        ]
        return {"currency": self.currency, "as_of": self.as_of, "rates": rows}

    def to_json(self) -> str:
        """The card as compact JSON, in field order: what the cost cache's digest hashes."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: Any) -> RateCard:
        """A card written by :meth:`to_dict`, each value checked; ``ValueError`` for anything else."""
        if not isinstance(data, dict) or set(data) != {"currency", "as_of", "rates"}:
            raise ValueError("not a rate card")
        currency, as_of, rows = data["currency"], data["as_of"], data["rates"]
        if not isinstance(currency, str) or not CURRENCY_RE.fullmatch(currency):
            raise ValueError("currency")
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError("rates")
        return cls(currency=currency, as_of=_text_or_none(as_of), rates=tuple(_rate(r) for r in rows))


def _text(value: Any) -> str:
    """``value`` if it is text UTF-8 can write (a lone surrogate cannot: ``UnicodeEncodeError``, a ``ValueError``)."""
    if not isinstance(value, str):
        raise ValueError("text")
    value.encode("utf-8")
    return value


def _text_or_none(value: Any) -> str | None:
    return None if value is None else _text(value)


def _price_or_none(value: Any) -> float | None:
    if value is None:
        return None
    if type(value) is not float or not math.isfinite(value) or value < 0:
        raise ValueError("price")
    return value


def _rate(row: dict[str, Any]) -> Rate:
    if set(row) != {"gpu_type", "provider", "on_demand", "spot", "source"}:
        raise ValueError("rate")
    gpu_type, provider = _text(row["gpu_type"]), _text(row["provider"])
    on_demand = _price_or_none(row["on_demand"])
    if on_demand is None:
        raise ValueError("on_demand")
    spot, source = _price_or_none(row["spot"]), _text_or_none(row["source"])
    return Rate(gpu_type=gpu_type, provider=provider, on_demand=on_demand, spot=spot, source=source)


def load_rates(path: str | Path | None = None) -> RateCard:
    """Load a rate card, or the one shipped with gpufleet when ``path`` is ``None`` (read once per process).

    A card is parsed and validated the first time its bytes are seen, then read back from
    ``$GPUFLEET_HOME/cache/rates/`` (keyed by the SHA-256 of its bytes and gpufleet's version), once
    the command that read it calls :func:`keep_validated`: an edited card is new bytes, so it is
    validated again; a kept copy that does not read back as a card is ignored and written again.
    """
    if path is None:
        return _shipped_rates()
    raw = read_bytes_bounded(Path(path), what="rate card", error=UsageError)
    return _card(raw, str(path))


@functools.cache
def _shipped_rates() -> RateCard:
    raw = resources.files("gpufleet.cost").joinpath("default_rates.yaml").read_bytes()
    return _card(raw, "<default rate card>")


def _kept_path(raw: bytes) -> Path:
    key = hashlib.sha256(raw + b"\0" + __version__.encode()).hexdigest()
    return gpufleet_home() / "cache" / "rates" / f"{key}.json"


_validated_here: dict[Path, tuple[Path, RateCard]] = {}
"""Cards this process validated: where each would be kept, the home it was read for, the card."""


KEPT_MAX_BYTES = MAX_BYTES * 4
"""The largest kept card read back: its JSON is a few times the size of the largest YAML card read."""


def _card(raw: bytes, source: str) -> RateCard:
    kept = _kept_path(raw)
    try:
        data = read_bytes_bounded(kept, what="kept rate card", error=UsageError, max_bytes=KEPT_MAX_BYTES)
        return RateCard.from_dict(json.loads(data))
    except (GpufleetError, ValueError, RecursionError):  # not kept yet, not a regular file, or not a card
        pass  # (json's errors and an unencodable string are ValueErrors; a deep nesting a RecursionError)
    from gpufleet.cost.rate_schema import validated_card

    card = validated_card(raw, source)
    _validated_here[kept] = (gpufleet_home(), card)
    return card


def keep_validated() -> None:
    """Write the cards this process validated, for the next read to skip parsing and validation.

    Called by a command once it has done its work (``gpufleet cost``), so a command that fails after
    reading a card leaves the home as it was. Only into a home that holds a store (a folder that merely
    exists may be anything), and never fatally: a home where it cannot write reads the YAML again.
    """
    pending = list(_validated_here.items())
    _validated_here.clear()
    for kept, (home, card) in pending:
        if not has_store(home):
            continue
        tmp = kept.with_suffix(f".{os.getpid()}.tmp")
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(card.to_json(), encoding="utf-8")
            os.replace(tmp, kept)
        except OSError:
            with contextlib.suppress(OSError):  # a full disk leaves no half-written temporary behind
                tmp.unlink()


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


__all__ = ["ENV_RATES", "Rate", "RateCard", "keep_validated", "load_rates", "price_environment"]
