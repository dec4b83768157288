"""Fleet topology: which nodes hang off which switch, and Slurm's ``topology.conf`` for it.

A fleet file describes the switch tree of a GPU fleet. It is loaded from YAML, validated by
pydantic (unknown fields are errors), and frozen::

    name: example
    switches:
      - name: spine1
        level: spine                                   # leaf | spine | core
        link: {fabric: infiniband, gbps: 400, generation: NDR}
        children: leaf[1-2]                            # switch names: a hostlist or a list
      - name: leaf1
        level: leaf
        link: {fabric: infiniband, gbps: 400, generation: NDR}
        nodes: gpu[01-04]                              # node names: a hostlist or a list
      - name: leaf2
        level: leaf
        link: {fabric: infiniband, gbps: 400, generation: NDR, hop_latency_ns: 150}   # optional latencies
        nodes: [gpu05, gpu06, gpu07, gpu08]

Hostlists in the file are expanded, and compressed again for ``topology.conf``, by
:mod:`gpufleet.backends.slurm.hostlist`.

Leaf switches hold nodes and no switches; spine and core switches hold switches and no nodes.
Every switch has at most one parent, so the switches form one tree or several separate trees
(one per fabric, say). Slurm accepts separate trees but never places one job across two of them;
:meth:`Fleet.warnings` says so, and :func:`render_topology_conf` repeats it in the file.

:func:`render_topology_conf` writes the file for ``TopologyPlugin=topology/tree``;
:func:`switch_hops` and :func:`placement_switches` answer the two questions a placement asks:
how far apart two nodes are, and how many leaf switches a set of nodes spans (what
``sbatch --switches=N`` bounds).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpufleet.backends.slurm.hostlist import SLURM_NAME_HINT, SLURM_NAME_RE, compress_hostlist, expand_hostlist
from gpufleet.errors import UsageError
from gpufleet.paths import NAME_HINT, NAME_RE
from gpufleet.yamlio import read_yaml, validate

Fabric = Literal["infiniband", "roce", "ethernet"]
Level = Literal["leaf", "spine", "core"]

GENERATION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._/+-]{0,31}$")

_LEVEL_RANK: dict[str, int] = {"leaf": 0, "spine": 1, "core": 2}
_FABRIC_LABEL: dict[str, str] = {"infiniband": "InfiniBand", "roce": "RoCE", "ethernet": "Ethernet"}


# --------------------------------------------------------------------------------------------
# The fleet file
# --------------------------------------------------------------------------------------------


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Link(_Frozen):
    """The ports of one switch: fabric and per-port speed, and optionally its latencies.

    Slurm ignores all of them; ``gpufleet estimate allreduce`` uses them (:mod:`gpufleet.estimate.network`), taking
    the fabric's defaults from its table where a latency is not given.
    """

    fabric: Fabric
    gbps: float = Field(gt=0, le=100_000, allow_inf_nan=False)
    """Speed of one port in Gb/s (NDR InfiniBand: 400; HDR: 200; 400GbE: 400)."""
    generation: str | None = None
    """Free-form label such as ``NDR``, ``HDR`` or ``400GbE``."""
    latency_us: float | None = Field(default=None, ge=0, le=1_000_000, allow_inf_nan=False)
    """On a leaf: one message between its nodes' NICs, software included, in µs (default: the fabric's)."""
    hop_latency_ns: float | None = Field(default=None, ge=0, le=1_000_000_000, allow_inf_nan=False)
    """This switch's port-to-port latency in ns (default: the fabric's)."""

    @field_validator("generation")
    @classmethod
    def _generation(cls, value: str | None) -> str | None:
        if value is not None and not GENERATION_RE.match(value):
            raise ValueError(
                f"{value!r} is not a valid generation: 1-32 letters, digits, spaces or '._/+-' (e.g. NDR, 400GbE)"
            )
        return value


class Switch(_Frozen):
    """One switch: a leaf holds nodes, a spine or core switch holds other switches."""

    name: str
    level: Level
    link: Link
    children: list[str] = Field(default_factory=list)
    """Switch names (spine and core only), as a list or a hostlist such as ``leaf[1-4]``."""
    nodes: list[str] = Field(default_factory=list)
    """Node names (leaves only), as a list or a hostlist such as ``gpu[01-04]``; stored expanded."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not SLURM_NAME_RE.match(value):
            raise ValueError(f"{value!r} is not a valid switch name: {SLURM_NAME_HINT}")
        return value

    @field_validator("children", "nodes", mode="before")
    @classmethod
    def _expand(cls, value: Any) -> list[str]:
        if value is None:
            return []
        if isinstance(value, str):
            items = [value]
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            items = value
        else:
            raise ValueError("give a hostlist string such as 'gpu[01-04]' or a list of names")
        names: list[str] = []
        for item in items:
            names.extend(expand_hostlist(item))
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ValueError(f"{name!r} is listed twice")
            seen.add(name)
        return names

    @model_validator(mode="after")
    def _shape(self) -> Switch:
        if self.level == "leaf":
            if self.children:
                raise ValueError(
                    f"leaf switch {self.name!r} cannot have children: only spine and core switches connect switches"
                )
            if not self.nodes:
                raise ValueError(f"leaf switch {self.name!r} needs nodes (a hostlist such as 'gpu[01-04]')")
        else:
            if self.nodes:
                raise ValueError(f"{self.level} switch {self.name!r} cannot have nodes: attach nodes to leaf switches")
            if not self.children:
                raise ValueError(f"{self.level} switch {self.name!r} needs children (the switches below it)")
        return self


