"""Glue between the store and the ledger: gather usages, price them, write the note.

Two ways to the same figures: :func:`cost_report` prices every attempt of every job (what a cost
note needs: each attempt's timeline), and :func:`cost_summary` prices only the jobs the cost cache
(:mod:`gpufleet.cost.cache`) holds no valid row for, and lets SQLite sum and rank the rest: what
``gpufleet cost`` and the dashboard's cost API show, in a fraction of a second at 100,000 jobs.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.cost.cache import CostCache, Filters, Miss, pricing_digest
from gpufleet.cost.ledger import AttemptUsage, Cost, Ledger, build_ledger
from gpufleet.cost.rates import RateCard, load_rates
from gpufleet.cost.usage import attempt_usages, job_usages, store_usages
from gpufleet.errors import GpufleetError, NotFound, ParameterError
from gpufleet.fmt import finite_json
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store
from gpufleet.paths import private_dir

if TYPE_CHECKING:
    from gpufleet.cost.live import LiveReader
    from gpufleet.cost.note import NoteEvent, NotePaths

FLEET_KINDS = (
    EventKind.PLACED,
    EventKind.CHECKPOINT_MOVED,
    EventKind.SPOT_PREEMPTED,
    EventKind.FAILOVER,
    EventKind.FLEET_DOWN,
    EventKind.RECLAIMED_BY,
)
"""What a fleet did to a job: where it was placed, moved, preempted, failed over, reclaimed."""


def fleet_event_text(kind: str, d: Mapping[str, Any], attempt: int | None) -> str:
    """One line for a fleet event, as the cost note's timeline and ``gpufleet show`` say it."""
    if kind == EventKind.PLACED:
        market = "spot" if d.get("spot") else "on-demand"
        borrowed = f", {d.get('borrowed_gpus')} GPU borrowed from the cohort" if d.get("borrowed_gpus") else ""
        return f"placed on {d.get('offer')} {market} at {d.get('price_per_gpu_hour')}/GPU-h{borrowed}"
    if kind == EventKind.CHECKPOINT_MOVED:
        return (
            f"checkpoint step {d.get('step')} moved {d.get('source')} -> {d.get('target')}: {d.get('bytes')} bytes, "
            f"verified; egress {d.get('egress_money')}"
        )
    if kind == EventKind.SPOT_PREEMPTED:
        return f"attempt {attempt}: spot preemption on {d.get('offer')}"
    if kind == EventKind.FAILOVER:
        return f"attempt {attempt}: failover, {d.get('target')} blocked ({d.get('why')})"
    if kind == EventKind.FLEET_DOWN:
        return f"attempt {attempt}: {d.get('target')} down{' (abrupt)' if d.get('abrupt') else ''}"
    return f"attempt {attempt}: its borrowed quota reclaimed for job {d.get('job')}"


def note_events(store: Store, job_ids: Sequence[int]) -> list[NoteEvent]:
    """The moments a reader of a cost note wants marked: preemptions, rollbacks, resumes."""
    from gpufleet.cost.note import NoteEvent  # a note's own: `gpufleet cost` without --out never loads it

    out: list[NoteEvent] = []
    for job_id in job_ids:
        for e in store.events(
            job_id,
            kinds=(
                EventKind.SIGTERM,
                EventKind.SIGKILL,
                EventKind.RESTORE,
                EventKind.ROLLBACK,
                EventKind.CHECKPOINT_SKIPPED,
                *FLEET_KINDS,
            ),
        ):
            d = e.data
            if e.kind in FLEET_KINDS:
                text = fleet_event_text(e.kind, d, e.attempt)
            elif e.kind == EventKind.SIGTERM:
                text = f"attempt {e.attempt}: SIGTERM ({d.get('reason')}), grace {d.get('grace')}s"
            elif e.kind == EventKind.SIGKILL:
                text = f"attempt {e.attempt}: SIGKILL after the grace time"
            elif e.kind == EventKind.RESTORE:
                if d.get("step") is None or d.get("cause") == "rollback":
                    continue
                text = f"attempt {e.attempt}: resumed from step {d.get('step')}"
            elif e.kind == EventKind.ROLLBACK:
                text = (
                    f"attempt {e.attempt}: unhealthy step {d.get('from_step')}, rolled back to step "
                    f"{d.get('to_step')} and skipped batches {d.get('skip_from')}-{d.get('skip_to')}"
                )
            else:
                text = f"attempt {e.attempt}: skipped checkpoint at step {d.get('step')}: {d.get('reason')}"
            out.append(NoteEvent(job_id=job_id, ts=e.ts, kind=e.kind, text=text))
    return sorted(out, key=lambda n: n.ts)


