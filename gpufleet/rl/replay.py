"""A replay buffer of transitions, uniform or prioritized, whose whole contents are checkpointed.

Transitions are rows of preallocated tensors (a ring of ``capacity`` rows): observation, action,
reward, next observation, done, and the policy version that produced it (what policy lag is measured
from). Prioritized sampling follows Schaul et al. 2016 ("Prioritized Experience Replay"): row ``i`` is
drawn with probability ``p_i^alpha / sum p^alpha`` and weighted by ``(N * P(i))^-beta / max w``; new
rows get the largest priority seen so far. The sum is recomputed over the filled rows at each draw
(``torch.multinomial``), which is simple and exact and costs microseconds at the sizes a CPU loop uses.

``state_dict`` is the buffer itself (the tensors, cut to the filled rows, and the counters), so a job
resumed from a checkpoint samples from the very transitions it had; ``load_state_dict`` checks the
layout (capacity, observation size, prioritized or not) before it changes anything.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class Batch:
    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    dones: torch.Tensor
    versions: torch.Tensor
    indices: torch.Tensor
    weights: torch.Tensor


class ReplayBuffer:
    def __init__(
        self, capacity: int, obs_dim: int, *, prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4
    ) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity={capacity} must be at least 1 transition")
        if obs_dim < 1:
            raise ValueError(f"obs_dim={obs_dim} must be at least 1")
        self.capacity, self.obs_dim, self.prioritized = capacity, obs_dim, prioritized
        self.alpha, self.beta = alpha, beta
        self.obs = torch.zeros(capacity, obs_dim)
        self.next_obs = torch.zeros(capacity, obs_dim)
        self.actions = torch.zeros(capacity, dtype=torch.int64)
        self.rewards = torch.zeros(capacity)
        self.dones = torch.zeros(capacity)
        self.versions = torch.zeros(capacity, dtype=torch.int64)
        self.priorities = torch.zeros(capacity)
        self.position = 0
        self.size = 0
        self.added = 0
        """Transitions added since the start (the buffer keeps the newest ``capacity``)."""
        self.max_priority = 1.0

    def __len__(self) -> int:
        return self.size

    def add(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        next_obs: torch.Tensor,
        dones: torch.Tensor,
        versions: torch.Tensor,
    ) -> None:
        """Append ``n`` transitions (rows of each tensor), overwriting the oldest when full."""
        n = int(obs.shape[0])
        if obs.shape != (n, self.obs_dim) or next_obs.shape != (n, self.obs_dim):
            raise ValueError(f"observations of shape {tuple(obs.shape)} do not match obs_dim={self.obs_dim}")
        for start in range(0, n, self.capacity):
            part = slice(start, min(n, start + self.capacity))
            count = part.stop - part.start
            rows = (torch.arange(count) + self.position) % self.capacity
            self.obs[rows] = obs[part].float()
            self.next_obs[rows] = next_obs[part].float()
            self.actions[rows] = actions[part].long()
            self.rewards[rows] = rewards[part].float()
            self.dones[rows] = dones[part].float()
            self.versions[rows] = versions[part].long()
            self.priorities[rows] = self.max_priority
            self.position = int((self.position + count) % self.capacity)
            self.size = min(self.capacity, self.size + count)
            self.added += count

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        if batch_size > self.capacity:
            raise ValueError(
                f"batch_size={batch_size} is larger than the buffer's capacity={self.capacity}: "
                "raise the capacity or lower the batch"
            )
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if self.prioritized:
            probs = self.priorities[: self.size] ** self.alpha
            probs = probs / probs.sum()
            indices = torch.multinomial(probs, batch_size, replacement=True, generator=generator)
            weights = (self.size * probs[indices]) ** (-self.beta)
            weights = weights / weights.max()
        else:
            indices = torch.randint(self.size, (batch_size,), generator=generator)
            weights = torch.ones(batch_size)
        return Batch(
            obs=self.obs[indices],
            actions=self.actions[indices],
            rewards=self.rewards[indices],
            next_obs=self.next_obs[indices],
            dones=self.dones[indices],
            versions=self.versions[indices],
            indices=indices,
            weights=weights,
        )

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        if not self.prioritized:
            return
        priorities = td_errors.detach().abs().float() + 1e-6
        self.priorities[indices] = priorities
        self.max_priority = max(self.max_priority, float(priorities.max()))

    def digest(self) -> str:
        """SHA-256 of the filled rows and the counters: equal for equal contents."""
        return _digest(self.state_dict())

    # -- checkpointing --------------------------------------------------------------------------

    def layout(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "obs_dim": self.obs_dim, "prioritized": self.prioritized}

    def state_dict(self) -> dict[str, Any]:
        n = self.size
        return {
            "layout": self.layout(),
            "obs": self.obs[:n].clone(),
            "next_obs": self.next_obs[:n].clone(),
            "actions": self.actions[:n].clone(),
            "rewards": self.rewards[:n].clone(),
            "dones": self.dones[:n].clone(),
            "versions": self.versions[:n].clone(),
            "priorities": self.priorities[:n].clone(),
            "counters": torch.tensor([self.position, self.size, self.added], dtype=torch.int64),
            "max_priority": torch.tensor(self.max_priority, dtype=torch.float64),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot; ``ValueError`` naming the difference for another layout, with nothing changed."""
        layout = state.get("layout")
        if layout != self.layout():
            raise ValueError(
                f"replay buffer snapshot has layout {layout}, this buffer {self.layout()}: resume with the same "
                "buffer_capacity, observation size and prioritized setting, or start the job afresh"
            )
        position, size, added = (int(x) for x in state["counters"].tolist())
        if not 0 <= size <= self.capacity or not 0 <= position < self.capacity or added < size:
            raise ValueError(f"replay buffer snapshot has inconsistent counters {position, size, added}")
        columns = ("obs", "next_obs", "actions", "rewards", "dones", "versions", "priorities")
        for name in columns:
            if int(state[name].shape[0]) != size:
                raise ValueError(f"replay buffer snapshot: {name} has {state[name].shape[0]} rows, not {size}")
        for name in columns:
            getattr(self, name)[:size] = state[name]
        self.position, self.size, self.added = position, size, added
        self.max_priority = float(state["max_priority"])


