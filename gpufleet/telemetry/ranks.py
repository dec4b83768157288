"""Findings about the ranks of a distributed job, read from its events (no GPU series needed).

* ``hung_rank``: a rank stopped stepping and the others waited for it until the attempt ended.
  The evidence is the ``rank_stalled`` event of the runtime's watchdog
  (:mod:`gpufleet.runtime.watchdog`), which names the rank, its host, the phase it was in, the
  threshold it crossed (a multiple of the median step, below the group timeout) and whether its
  frozen processes were killed, with no ``rank_stall_cleared`` after it in the same attempt.
* ``straggler``: one rank holds the others up. Rank 0 times every rank's phases at every step
  (``data_wait``, ``compute``, ``collective``, ``optimizer``, ``checkpoint``) and names a rank whose
  compute or data wait exceeds the other ranks' median by ``distributed.straggler_factor`` in a
  ``straggler`` event, with the tax: the seconds the other ranks spent waiting for it, priced in
  GPU-seconds and, with the attempt's price, money. The latest event of one straggler (attempt,
  rank, phase, first step) is the truth: ``named`` while it lasts, ``ended`` with the final tax.

An attempt written before the runtime timed phases (no ``phase_totals_s``, no ``straggler`` event)
keeps the older heuristic: at each step agreement every rank records how long it waited for the
rest (``rank_wait_s``); the rank that barely waits is the one the others wait for, a finding when
they spend at least ``wait_fraction`` (10%) of their step waiting. Under DDP the ranks also meet
inside ``backward``, so that heuristic misses a rank slow in its forward pass; the phase timings do
not. A stall that cleared by itself is reported as a straggler too, with its length.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpufleet.jobs.events import EventKind
from gpufleet.jobs.rank_phases import (
    MAX_RANKS,
    PHASES,
    STRAGGLER_PHASES,
    Straggler,
    event_attempt,
    is_host,
    phase_table,
    rank_number,
    rank_seconds,
    stragglers,
)
from gpufleet.telemetry.diagnose import Finding, Rule

RANK_RULES: Mapping[str, Rule] = {
    "hung_rank": Rule(
        "A rank stopped stepping",
        "critical",
        "gpufleet watchdog: no step for hang_factor x the median step (at least hang_floor_seconds), or a "
        "quarter of the group timeout",
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

STRAGGLER_SOURCE = (
    "gpufleet runtime: rank 0 times every rank's phases at every step and names a rank whose compute or data "
    "wait exceeds the other ranks' median by distributed.straggler_factor"
)
STRAGGLER_SUGGESTIONS: Mapping[str, str] = {
    "compute": "Check that rank's host (slower GPU, throttling, a noisy neighbour): drain it or move the job; "
    "uneven work per rank shows here too.",
    "data_wait": "Feed that rank's data loader: more workers, prefetch, or stage the data on its host "
    "(data.sources); an uneven shard shows here too.",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class RankFinding(Finding):
    """A finding about ranks, with its fields (``extra``) also at the top of its JSON and a sentence to print.

    The JSON of ``gpufleet diagnose`` and of the server's diagnosis says ``kind``, ``rank``, ``host``,
    ``phase``... beside the fields every finding has, so a reader needs no knowledge of ``extra``.
    """

    text: str = ""
    """One sentence that names the rank, its host, what it did and what it cost."""

    def to_dict(self) -> dict[str, Any]:
        own = asdict(self)
        return {**self.extra, **own}


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


def _ts(event: Mapping[str, Any]) -> float:
    return _number(event.get("ts")) or 0.0


@dataclass(frozen=True, slots=True)
class _Stall:
    """A ``rank_stalled`` event of the expected shape (the watchdog's, :mod:`gpufleet.runtime.watchdog`).

    The fields after ``where`` came with the hang threshold; an older event, or one of them malformed,
    leaves them ``None`` (empty for ``phases``) and the stall is still reported.
    """

    attempt: int
    ts: float
    seconds: float
    ranks: list[int]
    timeout_s: float
    step: int | None
    where: dict[str, str] | None
    hosts: dict[int, str]
    """Rank -> host as the event names them (the ``group`` event's hosts come first)."""
    threshold_s: float | None = None
    median_step_s: float | None = None
    phases: dict[str, str] | None = None
    action: str | None = None

    @property
    def threshold(self) -> float:
        """The time without a step that made it a hang: the event's own, else a quarter of the timeout."""
        return self.threshold_s if self.threshold_s is not None else self.timeout_s / 4


def _phases(value: Any, ranks: list[int]) -> dict[str, str] | None:
    """``{"<rank>": phase}`` for the stuck ranks; a phase outside the known ones reads ``unknown``."""
    if not isinstance(value, dict):
        return None
    known = (*PHASES, "unknown")
    out = {}
    for rank in ranks:
        phase = value.get(str(rank))
        out[str(rank)] = phase if isinstance(phase, str) and phase in known else "unknown"
    return out


def _stall(event: Mapping[str, Any]) -> _Stall | None:
    """The stall a ``rank_stalled`` event reports, or ``None`` when a field has the wrong shape (it is skipped):
    ``seconds`` and ``timeout_s`` durations, ``ranks`` a list of rank numbers, ``step`` an integer."""
    seconds, timeout_s = _seconds(event.get("seconds"), 0.0), _seconds(event.get("timeout_s"), 0.0)
    raw_ranks, step, where = event.get("ranks", []), event.get("step"), event.get("where")
    if seconds is None or timeout_s is None or not isinstance(raw_ranks, list) or len(raw_ranks) > MAX_RANKS:
        return None
    ranks = [r for r in (rank_number(r) for r in raw_ranks) if r is not None]
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        return None
    places = where if isinstance(where, dict) and all(isinstance(v, str) for v in where.values()) else None
    raw_hosts = event.get("hosts")
    same = isinstance(raw_hosts, list) and len(raw_hosts) == len(raw_ranks)
    pairs = zip(raw_ranks, raw_hosts, strict=True) if same and isinstance(raw_hosts, list) else iter(())
    hosts = {r: h for r, h in pairs if rank_number(r) is not None and is_host(h)}
    action = event.get("action")
    return _Stall(
        event_attempt(event),
        _ts(event),
        seconds,
        ranks,
        timeout_s,
        step,
        places,
        hosts,
        threshold_s=_seconds(event.get("threshold_s")),
        median_step_s=_seconds(event.get("median_step_s")),
        phases=_phases(event.get("phases"), ranks),
        action=action if action in ("killed", "reported") else None,
    )


def _hosts(events: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], str]:
    """(attempt, rank) -> host, from the ``group`` event each attempt's rank 0 writes."""
    out: dict[tuple[int, int], str] = {}
    for event in events:
        if event.get("kind") == EventKind.GROUP and isinstance(event.get("ranks"), list):
            for item in event["ranks"]:
                rank = rank_number(item.get("rank")) if isinstance(item, Mapping) else None
                if rank is not None:
                    host = item.get("host")
                    out[(event_attempt(event), rank)] = host if is_host(host) else "?"
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


def _rank_finding(
    rule_id: str, *, source: str | None = None, suggestion: str | None = None, **fields: Any
) -> RankFinding:
    rule = RANK_RULES[rule_id]
    return RankFinding(
        rule_id=rule_id,
        title=rule.title,
        severity=rule.severity,
        source=source or rule.source,
        suggestion=suggestion or rule.suggestion,
        **fields,
    )


def phase_totals(events: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, list[float]]]:
    """Attempt -> its ranks' cumulative seconds in each phase, from its latest well-formed ``phase_totals_s``
    (a ``step`` or its ``session_end``): the totals only grow within an attempt."""
    out: dict[int, dict[str, list[float]]] = {}
    for event in events:
        if event.get("kind") in (EventKind.STEP, EventKind.SESSION_END):
            table = phase_table(event.get("phase_totals_s"))
            if table is not None:
                out[event_attempt(event)] = table
    return out