class Fleet(_Frozen):
    """A fleet's switch tree (or several separate trees, e.g. one per fabric)."""

    name: str
    switches: list[Switch] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError(f"{value!r} is not a valid name: {NAME_HINT}")
        return value

    def known_nodes(self, nodes: str | Iterable[str]) -> list[str]:
        """``nodes`` (names, or a Slurm hostlist string) as names, each under a leaf of this fleet.

        Raises ``UsageError`` for a malformed hostlist or an unknown node. What
        :func:`gpufleet.estimate.network.fleet_placement` asks of a fleet, so the estimate never
        imports the Slurm grammar.
        """
        names = node_names(nodes)
        placement_switches(self, names)
        return names

    @model_validator(mode="after")
    def _tree(self) -> Fleet:
        index: dict[str, int] = {}
        for i, switch in enumerate(self.switches):
            if switch.name in index:
                raise ValueError(
                    f"switches.{i}.name: switch {switch.name!r} is defined twice (also switches.{index[switch.name]})"
                )
            index[switch.name] = i

        parent: dict[str, str] = {}
        for i, switch in enumerate(self.switches):
            for child in switch.children:
                if child not in index:
                    raise ValueError(f"switches.{i}.children: {switch.name!r} lists {child!r}, which is not defined")
                if child in parent:
                    raise ValueError(
                        f"switches.{i}.children: {child!r} is already under {parent[child]!r}; "
                        "topology/tree needs one parent per switch (model redundant spines as one switch)"
                    )
                below = self.switches[index[child]]
                if _LEVEL_RANK[below.level] > _LEVEL_RANK[switch.level]:
                    raise ValueError(
                        f"switches.{i}.children: {switch.level} switch {switch.name!r} cannot hold "
                        f"{below.level} switch {child!r}, which is a higher level"
                    )
                parent[child] = switch.name

        for switch in self.switches:
            path = [switch.name]
            while path[-1] in parent:
                path.append(parent[path[-1]])
                if path[-1] in path[:-1]:
                    loop = path[path.index(path[-1]) :]
                    raise ValueError(f"switches: cycle {' -> '.join(reversed(loop))}; switches must form a tree")

        leaf_of: dict[str, str] = {}
        for i, switch in enumerate(self.switches):
            for node in switch.nodes:
                if node in leaf_of:
                    raise ValueError(
                        f"switches.{i}.nodes: node {node!r} is under both {leaf_of[node]!r} and {switch.name!r}; "
                        "a node hangs off exactly one leaf switch"
                    )
                leaf_of[node] = switch.name
        return self

    def switch(self, name: str) -> Switch:
        """The switch called ``name``; ``UsageError`` if there is none."""
        for switch in self.switches:
            if switch.name == name:
                return switch
        raise UsageError(f"unknown switch {name!r} in fleet {self.name!r}")

    def parents(self) -> dict[str, str]:
        """Each switch that has a parent, mapped to that parent's name."""
        return {child: switch.name for switch in self.switches for child in switch.children}

    def roots(self) -> list[str]:
        """Switches without a parent, in file order: one per separate tree."""
        parents = self.parents()
        return [switch.name for switch in self.switches if switch.name not in parents]

    def node_leaves(self) -> dict[str, str]:
        """Each node, mapped to the leaf switch it hangs off (file order)."""
        return {node: switch.name for switch in self.switches for node in switch.nodes}

    def nodes(self) -> list[str]:
        """Every node of the fleet, in file order."""
        return list(self.node_leaves())

    def path_to_root(self, switch: str) -> list[str]:
        """``switch``, its parent, and so on up to the root of its tree."""
        parents = self.parents()
        self.switch(switch)
        path = [switch]
        while path[-1] in parents:
            path.append(parents[path[-1]])
        return path

    def warnings(self) -> list[str]:
        """Legal but probably unintended things, one line each (separate trees, mixed fabrics)."""
        notes: list[str] = []
        roots = self.roots()
        if len(roots) > 1:
            notes.append(
                f"{len(roots)} separate switch trees (roots: {', '.join(roots)}): Slurm never places one job "
                "across trees, and RouteTree message routing needs a single tree"
            )
        by_name = {switch.name: switch for switch in self.switches}
        for child, parent in self.parents().items():
            below, above = by_name[child].link.fabric, by_name[parent].link.fabric
            if below != above:
                notes.append(
                    f"{child!r} ({_FABRIC_LABEL[below]}) is under {parent!r} ({_FABRIC_LABEL[above]}): "
                    "one tree should be one fabric"
                )
        return notes

    def ordered_switches(self) -> list[Switch]:
        """Leaves first, then each switch after all switches below it (file order within a height)."""
        by_name = {switch.name: switch for switch in self.switches}
        height: dict[str, int] = {}

        def height_of(name: str) -> int:
            if name not in height:
                height[name] = 1 + max((height_of(child) for child in by_name[name].children), default=-1)
            return height[name]

        order = {switch.name: i for i, switch in enumerate(self.switches)}
        return sorted(self.switches, key=lambda switch: (height_of(switch.name), order[switch.name]))


