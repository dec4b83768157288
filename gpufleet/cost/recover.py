"""What would recover the most GPU time of one job, from its own measurements (``gpufleet advise JOB``).

Every billed GPU-second of an attempt falls in one of the ledger's goodput buckets
(:data:`gpufleet.cost.ledger.GOODPUT_BUCKETS`, :meth:`~gpufleet.cost.ledger.AttemptUsage.goodput_seconds`);
``compute`` is goodput and every other bucket is badput. :func:`recoverable` sums each badput bucket
over a job's attempts in GPU-seconds and in money (each attempt at its own price), ranks them largest
first, and gives each the remedy its own evidence points to: the straggler a ``straggler`` event named
(rank, host and phase), the rank that waits longest for its data (``phase_totals_s``), the measured
save, restore and start-up, and the checkpoint interval Daly's formula recommends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpufleet.cost.ledger import GOODPUT_BUCKETS, attempt_price
from gpufleet.fmt import number
from gpufleet.jobs.rank_phases import Straggler, stragglers
from gpufleet.telemetry.ranks import phase_totals

if TYPE_CHECKING:
    from gpufleet.cost.ledger import AttemptUsage
    from gpufleet.cost.rates import RateCard
    from gpufleet.jobs.store import Event

GOODPUT = "compute"
"""The one bucket that is not badput: nothing to recover there."""


class GoodputAttempt(Protocol):
    """What :func:`recoverable` reads of an attempt (:class:`~gpufleet.cost.ledger.AttemptUsage` has it)."""

    @property
    def attempt(self) -> int: ...

    @property
    def gpus(self) -> int: ...

    def goodput_seconds(self) -> dict[str, float]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """What a job measured that names the remedy of a bucket (``None``: not measured)."""

    stragglers: tuple[Straggler, ...] = ()
    data_wait_by_rank: tuple[float, ...] = ()
    """Each rank's seconds waiting for its data, summed over the attempts' final ``phase_totals_s``."""
    save_seconds: float | None = None
    restore_seconds: float | None = None
    startup_seconds: float | None = None
    interval_seconds: float | None = None
    """Today's checkpoint interval."""
    recommended_seconds: float | None = None
    """Daly's interval for the measured save and preemption rate."""
    memory_tier: bool = False
    async_save: bool = False
    rollbacks: int = 0


@dataclass(frozen=True, slots=True)
class Recovery:
    """One badput bucket of a job: what it cost, and what would win it back."""

    bucket: str
    gpu_seconds: float
    money: float | None
    """At each attempt's price; ``None`` when an attempt that spent some of it has no price."""
    action: str

    def to_dict(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "gpu_seconds": self.gpu_seconds, "money": self.money, "action": self.action}


def _s(seconds: float | None, what: str) -> str:
    return "" if seconds is None else f" ({number(seconds)} s {what})"


def _straggler_name(s: Straggler) -> str:
    return (
        f"rank {s.rank}'s data loader on {s.host}" if s.phase == "data_wait" else f"rank {s.rank}'s compute on {s.host}"
    )


def _straggler_wait(e: Evidence) -> str:
    if not e.stragglers:
        return "the ranks wait for slower ones in their collectives: balance the work and data per rank"
    ranked = sorted(e.stragglers, key=lambda s: -s.tax_gpu_seconds)
    names = "; ".join(f"{_straggler_name(s)} (x{s.factor:.1f} from step {s.first_step})" for s in ranked[:3])
    return f"fix the straggler: {names}; the other ranks wait for it (see gpufleet diagnose)"


def _data_wait(e: Evidence) -> str:
    fix = "feed the data loader: more workers, prefetch, stage the data on local disk (data.sources)"
    if not e.data_wait_by_rank:
        return fix
    rank = max(range(len(e.data_wait_by_rank)), key=lambda r: e.data_wait_by_rank[r])
    return f"{fix}; rank {rank} waits most for its data ({number(e.data_wait_by_rank[rank])} s)"


def _checkpoint(e: Evidence) -> str:
    ways = []
    if not e.async_save:
        ways.append("save asynchronously (checkpoint.async: true)")
    if not e.memory_tier:
        ways.append("snapshot to RAM (checkpoint.memory)")
    if e.recommended_seconds is not None and (e.interval_seconds or math.inf) < e.recommended_seconds:
        ways.append(f"save less often (every {e.recommended_seconds:.0f} s, Daly's interval)")
    how = ", ".join(ways) if ways else "write less state per save"
    return f"shorten the save{_s(e.save_seconds, 'a save')}: {how}"


