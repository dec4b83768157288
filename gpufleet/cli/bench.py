"""``gpufleet bench ...``: measure the disk and the network a job depends on (fio, iperf3). Parse, call, render."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gpufleet.cli.options import JsonOpt, check_path_name
from gpufleet.cli.render import console, emit_json, err_console, table
from gpufleet.errors import UsageError, parameters_as_flags
from gpufleet.fmt import number, shown_path
from gpufleet.iobench import DISK_COLUMNS, NET_COLUMNS, format_bytes, measure_disk, measure_net, parse_size
from gpufleet.paths import gpufleet_home

bench_app = typer.Typer(help="Measure the disk and the network a job depends on.", no_args_is_help=True)

_DISK_FLAGS = {"size_bytes": "--size", "runtime_s": "--runtime"}
_NET_FLAGS = {"host": "--host", "port": "--port", "seconds": "--seconds", "streams": "--streams"}


@contextmanager
def spinner(enabled: bool, first: str) -> Iterator[Callable[[str], None] | None]:
    """A Rich status spinner on stderr while a measurement runs; yields the callback that updates its text.

    Disabled (``None``) for ``--json``: stdout holds the one JSON object, stderr stays quiet.
    """
    if not enabled:
        yield None
        return
    with err_console.status(escape(first)) as status:
        yield lambda text: status.update(escape(text))


def print_report(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], footer: str) -> None:
    """A benchmark's short table and the one line that says how to read it (tool version, mode, limits)."""
    console.print(table(title, columns, rows))
    console.print(escape(footer), highlight=False, soft_wrap=True)


def default_disk_path() -> Path:
    """``$GPUFLEET_HOME``, where checkpoints and logs go; before it exists, the nearest folder above it."""
    home = gpufleet_home()
    for candidate in (home, *home.parents):
        try:
            exists = candidate.exists() or candidate.is_symlink()
        except (OSError, ValueError):
            continue
        if not exists:
            continue
        if not candidate.is_dir():
            raise UsageError(
                f"GPUFLEET_HOME={str(home)!r} cannot be a folder: {shown_path(candidate)} is not one; "
                "give PATH, or set GPUFLEET_HOME to a folder"
            )
        return candidate
    return home


@bench_app.command("disk")
@parameters_as_flags(_DISK_FLAGS)
def disk_command(
    path: Annotated[
        Path | None,
        typer.Argument(
            help="A folder on the disk to measure. Default: $GPUFLEET_HOME (~/.gpufleet), where checkpoints are "
            "written; before it exists, the nearest folder above it.",
            show_default=False,
        ),
    ] = None,
    size: Annotated[str, typer.Option("--size", help="Size of the test file: 256MiB, 1GiB, 512M or bytes.")] = "256MiB",
    runtime: Annotated[float, typer.Option("--runtime", help="Seconds each of the four tests runs.")] = 5.0,
    json_out: JsonOpt = False,
) -> None:
    """Sequential and random write and read with fio (direct I/O where the file system allows it).

    The test file lives in a temporary folder under PATH, removed afterwards. MB/s counts 10**6 bytes.
    """
    size_bytes = parse_size(size, "--size")
    target = default_disk_path() if path is None else check_path_name(path, "PATH")
    with spinner(not json_out, f"fio: starting in {target}") as progress:
        report = measure_disk(target, size_bytes=size_bytes, runtime_s=runtime, progress=progress)
    if json_out:
        emit_json(report.to_json())
        return
    footer = (
        f"{report.fio_version}, {report.fs_type}, {report.mode}, {report.ioengine}; "
        f"test file {format_bytes(report.size_bytes)}, {number(report.runtime_s, 6)} s a test"
    )
    shown = report.path if report.path.isprintable() else shown_path(report.path)
    print_report(f"disk: {shown}", DISK_COLUMNS, report.rows(), footer)


