"""The local backend's package: its modules import one another in one direction, and no private names."""

from __future__ import annotations

import ast
from pathlib import Path

from test_local_fleet import offer, write_fleet

import gpufleet.backends.local as local
from gpufleet.backends.local.fleet import FleetScheduling
from gpufleet.backends.local.scheduler import FleetPolicy
from gpufleet.backends.pools import drop_fleet, use_fleet

PACKAGE = Path(local.__file__).parent
BACKENDS = PACKAGE.parent
ALLOWED = {
    "process": set(),
    "warm": set(),
    "warm_server": {"warm"},
    "scheduler": {"process", "warm"},
    "fleet": {"scheduler"},
    "backend": {"process"},
    "__main__": {"scheduler"},
}
"""What each module may import of its siblings (the package's docstring says the same)."""


def imports(path: Path) -> list[ast.ImportFrom | ast.Import]:
    return [
        n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Import | ast.ImportFrom)
    ]


def siblings(path: Path) -> set[str]:
    found = set()
    for node in imports(path):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        for name in names:
            if name.startswith("gpufleet.backends.local."):
                found.add(name.split(".")[3])
            elif name == "gpufleet.backends.local" and isinstance(node, ast.ImportFrom):
                found.update(a.name for a in node.names)
    return found


def test_each_module_imports_only_the_siblings_below_it() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(ALLOWED)
    for name in modules:
        assert siblings(PACKAGE / f"{name}.py") <= ALLOWED[name], name


def test_no_module_of_the_backends_imports_a_private_name_of_another() -> None:
    private = [
        f"{path.relative_to(BACKENDS)}:{node.lineno} imports {alias.name} from {node.module}"
        for path in BACKENDS.rglob("*.py")
        for node in imports(path)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpufleet.")
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert private == []


def test_every_scheduler_gets_the_fleet_policy_of_its_home_and_lets_it_go_when_dropped(
    home: Path, tmp_path: Path
) -> None:
    scheduler = local.LocalScheduler(home, slots=1)
    assert scheduler.fleet_loader(scheduler) is None  # no fleet: the one pool of slots
    use_fleet(home, write_fleet(tmp_path / "fleet.yaml", offers=[offer("aws", "us-east-1", None, 6.88, 1)]))
    policy: FleetPolicy | None = scheduler.fleet_loader(scheduler)
    assert isinstance(policy, FleetScheduling) and policy.current()
    drop_fleet(home)
    assert not policy.current() and scheduler.fleet_loader(scheduler) is None