def trace_timelines(store: Store, job_ids: Sequence[int]) -> dict[int, list[str]]:
    """Each job's OpenTelemetry spans (queued, restore, train, checkpoint, preempted, requeued) as text."""
    from gpufleet.telemetry.tracing import job_spans, span_timeline

    return {j: span_timeline(job_spans(store.job(j), store.attempts(j), store.events(j))) for j in job_ids}


@dataclass(frozen=True)
class CostReport:
    ledger: Ledger
    usages: list[AttemptUsage]
    names: dict[int, str]
    note: NotePaths | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "currency": self.ledger.currency,
            "total": self.ledger.total.to_dict(),
            "teams": {t: c.to_dict() for t, c in self.ledger.teams.items()},
            "jobs": [{"id": j, "name": self.names[j], **c.to_dict()} for j, c in self.ledger.jobs.items()],
            "note": None
            if self.note is None
            else {"markdown": str(self.note.markdown), "json": str(self.note.json), "png": str(self.note.png)},
        }

    def summary(self, limit: int | None = None, *, with_json: bool = False) -> CostSummary:
        """The same figures as :func:`cost_summary` gives them: the costliest ``limit`` jobs (``None``: all)."""
        ledger = self.ledger
        ranked = sorted(ledger.jobs.items(), key=lambda jc: (-jc[1].money, jc[0]))
        return CostSummary(
            currency=ledger.currency,
            total=ledger.total,
            teams=ledger.teams,
            jobs=[(j, self.names.get(j, "?"), c) for j, c in ranked[:limit]],
            job_count=len(ledger.jobs),
            killed=[(j, self.names.get(j, "?"), c.killed) for j, c in ledger.jobs.items() if c.killed],
            note=self.note,
            json_text=_dump(self.to_dict()) if with_json else None,
        )


