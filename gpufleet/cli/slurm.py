"""``gpufleet slurm ...``: the operator's gestures, each printing the native command it runs.

Holding and releasing a job are job verbs (``gpufleet hold``/``release``, through the backend
contract). ``gpufleet slurm hold``/``release`` stay as aliases: on a gpufleet job id they run that
verb and say so; on ``slurm:<id>`` (a job gpufleet did not submit) they run ``scontrol`` itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gpufleet.backends.slurm.backend import SlurmBackend, run_slurm, slurm_usage
from gpufleet.cli.options import MAX_JOB_ID, JsonOpt, job_store
from gpufleet.cli.render import console, emit_json, err_console, fmt, table
from gpufleet.errors import UsageError
from gpufleet.paths import check_name, gpufleet_home

slurm_app = typer.Typer(
    help="Operate a Slurm cluster: accounts, holds, drains, requeues, topology.", no_args_is_help=True
)
account_app = typer.Typer(help="Slurm accounts (one per team).", no_args_is_help=True)
slurm_app.add_typer(account_app, name="account")


UNCHANGED = ("Nothing new added", "Nothing modified")
"""sacctmgr exits 1 when what it is asked to add or set is there already: that is not a failure."""


def _run_native(argv: list[str]) -> str:
    """Run one Slurm command; its output, or ``"already exists"`` where sacctmgr had nothing to do."""
    try:
        return str(run_slurm(argv).stdout).strip()
    except UsageError as err:
        if argv[0] != "sacctmgr" or not any(u in str(err) for u in UNCHANGED):
            raise
        return "already exists"


def _native(argv: list[str], json_out: bool) -> None:
    if not json_out:
        console.print(f"[dim]$ {escape(' '.join(argv))}[/]", highlight=False)
    out = _run_native(argv)
    if json_out:
        emit_json({"command": argv, "stdout": out})
    elif out == "already exists":
        console.print("already exists: nothing to add", highlight=False)
    elif out:
        console.print(out, highlight=False, markup=False)


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


def _job_verb(job: str, verb: str, json_out: bool) -> None:
    """``scontrol hold|release``: through the job verb for a gpufleet job, natively for ``slurm:<id>``."""
    ref = _slurm_ref(job)
    argv = ["scontrol", verb, ref]
    if job.startswith("slurm:"):
        _native(argv, json_out)
        return
    backend = SlurmBackend(gpufleet_home())
    if verb == "hold":
        backend.hold(int(job))
    else:
        backend.release(int(job))
    err_console.print(f"`gpufleet {verb} {job}` is this job's verb: it runs {' '.join(argv)}", highlight=False)
    if json_out:
        emit_json({"command": argv, "stdout": ""})
    else:
        console.print(f"[dim]$ {escape(' '.join(argv))}[/]", highlight=False)


@slurm_app.command()
def hold(job: Annotated[str, typer.Argument(help="Job id, or slurm:<id>.")], json_out: JsonOpt = False) -> None:
    """Keep a pending job from starting (scontrol hold); for a gpufleet job, the same as `gpufleet hold`."""
    _job_verb(job, "hold", json_out)


@slurm_app.command()
def release(job: Annotated[str, typer.Argument(help="Job id, or slurm:<id>.")], json_out: JsonOpt = False) -> None:
    """Let a held job start (scontrol release); for a gpufleet job, the same as `gpufleet release`."""
    _job_verb(job, "release", json_out)


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


def _cluster_name() -> str:
    out = run_slurm(["scontrol", "show", "config"]).stdout
    found = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.MULTILINE)
    if found is None:
        raise UsageError("scontrol show config names no ClusterName: is SLURM_CONF this cluster's?")
    return found.group(1)


@slurm_app.command("fleet")
def fleet_command(
    file: Annotated[
        Path | None, typer.Argument(help="A fleet file (default: the one in use, `gpufleet fleet use FILE`).")
    ] = None,
    apply: Annotated[
        bool, typer.Option("--apply", help="Run the commands on the cluster (root or a Slurm admin).")
    ] = False,
    nodes: Annotated[str, typer.Option(help="The nodes of every pool's partition (a hostlist).")] = "ALL",
    user: Annotated[str, typer.Option(help="The user added to a team account that --apply creates.")] = "root",
    json_out: JsonOpt = False,
) -> None:
    """The fleet's pools as partitions and its team quotas as QOS with GrpTRES=gres/gpu=N, for Slurm to enforce."""
    from gpufleet.backends.pools import active_fleet
    from gpufleet.backends.slurm.fleet import ClusterHas, fleet_commands, partition_lines, slurm_fleet
    from gpufleet.placement.fleetfile import load_fleet

    check_name(user, "user")
    if not re.fullmatch(r"ALL|[A-Za-z0-9][A-Za-z0-9_.,\[\]-]{0,1000}", nodes):
        raise UsageError(f"invalid --nodes {nodes[:60]!r}: give ALL or a hostlist such as node[1-4]")
    fleet = load_fleet(file) if file is not None else active_fleet(gpufleet_home())
    if fleet is None:
        raise UsageError("no fleet in use: give a fleet FILE, or `gpufleet fleet use FILE` first")
    sf = slurm_fleet(fleet)
    if apply:
        cluster = _cluster_name()
        todo = fleet_commands(sf, ClusterHas.ask(run_slurm), nodes=nodes, cluster=cluster, user=user)
    else:
        has = ClusterHas(accounts=frozenset(sf.teams))  # teams are accounts already (`gpufleet slurm account add`)
        todo = fleet_commands(sf, has, nodes=nodes, cluster="CLUSTER", user=user)
    if not json_out:
        console.print("# slurm.conf: the fleet's pools", highlight=False)
        for line in partition_lines(sf, nodes):
            console.print(line, highlight=False, markup=False)
        console.print("# the partitions now, and the quotas (QOS) Slurm enforces", highlight=False)
    ran = []
    for argv in todo:
        if apply and json_out:
            ran.append({"command": argv, "stdout": _run_native(argv)})
        elif apply:
            _native(argv, json_out=False)
        elif not json_out:
            console.print(" ".join(argv), highlight=False, markup=False)
    if json_out:
        commands = ran if apply else [{"command": argv} for argv in todo]
        emit_json({**sf.to_dict(), "slurm_conf": partition_lines(sf, nodes), "commands": commands, "applied": apply})


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
    "fleet_command",
    "hold",
    "preempt",
    "release",
    "resume",
    "slurm_app",
    "topology",
    "usage",
]
