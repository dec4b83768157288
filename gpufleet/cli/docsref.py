"""The generated pages of the docs site: the JobSpec's fields, the commands, the HTTP API.

    python -m gpufleet.cli.docsref --write    # regenerate docs/reference/*.md
    python -m gpufleet.cli.docsref --check    # exit 1 naming each page that is stale

Each page is rendered from what it documents, so it cannot drift from it unnoticed: the JobSpec
reference from the pydantic models (a field's description is the docstring written under it), the
CLI reference by walking the command tree through Click's own API (``list_commands`` and
``get_command`` on a context, so a command loaded only when it runs is seen too), and the HTTP
reference from the committed ``docs/openapi.json``. The pages are committed, readable without a
build; ``tests/docs/test_docs_site.py`` fails when one is stale.

It lives in the CLI package because it walks the CLI: the top floor, the only one that may import it.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import sys
import textwrap
import types
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gpufleet.fmt import markdown_table
from gpufleet.spec import attribute_docstrings

REGENERATE = "python -m gpufleet.cli.docsref --write"
PAGES = ("jobspec.md", "cli.md", "http-api.md")
"""The generated pages, under ``docs/reference/``."""

_CODE = re.compile(r"(?::[a-z]+:)?(`+)(.+?)\1", re.DOTALL)
"""A code span as Markdown (`x`) or reStructuredText (``x``, :class:`x`) writes it."""
_SPECIAL = re.compile(r"([\\*_\[\]<>`])")
_LIST_ITEM = re.compile(r"^\s*([-*]\s|\d+\.\s)")
_INT64_MAX = 2**63 - 1
"""An upper bound this high is SQLite's integer limit, not one a person would reach: not shown."""
_CONSTRAINTS = (
    ("ge", "≥ {}"),
    ("gt", "> {}"),
    ("le", "≤ {}"),
    ("lt", "< {}"),
    ("min_length", "at least {} long"),
    ("max_length", "at most {} long"),
    ("multiple_of", "a multiple of {}"),
)


# --- Markdown -------------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """The anchor of a heading as Python-Markdown's ``toc`` (the site) and GitHub both make it, for plain text."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def code(text: str, *, cell: bool = False) -> str:
    """``text`` as a code span; in a table cell, a ``|`` makes it escaped plain text (GitHub splits cells first)."""
    if cell and "|" in text:
        return _SPECIAL.sub(r"\\\1", text).replace("|", r"\|")
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" or text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def inline(text: str, *, cell: bool = False) -> str:
    """Prose from a docstring or a help string as Markdown: its code spans kept, every other mark escaped.

    reStructuredText's ````x```` and ``:class:`~a.b.X``` become code spans (``X``); ``*``, ``_``, ``<``
    and brackets elsewhere are text, not emphasis, HTML or links; in a table cell ``|`` is escaped too.
    """
    out: list[str] = []
    last = 0
    for match in _CODE.finditer(text):
        out.append(_escaped(text[last : match.start()], cell))
        inner = match.group(2).strip()
        if match.group(0).startswith(":"):  # a Sphinx role: ~ shows the last name only
            inner = inner.rpartition(".")[2] if inner.startswith("~") else inner
        out.append(code(inner, cell=cell))
        last = match.end()
    out.append(_escaped(text[last:], cell))
    return "".join(out)


def _escaped(text: str, cell: bool) -> str:
    text = _SPECIAL.sub(r"\\\1", text)
    return text.replace("|", r"\|") if cell else text


def prose(text: str | None) -> list[str]:
    """A docstring or help text as Markdown paragraphs: wrapped lines joined, lists and Click's ``\\b`` kept."""
    lines: list[str] = []
    for paragraph in inspect.cleandoc(text or "").split("\n\n"):
        rows = [row for row in paragraph.split("\n") if row.strip()]
        if not rows:
            continue
        if rows[0].strip() == "\b":
            lines += ["```text", *rows[1:], "```", ""]
        elif any(_LIST_ITEM.match(row) for row in rows):
            lines += [*map(_list_row, rows), ""]
        else:
            lines += [inline(" ".join(row.strip() for row in rows)), ""]
    return lines