def _timed_attempts(events: list[Mapping[str, Any]]) -> set[int]:
    """The attempts whose runtime timed the ranks' phases: they have ``phase_totals_s`` or ``straggler`` events."""
    return {
        event_attempt(e)
        for e in events
        if e.get("kind") == EventKind.STRAGGLER
        or (e.get("kind") in (EventKind.STEP, EventKind.SESSION_END) and isinstance(e.get("phase_totals_s"), dict))
    }


def rank_findings(
    events: Iterable[Mapping[str, Any]],
    *,
    wait_fraction: float = 0.10,
    straggler_factor: float = 1.5,
    prices: Mapping[int, float] | None = None,
    currency: str = "USD",
) -> list[Finding]:
    """``hung_rank`` and ``straggler`` findings for a job's events, most severe first.

    ``prices``: attempt -> its price of a GPU-hour in ``currency`` (the ledger's rate: telemetry sits below
    ``cost``, so the caller looks it up); a straggler's tax is then priced too. ``straggler_factor`` is the
    job's ``distributed.straggler_factor``, shown as the threshold its stragglers crossed.
    """
    events = list(events)
    hosts = _hosts(events)
    findings: list[Finding] = []
    open_stalls: dict[int, _Stall] = {}
    cleared: list[tuple[_Stall, float]] = []
    for event in events:
        kind, attempt = event.get("kind"), event_attempt(event)
        if kind == EventKind.RANK_STALLED:
            stall = _stall(event)
            if stall is not None:
                open_stalls[attempt] = stall
        elif kind == EventKind.RANK_STALL_CLEARED and attempt in open_stalls:
            stall = open_stalls.pop(attempt)
            cleared.append((stall, max(0.0, _ts(event) - stall.ts) + stall.seconds))
    findings.extend(_hung(stall, hosts) for _, stall in sorted(open_stalls.items()))
    for stall, seconds in cleared:
        attempt = stall.attempt
        findings.append(
            _finding(
                "straggler",
                metric="rank_stalled",
                observed=seconds,
                statistic=f"seconds the others waited for it at step {stall.step} (attempt {attempt})",
                comparison=">=",
                threshold=stall.threshold,
                duration_s=seconds,
                gpus=tuple(f"rank{r}@{_where(stall, hosts, r)}" for r in stall.ranks),
                extra={"attempt": attempt, "step": stall.step, "ranks": stall.ranks},
            )
        )
    prices = prices or {}
    named = sorted(stragglers(events), key=lambda s: -s.tax_s)
    findings.extend(_straggler_finding(s, straggler_factor, prices.get(s.attempt), currency) for s in named)
    timed = _timed_attempts(events)
    findings.extend(_stragglers([e for e in events if event_attempt(e) not in timed], hosts, wait_fraction))
    named_in = {s.attempt for s in named}
    for attempt, totals in sorted(phase_totals(events).items()):
        if attempt not in named_in:
            found = _attempt_straggler(attempt, totals, hosts, straggler_factor, wait_fraction)
            if found is not None:
                findings.append(_straggler_finding(found, straggler_factor, prices.get(attempt), currency, whole=True))
    return sorted(findings, key=lambda f: (f.severity != "critical", f.rule_id))


