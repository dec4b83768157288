"""``gpufleet slurm ...``: the operator's gestures, each printing the native command it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gpufleet.backends.slurm.backend import SlurmBackend, run_slurm, slurm_usage
from gpufleet.cli.options import MAX_JOB_ID, JsonOpt, job_store
from gpufleet.cli.render import console, emit_json, fmt, table
from gpufleet.errors import UsageError
from gpufleet.paths import check_name, gpufleet_home

slurm_app = typer.Typer(
    help="Operate a Slurm cluster: accounts, holds, drains, requeues, topology.", no_args_is_help=True
)
account_app = typer.Typer(help="Slurm accounts (one per team).", no_args_is_help=True)
slurm_app.add_typer(account_app, name="account")


def _native(argv: list[str], json_out: bool) -> None:
    if not json_out:
        console.print(f"[dim]$ {escape(' '.join(argv))}[/]", highlight=False)
    try:
        out = run_slurm(argv)
    except UsageError as err:
        if argv[0] != "sacctmgr" or "Nothing new added" not in str(err):
            raise
        # sacctmgr exits 1 when the account or association exists already: that is not a failure.
        if json_out:
            emit_json({"command": argv, "stdout": "already exists"})
        else:
            console.print("already exists: nothing to add", highlight=False)
        return
    if json_out:
        emit_json({"command": argv, "stdout": out.stdout.strip()})
    elif out.stdout.strip():
        console.print(out.stdout.strip(), highlight=False, markup=False)


SLURM_MAX_JOB_ID = 2**32 - 1
"""Slurm's job ids are 32-bit unsigned numbers."""


def _slurm_ref(job: str) -> str:
    """A gpufleet job id of a Slurm job becomes its Slurm id; ``slurm:ID`` passes through."""

    def _number(text: str, most: int) -> int | None:
        # ASCII digits only, and few of them: int() of thousands of digits is refused (or slow)
        if not (text.isascii() and text.isdigit()) or len(text) > len(str(most)) or not 0 < int(text) <= most:
            return None
        return int(text)

    shown = job if len(job) <= 40 else f"{job[:30]}... ({len(job):,} characters)"
    if job.startswith("slurm:"):
        if _number(job[6:], SLURM_MAX_JOB_ID) is None:
            raise UsageError(f"invalid Slurm job id {shown!r}: give slurm:<a number from 1 to {SLURM_MAX_JOB_ID}>")
        return str(int(job[6:]))
    job_id = _number(job, MAX_JOB_ID)
    if job_id is None:
        raise UsageError(f"invalid job {shown!r}: give a gpufleet job id (1 to {MAX_JOB_ID}) or slurm:<slurm job id>")
    record = job_store(job_id, sync=False).job(job_id)
    if record.backend != "slurm" or not record.backend_ref:
        raise UsageError(f"job {job} runs on {record.backend}, not Slurm")
    return record.backend_ref


@account_app.command("add")
def account_add(
    team: Annotated[str, typer.Argument(help="Team name; becomes the Slurm account.")],
    fairshare: Annotated[int | None, typer.Option(help="Fairshare shares.", min=1)] = None,
    user: Annotated[str, typer.Option(help="User to associate with the account.")] = "root",
    json_out: JsonOpt = False,
) -> None:
    """Open an account for a team (sacctmgr add account, then add the user to it)."""
    check_name(team, "team")
    check_name(user, "user")
    argv = ["sacctmgr", "-i", "add", "account", team, f"Description=gpufleet team {team}"]
    if fairshare is not None:
        argv.append(f"Fairshare={fairshare}")
    _native(argv, json_out)
    _native(["sacctmgr", "-i", "add", "user", user, f"Account={team}"], json_out)


@account_app.command("list")
def account_list(json_out: JsonOpt = False) -> None:
    """Accounts and their fairshare (sacctmgr show account)."""
    out = run_slurm(["sacctmgr", "-n", "-P", "show", "assoc", "format=Account,User,Fairshare,QOS"])
    rows = [line.split("|") for line in out.stdout.splitlines() if line.strip()]
    if json_out:
        emit_json({"associations": [dict(zip(("account", "user", "fairshare", "qos"), r, strict=False)) for r in rows]})
    else:
        console.print(table(None, ["account", "user", "fairshare", "qos"], rows))


@slurm_app.command()
def hold(job: Annotated[str, typer.Argument(help="Job id.")], json_out: JsonOpt = False) -> None:
    """Keep a pending job from starting (scontrol hold)."""
    _native(["scontrol", "hold", _slurm_ref(job)], json_out)


@slurm_app.command()
def release(job: Annotated[str, typer.Argument(help="Job id.")], json_out: JsonOpt = False) -> None:
    """Let a held job start (scontrol release)."""
    _native(["scontrol", "release", _slurm_ref(job)], json_out)


@slurm_app.command()
def preempt(job: Annotated[str, typer.Argument(help="Job id.")], json_out: JsonOpt = False) -> None:
    """Requeue a running job: SIGTERM, SIGKILL after KillWait, back to the queue (scontrol requeue)."""
    _native(["scontrol", "requeue", _slurm_ref(job)], json_out)


@slurm_app.command()
def drain(
    node: Annotated[str, typer.Argument(help="Node name or hostlist.")],
    reason: Annotated[str, typer.Option(help="Why (shown by sinfo -R).")] = "maintenance by gpufleet",
    json_out: JsonOpt = False,
) -> None:
    """Stop scheduling on a node; running jobs finish (scontrol update State=DRAIN)."""
    _native(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], json_out)


@slurm_app.command()
def resume(node: Annotated[str, typer.Argument(help="Node name or hostlist.")], json_out: JsonOpt = False) -> None:
    """Return a drained node to service (scontrol update State=RESUME)."""
    _native(["scontrol", "update", f"NodeName={node}", "State=RESUME"], json_out)


@slurm_app.command()
def usage(json_out: JsonOpt = False) -> None:
    """GPU-/CPU-hours per account from sacct, reconciled with gpufleet's own ledger; exit 1 on a mismatch."""
    home = gpufleet_home()
    backend = SlurmBackend(home)
    backend.sync()  # an attempt that ended since the last sync would still be running in the ledger
    report = slurm_usage(backend.store)
    if json_out:
        emit_json(report)
    else:
        console.print(
            table(
                "Slurm accounting vs gpufleet ledger (resource-hours, every attempt)",
                ["account", "resource", "sacct h", "gpufleet h", "difference h", "sacct s", "gpufleet s", "ok"],
                [
                    [
                        a["account"],
                        a["resource"],
                        fmt(a["sacct_hours"]),
                        fmt(a["ledger_hours"]),
                        fmt(a["difference_hours"]),
                        f"{a['sacct_seconds']:,.0f}",
                        f"{a['ledger_seconds']:,.0f}",
                        a["ok"],
                    ]
                    for a in report["accounts"]
                ],
            )
        )
    if not report["ok"]:
        raise typer.Exit(1)


@slurm_app.command()
def topology(fleet: Annotated[Path, typer.Argument(help="Fleet topology YAML.")]) -> None:
    """Print a topology.conf (topology/tree) for the fleet's switches."""
    from gpufleet.backends.slurm.topology import load_fleet, render_topology_conf

    typer.echo(render_topology_conf(load_fleet(fleet)), nl=False)


__all__ = [
    "account_add",
    "account_app",
    "account_list",
    "drain",
    "hold",
    "preempt",
    "release",
    "resume",
    "slurm_app",
    "topology",
    "usage",
]
