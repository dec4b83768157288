"""``gpufleet fleet ...``: give the local backend a fleet of pools, and take parts of it down."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gpufleet.backends.pools import drop_fleet, mark, use_fleet
from gpufleet.cli.options import JsonOpt
from gpufleet.cli.render import console, emit_json, table
from gpufleet.fmt import number
from gpufleet.paths import gpufleet_home
from gpufleet.views import fleet_status

fleet_app = typer.Typer(
    help="The local backend's fleet: pools of offers, team quotas, outages and failover.", no_args_is_help=True
)


@fleet_app.command("use")
def use_command(
    file: Annotated[Path, typer.Argument(help="A fleet file (docs/placement.md); examples/local-fleet.yaml.")],
    json_out: JsonOpt = False,
) -> None:
    """Make FILE this home's fleet: jobs are placed on its pools from now on (storm times count from now)."""
    home = gpufleet_home()
    fleet = use_fleet(home, file)
    if json_out:
        emit_json(fleet_status(home))
        return
    slots = sum(o.capacity_gpus for o in fleet.catalog.offers)
    console.print(
        f"fleet of {len(fleet.pools)} pools, {slots} slots, {len(fleet.catalog.quotas)} quotas: {escape(str(file))}",
        highlight=False,
    )


@fleet_app.command("off")
def off_command(json_out: JsonOpt = False) -> None:
    """Stop using a fleet: the local backend goes back to one pool of GPUFLEET_LOCAL_SLOTS slots."""
    had = drop_fleet(gpufleet_home())
    if json_out:
        emit_json({"fleet": None, "was_in_use": had})
    else:
        console.print("fleet dropped" if had else "no fleet was in use", highlight=False)


@fleet_app.command("show")
def show_command(json_out: JsonOpt = False) -> None:
    """Pools (up, down, blocked by failover), their prices, storms and jobs; quotas."""
    status = fleet_status(gpufleet_home())
    if json_out:
        emit_json(status)
        return
    if status["fleet"] is None:
        console.print("no fleet: the local backend runs one pool (`gpufleet fleet use FILE`)", highlight=False)
        return
    rows = []
    for p in status["pools"]:
        spot = "-" if p["spot_per_gpu_hour"] is None else f"{number(p['spot_per_gpu_hour'], 6)}"
        why = "; ".join(b["why"] for b in p["blocks"])
        rows.append(
            [
                p["offer"],
                str(p["slots"]),
                f"{number(p['on_demand_per_gpu_hour'], 6)}",
                spot,
                p["state"] + (f" ({why})" if why else ""),
                f"{number(p['storm_per_hour'], 6)}" if p["storm_per_hour"] else "",
                ", ".join(map(str, p["jobs"])),
            ]
        )
    console.print(table(None, ["pool", "slots", "on-demand/h", "spot/h", "state", "storm/h", "jobs"], rows))
    for q in status["quotas"]:
        console.print(
            escape(
                f"quota {q['team']}/{q['gpu_type']}@{q['provider']}: nominal {q['nominal']}, "
                f"borrowing limit {q['borrowing_limit']}, lending limit {q['lending_limit']}, cohort {q['cohort']}"
            ),
            highlight=False,
        )


@fleet_app.command("down")
def down_command(
    target: Annotated[str, typer.Argument(help="A provider, provider/region or offer of the fleet.")],
    abrupt: Annotated[
        bool, typer.Option("--abrupt", help="Kill its jobs at once (they lose the work since their checkpoint).")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Take a provider or region down: its jobs stop (and save, unless --abrupt) and move to the next offer."""
    marks = mark(gpufleet_home(), target, down=True, abrupt=abrupt)
    if json_out:
        emit_json({"down": marks.down})
    else:
        console.print(f"{escape(target)} is down{' (abrupt)' if abrupt else ''}: its jobs move", highlight=False)


@fleet_app.command("up")
def up_command(
    target: Annotated[str, typer.Argument(help="A target marked down before.")],
    json_out: JsonOpt = False,
) -> None:
    """Bring a target marked down back: jobs may be placed there again."""
    marks = mark(gpufleet_home(), target, down=False)
    if json_out:
        emit_json({"down": marks.down})
    else:
        console.print(f"{escape(target)} is up", highlight=False)


__all__ = ["fleet_app"]
