"""Sizes as people type them (``256MiB``, ``1GiB``, ``512M``, ``2e9``, ``2GB``) and as reports show them.

``K`` ... ``T``, ``Ki`` ... ``Ti`` and ``KiB`` ... ``TiB`` are powers of 1024, as fio and dd read them;
``KB`` ... ``TB`` are powers of 1000, as disk vendors and nccl-tests write them. A plain number is
bytes, also in scientific notation (``2e9``), and a fraction of a byte is dropped (``1.5K`` is 1536,
``0.1K`` is 102).
"""

from __future__ import annotations

import re

from gpufleet.errors import UsageError

MAX_SIZE = 1 << 50
"""Largest size accepted (1 PiB): far above any test file, well within an ``int`` fio parses."""

_SIZE_RE = re.compile(
    r"([+-]?)([0-9]{1,30}(?:\.[0-9]{1,9})?)(?:e([+-]?[0-9]{1,4}))?\s*([kmgt]?)(i?)(b?)", re.IGNORECASE
)
_BINARY = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SIZE_HINT = "give bytes or a number with a unit: 256MiB, 1GiB, 512M, 2GB, 2e9"


def parse_size(text: str, what: str = "size") -> int:
    """``text`` as a whole number of bytes > 0; ``UsageError`` naming ``what`` (a flag) and the value otherwise."""
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"{what} {_shown(text)} is not a size: {_SIZE_HINT}")
    sign, number, exponent, prefix, binary, byte = match.groups()
    if binary and not prefix:
        raise UsageError(f"{what} {_shown(text)} is not a size: {_SIZE_HINT}")
    decimal = bool(byte) and not binary and prefix != ""
    unit = (_DECIMAL if decimal else _BINARY)[prefix.lower()]
    numerator, _, fraction = number.partition(".")
    power = int(exponent or 0) - len(fraction)
    if power > 60:
        raise UsageError(f"{what} {_shown(text)} is out of range: give at most {format_bytes(MAX_SIZE)}")
    digits = int(numerator + fraction) * unit
    scaled: int = digits * 10**power if power >= 0 else digits // 10**-power
    if sign == "-" or scaled <= 0:
        raise UsageError(f"{what} {_shown(text)} must be at least 1 byte: {_SIZE_HINT}")
    if scaled > MAX_SIZE:
        raise UsageError(f"{what} {_shown(text)} is out of range: give at most {format_bytes(MAX_SIZE)}")
    return scaled


def format_bytes(count: float) -> str:
    """``count`` bytes in the largest binary unit that keeps it at least 1: ``256 MiB``, ``1.5 GiB``."""
    if abs(count) < 1024:
        return f"{int(count)} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.4g} {unit}"
    return f"{value:.4g} TiB"  # not reached: the loop returns at TiB


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text):,} characters)"


__all__ = ["MAX_SIZE", "format_bytes", "parse_size"]
