"""Reading user-written YAML (job specs, fleet files, rate cards) into validated models.

Everything here is untrusted input: a safe loader only, and every failure becomes one line
naming the file, the field and what to do, raised as the caller's ``GpufleetError`` subclass.

The loader also bounds what a document may cost before any of it reaches a model: the file's
size (:data:`MAX_BYTES`; only regular files are read, and never more than the limit), how deep it
nests (:data:`MAX_DEPTH`, checked while composing, so 20,000 nested ``[`` fail at level 65
instead of in a ``RecursionError``), how many values it holds once every alias is expanded
(:data:`MAX_NODES`: a billion-laughs document of nested anchors fails while it is read, not when
a model or an export walks its billion values), and how long an integer may be written
(:data:`gpufleet.yamlload.MAX_INT_DIGITS`, well under Python's limit on converting digits to an ``int``).
"""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar, get_args

from gpufleet.errors import GpufleetError
from gpufleet.fmt import shown_path

if TYPE_CHECKING:  # pydantic is imported by the functions that validate: reading a file needs none of it
    from pydantic import BaseModel, ValidationError
    from pydantic_core import ErrorDetails

M = TypeVar("M", bound="BaseModel")

MAX_BYTES = 1 << 20
"""Largest YAML file read (1 MiB; the biggest example shipped, ``examples/catalog.yaml``, is 3.4 KB)."""
MAX_NODES = 200_000
"""Most values (scalars, lists, mappings) a document may hold with every alias expanded.

Above what a realistic file under :data:`MAX_BYTES` holds (1 MiB of dense batch file, ~9,500 jobs,
is ~160,000 values; ``examples/catalog.yaml`` has 184), so in practice only alias amplification, or
a flat list of hundreds of thousands of tiny values, meets it."""
MAX_DEPTH = 64
"""Deepest nesting of lists and mappings."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def parse_yaml(
    text: str,
    *,
    source: str,
    error: type[GpufleetError],
    max_nodes: int = MAX_NODES,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """Parse one YAML document within the bounds; a malformed or oversized one raises ``error`` with the line.

    The parser (PyYAML, bounded: :mod:`gpufleet.yamlload`) is imported here, on the first file read, so
    the commands that read none do not pay its import.
    """
    from gpufleet.yamlload import parse_bounded

    return parse_bounded(text, source=source, error=error, max_nodes=max_nodes, max_depth=max_depth)


def _os_problem(err: OSError | ValueError) -> str:
    """What went wrong, without the path again (``str(err)`` repeats it: twice as long for a long one)."""
    reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return f"{err.__class__.__name__}: {_one_line(reason)}"


def open_regular(
    path: Path, *, what: str, error: type[GpufleetError], max_bytes: int, expect: str = "a YAML file"
) -> BinaryIO:
    """``path`` opened for binary reading, refused (``error``) unless it is a regular file of at most ``max_bytes``.

    A device (``/dev/zero`` never ends), a pipe (it may never answer) or a folder is refused before
    anything is read, as is a name the system cannot open (too long, a NUL byte in it).
    """
    shown = shown_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError) as err:
        raise error(f"cannot read {what} {shown}: {_os_problem(err)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "folder" if stat.S_ISDIR(info.st_mode) else "device, pipe or socket"
            raise error(f"cannot read {what} {shown}: it is a {kind}, not a regular file: give the path of {expect}")
        if info.st_size > max_bytes:
            raise error(_too_large(what, shown, max_bytes, expect))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _too_large(what: str, shown: str, max_bytes: int, expect: str) -> str:
    return (
        f"cannot read {what} {shown}: it is larger than {max_bytes:,} bytes, the limit for {expect}: trim or split it"
    )


def read_bytes_bounded(
    path: Path, *, what: str, error: type[GpufleetError], max_bytes: int = MAX_BYTES, expect: str = "a YAML file"
) -> bytes:
    """A regular file's bytes, refused (``error``) when it is anything else or over ``max_bytes``."""
    with open_regular(path, what=what, error=error, max_bytes=max_bytes, expect=expect) as fh:
        try:
            data = fh.read(max_bytes + 1)  # one byte over the limit is enough to know the file grew past it
        except OSError as err:
            raise error(f"cannot read {what} {shown_path(path)}: {_os_problem(err)}") from None
    if len(data) > max_bytes:
        raise error(_too_large(what, shown_path(path), max_bytes, expect))
    return data


