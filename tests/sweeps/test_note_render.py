"""The sweep note's text: money in the rate card's currency as every document writes it, a well-formed table."""

from __future__ import annotations

from typing import Any

from gpufleet.sweeps.note import render

FIGURES: dict[str, Any] = {
    "sweep": "lm",
    "trials": 4,
    "finished": 3,
    "pruned": 1,
    "pruned_share": 0.25,
    "gpu_hours": 0.012,
    "money": 0.0123456,
    "gpu_hours_per_finished_trial": 0.004,
    "gpu_hours_per_pruned_trial": 0.001,
    "gpu_hours_per_trial": 0.003,
    "price_per_gpu_hour": 2.5,
    "currency": "EUR",
    "best": None,
    "scaling": [
        {
            "ranks": 1,
            "job": 7,
            "tokens_per_s": 100.0,
            "speedup": 1.0,
            "efficiency": 1.0,
            "cost_factor": 1.0,
            "problem": None,
        },
        {
            "ranks": 2,
            "job": None,
            "tokens_per_s": None,
            "speedup": None,
            "efficiency": None,
            "cost_factor": None,
            "problem": "not run: a|b",
        },
    ],
}


def test_money_carries_the_currency_and_the_table_keeps_its_columns() -> None:
    text = render(FIGURES, gpus=8)
    assert "€0.0123 in money" in text
    assert "(€0.0075 a trial at €2.50 a GPU-hour)" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 4  # header, rule, two rows
    assert {line.replace("\\|", "").count("|") for line in table} == {8}  # 7 columns: the problem's '|' is escaped
    assert "not run: a\\|b" in table[-1]
