"""Capture and restore every source of randomness, so a resumed run is bit-identical.

Python's ``random`` state is a tuple of ints (accepted by ``torch.load(weights_only=True)``);
numpy's legacy global state holds an ndarray, which ``weights_only`` refuses, so its key is stored
as a tensor; torch's CPU generator (and CUDA's, when present) is a byte tensor.

Beside the RNG, what a resumed run compares with the checkpoint's so that nothing changes
silently: the optimizer's settings (:func:`hyperparameter_changes`) and what one step and the
whole run mean (:class:`RunShape`, :func:`run_change`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    kind, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": str(kind),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    key = n["key"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], key, n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    """``random.setstate`` needs tuples; a round trip may hand back lists."""
    if isinstance(value, list):
        return tuple(_as_tuple(v) for v in value)
    return value


def is_plain(value: Any) -> bool:
    """What ``torch.load(weights_only=True)`` gives back as it was: scalars, strings, tensors, containers."""
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and is_plain(v) for k, v in value.items())
    return False


def hyperparameter_changes(saved: Any, current: Any) -> list[str]:
    """Optimizer settings the checkpoint will silently restore over this run's (``lr`` aside: schedules move it)."""
    try:
        old_groups, new_groups = saved["param_groups"], current["param_groups"]
    except (KeyError, TypeError):
        return []
    changes = []
    for i, (old, new) in enumerate(zip(old_groups, new_groups, strict=False)):
        for key in sorted(set(old) & set(new) - {"params", "lr"}):
            a, b = old[key], new[key]
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                continue
            if a != b and not (isinstance(a, float) and isinstance(b, float) and a != a and b != b):
                group = f" (group {i})" if len(new_groups) > 1 else ""
                changes.append(f"{key}={a!r} in the checkpoint, {b!r} in this run{group}")
    return changes


@dataclass(frozen=True, slots=True)
class RunShape:
    """What one step and the whole run mean: recorded in every checkpoint's trainer state (``run``)."""

    world_size: int
    global_batch: int | None = None
    """Examples a step reads over all ranks, when the script said (``TrainSession.note_data``)."""
    total_steps: int | None = None
    epoch_batches: int | None = None
    """Data positions per epoch, when the script said."""

    def to_state(self) -> dict[str, int | None]:
        return {
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "total_steps": self.total_steps,
            "epoch_batches": self.epoch_batches,
        }

    @classmethod
    def from_state(cls, value: Any) -> RunShape | None:
        """The shape a checkpoint recorded; ``None`` for one written before it was recorded (or unreadable)."""
        if not isinstance(value, Mapping):
            return None
        world = _count(value.get("world_size"))
        if world is None:
            return None
        return cls(
            world,
            _count(value.get("global_batch")),
            _count(value.get("total_steps")),
            _count(value.get("epoch_batches")),
        )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def run_change(saved: RunShape, now: RunShape, data_position: int) -> dict[str, Any] | None:
    """The fields of a ``run_changed`` event, message included, or ``None`` when the run means what it meant.

    A resume changes the run when its global batch differs from the checkpoint's (a per-rank batch
    on another world size) or its ``total_steps`` do. The data position, a count of batches, then
    points elsewhere in the data; the message says where, so that nobody reads a changed run as the
    one that was started.
    """
    batch_changed = (
        saved.global_batch is not None and now.global_batch is not None and saved.global_batch != now.global_batch
    )
    steps_changed = (
        saved.total_steps is not None and now.total_steps is not None and saved.total_steps != now.total_steps
    )
    if not batch_changed and not steps_changed:
        return None
    ranks = f"{now.world_size} rank{'s' if now.world_size != 1 else ''}"
    parts = []
    if batch_changed:
        parts.append(f"global batch {saved.global_batch} -> {now.global_batch}")
    if steps_changed:
        parts.append(f"total steps {saved.total_steps} -> {now.total_steps}")
    message = f"resumed on {ranks} (the checkpoint's run had {saved.world_size}): {', '.join(parts)}"
    if batch_changed:
        message += (
            f"; {_where(data_position, saved, now)}. To keep the run as it was, make per-rank batch x ranks "
            f"(x micro-batches) {saved.global_batch} again"
        )
    return {
        "message": message,
        "data_position": data_position,
        "old_world_size": saved.world_size,
        "world_size": now.world_size,
        "old_global_batch": saved.global_batch,
        "global_batch": now.global_batch,
        "old_total_steps": saved.total_steps,
        "total_steps": now.total_steps,
    }


def _where(position: int, saved: RunShape, now: RunShape) -> str:
    """Where data position ``position`` points now, and where it pointed in the checkpoint's run."""
    if not (saved.epoch_batches and now.epoch_batches):
        return f"data position {position} now counts batches of another size"
    epoch, batch = divmod(position, now.epoch_batches)
    old_epoch, old_batch = divmod(position, saved.epoch_batches)
    return (
        f"data position {position} now reads as epoch {epoch}, batch {batch} of {now.epoch_batches} "
        f"(it was epoch {old_epoch}, batch {old_batch} of {saved.epoch_batches})"
    )


__all__ = ["RunShape", "capture_rng", "hyperparameter_changes", "is_plain", "restore_rng", "run_change"]
