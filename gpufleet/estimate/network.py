"""What an all-reduce costs on a placement: the links' numbers, and NCCL's ring and tree in the alpha-beta model.

Bandwidths follow NVIDIA's nccl-tests (doc/PERFORMANCE.md, https://github.com/NVIDIA/nccl-tests/blob/master/doc/
PERFORMANCE.md). An all-reduce of S bytes over n GPUs that takes t seconds has::

    algbw = S / t                     busbw = algbw * 2(n-1)/n

busbw is what the busiest link of every rank carries, so it compares directly with a link's peak.

Times follow the alpha-beta (latency-bandwidth) model, in the form NCCL's own tuner uses (src/graph/tuning.cc): a
start-up latency, a latency per sequential step, and the bytes over the bottleneck bandwidth B. With N nodes of g
GPUs (n = N·g), α₁ the step latency inside a node and α₂ the one between nodes::

    ring   t = 6.6 µs + (2(n-1) - 2N)·α₁ + 2N·α₂ + 2(n-1)/n · S / B       (2N network steps when N > 1)
    tree   t = 6.8 µs + 2((g-1)·α₁ + ⌊log₂ N⌋·α₂) + 2S / B

The ring is NCCL's: g rings at once, each entering and leaving every node through its own NIC, so a node's
network traffic is 2(n-1)/n · S over all its NICs together, and a GPU's NVLink traffic is the same over one GPU's
links. The tree is NCCL's double binary tree between nodes and a chain inside each: every node sends S up (half in
each tree) and S down to its children, 2S in all; every GPU of the chain does the same over NVLink. Both are
pipelined, so::

    B = min(one GPU's intra-node link, one node's NICs)               (one GPU per node: NICs; one node: the link)
    α₂ = NIC and software latency + each switch on the worst path     (the hops Slurm's topology/tree counts)

The start-up and step latencies are NCCL's tuner figures for its low-latency (LL) protocol, the one it picks for
small messages; bandwidths are link peaks. Large messages therefore come out optimistic by what NCCL loses to its
protocol: about 20% on NVLink (370 of 450 GB/s on 8 H100s), 4-8% on InfiniBand (46-48 of 50 GB/s per NDR NIC);
``docs/topology.md`` compares the model with published nccl-tests figures. Left out: NVLink SHARP (NVLS) and
InfiniBand SHARP in-network reductions, oversubscribed or congested uplinks, and the 2-node case where NCCL's tree
beats the NIC bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from gpufleet.errors import ParameterError, UsageError
from gpufleet.estimate.flops import MAX_COUNT, MAX_GPUS, require_at_most, require_positive
from gpufleet.estimate.peak import A10_SHEET, A100_SHEET, H100_SHEET, H200_SHEET, L4_SHEET, L40S_SHEET, gpu_peak

if TYPE_CHECKING:
    from gpufleet.backends.slurm.topology import Fleet, Switch

Fabric = Literal["infiniband", "roce", "ethernet"]
"""The fabrics of a fleet file's links (``gpufleet.backends.slurm.topology.Fabric``)."""
LinkKind = Literal["nvlink", "pcie", "infiniband", "roce", "ethernet"]
Algorithm = Literal["ring", "tree"]
ALGORITHMS: tuple[Algorithm, ...] = ("ring", "tree")

