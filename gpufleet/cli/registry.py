"""``gpufleet registry history|promote|rollback``: the MLflow registry's aliases, and who moved them.

MLflow is imported inside the commands so ``gpufleet --help`` stays fast.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufleet.cli.options import JsonOpt
from gpufleet.cli.render import console, emit_json, table
from gpufleet.errors import NotFound, UsageError

if TYPE_CHECKING:
    from gpufleet.quality.registry import AliasEvent

registry_app = typer.Typer(
    help="The model registry (MLflow): alias history, promotion, rollback.", no_args_is_help=True
)
ModelArg = Annotated[str, typer.Argument(metavar="MODEL", help="Registered model name.")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why: recorded in the alias history.")]


def require_registered(model: str) -> None:
    """Refuse ``model`` where the local registry does not exist yet, without creating it (nothing is registered).

    A sqlite registry (the default, ``$GPUFLEET_HOME/mlflow.db``) is created by the first MLflow call
    that opens it: a command refused for a model it does not know would leave one behind.
    """
    from gpufleet.quality.registry import check_model_name, sqlite_path, tracking_uri

    check_model_name(model)
    uri = tracking_uri()
    db = sqlite_path(uri)
    if db is not None and not os.path.exists(db):
        raise NotFound(f"model {model!r} is not registered in {uri} (registered: none)")


def _events_rows(events: list[AliasEvent]) -> list[list[Any]]:
    return [
        [
            e.seq,
            datetime.fromtimestamp(e.when, UTC).strftime("%Y-%m-%d %H:%M:%S"),
            e.action,
            f"@{e.alias}",
            e.from_version or "-",
            e.to_version or "-",
            e.who,
            e.why,
        ]
        for e in events
    ]


def print_alias_history(events: list[AliasEvent], title: str) -> None:
    t = table(title, ["#", "when (UTC)", "action", "alias", "from", "to", "who", "why"], _events_rows(events))
    for column in t.columns[-2:]:  # who and why wrap; the rest stays on one line
        column.no_wrap, column.overflow = False, "fold"
    console.print(t)


@registry_app.command("history")
def history_command(model: ModelArg, json_out: JsonOpt = False) -> None:
    """Every alias move of MODEL: who, when, why, from which version to which."""
    from gpufleet.quality.registry import Registry, mlflow_errors, tracking_uri

    require_registered(model)
    with mlflow_errors(tracking_uri()):
        registry = Registry()
        events, source = registry.history(model)
        aliases = registry.aliases(model)
    if json_out:
        emit_json({"model": model, "aliases": aliases, "source": source, "events": [e.to_dict() for e in events]})
        return
    print_alias_history(events, f"alias history of {model} (from {source})")
    console.print(
        "aliases now: " + (", ".join(f"@{a}=v{v}" for a, v in sorted(aliases.items())) or "none"), markup=False
    )


def _moves(model: str, events: list[AliasEvent], json_out: bool, verb: str) -> None:
    if json_out:
        emit_json({"model": model, "action": verb, "events": [e.to_dict() for e in events]})
        return
    for e in events:
        console.print(f"{verb}: @{e.alias} {e.from_version or '-'} -> {e.to_version or '-'}", markup=False)


@registry_app.command("promote")
def promote_command(
    model: ModelArg,
    version: Annotated[str, typer.Argument(metavar="VERSION", help="Version number to serve as @champion.")],
    reason: ReasonOpt,
    json_out: JsonOpt = False,
) -> None:
    """Move @champion to VERSION (the old champion becomes @previous)."""
    from gpufleet.quality.registry import Registry, mlflow_errors, tracking_uri

    if not reason.strip():
        raise UsageError("--reason is empty: say why, it goes into the alias history")
    require_registered(model)
    with mlflow_errors(tracking_uri()):
        events = Registry().promote(model, version, why=reason.strip())
    _moves(model, events, json_out, "promote")


@registry_app.command("rollback")
def rollback_command(model: ModelArg, reason: ReasonOpt, json_out: JsonOpt = False) -> None:
    """Move @champion back to @previous."""
    from gpufleet.quality.registry import Registry, mlflow_errors, tracking_uri

    if not reason.strip():
        raise UsageError("--reason is empty: say why, it goes into the alias history")
    require_registered(model)
    with mlflow_errors(tracking_uri()):
        events = Registry().rollback(model, why=reason.strip())
    _moves(model, events, json_out, "rollback")


__all__ = [
    "ModelArg",
    "ReasonOpt",
    "history_command",
    "print_alias_history",
    "promote_command",
    "registry_app",
    "require_registered",
    "rollback_command",
]
