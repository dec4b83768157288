"""The ``gpufleet`` command line: parse, call the library, render. Nothing else lives here."""

from __future__ import annotations

import errno
import functools
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import typer
from rich.markup import escape
from typer import TyperException
from typer.core import TyperGroup, TyperOption

from gpufleet.cli import jobs
from gpufleet.cli.advise import advise_command
from gpufleet.cli.bench import bench_app
from gpufleet.cli.ckpt import ckpt_app
from gpufleet.cli.debug import debug_app
from gpufleet.cli.demo import demo_command
from gpufleet.cli.estimate import estimate_app
from gpufleet.cli.export import export_app
from gpufleet.cli.fleet import fleet_app
from gpufleet.cli.goodput import goodput
from gpufleet.cli.observe import diagnose_job_command, observe_app
from gpufleet.cli.place import place_command
from gpufleet.cli.profile import profile_command
from gpufleet.cli.quality import drift_command, embedding_lab_command, quality_app, seasonal_lab_command
from gpufleet.cli.registry import registry_app
from gpufleet.cli.render import err_console
from gpufleet.cli.serve import serve_command
from gpufleet.cli.simulate import simulate_command
from gpufleet.cli.slurm import slurm_app
from gpufleet.cli.sweep import sweep_app
from gpufleet.cli.trace import trace_command
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.features import load_features

load_features()  # rl, data, sweeps and installed plugins: their events, metrics and `show` lines

