"""One rank of a TrainSession test under torchrun (``test_distributed_session.py`` starts 2 of these).

``python dist_session_worker.py MODE ROOT [AGREE_EVERY]``: a small replicated model trains 12 steps of two
accumulated micro-batches (random batches, as scripts draw them) with a
``TrainSession`` whose checkpoints go to ``ROOT/ckpt`` (every 4 steps) and whose events rank 0
writes to ``ROOT/events.jsonl``. ``MODE`` is what happens on rank 1 only:

- ``nan``: rank 1's second micro-batch loss at step 6 is NaN (the other rank's are finite);
- ``signal``: rank 1 sends itself SIGTERM during step 7;
- ``slow``: rank 1 takes 60 ms longer than rank 0 at every step (a straggler);
- ``noparams``: the session is given a model without parameters (and no optimizer);
- ``plain``: nothing.

``AGREE_EVERY`` (default 1) is the session's steps per agreement of the ranks.

Each rank writes ``ROOT/rank-<r>.json`` (its step, data position and rollbacks) when its session
ends, however it ends, and, having torn its process group down, how many native threads it still
runs (``native_threads``; gloo's workers must be gone before the interpreter finalises).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from gpufleet.runtime import EventLog, TrainSession
from gpufleet.runtime import group as group_module
from gpufleet.runtime.group import current_group
from gpufleet.spec import CheckpointPolicy, HealthPolicy


def main(mode: str, root: Path, agree_every: int = 1) -> None:
    group = current_group()
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if mode == "noparams":
        model = torch.nn.ReLU()
    events = EventLog(root / "events.jsonl") if group.is_main else None
    session = TrainSession(
        ckpt_dir=root / "ckpt",
        model=model,
        optimizer=None if mode == "noparams" else optimizer,
        total_steps=12,
        policy=CheckpointPolicy(every_steps=4, keep=5),
        health=HealthPolicy(action="rollback", window=200, min_history=100),  # NaN, not spikes
        events=events,
        log_every_s=0.0,
        job="dist-test",
        group=group,
        agree_every=agree_every,
    )
    try:
        with session:
            for step in session.steps():
                optimizer.zero_grad()
                losses = []
                for _ in range(2):  # gradient accumulation over two micro-batches
                    loss = model(torch.randn(4, 4)).pow(2).mean() / 2
                    loss.backward()
                    losses.append(float(loss) * 2)
                optimizer.step()
                if group.rank == 1 and step == 5 and mode == "nan" and session.rollbacks == 0:
                    losses[1] = float("nan")
                if group.rank == 1 and mode == "slow":
                    time.sleep(0.06)
                if group.rank == 1 and step == 6 and mode == "signal":
                    os.kill(os.getpid(), signal.SIGTERM)
                session.report(losses)
    finally:
        out = {"step": session.step, "data_position": session.data_position, "rollbacks": session.rollbacks}
        if group.distributed and sys.platform == "linux":  # the teardown gpufleet registers at exit, run now
            group_module._destroy()
            out["native_threads"] = len(os.listdir("/proc/self/task")) - threading.active_count()
        (root / f"rank-{group.rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1)
