"""Slurm hostlists (``gpu[01-04,07],cpu1``): our thin layer over the ClusterShell library.

ClusterShell (module ``ClusterShell.NodeSet``, LGPL-2.1-or-later) expands bracket groups and folds
names back into them. Its syntax is wider than Slurm's (``@group`` node groups resolved from
``groups.conf``, ``!``/``&``/``^`` set operators, ``*`` wildcards, ``/step`` ranges, negative
numbers) and a ``NodeSet`` sorts and deduplicates, so this module checks the Slurm syntax itself
and hands ClusterShell only what Slurm accepts, one piece at a time:

* the hostlist is split at top-level commas (outside brackets), empty pieces are skipped;
* brackets must balance and not nest; inside them, comma-separated ``N`` or ``N-M`` ranges
  (digits, low to high); outside them, name characters only (anything else is reported as an
  invalid name, so ``@group`` syntax is refused, never resolved);
* the number of names is counted from the ranges before anything is expanded (at most
  :data:`MAX_NAMES`), so a hostlist cannot exhaust memory;
* each range is rewritten to the width of its first number, as Slurm pads (``[1-02]`` is
  ``1 2``, ``[08-100]`` is ``08..99 100``), and a piece is cut where ClusterShell's sorting or
  deduplication would change what was written; the cut pieces are expanded by ClusterShell in
  the order written, so duplicates stay (the fleet check reports a node listed twice) and
  ``[7,1]`` gives ``7 1``.

ClusterShell never resolves groups here (``RESOLVER_NOGROUP``) and folds along every axis whatever
``defaults.conf`` says (its ``fold_axis`` setting). Every name must also be a valid Slurm name
(these names end up in ``topology.conf``). A refused hostlist becomes a ``ValueError`` whose
one-line message names the hostlist, the reason and the fix. ``ValueError`` rather than
``UsageError`` because the fleet file's pydantic validators turn it into a field error
(``switches.0.nodes: malformed hostlist ...``); callers outside a model wrap it themselves.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable

from gpufleet.extras import required

with required("ClusterShell", "slurm", "reading Slurm hostlists"):
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException
    from ClusterShell.RangeSet import RangeSetException

SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SLURM_NAME_HINT = "use 1-64 characters: letters, digits, '.', '_' or '-', starting with a letter or digit"
MAX_NAMES = 100000
"""The most names one hostlist may expand to (all pieces together)."""
HOSTLIST_HINT = (
    "write comma-separated names such as 'gpu[01-04,07],cpu1' or 'gpu[1-2]-ib[0-1]': inside each pair of "
    f"brackets, N or N-M ranges (digits, low to high, at most {MAX_NAMES} names in all) and no nested brackets"
)

_RANGE_RE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")
_NAME_CHARS_RE = re.compile(r"^[A-Za-z0-9._-]*$")
_MAX_DIGITS = 64  # a longer number cannot be part of a valid name (and int() of it could be slow)
# Fold along every axis: a name of at most 64 characters has at most 32 numbers. Passed explicitly
# because NodeSet's default (None) takes ClusterShell's defaults.conf ``fold_axis`` setting.
_ALL_AXES = tuple(range(64))

# A piece of a hostlist: the text around the bracket groups (one more than groups) and, for each
# group, its ranges as (low, high, width), width being that of the low number as written.
_Range = tuple[int, int, int]


class _Refused(Exception):
    """A reason to refuse a hostlist (becomes the ValueError's middle part)."""


class _BadName(_Refused):
    """A name that is not a Slurm name (its message carries its own fix)."""


def _split_top_level(expr: str) -> list[str]:
    """Split at commas outside brackets; check that brackets balance and do not nest."""
    pieces: list[str] = []
    depth = 0
    start = 0
    for i, char in enumerate(expr):
        if char == "[":
            if depth:
                raise _Refused("nested brackets")
            depth = 1
        elif char == "]":
            if not depth:
                raise _Refused("unbalanced brackets")
            depth = 0
        elif char == "," and not depth:
            pieces.append(expr[start:i])
            start = i + 1
    if depth:
        raise _Refused("unbalanced brackets")
    pieces.append(expr[start:])
    return [piece.strip() for piece in pieces if piece.strip()]


def _parse_ranges(body: str) -> list[_Range]:
    ranges: list[_Range] = []
    for item in body.split(","):
        match = _RANGE_RE.match(item)
        if not match:
            raise _Refused(f"bad range {item!r}")
        low_text, high_text = match.group(1), match.group(2) or match.group(1)
        if len(low_text) > _MAX_DIGITS or len(high_text) > _MAX_DIGITS:
            raise _Refused(f"bad range {item!r}: number too long")
        low, high = int(low_text), int(high_text)
        if low > high:
            raise _Refused(f"start > stop in {item!r}")
        if high - low + 1 > MAX_NAMES:
            raise _Refused(f"range too large: {item!r} holds more than {MAX_NAMES} names")
        ranges.append((low, high, len(low_text)))
    return ranges


def _parse_piece(piece: str) -> tuple[list[str], list[list[_Range]]]:
    """``gpu[1-2]-ib[0-1]`` -> (['gpu', '-ib', ''], [[(1, 2, 1)], [(0, 1, 1)]])."""
    if "[" not in piece:  # a plain name: checked as a name after expansion
        return [piece], []
    parts = re.split(r"\[([^\]]*)\]", piece)  # brackets are balanced and flat here
    texts, groups = parts[0::2], [_parse_ranges(body) for body in parts[1::2]]
    if not all(_NAME_CHARS_RE.match(text) for text in texts):
        # Not Slurm name characters (spaces, '@group', '!', '&', '*', '/', ...): report the first
        # name the piece would give, before ClusterShell can read any of it as its own syntax.
        first = texts[0] + "".join(f"{g[0][0]:0{g[0][2]}d}{t}" for g, t in zip(groups, texts[1:], strict=True))
        raise _BadName(f"{first!r} is not a valid name: {SLURM_NAME_HINT}")
    return texts, groups


def _padded(range_: _Range) -> list[tuple[str, str]]:
    """One range as (first, last) texts of one padding each, low to high, as ClusterShell reads them."""
    low, high, width = range_
    if width > 1 and len(str(high)) > width:  # [08-100]: 08..99 padded, then 100.. as they come
        return [(f"{low:0{width}d}", str(10**width - 1)), (str(10**width), str(high))]
    return [(f"{low:0{width}d}", f"{high:0{width}d}")]


def _chunks(group: list[_Range]) -> list[str]:
    """A bracket group's ranges as ClusterShell range lists, in the order written.

    A ``NodeSet`` sorts (shorter numbers first, then by value) and deduplicates, so consecutive
    ranges share one list only while each starts after the previous one ends in that order.
    """
    chunks: list[list[tuple[str, str]]] = []
    for first, last in (texts for range_ in group for texts in _padded(range_)):
        if chunks and (len(chunks[-1][-1][1]), chunks[-1][-1][1]) < (len(first), first):
            chunks[-1].append((first, last))
        else:
            chunks.append([(first, last)])
    return [",".join(f"{first}-{last}" for first, last in chunk) for chunk in chunks]


def _expand_piece(texts: list[str], groups: list[list[_Range]]) -> list[str]:
    if not groups:
        return [texts[0]]
    names: list[str] = []
    for combo in itertools.product(*(_chunks(group) for group in groups)):
        pattern = texts[0] + "".join(f"[{r}]{t}" for r, t in zip(combo, texts[1:], strict=True))
        names.extend(str(name) for name in NodeSet(pattern, resolver=RESOLVER_NOGROUP, fold_axis=_ALL_AXES))
    return names


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression into names, in the order written.

    ``"gpu[01-04,07],cpu1"`` gives ``gpu01 gpu02 gpu03 gpu04 gpu07 cpu1``. A range is zero-padded
    to the width of its first number, as Slurm does (``[08-10]`` gives ``08 09 10``, ``[8-10]``
    gives ``8 9 10``). A name may hold several bracket groups (``gpu[1-2]-ib[0-1]`` gives
    ``gpu1-ib0 gpu1-ib1 gpu2-ib0 gpu2-ib1``). Spaces around names and empty names (``a,,b``) are
    dropped; duplicates are kept. At most :data:`MAX_NAMES` names. Raises ``ValueError`` naming
    the problem and the fix.
    """
    try:
        pieces = [_parse_piece(piece) for piece in _split_top_level(expr)]
        total = sum(
            math.prod(sum(high - low + 1 for low, high, _ in group) for group in groups) for _, groups in pieces
        )
        if total > MAX_NAMES:
            raise _Refused(f"results too large: {total} names, more than {MAX_NAMES}")
        names = [name for texts, groups in pieces for name in _expand_piece(texts, groups)]
    except _BadName as err:
        raise ValueError(f"malformed hostlist {expr!r}: {err}") from None
    except _Refused as err:
        raise ValueError(f"malformed hostlist {expr!r}: {err}; {HOSTLIST_HINT}") from None
    except (NodeSetException, RangeSetException) as err:  # not expected after our checks
        reason = " ".join(str(err).split())
        raise ValueError(f"malformed hostlist {expr!r}: {reason}; {HOSTLIST_HINT}") from None
    for name in names:
        if not SLURM_NAME_RE.match(name):
            raise ValueError(f"malformed hostlist {expr!r}: {name!r} is not a valid name: {SLURM_NAME_HINT}")
    return names


def compress_hostlist(names: Iterable[str]) -> str:
    """A short Slurm hostlist for a set of names (sorted, duplicates dropped).

    ``gpu01..gpu16`` gives ``gpu[01-16]``; names that differ in several numbers get several bracket
    groups (``rack[1-2]-gpu[1-2]``); names of different zero-padding stay apart (``n[1-2,01-02]``).
    ``expand_hostlist`` of the result gives the names back. Raises ``ValueError`` for a name Slurm
    would not accept.
    """
    names = list(names)
    for name in names:
        if not SLURM_NAME_RE.match(name):
            raise ValueError(f"cannot compress {name!r}: not a valid name: {SLURM_NAME_HINT}")
    nodeset = NodeSet(resolver=RESOLVER_NOGROUP, fold_axis=_ALL_AXES)
    nodeset.updaten(names)
    return str(nodeset)


__all__ = ["HOSTLIST_HINT", "MAX_NAMES", "SLURM_NAME_HINT", "SLURM_NAME_RE", "compress_hostlist", "expand_hostlist"]
