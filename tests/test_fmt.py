"""The shared text formatters of ``gpufleet.fmt``: each style's rounding, pinned to the outputs its readers get."""

from __future__ import annotations

import json
import math

import pytest

from gpufleet import fmt
from gpufleet.fmt import compact_duration, finite_json, finite_or_none, markdown_table, money, short_duration


@pytest.mark.parametrize(
    ("amount", "currency", "expected"),
    [
        (1234.567, "USD", "$1,234.57"),
        (12.345, "usd", "$12.35"),
        (1.0, "EUR", "€1.00"),
        (0.0, "GBP", "£0.00"),
        (0.5, "USD", "$0.50"),
        (0.0123, "USD", "$0.0123"),
        (0.9999, "USD", "$1.00"),
        (0.000012345, "USD", "$0.0000123"),
        (7.5e-9, "USD", "$0.00000001"),
        (-0.5, "USD", "-$0.50"),
        (-1234.5, "USD", "-$1,234.50"),
        (12.345, "CHF", "12.35 CHF"),
        (math.inf, "USD", "n/a"),
        (math.nan, "USD", "n/a"),
    ],
)
def test_money_cents_is_the_cost_note_style(amount: float, currency: str, expected: str) -> None:
    assert money(amount, currency) == expected


def test_every_document_writes_money_the_same_way() -> None:
    from gpufleet.cli.render import money as cli_money

    for amount in (0.0, 0.0123, 0.5, 12.345, 1234.5, -3.0):
        assert cli_money(amount, "USD") == money(amount, "USD")
    assert cli_money(0.0, "USD") == "$0.00" and cli_money(0.5, "USD") == "$0.50"


def test_markdown_table_aligned() -> None:
    lines = markdown_table(["Job", "Team", "GPU-h"], [["#1 a", "ml", "1.5"], ["#2 b", "cv", "12"]], right_from=2)
    assert lines == [
        "| Job | Team | GPU-h |",
        "| --- | --- | ---: |",
        "| #1 a | ml | 1.5 |",
        "| #2 b | cv | 12 |",
    ]


def test_markdown_table_compact_rule_and_all_right() -> None:
    assert markdown_table(["a", "b"], [["x", "y"]]) == ["| a | b |", "|---|---|", "| x | y |"]
    assert markdown_table(["a", "b"], [], right_from=0) == ["| a | b |", "| ---: | ---: |"]


def test_markdown_table_takes_any_iterable_of_rows_and_writes_cells_as_given() -> None:
    rows = ([c, c.upper()] for c in ("p|q", "r"))
    assert markdown_table(("h", "H"), rows, right_from=1)[2:] == ["| p|q | P|Q |", "| r | R |"]


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0.0, "0.0s"), (12.34, "12.3s"), (59.94, "59.9s"), (60, "1m00s"), (245.9, "4m05s"), (3599.9, "59m59s"),
     (3600, "1h00m"), (7620, "2h07m"), (90000, "25h00m")],
)  # fmt: skip
def test_compact_duration(seconds: float, expected: str) -> None:
    assert compact_duration(seconds) == expected


def test_finite_or_none() -> None:
    assert finite_or_none(1.5) == 1.5
    assert finite_or_none(0.0) == 0.0
    assert finite_or_none(None) is None
    for bad in (math.nan, math.inf, -math.inf):
        assert finite_or_none(bad) is None


def test_finite_json_makes_strict_json() -> None:
    data = {"a": [1.0, math.nan, (math.inf, 2)], "b": {"c": -math.inf, "d": "x", "e": 3}, "f": None}
    clean = finite_json(data)
    assert clean == {"a": [1.0, None, [None, 2]], "b": {"c": None, "d": "x", "e": 3}, "f": None}
    assert json.loads(json.dumps(clean, allow_nan=False)) == clean


def test_all_lists_the_public_names() -> None:
    names = ["CURRENCY_SYMBOLS", "compact_duration", "finite_json", "finite_or_none", "markdown_table"]
    names += ["GPU_SECONDS_BELOW_HOURS", "gpu_time", "number", "short_duration", "shown_path"]
    assert sorted(fmt.__all__) == sorted([*names, "money"])
    for name in fmt.__all__:
        assert hasattr(fmt, name)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (6.976e-05, "0.07 ms"),
        (0.05806, "58 ms"),
        (0.9951, "1 s"),
        (1.43, "1.4 s"),
        (30.0, "30 s"),
        (245.0, "4m05s"),
        (0.0, "0 ms"),
        (math.nan, "n/a"),
    ],
)
def test_short_duration_keeps_a_measured_time_readable(seconds: float, expected: str) -> None:
    assert short_duration(seconds) == expected
