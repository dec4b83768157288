"""A loss that is not finite at the first step, before any update, points at the initialisation.

No checkpoint precedes step 1, and saving more often cannot make one: the hint names the model's
initialisation (an uninitialised tensor, as ``torch.empty`` or ``to_empty`` leaves one) and the first
batch. A NaN later in a run that had no checkpoint yet keeps the hint to save more often.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpufleet.errors import HealthError
from gpufleet.runtime import TrainSession
from gpufleet.spec import CheckpointPolicy


def train(ckpt_dir: Path, model: torch.nn.Module, nan_at: int | None = None) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.ones(4, 2)
    policy = CheckpointPolicy(every_steps=100)
    with TrainSession(ckpt_dir=ckpt_dir, model=model, optimizer=optimizer, total_steps=10, policy=policy) as s:
        for step in s.steps():
            loss = model(data).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            s.report(loss.detach() * (float("nan") if step + 1 == nan_at else 1.0))


def test_a_nan_from_an_uninitialised_model_names_the_initialisation(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(float("nan"))  # what uninitialised memory can hold
    with pytest.raises(HealthError) as err:
        train(tmp_path / "ckpt", model)
    text = str(err.value)
    assert text.startswith("step 1 is unhealthy before any update of the model"), text
    assert "initialisation" in text and "`torch.empty`" in text and "first batch" in text
    assert "save more often" not in text


def test_a_later_nan_without_a_checkpoint_still_says_to_save_more_often(tmp_path: Path) -> None:
    with pytest.raises(HealthError, match=r"^step 3 is unhealthy and no healthy checkpoint precedes it; save more"):
        train(tmp_path / "ckpt", torch.nn.Linear(2, 1), nan_at=3)
