"""The bounded YAML parser behind :func:`gpufleet.yamlio.parse_yaml`: a safe loader that counts values and depth.

Apart from :mod:`gpufleet.yamlio` so that importing that module (as every spec and config reader does)
does not import PyYAML: a command that reads no YAML file, such as ``gpufleet jobs``, never loads it.
It imports nothing of gpufleet's (the error class to raise and the bounds are the caller's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import Node, ScalarNode
from yaml.resolver import Resolver

MAX_INT_DIGITS = 100
"""Longest integer literal, in characters (Python refuses to convert more than 4,300 digits)."""


class YamlLimitError(yaml.MarkedYAMLError):
    """A document over one of the bounds above; ``problem`` says which and what to do."""


def _too_much(problem: str, node_or_mark: Any) -> YamlLimitError:
    return YamlLimitError(problem=problem, problem_mark=getattr(node_or_mark, "start_mark", node_or_mark))


class _Bounds(Composer, SafeConstructor):
    """A safe composer and constructor that count values (aliases expanded) and depth while composing.

    Mixed into a parser below: libyaml's when PyYAML has it (3-4x faster on a large file), else
    PyYAML's own. Either way the composing is this Python code, so the bounds hold the same.
    """

    if TYPE_CHECKING:  # from the parser mixed in

        def peek_event(self) -> Any: ...
        def dispose(self) -> None: ...

    def _start_bounds(self, *, max_nodes: int, max_depth: int) -> None:
        self._max_nodes, self._max_depth = max_nodes, max_depth
        self._nodes = 0
        """Values composed so far, each alias counted as the size of the node it names."""
        self._depth = 0
        """Nesting level of the node being composed (the document's root is level 1)."""
        self._deepest = 0
        """Deepest level reached inside the node being composed, aliases expanded."""
        self._anchored: dict[int, tuple[int, int]] = {}
        """``id`` of each anchored node -> (values, levels) with aliases expanded, once it is complete."""

    def _count(self, size: int, event: Any) -> None:
        self._nodes += size
        if self._nodes > self._max_nodes:
            raise _too_much(
                f"the document expands to more than {self._max_nodes:,} values (anchors and aliases "
                "counted in full): write it out without nested aliases, or split it",
                event.start_mark,
            )

    def _reach(self, level: int, event: Any) -> None:
        if level > self._max_depth:
            raise _too_much(_deeper_than(self._max_depth), event.start_mark)
        self._deepest = max(self._deepest, level)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            node = super().compose_node(parent, index)  # the anchored node, or an undefined-alias error
            known = self._anchored.get(id(node))
            if known is None:
                raise _too_much(
                    f"alias *{event.anchor} refers to a node that contains it: write the value out "
                    "(recursive documents are not accepted)",
                    event.start_mark,
                )
            size, levels = known
            self._reach(self._depth + levels, event)
            self._count(size, event)
            return node
        self._reach(self._depth + 1, event)
        self._count(1, event)
        start, outer_deepest = self._nodes - 1, self._deepest
        self._depth += 1
        self._deepest = self._depth
        node = super().compose_node(parent, index)
        if event.anchor is not None:
            self._anchored[id(node)] = (self._nodes - start, self._deepest - self._depth + 1)
        self._depth -= 1
        self._deepest = max(outer_deepest, self._deepest)
        return node

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, OverflowError, TypeError) as err:  # e.g. `2026-13-45` as a date
            raise ConstructorError(
                None, None, f"cannot read the value {_clip(node)} ({err})", node.start_mark
            ) from None

    def construct_bounded_int(self, node: ScalarNode) -> int:
        text = self.construct_scalar(node)
        if len(text) > MAX_INT_DIGITS:
            raise _too_much(
                f"an integer of {len(text):,} characters (at most {MAX_INT_DIGITS}): "
                "write a shorter number, or quote it if it is text",
                node,
            )
        value: int = super().construct_yaml_int(node)
        return value


_Bounds.add_constructor("tag:yaml.org,2002:int", _Bounds.construct_bounded_int)  # type: ignore[type-var]


class _PyLoader(_Bounds, yaml.SafeLoader):
    """The bounds over PyYAML's pure-Python reader, scanner and parser."""

    def __init__(self, stream: str, *, max_nodes: int, max_depth: int) -> None:
        yaml.SafeLoader.__init__(self, stream)
        self._start_bounds(max_nodes=max_nodes, max_depth=max_depth)


_Loader: Callable[..., _Bounds] = _PyLoader
if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _CLoader(_Bounds, CParser, Resolver):
        """The bounds over libyaml's scanner and parser (its composer is replaced by :class:`_Bounds`)."""

        def __init__(self, stream: str, *, max_nodes: int, max_depth: int) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            Composer.__init__(self)
            self._start_bounds(max_nodes=max_nodes, max_depth=max_depth)

    _Loader = _CLoader


def _deeper_than(max_depth: int) -> str:
    return f"the document nests deeper than {max_depth} levels (aliases expanded): flatten it"


def _clip(node: Node) -> str:
    value = node.value if isinstance(node, ScalarNode) else node.tag
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_bounded(
    text: str,
    *,
    source: str,
    error: type[Exception],
    max_nodes: int,
    max_depth: int,
) -> Any:
    """Parse one YAML document within the bounds; a malformed or oversized one raises ``error`` with the line."""
    loader = _Loader(text, max_nodes=max_nodes, max_depth=max_depth)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(getattr(err, "problem", None) or str(err).splitlines()[0]).split())
        if problem == "exceeded maximum nesting depth":  # libyaml's own bound (1,000), met while it reads ahead
            problem = _deeper_than(max_depth)
        elif not isinstance(err, YamlLimitError):
            raise error(f"{source}: malformed YAML{where}: {problem}") from None
        raise error(f"{source}{where}: {problem}") from None
    except RecursionError:  # a safety net: the depth bound stops nesting long before this
        raise error(f"{source}: {_deeper_than(max_depth)}") from None
    finally:
        loader.dispose()


__all__ = ["YamlLimitError", "parse_bounded"]