@bench_app.command("net")
@parameters_as_flags(_NET_FLAGS)
def net_command(
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            help="A machine running `iperf3 -s`. Default: a one-off server on 127.0.0.1 (loopback: this "
            "machine's TCP stack, not a network card).",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="The server's port (iperf3's default 5201).", show_default=False)
    ] = None,
    seconds: Annotated[float, typer.Option("--seconds", help="Length of the test (whole seconds).")] = 3.0,
    streams: Annotated[int, typer.Option("--streams", help="Parallel TCP streams.")] = 1,
    reverse: Annotated[bool, typer.Option("--reverse", help="The server sends, this machine receives.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """TCP throughput with iperf3: to --host, or over loopback to a server started (and stopped) here."""
    where = "loopback" if host is None else host
    with spinner(not json_out, f"iperf3: connecting to {where}") as progress:
        report = measure_net(host, port=port, seconds=seconds, streams=streams, reverse=reverse, progress=progress)
    if json_out:
        emit_json(report.to_json())
        return
    title = f"network: {report.host}:{report.port}" + (" (loopback)" if report.loopback else "")
    cpu = ", ".join(
        f"CPU {side} {value:.0f}%"
        for side, value in (("here", report.local_cpu_percent), ("there", report.remote_cpu_percent))
        if value is not None
    )
    direction = "the server sent" if report.reverse else "this machine sent"
    footer = (
        f"{report.iperf3_version}, TCP, {report.streams} stream(s), {number(report.seconds, 6)} s, {direction}; {cpu}"
    )
    if report.loopback:
        footer += "; loopback measures this machine's TCP stack and memory copies, not a network card"
    print_report(title, NET_COLUMNS, report.rows(), footer)


@bench_app.command("stage")
@parameters_as_flags({"disk_size_bytes": "--disk-size", "disk_runtime_s": "--disk-runtime"})
def stage_command(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="A JobSpec with a `data` block.")],
    folder: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            help="Folder on the disk to stage into (a temporary folder under it, removed afterwards). "
            "Default: as `bench disk`.",
            show_default=False,
        ),
    ] = None,
    disk_size: Annotated[str, typer.Option("--disk-size", help="fio's test file.")] = "256MiB",
    disk_runtime: Annotated[float, typer.Option("--disk-runtime", help="Seconds of fio's sequential write.")] = 5.0,
    json_out: JsonOpt = False,
) -> None:
    """Stage a spec's data cold, and compare its rate with the source's read rate and the disk's write rate."""
    from gpufleet.data.bench import measure_stage
    from gpufleet.spec import load_spec
    from gpufleet.spec.sources import check_installed

    spec = load_spec(spec_path)
    if spec.data is None:
        raise UsageError(f"{shown_path(spec_path)} has no `data` block: add one (see docs/data.md)")
    check_installed(spec.data)
    size_bytes = parse_size(disk_size, "--disk-size")
    target = default_disk_path() if folder is None else check_path_name(folder, "--dir")
    with spinner(not json_out, "reading the sources") as say:
        found = measure_stage(spec.data, target, disk_size_bytes=size_bytes, disk_runtime_s=disk_runtime, say=say)
    if json_out:
        emit_json(found.to_json())
        return
    report = found.stage
    rows = [
        ("source read (no write)", f"{found.source_read_bytes_per_s / 1e6:,.1f}", ""),
        (
            "stage-in",
            f"{found.stage_bytes_per_s / 1e6:,.1f}",
            f"{report.files_copied} files, {format_bytes(report.bytes_copied)} in {number(report.seconds)} s",
        ),
    ]
    if found.disk_write_bytes_per_s:
        rows.append(("disk sequential write (fio)", f"{found.disk_write_bytes_per_s / 1e6:,.1f}", ""))
    print_report(
        f"stage-in: {shown_path(spec_path)} into {shown_path(target)}", ("path", "MB/s", ""), rows, found.sentence()
    )


__all__ = ["bench_app", "default_disk_path", "disk_command", "net_command", "print_report", "spinner", "stage_command"]
