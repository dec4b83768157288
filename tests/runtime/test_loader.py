"""``ResumableLoader``: a loop with dropout and a ``DistributedSampler``, preempted mid-epoch, is bit-exact.

The same loop written the plain way (``set_epoch``, then skip ``data_position % len(loader)``
batches of a ``DataLoader`` without a generator of its own) is not: each resume draws the
loader's base seed from the global RNG once more, and every later dropout mask moves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Collection, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, TensorDataset

from gpufleet.errors import ParameterError
from gpufleet.jobs.events import EventLog
from gpufleet.jobs.faults import FaultPlan
from gpufleet.runtime import CheckpointDir, Preempted, ResumableLoader, TrainSession
from gpufleet.spec import CheckpointPolicy

PORT = Path(__file__).resolve().parents[1] / "ports" / "ddp_sampler_port.py"

EXAMPLES, BATCH, EPOCHS = 80, 8, 3  # 2 replicas: 40 examples a rank, 5 batches an epoch, 15 steps


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(EXAMPLES, 6, generator=g)
    y = torch.randint(0, 3, (EXAMPLES,), generator=g)
    return TensorDataset(x, y, torch.arange(EXAMPLES))


def sampler(data: Dataset[Any]) -> DistributedSampler[Any]:
    """Rank 0 of 2, given explicitly: no process group needed."""
    return DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=3)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.5), torch.nn.ReLU(), torch.nn.Linear(16, 3))


Batches = Callable[[TrainSession], Iterator[tuple[int, Any]]]


def with_helper() -> tuple[Batches, int]:
    loader = ResumableLoader(dataset(), batch_size=BATCH, sampler=sampler(dataset()), seed=0)
    return loader.over, loader.steps(epochs=EPOCHS)


def plain_recipe() -> tuple[Batches, int]:
    """``set_epoch(epoch)`` and skip ``s.data_position % len(loader)`` batches after a restore."""
    data = dataset()
    order = sampler(data)
    loader = DataLoader(data, batch_size=BATCH, sampler=order)

    def batches(s: TrainSession) -> Iterator[tuple[int, Any]]:
        total = s.total_steps or 0
        while s.step < total:
            epoch, skip = divmod(s.data_position, len(loader))
            order.set_epoch(epoch)
            for i, batch in enumerate(loader):
                if i < skip:
                    continue
                yield s.step, batch
                if s.step >= total:
                    break

    return batches, EPOCHS * len(loader)


def train(
    ckpt: Path,
    recipe: Callable[[], tuple[Batches, int]],
    *,
    preempt_after: Collection[int] = (),
    **inject: int,
) -> tuple[dict[str, torch.Tensor], list[tuple[int, list[int]]]]:
    """Attempts until one completes, each as a new process would be: a fresh model, optimizer and loader.

    SIGTERM arrives after each step in ``preempt_after`` (once each). Returns the final weights
    and, per step trained, the data position and the example ids it read.
    """
    pending, seen = set(preempt_after), list[tuple[int, list[int]]]()
    faults = FaultPlan.parse(os.environ.get("GPUFLEET_FAULT", ""))
    while True:
        net = model()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        batches, total = recipe()
        session = TrainSession(
            ckpt_dir=ckpt,
            model=net,
            optimizer=opt,
            total_steps=total,
            policy=CheckpointPolicy(every_steps=4),
            events=EventLog(None),
            echo=False,
        )
        for key, value in inject.items():
            setattr(session, key, value)
        try:
            with session as s:
                for _, (x, y, ids) in batches(s):
                    loss = faults.apply(torch.nn.functional.cross_entropy(net(x), y), s.data_position)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()  # type: ignore[no-untyped-call]
                    opt.step()
                    seen.append((s.data_position, ids.tolist()))
                    s.report(loss)
                    if s.step in pending:
                        pending.discard(s.step)
                        os.kill(os.getpid(), signal.SIGTERM)
            return {k: v.clone() for k, v in net.state_dict().items()}, seen
        except Preempted:
            continue


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.equal(a[k], b[k])}


MID_EPOCH = {3, 8, 12}  # saved at the next step boundary: positions 4, 9 and 13 of 5-batch epochs


def test_preempted_mid_epoch_with_dropout_ends_bitwise_equal(tmp_path: Path) -> None:
    reference, _ = train(tmp_path / "a", with_helper)
    resumed, seen = train(tmp_path / "b", with_helper, preempt_after=MID_EPOCH)
    assert differing(reference, resumed) == {}
    assert [p for p, _ in seen] == list(range(EPOCHS * EXAMPLES // 2 // BATCH))  # no batch lost or repeated


def test_the_plain_dataloader_recipe_diverges_after_a_mid_epoch_resume(tmp_path: Path) -> None:
    reference, _ = train(tmp_path / "a", plain_recipe)
    resumed, seen = train(tmp_path / "b", plain_recipe, preempt_after=MID_EPOCH)
    assert [p for p, _ in seen] == list(range(EPOCHS * EXAMPLES // 2 // BATCH))  # the same batches...
    assert differing(reference, resumed)  # ...and yet other weights: the dropout masks moved


def test_a_rollback_rereads_the_right_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replayed rollback ends exact; a NaN at position 6 goes back to step 4 and reads on from position 7."""
    reference, _ = train(tmp_path / "a", with_helper)
    replayed, _ = train(tmp_path / "b", with_helper, inject_rollback_at=10)
    assert differing(reference, replayed) == {}

    monkeypatch.setenv("GPUFLEET_FAULT", "nan@6")
    _, seen = train(tmp_path / "c", with_helper)
    total = EPOCHS * EXAMPLES // 2 // BATCH
    # Positions 0-6 (6 poisoned), back to the checkpoint of step 4, then the 11 steps left from position 7 on.
    assert [p for p, _ in seen] == [*range(7), *range(7, 7 + total - 4)]
    loader = ResumableLoader(dataset(), batch_size=BATCH, sampler=sampler(dataset()), seed=0)
    ids = [batch[2].tolist() for _, batch in islice(loader.batches(0), 7 + total)]
    assert all(read == ids[p] for p, read in seen)  # each position read its own examples


