"""The top-level command group that imports a command's module only when that command runs.

``gpufleet --help`` lists :data:`gpufleet.cli.commands.COMMANDS` from their written help strings, and
``gpufleet jobs`` imports ``gpufleet.cli.jobs`` alone: the start-up of a command is Python, Typer,
Rich and what that command needs, not what the thirty others need (pydantic, numpy, torch, MLflow).
Each command is prepared once, when it is loaded (:func:`prepare`): it refuses text that is not
UTF-8, its flags show no ``<bool>`` type, and its help reads as paragraphs, not as the source's lines.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import re
from collections.abc import Callable
from typing import Any

import typer
from typer import _click
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.main import get_command_from_info, get_group
from typer.models import CommandInfo

from gpufleet.cli.commands import COMMANDS, CommandEntry
from gpufleet.errors import UsageError

__all__ = ["LazyGroup", "prepare", "unwrapped"]

_LIST_ITEM = re.compile(r"^\s*([-*]\s|\d+\.\s)")


class LazyGroup(TyperGroup):
    """A :class:`TyperGroup` whose commands are :data:`COMMANDS`, each loaded (imported, prepared) on first use.

    While it prints its help, an unloaded command is described by its entry alone: nothing is imported.
    Commands added the usual way (``app.command()``) come first and are prepared too.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._listing = False
        prepare(self)

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return [*self.commands, *(name for name in COMMANDS if name not in self.commands)]

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        found = self.commands.get(cmd_name)
        entry = COMMANDS.get(cmd_name)
        if found is not None or entry is None:
            return found
        if self._listing:
            return TyperCommand(cmd_name, help=entry.help, rich_help_panel=entry.panel)
        command = prepare(_load(entry, self))
        self.commands[cmd_name] = command
        return command

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def resolve_command(
        self, ctx: _click.Context, args: list[str]
    ) -> tuple[str | None, _click.Command | None, list[str]]:
        """Click's lookup, with the "did you mean" of every command, loaded or not."""
        try:
            return self._click_resolve_command(ctx, args)
        except _click.exceptions.UsageError as err:
            matches = difflib.get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches:
                err.message = f"{err.message.rstrip('.')}. Did you mean {', '.join(map(repr, matches))}?"
            raise


def _load(entry: CommandEntry, group: TyperGroup) -> _click.Command:
    """The click command of ``entry``: its module imported, a function wrapped as Typer does, a Typer app built."""
    found = getattr(importlib.import_module(entry.module), entry.attribute)
    if isinstance(found, typer.Typer):
        command: _click.Command = get_group(found)
        command.name = entry.name
    else:
        command = get_command_from_info(
            CommandInfo(name=entry.name, callback=found),
            pretty_exceptions_short=True,
            rich_markup_mode=group.rich_markup_mode,
        )
    command.rich_help_panel = entry.panel  # type: ignore[attr-defined]
    return command


def prepare(command: _click.Command) -> _click.Command:
    """``command`` and every command under it made ready to run: text checked, help unwrapped, flags untyped."""
    command.help = unwrapped(command.help)
    for param in command.get_params(_click.Context(command)):  # the command's own and its --help
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""  # a flag takes no value: Typer would show `<bool>` after it
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            prepare(sub)
    elif command.callback is not None:
        _text_checked(command)
    return command


def unwrapped(text: str | None) -> str | None:
    """``text`` with each paragraph's lines joined: a docstring wrapped at 120 columns reads as prose in any width.

    Paragraphs (a blank line between), list items and Click's ``\\b`` (keep these lines) blocks stay as written.
    """
    if not text:
        return text
    paragraphs = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.split("\n")
        if paragraph.startswith("\b") or any(_LIST_ITEM.match(line) for line in lines):
            paragraphs.append(paragraph)
        else:
            paragraphs.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs)


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


def _text_checked(command: _click.Command) -> None:
    """Make ``command`` refuse a text value that is not UTF-8, before it runs.

    Such a value cannot be stored (SQLite, JSON), matched or shown faithfully; paths are left alone
    (a file name may be any bytes), as are the values of a group's own options.
    """
    names = {
        p.name: p.opts[0] if isinstance(p, TyperOption) else p.metavar or str(p.name).upper() for p in command.params
    }
    run: Callable[..., Any] = command.callback  # type: ignore[assignment]

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
