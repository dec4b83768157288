"""The one reader of the runtime's phase tables and straggler events, and the readers built on it.

Hand-made fields and events: a well-formed table read in the runtime's phase order, every malformed
shape refused whole, the exact rank count, the latest well-formed ``straggler`` event of each
(attempt, rank, phase, first step) winning, and the diagnosis, the ledger and the server's goodput
page refusing the same hostile field and the same hostile event.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.cost.usage import phase_shares
from gpufleet.jobs.events import MAX_INT, MAX_TS
from gpufleet.jobs.rank_phases import (
    MAX_GPUS_PER_RANK,
    MAX_HOST,
    MAX_RANKS,
    PHASES,
    STRAGGLER_PHASES,
    TIMED_PHASES,
    Straggler,
    phase_table,
    rank_seconds,
    read_straggler,
    stragglers,
)
from gpufleet.jobs.store import Event
from gpufleet.serve import goodput
from gpufleet.telemetry import ranks

TABLE = {
    "data_wait": [1.0, 3.0],
    "compute": [50.0, 60.0],
    "collective": [20.0, 2.0],
    "optimizer": [3.0, 1.0],
    "checkpoint": [0.0, 0.0],
    "straggler_wait": [10.0, 0.0],
}


def test_the_phases_are_the_runtimes_in_its_order() -> None:
    assert TIMED_PHASES == ("data_wait", "compute", "collective", "optimizer", "checkpoint")
    assert PHASES == ("data_wait", "compute", "collective", "optimizer", "checkpoint", "straggler_wait")
    assert set(STRAGGLER_PHASES) == {"compute", "data_wait"}
    assert ranks.PHASES is PHASES and goodput.PHASES is PHASES


def test_a_table_is_read_in_phase_order_with_unknown_keys_left_out() -> None:
    value = {"straggler_wait": [0, 1], "compute": [2, 3.5], "lunch": "x", "data_wait": [0.0, MAX_TS]}
    table = phase_table(value)
    assert table == {"data_wait": [0.0, MAX_TS], "compute": [2.0, 3.5], "straggler_wait": [0.0, 1.0]}
    assert table is not None and list(table) == ["data_wait", "compute", "straggler_wait"]
    assert all(isinstance(x, float) for v in table.values() for x in v)
    assert phase_table(TABLE, ranks=2) == TABLE


@pytest.mark.parametrize(
    "value",
    [
        None,
        "compute",
        [[1.0, 2.0]],
        {},
        {"lunch": [1.0]},
        {"compute": []},
        {"compute": 1.0},
        {"compute": (1.0, 2.0)},
        {"compute": [1.0, None]},
        {"compute": [1.0, "2"]},
        {"compute": [True, 1.0]},
        {"compute": [1.0, -0.5]},
        {"compute": [1.0, float("nan")]},
        {"compute": [float("inf"), 1.0]},
        {"compute": [10**400]},
        {"compute": [MAX_TS * 10]},
        {"compute": [0.1] * (MAX_RANKS + 1)},
        {"compute": [1.0, 2.0], "data_wait": [1.0]},
        {**TABLE, "checkpoint": ["a", "b"]},
    ],
    ids=[
        "none",
        "str",
        "list",
        "empty",
        "unknown-only",
        "no-ranks",
        "scalar",
        "tuple",
        "null",
        "string",
        "bool",
        "negative",
        "nan",
        "inf",
        "overflow",
        "past-max-ts",
        "too-many-ranks",
        "lengths-differ",
        "one-bad-phase",
    ],
)
def test_a_malformed_table_is_refused_whole(value: Any) -> None:
    assert phase_table(value) is None


def test_an_exact_rank_count_refuses_another_length() -> None:
    assert phase_table(TABLE, ranks=3) is None
    assert rank_seconds([1.0, 2.0], ranks=1) is None
    assert rank_seconds([1, 2], ranks=2) == [1.0, 2.0]


@pytest.mark.parametrize(
    "hostile",
    [{**TABLE, "compute": [MAX_TS * 10, 1.0]}, {**TABLE, "checkpoint": [1.0, "x"]}],
    ids=["past-max-ts", "bad-unused-phase"],
)
def test_every_reader_refuses_the_same_hostile_table(hostile: dict[str, Any]) -> None:
    """The diagnosis, the ledger and the goodput page read a table the same way: none reads a broken one."""
    step = {"kind": "step", "attempt": 1, "ts": 1.0, "step": 5}
    assert ranks.phase_totals([{**step, "phase_totals_s": TABLE}]) == {1: TABLE}
    assert ranks.phase_totals([{**step, "phase_totals_s": hostile}]) == {}
    assert goodput.phase_lists(TABLE) == TABLE and goodput.phase_lists(hostile) is None
    assert phase_shares({"phase_totals_s": TABLE}) is not None
    assert phase_shares({"phase_totals_s": hostile}) is None


def straggler(**over: Any) -> dict[str, Any]:
    event = {
        "kind": "straggler",
        "attempt": 1,
        "ts": 100.0,
        "step": 40,
        "rank": 1,
        "host": "node-1",
        "phase": "compute",
        "factor": 4.0,
        "first_step": 31,
        "last_step": 40,
        "tax_s": 3.0,
        "gpus_per_rank": 2,
        "status": "named",
    }
    return {**event, **over}


def as_event(line: dict[str, Any]) -> Event:
    """The line as the store holds it once ingested."""
    data = {k: v for k, v in line.items() if k not in ("kind", "ts", "attempt")}
    return Event(job_id=1, attempt=line["attempt"], ts=line["ts"], kind=line["kind"], source="runtime", data=data)


def test_the_latest_event_of_a_straggler_wins_and_keeps_its_first_time() -> None:
    lines = [
        straggler(),
        straggler(rank=2, host="node-2", phase="data_wait", ts=105.0),
        {"kind": "step", "attempt": 1, "ts": 106.0, "step": 41},
        straggler(ts=120.0, last_step=60, tax_s=6.0, status="ended"),
        straggler(ts=130.0, tax_s="lots"),  # malformed: the one before stands
    ]
    first, second = stragglers(lines)
    assert first == Straggler(
        attempt=1, rank=1, host="node-1", phase="compute", factor=4.0, first_step=31, last_step=60,
        tax_s=6.0, gpus_per_rank=2, status="ended", since=100.0, ts=120.0,
    )  # fmt: skip
    assert first.tax_gpu_seconds == 12.0 and first.tax_money(3.6) == pytest.approx(0.012)
    assert first.tax_money(None) is None
    ended = straggler(last_step=60, tax_s=6.0, status="ended")
    shown = {k: v for k, v in ended.items() if k not in ("kind", "ts", "step")}
    assert first.to_dict() == {**shown, "tax_gpu_seconds": 12.0}
    assert (second.rank, second.phase, second.status) == (2, "data_wait", "named")
    assert stragglers([as_event(line) for line in lines]) == [first, second]


def test_a_rank_slow_again_or_in_another_attempt_is_another_straggler() -> None:
    found = stragglers([straggler(), straggler(first_step=90, last_step=95), straggler(attempt=2)])
    assert [s.key for s in found] == [(1, 1, "compute", 31), (1, 1, "compute", 90), (2, 1, "compute", 31)]


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "step"},
        {"rank": "1"},
        {"rank": True},
        {"rank": -1},
        {"rank": MAX_RANKS},
        {"host": None},
        {"host": ""},
        {"host": "n" * (MAX_HOST + 1)},
        {"host": "node\n1"},
        {"phase": "collective"},
        {"status": "maybe"},
        {"status": None},
        {"factor": "4"},
        {"factor": -1.0},
        {"factor": float("nan")},
        {"tax_s": None},
        {"tax_s": float("inf")},
        {"first_step": 1.5},
        {"first_step": MAX_INT + 1, "last_step": MAX_INT + 2},
        {"last_step": None},
        {"first_step": 50, "last_step": 40},
        {"gpus_per_rank": None},
        {"gpus_per_rank": 0},
        {"gpus_per_rank": True},
        {"gpus_per_rank": MAX_GPUS_PER_RANK + 1},
    ],
)
def test_a_malformed_straggler_event_is_skipped(bad: dict[str, Any]) -> None:
    line = straggler(**bad)
    assert read_straggler(line) is None and read_straggler(as_event(line)) is None
    assert stragglers([line]) == []


def test_the_diagnosis_and_the_goodput_page_read_the_same_stragglers() -> None:
    """An event the contract does not allow (no ``last_step``, no ``gpus_per_rank``) is skipped by both."""
    lines = [straggler(), straggler(rank=2, last_step=None), straggler(rank=3, gpus_per_rank=None)]
    lines.append({k: v for k, v in straggler(rank=4).items() if k != "gpus_per_rank"})
    (row,) = goodput.stragglers([as_event(line) for line in lines], {1: 3.6})
    assert [s.rank for s in ranks.stragglers(lines)] == [row["rank"]] == [1]
    assert row["tax_gpu_seconds"] == 6.0 and row["tax_money"] == pytest.approx(0.006) and row["last_step"] == 40
