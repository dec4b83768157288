"""Findings about the ranks of a distributed job, read from its events (no GPU series needed).

* ``hung_rank``: a rank stopped stepping and the others waited for it until the attempt ended.
  The evidence is the ``rank_stalled`` event of the waiting ranks' watchdog
  (:mod:`gpufleet.runtime.watchdog`), which names the rank, its host and where it stood, with
  no ``rank_stall_cleared`` after it in the same attempt.
* ``straggler``: one rank holds the others up at every step. At each step agreement every rank
  records how long it waited for the rest (``rank_wait_s`` in the step events, also the
  ``gpufleet_rank_wait_seconds`` gauge); the rank that barely waits is the one the others wait
  for. A finding when the other ranks spend at least ``wait_fraction`` (10%) of their step
  waiting for it. A stall that cleared by itself is reported here too, with its length.

Limits: the per-rank step time is measured between step agreements. Under DDP the ranks also
meet inside ``backward`` (the gradient all-reduce), so a rank slow in its forward pass makes the
others wait there, not at the agreement, and its step time looks like theirs; the watchdog still
names a rank that stops altogether, wherever it stops.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from gpufleet.jobs.events import EventKind
from gpufleet.telemetry.diagnose import Finding, Rule

RANK_RULES: Mapping[str, Rule] = {
    "hung_rank": Rule(
        "A rank stopped stepping",
        "critical",
        "gpufleet watchdog: the other ranks waited for it longer than a quarter of the group timeout",
        "Look at that rank's host and its log (gpufleet logs JOB); the attempt was requeued from the last "
        "checkpoint. A rank that hangs again on the same host points at the host (drain it).",
    ),
    "straggler": Rule(
        "One rank holds the others up",
        "warning",
        "gpufleet heuristic: the other ranks wait for it in the step agreement for >= 10% of their step",
        "Check that rank's host (slower GPU, throttling, a noisy neighbour, uneven data); balance the work "
        "per rank or move the job.",
    ),
}


def _hosts(events: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], str]:
    """(attempt, rank) -> host, from the ``group`` event each attempt's rank 0 writes."""
    out: dict[tuple[int, int], str] = {}
    for event in events:
        if event.get("kind") == EventKind.GROUP and isinstance(event.get("ranks"), list):
            for item in event["ranks"]:
                if isinstance(item, Mapping) and isinstance(item.get("rank"), int):
                    out[(int(event.get("attempt") or 0), item["rank"])] = str(item.get("host", "?"))
    return out


def _finding(rule_id: str, **fields: Any) -> Finding:
    rule = RANK_RULES[rule_id]
    return Finding(
        rule_id=rule_id,
        title=rule.title,
        severity=rule.severity,
        source=rule.source,
        suggestion=rule.suggestion,
        **fields,
    )


def _numbers(value: Any) -> list[float] | None:
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return None
    return [float(v) for v in value]


def rank_findings(events: Iterable[Mapping[str, Any]], *, wait_fraction: float = 0.10) -> list[Finding]:
    """``hung_rank`` and ``straggler`` findings for a job's events, most severe first."""
    events = list(events)
    hosts = _hosts(events)
    findings: list[Finding] = []
    open_stalls: dict[int, Mapping[str, Any]] = {}
    cleared: list[tuple[Mapping[str, Any], float]] = []
    for event in events:
        kind, attempt = event.get("kind"), int(event.get("attempt") or 0)
        if kind == EventKind.RANK_STALLED:
            open_stalls[attempt] = event
        elif kind == EventKind.RANK_STALL_CLEARED and attempt in open_stalls:
            stall = open_stalls.pop(attempt)
            cleared.append((stall, float(event.get("ts", 0)) - float(stall.get("ts", 0)) + float(stall["seconds"])))
    for attempt, stall in sorted(open_stalls.items()):
        ranks = [int(r) for r in stall.get("ranks") or [] if isinstance(r, int)]
        names = tuple(f"rank{r}@{hosts.get((attempt, r), '?')}" for r in ranks)
        findings.append(
            _finding(
                "hung_rank",
                metric="rank_stalled",
                observed=float(stall.get("seconds", 0.0)),
                statistic=f"seconds without a step at step {stall.get('step')} (attempt {attempt})",
                comparison=">=",
                threshold=float(stall.get("timeout_s", 0.0)) / 4,
                duration_s=float(stall.get("seconds", 0.0)),
                gpus=names,
                extra={"attempt": attempt, "step": stall.get("step"), "where": stall.get("where"), "ranks": ranks},
            )
        )
    for stall, seconds in cleared:
        attempt = int(stall.get("attempt") or 0)
        ranks = [int(r) for r in stall.get("ranks") or [] if isinstance(r, int)]
        findings.append(
            _finding(
                "straggler",
                metric="rank_stalled",
                observed=seconds,
                statistic=f"seconds the others waited for it at step {stall.get('step')} (attempt {attempt})",
                comparison=">=",
                threshold=float(stall.get("timeout_s", 0.0)) / 4,
                duration_s=seconds,
                gpus=tuple(f"rank{r}@{hosts.get((attempt, r), '?')}" for r in ranks),
                extra={"attempt": attempt, "step": stall.get("step"), "ranks": ranks},
            )
        )
    findings.extend(_stragglers(events, hosts, wait_fraction))
    return sorted(findings, key=lambda f: (f.severity != "critical", f.rule_id))


def _stragglers(
    events: list[Mapping[str, Any]], hosts: dict[tuple[int, int], str], wait_fraction: float
) -> list[Finding]:
    per_attempt: dict[int, tuple[list[list[float]], list[list[float]], float, float]] = {}
    for event in events:
        if event.get("kind") != EventKind.STEP:
            continue
        step_s, wait_s = _numbers(event.get("rank_step_s")), _numbers(event.get("rank_wait_s"))
        if step_s is None or wait_s is None or len(step_s) != len(wait_s) or len(step_s) < 2:
            continue
        attempt = int(event.get("attempt") or 0)
        steps, waits, first, _ = per_attempt.get(attempt, ([], [], float(event.get("ts", 0)), 0.0))
        steps.append(step_s)
        waits.append(wait_s)
        per_attempt[attempt] = (steps, waits, first, float(event.get("ts", 0)))
    out = []
    for attempt, (steps, waits, first, last) in sorted(per_attempt.items()):
        world = len(steps[0])
        if any(len(s) != world for s in steps) or len(steps) < 3:
            continue  # a few windows are not a pattern
        mean_wait = [statistics.fmean(w[r] for w in waits) for r in range(world)]
        mean_step = [statistics.fmean(s[r] for s in steps) for r in range(world)]
        slow = min(range(world), key=lambda r: mean_wait[r])
        others = [r for r in range(world) if r != slow]
        waited = statistics.fmean(mean_wait[r] for r in others)
        step = statistics.fmean(mean_step[r] + mean_wait[r] for r in others)
        if step <= 0 or waited < 1e-3:
            continue
        fraction = waited / step
        if fraction < wait_fraction:
            continue
        out.append(
            _finding(
                "straggler",
                metric="gpufleet_rank_wait_seconds",
                observed=fraction,
                statistic=f"share of the other ranks' step spent waiting for it (attempt {attempt}, "
                f"{waited * 1000:.1f} ms a step)",
                comparison=">=",
                threshold=wait_fraction,
                duration_s=max(0.0, last - first),
                gpus=(f"rank{slow}@{hosts.get((attempt, slow), '?')}",),
                extra={"attempt": attempt, "rank_wait_s": mean_wait, "rank_step_s": mean_step},
            )
        )
    return out


__all__ = ["RANK_RULES", "rank_findings"]
