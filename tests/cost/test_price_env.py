"""The backend prices an attempt and hands it the price; the training process never reads the rate card."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import drive

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.cost.rates import ENV_RATES, load_rates, price_environment
from gpufleet.errors import UsageError
from gpufleet.jobs.protocol import ENV_CURRENCY, ENV_PRICE
from gpufleet.spec import parse_spec

CARD = "currency: EUR\nrates:\n  - {gpu_type: H100, provider: '*', on_demand: 4.0, spot: 1.5}\n"


def spec(**fields: object):  # type: ignore[no-untyped-def]
    base = {"name": "priced", "team": "t", "entrypoint": "gpufleet.workloads.toy:train"}
    return parse_spec({**base, **fields})


def test_the_rate_card_prices_the_spec(tmp_path: Path) -> None:
    card = tmp_path / "rates.yaml"
    card.write_text(CARD)
    h100 = {"resources": {"gpu_type": "H100"}}
    assert price_environment(spec(**h100), {ENV_RATES: str(card)}) == {ENV_PRICE: "4.0", ENV_CURRENCY: "EUR"}
    assert price_environment(spec(**h100, spot=True), {ENV_RATES: str(card)})[ENV_PRICE] == "1.5"
    shipped = price_environment(spec(**h100), {})
    assert float(shipped[ENV_PRICE]) > 0 and shipped[ENV_CURRENCY] == "USD"


def test_no_row_or_a_bad_card_prices_nothing(tmp_path: Path) -> None:
    card = tmp_path / "rates.yaml"
    card.write_text(CARD)
    assert price_environment(spec(resources={"gpu_type": "L4"}), {ENV_RATES: str(card)}) == {}
    bad = tmp_path / "bad.yaml"
    bad.write_text("rates: [{gpu_type: H100, on_demand: -1}]\n")
    assert price_environment(spec(resources={"gpu_type": "H100"}), {ENV_RATES: str(bad)}) == {}
    # A currency the attempt could not export is refused where the card is read, and prices nothing.
    symbol = tmp_path / "symbol.yaml"
    symbol.write_text(CARD.replace("currency: EUR", 'currency: "US$"'))
    with pytest.raises(UsageError, match="currency 'US\\$' is not a currency code"):
        load_rates(symbol)
    assert price_environment(spec(resources={"gpu_type": "H100"}), {ENV_RATES: str(symbol)}) == {}


def test_a_local_attempt_exports_the_price_it_was_handed(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    card = tmp_path / "rates.yaml"
    card.write_text(CARD)
    textfile = tmp_path / "job.prom"
    monkeypatch.setenv(ENV_RATES, str(card))  # the scheduler's environment, as `gpufleet` started it
    monkeypatch.setenv("GPUFLEET_METRICS_TEXTFILE", str(textfile))
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    job_spec = spec(args={"steps": 6, "step_seconds": 0.0}, resources={"gpu_type": "H100"})
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=1, poll_s=0.02)
    try:
        job = backend.submit(job_spec)
        drive(scheduler, lambda: backend.store.job(job).state == "completed", timeout=300)
    finally:
        scheduler.shutdown(grace_s=5)
    text = textfile.read_text()
    cost = re.search(r'^gpufleet_job_cost_total\{[^}]*currency="EUR"[^}]*\} (\S+)$', text, re.M)
    assert cost is not None, text
    assert float(cost.group(1)) > 0
