"""Typer's check of a parameter's value, built only for a value that needs it.

Typer (0.29) checks each parameter's value with a pydantic ``TypeAdapter``, built the first time the
parameter is processed, given or not. So every command with an option imported pydantic, about 0.1 s
on the 2-core machine, a third of what `gpufleet jobs` or `gpufleet cost` take, even when nothing
was given to check.

Here each parameter gets a :class:`Deferred` check instead, which passes what typer's check would
pass unchanged, without building it:

- a parameter not given (``None``): ``None``, or ``()`` for a repeatable one, as typer returns;
- a value already of the parameter's type (a default such as ``limit: int = 20``), inside its
  ``min``/``max``;
- a plain decimal integer typed for an ``int`` parameter, inside its range (``gpufleet show 12``),
  and any text typed for a ``str`` parameter.

Every other value (a number out of range, a path, a choice, a list...) goes through typer's own
check, built then, so its errors and conversions are typer's. ``tests/cli/test_typer_values.py``
runs the same command lines with and without this and compares what they print; it also checks
that the read-only commands no longer import pydantic, which fails when a typer release changes
the internals this relies on (``install()`` leaves typer as it is when they are not there).
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

_INSTALLED = False


def _simple(annotation: Any) -> Any:
    """The type a value must have to pass unchecked (``int``, ``float``, ``str`` or an Enum), from ``T`` or
    ``T | None``; None for any other annotation."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            return None
        annotation = args[0]
    if annotation in (int, float, str) or (isinstance(annotation, type) and issubclass(annotation, enum.Enum)):
        return annotation
    return None


_MOST_DIGITS = 40
"""Longer numbers go to typer's check (Python refuses to read one of more than 4,300 digits)."""


def _plain_int(text: str) -> int | None:
    """``int(text)`` for at most 40 ASCII digits with an optional sign; None for anything else (typer decides)."""
    digits = text[1:] if text[:1] in "+-" else text
    if digits and len(digits) <= _MOST_DIGITS and digits.isascii() and digits.isdigit():
        return int(text)
    return None


class Deferred:
    """A parameter's value check that builds typer's own only for a value that needs it."""

    __slots__ = ("_real", "descriptor")

    def __init__(self, descriptor: Any) -> None:
        self.descriptor = descriptor
        self._real: Any = None

    @property
    def built(self) -> bool:
        """Whether typer's own check was needed (and built)."""
        return self._real is not None

    def _passes(self, value: Any) -> tuple[bool, Any]:
        info = self.descriptor.parameter_info
        if getattr(info, "parser", None) is not None or getattr(info, "click_type", None) is not None:
            return False, None
        if self.descriptor.file_annotation is not None:
            return False, None
        kind = _simple(self.descriptor.annotation)
        if kind is None:
            return False, None
        if type(value) is kind:
            checked = value
        elif kind is int and type(value) is str:
            parsed = _plain_int(value)
            if parsed is None:
                return False, None
            checked = parsed
        else:
            return False, None
        if kind in (int, float):
            low, high = getattr(info, "min", None), getattr(info, "max", None)
            if getattr(info, "clamp", False) and (low is not None or high is not None):
                return False, None
            if (low is not None and checked < low) or (high is not None and checked > high):
                return False, None  # out of range: typer's check words the error
        return True, checked

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:
            return () if param.multiple or param.nargs == -1 else None
        if not (param.multiple or param.nargs != 1):
            ok, checked = self._passes(value)
            if ok:
                return checked
        if self._real is None:
            from typer._coercion import build_runtime_param

            self._real = build_runtime_param(self.descriptor)
        return self._real.coerce(value, param=param, ctx=ctx)


def install() -> bool:
    """Give typer's parameters a :class:`Deferred` check; False (typer left as it is) when its internals
    are not the ones this was written against."""
    global _INSTALLED
    if _INSTALLED:
        return True
    try:
        from typer import _coercion, core
    except ImportError:
        return False
    cls = getattr(core, "_TyperParameter", None)
    if cls is None or not hasattr(cls, "get_runtime_param") or not hasattr(_coercion, "build_runtime_param"):
        return False

    def get_runtime_param(self: Any) -> Any:
        if getattr(self, "_runtime_param", None) is None:
            self._runtime_param = Deferred(self.type_descriptor)
        return self._runtime_param

    cls.get_runtime_param = get_runtime_param
    _INSTALLED = True
    return True