def parse_fleet(data: Any, source: str = "<fleet>") -> Fleet:
    """Validate a mapping as a Fleet; raise ``UsageError`` naming the first bad field."""
    return validate(Fleet, data, source=source, what="a fleet file", reference="docs/topology.md", error=UsageError)


def load_fleet(path: str | Path) -> Fleet:
    """Read and validate a fleet YAML file (untrusted input: ``yaml.safe_load`` only)."""
    path = Path(path)
    data = read_yaml(path, what="fleet file", error=UsageError)
    return parse_fleet(data, source=str(path))


# --------------------------------------------------------------------------------------------
# topology.conf and placement questions
# --------------------------------------------------------------------------------------------


def _speed(gbps: float) -> str:
    return f"{gbps:g} Gb/s"


def render_topology_conf(fleet: Fleet) -> str:
    """Slurm's ``topology.conf`` for ``TopologyPlugin=topology/tree``.

    A header comment (source fleet, one row per switch with its fabric, port speed and parent, and
    any :meth:`Fleet.warnings`), then one ``SwitchName=`` line per switch: leaves first, each with
    ``Nodes=``, then upward, each with ``Switches=``. Port speeds stay in comments: ``LinkSpeed=``
    is unused by Slurm. The output is deterministic (no timestamp), so it can be diffed.
    """
    ordered = fleet.ordered_switches()
    parents = fleet.parents()
    leaves = [switch for switch in ordered if switch.level == "leaf"]
    roots = fleet.roots()
    node_count = sum(len(switch.nodes) for switch in leaves)
    trees = "1 switch tree" if len(roots) == 1 else f"{len(roots)} switch trees"
    rows = [("switch", "level", "fabric", "port speed", "generation", "parent")]
    rows += [
        (
            switch.name,
            switch.level,
            _FABRIC_LABEL[switch.link.fabric],
            _speed(switch.link.gbps),
            switch.link.generation or "-",
            parents.get(switch.name, "-"),
        )
        for switch in ordered
    ]
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    lines = [
        "# Slurm topology.conf for TopologyPlugin=topology/tree (set in slurm.conf).",
        f'# Generated by gpufleet from fleet "{fleet.name}": edit the fleet file and regenerate, not this file.',
        f"# {node_count} nodes on {len(leaves)} leaf switches; {trees}.",
        "# Port speeds are for people: Slurm does not use them (LinkSpeed= is unused).",
        "#",
    ]
    lines += [("# " + "  ".join(cell.ljust(widths[col]) for col, cell in enumerate(row))).rstrip() for row in rows]
    warnings = fleet.warnings()
    if warnings:
        lines.append("#")
        lines += [f"# warning: {note}" for note in warnings]
    lines.append("")
    for switch in ordered:
        if switch.level == "leaf":
            lines.append(f"SwitchName={switch.name} Nodes={compress_hostlist(switch.nodes)}")
        else:
            lines.append(f"SwitchName={switch.name} Switches={compress_hostlist(switch.children)}")
    return "\n".join(lines) + "\n"


