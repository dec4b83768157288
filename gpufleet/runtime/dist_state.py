"""A distributed job's state as ``torch.distributed.checkpoint`` (DCP) saves and loads it.

The model and the optimizer go through PyTorch's ``get_state_dict``/``set_state_dict``, which
know DDP (one replica, saved once) and FSDP2 (each rank's shards as DTensors), so DCP can load a
checkpoint into another world size. Everything else the session saves (a learning-rate
scheduler, stateful extras, the trainer's step, data position and health history) is the same on
every rank and of a shape only known when it is read back, so each goes in as one serialized
blob (``io.BytesIO``, which DCP stores as bytes and loads in place) read back with
``torch.load(weights_only=True)``. What differs per rank (the RNG states) is the rank's own file,
outside DCP (:mod:`gpufleet.runtime.sharded`).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, Protocol

import torch

MODEL, OPTIMIZER, TRAINER = "model", "optimizer", "trainer"


class Stateful(Protocol):
    def state_dict(self) -> Any: ...
    def load_state_dict(self, state: Any, /) -> Any: ...


def _blob(value: Any) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


def _unblob(buffer: Any, what: str) -> Any:
    if not isinstance(buffer, io.BytesIO):
        raise TypeError(f"{what} was not read back as bytes")
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _module_and_optimizer(objects: Mapping[str, Stateful]) -> tuple[torch.nn.Module, list[torch.optim.Optimizer]]:
    model = objects[MODEL]
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"a distributed job's model must be a torch.nn.Module, not {type(model).__name__}")
    optimizer = objects.get(OPTIMIZER)
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"a distributed job's optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}"
        )
    return model, [optimizer] if optimizer is not None else []


def dcp_state(objects: Mapping[str, Stateful], trainer: Mapping[str, Any]) -> dict[str, Any]:
    """What to hand DCP's save: sharded model and optimizer, every other object and the trainer as blobs."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizers = _module_and_optimizer(objects)
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state: dict[str, Any] = {MODEL: model_sd, TRAINER: _blob(dict(trainer))}
    if optimizers:
        state[OPTIMIZER] = optim_sd
    for name, obj in objects.items():
        if name not in (MODEL, OPTIMIZER):
            state[name] = _blob(obj.state_dict())
    return state


def dcp_template(objects: Mapping[str, Stateful]) -> dict[str, Any]:
    """What DCP's load fills in place: this run's sharded model and optimizer, empty blobs for the rest."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizers = _module_and_optimizer(objects)
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state: dict[str, Any] = {MODEL: model_sd, TRAINER: io.BytesIO()}
    if optimizers:
        state[OPTIMIZER] = optim_sd
    for name in objects:
        if name not in (MODEL, OPTIMIZER):
            state[name] = io.BytesIO()
    return state


def apply_dcp_state(objects: Mapping[str, Stateful], state: Mapping[str, Any]) -> dict[str, Any]:
    """Load what DCP read into the objects; the trainer's entries."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model, optimizers = _module_and_optimizer(objects)
    set_state_dict(
        model,
        optimizers,
        model_state_dict=state[MODEL],
        optim_state_dict=state.get(OPTIMIZER, {}),
    )
    for name, obj in objects.items():
        if name not in (MODEL, OPTIMIZER):
            obj.load_state_dict(_unblob(state[name], name))
    trainer = _unblob(state[TRAINER], TRAINER)
    if not isinstance(trainer, dict):
        raise TypeError("the trainer state was not read back as a dict")
    return trainer


def strategy_of(model: Any) -> str:
    """``fsdp`` for a model sharded with ``fully_shard``, ``ddp`` for a ``DistributedDataParallel``, else ``none``."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, FSDPModule):
        return "fsdp"
    if isinstance(model, DistributedDataParallel):
        return "ddp"
    return "none"


def reseeded_rng(step: int, rank: int) -> None:
    """Seed every generator from the step and the rank: a resume on another world size has no saved RNG per rank."""
    import random

    import numpy as np

    seed = (step * 1_000_003 + rank) % (2**31)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


__all__ = ["Stateful", "apply_dcp_state", "dcp_state", "dcp_template", "reseeded_rng", "strategy_of"]