def read_text_bounded(
    path: Path, *, what: str, error: type[GpufleetError], max_bytes: int = MAX_BYTES, expect: str = "a YAML file"
) -> str:
    """A regular file's UTF-8 text, refused (``error``) when it is anything else or over ``max_bytes``."""
    data = read_bytes_bounded(path, what=what, error=error, max_bytes=max_bytes, expect=expect)
    return utf8_text(data, path, what=what, error=error)


def utf8_text(data: bytes, path: Path | str, *, what: str, error: type[GpufleetError]) -> str:
    """``data`` read from ``path`` as UTF-8 text; ``error`` when it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"cannot read {what} {shown_path(path)}: not UTF-8 text ({_one_line(str(err))})") from None


def _loc_part(part: Any) -> str:
    text = str(part)
    if isinstance(part, str) and (not text.isprintable() or len(text) > 64):
        text = repr(text) if len(text) <= 64 else repr(text[:60]) + "..."
    return text


def describe_validation(err: ValidationError, source: str, reference: str, model: type[BaseModel] | None = None) -> str:
    """The first validation error as ``source: field.path: message (and N more)``, on one line.

    A misspelt field comes first, with the name it is closest to: ``entrypiont: unknown field (did you
    mean 'entrypoint'? ...)`` says what to fix where ``entrypoint: required field is missing`` would not.
    The names it may be close to are the fields ``model`` has at that place and those reported missing.
    """
    errors = err.errors()
    guesses = [(e, _near_field(e, errors, model)) for e in errors if e["type"] == "extra_forbidden"]
    first, guess = next(((e, g) for e, g in guesses if g is not None), (errors[0], None))
    where = ".".join(_loc_part(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    if guess is not None:
        msg = f"unknown field (did you mean {guess!r}? see {reference})"
    elif first["type"] == "extra_forbidden":
        msg = f"unknown field (check its spelling against {reference})"
    elif first["type"] == "missing":
        msg = "required field is missing"
    elif first["type"] == "finite_number":
        msg = "must be a finite number, not inf or nan"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {where}: {_one_line(msg)}{more}"


def _near_field(error: ErrorDetails, errors: list[ErrorDetails], model: type[BaseModel] | None) -> str | None:
    """The field name an unknown field's name is closest to (difflib), among those allowed at its place."""
    if not error["loc"] or not isinstance(error["loc"][-1], str):
        return None
    parent = error["loc"][:-1]
    names = {str(e["loc"][-1]) for e in errors if e["type"] == "missing" and e["loc"] and e["loc"][:-1] == parent}
    names.update(_fields_at(model, parent) if model is not None else ())
    close = difflib.get_close_matches(error["loc"][-1], sorted(names), n=1)
    return close[0] if close else None


def _fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> set[str]:
    """The field names of the models found at ``loc`` under ``model`` (through lists, optionals and unions)."""
    models = [model]
    for part in loc:
        inner = [m for m in models if isinstance(part, str) and part in m.model_fields]
        if inner:  # a list index or a union member's tag is not a field: stay on the models found so far
            models = [found for m in inner for found in _models_in(m.model_fields[str(part)].annotation)]
    fields = [(name, info.alias) for m in models for name, info in m.model_fields.items()]
    return {name for pair in fields for name in pair if name}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def validate(model: type[M], data: Any, *, source: str, what: str, reference: str, error: type[GpufleetError]) -> M:
    """Validate a mapping as ``model``; raise ``error`` naming the first bad field."""
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise error(f"{source}: {what} must be a YAML mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise error(describe_validation(err, source, reference, model)) from None


def read_yaml(path: Path, *, what: str, error: type[GpufleetError]) -> Any:
    """Parse a YAML file safely and within the bounds; unreadable, oversized or malformed files raise ``error``."""
    return parse_yaml(read_text_bounded(path, what=what, error=error), source=str(path), error=error)


__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "M",
    "describe_validation",
    "open_regular",
    "parse_yaml",
    "read_bytes_bounded",
    "read_text_bounded",
    "read_yaml",
    "utf8_text",
    "validate",
]
