"""A parameter's value check built only when a value needs it (gpufleet/cli/typer_values.py).

Every parameter of every command is given the same values through typer's own check and through
``Deferred``: what each returns (or the error each raises) must be the same. And the read-only
commands must not import pydantic: that fails when a typer release changes what ``install`` relies on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer import _click
from typer._coercion import build_runtime_param
from typer.core import TyperGroup

from gpufleet.cli import typer_values
from gpufleet.cli.app import app
from gpufleet.cli.commands import COMMANDS
from gpufleet.jobs.store import Store

TYPED = [
    "0",
    "5",
    "-3",
    "+4",
    "007",
    "17",
    "1_000",
    " 7",
    "7 ",
    "abc",
    "",
    "1.5",
    "1e3",
    "\u0663",
    "9" * 30,
    "9" * 41,
    "9" * 5000,
]


def _commands() -> Iterator[_click.Command]:
    import typer.main

    group = typer.main.get_command(app)
    ctx = _click.Context(group)
    assert isinstance(group, TyperGroup)
    todo: list[_click.Command] = [c for name in COMMANDS if (c := group.get_command(ctx, name)) is not None]
    while todo:
        command = todo.pop()
        if isinstance(command, TyperGroup):
            todo.extend(command.commands.values())
        yield command


def _outcome(check: Any, value: Any, param: Any, ctx: Any) -> tuple[Any, ...]:
    try:
        got = check.coerce(value, param=param, ctx=ctx)
    except Exception as err:  # noqa: BLE001 - the error itself is what is compared
        return ("error", type(err).__name__, str(err))
    return ("value", type(got).__name__, repr(got))


def test_every_parameter_gets_what_typers_own_check_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a value read as a path names nothing here
    compared = passed = 0
    for command in _commands():
        ctx = _click.Context(command)
        for param in command.params:
            descriptor = getattr(param, "type_descriptor", None)
            if descriptor is None or descriptor.file_annotation is not None:
                continue  # a file parameter opens what it is given: typer's check always does it
            repeatable = param.multiple or param.nargs != 1
            values: list[Any] = [None, param.default] if not callable(param.default) else [None]
            values += [(), tuple(TYPED[:3]), ("abc",)] if repeatable else TYPED
            for value in values:
                real = _outcome(build_runtime_param(descriptor), value, param, ctx)
                ours = _outcome(typer_values.Deferred(descriptor), value, param, ctx)
                where = f"{command.name} {param.name} = {value!r}"
                assert ours == real, where
                compared += 1
                if real[0] == "value":
                    deferred = typer_values.Deferred(descriptor)
                    deferred.coerce(value, param, ctx)
                    passed += not deferred.built
    assert compared > 1000, compared  # every command was loaded, not a handful
    assert passed > compared / 3, (passed, compared)  # and most values never needed typer's check


def test_install_is_in_place_and_idempotent() -> None:
    from typer.core import _TyperParameter

    assert typer_values.install() is True
    assert _TyperParameter.get_runtime_param.__module__ == typer_values.__name__


def _modules_after(argv: list[str], home: Path) -> tuple[list[str], str]:
    """The pydantic modules a fresh process imported to run ``gpufleet ARGV``, and its stderr."""
    code = (
        "import json, sys\n"
        "from gpufleet.cli.app import main\n"
        f"sys.argv = ['gpufleet', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core'))))\n"
    )
    env = {**os.environ, "GPUFLEET_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr[-500:]


WITHOUT_PYDANTIC = [["cost"], ["cost", "--limit", "5", "--team", "vision", "--json"], ["show", "12"]]


@pytest.mark.parametrize("argv", WITHOUT_PYDANTIC, ids=" ".join)
def test_commands_that_need_no_model_do_not_import_pydantic(argv: list[str], tmp_path: Path) -> None:
    """Their options are checked without typer's adapters, and `cost` reads the rate card it validated
    on its first run (gpufleet/cost/rates.py): nothing left for pydantic to do."""
    home = tmp_path / "home"
    home.mkdir()
    Store(home / "state.db").close()  # cards are kept in a home with a store, by a command that succeeded
    first, _ = _modules_after(["cost"], home)
    assert first, "the first `cost` validates the rate card: the check below would prove nothing"
    imported, stderr = _modules_after(argv, home)
    assert imported == [], f"`gpufleet {' '.join(argv)}` imported {imported[:3]} ({stderr})"
