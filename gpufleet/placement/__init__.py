"""Placement across providers: the offer catalogue, team quotas, a cost-optimal planner, failover.

``catalog`` reads what each provider sells; ``quota`` applies Kueue's nominal/borrow/lend rules;
``planner`` chooses, for each job, the offer and market (spot or on-demand) with the lowest expected
cost that fits its deadline, capacity and quota, and says why every other candidate lost;
``advisor`` gives the Young/Daly checkpoint interval; ``failover`` blocks a failing region and
moves its jobs elsewhere. The planner's names load numpy, so they are imported on first use
(PEP 562): reading a catalogue stays cheap for the CLI.

Floor 9 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/, data/, rl/,
workloads/.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from gpufleet.placement.catalog import (
    Catalog,
    GpuType,
    Offer,
    Quota,
    load_batch,
    load_catalog,
    parse_batch,
    parse_catalog,
)

if TYPE_CHECKING:
    from gpufleet.placement.advisor import CheckpointAdvice, advise
    from gpufleet.placement.failover import Failover, FailoverPolicy, replan
    from gpufleet.placement.planner import Allocation, Candidate, Choice, Decision, Plan, plan
    from gpufleet.placement.quota import Admission, QuotaBook

_LAZY = {
    "CheckpointAdvice": "advisor",
    "advise": "advisor",
    "Failover": "failover",
    "FailoverPolicy": "failover",
    "replan": "failover",
    "Allocation": "planner",
    "Candidate": "planner",
    "Choice": "planner",
    "Decision": "planner",
    "Plan": "planner",
    "plan": "planner",
    "Admission": "quota",
    "QuotaBook": "quota",
}

__all__ = [
    "Admission",
    "Allocation",
    "Candidate",
    "Catalog",
    "CheckpointAdvice",
    "Choice",
    "Decision",
    "Failover",
    "FailoverPolicy",
    "GpuType",
    "Offer",
    "Plan",
    "Quota",
    "QuotaBook",
    "advise",
    "load_batch",
    "load_catalog",
    "parse_batch",
    "parse_catalog",
    "plan",
    "replan",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f"gpufleet.placement.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'gpufleet.placement' has no attribute {name!r}")
