"""The ``gpufleet`` command line: parse, call the library, render. Nothing else lives here."""

from __future__ import annotations

import errno
import re
import sys
from typing import Annotated, NoReturn

import typer
from rich.markup import escape
from typer import TyperException

from gpufleet._version import __version__
from gpufleet.cli import typer_values
from gpufleet.cli.lazy import LazyGroup
from gpufleet.cli.render import err_console
from gpufleet.errors import GpufleetError

typer_values.install()  # a value's pydantic check only when one needs it: no pydantic import for most commands

app = typer.Typer(
    name="gpufleet",
    cls=LazyGroup,  # the commands of gpufleet.cli.commands, each imported when it runs
    help="Run training jobs that survive preemption, and see what they cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    """``--version``: an eager option, so it answers before any command is looked up."""
    if value:
        print(f"gpufleet {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """The options of ``gpufleet`` itself (its help is the app's, above)."""


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
        code = typer.main.get_command(app)(standalone_mode=False)
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
