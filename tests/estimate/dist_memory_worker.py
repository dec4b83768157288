"""One rank of the estimator check (test_memory.py starts 2 under torchrun): `dist_memory_worker.py STRATEGY OUT`.

Builds the tiny LM, wraps it (``ddp``: DistributedDataParallel; ``fsdp``: FSDP2 per block then the
whole model), takes one AdamW step on this rank's rows of a batch, and measures the bytes this
rank holds: its parameters, gradients and Adam moments (a DTensor counts its local shard only).
Rank 0 writes every rank's bytes to ``OUT`` as JSON, with the model's parameter count.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from gpufleet.runtime.group import current_group
from gpufleet.workloads import tinylm


def local_bytes(t: Any) -> int:
    part = t.to_local() if callable(getattr(t, "to_local", None)) else t
    return int(part.numel() * part.element_size())


def main(strategy: str, out: Path) -> None:
    group = current_group()
    corpus, model, _, _ = tinylm.build(seed=1, context=64, layers=2, heads=4, embed=128, dropout=0.1, lr=3e-3, steps=10)
    params_total = model.num_params()
    if strategy == "fsdp":
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        wrapped: torch.nn.Module = model  # fully_shard shards it in place
    else:
        wrapped = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=3e-3)
    x, y = corpus.batch("train", 0, 4, 64, seed=1)
    _, loss = wrapped(x[group.rank :: group.world_size], y[group.rank :: group.world_size])
    loss.backward()
    optimizer.step()
    params = list(wrapped.parameters())
    mine = {
        "params": sum(local_bytes(p) for p in params),
        "grads": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "moments": sum(local_bytes(optimizer.state[p][k]) for p in params for k in ("exp_avg", "exp_avg_sq")),
    }
    every = group.gather(mine)
    if group.is_main:
        out.write_text(json.dumps({"params": params_total, "ranks": every}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
