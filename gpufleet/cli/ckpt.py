"""``gpufleet ckpt``: list, verify and export the checkpoints of a folder, as a restore would read them."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from gpufleet.cli.options import MAX_JOB_ID, JsonOpt, check_path_name, job_store
from gpufleet.cli.render import console, emit_json, fmt, table
from gpufleet.errors import UsageError, parameters_as_flags
from gpufleet.outfiles import check_replaceable_file
from gpufleet.paths import checkpoints_dir, gpufleet_home
from gpufleet.runtime.checkpoint import CheckpointDir, CheckpointInfo, Expectation
from gpufleet.units import format_bytes

ckpt_app = typer.Typer(help="Inspect and verify checkpoint directories.", no_args_is_help=True)


def _directory(raw: str) -> Path:
    """The checkpoint directory argument, refused when empty: ``Path("")`` would be the current folder."""
    if not raw.strip():
        raise UsageError("checkpoint directory is empty: give the folder holding step-N folders, e.g. ./ck")
    return Path(raw)


DirArg = Annotated[
    Path | None,
    typer.Argument(help="A checkpoint directory (or give --job).", parser=_directory, show_default=False),
]
JobOpt = Annotated[
    int | None,
    typer.Option("--job", help="The checkpoints of this job (see `gpufleet jobs`), not DIR.", min=1, max=MAX_JOB_ID),
]


def job_checkpoints(job_id: int) -> Path:
    """The checkpoint folder of job ``job_id``, where every attempt of it saves; refused when it holds none."""
    job_store(job_id, sync=False)  # an unknown job is named as such
    folder = checkpoints_dir(gpufleet_home(), job_id)
    try:
        saved = folder.is_dir() and any(p.name.startswith("step-") for p in folder.iterdir())
    except PermissionError as err:
        raise UsageError(f"cannot read the checkpoints of job {job_id} in {str(folder)!r}: {err.strerror}") from None
    if not saved:
        raise UsageError(f"job {job_id} has no checkpoint yet (none in {folder}): `gpufleet show {job_id}` says why")
    return folder


def _chosen(directory: Path | None, job: int | None) -> Path:
    """DIR, or the folder of ``--job``: one of them, not both."""
    if directory is not None and job is not None:
        raise UsageError("give a checkpoint directory or --job ID, not both")
    if directory is not None:
        return directory
    if job is None:
        raise UsageError("give a checkpoint directory or --job ID (a job's id, see `gpufleet jobs`)")
    return job_checkpoints(job)


@ckpt_app.command("list")
def ckpt_list(directory: DirArg = None, job: JobOpt = None, json_out: JsonOpt = False) -> None:
    """List the step-N checkpoints in DIR (or of --job), with their state and metrics, and the memory tier's copies."""
    directory = _chosen(directory, job)
    infos = _ckpt_infos(directory)
    rows = [_ckpt_row(i) for i in infos]
    memory = memory_tiers(directory)
    if json_out:
        emit_json({"directory": str(directory), "checkpoints": rows, "memory": memory})
        return
    console.print(
        table(
            str(directory),
            ["step", "status", "format", "healthy", "loss", "metrics", "size", "reason", "problem"],
            [
                [
                    r["step"],
                    r["status"],
                    r["format"] if r["world_size"] in (None, 1) else f"{r['format']} x{r['world_size']}",
                    r["healthy"],
                    r["loss"],
                    " ".join(f"{k}={fmt(v)}" for k, v in (r["metrics"] or {}).items()),
                    None if r["bytes"] is None else format_bytes(r["bytes"]),
                    r["reason"],
                    r["problem"],
                ]
                for r in rows
            ],
        )
    )
    if memory is not None:
        print_memory(memory)


def memory_tiers(directory: Path) -> dict[str, Any] | None:
    """The memory tier of the job whose checkpoints these are (``checkpoint.memory``): steps held per rank.

    The job's folder is the checkpoint folder's parent under gpufleet (``jobs/<id>/checkpoints``), or
    the checkpoint folder itself for a script run by hand; ``None`` when neither has a memory tier.
    """
    from gpufleet.runtime.memtier.copies import TierError
    from gpufleet.runtime.memtier.peer import PeerClient, read_record, running_keeper
    from gpufleet.runtime.memtier.shm import held_copies, job_key, shm_root

    root = shm_root(os.environ)
    for job_dir in (directory.resolve().parent, directory.resolve()):
        key, record = job_key(job_dir), read_record(job_dir)
        own = held_copies(root, key)
        if not own and record is None:
            continue
        peer: dict[str, Any] | None = None
        if record is not None:
            address = running_keeper(job_dir)
            copies: dict[int, list[int]] = {}
            if address is not None:
                client = PeerClient(address, timeout=5.0)
                try:
                    for rank, step in client.list(key):
                        copies.setdefault(rank, []).append(step)
                except TierError:
                    address = None
                finally:
                    client.close()
            peer = {
                "address": record["address"],
                "alive": address is not None,
                "ranks": {str(r): sorted(v, reverse=True) for r, v in sorted(copies.items())},
            }
        return {
            "job_dir": str(job_dir),
            "own_root": str(root / key),
            "own": {str(rank): steps for rank, steps in own.items()},
            "peer": peer,
        }
    return None