NCCL_TUNING = (
    "NCCL's tuner, src/graph/tuning.cc (baseLat and hwLat, LL protocol), "
    "https://github.com/NVIDIA/nccl/blob/b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2/src/graph/tuning.cc"
)
IBTA_ROADMAP = "InfiniBand Trade Association roadmap (4x ports), https://www.infinibandta.org/infiniband-roadmap/"
PCIE4_SPEC = "PCI Express 4.0 x16: 16 GT/s x 16 lanes, 128b/130b encoding = 31.5 GB/s each way (PCI-SIG)"
RING_BASE_US = 6.6
"""Start-up latency of one ring all-reduce (NCCL tuner, baseLat, Ring/LL)."""
TREE_BASE_US = 6.8
"""Start-up latency of one tree all-reduce (NCCL tuner, baseLat, Tree/LL)."""
MAX_BYTES = MAX_COUNT
"""Largest message an estimate takes: 1e15 bytes (a petabyte)."""
MAX_GBPS = 100_000.0
"""Fastest port or node bandwidth taken, in Gb/s (as the fleet file's ``link.gbps``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """One kind of link: its peak bandwidth one way and the latency of one step of a collective over it."""

    name: str
    kind: LinkKind
    gbytes_per_s: float
    """Peak, one direction, in GB/s (1e9 bytes): per GPU for NVLink and PCIe, per port for a network."""
    latency_us: float
    """One step of a collective over this link (NCCL tuner, hwLat, LL protocol); network links add their switches."""
    source: str

    @property
    def bytes_per_s(self) -> float:
        return self.gbytes_per_s * 1e9


NVLINK4 = LinkSpec(
    name="NVLink 4",
    kind="nvlink",
    gbytes_per_s=450.0,
    latency_us=0.6,
    source=f"900 GB/s bidirectional per GPU: {H100_SHEET}; {H200_SHEET}",
)
NVLINK3 = LinkSpec(
    name="NVLink 3", kind="nvlink", gbytes_per_s=300.0, latency_us=0.6, source=f"600 GB/s bidirectional: {A100_SHEET}"
)
PCIE5 = LinkSpec(
    name="PCIe Gen5 x16",
    kind="pcie",
    gbytes_per_s=64.0,
    latency_us=1.0,
    source=f"128 GB/s bidirectional: {H100_SHEET} (PCIe and NVL columns; an NVL bridge joins only two cards)",
)
PCIE4 = LinkSpec(
    name="PCIe Gen4 x16",
    kind="pcie",
    gbytes_per_s=32.0,
    latency_us=1.0,
    source=f"64 GB/s bidirectional: {L40S_SHEET}; {L4_SHEET}; {A10_SHEET}; {PCIE4_SPEC}",
)
INTRA_NODE: dict[str, LinkSpec] = {
    "a100-40gb": NVLINK3,
    "a100-80gb": NVLINK3,
    "h100-sxm": NVLINK4,
    "h100-pcie": PCIE5,
    "h100-nvl": PCIE5,
    "h200": NVLINK4,
    "l40s": PCIE4,
    "l4": PCIE4,
    "a10": PCIE4,
    "rtx-4090": PCIE4,
}
"""How the GPUs of one node reach each other, by canonical GPU name (:data:`gpufleet.estimate.peak.GPUS`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FabricSpec:
    """Latencies of one network fabric; its bandwidth is the fleet file's ``link.gbps``."""

    label: str
    nic_latency_us: float
    """One network step: NIC, PCIe and NCCL's proxy (NCCL tuner, hwLat NET, Ring/LL: 2.7 µs)."""
    switch_latency_ns: float
    """One switch crossed, port to port (cut-through)."""
    source: str


FABRICS: dict[Fabric, FabricSpec] = {
    "infiniband": FabricSpec(
        label="InfiniBand",
        nic_latency_us=2.7,
        switch_latency_ns=200.0,
        source=f"{NCCL_TUNING}; switch: vendors quote 130-330 ns port to port for HDR/NDR switches, 200 ns taken",
    ),
    "roce": FabricSpec(
        label="RoCE",
        nic_latency_us=2.7,
        switch_latency_ns=400.0,
        source=f"{NCCL_TUNING} (NCCL does not tell RoCE from InfiniBand); switch: 400 ns taken for a 400GbE "
        "cut-through switch, an assumption",
    ),
    "ethernet": FabricSpec(
        label="Ethernet (TCP)",
        nic_latency_us=10.0,
        switch_latency_ns=1000.0,
        source="an assumption, not a published figure: NCCL's socket transport pays the kernel TCP stack, about "
        "10 µs a message on a data-centre LAN; 1 µs for a store-and-forward switch",
    ),
}


def parse_fabric(name: str) -> Fabric:
    """``name`` as a fabric of :data:`FABRICS`; ``ParameterError`` listing them otherwise."""
    for fabric in FABRICS:
        if name == fabric:
            return fabric
    raise ParameterError(f"unknown {{fabric}}: use one of {', '.join(FABRICS)}", fabric=name)


def _fabric(fabric: str) -> FabricSpec:
    return FABRICS[parse_fabric(fabric)]


def network_link(fabric: Fabric, gbps: float, generation: str = "") -> LinkSpec:
    """A network port as a :class:`LinkSpec`: ``gbps`` / 8 GB/s each way and the fabric's step latency."""
    spec = _fabric(fabric)
    require_positive(gbps=gbps)
    require_at_most(MAX_GBPS, "100000 Gb/s", gbps=gbps)
    name = f"{spec.label} {generation or f'{gbps:g} Gb/s'}"
    source = IBTA_ROADMAP if fabric == "infiniband" else "IEEE 802.3 (the port's line rate)"
    return LinkSpec(name=name, kind=fabric, gbytes_per_s=gbps / 8, latency_us=spec.nic_latency_us, source=source)


NETWORK_LINKS: tuple[LinkSpec, ...] = (
    network_link("infiniband", 800, "XDR"),
    network_link("infiniband", 400, "NDR"),
    network_link("infiniband", 200, "HDR"),
    network_link("infiniband", 100, "EDR"),
    network_link("roce", 400, "400GbE"),
    network_link("roce", 200, "200GbE"),
    network_link("ethernet", 100, "100GbE"),
    network_link("ethernet", 25, "25GbE"),
)
"""The usual ports, for the documentation table; a fleet file may give any speed."""


def intra_node_link(gpu: str) -> LinkSpec:
    """How the GPUs of one node reach each other: NVLink for SXM parts, PCIe for the rest."""
    return INTRA_NODE[gpu_peak(gpu).name]


# --------------------------------------------------------------------------------------------
# Placements
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkPath:
    """What traffic between a placement's nodes crosses."""

    fabric: Fabric
    port_gbps: float
    """The slowest port on the way."""
    node_gbps: float
    """One node's NICs together (one NIC per GPU unless overridden)."""
    nic_latency_us: float
    switch_latency_us: float
    """The switches of the worst path together."""
    max_hops: int
    """Switch-to-switch links on the worst path: 0 on one leaf, 2 through a spine, 4 through a core."""
    leaves: int

    def __post_init__(self) -> None:
        _fabric(self.fabric)
        require_positive(port_gbps=self.port_gbps, node_gbps=self.node_gbps)
        require_at_most(MAX_GBPS, "100000 Gb/s", port_gbps=self.port_gbps)
        require_at_most(MAX_GBPS * MAX_GPUS, "1e11 Gb/s", node_gbps=self.node_gbps)
        for name, value in (("nic_latency_us", self.nic_latency_us), ("switch_latency_us", self.switch_latency_us)):
            if not 0 <= value < math.inf:
                raise ParameterError(f"{{{name}}} must be a finite number >= 0", **{name: value})

    @property
    def step_latency_s(self) -> float:
        """α₂: one network step, NIC and every switch of the worst path."""
        return (self.nic_latency_us + self.switch_latency_us) * 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where the GPUs of a collective are: whole nodes of ``gpus_per_node`` GPUs, and the network between them."""

    gpu: str
    nodes: int
    gpus_per_node: int
    intra: LinkSpec
    network: NetworkPath | None
    """``None`` on one node."""

    def __post_init__(self) -> None:
        require_positive(nodes=self.nodes, gpus_per_node=self.gpus_per_node)
        require_at_most(MAX_GPUS, "1e6 GPUs", gpus=self.gpus)
        if (self.nodes > 1) != (self.network is not None):
            raise ParameterError(
                "{nodes} does not match the network: more than one node needs one, a single node none", nodes=self.nodes
            )

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def leaves(self) -> int:
        return 1 if self.network is None else self.network.leaves

    @property
    def max_hops(self) -> int:
        return 0 if self.network is None else self.network.max_hops

    def links(self) -> list[tuple[str, float]]:
        """(label, bytes/s one way) of each link every rank's traffic crosses: a GPU's in the node, a node's NICs."""
        links: list[tuple[str, float]] = []
        if self.gpus_per_node > 1:
            links.append((f"{self.intra.name} ({self.intra.gbytes_per_s:g} GB/s per GPU)", self.intra.bytes_per_s))
        net = self.network
        if net is not None:
            label = FABRICS[net.fabric].label
            nics = net.node_gbps / net.port_gbps
            count = f"{nics:g} x {net.port_gbps:g} Gb/s" if nics == round(nics) else f"{net.node_gbps:g} Gb/s"
            links.append((f"{label} NICs ({count} per node)", net.node_gbps * 1e9 / 8))
        return links

    def as_dict(self) -> dict[str, object]:
        net = self.network
        return {
            "gpu": self.gpu,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "intra_node": {"link": self.intra.name, "gbytes_per_s": self.intra.gbytes_per_s},
            "network": None
            if net is None
            else {
                "fabric": net.fabric,
                "port_gbps": net.port_gbps,
                "node_gbps": net.node_gbps,
                "step_latency_us": round(net.nic_latency_us + net.switch_latency_us, 6),
                "max_hops": net.max_hops,
                "leaf_switches": net.leaves,
            },
        }


def _placement(gpus: int, gpus_per_node: int, gpu: str) -> tuple[int, int, LinkSpec, str]:
    """(nodes, GPUs used on each) for whole nodes, or for part of one node; the link inside a node; the GPU's name."""
    require_positive(gpus=gpus, gpus_per_node=gpus_per_node)
    require_at_most(MAX_GPUS, "1e6 GPUs", gpus=gpus, gpus_per_node=gpus_per_node)
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise ParameterError(
            "{gpus} is not a multiple of {gpus_per_node}: give whole nodes (or GPUs of one node)",
            gpus=gpus,
            gpus_per_node=gpus_per_node,
        )
    per_node = min(gpus, gpus_per_node)
    return gpus // per_node, per_node, intra_node_link(gpu), gpu_peak(gpu).name


def _node_gbps(node_gbps: float | None, port_gbps: float, gpus_per_node: int) -> float:
    if node_gbps is None:
        return port_gbps * gpus_per_node
    require_positive(node_gbps=node_gbps)
    require_at_most(MAX_GBPS * MAX_GPUS, "1e11 Gb/s", node_gbps=node_gbps)
    return node_gbps


def one_switch_placement(
    *,
    gpus: int,
    gpus_per_node: int = 8,
    gpu: str = "h100",
    fabric: Fabric = "infiniband",
    gbps: float = 400.0,
    node_gbps: float | None = None,
) -> Placement:
    """Whole nodes (or part of one) under one leaf switch of ``fabric`` with ``gbps`` ports: no switch-to-switch
    hop."""
    nodes, gpus_per_node, intra, name = _placement(gpus, gpus_per_node, gpu)
    spec = _fabric(fabric)
    require_positive(gbps=gbps)
    require_at_most(MAX_GBPS, "100000 Gb/s", gbps=gbps)
    network = None
    if nodes > 1:
        network = NetworkPath(
            fabric=fabric,
            port_gbps=gbps,
            node_gbps=_node_gbps(node_gbps, gbps, gpus_per_node),
            nic_latency_us=spec.nic_latency_us,
            switch_latency_us=spec.switch_latency_ns / 1000,
            max_hops=0,
            leaves=1,
        )
    return Placement(gpu=name, nodes=nodes, gpus_per_node=gpus_per_node, intra=intra, network=network)


def fleet_placement(
    fleet: Fleet,
    nodes: str | Sequence[str],
    *,
    gpus: int,
    gpus_per_node: int = 8,
    gpu: str = "h100",
    node_gbps: float | None = None,
) -> Placement:
    """The first ``gpus / gpus_per_node`` of ``nodes`` (names or a Slurm hostlist; the first one for fewer GPUs than a
    node holds) in ``fleet``'s switch tree.

    Latencies and the slowest port come from the switches the placement's traffic may cross, each switch's link
    overriding the fabric's defaults (``latency_us``, ``hop_latency_ns``). Raises ``UsageError`` for a malformed
    hostlist, an unknown node, a node given twice, too few nodes, or nodes in separate switch trees.
    """
    count, gpus_per_node, intra, name = _placement(gpus, gpus_per_node, gpu)
    names = fleet.known_nodes(nodes)  # a malformed hostlist, unknown nodes
    seen: set[str] = set()
    for node in names:
        if node in seen:
            raise ParameterError(f"{{nodes:name}} lists {node!r} twice: give each node once", nodes=nodes)
        seen.add(node)
    if count > len(names):
        raise ParameterError(
            f"{{gpus}} needs {count} nodes of {{gpus_per_node!s}} GPUs, but {{nodes:name}} has {len(names)}: "
            "give more nodes or fewer GPUs",
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            nodes=nodes,
        )
    used = names[:count]
    network = None
    if count > 1:
        leaves = fleet.node_leaves()
        network = _network_path(fleet, [leaves[node] for node in used], gpus_per_node, node_gbps)
    return Placement(gpu=name, nodes=count, gpus_per_node=gpus_per_node, intra=intra, network=network)


def _network_path(fleet: Fleet, leaf_names: Iterable[str], gpus_per_node: int, node_gbps: float | None) -> NetworkPath:
    """The worst path between the leaves: up to the lowest switch above them all and down again."""
    leaves = list(dict.fromkeys(leaf_names))
    parents = fleet.parents()
    paths: dict[str, list[str]] = {}
    for leaf in leaves:  # Fleet.path_to_root, with the parents looked up once for all leaves
        path = paths[leaf] = [leaf]
        while path[-1] in parents:
            path.append(parents[path[-1]])
    roots = {path[-1]: leaf for leaf, path in paths.items()}
    if len(roots) > 1:
        (root_a, leaf_a), (root_b, leaf_b) = list(roots.items())[:2]
        raise UsageError(
            f"the nodes are in separate switch trees (under {leaf_a!r}, root {root_a!r}, and {leaf_b!r}, root "
            f"{root_b!r}): no switch joins them and Slurm never places one job on both; give nodes of one tree"
        )
    common = set.intersection(*(set(path) for path in paths.values()))
    top = next(switch for switch in paths[leaves[0]] if switch in common)
    climbs = {leaf: path[: path.index(top)] for leaf, path in paths.items()}  # each leaf up to, not including, top
    by_switch = {switch.name: switch for switch in fleet.switches}

    def latency_ns(names: Iterable[str]) -> float:
        return sum(_hop_latency_ns(by_switch[name]) for name in names)

    worst: list[str] = [top]
    if len(leaves) > 1:
        best_per_branch: dict[str, list[str]] = {}  # the longest climb through each switch just below top
        for climb in climbs.values():
            branch = best_per_branch.get(climb[-1])
            if branch is None or (len(climb), latency_ns(climb)) > (len(branch), latency_ns(branch)):
                best_per_branch[climb[-1]] = climb
        first, second = sorted(best_per_branch.values(), key=lambda c: (len(c), latency_ns(c)), reverse=True)[:2]
        worst = [*first, top, *reversed(second)]
    crossed = {top, *(switch for climb in climbs.values() for switch in climb)}
    port = min(by_switch[name].link.gbps for name in crossed)
    first_leaf = by_switch[leaves[0]].link
    return NetworkPath(
        fabric=first_leaf.fabric,
        port_gbps=port,
        node_gbps=_node_gbps(node_gbps, port, gpus_per_node),
        nic_latency_us=max(_nic_latency_us(by_switch[leaf]) for leaf in leaves),
        switch_latency_us=latency_ns(worst) / 1000,
        max_hops=len(worst) - 1,
        leaves=len(leaves),
    )


def _hop_latency_ns(switch: Switch) -> float:
    link = switch.link
    return FABRICS[link.fabric].switch_latency_ns if link.hop_latency_ns is None else link.hop_latency_ns


def _nic_latency_us(leaf: Switch) -> float:
    link = leaf.link
    return FABRICS[link.fabric].nic_latency_us if link.latency_us is None else link.latency_us


# --------------------------------------------------------------------------------------------
# The all-reduce
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AllreduceEstimate:
    """One algorithm's all-reduce of ``size_bytes`` over a placement. Bandwidths in bytes/s (nccl-tests' units)."""

    algorithm: Algorithm
    size_bytes: int
    gpus: int
    nodes: int
    seconds: float
    latency_seconds: float
    """The alpha part: start-up and every step's latency."""
    bandwidth_seconds: float
    """The beta part: the bytes over the bottleneck link."""
    algbw: float
    busbw: float
    bottleneck: str
    """The slower link, or ``latency (...)`` when the alpha part is the larger."""
    max_hops: int

    def as_dict(self) -> dict[str, object]:
        return {
            "algorithm": self.algorithm,
            "seconds": self.seconds,
            "algbw": self.algbw,
            "busbw": self.busbw,
            "bottleneck": self.bottleneck,
            "max_hops": self.max_hops,
            "latency_seconds": self.latency_seconds,
            "bandwidth_seconds": self.bandwidth_seconds,
        }


def bus_bandwidth(algbw: float, gpus: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: ``algbw * 2(n-1)/n``."""
    return algbw * 2 * (gpus - 1) / gpus


def allreduce(size_bytes: int, placement: Placement, algorithm: Algorithm = "ring") -> AllreduceEstimate:
    """Time of one all-reduce of ``size_bytes`` over ``placement`` with NCCL's ring or tree (module docstring)."""
    require_positive(size_bytes=size_bytes)
    require_at_most(MAX_BYTES, "1e15 bytes", size_bytes=size_bytes)
    n, nodes, g = placement.gpus, placement.nodes, placement.gpus_per_node
    if n < 2:
        raise ParameterError("an all-reduce needs at least 2 GPUs, got {gpus}: there is nothing to reduce", gpus=n)
    net = placement.network
    alpha_intra = placement.intra.latency_us * 1e-6
    alpha_inter = 0.0 if net is None else net.step_latency_s
    label, bandwidth = min(placement.links(), key=lambda link: link[1])
    if algorithm == "ring":
        inter_steps = min(2 * nodes, 2 * (n - 1)) if nodes > 1 else 0
        steps = 2 * (n - 1)
        alpha = RING_BASE_US * 1e-6 + (steps - inter_steps) * alpha_intra + inter_steps * alpha_inter
        beta = 2 * (n - 1) / n * size_bytes / bandwidth
    elif algorithm == "tree":
        inter_steps = 2 * (nodes.bit_length() - 1)
        steps = 2 * (g - 1) + inter_steps
        alpha = TREE_BASE_US * 1e-6 + 2 * (g - 1) * alpha_intra + inter_steps * alpha_inter
        beta = 2 * size_bytes / bandwidth
    else:
        raise ParameterError(f"unknown {{algorithm}}: use one of {', '.join(ALGORITHMS)}", algorithm=algorithm)
    seconds = alpha + beta
    if alpha > beta:
        between = f", {inter_steps} between nodes at {alpha_inter * 1e6:.3g} µs" if inter_steps else ""
        label = f"latency ({steps} steps{between})"
    algbw = size_bytes / seconds
    return AllreduceEstimate(
        algorithm=algorithm,
        size_bytes=size_bytes,
        gpus=n,
        nodes=nodes,
        seconds=seconds,
        latency_seconds=alpha,
        bandwidth_seconds=beta,
        algbw=algbw,
        busbw=bus_bandwidth(algbw, n),
        bottleneck=label,
        max_hops=placement.max_hops,
    )


def estimate_allreduce(size_bytes: int, placement: Placement) -> tuple[AllreduceEstimate, ...]:
    """Ring and tree, in that order."""
    return tuple(allreduce(size_bytes, placement, algorithm) for algorithm in ALGORITHMS)


def data_parallel_group(placement: Placement, *, tp: int, dp: int) -> Placement:
    """The placement one data-parallel group of a tensor x pipeline x data layout sees.

    Ranks are laid out as Megatron-LM does, tensor ranks innermost, then data-parallel ones, so a group has
    k = min(dp, g // tp) ranks on each of its ceil(dp / k) nodes. Every group of the job all-reduces at the same time,
    so each gets k/g of a node's NICs.
    """
    require_positive(tp=tp, dp=dp)
    g = placement.gpus_per_node
    if tp * dp > placement.gpus:
        raise ParameterError("{tp} x {dp} is more than the placement's {gpus} GPUs", tp=tp, dp=dp, gpus=placement.gpus)
    k = max(1, min(dp, g // tp))
    nodes = -(-dp // k)
    net = placement.network
    network = None if nodes == 1 or net is None else replace(net, node_gbps=net.node_gbps * k / g)
    return replace(placement, nodes=nodes if network is not None else 1, gpus_per_node=k, network=network)


__all__ = [
    "ALGORITHMS",
    "FABRICS",
    "INTRA_NODE",
    "NETWORK_LINKS",
    "NVLINK3",
    "NVLINK4",
    "PCIE4",
    "PCIE5",
    "Algorithm",
    "AllreduceEstimate",
    "Fabric",
    "FabricSpec",
    "LinkSpec",
    "NetworkPath",
    "Placement",
    "allreduce",
    "bus_bandwidth",
    "data_parallel_group",
    "estimate_allreduce",
    "fleet_placement",
    "intra_node_link",
    "network_link",
    "one_switch_placement",
    "parse_fabric",
]