RETURNS_KEPT = 100
"""Episode returns an :class:`Experience` keeps: the window of the "mean return over 100 episodes"."""


@dataclass(frozen=True, slots=True)
class Stats:
    """What a learner reads of an :class:`Experience` between updates (sent whole across processes)."""

    env_steps: int
    episodes: int
    size: int
    capacity: int
    returns: tuple[float, ...]

    @property
    def mean_return(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else 0.0


class Experience:
    """A :class:`ReplayBuffer` with the counts a learner reports, and the generator it samples with.

    Environment steps are the transitions ever added (``buffer.added``); the episodes finished and the
    last :data:`RETURNS_KEPT` returns arrive with the transitions that ended them. ``state_dict`` is the
    buffer's plus those counts, so a checkpoint's buffer and its counts always agree; ``load_state_dict``
    checks everything before it changes anything.
    """

    def __init__(self, buffer: ReplayBuffer, seed: int = 0) -> None:
        self.buffer = buffer
        self.episodes = 0
        self.returns: deque[float] = deque(maxlen=RETURNS_KEPT)
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.buffer)

    @property
    def env_steps(self) -> int:
        return self.buffer.added

    def stats(self) -> Stats:
        b = self.buffer
        return Stats(b.added, self.episodes, len(b), b.capacity, tuple(self.returns))

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def add(self, rows: Mapping[str, Any], returns: Sequence[float]) -> Stats:
        """Add transitions (tensors or numpy arrays by column) and the returns of the episodes they ended."""
        t = {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v)) for k, v in rows.items()}
        self.buffer.add(t["obs"], t["actions"], t["rewards"], t["next_obs"], t["dones"], t["versions"])
        self.episodes += len(returns)
        self.returns.extend(float(r) for r in returns)
        return self.stats()

    def sample(self, batch_size: int) -> Batch:
        return self.buffer.sample(batch_size, self.generator)

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        self.buffer.update_priorities(indices, td_errors)

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.buffer.state_dict(),
            "episodes": torch.tensor(self.episodes, dtype=torch.int64),
            "returns": torch.tensor(list(self.returns), dtype=torch.float64),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        episodes, returns = state.get("episodes"), state.get("returns")
        if not isinstance(episodes, torch.Tensor) or not isinstance(returns, torch.Tensor) or returns.dim() != 1:
            raise ValueError("replay snapshot has no episode counts: it was not saved by an Experience")
        if int(episodes) < 0 or int(returns.shape[0]) > RETURNS_KEPT:
            raise ValueError(f"replay snapshot has inconsistent episode counts ({int(episodes)}, {returns.shape[0]})")
        self.buffer.load_state_dict(state)  # checks its own part before it changes anything
        self.episodes = int(episodes)
        self.returns = deque((float(r) for r in returns.tolist()), maxlen=RETURNS_KEPT)

    def close(self) -> None:
        """Nothing to release here (the Ray actor's proxy stops the actor)."""

    def digest(self) -> str:
        """SHA-256 of the buffer's rows and counters and the episode counts: equal for equal contents."""
        return _digest(self.state_dict())


def _digest(state: Mapping[str, Any]) -> str:
    h = hashlib.sha256()
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            h.update(name.encode())
            h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()


__all__ = ["RETURNS_KEPT", "Batch", "Experience", "ReplayBuffer", "Stats"]
