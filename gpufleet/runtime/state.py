"""Capture and restore every source of randomness, so a resumed run is bit-identical.

Python's ``random`` state is a tuple of ints (accepted by ``torch.load(weights_only=True)``);
numpy's legacy global state holds an ndarray, which ``weights_only`` refuses, so its key is stored
as a tensor; torch's CPU generator (and CUDA's, when present) is a byte tensor.
"""

from __future__ import annotations

import random
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


__all__ = ["capture_rng", "hyperparameter_changes", "is_plain", "restore_rng"]
