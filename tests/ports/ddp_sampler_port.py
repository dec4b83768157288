"""A DDP training script with a ``DistributedSampler``, ported to ``TrainSession`` the way docs/porting.md says.

Written the way the DDP tutorial's ``multigpu_torchrun.py`` is: its own ``init_process_group`` from
torchrun's environment, a ``Trainer`` class, a ``DataLoader`` over a ``DistributedSampler`` with
``set_epoch`` every epoch, ``DistributedDataParallel``, rank 0's own ``torch.save`` of the model at
the end and ``destroy_process_group()`` as the last line of ``main()``. The port removed the
script's own snapshot loading and put ``TrainSession.from_env`` around the loop; a restore moves
the loader to ``s.data_position`` (its epoch, then the batches already trained in it).

``python ddp_sampler_port.py TOTAL_EPOCHS [--batch_size N] [--samples N] [--snapshot_path PATH]
[--loader resumable]`` (``resumable``: the loop over ``ResumableLoader`` instead)
under torchrun (``gpufleet submit`` with ``resources: {gpus: 2}``, ``distributed: {strategy: ddp}``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from gpufleet.runtime import ResumableLoader, TrainSession


def ddp_setup() -> None:
    init_process_group(backend="gloo")  # CPU; the tutorial's "nccl" on GPUs


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data: DataLoader[Any], optimizer: torch.optim.Optimizer) -> None:
        self.rank = int(os.environ["RANK"])
        self.train_data = train_data
        self.optimizer = optimizer
        self.model = DDP(model)

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        return loss.detach()

    def _batches(self, position: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches from ``position`` on: its epoch (``set_epoch``), minus the batches trained in it."""
        epoch, skip = divmod(position, len(self.train_data))
        while True:
            self.train_data.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            for index, (source, targets) in enumerate(self.train_data):
                if index >= skip:
                    yield source, targets
            epoch, skip = epoch + 1, 0

    def train(self, max_epochs: int) -> None:
        total = max_epochs * len(self.train_data)
        with TrainSession.from_env(model=self.model, optimizer=self.optimizer, total_steps=total) as s:
            batches, expected = None, -1
            for _ in s.steps():
                if batches is None or s.data_position != expected:  # first step, or a restore or rollback
                    batches = self._batches(s.data_position)
                source, targets = next(batches)
                s.report(self._run_batch(source, targets), tokens=source.shape[0])
                expected = s.data_position

    def save(self, snapshot_path: str) -> None:
        if self.rank == 0:
            torch.save(self.model.module.state_dict(), snapshot_path)
            print(f"Training snapshot saved at {snapshot_path}")


class ResumableTrainer(Trainer):
    """``--loader resumable``: the same loop over ``ResumableLoader`` (docs/porting.md's recipe for a sampler)."""

    def train(self, max_epochs: int) -> None:
        loader = ResumableLoader(
            self.train_data.dataset, batch_size=self.train_data.batch_size or 1, sampler=self.train_data.sampler
        )
        total = loader.steps(epochs=max_epochs)
        with TrainSession.from_env(model=self.model, optimizer=self.optimizer, total_steps=total) as s:
            for _, (source, targets) in loader.over(s):
                s.report(self._run_batch(source, targets), tokens=source.shape[0])


def load_train_objs(samples: int) -> tuple[Dataset[tuple[torch.Tensor, ...]], torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # every rank builds the same model and data
    train_set = TensorDataset(torch.rand(samples, 20), torch.rand(samples, 1))
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset[tuple[torch.Tensor, ...]], batch_size: int) -> DataLoader[Any]:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset))


def main(
    total_epochs: int, batch_size: int, samples: int, snapshot_path: str = "snapshot.pt", loader: str = "dataloader"
) -> None:
    ddp_setup()
    dataset, model, optimizer = load_train_objs(samples)
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = (ResumableTrainer if loader == "resumable" else Trainer)(model, train_data, optimizer)
    trainer.train(total_epochs)
    trainer.save(snapshot_path)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device (default: 32)")
    parser.add_argument("--samples", default=1024, type=int, help="Rows of the random dataset (default: 1024)")
    parser.add_argument("--snapshot_path", default="snapshot.pt", help="Where rank 0 saves the final model")
    parser.add_argument(
        "--loader", default="dataloader", choices=("dataloader", "resumable"), help="resumable: ResumableLoader"
    )
    args = parser.parse_args()

    main(args.total_epochs, args.batch_size, args.samples, args.snapshot_path, args.loader)