def print_memory(memory: dict[str, Any]) -> None:
    peer = memory["peer"]
    ranks = sorted({*memory["own"], *(peer["ranks"] if peer else {})}, key=int)
    console.print(f"memory tier: own copies in {escape(memory['own_root'])}")
    if peer is not None:
        console.print(f"memory tier: peer keeper {peer['address']}" + ("" if peer["alive"] else " (not running)"))
    console.print(
        table(
            "memory tier",
            ["rank", "own steps", "peer steps"],
            [
                [
                    rank,
                    " ".join(str(x) for x in memory["own"].get(rank, [])) or "-",
                    " ".join(str(x) for x in (peer["ranks"].get(rank, []) if peer else [])) or "-",
                ]
                for rank in ranks
            ],
        )
    )


@ckpt_app.command("verify")
def ckpt_verify(
    directory: DirArg = None,
    job: Annotated[
        str | None,
        typer.Option(
            "--job",
            help="This job's id: checkpoints another job wrote count as foreign. Without DIR, that job's checkpoints.",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Verify every checkpoint as a restore would; exit 1 if any is corrupt."""
    if directory is None and job is not None:
        if not job.isdecimal() or not 1 <= int(job) <= MAX_JOB_ID:
            raise UsageError(f"--job {job!r} is not a job id: give a number from `gpufleet jobs`, or DIR as well")
        directory = job_checkpoints(int(job))
    directory = _chosen(directory, None)
    infos = _ckpt_infos(directory, Expectation(job=job))
    bad = [i for i in infos if i.status == "corrupt"]
    restorable = [i for i in infos if i.restorable]  # the rule restore_candidate applies, newest first
    result = {
        "directory": str(directory),
        "ok": not bad,
        "checked": len(infos),
        "corrupt": [{"step": i.step, "path": str(i.path), "problem": i.problem} for i in bad],
        "checkpoints": [_ckpt_row(i) for i in infos],
        "restore_step": restorable[-1].step if restorable else None,
    }
    if json_out:
        emit_json(result)
    else:
        marks = {"ok": "[green]ok[/]", "corrupt": "[red]BAD[/]", "unhealthy": "[yellow]unhealthy[/]"}
        for info in infos:
            mark = marks.get(info.status, "[magenta]foreign[/]")
            problem = f"  {escape(info.problem)}" if info.problem else ""
            console.print(f"{mark}  {escape(info.path.name)}{problem}", soft_wrap=True)
        restore = (
            f"restore would use step {result['restore_step']}"
            if restorable
            else "no healthy checkpoint: restore would start from scratch"
        )
        console.print(f"{len(infos)} checked, {len(bad)} bad; {restore}")
    if bad:
        raise typer.Exit(1)


@ckpt_app.command("export")
@parameters_as_flags({"out": "--out", "step": "--step", "entry": "--entry"})
def ckpt_export(
    directory: DirArg = None,
    job: JobOpt = None,
    *,
    out: Annotated[Path, typer.Option("--out", help="File to write, e.g. model.pt (replaced atomically).")],
    step: Annotated[
        int | None, typer.Option("--step", help="Step to export (default: the one a restore would use).", min=0)
    ] = None,
    entry: Annotated[str, typer.Option("--entry", help="State entry to export (model, optimizer, ...).")] = "model",
    json_out: JsonOpt = False,
) -> None:
    """Write one entry of a verified checkpoint as a plain state dict: torch.load(OUT, weights_only=True)."""
    directory = _chosen(directory, job)
    _ckpt_dir(directory)
    check_replaceable_file(check_path_name(out, "--out"), "--out")  # written by a rename: never over a device
    with _torch_quiet():
        done = CheckpointDir(directory).export(out, step=step, entry=entry)
    result = {
        "directory": str(directory),
        "path": str(done.source),
        "step": done.step,
        "entry": done.entry,
        "out": str(done.out),
        "bytes": done.bytes,
        "tensors": done.tensors,
        "fingerprint": done.fingerprint,
    }
    if json_out:
        emit_json(result)
    else:
        console.print(
            f"wrote {done.entry} of {done.source.name} to {done.out} ({done.bytes} bytes, {done.tensors} tensors)",
            markup=False,
        )


def _ckpt_dir(directory: Path) -> None:
    check_path_name(directory, "checkpoint directory")
    if not directory.exists():
        raise UsageError(f"checkpoint directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise UsageError(f"{str(directory)!r} is not a directory: give the folder holding step-N folders")


def _ckpt_infos(directory: Path, expect: Expectation | None = None) -> list[CheckpointInfo]:
    _ckpt_dir(directory)
    try:
        with _torch_quiet():
            return CheckpointDir(directory).scan(verify=True, expect=expect)
    except PermissionError as err:
        raise UsageError(f"cannot read checkpoint directory {str(directory)!r}: {err.strerror}") from None


@contextlib.contextmanager
def _torch_quiet() -> Iterator[None]:
    """torch's warnings while checkpoints are read (deprecated storages, dtypes) name its own files, not the checkpoint.

    Whatever in a checkpoint matters is a problem of ours, reported on its own line (``CorruptCheckpoint``).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _ckpt_row(info: CheckpointInfo) -> dict[str, Any]:
    m = info.manifest
    return {
        "step": info.step,
        "path": str(info.path),
        "status": info.status,
        "healthy": m.healthy if m else None,
        "loss": round(m.loss, 4) if m and m.loss is not None else None,
        "metrics": dict(m.metrics) if m else None,
        "job": m.job if m else None,
        "bytes": m.total_bytes if m else None,
        "format": m.format if m else None,
        "world_size": m.world_size if m else None,
        "strategy": m.strategy if m else None,
        "reason": m.reason if m else None,
        "problem": info.problem,
    }


__all__ = ["ckpt_app", "ckpt_export", "ckpt_list", "ckpt_verify", "job_checkpoints"]
