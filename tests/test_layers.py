"""The layer order docs/architecture.md's "Layout" states, kept by walking every import of the package.

The Layout block numbers each top-level part of ``gpufleet`` with a floor (``3  gpufleet/jobs/``); a part
may import only parts on lower floors. Every import counts, including those inside functions (they
run too, only later); imports under ``if TYPE_CHECKING:`` are left out (they never run). A failure
names the file, the line and the import that breaks the order, so the fix is where the message points.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpufleet"
LAYOUT = ROOT / "docs" / "architecture.md"
FLOOR_LINE = re.compile(r"^\s*(\d+)\s+gpufleet/([A-Za-z_][\w]*)(?:\.py|/)")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted
    path: Path
    line: int

    def where(self) -> str:
        shown = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{shown}:{self.line} imports {self.target}"


def stated_floors(text: str) -> dict[str, int]:
    """``{part: floor}`` from the Layout block of docs/architecture.md (``N  gpufleet/part/  what lives there``)."""
    _, _, after = text.partition("\n## Layout\n")
    assert after, "docs/architecture.md has no '## Layout' section to read the layer order from"
    block = after.split("```", 2)[1]
    floors: dict[str, int] = {}
    for line in block.splitlines():
        match = FLOOR_LINE.match(line)
        if match:
            part = match.group(2)
            assert part not in floors, f"the Layout (docs/architecture.md) lists gpufleet/{part} twice"
            floors[part] = int(match.group(1))
    assert floors, "the Layout (docs/architecture.md) states no floors ('N  gpufleet/part/  ...')"
    return floors


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def imports(path: Path, module: str | None = None) -> Iterator[Import]:
    """Every ``gpufleet`` import in ``path`` (the module ``module``) that runs, at module scope or in a function."""
    module = module or module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skipped = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path.name == "__init__.py", node)
            # ``from gpufleet.x import y``: y is a submodule (then it is what is imported) or a name of x.
            targets = [f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "gpufleet" or target.startswith("gpufleet."):
                yield Import(module, target, path, node.lineno)


def part_of(dotted: str) -> str:
    """The top-level part of a module: ``gpufleet.jobs.store`` -> ``jobs``; the package itself -> ``__init__``."""
    pieces = dotted.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


@functools.cache
def all_imports() -> tuple[Import, ...]:
    return tuple(imp for path in sorted(PACKAGE.rglob("*.py")) for imp in imports(path))


def parts_on_disk() -> set[str]:
    parts = {p.stem for p in PACKAGE.glob("*.py")} | {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    return parts


def test_every_part_has_a_floor() -> None:
    floors = stated_floors(LAYOUT.read_text(encoding="utf-8"))
    missing = sorted(parts_on_disk() - set(floors))
    stale = sorted(set(floors) - parts_on_disk())
    assert not missing, (
        f"the Layout gives no floor to: {', '.join(missing)} (add 'N  gpufleet/<part>  ...' to its block)"
    )
    assert not stale, f"the Layout (docs/architecture.md) names parts that do not exist: {', '.join(stale)}"


def test_imports_go_down_the_floors() -> None:
    floors = stated_floors(LAYOUT.read_text(encoding="utf-8"))
    bad = []
    for imp in all_imports():
        src, dst = part_of(imp.source), part_of(imp.target)
        if src == dst or src not in floors or dst not in floors:
            continue
        if floors[dst] >= floors[src]:
            bad.append(
                f"{imp.where()}: {src} (floor {floors[src]}) may import only lower floors, "
                f"{dst} is on floor {floors[dst]}"
            )
    assert not bad, "imports against the Layout's order (docs/architecture.md):\n" + "\n".join(bad)


def test_each_folder_says_its_floor() -> None:
    """Each folder's ``__init__`` docstring states the floor the Layout gives it, so a reader of the code sees it."""
    floors = stated_floors(LAYOUT.read_text(encoding="utf-8"))
    wrong = []
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        part = init.parent.name
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        said = re.search(r"Floor (\d+) of the layers", doc)
        if said is None or part not in floors or int(said.group(1)) != floors[part]:
            wrong.append(
                f"gpufleet/{part}/__init__.py: says {said.group(0) if said else 'no floor'}, Layout: {floors.get(part)}"
            )
    assert not wrong, "folder docstrings disagree with the Layout (docs/architecture.md):\n" + "\n".join(wrong)


def test_no_cycle_between_parts() -> None:
    """Independent of the stated floors: no two top-level parts reach each other."""
    graph: dict[str, set[str]] = defaultdict(set)
    example: dict[tuple[str, str], Import] = {}
    for imp in all_imports():
        src, dst = part_of(imp.source), part_of(imp.target)
        if src != dst:
            graph[src].add(dst)
            example.setdefault((src, dst), imp)
    cycle = _find_cycle(graph)
    if cycle:
        steps = [example[(a, b)].where() for a, b in itertools.pairwise(cycle)]
        pytest.fail("parts import each other in a cycle " + " -> ".join(cycle) + ":\n" + "\n".join(steps))


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_walk_sees_function_level_imports_and_skips_type_checking(tmp_path: Path) -> None:
    """The walker itself: an import inside a function counts, one under TYPE_CHECKING does not."""
    sample = tmp_path / "probe.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from gpufleet.cli import app\n"
        "def f():\n"
        "    from gpufleet.backends import base\n"
        "    from . import store\n",
        encoding="utf-8",
    )
    found = {(imp.target, imp.line) for imp in imports(sample, "gpufleet.jobs.probe")}
    assert found == {("gpufleet.backends.base", 5), ("gpufleet.jobs.store", 6)}


def test_the_floors_are_read_from_the_layout_block() -> None:
    text = "intro\n\n## Layout\n\nwords\n\n```\n 0  gpufleet/errors.py   errors\n 3  gpufleet/jobs/   jobs\n```\n"
    assert stated_floors(text) == {"errors": 0, "jobs": 3}
