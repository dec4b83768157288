"""Failover: stop sending jobs where they keep failing, and move the jobs that were there.

SkyPilot's managed jobs recover with ``EAGER_NEXT_REGION``: after a preemption or a failure they
try another region first, then another cloud. Here a failure of a provider (or one of its
regions), or ``preemptions`` preemptions within ``window_hours`` there, blocks it for
``cooldown_hours``. :func:`replan` places the affected jobs again with the blocked targets avoided,
the current provider's other regions ranked first within each of the job's preferences, then the
other providers by expected cost; a move between providers pays the checkpoint egress
(``placement.checkpoint_gb``), because ``spec.provider`` is where the job's checkpoint is now.

:class:`Failover` is an immutable value: each ``record_*`` returns a new one, and the time is
always passed in (hours on the caller's clock), so the whole module is pure.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.errors import UsageError
from gpufleet.placement.catalog import Catalog
from gpufleet.placement.planner import Allocation, Plan, parse_target, plan
from gpufleet.spec import JobSpec


@dataclass(frozen=True, slots=True)
class FailoverPolicy:
    """When a target is blocked, and for how long."""

    cooldown_hours: float = 1.0
    preemptions: int = 3
    """Preemptions within ``window_hours`` that block a target."""
    window_hours: float = 1.0

    def __post_init__(self) -> None:
        if not self.cooldown_hours > 0 or not self.window_hours > 0 or self.preemptions < 1:
            raise UsageError(
                f"failover policy needs cooldown_hours > 0, window_hours > 0 and preemptions >= 1, got {self}"
            )


@dataclass(frozen=True, slots=True)
class Block:
    """``target`` (provider, provider/region or offer key) is avoided until ``until_hours``."""

    target: str
    since_hours: float
    until_hours: float
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "since_hours": self.since_hours,
            "until_hours": self.until_hours,
            "why": self.why,
        }


@dataclass(frozen=True, slots=True)
class Failover:
    """Blocks in force and recent preemptions, as of the last event recorded."""

    policy: FailoverPolicy = field(default_factory=FailoverPolicy)
    blocks: tuple[Block, ...] = ()
    preemptions: tuple[tuple[str, float], ...] = ()
    """(target, hour) of preemptions still inside the window."""

    def _block(self, target: str, at_hours: float, why: str) -> Failover:
        until = at_hours + self.policy.cooldown_hours
        kept = tuple(b for b in self.blocks if b.target != target and b.until_hours > at_hours)
        return replace(self, blocks=(*kept, Block(target, at_hours, until, why)))

    def record_failure(self, target: str, at_hours: float, why: str = "failure") -> Failover:
        """A provider or region failed (capacity error, outage): block it for the cool-down."""
        return self._block(parse_target(target), at_hours, why)

    def record_preemption(self, target: str, at_hours: float) -> Failover:
        """One preemption at ``target``; the ``policy.preemptions``-th within the window blocks it."""
        parse_target(target)
        start = at_hours - self.policy.window_hours
        recent = (*((t, h) for t, h in self.preemptions if h > start), (target, at_hours))
        state = replace(self, preemptions=recent)
        count = sum(1 for t, _ in recent if t == target)
        if count >= self.policy.preemptions:
            window = f"{count} preemptions within {self.policy.window_hours:g} h"
            state = replace(
                state._block(target, at_hours, window), preemptions=tuple(p for p in recent if p[0] != target)
            )
        return state

    def active(self, at_hours: float) -> tuple[Block, ...]:
        """Blocks still in force at ``at_hours``."""
        return tuple(b for b in self.blocks if b.since_hours <= at_hours < b.until_hours)

    def blocked(self, at_hours: float) -> frozenset[str]:
        """The targets to pass to :func:`~gpufleet.placement.planner.plan` at ``at_hours``."""
        return frozenset(b.target for b in self.active(at_hours))


def replan(
    affected_jobs: Sequence[JobSpec],
    catalog: Catalog,
    *,
    blocked: Collection[str],
    now_hours: float = 0.0,
    running: Sequence[Allocation] = (),
) -> Plan:
    """Place the jobs of a failed or blocked target again (``EAGER_NEXT_REGION``).

    Each job's ``provider`` must be where its checkpoint is now: the planner ranks that provider's
    other regions first and charges egress for a move away from it. ``running`` holds the GPUs the
    unaffected jobs keep.
    """
    stay = {job.name: job.provider for job in affected_jobs}
    return plan(affected_jobs, catalog, now_hours=now_hours, blocked=blocked, running=running, prefer_provider=stay)


__all__ = ["Block", "Failover", "FailoverPolicy", "replan"]
