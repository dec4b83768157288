"""How one job's candidate is chosen, given its costs, the capacity left and the quota book.

The rule of :mod:`gpufleet.placement.planner`'s docstring for one job: the best rank that still
has a candidate with capacity (ranked jobs), then the cheapest, the lowest candidate index on a
tie; a candidate whose quota check fails takes every candidate of the same quota row needing as
many GPUs or more out with it. :func:`choose` decides the usual cases without array work and
hands the rest to :func:`choose_among`. Private to the placement package.
"""

from __future__ import annotations

import numpy as np

from gpufleet.placement.candidates import F8, I8, OfferGroup
from gpufleet.placement.costing import CostTables
from gpufleet.placement.quota import Admission, QuotaBook


def choose(
    t: CostTables, j: int, group: OfferGroup, key: F8, first: int, left: I8, book: QuotaBook
) -> tuple[int, Admission | None, list[tuple[int, int, str]]]:
    """The candidate job ``j`` wins (-1: none), its admission, and the quota checks that failed.

    ``key`` is the job's row of :meth:`CostTables.block` over its ``group``'s candidates, less those
    that lacked capacity when its block began (capacity only shrinks), ``first`` its argmin (-1: an
    empty group), ``left`` the capacity left. The usual cases take no array work: no candidate at
    all, or the cheapest candidate of an unranked job fits capacity and quota (no other could win:
    ties go to the lowest index either way). Otherwise :func:`choose_among` runs the full rule.
    """
    if first < 0 or key[first] == np.inf:
        return -1, None, []
    alloc, rows = group.alloc[t.klass[j]], group.resources[t.team_row[j]]
    failed: list[tuple[int, int, str]] = []
    c = int(group.candidates[first])
    if not t.ranked[j] and left[c] >= alloc[first]:
        row, need = int(rows[first]), int(alloc[first])
        why = book.why_not(row, need) if row >= 0 else None
        if why is None:
            return c, (book.admit(row, need) if row >= 0 else None), failed
        failed.append((row, need, why))
    return choose_among(t, j, group, key, left, book, failed)


def choose_among(
    t: CostTables, j: int, group: OfferGroup, key: F8, left: I8, book: QuotaBook, failed: list[tuple[int, int, str]]
) -> tuple[int, Admission | None, list[tuple[int, int, str]]]:
    """The choice rule on job ``j``'s finite candidates only (others are out, and out they stay),
    after the quota checks that ``failed`` already."""
    live = (key < np.inf).nonzero()[0]  # ascending, so an argmin's tie still goes to the lowest index
    if not len(live):
        return -1, None, failed
    candidates = group.candidates[live]
    alloc, rows = group.alloc[t.klass[j], live], group.resources[t.team_row[j], live]
    keys = np.where(left[candidates] >= alloc, key[live], np.inf)
    for row, need, _ in failed:
        keys[(rows == row) & (alloc >= need)] = np.inf
    tiers = np.repeat(group.tiers[t.slot[j]], 2)[live] if t.ranked[j] else None
    while True:
        if tiers is None:
            best = int(keys.argmin())
        else:  # the best rank that still has a candidate, then the cheapest within it
            fits = keys < np.inf
            if not fits.any():
                return -1, None, failed
            best = int(np.where(tiers == tiers[fits].min(), keys, np.inf).argmin())
        if keys[best] == np.inf:
            return -1, None, failed
        row, need = int(rows[best]), int(alloc[best])
        why = book.why_not(row, need) if row >= 0 else None
        if why is None:
            return int(candidates[best]), (book.admit(row, need) if row >= 0 else None), failed
        failed.append((row, need, why))
        keys[(rows == row) & (alloc >= need)] = np.inf


__all__ = ["choose", "choose_among"]