def _leaf_of(fleet: Fleet, node: str, leaves: dict[str, str]) -> str:
    if node not in leaves:
        raise UsageError(f"unknown node {node!r}: it is under no leaf switch of fleet {fleet.name!r}")
    return leaves[node]


def switch_hops(fleet: Fleet, a: str, b: str) -> int:
    """Switch-to-switch links between two nodes: 0 on one leaf, 2 via a spine, 4 via a core.

    In general, the links from each node's leaf up to the lowest switch above both. Raises
    ``UsageError`` for an unknown node, or for nodes in separate trees (no switch joins them).
    """
    leaves = fleet.node_leaves()
    leaf_a, leaf_b = _leaf_of(fleet, a, leaves), _leaf_of(fleet, b, leaves)
    up_a, up_b = fleet.path_to_root(leaf_a), fleet.path_to_root(leaf_b)
    for hops_a, switch in enumerate(up_a):
        if switch in up_b:
            return hops_a + up_b.index(switch)
    raise UsageError(
        f"nodes {a!r} and {b!r} are in separate switch trees (roots {up_a[-1]!r} and {up_b[-1]!r}): "
        "no switch joins them, and Slurm never places one job on both"
    )


def node_names(nodes: str | Iterable[str]) -> list[str]:
    """Node names from a hostlist string (``gpu[01-04]``) or an iterable; ``UsageError`` for a malformed hostlist."""
    if isinstance(nodes, str):
        try:
            return expand_hostlist(nodes)
        except ValueError as err:
            raise UsageError(str(err)) from None
    return list(nodes)


def placement_switches(fleet: Fleet, nodes: str | Iterable[str]) -> int:
    """How many leaf switches ``nodes`` (names, or a hostlist string) span: the N of ``--switches=N``.

    Raises ``UsageError`` for a malformed hostlist or an unknown node; an empty set spans 0.
    """
    names = node_names(nodes)
    leaves = fleet.node_leaves()
    unknown = sorted({name for name in names if name not in leaves})
    if unknown:
        shown = ", ".join(repr(name) for name in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise UsageError(
            f"unknown nodes {shown}: under no leaf switch of fleet {fleet.name!r}; "
            "fix the names or list them under a leaf"
        )
    return len({leaves[name] for name in names})


__all__ = [
    "GENERATION_RE",
    "Fabric",
    "Fleet",
    "Level",
    "Link",
    "Switch",
    "load_fleet",
    "node_names",
    "parse_fleet",
    "placement_switches",
    "render_topology_conf",
    "switch_hops",
]
