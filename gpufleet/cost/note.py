"""The cost note: a Markdown page, a JSON twin and a timeline PNG built from a ledger.

``write_cost_note`` renders what ``build_ledger`` computed; it does no pricing of its own. The
JSON is the machine-readable record (finite floats, a fixed key order); the Markdown is for
people and embeds the PNG, a Gantt chart of every attempt split into the ledger's buckets.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.cost.ledger import AttemptUsage, Cost, Ledger
from gpufleet.errors import ParameterError
from gpufleet.fmt import finite_json, markdown_table, money
from gpufleet.outfiles import check_output_file, replace_output

_COLORS = {
    "startup": "#b0b0b0",
    "staging": "#7fb3d5",
    "restore": "#f2a541",
    "useful": "#3c9d6b",
    "lost": "#d62728",
    "checkpoint": "#1b2f5e",
}
_ENDED = ("preempted", "lost")
_HOW_TO_READ = """\
Every second an attempt held its GPUs falls in exactly one bucket: \
`wall = startup + staging + restore + checkpoint + lost + useful`. \
**Startup** is process start to the first training step, staging and restore excluded (imports), \
plus the shut-down of a process that ended on purpose after saving. \
**Staging** is copying the job's `data` sources in before the first step (an attempt that finds them \
verified spends almost none). \
**Restore** is reading and verifying the checkpoint it resumed from (also after a rollback). \
**Checkpoint** is time spent saving checkpoints. \
**Lost** is training that had to be redone: the work after the last durable checkpoint of an attempt \
that did not finish (preempted, killed, lost), plus the steps discarded by a rollback. \
**Useful** is the rest. GPU-seconds are wall seconds times the attempt's GPUs; money is GPU-hours \
times the rate card's price for the attempt's GPU type, provider, and spot or on-demand, and \
*on-demand* prices the same hours at the on-demand rate, to show what spot saved (or cost, once \
preemption losses are counted). Lost money is the lost share of the money, at the average rate.

**Preemption overhead** is not a seventh bucket but the part of five of them that a job spent only \
because it was preempted: the lost work of each preempted attempt (rollbacks excluded), the checkpoint \
it saved at the preemption signal, its shut-down after saving, and all the start-up, staging and restore \
of each attempt that restarted after a preemption. Lost work alone understates a preemption: an \
attempt that saves at the signal loses almost nothing, but its restart pays the start-up (a new \
process, imports, data) and the restore again. Its money is those GPU-hours at each attempt's own \
rate; its share is of the row's GPU-hours. A rollback's lost work and restore count as lost and \
restore, not as preemption overhead.

