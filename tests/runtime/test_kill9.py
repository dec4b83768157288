"""``kill -9`` at random moments, in training and in saving: restore always finds a valid checkpoint.

15 trials by default; ``GPUFLEET_KILL_TRIALS=200`` (``make soak``) runs 200. Children are forked
from a fork server that imported torch but never ran a parallel region, so each trial costs
milliseconds, not an interpreter start.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from gpufleet.runtime import CheckpointDir, TrainSession
from gpufleet.spec import CheckpointPolicy

TRIALS = int(os.environ.get("GPUFLEET_KILL_TRIALS", "15"))


class Marker:
    """A state whose every element must equal the step it was saved at: a torn save would show."""

    def __init__(self) -> None:
        self.value = torch.zeros(512, 1024)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.value = state["value"].clone()


def train_forever(ckpt_dir: str, started: Any) -> None:
    torch.set_num_threads(1)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.Adam(model.parameters())
    marker = Marker()
    policy = CheckpointPolicy(every_steps=1, keep=2)
    with TrainSession(
        ckpt_dir=ckpt_dir, model=model, optimizer=optimizer, extra={"marker": marker}, policy=policy
    ) as s:
        started.set()
        for _ in s.steps():
            x = torch.randn(32, 256)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            marker.value.fill_(float(s.step + 1))
            time.sleep(random.random() * 0.01)
            s.report(loss)


def check(ckpt_dir: Path, previous: int) -> int:
    ckpts = CheckpointDir(ckpt_dir)
    info, _ = ckpts.latest()
    assert info is not None, "no restorable checkpoint after a kill"
    manifest, state = ckpts.load(info.path)
    step = state["trainer"]["step"]
    assert manifest.step == step == info.step
    assert bool((state["marker"]["value"] == float(step)).all()), f"torn state at step {step}"
    assert step >= previous, "restore went backwards"
    return int(step)


@pytest.mark.timeout(600)
def test_kill_minus_nine_never_leaves_an_unrestorable_directory(tmp_path: Path) -> None:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "gpufleet.runtime"])
    rng = random.Random(9)
    ckpt_dir = tmp_path / "ckpt"
    step, saves_hit = 0, 0
    for trial in range(TRIALS):
        started = ctx.Event()
        child = ctx.Process(target=train_forever, args=(str(ckpt_dir), started))
        child.start()
        assert started.wait(60), "child did not start"
        time.sleep(0.02 + rng.random() * 0.25)
        if any(ckpt_dir.glob(".tmp-step-*")):
            saves_hit += 1  # the kill most likely lands inside a save
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
        if trial == 0 and not any(ckpt_dir.glob("step-*")):
            continue
        step = check(ckpt_dir, step)
    assert step > TRIALS, "training made no progress across kills"
    assert saves_hit > 0, "no kill landed during a save; the test would prove nothing"