def _list_row(row: str) -> str:
    """A line of a list in a help text: its marker (``-``, ``1.``) kept as Markdown, its text escaped."""
    marker = _LIST_ITEM.match(row)
    cut = marker.end() if marker else 0
    return row[:cut] + inline(row[cut:])


def one_line(text: str | None) -> str:
    """A docstring's paragraphs on one line, for a table cell."""
    return " ".join(line.strip() for line in inspect.cleandoc(text or "").split("\n") if line.strip())


def number(value: float, *, grouped: bool = True) -> str:
    """A number never in e-notation (``1e-06`` is ``0.000001``); a bound's thousands separated, a value as typed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}" if grouped else str(int(value))
    sign = "-" if value < 0 else ""
    whole, _, frac = format(abs(Decimal(repr(value))), "f").partition(".")
    return f"{sign}{int(whole):,}.{frac}" if grouped else f"{sign}{whole}.{frac}"


def page(title: str, intro: list[str], body: list[str]) -> str:
    """A whole page: its title, the line that says it is generated, then ``intro`` and ``body``."""
    head = [
        f"# {title}",
        "",
        f"<!-- Generated by `{REGENERATE}`: edit the code it is read from, not this page. -->",
        "",
    ]
    text = "\n".join([*head, *intro, *body]).rstrip("\n") + "\n"
    return re.sub(r"\n{3,}", "\n\n", text)


# --- JobSpec ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    """One model of the spec and the paths it is written at (``resources``; ``placement.any_of[]``)."""

    model: type[BaseModel]
    paths: tuple[str, ...]

    @property
    def title(self) -> str:
        return self.paths[0] or self.model.__name__

    @property
    def anchor(self) -> str:
        return slug(self.title)


def attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """Each field's docstring, the string literal written right under it (PEP 257's attribute docstrings)."""
    docs: dict[str, str] = {}
    for cls in reversed([c for c in model.__mro__ if issubclass(c, BaseModel) and c is not BaseModel]):
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        docs.update(attribute_docstrings(tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []))
    return docs


@dataclass(frozen=True)
class _Value:
    """One value a ``Literal`` allows, as an alternative of its own: ``"ddp"`` in ``Literal["ddp", "fsdp"]``."""

    value: Any


def _alternatives(annotation: Any) -> list[Any]:
    """The members of a union (``X | None``), each Literal value its own member."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return [alt for arg in get_args(annotation) for alt in _alternatives(arg)]
    if origin is Literal:
        return [_Value(value) for value in get_args(annotation)]
    return [annotation]


def _models_in(annotation: Any) -> Iterator[tuple[type[BaseModel], str]]:
    """Every model an annotation holds, with the suffix its path takes (``[]`` for the items of a list)."""
    for alt in _alternatives(annotation):
        if isinstance(alt, type) and issubclass(alt, BaseModel):
            yield alt, ""
        elif get_origin(alt) is list:
            yield from ((model, suffix + "[]") for model, suffix in _models_in(get_args(alt)[0]))


def yaml_key(name: str, info: FieldInfo) -> str:
    """The key a user writes: the alias where a field has one (``async`` for ``async_save``)."""
    return info.alias or name


