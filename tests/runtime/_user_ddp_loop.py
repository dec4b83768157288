"""A data-parallel training script written the way people write them, wrapped in ``TrainSession``.

``python _user_ddp_loop.py [--steps 60] [--hidden 1024] [--micro-batch 64] [--data-ms 6] [--eval-every 20]``
under torchrun (``gpufleet submit`` with ``resources: {gpus: 2}``, ``distributed: {strategy: ddp}``, or
``python -m torch.distributed.run --nproc-per-node=2``). Its own ``init_process_group``, a small MLP in
``DistributedDataParallel``, random batches from its own seeded generator (a pure function of the data
position, so a restore needs nothing else), gradient accumulation over two micro-batches (the first under
``no_sync``), a periodic evaluation whose loss the ranks average, and ``s.report`` of both micro-batch
losses at every step.

Producing a micro-batch also waits ``--data-ms`` milliseconds (reading and decoding, as a loader does), so
the data wait is a real share of a step. Faults come from the environment, on one rank only:

- ``SLOW_RANK=R SLOW_FROM=S SLOW_KIND=compute SLOW_FACTOR=F``: from step ``S`` on, each forward of rank
  ``R`` also computes (busy, not asleep) for ``(F - 1)`` times that rank's own forward and backward of a
  micro-batch (measured on the steps before ``S``, on the first micro-batch, which does not communicate),
  so its compute takes about ``F`` times as long;
- ``SLOW_KIND=data``: from step ``S`` on, rank ``R``'s micro-batches take ``F`` times as long to produce.

A slowdown only strikes in attempt 1 (``$GPUFLEET_ATTEMPT``): a requeued run trains at full speed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from gpufleet.runtime import TrainSession

SEED = 20261205
FEATURES = 64
CLASSES = 10


class Slowdown:
    """The injected fault of this rank: extra compute in forward, or a slower data producer."""

    def __init__(self, rank: int) -> None:
        env = os.environ
        first_attempt = env.get("GPUFLEET_ATTEMPT", "1") == "1"
        self.kind = env.get("SLOW_KIND", "compute")
        self.factor = float(env.get("SLOW_FACTOR", "1.5"))
        self.start = int(env.get("SLOW_FROM", "31"))
        self.mine = first_attempt and env.get("SLOW_RANK") is not None and int(env["SLOW_RANK"]) == rank
        self.compute_s: list[float] = []
        """This rank's compute time of each step before the slowdown: the step without producing the data, the
        optimizer and the all-reduce (the second micro-batch counted as long as the first, which does not
        communicate)."""
        self.step = 0

    def active(self, kind: str) -> bool:
        return self.mine and self.kind == kind and self.step >= self.start

    def extra_compute_s(self) -> float:
        """What each of a step's two forwards adds: ``(factor - 1)`` times this rank's forward and backward of a
        micro-batch (the first one's, which does not communicate)."""
        if not self.active("compute") or not self.compute_s:
            return 0.0
        return (self.factor - 1.0) * statistics.median(self.compute_s[-50:])

    def data_factor(self) -> float:
        return self.factor if self.active("data") else 1.0


def spin(seconds: float) -> None:
    """Keep the CPU busy for ``seconds`` (compute, not a sleep: a frozen GPU kernel is not idle either)."""
    until = time.perf_counter() + seconds
    x = torch.ones(64, 64)
    while time.perf_counter() < until:
        x = torch.tanh(x @ x * 1e-3)


class Net(torch.nn.Module):
    def __init__(self, hidden: int, slowdown: Slowdown) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, hidden),
            torch.nn.GELU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.GELU(),
            torch.nn.Linear(hidden, CLASSES),
        )
        self.slowdown = slowdown

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = self.slowdown.extra_compute_s()
        if extra > 0 and self.training:
            spin(extra)
        out: torch.Tensor = self.body(x)
        return out


def micro_batch(position: int, rank: int, world: int, size: int, data_s: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch ``position``'s share of this rank: a pure function of the position, as a resumable loader's."""
    gen = torch.Generator().manual_seed(SEED + position * world + rank)
    x = torch.randn(size, FEATURES, generator=gen)
    y = (x[:, :CLASSES].argmax(dim=1) + torch.randint(0, 2, (size,), generator=gen)) % CLASSES
    time.sleep(data_s)  # reading and decoding
    return x, y


def batches(
    start: int, rank: int, world: int, size: int, data_ms: float, slowdown: Slowdown
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    position = start
    while True:
        yield micro_batch(position, rank, world, size, data_ms / 1000.0 * slowdown.data_factor())
        position += 1


def evaluate(model: torch.nn.Module, size: int) -> float:
    """The loss on a held-out batch, averaged over the ranks."""
    gen = torch.Generator().manual_seed(SEED - 1)
    x = torch.randn(size, FEATURES, generator=gen)
    y = x[:, :CLASSES].argmax(dim=1)
    model.eval()
    with torch.no_grad():
        loss = F.cross_entropy(model(x), y)
    model.train()
    dist.all_reduce(loss)
    return float(loss) / dist.get_world_size()


def train(args: argparse.Namespace) -> None:
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)  # every rank starts from the same weights
    slowdown = Slowdown(rank)
    net = Net(args.hidden, slowdown)
    model = DDP(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with TrainSession.from_env(model=model, optimizer=optimizer, total_steps=args.steps) as s:
        data, expected = None, -1
        for step in s.steps():
            slowdown.step = step
            if step > 0 and s.due("eval", every=args.eval_every):
                s.log("eval", val_loss=evaluate(model, args.micro_batch))
            if data is None or s.data_position != expected:  # the first step, or after a restore or rollback
                data = batches(s.data_position, rank, world, args.micro_batch, args.data_ms, slowdown)
            optimizer.zero_grad(set_to_none=True)
            losses, fetch_s, micro_s = [], 0.0, [0.0, 0.0]
            for micro in range(2):
                fetching = time.perf_counter()
                x, y = next(data)
                started = time.perf_counter()
                fetch_s += started - fetching
                with model.no_sync() if micro == 0 else contextlib.nullcontext():
                    loss = F.cross_entropy(model(x), y) / 2
                    loss.backward()  # type: ignore[no-untyped-call]
                micro_s[micro] = time.perf_counter() - started
                losses.append(loss.detach() * 2)
            optimizer.step()
            if step < slowdown.start:  # the forward and backward of a micro-batch, without an all-reduce
                slowdown.compute_s.append(micro_s[0])
            s.report(losses, tokens=2 * args.micro_batch)
            expected = s.data_position
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description="a small DDP MLP with gradient accumulation")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps (default 60)")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden width of the MLP (default 1024)")
    parser.add_argument("--micro-batch", type=int, default=64, help="rows of a micro-batch per rank (default 64)")
    parser.add_argument("--data-ms", type=float, default=6.0, help="milliseconds to produce a micro-batch")
    parser.add_argument("--eval-every", type=int, default=20, help="steps between evaluations (default 20)")
    train(parser.parse_args())


if __name__ == "__main__":
    main()