app = typer.Typer(
    name="gpufleet",
    help="Run training jobs that survive preemption, and see what they cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Jobs: cli/jobs.py
for command in (
    jobs.submit,
    jobs.jobs,
    jobs.show,
    jobs.logs,
    jobs.preempt,
    jobs.cancel,
    jobs.hold,
    jobs.release,
    jobs.resize,
    jobs.cost,
):
    app.command()(command)
app.add_typer(ckpt_app, name="ckpt")
app.command("demo")(demo_command)
# Observing and debugging
app.add_typer(observe_app, name="observe")
app.command("diagnose")(diagnose_job_command)
app.command("trace")(trace_command)
app.command("profile")(profile_command)
app.add_typer(debug_app, name="debug")
# Planning and estimating
app.command("place")(place_command)
app.command("simulate")(simulate_command)
app.command("goodput")(goodput)
app.command("advise")(advise_command)
app.add_typer(fleet_app, name="fleet")
app.add_typer(estimate_app, name="estimate")
app.add_typer(bench_app, name="bench")
app.add_typer(export_app, name="export")
app.add_typer(slurm_app, name="slurm")
app.add_typer(sweep_app, name="sweep")
# Model quality
app.command("drift")(drift_command)
quality_app.command("lab-seasonal")(seasonal_lab_command)
quality_app.command("lab-embeddings")(embedding_lab_command)
app.add_typer(quality_app, name="quality")
app.add_typer(registry_app, name="registry")
app.command("serve")(serve_command)


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_PLAIN = re.compile(r"[\w.,:/@+-]+")  # a value shown as typed; anything else, quoted
_HINT_FITS = 160  # an error line longer than this gets no "(see ... --help)" hint


def _escaped(char: str) -> str:
    code = ord(char)
    if char in _ESCAPES:
        return _ESCAPES[char]
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _one_line(text: str) -> str:
    """``text`` with every character that does not print as itself shown escaped, so it prints as one line.

    Control characters (a newline too), line and paragraph separators (U+2028, U+2029), other
    invisible format characters (a bidi override) and the lone surrogates of undecodable bytes.
    """
    text = text.strip()
    return text if text.isprintable() else "".join(c if c.isprintable() else _escaped(c) for c in text)


def _not_utf8(value: str) -> bytes | None:
    """The bytes of a command-line value that was not UTF-8 (Python keeps them as lone surrogates), else ``None``."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate no byte decodes to: passed from Python, not from a terminal
            return value.encode("utf-8", "backslashreplace")
    return None


def _text_checked(command: Any) -> None:
    """Make ``command`` (each command under a group) refuse a text value that is not UTF-8, before it runs.

    Such a value cannot be stored (SQLite, JSON), matched or shown faithfully; paths are left alone
    (a file name may be any bytes), as are the values of a group's own options.
    """
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            _text_checked(sub)
        return
    if command.callback is None:
        return
    names = {p.name: p.opts[0] if isinstance(p, TyperOption) else p.metavar or p.name.upper() for p in command.params}
    run: Callable[..., Any] = command.callback

    @functools.wraps(run)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for name, value in kwargs.items():
            for item in value if isinstance(value, list | tuple) else (value,):
                raw = _not_utf8(item) if isinstance(item, str) else None
                if raw is not None:
                    raise UsageError(
                        f"{names.get(name, name)} {repr(raw)[1:]} is not UTF-8 text: give it in UTF-8 "
                        "(is the terminal's locale UTF-8? e.g. LANG=C.UTF-8)"
                    )
        return run(*args, **kwargs)

    command.callback = checked


def _fail(message: str, code: int, *, label: str = "error:") -> NoReturn:
    """``label message`` as one line on stderr, then exit ``code``."""
    line = f"[red]{label}[/]" + (f" {escape(_one_line(message))}" if message else "")
    err_console.print(line, highlight=False, soft_wrap=True, emoji=False)
    sys.exit(code)


def _bad_input(err: TyperException) -> str:
    """``, got VALUE`` where Typer's message came from a validation that kept the input but did not name it."""
    errors = getattr(err.__cause__, "errors", None)
    try:
        value = errors()[0]["input"] if callable(errors) else None
    except (LookupError, TypeError):
        return ""
    if value is None:
        return ""
    shown = str(value)
    if len(shown) > 40:
        return f", got {shown[:40]!r}... ({len(shown)} characters)"
    return f", got {shown}" if _PLAIN.fullmatch(shown) else f", got {shown!r}"


def _usage_line(err: TyperException) -> str:
    """Click's own message (it names the option and the value) and, where it fits, where to read more."""
    message = _one_line(err.format_message().strip().rstrip(".") + _bad_input(err))
    ctx = getattr(err, "ctx", None)
    command = getattr(ctx, "command_path", None) or "gpufleet"
    hint = f" (see {command} --help)"
    return message + hint if len(message) + len(hint) <= _HINT_FITS else message


def main() -> None:
    """Run the CLI: any error a user can cause ends as one line on stderr and its exit code, never a traceback."""
    try:
        command = typer.main.get_command(app)
        _text_checked(command)
        code = command(standalone_mode=False)
    except GpufleetError as err:
        _fail(str(err), err.exit_code)
    except OSError as err:
        if err.errno != errno.ENAMETOOLONG:
            raise
        # A safety net: each command checks the paths it is given, but a name too long can reach the system
        # from anywhere, and it is bad input wherever it does.
        shown = repr(str(err.filename))
        shown = shown if len(shown) <= 120 else f"{shown[:70]}...{shown[-40:]} ({len(str(err.filename)):,} characters)"
        _fail(f"cannot use the path {shown}: {err.strerror}: shorten it (at most 255 bytes a name)", 2)
    except typer.Abort:
        _fail("", 130, label="aborted")
    except TyperException as err:  # Click's usage errors (a bad value, an unknown option or command)
        if type(err).__name__ == "NoArgsIsHelpError":  # no arguments: the help was printed already
            sys.exit(err.exit_code)
        _fail(_usage_line(err), err.exit_code)
    # Not standalone, the app returns typer.Exit's code (``--help`` gives 0; Ctrl-C, 130) or a command's None.
    if code == 130:
        _fail("", 130, label="aborted")
    if isinstance(code, int) and code:
        sys.exit(code)


__all__ = ["app", "main"]