def test_skipped_batches_are_never_loaded_and_the_global_rng_is_untouched() -> None:
    loaded: list[int] = []

    class Counting(Dataset[int]):
        def __len__(self) -> int:
            return 20

        def __getitem__(self, i: int) -> int:
            loaded.append(i)
            return i

    loader = ResumableLoader(Counting(), batch_size=4, shuffle=True, seed=5)
    full = [batch.tolist() for _, batch in islice(loader.batches(0), 10)]
    before = torch.get_rng_state()
    loaded.clear()
    epoch, batch = next(loader.batches(7))  # epoch 1, its batch 2
    assert (epoch, batch.tolist()) == (1, full[7]) and sorted(loaded) == sorted(full[7])
    assert torch.equal(before, torch.get_rng_state())
    assert full[:5] != full[5:]  # another order each epoch
    assert loader.locate(7) == (1, 2) and len(loader) == 5 and loader.steps(epochs=2) == 10


def test_global_batch_counts_the_replicas_and_bad_arguments_are_refused() -> None:
    data = dataset()
    loader = ResumableLoader(data, batch_size=BATCH, sampler=sampler(data), drop_last=True)
    assert (loader.global_batch, len(loader)) == (2 * BATCH, EXAMPLES // 2 // BATCH)
    with pytest.raises(ParameterError, match=r"RandomSampler.*global RNG"):
        ResumableLoader(data, batch_size=4, sampler=RandomSampler(data))
    with pytest.raises(ParameterError, match=r"'generator'=.*sets it itself"):
        ResumableLoader(data, batch_size=4, generator=torch.Generator())
    with pytest.raises(ParameterError, match="batch_size=0"):
        ResumableLoader(data, batch_size=0)
    with pytest.raises(ParameterError, match="holds no batch"):
        ResumableLoader(data, batch_size=EXAMPLES + 1, drop_last=True)


def port(root: Path, name: str, attempt: int, **env: str) -> int:
    """The DDP port on 2 ranks under torchrun, with ``--loader resumable``: torchrun's exit status."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(PORT), "2"]
    args = [
        "--batch_size",
        "8",
        "--samples",
        "96",
        "--snapshot_path",
        str(root / f"{name}.pt"),
        "--loader",
        "resumable",
    ]
    run_env = {**clean, **env, "GPUFLEET_CKPT_DIR": str(root / name), "GPUFLEET_ATTEMPT": str(attempt)}
    with (root / f"{name}-{attempt}.log").open("w") as log:
        return subprocess.run(
            [*argv, *args],
            cwd=root,
            env={**run_env, "OMP_NUM_THREADS": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=300,
        ).returncode


def test_the_ddp_port_on_two_ranks_preempted_mid_epoch_ends_bitwise_equal(tmp_path: Path) -> None:
    """6 batches an epoch on each rank, 2 epochs: preempted at step 8 (epoch 1, its batch 2), then resumed."""
    assert port(tmp_path, "whole", 1) == 0, (tmp_path / "whole-1.log").read_text()[-3000:]
    assert port(tmp_path, "cut", 1, GPUFLEET_DEBUG_PREEMPT_AT="8") != 0  # both ranks exit 75
    assert [i.step for i in CheckpointDir(tmp_path / "cut").scan()] == [8]
    assert port(tmp_path, "cut", 2) == 0, (tmp_path / "cut-2.log").read_text()[-3000:]
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    cut = torch.load(tmp_path / "cut.pt", weights_only=True)
    assert differing(whole, cut) == {}


def test_micro_batches_give_each_step_the_next_ones_and_count_in_the_global_batch(tmp_path: Path) -> None:
    data = dataset()
    loader = ResumableLoader(data, batch_size=BATCH, sampler=sampler(data))
    expected = [batch[2].tolist() for _, batch in islice(loader.batches(0), 10)]
    net = model()
    session = TrainSession(
        ckpt_dir=tmp_path, model=net, total_steps=loader.steps(epochs=2, micro_batches=2), events=EventLog(None)
    )
    read: list[list[int]] = []
    with session as s:
        for _, micro in loader.over(s, micro_batches=2):
            read.extend(ids.tolist() for _, _, ids in micro)
            s.report([net(x).square().mean() for x, _, _ in micro])  # two losses: two data positions
    assert read == expected and session.data_position == 10 and session.global_batch == 2 * 2 * BATCH
