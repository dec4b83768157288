"""Reading user-written YAML (job specs, fleet files, rate cards) into validated models.

Everything here is untrusted input: ``yaml.safe_load`` only, and every failure becomes one line
naming the file, the field and what to do, raised as the caller's ``GpufleetError`` subclass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpufleet.errors import GpufleetError

M = TypeVar("M", bound=BaseModel)


def describe_validation(err: ValidationError, source: str, reference: str) -> str:
    """The first validation error as ``source: field.path: message (and N more)``."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = f"unknown field (check its spelling against {reference})"
    elif first["type"] == "missing":
        msg = "required field is missing"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{source}: {where}: {msg}{more}"


def validate(model: type[M], data: Any, *, source: str, what: str, reference: str, error: type[GpufleetError]) -> M:
    """Validate a mapping as ``model``; raise ``error`` naming the first bad field."""
    if not isinstance(data, dict):
        raise error(f"{source}: {what} must be a YAML mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise error(describe_validation(err, source, reference)) from None


def read_yaml(path: Path, *, what: str, error: type[GpufleetError]) -> Any:
    """Parse a YAML file safely; unreadable or malformed files raise ``error`` with the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"cannot read {what} {str(path)!r}: {err.__class__.__name__}: {err}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise error(f"{path}: malformed YAML{where}: {problem}") from None


__all__ = ["M", "describe_validation", "read_yaml", "validate"]