**Goodput** splits the same GPU time into twelve buckets that add up to it: *queued* (GPUs held before \
the job's processes started), *startup*, *staging*, *data wait* (ranks waiting for their input), *compute*, \
*straggler wait* (ranks waiting in collectives for a slower rank), *checkpoint*, *restore*, *lost* (work \
after the last durable checkpoint of an attempt that did not finish), *rollback* (steps a rollback \
discarded and its restore), *resize* (restoring a checkpoint resharded onto another world size) and \
*idle* (held after the session ended until the process exited). Goodput is compute over the whole; the \
three largest other buckets are the top badput, priced at the row's average rate. Data wait and \
straggler wait divide the training time in the proportions of the ranks' phase totals; a job that \
reported none counts all of its training time as compute."""


@dataclass(frozen=True, slots=True)
class NoteEvent:
    """A notable moment in a job's life: preempted, rollback to step N, resumed from step N."""

    job_id: int
    ts: float
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class NotePaths:
    markdown: Path
    json: Path
    png: Path


def write_cost_note(
    out_dir: Path,
    usages: Sequence[AttemptUsage],
    ledger: Ledger,
    *,
    title: str = "Cost note",
    events: Sequence[NoteEvent] = (),
    traces: Mapping[int, Sequence[str]] | None = None,
    generated_at: float,
) -> NotePaths:
    """Write ``cost-note.md``, ``cost-note.json`` and ``timeline.png`` into ``out_dir``."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # it, or a folder above it, is a file; or no permission
        raise ParameterError(
            "{out} cannot be made a folder ({why!s}): give a folder for the cost note",
            out=str(out_dir),
            why=err.strerror,
        ) from None
    paths = NotePaths(out_dir / "cost-note.md", out_dir / "cost-note.json", out_dir / "timeline.png")
    for path in (paths.markdown, paths.json, paths.png):  # never renamed over a folder, a FIFO or a device
        check_output_file(path, "--out")
    attempts = sorted(usages, key=lambda u: (u.job_id, u.attempt, u.start))
    ordered_events = sorted(events, key=lambda e: (e.ts, e.job_id))
    data = finite_json(_note_json(attempts, ledger, title, ordered_events, generated_at))
    if traces:
        data["traces"] = {str(job): list(lines) for job, lines in traces.items()}
    _write_text(paths.json, json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    _draw_timeline(paths.png, attempts, title)
    markdown = _note_markdown(attempts, ledger, title, ordered_events, generated_at, paths.png.name)
    _write_text(paths.markdown, markdown + _traces_markdown(traces or {}, {u.job_id: u.job_name for u in attempts}))
    return paths


# --- JSON -------------------------------------------------------------------------------------


def _note_json(
    usages: Sequence[AttemptUsage], ledger: Ledger, title: str, events: Sequence[NoteEvent], generated_at: float
) -> dict[str, Any]:
    jobs: list[dict[str, Any]] = []
    for job_id, cost in ledger.jobs.items():
        mine = [u for u in usages if u.job_id == job_id]
        jobs.append(
            {
                "job_id": job_id,
                "name": _joined(u.job_name for u in mine),
                "team": _joined(u.team for u in mine),
                "gpu_type": _joined(u.gpu_type for u in mine),
                "provider": _joined(u.provider for u in mine),
                "spot": bool(mine) and all(u.spot for u in mine),
                **cost.to_dict(),
                "attempts": [_attempt_json(u) for u in mine],
            }
        )
    return {
        "title": title,
        "generated_at": _iso(generated_at),
        "currency": ledger.currency,
        "total": ledger.total.to_dict(),
        "teams": {team: cost.to_dict() for team, cost in ledger.teams.items()},
        "jobs": jobs,
        "events": [
            {"job_id": e.job_id, "ts": e.ts, "time": _iso(e.ts), "kind": e.kind, "text": e.text} for e in events
        ],
    }


def _attempt_json(u: AttemptUsage) -> dict[str, Any]:
    return {
        "attempt": u.attempt,
        "outcome": u.outcome,
        "gpus": u.gpus,
        "spot": u.spot,
        "start": u.start,
        "end": u.end,
        "wall_s": round(u.wall_s, 6),
        "first_step": u.first_step,
        "last_step": u.last_step,
        "steps_done": u.steps_done,
        "steps_redone": u.steps_redone,
        "seconds": {k: round(v, 6) for k, v in u.seconds().items()},
        "after_preemption": u.after_preemption,
        "preemption_seconds": {k: round(v, 6) for k, v in u.preemption_seconds().items()},
        "goodput_seconds": {k: round(v, 6) for k, v in u.goodput_seconds().items()},
        "offer": u.offer,
        "price_per_gpu_hour": u.price_per_gpu_hour,
        "egress_bytes": u.egress_bytes,
        "egress_money": u.egress_money,
        "preemption_notice": None
        if u.notice_source is None
        else {"source": u.notice_source, "lead_s": u.notice_lead_s, "saved_s": round(u.preempt_save_s, 6)},
    }


def notice_sentence(u: AttemptUsage) -> str | None:
    """``a spot notice (aws) 120 s ahead; saved in 0.03 s``: what warning the attempt had, and its use."""
    if u.notice_source is None:
        return None
    what = "a Slurm warning signal" if u.notice_source == "slurm" else f"a spot notice ({_one_line(u.notice_source)})"
    ahead = " with no deadline given" if u.notice_lead_s is None else f" {_num(u.notice_lead_s)} s ahead"
    saved = f"saved in {_duration(u.preempt_save_s)}" if u.preempt_save_s > 0 else "no save recorded after it"
    return f"{what}{ahead}; {saved}"


# --- Markdown ---------------------------------------------------------------------------------


def _note_markdown(
    usages: Sequence[AttemptUsage],
    ledger: Ledger,
    title: str,
    events: Sequence[NoteEvent],
    generated_at: float,
    png_name: str,
) -> str:
    total, cur = ledger.total, ledger.currency
    seconds = total.total_gpu_hours < 1.0
    unit = "GPU-s" if seconds else "GPU-h"
    t0 = min((u.start for u in usages), default=0.0)
    names = {u.job_id: u.job_name for u in usages}
    rollbacks = sum(len(u.rollbacks) for u in usages)

    def amount(hours: float) -> str:
        return _num(hours * 3600.0 if seconds else hours)

    def hours_cell(h: float) -> str:
        return f"{_num(h)} ({_num(h * 3600.0)} GPU-s)" if 0 < h < 0.1 and not seconds else _num(h)

    hours = f"**{_num(total.total_gpu_hours)} GPU-hours**"
    if seconds:
        hours += f" ({_num(total.total_gpu_hours * 3600.0)} GPU-seconds)"
    summary = (
        f"{_plural(len(ledger.jobs), 'job')} from {_plural(len(ledger.teams), 'team')} used {hours} "
        f"over {_plural(total.attempts, 'attempt')} and cost **{money(total.money, cur)}**. "
        f"{_preemption_sentence(total, cur, amount, unit)} "
        f"Of those hours, **{_num(total.gpu_hours['lost'] * (3600.0 if seconds else 1.0))} {unit} "
        f"({_pct(total.gpu_hours['lost'], total.total_gpu_hours)})** were lost to work redone after "
        f"{_plural(total.preemptions, 'preemption')}"
        + (f", {_plural(total.killed, 'killed attempt')}" if total.killed else "")
        + f" and {_plural(rollbacks, 'rollback')}, about "
        f"{money(total.lost_money, cur)}. At on-demand prices the same hours would have cost "
        f"{money(total.on_demand_money, cur)}"
    )
    saved = total.on_demand_money - total.money
    summary += f", so spot saved {money(saved, cur)}." if saved > 0 else "."
    if total.egress_bytes:
        summary += (
            f" Moving checkpoints between regions copied {total.egress_bytes:,} bytes; the egress between providers "
            f"cost {money(total.egress_money, cur)} (in the money above)."
        )
    out = [f"# {_one_line(title)}", "", f"_Generated {_iso(generated_at)} · prices in {cur}_", "", summary, ""]
    if total.unpriced:
        out += [f"> **Unpriced:** {', '.join(total.unpriced)}: counted in hours but not in money.", ""]
    out += ["## Timeline", "", f"![timeline]({png_name})", ""]

    def cost_cells(c: Cost) -> list[str]:
        useful, checkpoint = amount(c.gpu_hours["useful"]), amount(c.gpu_hours["checkpoint"])
        lost = f"{amount(c.gpu_hours['lost'])} ({_pct(c.gpu_hours['lost'], c.total_gpu_hours)})"
        overhead = c.preemption_overhead_gpu_hours
        preemption = [f"{amount(overhead)} ({_pct(overhead, c.total_gpu_hours)})", money(c.preemption_money, cur)]
        priced = [money(c.money, cur), money(c.on_demand_money, cur)]
        staging = [amount(c.gpu_hours["staging"])] if staged else []
        return [hours_cell(c.total_gpu_hours), useful, lost, checkpoint, *staging, *preemption, *priced]

    staged = total.gpu_hours["staging"] > 0  # a Staging column only for ledgers with a `data` job
    head = [
        "GPU-hours",
        f"Useful ({unit})",
        f"Lost ({unit})",
        f"Checkpoint ({unit})",
        *([f"Staging ({unit})"] if staged else []),
        f"Preemption overhead ({unit})",
        "Preemption money",
        "Money",
        "On-demand",
    ]
    rows = [[_cell(team), *cost_cells(c)] for team, c in ledger.teams.items()]
    out += ["## By team", "", *markdown_table(["Team", *head], rows, right_from=1), ""]
    rows = []
    for job_id, c in ledger.jobs.items():
        mine = [u for u in usages if u.job_id == job_id]
        gpu = _joined(
            f"{u.gpus}x {u.gpu_type} {'spot' if u.spot else 'on-demand'} ({u.offer or u.provider})" for u in mine
        )
        team = _joined(u.team for u in mine)
        job = f"#{job_id} {names.get(job_id, '?')}"
        rows.append(
            [_cell(job), _cell(team), _cell(gpu), str(c.attempts), str(c.preemptions), str(c.killed), *cost_cells(c)]
        )
    job_head = ["Job", "Team", "GPUs", "Attempts", "Preemptions", "Killed", *head]
    out += ["## By job", "", *markdown_table(job_head, rows, right_from=3)]
    out += ["", "## Goodput by job", "", *_goodput_table(ledger, names, cur, amount, unit)]
    rows = []
    for u in usages:
        steps = "-" if u.first_step is None else f"{u.first_step}..{u.last_step if u.last_step is not None else '?'}"
        outcome = f"**{_cell(u.outcome)}**" if u.outcome in _ENDED else _cell(u.outcome)
        outcome += " (killed)" if u.killed else ""
        start, wall = f"+{_duration(u.start - t0)}", _duration(u.wall_s)
        job = _cell(f"#{u.job_id} {u.job_name}")
        rows.append([job, str(u.attempt), outcome, start, steps, wall, str(u.steps_done), str(u.steps_redone)])
    heads = ["Job", "Attempt", "Outcome", "Started", "Steps", "Wall", "Steps run", "Redone steps"]
    out += ["", "## Attempts", "", *markdown_table(heads, rows, right_from=3), ""]
    noticed = [(u, notice_sentence(u)) for u in usages if u.notice_source is not None]
    if noticed:
        out += ["## Preemption notices", ""]
        out += [f"- {_cell(f'#{u.job_id} {u.job_name}')}, attempt {u.attempt}: {text}" for u, text in noticed]
        out.append("")
    out += ["## Notable events", ""]
    for e in events:
        who = f"#{e.job_id} {names.get(e.job_id, '?')}"
        out.append(f"- `+{_duration(e.ts - t0)}` {_cell(who)}: **{_cell(e.kind)}**: {_one_line(e.text)}")
    if not events:
        out.append("_None recorded._")
    out += ["", "## How to read this", "", _HOW_TO_READ, ""]
    return "\n".join(out)


def _goodput_table(
    ledger: Ledger, names: Mapping[int, str], currency: str, amount: Callable[[float], str], unit: str
) -> list[str]:
    """Each job's goodput (compute over all its GPU time) and its three largest other buckets, with money."""
    rows = []
    for job_id, c in ledger.jobs.items():
        goodput = "n/a" if c.goodput is None else f"{100.0 * c.goodput:.1f} %"
        top = [
            f"{k.replace('_', ' ')}: {amount(v / 3600.0)} {unit}, {money(m, currency)}" for k, v, m in c.badput_top()
        ]
        rows.append([_cell(f"#{job_id} {names.get(job_id, '?')}"), goodput, *(top + ["-"] * 3)[:3]])
    head = ["Job", "Goodput", "Top badput", "Second", "Third"]
    return markdown_table(head, rows, right_from=1)


def _preemption_sentence(total: Cost, currency: str, amount: Callable[[float], str], unit: str) -> str:
    """The headline's overhead sentence: what preemptions cost beyond the work they threw away."""
    overhead = total.preemption_overhead_gpu_hours
    if total.preemptions == 0 and total.killed == 0 and overhead == 0:
        return "No attempt was preempted."
    parts = total.preemption_gpu_hours
    killed = f" and {_plural(total.killed, 'killed attempt')}" if total.killed else ""
    return (
        f"{_plural(total.preemptions, 'preemption')}{killed} cost **{amount(overhead)} {unit} "
        f"({_pct(overhead, total.total_gpu_hours)}) of preemption overhead**, about "
        f"{money(total.preemption_money, currency)}: {amount(parts['lost'])} {unit} of lost work, "
        f"{amount(parts['startup'])} {unit} of restart start-up and shut-down, "
        + (f"{amount(parts['staging'])} {unit} of staging data again, " if parts["staging"] > 0 else "")
        + f"{amount(parts['restore'])} {unit} of restore and {amount(parts['checkpoint'])} {unit} "
        "of saving at the signal."
    )


def _cell(text: str) -> str:
    return _one_line(text).replace("\\", "\\\\").replace("|", "\\|")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _joined(values: Any) -> str:
    return ", ".join(dict.fromkeys(str(v) for v in values))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _iso(ts: float) -> str:
    if not math.isfinite(ts):
        return "unknown"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(x: float) -> str:
    """Three significant figures, thousands separators above 1000."""
    if not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole > 0 and math.isfinite(part / whole) else "0 %"


def _duration(s: float) -> str:
    if not math.isfinite(s):
        return "n/a"
    if abs(s) < 60:
        return f"{_num(s)} s"
    s = round(s)
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _traces_markdown(traces: Mapping[int, Sequence[str]], names: Mapping[int, str]) -> str:
    """The trace of each job (``gpufleet trace JOB`` shows and exports the same spans)."""
    if not traces:
        return ""
    out = ["", "## Trace of each job", "", "Span, start from the job's submission, duration, outcome.", ""]
    for job_id, lines in traces.items():
        out += [f"### #{job_id} {_one_line(names.get(job_id, '?'))}", "", "```text", *lines, "```", ""]
    return "\n".join(out)


# --- Timeline ---------------------------------------------------------------------------------


def _draw_timeline(path: Path, usages: Sequence[AttemptUsage], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    jobs = list(dict.fromkeys(u.job_id for u in usages))
    row = {job_id: i for i, job_id in enumerate(jobs)}
    labels = {u.job_id: f"#{u.job_id} {u.job_name} ({u.team})" for u in usages}
    t0 = min((u.start for u in usages), default=0.0)
    span = max([u.end - t0 for u in usages] + [1e-9])
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.6 * max(1, len(jobs)) + 0.5), layout="constrained")
    try:
        other_ends = False
        for u in usages:
            y, x, sec = row[u.job_id], u.start - t0, u.seconds()
            end_lost = sec["lost"] if u.outcome not in ("completed", "running") else 0.0
            parts = [("staging", sec["staging"]), ("startup", sec["startup"]), ("restore", sec["restore"])]
            head = sec["staging"] + sec["startup"] + sec["restore"]
            parts += [("useful", max(0.0, u.wall_s - head - end_lost)), ("lost", end_lost)]
            for bucket, width in parts:
                if width <= 0:
                    continue
                lost = bucket == "lost"
                ax.barh(y, width, left=x, height=0.5, color="#f6c4c4" if lost else _COLORS[bucket], linewidth=0)
                if lost:
                    ax.barh(y, width, left=x, height=0.5, fill=False, hatch="////", edgecolor=_COLORS["lost"], lw=0)
                x += width
            ax.barh(y, u.wall_s, left=u.start - t0, height=0.5, fill=False, edgecolor="#333333", linewidth=0.6)
            if u.wall_s / span > 0.05:
                where = f" {u.offer.rsplit('/', 1)[0]}" if u.offer else ""  # the region a fleet placed it in
                ax.text(
                    u.start - t0 + span * 0.004, y, f"a{u.attempt}{where}", va="center", fontsize=7, color="#1a1a1a"
                )
            for t in u.checkpoints:
                ax.vlines(t - t0, y - 0.25, y + 0.25, color=_COLORS["checkpoint"], linewidth=1.2)
            for t in u.rollbacks:
                ax.vlines(t - t0, y - 0.25, y + 0.25, color=_COLORS["lost"], linewidth=1.2)
                ax.plot(t - t0, y - 0.36, marker="v", color=_COLORS["lost"], markersize=6)
            if u.outcome in _ENDED:
                ax.plot(u.end - t0, y, marker="X", color=_COLORS["lost"], markersize=10, markeredgecolor="white")
                ax.text(u.end - t0, y - 0.34, u.outcome, ha="center", va="bottom", fontsize=8, color=_COLORS["lost"])
            elif u.outcome == "running":
                ax.plot(u.end - t0, y, marker=">", color="#333333", markersize=7)
            elif u.outcome != "completed":
                other_ends = True
                ax.plot(u.end - t0, y, marker="x", color="#333333", markersize=7)
                ax.text(u.end - t0, y - 0.34, u.outcome, ha="center", va="bottom", fontsize=8, color="#333333")
        ax.set_yticks(range(len(jobs)), [labels[j] for j in jobs])
        ax.set_ylim(len(jobs) - 0.4, -0.8)
        ax.set_xlim(0, span * 1.04)
        ax.set_xlabel("seconds since the first attempt started")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,g}"))
        ax.set_title(f"{title}: attempts by job" if jobs else f"{title}: no attempts")
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        shown = (
            ("staging", "startup", "restore", "useful")
            if any(u.staging_s > 0 for u in usages)
            else ("startup", "restore", "useful")
        )
        handles: list[Any] = [Patch(color=_COLORS[b], label=b) for b in shown]
        handles += [
            Patch(facecolor="#f6c4c4", edgecolor=_COLORS["lost"], hatch="////", label="lost (redone)"),
            Line2D([], [], color=_COLORS["checkpoint"], marker="|", ls="", markersize=10, label="checkpoint"),
            Line2D([], [], color=_COLORS["lost"], marker="v", ls="", label="rollback"),
            Line2D([], [], color=_COLORS["lost"], marker="X", ls="", markersize=9, label="preempted"),
        ]
        if other_ends:
            handles.append(Line2D([], [], color="#333333", marker="x", ls="", label="ended otherwise"))
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
        tmp = path.with_name(path.name + ".tmp")
        fig.savefig(tmp, dpi=120, format="png")
        replace_output(tmp, path)
    finally:
        plt.close(fig)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    replace_output(tmp, path)


__all__ = ["NoteEvent", "NotePaths", "notice_sentence", "write_cost_note"]
