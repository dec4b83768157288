"""``gpufleet export ...``: a JobSpec as a SkyPilot task or as Kueue manifests. Parse, call, write.

YAML goes to stdout (or ``--out FILE``), ready for ``sky jobs launch`` or ``kubectl apply -f``;
``--json`` prints one object with the same content instead. Warnings (a setting that makes a
recovered attempt start from step 0) go to stderr and into the JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from gpufleet.cli.options import check_path_name
from gpufleet.cli.render import console, emit_json, err_console
from gpufleet.errors import UsageError, parameters_as_flags
from gpufleet.spec import load_spec

export_app = typer.Typer(
    help="Write a JobSpec as another scheduler's files: a SkyPilot task, or Kueue manifests.",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of YAML.")]
SpecArg = Annotated[Path, typer.Argument(metavar="SPEC", help="JobSpec YAML file.")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Write the YAML to this file instead of stdout.")]


def _check_out(out: Path) -> None:
    """Refuse an ``--out`` no file can be written at, before anything (a warning included) is printed."""
    check_path_name(out, "--out")
    if out.exists() and out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a directory: give a file path")
    if not out.parent.is_dir():
        raise UsageError(f"--out {str(out)!r}: folder {str(out.parent)!r} does not exist; create it first")


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write --out {str(out)!r}: {err.strerror or err}") from None


def _finish(text: str, payload: dict[str, Any], warnings: list[str], out: Path | None, json_out: bool) -> None:
    if out is not None:
        _check_out(out)
        _write(text, out)  # before any warning: a write that fails is the one line a refusal prints
    if json_out:
        emit_json({**payload, "out": str(out) if out else None, "warnings": warnings})
        return
    for warning in warnings:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if out is None:
        _write(text, out)
    else:
        console.print(f"wrote {out}", highlight=False, markup=False)


@export_app.command("skypilot")
@parameters_as_flags({"infra": "--infra"})
def skypilot(
    spec_path: SpecArg,
    bucket: Annotated[
        str | None, typer.Option("--bucket", help="Bucket URI mounted for checkpoints, e.g. s3://team-ckpt.")
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Local folder SkyPilot syncs to the node (default: the spec's).")
    ] = None,
    infra: Annotated[
        list[str] | None,
        typer.Option("--infra", help="PROVIDER=INFRA for providers SkyPilot does not know, e.g. coreweave=k8s/cw."),
    ] = None,
    requirement: Annotated[
        str | None, typer.Option("--requirement", help="What setup pip-installs (default: this gpufleet version).")
    ] = None,
    out: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A SkyPilot task for `sky jobs launch`: spot recovery, any_of/ordered placement, checkpoint bucket."""
    from gpufleet.export.skypilot import (
        DEFAULT_REQUIREMENT,
        parse_infra_map,
        skypilot_task,
        skypilot_yaml,
        task_warnings,
    )

    spec = load_spec(spec_path)
    if workdir is not None and not check_path_name(workdir, "--workdir").is_dir():
        raise UsageError(f"--workdir {str(workdir)!r} is not a folder")
    task = skypilot_task(
        spec,
        bucket=bucket,
        workdir=str(workdir.resolve()) if workdir is not None else None,
        infra=parse_infra_map(infra or []),
        requirement=requirement or DEFAULT_REQUIREMENT,
    )
    _finish(skypilot_yaml(task), {"task": task}, task_warnings(spec, bucket=bucket), out, json_out)


@export_app.command("kueue")
def kueue(
    spec_path: SpecArg,
    catalog: Annotated[Path, typer.Option("--catalog", help="Offer catalogue with the team quotas (YAML).")],
    namespace: Annotated[
        str, typer.Option("--namespace", help="Namespace of the LocalQueues and the Job.")
    ] = "default",
    image: Annotated[
        str | None, typer.Option("--image", help="Container image with gpufleet and the job's code installed.")
    ] = None,
    checkpoint_claim: Annotated[
        str | None, typer.Option("--checkpoint-claim", help="PersistentVolumeClaim that keeps the checkpoints.")
    ] = None,
    out: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Kueue manifests: flavors, cohorts, team ClusterQueues and LocalQueues, and the job as a suspended Job."""
    from gpufleet.export.kueue import DEFAULT_IMAGE, kueue_manifests, kueue_yaml, manifest_warnings
    from gpufleet.placement.catalog import load_catalog

    spec = load_spec(spec_path)
    manifests = kueue_manifests(
        spec,
        load_catalog(catalog),
        namespace=namespace,
        image=image or DEFAULT_IMAGE,
        checkpoint_claim=checkpoint_claim,
    )
    warnings = manifest_warnings(spec, checkpoint_claim=checkpoint_claim)
    _finish(kueue_yaml(manifests), {"manifests": manifests}, warnings, out, json_out)


__all__ = ["export_app"]