def _where(stall: _Stall, hosts: dict[tuple[int, int], str], rank: int) -> str:
    known = hosts.get((stall.attempt, rank), "?")
    return known if known != "?" else stall.hosts.get(rank, "?")


def _hung(stall: _Stall, hosts: dict[tuple[int, int], str]) -> RankFinding:
    """A ``hung_rank`` finding: each stuck rank with its host and the phase it was in, the threshold, the action."""
    attempt, phases = stall.attempt, stall.phases or {}
    names = tuple(f"rank{r}@{_where(stall, hosts, r)}" for r in stall.ranks)
    stuck = ", ".join(
        f"rank {r} on {_where(stall, hosts, r)}" + (f" (in {phases[str(r)]})" if str(r) in phases else "")
        for r in stall.ranks
    )
    median = f", {stall.median_step_s:.3g} s median step" if stall.median_step_s is not None else ""
    done = {"killed": "; its frozen processes were killed so the recovery policy applies", "reported": "; reported"}
    text = (
        f"{stuck or 'a rank'} stopped at step {stall.step} (attempt {attempt}): no step for {stall.seconds:.0f} s, "
        f"over the {stall.threshold:.3g} s threshold{median}{done.get(stall.action or '', '')}"
    )
    return _rank_finding(
        "hung_rank",
        metric="rank_stalled",
        observed=stall.seconds,
        statistic=f"seconds without a step at step {stall.step} (attempt {attempt})",
        comparison=">=",
        threshold=stall.threshold,
        duration_s=stall.seconds,
        gpus=names,
        text=text,
        extra={
            "kind": "hung_rank",
            "attempt": attempt,
            "step": stall.step,
            "where": stall.where,
            "ranks": stall.ranks,
            "hosts": [_where(stall, hosts, r) for r in stall.ranks],
            "threshold_s": stall.threshold_s,
            "median_step_s": stall.median_step_s,
            "phases": stall.phases,
            "action": stall.action,
            "hung": True,
        },
    )


def money_text(amount: float, currency: str) -> str:
    """``$0.0041`` or ``0.0041 EUR``: two significant digits below one unit, cents above."""
    if amount >= 1 or amount <= 0:
        digits = f"{max(amount, 0.0):,.2f}"
    else:  # two significant digits, written out (a CPU demo costs millionths), never in scientific notation
        rounded = float(f"{amount:.2g}")
        digits = f"{rounded:.{min(12, 1 - math.floor(math.log10(rounded)))}f}"
    return f"${digits}" if currency == "USD" else f"{digits} {currency}"


