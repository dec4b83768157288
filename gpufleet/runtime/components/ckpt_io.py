"""Reading and writing one checkpoint of a session's objects: the mechanism, without policy or clock.

What a checkpoint holds (the stateful objects by name and the plain values, :func:`state_registry`),
how one is written (one ``torch.save`` file, or every rank's DCP shards committed by rank 0), how the
one to restore is found, loaded and checked against the model. When and why to save, and what the
loop makes of a restore, belong to ``checkpointer.CheckpointManager``, the only caller.

Imports: ``runtime.checkpoint``, ``runtime.dist_state``, ``runtime.group``, ``runtime.state``, and
``runtime.sharded`` lazily (torch's distributed checkpoint takes most of a second to import).
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from gpufleet.errors import CheckpointError, SpecError
from gpufleet.runtime.checkpoint import (
    CheckpointDir,
    CheckpointInfo,
    CheckpointManifest,
    Expectation,
    state_dict_mismatch,
)
from gpufleet.runtime.dist_state import apply_dcp_state, dcp_state, dcp_template, strategy_of
from gpufleet.runtime.group import Group
from gpufleet.runtime.state import capture_rng, is_plain

Candidate = tuple[CheckpointInfo | None, CheckpointManifest | None, dict[str, Any] | None, list[CheckpointInfo]]
"""The checkpoint to load, its manifest, its state (``None``: sharded, loaded by every rank), those passed over."""

RESERVED_NAMES = frozenset({"trainer"})
"""Entries of a checkpoint that no stateful object or value may take."""


class Stateful(Protocol):
    def state_dict(self) -> Any: ...
    def load_state_dict(self, state: Any, /) -> Any: ...


def state_registry(
    model: Stateful, optimizer: Stateful | None, scheduler: Stateful | None, extra: Mapping[str, Any] | None
) -> tuple[dict[str, Stateful], dict[str, Any]]:
    """What every checkpoint holds: the stateful objects by name, and the plain values of ``extra``."""
    objects: dict[str, Stateful] = {"model": model}
    if optimizer is not None:
        objects["optimizer"] = optimizer
    if scheduler is not None:
        objects["scheduler"] = scheduler
    values: dict[str, Any] = {}
    for name, obj in (extra or {}).items():
        if name in objects or name in RESERVED_NAMES:
            raise ValueError(f"extra state name {name!r} is reserved")
        if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
            objects[name] = obj
        elif is_plain(obj):
            values[name] = obj
        else:
            raise ValueError(
                f"extra[{name!r}] is a {type(obj).__name__}: give an object with state_dict/load_state_dict, "
                "or a plain value (number, string, tensor, or lists and dicts of them)"
            )
    return objects, values


def staged(value: Any) -> Any:
    """A copy of a state that training can no longer change: tensors cloned, containers rebuilt.

    What an asynchronous save writes while the loop goes on updating the weights and the
    optimizer in place (a DTensor clones its local shard and keeps its placement).
    """
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, io.BytesIO):
        return io.BytesIO(value.getvalue())
    if isinstance(value, dict):
        return {key: staged(item) for key, item in value.items()}
    if isinstance(value, list):
        return [staged(item) for item in value]
    if isinstance(value, tuple):
        return tuple(staged(item) for item in value)
    return copy.deepcopy(value)


def _local(value: Any) -> Any:
    """This rank's part of a sharded tensor (a DTensor's local shard); anything else as it is."""
    to_local = getattr(value, "to_local", None)
    return to_local() if callable(to_local) else value


def named_state(objects: Mapping[str, Stateful]) -> Iterator[tuple[str, Any]]:
    """Every tensor of the model and the optimizer state, named for a message."""
    for name, obj in objects.items():
        if name == "model":
            yield from ((f"model.{key}", _local(value)) for key, value in obj.state_dict().items())
        elif name == "optimizer":
            state = getattr(obj, "state", None)
            if isinstance(state, Mapping):
                for index, per_param in enumerate(state.values()):
                    if isinstance(per_param, Mapping):
                        yield from ((f"optimizer.state.{index}.{k}", _local(v)) for k, v in per_param.items())


def check_values(values: Mapping[str, Any]) -> None:
    """Only plain values can be saved: anything else is named with the way out."""
    for name, value in values.items():
        if not is_plain(value):
            raise CheckpointError(
                f"values[{name!r}] is a {type(value).__name__}: only numbers, strings, tensors and lists or "
                "dicts of them are saved; convert it, or pass an object with state_dict/load_state_dict"
            )


def check_strategy(model: Stateful, group: Group, strategy: str | None) -> None:
    """``distributed.strategy: fsdp`` on a model without parameters shards nothing: say so, do not train."""
    parameters = getattr(model, "parameters", None)
    if strategy != "fsdp" or not group.distributed or not callable(parameters):
        return
    if not any(True for _ in parameters()):
        raise SpecError(
            f"distributed.strategy is fsdp, but the {type(model).__name__} given to TrainSession has no "
            "parameters to shard: give the model with its parameters, or use strategy ddp or none"
        )


def checkpoint_write(
    ckpts: CheckpointDir,
    group: Group,
    objects: Mapping[str, Stateful],
    step: int,
    trainer: dict[str, Any],
    fields: dict[str, Any],
    *,
    background: Group | None = None,
) -> Callable[[], CheckpointManifest]:
    """The write of one checkpoint, its state captured now; ``background``: copied, written through that group.

    A group's ranks each write their shards and rank 0 commits the manifest; one process writes
    one file. A background write prunes once committed; a synchronous one after its event.
    """
    if group.distributed:
        from gpufleet.runtime.sharded import save_sharded  # torch.distributed.checkpoint: 0.7 s to import

        state, rank_state = dcp_state(objects, trainer), {"rng": capture_rng()}
        strategy = strategy_of(objects["model"])
        if background is not None:
            state, rank_state = staged(state), staged(rank_state)
        through = background or group
        return lambda: save_sharded(ckpts, through, step, state, rank_state, strategy=strategy, **fields)
    plain: dict[str, Any] = {name: obj.state_dict() for name, obj in objects.items()}
    plain["trainer"] = {**trainer, "rng": capture_rng()}
    if background is not None:
        plain = staged(plain)

    def write() -> CheckpointManifest:
        manifest = ckpts.save(step, plain, **fields)
        if background is not None:
            with contextlib.suppress(OSError, CheckpointError):
                ckpts.prune()
        return manifest

    return write


def find_candidate(
    ckpts: CheckpointDir, group: Group, objects: Mapping[str, Stateful], job: str | None, before_step: int | None
) -> Candidate:
    """Collective in a group: the newest restorable checkpoint of ``job`` (below ``before_step``)."""
    if not group.distributed:
        expect = Expectation(job=job, objects=frozenset([*objects, "trainer"]))
        # A sharded checkpoint loads here too: a job cut down to one process reshards it.
        return ckpts.restore_candidate(before_step=before_step, expect=expect, formats=("torch", "dcp"))
    from gpufleet.runtime.sharded import sharded_candidate

    info, manifest, skipped = sharded_candidate(ckpts, group, before_step=before_step, expect=Expectation(job=job))
    single = [
        bad
        for bad in skipped
        if bad.manifest is not None
        and bad.manifest.format != "dcp"
        and bad.manifest.healthy
        and (job is None or bad.manifest.job in (None, job))
    ]
    if single and (info is None or single[0].step > info.step):
        # Starting over (or from an older sharded one) would silently throw that progress away.
        raise CheckpointError(
            f"{single[0].path.name} (step {single[0].step}) was written by a single process (torch format), "
            f"which a group of {group.world_size} ranks cannot reshard: resume the job with one rank "
            "(resources.gpus: 1, no distributed block), or start over with resume: never in a fresh "
            "checkpoint directory"
        )
    return info, manifest, None, skipped


def load_objects(path: Path, objects: Mapping[str, Stateful], state: Mapping[str, Any]) -> None:
    """Load every object from a verified single-process checkpoint; one that does not fit is named."""
    for name, obj in objects.items():
        try:
            obj.load_state_dict(state[name])
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{path} does not fit this run's {name}: {str(err).splitlines()[0][:300]}; "
                "start over with resume: never in a fresh checkpoint directory"
            ) from None


def load_sharded_state(
    ckpts: CheckpointDir,
    group: Group,
    objects: Mapping[str, Stateful],
    path: Path,
    manifest: CheckpointManifest,
    fingerprint: str | None,
) -> tuple[dict[str, Any], Any]:
    """Collective: every rank loads its part of a sharded checkpoint (resharded when the world size changed).

    Returns the trainer state and this rank's RNG states (``None``: written by another world size).
    """
    if manifest.fingerprint is not None and manifest.fingerprint != fingerprint:
        raise CheckpointError(
            f"{path} does not fit the model: it was written for another architecture; start over with "
            "resume: never in a fresh checkpoint directory, or restore the old model"
        )
    from gpufleet.runtime.sharded import load_sharded

    state = dcp_template(objects)
    try:
        rank_state = load_sharded(ckpts, group, path, state)
        trainer = apply_dcp_state(objects, state)
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"{path} does not fit this run: {str(err).splitlines()[0][:300]}; "
            "start over with resume: never in a fresh checkpoint directory"
        ) from None
    return trainer, (rank_state or {}).get("rng")


def check_fits(
    path: Path, model: Stateful, fingerprint: str | None, saved: str | None, state: Mapping[str, Any]
) -> None:
    """A checkpoint of this job written for another model shape is an error, not a silent fallback."""
    if saved is None or saved == fingerprint:
        return
    mismatch = state_dict_mismatch(state["model"], model.state_dict())
    raise CheckpointError(
        f"{path} does not fit the model: {mismatch}; the model changed since it was written: "
        "start over with resume: never in a fresh checkpoint directory, or restore the old model"
    )


__all__ = [
    "RESERVED_NAMES",
    "Candidate",
    "Stateful",
    "check_fits",
    "check_strategy",
    "check_values",
    "checkpoint_write",
    "find_candidate",
    "load_objects",
    "load_sharded_state",
    "named_state",
    "staged",
    "state_registry",
]
