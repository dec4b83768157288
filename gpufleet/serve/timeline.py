"""Cost over time per team: the ledger's GPU-hours and money of each attempt, spread over the hours or days it ran.

An attempt's GPU-hours and money (:func:`gpufleet.cost.ledger.attempt_cost`, the same figures as
``gpufleet cost``) are spread evenly over its wall time, from its start to its end (to now while it
runs), and each bucket gets the share that falls in it. Buckets are whole hours or whole days of
UTC, so a series sums to the team's totals of ``GET /api/cost`` over the same attempts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from gpufleet.cost.ledger import AttemptUsage, attempt_cost
from gpufleet.cost.rates import RateCard
from gpufleet.errors import ParameterError

BUCKETS: dict[str, float] = {"hour": 3600.0, "day": 86_400.0}
AUTO_HOURS_UP_TO_S = 2 * 86_400.0
"""``bucket=auto`` counts by the hour over a span of two days at most, else by the day."""
MAX_BUCKETS = 2_000
"""Buckets a series may have: a longer span asks for the next coarser bucket (422)."""

Bucket = Literal["auto", "hour", "day"]


def pick_bucket(usages: Sequence[AttemptUsage], bucket: Bucket) -> str:
    """``hour`` or ``day``: as asked, or for ``auto`` by the span the attempts cover."""
    if bucket != "auto":
        return bucket
    if not usages:
        return "hour"
    span = max(u.end for u in usages) - min(u.start for u in usages)
    return "hour" if span <= AUTO_HOURS_UP_TO_S else "day"


def _spread(start: float, end: float, size: float) -> list[tuple[float, float]]:
    """``(bucket start, share of [start, end] in it)`` for each bucket of ``size`` seconds the span touches."""
    if end <= start:
        return [(math.floor(start / size) * size, 1.0)]
    out = []
    edge = math.floor(start / size) * size
    while edge < end:
        part = min(end, edge + size) - max(start, edge)
        if part > 0:
            out.append((edge, part / (end - start)))
        edge += size
    return out


def cost_timeline(
    usages: Sequence[AttemptUsage], rates: RateCard, bucket: Bucket = "auto", since: float | None = None
) -> dict[str, Any]:
    """Per team, ``[{"start", "gpu_hours", "money"}]`` per bucket, oldest first, from the first bucket any team
    used to the last (a bucket the team did not use is there with zeros, so a line drawn through them is true).

    With ``since``, only the part of each attempt after it counts (its share of the attempt's cost)."""
    name = pick_bucket(usages, bucket)
    size = BUCKETS[name]
    spans = [(u, max(u.start, since) if since is not None else u.start) for u in usages]
    spans = [(u, begin) for u, begin in spans if u.end >= begin]
    if spans:
        first = min(begin for _, begin in spans)
        count = (max(u.end for u, _ in spans) - first) / size
        if count > MAX_BUCKETS:
            raise ParameterError(
                "{bucket} gives {count!s} buckets over this span: ask for bucket=day or a shorter period",
                bucket=name,
                count=int(count),
            )
    teams: dict[str, dict[float, list[float]]] = {}
    for usage, begin in spans:
        cost = attempt_cost(usage, rates)
        whole = usage.end - usage.start
        kept = (usage.end - begin) / whole if whole > 0 else 1.0
        for edge, share in _spread(begin, usage.end, size):
            cell = teams.setdefault(usage.team, {}).setdefault(edge, [0.0, 0.0])
            cell[0] += cost.total_gpu_hours * kept * share
            cell[1] += cost.money * kept * share
    edges = sorted({edge for cells in teams.values() for edge in cells})
    every = [edges[0] + i * size for i in range(round((edges[-1] - edges[0]) / size) + 1)] if edges else []
    return {
        "bucket": name,
        "bucket_s": size,
        "currency": rates.currency,
        "teams": {
            team: [{"start": e, "gpu_hours": h, "money": m} for e in every for h, m in [cells.get(e, [0.0, 0.0])]]
            for team, cells in sorted(teams.items())
        },
    }


__all__ = ["BUCKETS", "Bucket", "cost_timeline", "pick_bucket"]
