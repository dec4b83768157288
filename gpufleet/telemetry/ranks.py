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

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


MAX_RANKS = 1 << 20
"""More ranks than any job has: a rank number or a per-rank list beyond it is a broken event."""


def _number(value: Any) -> float | None:
    """A finite number, else ``None``: events come from a file user code writes."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None


def _seconds(value: Any, default: float | None = None) -> float | None:
    """A duration: a finite number, not negative; ``default`` when there is none, ``None`` when it is not one."""
    if value is None:
        return default
    number = _number(value)
    return number if number is not None and number >= 0 else None


def _rank(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_RANKS
    return value if ok else None


def _attempt(event: Mapping[str, Any]) -> int:
    """The event's attempt number (0 when it has none)."""
    value = event.get("attempt")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _ts(event: Mapping[str, Any]) -> float:
    return _number(event.get("ts")) or 0.0


@dataclass(frozen=True, slots=True)
class _Stall:
    """A ``rank_stalled`` event of the expected shape (the watchdog's, :mod:`gpufleet.runtime.watchdog`)."""

    attempt: int
    ts: float
    seconds: float
    ranks: list[int]
    timeout_s: float
    step: int | None
    where: dict[str, str] | None


def _stall(event: Mapping[str, Any]) -> _Stall | None:
    """The stall a ``rank_stalled`` event reports, or ``None`` when a field has the wrong shape (it is skipped):
    ``seconds`` and ``timeout_s`` durations, ``ranks`` a list of rank numbers, ``step`` an integer."""
    seconds, timeout_s = _seconds(event.get("seconds"), 0.0), _seconds(event.get("timeout_s"), 0.0)
    raw_ranks, step, where = event.get("ranks", []), event.get("step"), event.get("where")
    if seconds is None or timeout_s is None or not isinstance(raw_ranks, list) or len(raw_ranks) > MAX_RANKS:
        return None
    ranks = [_rank(r) for r in raw_ranks]
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        return None
    places = where if isinstance(where, dict) and all(isinstance(v, str) for v in where.values()) else None
    return _Stall(_attempt(event), _ts(event), seconds, [r for r in ranks if r is not None], timeout_s, step, places)


def _hosts(events: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], str]:
    """(attempt, rank) -> host, from the ``group`` event each attempt's rank 0 writes."""
    out: dict[tuple[int, int], str] = {}
    for event in events:
        if event.get("kind") == EventKind.GROUP and isinstance(event.get("ranks"), list):
            for item in event["ranks"]:
                rank = _rank(item.get("rank")) if isinstance(item, Mapping) else None
                if rank is not None:
                    host = item.get("host")
                    out[(_attempt(event), rank)] = host if isinstance(host, str) else "?"
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
    """Per-rank seconds: a list of finite durations, one a rank; else ``None``."""
    if not isinstance(value, list) or not 0 < len(value) <= MAX_RANKS:
        return None
    numbers = [_seconds(v) for v in value]
    return None if any(n is None for n in numbers) else [n or 0.0 for n in numbers]


def rank_findings(events: Iterable[Mapping[str, Any]], *, wait_fraction: float = 0.10) -> list[Finding]:
    """``hung_rank`` and ``straggler`` findings for a job's events, most severe first."""
    events = list(events)
    hosts = _hosts(events)
    findings: list[Finding] = []
    open_stalls: dict[int, _Stall] = {}
    cleared: list[tuple[_Stall, float]] = []
    for event in events:
        kind, attempt = event.get("kind"), _attempt(event)
        if kind == EventKind.RANK_STALLED:
            stall = _stall(event)
            if stall is not None:
                open_stalls[attempt] = stall
        elif kind == EventKind.RANK_STALL_CLEARED and attempt in open_stalls:
            stall = open_stalls.pop(attempt)
            cleared.append((stall, max(0.0, _ts(event) - stall.ts) + stall.seconds))
    for attempt, stall in sorted(open_stalls.items()):
        names = tuple(f"rank{r}@{hosts.get((attempt, r), '?')}" for r in stall.ranks)
        findings.append(
            _finding(
                "hung_rank",
                metric="rank_stalled",
                observed=stall.seconds,
                statistic=f"seconds without a step at step {stall.step} (attempt {attempt})",
                comparison=">=",
                threshold=stall.timeout_s / 4,
                duration_s=stall.seconds,
                gpus=names,
                extra={"attempt": attempt, "step": stall.step, "where": stall.where, "ranks": stall.ranks},
            )
        )
    for stall, seconds in cleared:
        attempt = stall.attempt
        findings.append(
            _finding(
                "straggler",
                metric="rank_stalled",
                observed=seconds,
                statistic=f"seconds the others waited for it at step {stall.step} (attempt {attempt})",
                comparison=">=",
                threshold=stall.timeout_s / 4,
                duration_s=seconds,
                gpus=tuple(f"rank{r}@{hosts.get((attempt, r), '?')}" for r in stall.ranks),
                extra={"attempt": attempt, "step": stall.step, "ranks": stall.ranks},
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
        attempt = _attempt(event)
        steps, waits, first, _ = per_attempt.get(attempt, ([], [], _ts(event), 0.0))
        steps.append(step_s)
        waits.append(wait_s)
        per_attempt[attempt] = (steps, waits, first, _ts(event))
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


__all__ = ["MAX_RANKS", "RANK_RULES", "rank_findings"]
