"""A rate card validated once per content, then read back (gpufleet/cost/rates.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cost import rate_schema, rates
from gpufleet.cost.rates import Rate, RateCard, keep_validated, load_rates
from gpufleet.errors import UsageError
from gpufleet.jobs.store import Store

CARD = """currency: EUR
as_of: 2026-11-30
rates:
  - {gpu_type: H100, provider: lambda, on_demand: 3, spot: 1.5}
  - {gpu_type: L4, on_demand: 0.8, source: "list price"}
"""


@pytest.fixture
def made(home: Path) -> Path:
    """A home with a store, as after a first job: cards are kept only there."""
    home.mkdir()
    Store(home / "state.db").close()
    return home


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources validated (parsed and checked by pydantic) from now on."""
    seen: list[str] = []
    real = rate_schema.validated_card

    def counting(raw: bytes, source: str) -> RateCard:
        seen.append(source)
        return real(raw, source)

    monkeypatch.setattr(rate_schema, "validated_card", counting)
    monkeypatch.setattr(rates, "_validated_here", {})
    return seen


def kept_files(home: Path) -> list[Path]:
    return sorted((home / "cache" / "rates").glob("*.json"))


def card_kept(home: Path, tmp_path: Path) -> tuple[Path, RateCard, Path]:
    """A card read and kept in ``home``: its YAML's path, the card, and its kept file."""
    path = tmp_path / "rates.yaml"
    path.write_text(CARD)
    card = load_rates(path)
    keep_validated()
    (kept,) = kept_files(home)
    return path, card, kept


def test_a_card_is_validated_once_then_read_back(made: Path, tmp_path: Path, counted: list[str]) -> None:
    path = tmp_path / "rates.yaml"
    path.write_text(CARD)
    first = load_rates(path)
    assert first == RateCard(
        currency="EUR",
        as_of="2026-11-30",
        rates=[
            Rate(gpu_type="H100", provider="lambda", on_demand=3.0, spot=1.5),
            Rate(gpu_type="L4", on_demand=0.8, source="list price"),
        ],
    )
    assert type(first.rates[0].on_demand) is float  # 3 in the YAML, a price once validated
    assert counted == [str(path)] and kept_files(made) == []  # kept only once the command did its work
    keep_validated()
    assert len(kept_files(made)) == 1
    assert load_rates(path) == first
    assert counted == [str(path)]  # read back: not validated again
    path.write_text(CARD.replace("0.8", "0.9"))  # an edited card is new bytes: validated again
    assert load_rates(path).price("L4", "any", spot=False) == 0.9
    keep_validated()
    assert counted == [str(path)] * 2 and len(kept_files(made)) == 2


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: "not json {",
        lambda d: json.dumps({**d, "currency": "dollars!"}),
        lambda d: json.dumps({**d, "extra": 1}),
        lambda d: json.dumps({**d, "rates": [{**d["rates"][0], "on_demand": -1.0}]}),
        lambda d: json.dumps({**d, "rates": [{**d["rates"][0], "on_demand": True}]}),
        lambda d: json.dumps({**d, "rates": [{**d["rates"][0], "spot": "cheap"}]}),
        lambda d: json.dumps({**d, "rates": [{**d["rates"][0], "gpu_type": 7}]}),
        lambda d: json.dumps({**d, "rates": "all"}),
        lambda d: json.dumps([d]),
        lambda d: "[" * 100_000,  # json's parser recurses: a RecursionError, not a ValueError
        lambda d: json.dumps({**d, "rates": [{**d["rates"][0], "gpu_type": "\ud800"}]}),  # a lone surrogate
    ],
)
def test_a_kept_copy_that_is_not_a_card_is_validated_again(
    made: Path, tmp_path: Path, counted: list[str], tamper: Any
) -> None:
    path, card, kept = card_kept(made, tmp_path)
    kept.write_text(tamper(json.loads(kept.read_text())))
    assert load_rates(path) == card
    assert counted == [str(path)] * 2
    keep_validated()
    assert RateCard.from_dict(json.loads(kept.read_text())) == card  # written again, whole


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_kept_path_that_is_not_a_regular_file_is_never_read(
    made: Path, tmp_path: Path, counted: list[str], kind: str
) -> None:
    """A FIFO would block the read for ever, /dev/zero never end it: neither is opened for reading."""
    path, card, kept = card_kept(made, tmp_path)
    kept.unlink()
    if kind == "fifo":
        os.mkfifo(kept)
    elif kind == "device":
        kept.symlink_to("/dev/zero")
    else:
        kept.mkdir()
    assert load_rates(path) == card
    assert counted == [str(path)] * 2
    keep_validated()  # written again over a FIFO or a link; a folder in the way is left there
    if kind == "folder":
        assert kept.is_dir() and not list(kept.parent.glob("*.tmp"))
    else:
        assert RateCard.from_dict(json.loads(kept.read_text())) == card


def test_cost_prints_its_report_where_the_card_cannot_be_kept(made: Path, tmp_path: Path) -> None:
    """A cache that is a file (or a full disk) costs the next run a validation, never this run its output."""
    from typer.testing import CliRunner

    from gpufleet.cli.app import app

    (made / "cache").write_text("not a folder")
    path = tmp_path / "rates.yaml"
    path.write_text(CARD)
    result = CliRunner().invoke(app, ["cost", "--rates", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["currency"] == "EUR"
    assert (made / "cache").read_text() == "not a folder"


@pytest.mark.parametrize("folder", ["missing", "empty", "junk"])
def test_nothing_is_kept_in_a_home_without_a_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: list[str], folder: str
) -> None:
    """A $GPUFLEET_HOME that is not one yet (or a folder named by mistake) is left exactly as it was."""
    home = tmp_path / folder
    if folder != "missing":
        home.mkdir()
    if folder == "junk":
        (home / "notes.txt").write_text("mine")
    monkeypatch.setenv("GPUFLEET_HOME", str(home))
    path = tmp_path / "rates.yaml"
    path.write_text(CARD)
    before = sorted(tmp_path.rglob("*"))
    assert load_rates(path) == load_rates(path)
    keep_validated()
    assert counted == [str(path)] * 2
    assert sorted(tmp_path.rglob("*")) == before


def test_a_bad_card_is_refused_whether_or_not_a_good_one_was_kept(made: Path, tmp_path: Path) -> None:
    path = tmp_path / "rates.yaml"
    path.write_text(CARD)
    load_rates(path)
    keep_validated()
    path.write_text(CARD.replace("on_demand: 3", "on_demand: -3"))
    with pytest.raises(UsageError, match=r"on_demand.*greater than or equal to 0"):
        load_rates(path)
    path.write_bytes(b"currency: \xff\n")
    with pytest.raises(UsageError, match="not UTF-8 text"):
        load_rates(path)
    keep_validated()
    assert len(kept_files(made)) == 1


def test_the_cards_json_is_what_the_cost_caches_digest_always_hashed() -> None:
    """The digest of priced rows hashes the card's JSON: the same text as pydantic's, so no row is priced again."""
    shipped = load_rates()
    model = rate_schema.RateCardFile.model_validate(shipped.to_dict())
    assert shipped.to_json() == model.model_dump_json()
    assert RateCard.from_dict(json.loads(shipped.to_json())) == shipped
    assert rates.load_rates() is shipped  # the shipped card is read once per process
