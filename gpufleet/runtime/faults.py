"""Injected faults, to see recovery happen: ``GPUFLEET_FAULT="nan@150,inf@220"``.

A fault is tied to a *data position* (the batch), not to a step: like the bad batches PaLM met,
it strikes again if training replays that batch and disappears once the batch is skipped.
The loss is poisoned before ``backward``, so the gradients and then the weights really go bad
and the rollback has real damage to undo.

``oom@N`` raises ``torch.OutOfMemoryError`` (what the CUDA caching allocator raises) at that
batch instead, with the allocator's message, so the attempt dies the way an out-of-memory job
does and the fleet report's OOM count can be checked on a CPU machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from gpufleet.errors import UsageError

_FAULT_RE = re.compile(r"^(nan|inf|spike|oom)@(\d+)$")


@dataclass(frozen=True, slots=True)
class FaultPlan:
    faults: dict[int, str]

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        faults: dict[int, str] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            match = _FAULT_RE.match(item)
            if not match:
                raise UsageError(
                    f"invalid fault {item!r}: use KIND@STEP with KIND nan, inf, spike or oom (e.g. nan@150)"
                )
            faults[int(match.group(2))] = match.group(1)
        return cls(faults)

    def apply(self, loss: torch.Tensor, data_position: int) -> torch.Tensor:
        import torch

        kind = self.faults.get(data_position)
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
