"""A toy job for smoke tests of a backend: a linear regression that takes a set time per step.

``gpufleet.workloads.toy:train`` exercises everything a backend must get right (checkpoints,
preemption, requeue, resume) in seconds, with no data and a model of a few parameters.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from gpufleet.errors import ParameterError
from gpufleet.jobs.faults import FaultPlan
from gpufleet.runtime import TrainSession
from gpufleet.workloads import check_seed


def train(steps: int = 50, step_seconds: float = 0.02, seed: int = 0, exit_code: int = 0) -> dict[str, Any]:
    """Fit y = 3x - 1 by SGD; sleep ``step_seconds`` a step; exit with ``exit_code`` at the end."""
    torch.manual_seed(check_seed(seed))
    if not 0 <= step_seconds <= 3600:  # NaN too
        raise ParameterError("{step_seconds} is out of range: give seconds from 0 to 3600", step_seconds=step_seconds)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    faults = FaultPlan.parse(os.environ.get("GPUFLEET_FAULT", ""))
    with TrainSession.from_env(model=model, optimizer=optimizer, total_steps=steps) as sess:
        for _ in sess.steps():
            g = torch.Generator().manual_seed(seed * 100_003 + sess.data_position)
            x = torch.randn(16, 1, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), 3 * x - 1)
            loss = faults.apply(loss, sess.data_position)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            time.sleep(step_seconds)
            sess.report(loss)
    if exit_code:
        raise SystemExit(exit_code)
    return {"steps": sess.step, "weight": model.weight.item()}


__all__ = ["train"]
