"""A resume that changes what a step means says so: global batch and total steps, before and after.

A script with a per-rank batch and a ``DistributedSampler`` (``ResumableLoader``) trains on 2
ranks under torchrun and is preempted; resumed by one process, its global batch halves and its
epochs, so ``total_steps``, double. The resumed session names both numbers of each in a
``run_changed`` event and on stdout, and trains on. A checkpoint written before the run's shape
was recorded still loads, silently.

Run as a script (``python -m torch.distributed.run --nproc-per-node=2 test_global_batch.py ROOT``)
this file is one rank of the 2-rank run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from gpufleet.jobs.events import EventKind, EventLog, read_events
from gpufleet.runtime import CheckpointDir, Preempted, ResumableLoader, TrainSession
from gpufleet.runtime.group import Group, current_group
from gpufleet.runtime.state import RunShape, run_change
from gpufleet.spec import CheckpointPolicy

EXAMPLES, PER_RANK, EPOCHS, PREEMPT_AT = 64, 4, 2, 6


def train(root: Path, group: Group, *, preempt_at: int | None = None, total_steps: int | None = None) -> TrainSession:
    """The script: a per-rank batch, a ``DistributedSampler`` over the group's ranks, 2 epochs."""
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(EXAMPLES, 5, generator=g), torch.randint(0, 2, (EXAMPLES,), generator=g))
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, num_replicas=group.world_size, rank=group.rank, seed=2
    )
    loader = ResumableLoader(data, batch_size=PER_RANK, sampler=sampler, seed=0)
    torch.manual_seed(0)
    # Not wrapped in DDP: the same parameter names on 2 ranks and on 1 (what is checked here is the data).
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    session = TrainSession(
        ckpt_dir=root / "ckpt",
        model=net,
        optimizer=opt,
        total_steps=total_steps or loader.steps(epochs=EPOCHS),
        policy=CheckpointPolicy(every_steps=4),
        events=EventLog(root / "events.jsonl", attempt=1 if group.distributed else 2) if group.is_main else None,
        job="gb",
        group=group,
    )
    session.inject_preempt_at = preempt_at
    with session as s:
        for _, (x, y) in loader.over(s):
            loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            s.report(loss)
    return session


def run_changes(root: Path) -> list[dict[str, object]]:
    events, _ = read_events(root / "events.jsonl")
    return [e for e in events if e["kind"] == EventKind.RUN_CHANGED]


def test_two_ranks_resumed_by_one_process_announce_the_halved_global_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__]
    with (tmp_path / "torchrun.log").open("w") as log:
        proc = subprocess.run([*argv, str(tmp_path)], stdout=log, stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode != 0, (tmp_path / "torchrun.log").read_text()[-3000:]  # both ranks exit 75
    (saved,) = [i for i in CheckpointDir(tmp_path / "ckpt").scan() if i.step == PREEMPT_AT]
    assert saved.manifest is not None and saved.manifest.world_size == 2

    capsys.readouterr()
    session = train(tmp_path, Group())
    out = capsys.readouterr().out
    assert session.step == 2 * EXAMPLES // PER_RANK  # trained on, to the new total
    (event,) = run_changes(tmp_path)
    assert (event["old_world_size"], event["world_size"]) == (2, 1)
    assert (event["old_global_batch"], event["global_batch"]) == (8, 4)
    assert (event["old_total_steps"], event["total_steps"]) == (16, 32)
    assert (event["step"], event["data_position"]) == (PREEMPT_AT, PREEMPT_AT)
    line = (
        "gpufleet: resumed on 1 rank (the checkpoint's run had 2): global batch 8 -> 4, total steps 16 -> 32; "
        "data position 6 now reads as epoch 0, batch 6 of 16 (it was epoch 0, batch 6 of 8). "
        "To keep the run as it was, make per-rank batch x ranks (x micro-batches) 8 again"
    )
    assert line in out.splitlines(), out


def test_the_same_shape_is_silent_and_an_older_checkpoint_loads(tmp_path: Path) -> None:
    """Resumed as it was written: no event. A checkpoint without the recorded shape: loads, nothing to compare."""
    with pytest.raises(Preempted):
        train(tmp_path, Group(), preempt_at=PREEMPT_AT)
    ckpts = CheckpointDir(tmp_path / "ckpt")
    manifest, state = ckpts.load(tmp_path / "ckpt" / f"step-{PREEMPT_AT:08d}")
    assert state["trainer"]["run"] == RunShape(1, 4, 32, 16).to_state()
    with pytest.raises(Preempted):
        train(tmp_path, Group(), preempt_at=PREEMPT_AT + 2)
    assert run_changes(tmp_path) == []

    del state["trainer"]["run"]  # as written before the shape was recorded
    shutil.rmtree(tmp_path / "ckpt")
    CheckpointDir(tmp_path / "ckpt").save(
        PREEMPT_AT, state, data_position=PREEMPT_AT, job="gb", fingerprint=manifest.fingerprint
    )
    session = train(tmp_path, Group(), total_steps=40)
    assert session.step == 40 and run_changes(tmp_path) == []


def test_a_changed_total_alone_is_announced_and_unknown_batches_are_not_compared() -> None:
    saved = RunShape(2, None, 100)
    change = run_change(saved, RunShape(2, 64, 200), 10)
    assert (
        change is not None
        and change["message"] == "resumed on 2 ranks (the checkpoint's run had 2): total steps 100 -> 200"
    )
    assert run_change(saved, RunShape(1, None, 100), 10) is None  # a global batch sliced by rank: nothing changed
    grown = run_change(RunShape(2, 6, 10), RunShape(4, 12, 10), 3)
    assert grown is not None and "data position 3 now counts batches of another size" in str(grown["message"])
    assert RunShape.from_state(None) is None and RunShape.from_state({"world_size": "2"}) is None


if __name__ == "__main__":  # one rank of the 2-rank run
    train(Path(sys.argv[1]), current_group(), preempt_at=PREEMPT_AT)