@dataclass(frozen=True)
class CostSummary:
    """The ledger's totals, its costliest jobs and (asked for) every job's ``--json`` text.

    What ``gpufleet cost`` prints: at 100,000 jobs a table of every one is read by nobody (and took
    seconds to draw), and ``--json`` still lists them all, from text the cache kept.
    """

    currency: str
    total: Cost
    teams: dict[str, Cost]
    jobs: list[tuple[int, str, Cost]]
    """The jobs listed: id, name, cost; the costliest first (ties by id)."""
    job_count: int
    """All the jobs with a cost (``jobs`` may list fewer)."""
    killed: list[tuple[int, str, int]]
    """Jobs with attempts ended by a killed or lost process: id, name, how many; by id."""
    note: NotePaths | None = None
    json_text: str | None = None
    """``gpufleet cost --json``, every job included (when :func:`cost_summary` was asked for it)."""

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object: the same as :meth:`CostReport.to_dict` for the same jobs."""
        if self.json_text is None:
            raise ValueError("cost_summary(..., with_json=True) keeps every job's text; this summary has none")
        out: dict[str, Any] = json.loads(self.json_text)
        return out

    def summary(self, limit: int | None = None) -> CostSummary:
        """The same with at most ``limit`` jobs listed (``None``: as listed now)."""
        return self if limit is None or len(self.jobs) <= limit else dataclasses.replace(self, jobs=self.jobs[:limit])

    def as_report(self) -> CostReport:
        """The jobs listed as a :class:`CostReport` (no usages), for what draws one."""
        ledger = Ledger({j: c for j, _, c in self.jobs}, self.teams, self.total, self.currency)
        return CostReport(ledger, [], {j: name for j, name, _ in self.jobs}, self.note)


def json_document(currency: str, total: Cost, teams: Mapping[str, Cost], job_texts: Iterable[str]) -> str:
    """``CostReport.to_dict()`` as ``emit_json`` prints it, from each job's :func:`job_text` (no note).

    Joined, not dumped: at 100,000 jobs the whole object is 170 MB of JSON that Python's indenting
    encoder writes in tens of seconds, while each job's text was written once, when it was priced.
    """
    head = _dump({"currency": currency, "total": total.to_dict(), "teams": {t: c.to_dict() for t, c in teams.items()}})
    texts = list(job_texts)
    jobs = "[\n" + ",\n".join(texts) + "\n  ]" if texts else "[]"
    return f'{head[:-2]},\n  "jobs": {jobs},\n  "note": null\n}}'


def job_text(job_id: int, name: str, cost: Cost) -> str:
    """One job's entry of ``--json``'s ``jobs``, indented as it sits there."""
    return "    " + _dump({"id": job_id, "name": name, **cost.to_dict()}).replace("\n", "\n    ")


def _dump(obj: Any) -> str:
    return json.dumps(finite_json(obj), indent=2, sort_keys=False, default=str, allow_nan=False)


def cost_report(
    store: Store,
    *,
    team: str | None = None,
    job_ids: Sequence[int] | None = None,
    rates_path: Path | None = None,
    out: Path | None = None,
    title: str = "Cost note",
    since: float | None = None,
) -> CostReport:
    """The ledger of the jobs asked for; with ``since``, of the jobs that ran after it (an attempt ending
    then or later, or still running), each counted whole."""
    rates = load_rates(rates_path)
    usages = store_usages(store, team=team, job_ids=job_ids)
    if since is not None:
        active = {u.job_id for u in usages if u.end >= since or u.outcome == "running"}
        usages = [u for u in usages if u.job_id in active]
    if job_ids:
        known = {j.id for j in store.jobs()}
        missing = [j for j in job_ids if j not in known]
        if missing:
            raise NotFound(f"no job {missing[0]} (list them with `gpufleet jobs`)")
    ledger = build_ledger(usages, rates)
    names = {u.job_id: u.job_name for u in usages}
    note = None
    if out is not None:
        if out.exists() and not out.is_dir():
            raise ParameterError("{out} is a file: give a folder for the cost note", out=str(out))
        ids = sorted(names)
        from gpufleet.cost.note import write_cost_note

        note = write_cost_note(
            out,
            usages,
            ledger,
            title=title,
            events=note_events(store, ids),
            traces=trace_timelines(store, ids),
            generated_at=time.time(),
        )
    return CostReport(ledger, usages, names, note)


def cost_summary(
    store: Store,
    *,
    team: str | None = None,
    job_ids: Sequence[int] | None = None,
    rates_path: Path | None = None,
    since: float | None = None,
    limit: int | None = 20,
    with_json: bool = False,
    cached: bool = True,
) -> CostSummary:
    """What :func:`cost_report` would give for the same jobs, as a :class:`CostSummary`, through the cost cache.

    Ended jobs are read from the cache (``$GPUFLEET_HOME/cache/cost.db``) where it holds a valid row,
    everything else is priced now (and kept, where it ended). ``limit``: the costliest jobs listed
    (``None``: all); ``with_json``: also every job's ``--json`` text. ``cached=False`` keeps nothing
    (a cache in memory: the figures as computed from the store alone). A cache file that is damaged is
    rebuilt; one that cannot be written (a read-only home) is done without.
    """
    rates = load_rates(rates_path)
    if job_ids:
        _check_jobs(store, job_ids)
    filters = Filters(team=team, job_ids=None if job_ids is None else tuple(job_ids), since=since)
    digest = pricing_digest(rates)
    path = _cache_path(store) if cached else None
    for where in (path, path, None) if path is not None else (None,):
        try:
            with _open_cache(where, store.path, digest) as cache:
                return _summarise(cache, filters, rates, limit=limit, with_json=with_json)
        except sqlite3.DatabaseError as err:
            if where is not None and not _busy(err):  # damaged, or of another version: start it again
                for suffix in ("", "-wal", "-shm"):
                    with suppress(OSError):
                        Path(f"{where}{suffix}").unlink()
    # Neither the file nor memory would do: the store itself is at fault, and its own reads say how.
    report = cost_report(store, team=team, job_ids=job_ids, rates_path=rates_path, since=since)
    return report.summary(limit, with_json=with_json)


def _check_jobs(store: Store, job_ids: Sequence[int]) -> None:
    for job_id in job_ids:
        try:
            store.job(job_id)
        except NotFound:
            raise NotFound(f"no job {job_id} (list them with `gpufleet jobs`)") from None


def _cache_path(store: Store) -> Path | None:
    """``cache/cost.db`` beside the store; ``None`` (a cache in memory) where that folder cannot be made."""
    try:
        return private_dir(store.path.parent / "cache") / "cost.db"
    except (OSError, GpufleetError):  # a read-only home, a file where the folder goes
        return None


@contextmanager
def _open_cache(path: Path | None, state: Path, digest: str) -> Iterator[CostCache]:
    cache = CostCache.open(path, state, digest)
    try:
        yield cache
    finally:
        cache.close()


def _busy(err: sqlite3.DatabaseError) -> bool:
    """Another process holds the cache's lock: not a reason to empty it (this read goes on in memory)."""
    return isinstance(err, sqlite3.OperationalError) and ("locked" in str(err) or "busy" in str(err))