def sections(root: type[BaseModel]) -> list[Section]:
    """Every model under ``root``, depth first in field order, each once with every path it is written at."""
    paths: dict[type[BaseModel], list[str]] = {root: [""]}

    def visit(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            for nested, suffix in _models_in(info.annotation):
                path = f"{prefix}{yaml_key(name, info)}{suffix}"
                first = nested not in paths
                paths.setdefault(nested, []).append(path)
                if first:
                    visit(nested, path + ".")

    visit(root, "")
    return [Section(model, tuple(where)) for model, where in paths.items()]


def plain_type(annotation: Any) -> str:
    """A type as a YAML writer reads it: ``int``, ``list[str]``, ``dict[str, any]``, ``null``."""
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    origin = get_origin(annotation)
    if origin is not None:
        args = ", ".join(plain_type(arg) for arg in get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


def type_cell(annotation: Any, anchors: dict[type[BaseModel], str]) -> str:
    """A field's type: each alternative a code span (``"ddp"`` for a Literal), a model a link to its section."""
    shown = []
    for alt in _alternatives(annotation):
        if isinstance(alt, _Value):
            shown.append(code(json.dumps(alt.value.value if isinstance(alt.value, Enum) else alt.value), cell=True))
        elif isinstance(alt, type) and issubclass(alt, BaseModel):
            shown.append(f"[{alt.__name__}](#{anchors[alt]})")
        elif get_origin(alt) is list and isinstance(get_args(alt)[0], type) and issubclass(get_args(alt)[0], BaseModel):
            item = get_args(alt)[0]
            shown.append(f"list of [{item.__name__}](#{anchors[item]})")
        else:
            shown.append(code(plain_type(alt), cell=True))
    return r" \| ".join(shown)


def yaml_value(value: Any) -> str:
    """A default as YAML writes it, in a code span: ``true``, ``null``, ``"auto"``, ``1024``."""
    if value is None or isinstance(value, bool):
        return code(json.dumps(value))
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, int | float):
        return code(number(value, grouped=False))
    return code(json.dumps(value), cell=True)


def default_cell(info: FieldInfo) -> str:
    """What a field is when the spec leaves it out; a section's own defaults for a nested model."""
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        made = info.default_factory()  # type: ignore[call-arg]
        return "its fields' defaults" if isinstance(made, BaseModel) else yaml_value(made)
    return yaml_value(info.default)


def constraints_cell(info: FieldInfo) -> str:
    """The bounds pydantic checks on a field (``≥ 1``, ``≤ 1,024``, a pattern), from its metadata."""
    found = []
    for item in info.metadata:
        for attribute, shape in _CONSTRAINTS:
            value = getattr(item, attribute, None)
            if value is not None:
                found.append(shape.format(number(value)))
        pattern = getattr(item, "pattern", None)
        if pattern is not None:
            found.append("matches " + code(str(pattern), cell=True))
    return ", ".join(found)


def _model_doc(annotation: Any) -> str:
    """A nested block's description where its field has none: the first line of its model's docstring."""
    models = [model for model, _ in _models_in(annotation)]
    return inspect.cleandoc(models[0].__doc__ or "").split("\n\n")[0] if len(models) == 1 else ""


def field_rows(section: Section, anchors: dict[type[BaseModel], str]) -> tuple[list[list[str]], list[str]]:
    """The table rows of ``section``, and the dotted paths of its fields that have no description."""
    docs = attribute_docs(section.model)
    prefix = f"{section.paths[0]}." if section.paths[0] else ""
    rows, undocumented = [], []
    for name, info in section.model.model_fields.items():
        path = prefix + yaml_key(name, info)
        described = docs.get(name) or info.description or _model_doc(info.annotation)
        if not described:
            undocumented.append(path)
        type_text = type_cell(info.annotation, anchors)
        rows.append(
            [code(path), type_text, default_cell(info), constraints_cell(info), inline(one_line(described), cell=True)]
        )
    return rows, undocumented


def jobspec_page(root: type[BaseModel]) -> tuple[str, list[str]]:
    """The JobSpec reference, and the fields it could find no description for."""
    found = sections(root)
    anchors = {s.model: s.anchor for s in found}
    intro = [
        "Every field a JobSpec YAML file may hold, read from the model that validates it "
        f"({code('gpufleet.spec.JobSpec')}). An unknown field is an error, as are `inf` and `nan`; "
        "a spec is frozen once loaded. One section per block, in the order the fields are declared.",
        "",
        *(f"- [{code(s.title)}](#{s.anchor}): {inline(_model_doc(s.model))}" for s in found),
        "",
    ]
    body: list[str] = []
    missing: list[str] = []
    for section in found:
        rows, undocumented = field_rows(section, anchors)
        missing += undocumented
        where = ", ".join(code(p) for p in section.paths if p)
        body += [f"## {section.title}", ""]
        body += [f"{code(section.model.__name__)}, written at {where}.", ""] if where else []
        body += prose(section.model.__doc__)
        body += [*markdown_table(["Field", "Type", "Default", "Constraints", "Description"], rows), ""]
    return page("JobSpec reference", intro, body), missing


# --- CLI -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One command of the tree, read through Click's API."""

    path: str
    usage: str
    help: str
    panel: str | None
    params: tuple[tuple[str, str, str, str], ...]
    """(name, type, default, help) of each argument and option but ``--help``."""
    children: tuple[Command, ...]

    @property
    def summary(self) -> str:
        return self.help.split("\n\n", 1)[0]


def _panel(command: Any) -> str | None:
    """A command's ``rich_help_panel``: Typer leaves a placeholder object where none was given."""
    panel = getattr(command, "rich_help_panel", None)
    return panel if isinstance(panel, str) else None


def _param_name(param: Any) -> str:
    """An argument's name as the usage line shows it; an option's flags (``--x / --no-x`` for a pair)."""
    if getattr(param, "param_type_name", "") == "argument":
        return str(param.metavar or param.name)
    return ", ".join(param.opts) + (" / " + ", ".join(param.secondary_opts) if param.secondary_opts else "")


def _param_type(param: Any, ctx: Any) -> str:
    """``int``, ``path``, ``a | b`` for choices, ``flag`` for a flag; with the range it accepts, if any."""
    if getattr(param, "is_flag", False):
        return "flag"
    shown = param.display_type(ctx) if hasattr(param, "display_type") else param.type.name
    shown = shown.strip("<>").removesuffix(" range")
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    limits = [f"≥ {number(low)}"] if low is not None else []
    limits += [f"≤ {number(high)}"] if high is not None and high < _INT64_MAX else []
    text = r" \| ".join(code(alt) for alt in shown.split("|"))
    return text + (f" ({', '.join(limits)})" if limits else "")


def _param_default(param: Any, ctx: Any) -> str:
    """What ``--help`` shows as the default, and ``required`` for a parameter that must be given."""
    if param.required:
        return "required"
    if isinstance(param.show_default, str):
        return inline(param.show_default, cell=True)
    value = param.get_default(ctx, call=False)
    if not (param.show_default or ctx.show_default) or value is None or callable(value):
        return ""
    if getattr(param, "is_flag", False):
        if param.secondary_opts:
            return code((param.opts if value else param.secondary_opts)[0])
        return code(param.opts[0]) if value else ""
    if isinstance(value, list | tuple):
        return ", ".join(yaml_value(v) for v in value)
    return yaml_value(str(value) if isinstance(value, Path) else value)


def read_command(command: Any, ctx: Any) -> Command:
    """``command`` and everything under it; hidden commands and parameters are left out, as ``--help`` does."""
    params = tuple(
        (
            code(_param_name(p), cell=True),
            _param_type(p, ctx),
            _param_default(p, ctx),
            inline(one_line(p.help), cell=True),
        )
        for p in command.get_params(ctx)
        if not getattr(p, "hidden", False) and "--help" not in getattr(p, "opts", ())
    )
    children = []
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                children.append(read_command(sub, sub.context_class(sub, info_name=name, parent=ctx)))
    text = inspect.cleandoc(command.help or "")
    usage = " ".join(["Usage:", ctx.command_path, *command.collect_usage_pieces(ctx)])  # unwrapped, at any width
    return Command(ctx.command_path, usage, text, _panel(command), params, tuple(children))


def by_panel(commands: tuple[Command, ...]) -> dict[str, list[Command]]:
    """Commands grouped by help panel, panels in the order they first appear; unpanelled ones under ``Commands``."""
    panels: dict[str, list[Command]] = {}
    for command in commands:
        panels.setdefault(command.panel or "Commands", []).append(command)
    return panels


def _command_lines(command: Command) -> list[str]:
    lines = [f"### {command.path}", "", *prose(command.help), "```text", command.usage, "```", ""]
    if command.params:
        lines += markdown_table(["Argument or option", "Type", "Default", "Help"], [list(p) for p in command.params])
        lines.append("")
    if command.children:
        lines += [*_index(command.children), ""]
    for group in by_panel(command.children).values():
        for child in group:
            lines += _command_lines(child)
    return lines


def _index(commands: tuple[Command, ...] | list[Command]) -> list[str]:
    rows = [[f"[{code(c.path)}](#{slug(c.path)})", inline(c.summary, cell=True)] for c in commands]
    return markdown_table(["Command", "What it does"], rows)


def cli_page(root: Command) -> str:
    """The CLI reference: the top-level commands by help panel, each command with its usage and parameters."""
    intro = [
        f"Every command of {code(root.path)}, read from the commands themselves; "
        f"{code(root.path + ' COMMAND --help')} prints the same. Every command also takes {code('--help')}.",
        "",
        *prose(root.help),
    ]
    body: list[str] = []
    for panel, commands in by_panel(root.children).items():
        body += [f"## {panel}", "", *_index(commands), ""]
        for command in commands:
            body += _command_lines(command)
    return page("CLI reference", intro, body)


def read_cli(app: typer.Typer, name: str = "gpufleet") -> Command:
    """The command tree of ``app``, walked as Click resolves a command line (loading what is loaded lazily)."""
    command = typer.main.get_command(app)
    return read_command(command, command.context_class(command, info_name=name))


# --- HTTP API --------------------------------------------------------------------------------------------------


def http_page(document: dict[str, Any]) -> str:
    """Each operation of the OpenAPI document (path, method, summary, parameters), grouped by tag."""
    groups: dict[str, list[list[str]]] = {}
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            params = ", ".join(f"{code(p['name'])} ({p['in']})" for p in operation.get("parameters", []))
            row = [code(method.upper()), code(path), inline(operation.get("summary") or "", cell=True), params]
            groups.setdefault((operation.get("tags") or ["other"])[0], []).append(row)
    info = document.get("info", {})
    intro = [
        f"The JSON API of {code('gpufleet serve')}: {inline(info.get('summary') or '')} Version "
        f"{code(str(info.get('version', '')))}, from the committed [openapi.json](../openapi.json) "
        f"(the server also serves it at {code('GET /api/openapi.json')}; regenerate the file with "
        f"{code('gpufleet serve --openapi docs/openapi.json')}). An action (POST) needs the server's token.",
        "",
    ]
    body: list[str] = []
    for tag, rows in groups.items():
        body += [f"## {tag}", "", *markdown_table(["Method", "Path", "Summary", "Parameters"], rows), ""]
    return page("HTTP API", intro, body)


# --- the pages -------------------------------------------------------------------------------------------------


def render_pages(docs: Path) -> tuple[dict[str, str], list[str]]:
    """``{file name: text}`` of every generated page, and the JobSpec fields without a description."""
    from gpufleet.cli.app import app
    from gpufleet.spec import JobSpec

    jobspec, missing = jobspec_page(JobSpec)
    document = json.loads((docs / "openapi.json").read_text(encoding="utf-8"))
    pages = {"jobspec.md": jobspec, "cli.md": cli_page(read_cli(app)), "http-api.md": http_page(document)}
    return pages, missing


def stale_pages(docs: Path, pages: dict[str, str]) -> list[str]:
    """The pages whose committed text differs from ``pages`` (or that are missing)."""
    stale = []
    for name, text in pages.items():
        path = docs / "reference" / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(f"docs/reference/{name}")
    return stale


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> int:
    """Write the pages (``--write``) or check them (``--check``, exit 1 naming each stale page)."""
    parser = argparse.ArgumentParser(prog="python -m gpufleet.cli.docsref", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate docs/reference/*.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if a page differs from what the code gives")
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="the docs folder (default: docs)")
    args = parser.parse_args(argv)
    if not (args.docs / "openapi.json").is_file():
        parser.exit(2, f"error: {args.docs}/openapi.json not found: give the docs folder with --docs\n")
    pages, missing = render_pages(args.docs)
    if args.check:
        stale = stale_pages(args.docs, pages)
        for name in stale:
            out(f"{name} is stale: run `{REGENERATE}`")
        return 1 if stale else 0
    (args.docs / "reference").mkdir(exist_ok=True)
    for name, text in pages.items():
        (args.docs / "reference" / name).write_text(text, encoding="utf-8")
        out(f"wrote {args.docs}/reference/{name}")
    out(f"{len(missing)} JobSpec fields have no description: {', '.join(missing) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
