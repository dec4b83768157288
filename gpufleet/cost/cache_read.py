"""Reading a report out of the cost cache: team sums, the costliest jobs, the killed ones, every job's text.

Each read joins the cached rows still valid (those of this pricing not in ``temp.stale``, within the
report's filters) with the jobs priced by this read (``temp.fresh``). The team sums come from the
``sums`` table the triggers keep, less the stale rows, plus the fresh ones: a few rows read whatever
the number of jobs (a report filtered by job ids or by time sums its rows instead). The costliest
jobs are read down an index on money, and stop at the number asked for.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from gpufleet.cost.cache import INTEGER, REAL, ROW_COLUMNS, SUMMED, CostCache, Filters, cost_from
from gpufleet.cost.ledger import Cost

_TOTALS = ", ".join([*(f"total({c})" for c in REAL), *(f"ifnull(sum({c}), 0)" for c in INTEGER)])
"""A group's sums, in :data:`SUMMED` order (``total()``: a float, 0.0 for no rows)."""


def _valid(cache: CostCache, filters: Filters) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause on ``rows r`` for the cached rows of this report, and its arguments."""
    sql = "r.digest=? AND r.attempts > 0 AND r.rid NOT IN (SELECT rid FROM temp.stale) AND ?"
    args: list[Any] = [cache.digest, int(cache.trusted)]
    if filters.team:
        sql += " AND r.team=?"
        args.append(filters.team)
    if filters.job_ids is not None:
        sql += f" AND r.job_id IN ({','.join('?' * len(filters.job_ids))})"
        args += list(filters.job_ids)
    if filters.since is not None:
        sql += " AND r.last_end >= ?"
        args.append(filters.since)
    return sql, args


def _group_sums(rows: Iterable[Sequence[Any]], sign: int, into: dict[str, list[Any]]) -> None:
    """Add (``sign`` -1: take away) rows of ``team, count, sums...`` to ``into``."""
    for team, n, *values in rows:
        acc = into.setdefault(str(team), [0] + [0.0] * len(REAL) + [0] * len(INTEGER))
        acc[0] += sign * int(n)
        for i, value in enumerate(values, start=1):
            acc[i] += sign * (value or 0)


def _team_sums(cache: CostCache, filters: Filters) -> dict[str, list[Any]]:
    """Per team: the number of jobs and the sums of :data:`SUMMED`, over the valid rows and the fresh ones."""
    db = cache.db
    out: dict[str, list[Any]] = {}
    if cache.trusted and filters.job_ids is None and filters.since is None:
        team = " AND team=?" if filters.team else ""
        args = [cache.digest, *([filters.team] if filters.team else [])]
        _group_sums(db.execute(f"SELECT team, n, {', '.join(SUMMED)} FROM sums WHERE digest=?{team}", args), 1, out)
        # CROSS JOIN: from the few stale rows to theirs by key (SQLite would walk every row of the digest).
        stale = (
            f"SELECT team, count(*), {_TOTALS} FROM temp.stale s CROSS JOIN rows USING (rid)"
            f" WHERE digest=? AND attempts > 0{team} GROUP BY team"
        )
        _group_sums(db.execute(stale, args).fetchall(), -1, out)
    else:
        where, args = _valid(cache, filters)
        _group_sums(
            db.execute(f"SELECT team, count(*), {_TOTALS} FROM rows r WHERE {where} GROUP BY team", args), 1, out
        )
    fresh = f"SELECT team, count(*), {_TOTALS} FROM temp.fresh WHERE shown GROUP BY team"
    _group_sums(db.execute(fresh).fetchall(), 1, out)
    return {team: acc for team, acc in sorted(out.items()) if acc[0] > 0}


def _lists(cache: CostCache, filters: Filters, column: str) -> list[tuple[int, str, Any]]:
    """``(job_id, team, value)`` of the rows where ``column`` (``unpriced`` or ``notices``) is set, by job id."""
    where, args = _valid(cache, filters)
    cached = cache.db.execute(
        f"SELECT r.job_id, r.team, r.{column} FROM rows r WHERE {where} AND r.{column} IS NOT NULL ORDER BY r.job_id",
        args,
    )
    fresh = cache.db.execute(
        f"SELECT job_id, team, {column} FROM temp.fresh WHERE shown AND {column} IS NOT NULL ORDER BY job_id"
    )
    return [(int(j), str(t), json.loads(v)) for j, t, v in heapq.merge(cached, fresh, key=lambda r: r[0])]


def sums(cache: CostCache, filters: Filters, *, notices: bool) -> tuple[dict[str, Cost], Cost, int]:
    """Each team's cost, the fleet's and the number of jobs; ``notices``: with the preemption notices listed
    (only ``--json`` shows them, and a spot fleet has one on most jobs)."""
    teams = _team_sums(cache, filters)
    if not teams:
        return {}, Cost(), 0
    unpriced: dict[str | None, set[str]] = {None: set()}
    for _, team, keys in _lists(cache, filters, "unpriced"):
        for key in (team, None):
            unpriced.setdefault(key, set()).update(keys)
    listed: dict[str | None, list[Any]] = {None: []}
    for _, team, items in _lists(cache, filters, "notices") if notices else ():
        for key in (team, None):
            listed.setdefault(key, []).extend(items)

    def cost(values: Sequence[Any], key: str | None) -> Cost:
        keys, items = sorted(unpriced.get(key, ())), listed.get(key, [])
        return cost_from((*values, json.dumps(keys) if keys else None, json.dumps(items) if items else None))

    whole = [0.0] * len(REAL) + [0] * len(INTEGER)
    for acc in teams.values():
        whole = [a + b for a, b in zip(whole, acc[1:], strict=True)]
    count = sum(int(acc[0]) for acc in teams.values())
    return {team: cost(acc[1:], team) for team, acc in teams.items()}, cost(whole, None), count


def ranked(cache: CostCache, filters: Filters, limit: int | None) -> list[tuple[int, str, Cost]]:
    """The costliest jobs first (ties by id): ``limit`` of them, or all."""
    where, args = _valid(cache, filters)
    cols = ", ".join(f"r.{c}" for c in ROW_COLUMNS)
    tail = "" if limit is None else f" LIMIT {int(limit)}"
    rows = [
        *cache.db.execute(f"SELECT {cols} FROM rows r WHERE {where} ORDER BY r.money DESC, r.job_id{tail}", args),
        *cache.db.execute(f"SELECT {cols} FROM temp.fresh r WHERE shown ORDER BY r.money DESC, r.job_id{tail}"),
    ]
    money = ROW_COLUMNS.index("money")
    rows.sort(key=lambda r: (-r[money], r[0]))
    return [(int(r[0]), str(r[2]), cost_from(r[4:])) for r in rows[:limit]]


def killed(cache: CostCache, filters: Filters) -> list[tuple[int, str, int]]:
    """Jobs with attempts ended by a killed or lost process: id, name, how many; by id."""
    where, args = _valid(cache, filters)
    cached = cache.db.execute(
        f"SELECT job_id, name, killed FROM rows r WHERE {where} AND killed > 0 ORDER BY job_id", args
    )
    fresh = cache.db.execute("SELECT job_id, name, killed FROM temp.fresh WHERE shown AND killed > 0 ORDER BY job_id")
    return [(int(j), str(n), int(k)) for j, n, k in heapq.merge(cached, fresh, key=lambda r: r[0])]


def texts(cache: CostCache, filters: Filters) -> Iterator[str]:
    """Every job's ``--json`` entry, by id."""
    where, args = _valid(cache, filters)
    cached = cache.db.execute(
        f"SELECT r.job_id, f.json FROM rows r JOIN frags f ON f.rid=r.rid WHERE {where} ORDER BY r.job_id", args
    )
    fresh = cache.db.execute("SELECT job_id, json FROM temp.fresh WHERE shown ORDER BY job_id")
    for _, text in heapq.merge(cached, fresh, key=lambda r: r[0]):
        yield str(text)


__all__ = ["killed", "ranked", "sums", "texts"]