def _summarise(
    cache: CostCache, filters: Filters, rates: RateCard, *, limit: int | None, with_json: bool
) -> CostSummary:
    from gpufleet.cost import cache_read
    from gpufleet.cost.live import LiveReader

    now = time.time()
    misses = cache.lookup(filters)
    live = LiveReader(cache.db, cache.digest)
    # An ended job is read whole: it is priced once more, then kept (its row replaces its kept pricing).
    live.read([m.job_id for m in misses if m.attempted], cache.dirty() | {m.job_id for m in misses if m.ended})
    for miss in misses:
        _price(live, cache, miss, rates, now, filters.since, with_json=with_json)
    live.keep()
    cache.flush()
    teams, total, count = cache_read.sums(cache, filters, notices=with_json)
    texts = cache_read.texts(cache, filters) if with_json else None
    summary = CostSummary(
        currency=rates.currency,
        total=total,
        teams=teams,
        jobs=cache_read.ranked(cache, filters, limit),
        job_count=count,
        killed=cache_read.killed(cache, filters),
        json_text=None if texts is None else json_document(rates.currency, total, teams, texts),
    )
    cache.store(now)
    return summary


def _price(
    live: LiveReader, cache: CostCache, miss: Miss, rates: RateCard, now: float, since: float | None, *, with_json: bool
) -> None:
    """Price one job the cache missed and hand it to the cache (a job with no attempt has no row to show).

    Its inputs are those ``live`` read (or kept, brought up to date). Its ``--json`` text is written when it
    will be kept (it ended) or printed now."""
    kept = live.kept.get(miss.job_id) if miss.attempted else None
    if kept is not None:  # nothing written about it since it was priced: what that read is enough
        cost, last_end, shown = kept.price(rates, now, since)
        name, team = kept.name, kept.team
    else:
        attempts = live.attempts.get(miss.job_id, []) if miss.attempted else []
        job = live.jobs.get(miss.job_id)
        if not attempts or job is None:  # queued (looked at again next time), or ended without starting (kept)
            if miss.ended:
                cache.add(miss, team="", name="", last_end=0.0, cost=None, shown=False, text="")
            return
        cost, last_end, shown = job.price(attempts, rates, now, since)
        live.changed.add(miss.job_id)  # what it read is kept, for the next read
        name, team = job.facts.name, job.facts.team
    text = job_text(miss.job_id, name, cost) if miss.ended or with_json else ""
    cache.add(miss, team=team, name=name, last_end=last_end, cost=cost, shown=shown, text=text)


__all__ = [
    "FLEET_KINDS",
    "CostReport",
    "CostSummary",
    "attempt_usages",
    "cost_report",
    "cost_summary",
    "fleet_event_text",
    "job_text",
    "job_usages",
    "json_document",
    "note_events",
    "trace_timelines",
]
