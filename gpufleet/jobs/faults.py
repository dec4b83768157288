"""Injected faults, to see recovery happen: ``GPUFLEET_FAULT="nan@150,inf@220"``.

A fault is tied to a *data position* (the batch), not to a step: like the bad batches PaLM met,
it strikes again if training replays that batch and disappears once the batch is skipped.
The loss is poisoned before ``backward``, so the gradients and then the weights really go bad
and the rollback has real damage to undo.

``oom@N`` raises ``torch.OutOfMemoryError`` (what the CUDA caching allocator raises) at that
batch instead, with the allocator's message, so the attempt dies the way an out-of-memory job
does and the fleet report's OOM count can be checked on a CPU machine.

``hang@N`` makes the process stop stepping at that batch (it sleeps until it is killed): the
stuck rank of a distributed job, which the other ranks' watchdogs name and the group timeout
ends. It strikes in the job's first attempt only, as a wedged process or link that a restart
clears, so the requeued attempt trains on.

``:rR`` after a fault limits it to rank ``R`` of a distributed job (``nan@40:r1``: only rank 1's
loss goes bad, and every rank rolls back together); without it every rank is hit.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from gpufleet.errors import UsageError

_FAULT_RE = re.compile(r"^(nan|inf|spike|oom|hang)@(\d+)(?::r(\d+))?$")
HANG_SECONDS = 24 * 3600.0
"""How long ``hang`` sleeps: longer than any group timeout, so the watchdog and the timeout end it."""


@dataclass(frozen=True, slots=True)
class FaultPlan:
    faults: dict[int, str]
    ranks: dict[int, int] | None = None
    """Data position -> the only rank its fault strikes (absent: every rank)."""

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        faults: dict[int, str] = {}
        ranks: dict[int, int] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            match = _FAULT_RE.match(item)
            if not match:
                raise UsageError(
                    f"invalid fault {item!r}: use KIND@STEP[:rRANK] with KIND nan, inf, spike, oom or hang "
                    "(e.g. nan@150, or hang@40:r1 for rank 1 only)"
                )
            faults[int(match.group(2))] = match.group(1)
            if match.group(3) is not None:
                ranks[int(match.group(2))] = int(match.group(3))
        return cls(faults, ranks or None)

    def apply(self, loss: torch.Tensor, data_position: int, rank: int = 0) -> torch.Tensor:
        import torch

        kind = self.faults.get(data_position)
        if kind is not None and self.ranks is not None and self.ranks.get(data_position, rank) != rank:
            return loss
        if kind == "hang":
            if (os.environ.get("GPUFLEET_ATTEMPT") or "1") == "1":
                print(f"gpufleet: rank {rank} hangs at batch {data_position} (GPUFLEET_FAULT)", flush=True)
                time.sleep(HANG_SECONDS)
            return loss
        if kind == "nan":
            return loss * float("nan")
        if kind == "inf":
            return loss * float("inf")
        if kind == "spike":
            return loss * 50.0
        if kind == "oom":
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 20.00 GiB (injected by GPUFLEET_FAULT oom@{data_position})"
            )
        return loss


__all__ = ["HANG_SECONDS", "FaultPlan"]
