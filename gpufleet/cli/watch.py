"""Live progress of jobs: one Rich progress bar per job, and a line per notable event."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gpufleet.cli.render import console
from gpufleet.jobs.events import NOTABLE, EventKind
from gpufleet.jobs.store import TERMINAL, Event, Store, latest_step


def describe(event: Event) -> str | None:
    """One line for a notable event (Rich markup), or ``None`` for those not worth a line.

    Every value of the event is escaped: the runtime's events come from the job's own process, so a
    reason or a loss may hold anything, ``[/]`` included.
    """
    d = {k: escape(str(v)) for k, v in event.data.items()}
    a = f"attempt {event.attempt}" if event.attempt else ""
    match event.kind:
        case EventKind.ATTEMPT_START:
            return f"{a} started (pid {d.get('pid')})"
        case EventKind.SIGTERM:
            return f"[yellow]{a} got SIGTERM ({d.get('reason')}); {d.get('grace')}s to save before SIGKILL[/]"
        case EventKind.SIGKILL:
            return f"[red]{a} SIGKILL: the grace time expired[/]"
        case EventKind.PREEMPT_SIGNAL:
            return f"{a} saw {d.get('signal')} at step {d.get('step')}: saving"
        case EventKind.RESTORE:
            if event.data.get("cause") == "rollback":
                return None  # the rollback line says it
            if event.data.get("step") is None:
                return f"{a} found no checkpoint: starting from scratch"
            return f"[green]{a} restored step {d.get('step')} in {_seconds(event.data.get('seconds', 0))}s[/]"
        case EventKind.RUN_CHANGED:
            return f"[yellow]{a} {d.get('message')}[/]"
        case EventKind.CHECKPOINT_SKIPPED:
            return f"[yellow]{a} skipped checkpoint step {d.get('step')}: {d.get('reason')}[/]"
        case EventKind.UNHEALTHY:
            return f"[red]{a} unhealthy step {d.get('step')}: loss {d.get('loss')} ({d.get('reason')})[/]"
        case EventKind.ROLLBACK:
            return (
                f"[yellow]{a} rolled back from step {d.get('from_step')} to healthy step {d.get('to_step')}, "
                f"skipping batches {d.get('skip_from')}..{_before(event.data.get('skip_to', 0))}[/]"
            )
        case EventKind.DATA_STAGED:
            return (
                f"{a} staged its data in {_seconds(event.data.get('seconds', 0))}s: "
                f"{d.get('files_copied')} files copied, {d.get('files_reused')} reused"
            )
        case EventKind.DATA_STAGE_FAILED:
            return f"[red]{a} data staging failed: {d.get('error')}[/]"
        case EventKind.ATTEMPT_END:
            return f"{a} ended: {d.get('outcome')} (exit {d.get('exit_code')})"
        case EventKind.REQUEUED:
            return "[yellow]requeued[/]"
        case EventKind.COMPLETED:
            return "[green]completed[/]"
        case EventKind.FAILED | EventKind.CANCELLED:
            return f"[red]{escape(str(event.kind))}[/]"
    return None


def _seconds(value: object) -> str:
    """``value`` as seconds with two decimals; as written when it is not a number (an event is user data)."""
    try:
        return f"{float(value):.2f}"  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return escape(str(value))


def _before(value: object) -> str:
    """The batch before ``value`` (``skip_to`` is exclusive); ``value`` as written when it is not an integer."""
    try:
        return str(int(value) - 1)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return escape(str(value))


PLAIN_EVERY = 10
"""Without a terminal, one plain progress line per job each time it passes another tenth of its steps."""


class JobWatcher:
    """Progress bars and event lines for a set of jobs; ``follow`` can be called repeatedly.

    Rich redraws its bars only on a terminal; piped to a file or a CI log it shows them once, at the
    end, so a slow run looks hung. Without a terminal the watcher therefore also prints a plain line
    per job every tenth of its steps (``PLAIN_EVERY``), in order with the event lines.
    """

    def __init__(self, store: Store, progress: Progress, *, quiet: bool = False) -> None:
        self.store = store
        self.progress = progress
        self.quiet = quiet
        self.plain = not quiet and not progress.console.is_terminal
        self.tasks: dict[int, TaskID] = {}
        self.seen: dict[int, int] = {}
        self.totals: dict[int, int] = {}
        self.printed: dict[int, int] = {}
        """Per job, the highest tenth of its steps already printed as a plain line."""

    def refresh(self, job_id: int, lines: list[tuple[float, str]]) -> bool:
        """Update one job's bar, collect its new notable events; true once the job has ended."""
        job = self.store.job(job_id)
        if job_id not in self.tasks:
            self.tasks[job_id] = self.progress.add_task(escape(f"#{job_id} {job.name}"), total=None, state=job.state)
        events = self.store.events(job_id, kinds=(*NOTABLE, EventKind.SESSION_START))
        for ev in events[self.seen.get(job_id, 0) :]:
            line = describe(ev)
            if line:
                lines.append((ev.ts, f"  #{job_id} {escape(job.name)}: {line}"))
            if ev.kind == EventKind.SESSION_START and isinstance(ev.data.get("total_steps"), int):
                self.totals[job_id] = ev.data["total_steps"]
                self.progress.update(self.tasks[job_id], total=ev.data["total_steps"])
        self.seen[job_id] = len(events)
        step = latest_step(self.store, job_id)
        state = f"{job.state} ({job.team})"
        self.progress.update(self.tasks[job_id], completed=step or 0, state=state)
        if self.plain:
            self._plain_line(job_id, job.name, step or 0, state, lines)
        return job.state in TERMINAL

    def _plain_line(self, job_id: int, name: str, step: int, state: str, lines: list[tuple[float, str]]) -> None:
        """A line when the job first reaches another tenth of its steps (none until its total is known)."""
        total = self.totals.get(job_id)
        if not total or total <= 0:
            return
        tenth = min(PLAIN_EVERY, step * PLAIN_EVERY // total)
        if tenth <= self.printed.get(job_id, 0):
            return
        self.printed[job_id] = tenth
        lines.append(
            (time.time(), escape(f"  #{job_id} {name}: step {step}/{total} ({100 * step // total}%), {state}"))
        )

    def follow(
        self,
        job_ids: Sequence[int],
        *,
        tick: Callable[[], None] | None = None,
        poll_s: float = 0.2,
        until: Callable[[], bool] | None = None,
    ) -> None:
        """Refresh until every job has ended (or ``until()`` holds), calling ``tick`` each round."""
        while True:
            if tick is not None:
                tick()
            lines: list[tuple[float, str]] = []
            ended = [self.refresh(j, lines) for j in job_ids]
            if not self.quiet:
                for _, line in sorted(lines, key=lambda item: item[0]):
                    self.progress.console.print(line)
            if all(ended) or (until is not None and until()):
                return
            time.sleep(poll_s)


def watch_jobs(
    store: Store,
    job_ids: Sequence[int],
    *,
    quiet: bool = False,
    poll_s: float = 0.5,
    tick: Callable[[], None] | None = None,
) -> None:
    """Follow jobs run by a scheduler elsewhere until they all end (``tick`` refreshes remote state)."""
    progress = make_progress(quiet)
    with progress:
        JobWatcher(store, progress, quiet=quiet).follow(job_ids, poll_s=poll_s, tick=tick)


def make_progress(quiet: bool = False, *, to: Console | None = None) -> Progress:
    """One bar per job on ``to`` (the CLI's stdout console unless given)."""
    return Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps  {task.fields[state]:<24}"),
        TimeElapsedColumn(),
        console=to or console,
        disable=quiet,
        transient=False,
    )


__all__ = ["PLAIN_EVERY", "JobWatcher", "describe", "make_progress", "watch_jobs"]
