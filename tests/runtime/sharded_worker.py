"""One rank of a test of sharded checkpoints (``test_sharded.py`` starts N of these, gloo on CPU).

``python sharded_worker.py save ROOT DUMP`` trains a small MLP sharded with FSDP2 (``fully_shard``)
and the same MLP under DDP, each with Adam, and saves each at steps 3 and 5 with ``save_sharded``
into ``ROOT/fsdp`` and ``ROOT/ddp``; rank 0 writes the full tensors saved (parameters, optimizer
state, the trainer blob, every rank's ``rank_state``) to ``DUMP``, per kind and step.

``python sharded_worker.py load ROOT OUT KIND[,KIND]`` builds fresh models (other weights) on this
world size, restores the newest checkpoint of each kind with ``sharded_candidate`` and
``load_sharded``, and rank 0 writes what was restored, as full tensors, to ``OUT``.

Rank and world size come from ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.
"""

from __future__ import annotations

import gc
import io
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from gpufleet.runtime.checkpoint import CheckpointDir
from gpufleet.runtime.group import Group, current_group, import_world_defaults
from gpufleet.runtime.sharded import load_sharded, save_sharded, sharded_candidate

KINDS = ("fsdp", "ddp")


def mlp(seed: int) -> torch.nn.Sequential:
    """Layer sizes not divisible by 4: resharding onto 4 ranks shards unevenly."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))


def wrap(model: torch.nn.Sequential, kind: str, group: Group) -> torch.nn.Module:
    """``kind`` on ``group``; a group of one (no process group) keeps the plain model."""
    if not group.distributed:
        return model
    if kind == "fsdp":
        fully_shard(model[0])
        fully_shard(model[2])
        fully_shard(model)
        return model
    return DistributedDataParallel(model)


def full(value: Any) -> Any:
    """A state value with every sharded tensor gathered (``DTensor.full_tensor``, collective)."""
    if isinstance(value, dict):
        return {k: full(v) for k, v in value.items()}
    if isinstance(value, list):
        return [full(v) for v in value]
    if isinstance(value, torch.Tensor):
        to_full = getattr(value, "full_tensor", None)
        return (to_full() if callable(to_full) else value).detach().clone()
    return value


def blob(value: Any) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


def unblob(value: Any) -> Any:
    assert isinstance(value, io.BytesIO), type(value)
    value.seek(0)
    return torch.load(value, weights_only=True)


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, [optimizer])
    groups: Any = optim_sd["param_groups"]
    return {"model": full(model_sd), "optimizer": full(optim_sd["state"]), "lr": groups[0]["lr"]}


def save(root: Path, dump: Path, group: Group) -> None:
    saved: dict[str, Any] = {}
    for kind in KINDS:
        model = wrap(mlp(0), kind, group)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        ckpts = CheckpointDir(root / kind, keep=5)
        saved[kind] = {}
        for step in range(1, 6):
            generator = torch.Generator().manual_seed(100 * step + group.rank)  # each rank its own batch
            x = torch.randn(4, 8, generator=generator)
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step not in (3, 5):
                continue
            model_sd, optim_sd = get_state_dict(model, [optimizer])
            noise = torch.randn(5, generator=torch.Generator().manual_seed(1000 * step + group.rank))
            rank_state = {"rank": group.rank, "step": step, "noise": noise, "rng": torch.get_rng_state()}
            state = {"model": model_sd, "optimizer": optim_sd, "trainer": blob({"step": step, "data_position": step})}
            manifest = save_sharded(
                ckpts,
                group,
                step,
                state,
                rank_state,
                healthy=True,
                loss=0.5,
                data_position=step,
                reason="periodic",
                meta={"attempt": 1},
                job="7",
                fingerprint=None,
                metrics={},
                strategy=kind,
            )
            assert manifest.format == "dcp" and manifest.world_size == group.world_size, manifest
            saved[kind][step] = {**snapshot(model, optimizer), "rank_states": group.gather(rank_state)}
    if group.is_main:
        torch.save(saved, dump)


def load(root: Path, out: Path, kinds: list[str], group: Group) -> None:
    restored: dict[str, Any] = {}
    for kind in kinds:
        model = wrap(mlp(1), kind, group)  # other weights than those saved
        optimizer = torch.optim.Adam(model.parameters(), lr=5e-2)
        ckpts = CheckpointDir(root / kind)
        info, manifest, skipped = sharded_candidate(ckpts, group, before_step=None, expect=None)
        assert info is not None and manifest is not None, [s.problem for s in skipped]
        model_sd, optim_sd = get_state_dict(model, [optimizer])
        state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd, "trainer": io.BytesIO()}
        rank_state = load_sharded(ckpts, group, info.path, state)
        set_state_dict(model, [optimizer], model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        restored[kind] = {
            **snapshot(model, optimizer),
            "step": info.step,
            "trainer": unblob(state["trainer"]),
            "rank_states": group.gather(rank_state),
            "skipped": [s.problem for s in skipped],
        }
    if group.is_main:
        torch.save(restored, out)


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    import_world_defaults()  # as the runtime does: no module default holds the world group past its end
    dist.init_process_group("gloo", timeout=timedelta(seconds=90))
    group = current_group()
    try:
        if argv[0] == "save":
            save(Path(argv[1]), Path(argv[2]), group)
        else:
            load(Path(argv[1]), Path(argv[2]), argv[3].split(","), group)
        group.barrier()
    finally:
        dist.destroy_process_group()
        gc.collect()  # DDP's and FSDP's reference cycles hold the group: free it while the interpreter is whole


if __name__ == "__main__":
    main(sys.argv[1:])
