"""``gpufleet quality demo|doc`` and ``gpufleet registry history|promote|rollback``: parse, call, render.

MLflow, pandas and torch are imported inside the commands so ``gpufleet --help`` stays fast.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufleet.cli.render import console, emit_json, table
from gpufleet.errors import UsageError
from gpufleet.paths import gpufleet_home

if TYPE_CHECKING:
    from gpufleet.quality.registry import AliasEvent

quality_app = typer.Typer(
    help="The model-quality loop: drift, retraining, champion and challenger.", no_args_is_help=True
)
registry_app = typer.Typer(
    help="The model registry (MLflow): alias history, promotion, rollback.", no_args_is_help=True
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
ModelArg = Annotated[str, typer.Argument(metavar="MODEL", help="Registered model name.")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why: recorded in the alias history.")]


def _events_rows(events: list[AliasEvent]) -> list[list[Any]]:
    return [
        [
            e.seq,
            datetime.fromtimestamp(e.when, timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            e.action,
            f"@{e.alias}",
            e.from_version or "-",
            e.to_version or "-",
            e.who,
            e.why,
        ]
        for e in events
    ]


def print_history(events: list[AliasEvent], title: str) -> None:
    t = table(title, ["#", "when (UTC)", "action", "alias", "from", "to", "who", "why"], _events_rows(events))
    for column in t.columns[-2:]:  # who and why wrap; the rest stays on one line
        column.no_wrap, column.overflow = False, "fold"
    console.print(t)


@quality_app.command("demo")
def demo_command(
    preempt: Annotated[
        bool, typer.Option("--preempt", help="Preempt the retraining job once to show it resume.")
    ] = False,
    worse: Annotated[
        bool, typer.Option("--worse", help="Train a worse challenger (broken labels) to show the rollback path.")
    ] = False,
    mode: Annotated[str, typer.Option("--mode", help="Live evaluation: canary or shadow.")] = "canary",
    json_out: JsonOpt = False,
) -> None:
    """The whole chain on synthetic data: drift, policy, signed alert, retraining job, registry, canary."""
    from gpufleet.cli.watch import describe
    from gpufleet.demos.quality_chain import ChainConfig, run_quality_demo
    from gpufleet.quality.registry import mlflow_errors, tracking_uri

    if mode not in ("canary", "shadow"):
        raise UsageError(f"--mode {mode!r}: use canary or shadow")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    home = gpufleet_home() / "quality-demo" / stamp
    home.mkdir(parents=True, exist_ok=True)

    def say(text: str) -> None:
        if not json_out:
            console.print(text, highlight=False)

    say(f"[bold]gpufleet quality demo[/]  state: {home}")
    cfg = ChainConfig(mode="shadow" if mode == "shadow" else "canary", preempt=preempt, worse=worse)
    with mlflow_errors(tracking_uri(home)):
        result = run_quality_demo(home, cfg, say, describe)
    if json_out:
        emit_json(result)
    else:
        print_history([_event(e) for e in result["history"]["events"]], f"alias history of {result['model']}")
        verdict = {"promoted": "[green]promoted[/]", "rolled_back": "[yellow]rolled back[/]"}
        console.print(
            f"outcome: {verdict.get(result['outcome'], result['outcome'])}; aliases now "
            + ", ".join(f"@{a}=v{v}" for a, v in sorted(result["aliases"].items()))
            + f". Took {result['seconds']:.0f}s."
        )
        console.print(
            f"explore it:  export GPUFLEET_HOME={home}; gpufleet registry history {result['model']}; "
            f"gpufleet quality doc {result['model']}; mlflow ui --backend-store-uri {result['tracking_uri']}",
            highlight=False,
            soft_wrap=True,
        )
        if not result["ok"]:
            console.print("[red]the chain did not end as expected: see the steps above[/]")
    if not result["ok"]:
        raise typer.Exit(1)


def _event(data: dict[str, Any]) -> AliasEvent:
    from gpufleet.quality.registry import AliasEvent

    return AliasEvent.from_dict(data)


@quality_app.command("doc")
def doc_command(
    model: ModelArg,
    out: Annotated[Path | None, typer.Option("--out", help="Write the Markdown here (default: stdout).")] = None,
    purpose: Annotated[
        str | None, typer.Option("--purpose", help="Intended purpose (default: the model's recorded one).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Technical documentation for a high-risk AI system (AI Act, Annex IV) from the registry."""
    from gpufleet.quality.aidoc import collect, render
    from gpufleet.quality.registry import Registry, mlflow_errors, tracking_uri

    with mlflow_errors(tracking_uri()):
        text = render(collect(Registry(), model, purpose))
    if out is not None:
        if out.is_dir():
            raise UsageError(f"--out {str(out)!r} is a directory: give a file name, e.g. {out / (model + '.md')}")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
        except OSError as err:
            raise UsageError(f"cannot write {str(out)!r}: {err.strerror}") from None
    if json_out:
        emit_json({"model": model, "path": str(out) if out else None, "markdown": text})
    elif out is not None:
        console.print(f"wrote {out} ({len(text.splitlines())} lines)")
    else:
        typer.echo(text, nl=False)


@registry_app.command("history")
def history_command(model: ModelArg, json_out: JsonOpt = False) -> None:
    """Every alias move of MODEL: who, when, why, from which version to which."""
    from gpufleet.quality.registry import Registry, mlflow_errors, tracking_uri

    with mlflow_errors(tracking_uri()):
        registry = Registry()
        events, source = registry.history(model)
        aliases = registry.aliases(model)
    if json_out:
        emit_json({"model": model, "aliases": aliases, "source": source, "events": [e.to_dict() for e in events]})
        return
    print_history(events, f"alias history of {model} (from {source})")
    console.print("aliases now: " + (", ".join(f"@{a}=v{v}" for a, v in sorted(aliases.items())) or "none"))


def _moves(model: str, events: list[AliasEvent], json_out: bool, verb: str) -> None:
    if json_out:
        emit_json({"model": model, "action": verb, "events": [e.to_dict() for e in events]})
        return
    for e in events:
        console.print(f"{verb}: @{e.alias} {e.from_version or '-'} -> {e.to_version or '-'}")


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
    with mlflow_errors(tracking_uri()):
        events = Registry().promote(model, version, why=reason.strip())
    _moves(model, events, json_out, "promote")


@registry_app.command("rollback")
def rollback_command(model: ModelArg, reason: ReasonOpt, json_out: JsonOpt = False) -> None:
    """Move @champion back to @previous."""
    from gpufleet.quality.registry import Registry, mlflow_errors, tracking_uri

    if not reason.strip():
        raise UsageError("--reason is empty: say why, it goes into the alias history")
    with mlflow_errors(tracking_uri()):
        events = Registry().rollback(model, why=reason.strip())
    _moves(model, events, json_out, "rollback")


__all__ = ["quality_app", "registry_app"]