def _lost(e: Evidence) -> str:
    today = f", today {e.interval_seconds:.0f} s" if e.interval_seconds is not None else ""
    at = (
        f"checkpoint at Daly's interval ({e.recommended_seconds:.0f} s{today})"
        if e.recommended_seconds is not None
        else "checkpoint more often (checkpoint.every: auto)"
    )
    tier = "" if e.memory_tier else "; a memory tier (checkpoint.memory) makes frequent saves cheap"
    return f"{at}, so a preemption redoes less work{tier}"


def _restore(e: Evidence) -> str:
    tier = "restore from RAM (checkpoint.memory: own or a peer's copy before disk)" if not e.memory_tier else ""
    return f"{tier or 'restore less state'}{_s(e.restore_seconds, 'a restore')}; warm start the restart"


def _startup(e: Evidence) -> str:
    return (
        f"warm start{_s(e.startup_seconds, 'a start')}: keep the environment and compiled kernels cached on "
        "the node, do less before the first step" + ("; a memory tier (checkpoint.memory)" if not e.memory_tier else "")
    )


def _rollback(e: Evidence) -> str:
    times = f"{e.rollbacks} rollback(s)" if e.rollbacks else "rollbacks"
    return (
        f"{times} redid steps: find why steps were unhealthy (learning rate, gradient clipping, bad batches: "
        "gpufleet show JOB); a shorter checkpoint interval shortens what a rollback redoes"
    )


REMEDIES: Mapping[str, Callable[[Evidence], str]] = {
    "queued": lambda e: (
        "start the processes sooner once the GPUs are granted: a cached image and environment "
        "on the nodes, less set-up in the batch script"
    ),
    "startup": _startup,
    "staging": lambda e: "stage less before the first step: keep the data cached on the node between attempts",
    "data_wait": _data_wait,
    "straggler_wait": _straggler_wait,
    "checkpoint": _checkpoint,
    "restore": _restore,
    "lost": _lost,
    "rollback": _rollback,
    "resize": lambda e: (
        "resharding onto another world size: resize less often, or let the group step on "
        "short-handed (distributed.recovery: continue)"
    ),
    "idle": lambda e: "release the GPUs when training ends: exit promptly after the last step",
}
"""The remedy of each badput bucket, as data: one function of the job's evidence each."""


def recoverable(usages: Sequence[GoodputAttempt], prices: Mapping[int, float], evidence: Evidence) -> list[Recovery]:
    """The job's badput buckets with any GPU time in them, most GPU-seconds first (money breaks a tie)."""
    seconds = dict.fromkeys(GOODPUT_BUCKETS, 0.0)
    money: dict[str, float | None] = dict.fromkeys(GOODPUT_BUCKETS, 0.0)
    for usage in usages:
        price = prices.get(usage.attempt)
        for bucket, wall in usage.goodput_seconds().items():
            if bucket not in seconds or not math.isfinite(wall) or wall <= 0:
                continue
            gpu_s = wall * max(0, usage.gpus)
            seconds[bucket] += gpu_s
            spent = money[bucket]
            money[bucket] = None if spent is None or price is None else spent + gpu_s / 3600.0 * price
    out = [
        Recovery(b, seconds[b], money[b], REMEDIES[b](evidence))
        for b in GOODPUT_BUCKETS
        if b != GOODPUT and seconds[b] > 0
    ]
    return sorted(out, key=lambda r: (-r.gpu_seconds, -(r.money or 0.0)))


def attempt_prices(usages: Iterable[AttemptUsage], rates: RateCard) -> dict[int, float]:
    """Attempt -> its price of a GPU-hour, for the attempts the card (or their offer) prices."""
    out: dict[int, float] = {}
    for usage in usages:
        price = attempt_price(usage, rates)
        if price is not None and math.isfinite(price) and price >= 0:
            out[usage.attempt] = price
    return out


def flat_events(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The runtime's events as the lines of ``events.jsonl`` read (``kind``, ``ts``, ``attempt`` and the data)."""
    return [{**e.data, "kind": e.kind, "ts": e.ts, "attempt": e.attempt} for e in events if e.source == "runtime"]


def rank_evidence(events: Sequence[Mapping[str, Any]]) -> tuple[tuple[Straggler, ...], tuple[float, ...]]:
    """The stragglers a job's events named, and each rank's data wait summed over its attempts."""
    totals = [t["data_wait"] for t in phase_totals(events).values() if "data_wait" in t]
    width = max((len(t) for t in totals), default=0)
    by_rank = tuple(math.fsum(t[r] for t in totals if r < len(t)) for r in range(width))
    return tuple(stragglers(events)), by_rank


__all__ = [
    "REMEDIES",
    "Evidence",
    "GoodputAttempt",
    "Recovery",
    "attempt_price",
    "attempt_prices",
    "flat_events",
    "rank_evidence",
    "recoverable",
]
