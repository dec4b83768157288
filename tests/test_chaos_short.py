"""The fault table (``bench/chaos.py``): a short run recovers bit-exact, and each row reads the events right."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import chaos  # noqa: E402


def ev(ts: float, kind: str, attempt: int = 1, **data: Any) -> dict[str, Any]:
    return {"ts": ts, "kind": kind, "attempt": attempt, **data}


def group(ts: float, attempt: int, pids: tuple[int, int]) -> dict[str, Any]:
    return ev(ts, "group", attempt, ranks=[{"rank": r, "pid": p} for r, p in enumerate(pids)])


def test_a_requeued_row_counts_the_redone_steps_the_tier_and_the_new_pids() -> None:
    events = [
        group(1.0, 1, (100, 101)),
        *(ev(1.0 + s / 10, "step", step=s) for s in range(1, 14)),
        ev(1.9, "checkpoint", step=10),
        group(9.0, 2, (200, 201)),
        ev(9.1, "restore", 2, step=10, tier="peer"),
        ev(9.2, "tier_skipped", 2, tier="own", reason="corrupt"),
        ev(9.5, "step", 2, step=11),
    ]
    row = chaos.Row("kill9-rank")
    chaos.measure(row, events, fault_ts=2.35)
    assert row.recovery == "requeue (attempt 2)"
    assert row.steps_lost == 3 and row.tier == "peer" and row.restarted == [0, 1]
    assert row.seconds == pytest.approx(9.5 - 2.35)
    assert row.skipped == ["own:corrupt"]


def test_a_reformed_group_names_only_the_replaced_rank_and_a_restore_without_tier_is_the_disk() -> None:
    events = [
        group(1.0, 1, (100, 101)),
        ev(1.5, "step", step=20),
        ev(3.0, "restore", step=20),
        ev(3.1, "group_reformed", generation=1, replaced=[1], pids={"0": 100, "1": 555}),
        ev(3.2, "step", step=21),
    ]
    row = chaos.Row("kill9-rank")
    chaos.measure(row, events, fault_ts=2.0)
    assert row.recovery == "wait (gen 1)" and row.tier == "disk" and row.steps_lost == 0 and row.restarted == [1]


def test_a_row_is_ok_only_when_bitwise_equal_or_not_applicable() -> None:
    assert not chaos.Row("sigterm", equal=False).ok
    assert not chaos.Row("sigterm", equal=None, error="the job ended failed").ok
    assert chaos.Row("lost-keeper", na="needs --memory").ok
    assert chaos.Row("sigterm", equal=True).cells()[-1] == "yes"


@pytest.mark.timeout(600)
def test_the_short_table_recovers_every_fault_bitwise_equal(tmp_path: Path) -> None:
    """kill -9 of rank 1 of a 2-rank DDP job (memory tier on, recovery wait): the job goes on from a restore
    and ends with the model and optimizer state of the uninterrupted run, bit for bit."""
    argv = [sys.executable, str(BENCH / "chaos.py"), "--json", "--faults", "kill9-rank", "--steps", "30"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=590, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["target_met"] and result["baseline_error"] is None
    rows = {r["fault"]: r for r in result["rows"]}
    assert sorted(rows) == ["kill9-rank"]
    row = rows["kill9-rank"]
    assert row["equal"] is True and row["error"] is None, row
    assert row["recovery"] != "-" and row["tier"] is not None and row["seconds"] is not None, row
    assert 1 in row["restarted"]
