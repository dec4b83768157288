"""The job commands: ``submit``, ``jobs``, ``show``, ``logs``, ``preempt``, ``cancel``, ``resize``, ``cost``."""

from __future__ import annotations

import math
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from gpufleet.backends import Backend, get_backend, sync_remote
from gpufleet.backends.base import MAX_RESOURCE
from gpufleet.cli.options import JobArg, JsonOpt, check_path_name, existing_store, job_store, open_store
from gpufleet.cli.render import console, duration, emit_json, err_console, event_detail, print_cost, table
from gpufleet.errors import NotFound, ParameterError, UsageError, parameters_as_flags
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import JOBS_PAGE
from gpufleet.outfiles import check_output_dir
from gpufleet.paths import checkpoints_dir, gpufleet_home

if TYPE_CHECKING:
    from gpufleet.spec import JobSpec
    from gpufleet.views import JobRow


def _backend_of(job_id: int) -> Backend:
    return get_backend(job_store(job_id, sync=False).job(job_id).backend, gpufleet_home())


def submit(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="JobSpec YAML file.")],
    wait: Annotated[bool, typer.Option("--wait", help="Block until the job ends; exit 1 unless it completed.")] = False,
    backend: Annotated[str, typer.Option(help="Scheduler to run on.")] = "local",
    gpu_source: Annotated[
        str | None,
        typer.Option(
            "--gpu-source",
            help="Override the spec's telemetry.gpu_source: auto, none, nvml, synthetic:<pattern>, scrape:<url>.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check the spec and print what would run; submit nothing.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Queue a training job."""
    if dry_run:
        validate(spec_path, backend=backend, gpu_source=gpu_source, json_out=json_out)
        return
    spec, warnings = _checked_spec(spec_path, backend, gpu_source)
    home = gpufleet_home()
    job_id = get_backend(backend, home).submit(spec)
    _warn(warnings)  # once submitted: a refusal is one line, its error alone
    store = open_store()
    if not wait:
        if json_out:
            from gpufleet.views import job_summary  # the views' models are built by the commands that show them

            emit_json(job_summary(store, store.job(job_id)))
        else:
            console.print(
                f"submitted job [bold]{job_id}[/] ({escape(spec.name)}, team {escape(spec.team)}) to {escape(backend)}"
            )
        return
    from gpufleet.backends.local.process import ensure_scheduler
    from gpufleet.cli.watch import watch_jobs

    # A remote scheduler is polled; a local one that died while we wait is started again.
    tick = (lambda: sync_remote(home, store)) if backend != "local" else (lambda: ensure_scheduler(home))
    watch_jobs(store, [job_id], quiet=json_out, tick=tick)
    from gpufleet.jobs.failure import TAIL_BYTES
    from gpufleet.views import JobRow

    row = JobRow.read(store, store.job(job_id), tail_bytes=TAIL_BYTES)
    if json_out:
        emit_json(row.to_json())
    else:
        console.print(_ended_line(row), markup=False, highlight=False, soft_wrap=True)
    if row.state != JobState.COMPLETED:
        raise typer.Exit(1)


def validate(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="JobSpec YAML file.")],
    backend: Annotated[str, typer.Option(help="Scheduler it would run on.")] = "local",
    gpu_source: Annotated[
        str | None, typer.Option("--gpu-source", help="Override the spec's telemetry.gpu_source, as submit does.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check a JobSpec file without submitting it.

    Exit 0 with what would run, or 2 with why it would not. The spec is validated, its entrypoint
    checked without running it (the script exists, the module's package can be found, the program is
    on PATH) and the backend's own checks run; nothing is written.
    """
    spec, warnings = _checked_spec(spec_path, backend, gpu_source)
    checks = ["spec", "entrypoint" if not warnings else "entrypoint (warning)", *_backend_checks(spec, backend)]
    plan = _plan(spec, backend, checks, warnings)
    if json_out:
        emit_json(plan)
        return
    _warn(warnings)
    say = partial(console.print, highlight=False, markup=False, soft_wrap=True)
    say(f"valid: {spec.name} (team {spec.team}) would run on the {backend} backend")
    say(f"  command: {plan['command']}" + (f"  (in {plan['workdir']})" if plan["workdir"] else ""))
    say(f"  resources: {plan['resources']['summary']}")
    say(f"  checks passed: {', '.join(checks)}")


def _checked_spec(spec_path: Path, backend: str, gpu_source: str | None) -> tuple[JobSpec, list[str]]:
    """The spec as submit reads it, its entrypoint checked: refused for a backend on this machine, else warned."""
    from gpufleet.errors import SpecError
    from gpufleet.jobs.preflight import entrypoint_problem, entrypoint_warning
    from gpufleet.spec import load_spec

    spec = load_spec(spec_path)
    if gpu_source is not None:
        spec = spec.copy_with(telemetry={**spec.telemetry.model_dump(), "gpu_source": gpu_source})
    problem = entrypoint_problem(spec)
    if problem is None:
        warning = entrypoint_warning(spec)
        return spec, [warning] if warning else []
    if backend == "local":
        raise SpecError(f"{spec_path}: {problem}")
    return spec, [f"{problem} (on this machine; the job runs where the {backend} backend starts it)"]


def _warn(warnings: list[str]) -> None:
    for line in warnings:
        err_console.print(f"warning: {line}", highlight=False, markup=False, soft_wrap=True)


def _backend_checks(spec: JobSpec, backend: str) -> list[str]:
    """What the backend checks before it writes a job (its features, the job's variables, the fit), named."""
    from gpufleet.backends.base import Feature, check_submittable

    chosen = get_backend(backend, gpufleet_home())
    needs = [
        (spec.world_size > 1, Feature.MULTI_RANK),
        (spec.resources.nodes > 1, Feature.MULTI_NODE),
        (spec.recovery == "continue", Feature.ELASTIC),
    ]
    for needed, feature in needs:
        if needed:
            chosen.require(feature)
    check_submittable(spec, None)
    chosen._admit(spec, None)
    return [f"{backend} backend"]


def _plan(spec: JobSpec, backend: str, checks: list[str], warnings: list[str]) -> dict[str, Any]:
    """What ``validate --json`` prints: the job as it would run."""
    import shlex

    from gpufleet.jobs.protocol import entry_argv

    res = spec.resources
    nodes = f" x {res.nodes} nodes" if res.nodes > 1 else ""
    return {
        "valid": True,
        "name": spec.name,
        "team": spec.team,
        "backend": backend,
        "entrypoint": spec.entrypoint,
        "command": shlex.join(entry_argv(spec)),
        "workdir": spec.workdir,
        "resources": {
            "gpus": res.gpus,
            "gpu_type": res.gpu_type,
            "nodes": res.nodes,
            "cpus": res.cpus,
            "world_size": spec.world_size,
            "summary": f"{res.gpus}x {res.gpu_type}{nodes}, {_count(res.cpus, 'CPU')}, "
            f"{_count(spec.world_size, 'rank')}",
        },
        "checks": checks,
        "warnings": warnings,
    }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _ended_line(row: JobRow) -> str:
    """``job 2 failed (exit code 1): RuntimeError: boom at step 80 — see `gpufleet logs 2```."""
    text = f"job {row.id} {row.state}" + (f" ({row.reason})" if row.reason else "")
    failure = row.failure
    if failure is not None and failure.line:
        text += f": {failure.line}"
    if failure is not None and failure.hint:
        text += f" — see `{failure.hint}`"
    return text


def jobs(
    team: Annotated[str | None, typer.Option(help="Only this team's jobs.")] = None,
    state: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    limit: Annotated[
        int, typer.Option(min=0, help=f"Show the newest N jobs (default {JOBS_PAGE}; 0: all of them).")
    ] = JOBS_PAGE,
    offset: Annotated[int, typer.Option(min=0, help="Skip the newest K jobs first (the next page).")] = 0,
    every: Annotated[bool, typer.Option("--all", help="Show every job (a store of 100,000 takes seconds).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """List jobs.

    The newest 50 by default (--limit, --offset, --all), oldest first, with how many match in all.
    """
    store = existing_store()  # a home without a store has no jobs: listing them creates none
    page = None if every or limit == 0 else limit
    from gpufleet.views import jobs_view

    view = jobs_view(store, team=team, state=state, limit=page, offset=offset)
    rows = view["jobs"]
    if json_out:
        emit_json(view)
        return
    if not rows:
        empty = store is None or store.count_jobs() == 0
        console.print(_no_jobs(empty, team, state, view["total"], offset), highlight=False, markup=False)
        return
    # Why a job waits (its quota, the capacity, a reclaim) or failed is worth a column when any has a reason.
    why = [_why(r) for r in rows]
    console.print(
        table(
            None,
            ["id", "name", "team", "prio", "state", "attempts", "step", "gpu", "age"] + (["why"] if any(why) else []),
            [
                [
                    r["id"],
                    r["name"],
                    r["team"],
                    r["priority"],
                    r["state"],
                    r["attempts"],
                    r["step"],
                    f"{r['gpus']}x {r['gpu_type']}",
                    duration(time.time() - r["submitted_at"]),
                ]
                + ([reason] if any(why) else [])
                for r, reason in zip(rows, why, strict=True)
            ],
        )
    )
    if len(rows) < view["total"]:
        console.print(_more_line(rows, view["total"], offset), highlight=False, markup=False)


def _more_line(rows: list[dict[str, Any]], total: int, offset: int) -> str:
    """``50 of 100,000 jobs (the newest): --limit N, --offset 50 for the next page, or --all``."""
    which = "the newest" if offset == 0 else f"after the {offset:,} newest"
    return (
        f"{len(rows):,} of {total:,} jobs ({which}): --limit N, --offset {offset + len(rows)} for the next page, "
        "or --all"
    )


WHY_WIDTH = 80
"""Characters of the ``why`` column of ``gpufleet jobs``; ``gpufleet show ID`` prints the whole reason."""


def _why(row: dict[str, Any]) -> str:
    """Why a queued job waits, or why a failed one failed (with its log's exception line)."""
    if row["state"] not in (JobState.QUEUED, JobState.FAILED):
        return ""
    failure = row.get("failure")
    text = f"{failure['exit']}: {failure['line']}" if failure and failure["line"] else row["reason"] or ""
    return text if len(text) <= WHY_WIDTH else text[: WHY_WIDTH - 3] + "..."


def _no_jobs(empty: bool, team: str | None, state: str | None, total: int = 0, offset: int = 0) -> str:
    """What an empty list says: how to submit a first job, that the filters matched none, or that the page is past
    the last job."""
    if empty:
        return "no jobs yet: submit one with `gpufleet submit SPEC` (see examples/)"
    if total:
        return f"--offset {offset:,} skips past all {total:,} matching jobs: give a smaller one"
    asked = " and ".join(f"--{flag} {value}" for flag, value in (("team", team), ("state", state)) if value)
    return f"no job matches {asked} (`gpufleet jobs` lists them all)"


def show(job_id: JobArg, json_out: JsonOpt = False) -> None:
    """One job: its attempts, notable events and checkpoints."""
    store = job_store(job_id)
    job = store.job(job_id)
    from gpufleet.views import JobView

    detail = JobView.read(store, gpufleet_home(), job_id)
    view = detail.to_json()
    memory = None
    if job.spec.checkpoint.memory is not None:  # the RAM tiers and the steps each holds (`ckpt list` shows them too)
        from gpufleet.cli.ckpt import memory_tiers

        memory = memory_tiers(checkpoints_dir(gpufleet_home(), job_id))
        view["memory"] = memory
    if json_out:
        emit_json(view)
        return
    summary, events, ckpts = view, view["events"], view["checkpoints"]
    console.print(
        f"[bold]job {job.id}[/] {escape(job.name)}  team={escape(job.team)}  priority={job.priority}  "
        f"state=[bold]{job.state}[/]" + (f"  ({escape(job.reason)})" if job.reason else "")
    )
    failure = view.get("failure")
    if failure is not None:
        console.print(escape(_failed_because(failure)), highlight=False, soft_wrap=True)
    console.print(
        escape(
            ("no step reported yet" if summary["step"] is None else f"step {summary['step']}")
            + f"  {summary['gpus']}x {summary['gpu_type']}"
            + (f" x {summary['nodes']} nodes" if summary["nodes"] > 1 else "")
            + (f" ({summary['world_size']} ranks, {summary['strategy']})" if summary["world_size"] > 1 else "")
            + f" on {summary['offer'] or summary['provider']}"
            f"{' (spot)' if job.spec.spot else ''}  restarts {job.restarts}/{job.spec.max_restarts}"
        )
    )
    for line in detail.feature_lines():
        console.print(escape(line))
    t0 = job.submitted_at
    console.print(
        table(
            "attempts",
            ["attempt", "outcome", "gpus", "start", "wall", "exit"],
            [
                [
                    a["attempt"],
                    a["outcome"],
                    a["gpus"],
                    f"+{a['started_at'] - t0:.1f}s",
                    duration((a["ended_at"] or time.time()) - a["started_at"]),
                    a["exit_code"],
                ]
                for a in view["attempts"]
            ],
        )
    )
    console.print(
        table(
            "events",
            ["t", "attempt", "event", "detail"],
            [
                [
                    f"+{e['ts'] - t0:.1f}s",
                    e["attempt"],
                    e["kind"],
                    event_detail(e, t0),
                ]
                for e in events
            ],
        )
    )
    console.print(
        table("checkpoints", ["step", "healthy", "path"], [[c["step"], c["healthy"], c["path"]] for c in ckpts])
    )
    if memory is not None:
        from gpufleet.cli.ckpt import print_memory

        print_memory(memory)


def _failed_because(failure: dict[str, Any]) -> str:
    """``failed because: RuntimeError: boom at step 80 (attempt 2, exit code 1, see `gpufleet logs 2`)``."""
    line, exit_ = failure["line"], failure["exit"]
    where = [f"attempt {failure['attempt']}"] if failure["attempt"] is not None else []
    where += [exit_] if line else []
    where += [f"see `{failure['hint']}`"] if failure["hint"] else []
    return f"failed because: {line or exit_}" + (f" ({', '.join(where)})" if where else "")


LOG_MAX_BYTES = 16 << 20
"""``gpufleet logs`` prints at most the last 16 MiB of an attempt's log."""


def logs(
    job_id: JobArg,
    attempt: Annotated[int | None, typer.Option(help="Attempt number (default: the latest).", min=1)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Print an attempt's stdout and stderr."""
    store = job_store(job_id)
    from gpufleet.views import log_view

    view = log_view(store, gpufleet_home(), job_id, attempt, LOG_MAX_BYTES)
    n, path, text, size = view["attempt"], view["path"], view["log"], view["size"]
    if size > LOG_MAX_BYTES and not json_out:
        err_console.print(f"(the last {LOG_MAX_BYTES >> 20} MiB of {size:,} bytes)", highlight=False, markup=False)
    if json_out:
        emit_json({k: v for k, v in view.items() if k != "size"})
    elif not text:
        console.print(
            f"(empty: attempt {n} of job {job_id} has written nothing to {path})", highlight=False, markup=False
        )
    else:
        sys.stdout.write(text)


@parameters_as_flags({"grace": "--grace"})
def preempt(
    job_id: JobArg,
    grace: Annotated[
        float | None, typer.Option(help="Seconds between SIGTERM and SIGKILL (default: the spec's).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Preempt a running job: it saves, exits and goes back to the queue."""
    if grace is not None and not (math.isfinite(grace) and grace > 0):  # as the backend would, before the store
        raise ParameterError("{grace} is invalid: give a positive number of seconds", grace=grace)
    _backend_of(job_id).preempt(job_id, grace)
    if json_out:
        emit_json({"id": job_id, "requested": "preempt", "grace": grace})
    else:
        console.print(f"preemption of job {job_id} requested")


def cancel(job_id: JobArg, json_out: JsonOpt = False) -> None:
    """Cancel a job for good."""
    _backend_of(job_id).cancel(job_id)
    if json_out:
        emit_json({"id": job_id, "requested": "cancel"})
    else:
        console.print(f"cancellation of job {job_id} requested")


def hold(job_id: JobArg, json_out: JsonOpt = False) -> None:
    """Keep a queued job from starting until `gpufleet release` (local and Slurm backends)."""
    _backend_of(job_id).hold(job_id)
    _requested(job_id, "hold", f"job {job_id} is held: `gpufleet release {job_id}` lets it start", json_out)


def release(job_id: JobArg, json_out: JsonOpt = False) -> None:
    """Let a held job start again, in its turn."""
    _backend_of(job_id).release(job_id)
    _requested(job_id, "release", f"job {job_id} is released: it starts in its turn", json_out)


def _requested(job_id: int, verb: str, text: str, json_out: bool) -> None:
    if json_out:
        emit_json({"id": job_id, "requested": verb})
    else:
        console.print(text, highlight=False, markup=False)


@parameters_as_flags({"gpus": "--gpus", "nodes": "--nodes", "one_process": "--one-process"})
def resize(
    job_id: JobArg,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs per node from the job's next attempt on.")],
    nodes: Annotated[
        int | None, typer.Option("--nodes", help="Nodes from the next attempt on (default: as now).")
    ] = None,
    now: Annotated[
        bool, typer.Option("--now", help="Preempt the job if it runs, so that it resumes at once on the new size.")
    ] = False,
    one_process: Annotated[
        bool,
        typer.Option(
            "--one-process",
            help="With --gpus 1: run a distributed job as one plain process, without torchrun (it cannot grow "
            "back into a group). By default it stays a torchrun job of one rank.",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Change a job's GPUs for its next attempts: it resumes from its checkpoint on the new world size.

    A distributed job resized to one GPU stays a torchrun job of one rank (its script still sees
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``; its checkpoints stay sharded), so it can grow back.
    """
    # The bounds resized_spec applies, checked before the store is opened: a refused resize writes nothing.
    if not 0 <= gpus <= MAX_RESOURCE:
        raise ParameterError(
            "{gpus} is invalid: give the GPUs per node, from 0 to {most!s}", gpus=gpus, most=MAX_RESOURCE
        )
    if nodes is not None and not 1 <= nodes <= MAX_RESOURCE:
        raise ParameterError(
            "{nodes} is invalid: give the number of nodes, from 1 to {most!s}", nodes=nodes, most=MAX_RESOURCE
        )
    backend = _backend_of(job_id)
    done = backend.resize(job_id, gpus, nodes, one_process=one_process)
    preempted, missed = False, None
    if now and done.changed and done.state == JobState.RUNNING:
        try:
            backend.preempt(job_id)
            preempted = True
        except UsageError as err:  # it stopped running meanwhile: its next attempt, if any, has the new size
            missed = str(err)
    if json_out:
        emit_json(
            {
                "id": job_id,
                "state": done.state,
                "changed": done.changed,
                "before": _size(done.before),
                "after": _size(done.after),
                "distributed_dropped": done.distributed_dropped,
                "one_rank_group": done.one_rank_group,
                "preempted": preempted,
                "not_preempted": missed,
            }
        )
        return
    before, after = _size(done.before), _size(done.after)
    if not done.changed:
        console.print(f"job {job_id} already has {_describe_size(after)}: nothing to change", highlight=False)
        return
    console.print(f"job {job_id}: {_describe_size(before)} -> {_describe_size(after)}", highlight=False)
    if done.distributed_dropped:
        console.print(
            "its `distributed` block is dropped (--one-process): the job now runs as one process, without "
            "torchrun, which restores the sharded checkpoint its ranks wrote; it cannot grow back into a group",
            highlight=False,
        )
    elif done.one_rank_group:
        console.print(
            "it stays a torchrun job, of one rank: it restores the sharded checkpoint its ranks wrote, and can "
            "grow back (--one-process runs it without torchrun instead)",
            highlight=False,
        )
    if preempted:
        console.print(f"preemption of job {job_id} requested: it saves, and resumes on the new size", highlight=False)
    elif missed is not None:
        console.print(
            f"not preempted ({escape(missed)}): its next attempt, if any, starts on the new size", highlight=False
        )
    elif done.state == JobState.RUNNING:
        console.print(
            f"job {job_id} keeps running on its current GPUs until its attempt ends; "
            f"`gpufleet preempt {job_id}` applies the change now (it saves and resumes on the new size)",
            highlight=False,
        )
    else:
        console.print(f"job {job_id} is {done.state}: its next attempt starts on the new size", highlight=False)


def _size(spec: JobSpec) -> dict[str, Any]:
    return {
        "gpus": spec.resources.gpus,
        "nodes": spec.resources.nodes,
        "total_gpus": spec.total_gpus,
        "world_size": spec.world_size,
        "strategy": spec.distributed.strategy if spec.distributed is not None else None,
        "launcher": spec.distributed.launcher if spec.distributed is not None else None,
    }


def _describe_size(size: dict[str, Any]) -> str:
    nodes = f" x {size['nodes']} nodes" if size["nodes"] > 1 else ""
    if size["world_size"] > 1:
        ranks = f"{size['world_size']} ranks"
    else:
        ranks = f"one rank, {size['launcher']}" if size["launcher"] else "one process"
    return f"{size['gpus']} GPU{'' if size['gpus'] == 1 else 's'}{nodes} ({ranks})"


@parameters_as_flags({"out": "--out"})
def cost(
    team: Annotated[str | None, typer.Option(help="Only this team.")] = None,
    job: Annotated[list[int] | None, typer.Option("--job", help="Only these job ids (repeatable).")] = None,
    rates: Annotated[Path | None, typer.Option(help="Rate card YAML (default: the shipped example card).")] = None,
    out: Annotated[Path | None, typer.Option(help="Write a cost note (Markdown, JSON, PNG) into this folder.")] = None,
    buckets: Annotated[
        bool,
        typer.Option("--buckets", help="Also print where every GPU-second went (twelve buckets), per job and team."),
    ] = False,
    limit: Annotated[int, typer.Option(min=0, help="List the N costliest jobs (default 20; 0: all of them).")] = 20,
    every: Annotated[bool, typer.Option("--all", help="List every job, not only the costliest.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """GPU-hours and money per team and for the costliest jobs, with the work lost to preemption and the goodput.

    The JSON lists every job and always carries each row's goodput split (gpu_seconds, buckets,
    goodput, badput_top); --buckets prints it as tables. Ended jobs are priced once and read back
    from $GPUFLEET_HOME/cache/cost.db (docs/cost.md says when a row is priced again).
    """
    from gpufleet.cost.gather import cost_report, cost_summary
    from gpufleet.cost.rates import keep_validated, load_rates

    load_rates(rates)  # a refused rate card leaves the home as it was: read it before opening the store
    if out is not None:
        check_output_dir(check_path_name(out, "--out"), "--out")
    if job and existing_store(sync=False) is None:
        raise NotFound(f"no job {job[0]} (list them with `gpufleet jobs`)")
    shown = None if every or limit == 0 else limit
    if out is not None:  # a note draws every attempt: price them all
        report = cost_report(open_store(), team=team, job_ids=job, rates_path=rates, out=out)
        if json_out:
            emit_json(report.to_dict())
            keep_validated()  # the card read, now that the command did its work: the next read skips the YAML
            return
        summary = report.summary(shown)
    else:
        summary = cost_summary(open_store(), team=team, job_ids=job, rates_path=rates, limit=shown, with_json=json_out)
        if summary.json_text is not None:
            sys.stdout.write(summary.json_text + "\n")
            keep_validated()
            return
    print_cost(summary, buckets=buckets)
    keep_validated()
    killed = summary.total.killed
    if killed:  # a killed or lost process is not a preemption: never counted under "preempted"
        which = ", ".join(f"#{j} {name} ({n})" for j, name, n in summary.killed[:20])
        more = f" and {len(summary.killed) - 20:,} more jobs" if len(summary.killed) > 20 else ""
        console.print(
            f"killed: {killed} attempt{'' if killed == 1 else 's'} ended by a killed or lost process (a kill, a lost "
            f"rank, the OOM killer), not by a preemption: {escape(which)}{more}",
            highlight=False,
        )


__all__ = [
    "cancel",
    "cost",
    "hold",
    "jobs",
    "logs",
    "preempt",
    "release",
    "resize",
    "show",
    "submit",
    "validate",
]
