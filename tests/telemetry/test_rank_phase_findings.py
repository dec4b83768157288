"""Straggler and hang findings from the runtime's phase timings (``straggler`` and ``rank_stalled`` events).

Hand-made event lists: a named straggler with its tax in GPU-seconds and money, the latest event of
one straggler winning, malformed events skipped, a healthy run with phase data giving no finding,
the older ``rank_wait_s`` heuristic kept only for attempts without phase data, and a hang with its
threshold, the phase each stuck rank was in and what was done about it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufleet.telemetry.ranks import RankFinding, money_text, phase_totals, rank_findings, stragglers

T0 = 1_796_000_000.0
GROUP = {
    "kind": "group",
    "attempt": 1,
    "ts": T0,
    "ranks": [{"rank": r, "host": f"node-{r}"} for r in range(3)],
}


def straggler(**over: Any) -> dict[str, Any]:
    event = {
        "kind": "straggler",
        "attempt": 1,
        "ts": T0 + 10,
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


def phase_step(step: int, *, attempt: int = 1, waits: list[float] | None = None) -> dict[str, Any]:
    """A step event of an even 3-rank run, with the phase times the runtime adds."""
    per_step = {"data_wait": 0.01, "compute": 0.1, "collective": 0.02, "optimizer": 0.01, "checkpoint": 0.0}
    return {
        "kind": "step",
        "attempt": attempt,
        "ts": T0 + step,
        "step": step,
        "rank_step_s": [0.15] * 3,
        "rank_wait_s": waits or [0.001] * 3,
        "rank_phase_s": {**{k: [v] * 3 for k, v in per_step.items()}, "straggler_wait": [0.0] * 3},
        "phase_totals_s": {**{k: [v * step] * 3 for k, v in per_step.items()}, "straggler_wait": [0.0] * 3},
    }


def test_a_named_straggler_gives_one_finding_with_its_tax_priced() -> None:
    events = [GROUP, straggler(), straggler(ts=T0 + 20, last_step=60, tax_s=6.15, status="ended")]
    (found,) = rank_findings(events, prices={1: 1.2}, currency="USD")
    assert isinstance(found, RankFinding) and found.rule_id == "straggler" and found.gpus == ("rank1@node-1",)
    doc = json.loads(json.dumps(found.to_dict()))
    assert doc["kind"] == "straggler" and doc["rank"] == 1 and doc["host"] == "node-1" and doc["phase"] == "compute"
    assert doc["factor"] == 4.0 and doc["first_step"] == 31 and doc["last_step"] == 60 and doc["status"] == "ended"
    assert doc["tax_gpu_seconds"] == pytest.approx(12.3) and doc["currency"] == "USD"
    assert doc["tax_money"] == pytest.approx(12.3 / 3600 * 1.2)
    assert doc["severity"] == "warning" and doc["threshold"] == 1.5 and doc["duration_s"] == 10.0
    assert found.text == (
        "rank 1 on node-1 is a straggler in compute (x4.0 from step 31): the other ranks waited 12.3 GPU-s ($0.0041)"
    )


def test_without_a_price_the_tax_is_in_gpu_seconds_only() -> None:
    (found,) = rank_findings([straggler(phase="data_wait")], straggler_factor=2.0)
    doc = found.to_dict()
    assert "tax_money" not in doc and "currency" not in doc and doc["threshold"] == 2.0
    assert (
        isinstance(found, RankFinding) and found.text.endswith("waited 6.0 GPU-s") and "data loader" in found.suggestion
    )


def test_each_straggler_is_one_finding() -> None:
    """One finding per (attempt, rank, phase, first step): a rank slow again later is a second one."""
    events = [straggler(), straggler(first_step=90, last_step=95), straggler(rank=2, host="node-2", phase="data_wait")]
    found = rank_findings(events)
    assert sorted((f.to_dict()["rank"], f.to_dict()["first_step"]) for f in found) == [(1, 31), (1, 90), (2, 31)]
    assert len(stragglers([*events, straggler(tax_s=9.0)])) == 3


@pytest.mark.parametrize(
    "bad",
    [
        {"rank": "1"},
        {"rank": -1},
        {"rank": True},
        {"host": 5},
        {"host": ""},
        {"host": "node\n1"},
        {"phase": "collective"},
        {"phase": None},
        {"factor": float("nan")},
        {"factor": "4"},
        {"factor": -1.0},
        {"tax_s": -3.0},
        {"tax_s": float("inf")},
        {"tax_s": None},
        {"first_step": 1.5},
        {"first_step": 50, "last_step": 40},
        {"gpus_per_rank": 0},
        {"gpus_per_rank": 1e9},
        {"gpus_per_rank": 10**9},
        {"status": "maybe"},
    ],
)
def test_a_malformed_straggler_event_is_skipped(bad: dict[str, Any]) -> None:
    assert rank_findings([GROUP, straggler(**bad)]) == []


def test_a_malformed_latest_event_leaves_the_last_good_one() -> None:
    (found,) = rank_findings([straggler(), straggler(ts=T0 + 30, tax_s="lots", status="ended")])
    assert found.to_dict()["tax_s"] == 3.0 and found.to_dict()["status"] == "named"


def test_a_healthy_run_with_phase_data_gives_no_straggler() -> None:
    assert rank_findings([GROUP, *(phase_step(s) for s in range(1, 20))]) == []


def test_the_wait_heuristic_is_kept_only_for_attempts_without_phase_data() -> None:
    """Uneven agreement waits name a straggler in an attempt the runtime did not time, not in one it did
    (there the runtime's own detector, which sees a slow forward too, named nobody)."""
    skewed = [0.05, 0.05, 0.0001]
    timed = [GROUP, *(phase_step(s, waits=skewed) for s in range(1, 8))]
    assert rank_findings(timed) == []
    untimed = [{k: v for k, v in e.items() if not k.startswith(("rank_phase", "phase_"))} for e in timed]
    (old,) = rank_findings(untimed)
    assert old.rule_id == "straggler" and old.gpus == ("rank2@node-2",) and not isinstance(old, RankFinding)
    both = [*timed, *({**e, "attempt": 2} for e in untimed)]
    assert [f.to_dict()["extra"]["attempt"] for f in rank_findings(both)] == [2]


def test_phase_totals_take_the_latest_well_formed_table() -> None:
    events = [phase_step(5), phase_step(9), {**phase_step(10), "phase_totals_s": {"compute": [1.0, "x", 2.0]}}]
    events.append({**phase_step(11), "phase_totals_s": {"compute": [1.0, 2.0], "data_wait": [1.0]}})
    assert phase_totals(events)[1]["compute"] == pytest.approx([0.9] * 3)


def hung(**over: Any) -> dict[str, Any]:
    event = {
        "kind": "rank_stalled",
        "attempt": 1,
        "ts": T0 + 50,
        "step": 7,
        "ranks": [1],
        "hosts": ["node-1"],
        "seconds": 45.0,
        "timeout_s": 300.0,
        "where": {"1": "model.py:10 in forward"},
        "threshold_s": 30.0,
        "median_step_s": 0.8,
        "phases": {"1": "compute"},
        "hung": True,
        "action": "killed",
    }
    return {**event, **over}


def test_a_hang_names_the_phase_threshold_and_action() -> None:
    (found,) = rank_findings([GROUP, hung()])
    doc = json.loads(json.dumps(found.to_dict()))
    assert doc["rule_id"] == "hung_rank" and doc["kind"] == "hung_rank" and doc["threshold"] == 30.0
    assert doc["threshold_s"] == 30.0 and doc["median_step_s"] == 0.8 and doc["phases"] == {"1": "compute"}
    assert doc["action"] == "killed" and doc["hung"] is True and doc["hosts"] == ["node-1"]
    assert isinstance(found, RankFinding)
    assert found.text == (
        "rank 1 on node-1 (in compute) stopped at step 7 (attempt 1): no step for 45 s, over the 30 s threshold, "
        "0.8 s median step; its frozen processes were killed so the recovery policy applies"
    )


def test_a_hang_without_the_new_fields_keeps_the_quarter_timeout() -> None:
    old = {k: v for k, v in hung().items() if k not in ("threshold_s", "median_step_s", "phases", "hung", "action")}
    (found,) = rank_findings([old])
    assert found.threshold == 75.0 and found.gpus == ("rank1@node-1",) and found.to_dict()["action"] is None
    bad = hung(threshold_s=-1, phases={"1": "lunch"}, action="shrugged")
    (odd,) = rank_findings([GROUP, bad])
    assert odd.threshold == 75.0 and odd.to_dict()["phases"] == {"1": "unknown"} and odd.to_dict()["action"] is None
    assert "reported" in rank_findings([hung(action="reported")])[0].to_dict()["action"]


def test_money_is_written_plainly() -> None:
    assert money_text(0.0041, "USD") == "$0.0041" and money_text(12.5, "EUR") == "12.50 EUR"
    assert money_text(0.00001234, "USD") == "$0.000012" and money_text(0.00997, "USD") == "$0.010"


def test_a_straggler_over_a_whole_attempt_comes_from_its_phase_totals() -> None:
    """No straggler event (a short attempt, a slowdown outside the forward and backward): the totals decide."""
    group = {"kind": "group", "attempt": 1, "ts": 1.0, "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "b"}]}
    totals = {
        "data_wait": [0.1, 0.1],
        "compute": [1.0, 3.0],
        "collective": [2.2, 0.2],
        "optimizer": [0.1, 0.1],
        "checkpoint": [0.0, 0.0],
        "straggler_wait": [2.0, 0.0],
    }
    end = {"kind": "session_end", "attempt": 1, "ts": 9.0, "phase_totals_s": totals}
    found = [f.to_dict() for f in rank_findings([group, end], prices={1: 3600.0})]
    assert [(f["kind"], f["rank"], f["host"], f["phase"]) for f in found] == [("straggler", 1, "b", "compute")]
    assert found[0]["factor"] == 3.0 and found[0]["tax_gpu_seconds"] == 2.0 and found[0]["tax_money"] == 2.0
    even = {**end, "phase_totals_s": {**totals, "compute": [1.0, 1.2], "straggler_wait": [0.2, 0.0]}}
    assert rank_findings([group, even]) == []
    idle = {**end, "phase_totals_s": {**totals, "straggler_wait": [0.01, 0.0]}}  # slower, but nobody waited
    assert rank_findings([group, idle]) == []