def _straggler_finding(
    s: Straggler, factor: float, price: float | None, currency: str, *, whole: bool = False
) -> RankFinding:
    money = s.tax_money(price)
    cost = f" ({money_text(money, currency)})" if money is not None else ""
    when = f"over attempt {s.attempt}" if whole else f"from step {s.first_step}"
    text = (
        f"rank {s.rank} on {s.host} is a straggler in {s.phase} (x{s.factor:.1f} {when}): "
        f"the other ranks waited {s.tax_gpu_seconds:.1f} GPU-s{cost}"
    )
    extra: dict[str, Any] = {"kind": "straggler", **s.to_dict()}
    if money is not None:
        extra.update(tax_money=money, currency=currency)
    return _rank_finding(
        "straggler",
        source=STRAGGLER_SOURCE,
        suggestion=STRAGGLER_SUGGESTIONS[s.phase],
        metric="straggler",
        observed=s.factor,
        statistic=f"its {s.phase} seconds over the other ranks' median (attempt {s.attempt}, whole attempt)"
        if whole
        else f"its {s.phase} seconds a step over the other ranks' median (attempt {s.attempt}, "
        f"steps {s.first_step}-{s.last_step}, {s.status})",
        comparison=">=",
        threshold=factor,
        duration_s=max(0.0, s.ts - s.since),
        gpus=(f"rank{s.rank}@{s.host}",),
        text=text,
        extra=extra,
    )


def _attempt_straggler(
    attempt: int,
    totals: Mapping[str, list[float]],
    hosts: dict[tuple[int, int], str],
    factor: float,
    wait_fraction: float,
) -> Straggler | None:
    """A straggler over a whole attempt, from its ranks' phase totals, where the runtime named none online.

    The online detector needs a dozen steps before it judges and a slowdown in the forward and backward's own
    work; an attempt too short for it, or whose slow rank lost its time elsewhere (a sleep, host-side work
    between the steps), is judged here on its totals: a rank whose ``compute`` or ``data_wait`` is
    ``factor`` times the other ranks' median while they spent ``wait_fraction`` of their time waiting for
    slower ranks (``straggler_wait``). One GPU a rank is assumed for the tax.
    """
    waits = totals.get("straggler_wait")
    world = len(waits) if waits else 0
    if waits is None or world < 2:
        return None
    spent = [sum(totals[p][r] for p in PHASES if p in totals and p != "straggler_wait") for r in range(world)]
    best: tuple[float, int, str] | None = None
    for phase in STRAGGLER_PHASES:
        values = totals.get(phase) or []
        for rank in range(len(values)):
            median = statistics.median(v for r, v in enumerate(values) if r != rank)
            ratio = values[rank] / median if median > 0 else math.inf
            if ratio >= factor and (best is None or ratio > best[0]):
                best = (ratio, rank, phase)
    if best is None:
        return None
    ratio, rank, phase = best
    others = [r for r in range(world) if r != rank]
    tax = sum(waits[r] for r in others)
    if tax < wait_fraction * sum(spent[r] for r in others):
        return None
    return Straggler(
        attempt=attempt,
        rank=rank,
        host=hosts.get((attempt, rank), "?"),
        phase=phase,
        factor=min(ratio, 1000.0),
        first_step=0,
        last_step=0,
        tax_s=tax,
        gpus_per_rank=1,
        status="ended",
        ts=0.0,
        since=0.0,
    )


def _stragglers(
    events: list[Mapping[str, Any]], hosts: dict[tuple[int, int], str], wait_fraction: float
) -> list[Finding]:
    per_attempt: dict[int, tuple[list[list[float]], list[list[float]], float, float]] = {}
    for event in events:
        if event.get("kind") != EventKind.STEP:
            continue
        step_s, wait_s = rank_seconds(event.get("rank_step_s")), rank_seconds(event.get("rank_wait_s"))
        if step_s is None or wait_s is None or len(step_s) != len(wait_s) or len(step_s) < 2:
            continue
        attempt = event_attempt(event)
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


__all__ = [
    "MAX_RANKS",
    "PHASES",
    "RANK_RULES",
    "STRAGGLER_PHASES",
    "RankFinding",
    "Straggler",
    "money_text",
    "phase_totals",
    "rank_findings",
    "stragglers",
]
