"""Glue between the store and the ledger: gather usages, price them, write the note."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.cost.ledger import AttemptUsage, Ledger, build_ledger
from gpufleet.cost.note import NoteEvent, NotePaths, write_cost_note
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import store_usages
from gpufleet.errors import NotFound, ParameterError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store

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


__all__ = ["FLEET_KINDS", "CostReport", "cost_report", "fleet_event_text", "note_events", "trace_timelines"]
