"""The actor-learner on Ray: environment actors and the replay buffer are Ray actors, the learner drives them.

On the Ray backend (``GPUFLEET_BACKEND=ray``, or ``args.actor_backend: ray``) the learner, which is
the attempt's own process so that a preemption's SIGTERM reaches its ``TrainSession``, joins the
cluster its node belongs to (``$GPUFLEET_RAY_ADDRESS``, else ``auto``) and starts:

- one :class:`ExperienceServer`, the :class:`~gpufleet.rl.replay.Experience` as a Ray actor: the
  buffer, its counts and its sampling generator, answering one call at a time, so a checkpoint's
  snapshot (``state_dict``) is whole;
- ``actors`` :class:`EnvWorker` actors, each stepping one environment with the newest weights it
  was sent and pushing its transitions straight to the buffer actor (Ape-X's layout: the learner
  never touches a transition).

The learner keeps one ``collect`` call in flight per environment actor while the buffer is short of
the environment steps it needs (plus one push per actor, so actors do not wait on the learner), and
one ``draw`` in flight ahead of the batch it trains on, so sampling overlaps the update. Weights go
through the object store once per broadcast (``ray.put``), and each actor gets them with its next
call when its version is older. An environment actor that dies (``kill -9``, a lost node) fails its
call with ``RayActorError``: the learner starts a new one, with the newest weights, and counts it.
The buffer actor holds the job's experience: if it dies the attempt fails, and the next attempt
restores the buffer from the last checkpoint.

Every actor is owned by the learner's process (no ``detached`` lifetime): when the attempt ends, is
preempted or is killed, Ray stops its actors with it. ``actor_cpus`` is what each environment actor
reserves; the default 0 counts them in the job's own ``resources.cpus``, which the job's runner
holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from typing import Any

import torch

from gpufleet.rl.dqn import Message, Rollout, actor_seed
from gpufleet.rl.replay import Batch, Experience, ReplayBuffer, Stats

DRAWS_PER_CALL = 16
"""Batches the buffer actor draws per call: one round trip serves this many updates."""

POLL_EVERY = 8
"""Updates between two looks at the environment actors' answers, while the buffer has the steps needed."""

IN_FLIGHT = 2
"""``collect`` calls queued per environment actor: it steps the next while the last one's answer travels."""

CALL_TIMEOUT_S = 120.0
"""The longest the learner waits on one answer from the buffer actor before it gives up the attempt."""


def connect() -> Any:
    """Join the cluster this process runs in; ``ray`` once connected."""
    import ray

    if not ray.is_initialized():
        address = os.environ.get("GPUFLEET_RAY_ADDRESS", "").strip() or "auto"
        ray.init(address=address, logging_level=logging.ERROR, configure_logging=False)
    return ray


class ExperienceServer(Experience):
    """The replay buffer as a Ray actor (the class Ray starts; the learner talks to it by :class:`RemoteExperience`)."""

    def __init__(self, capacity: int, obs_dim: int, prioritized: bool) -> None:
        super().__init__(ReplayBuffer(capacity, obs_dim, prioritized=prioritized))

    def draw(self, batch_size: int, count: int) -> tuple[list[Batch], Stats]:
        return [self.sample(batch_size) for _ in range(count)], self.stats()

    def pid(self) -> int:
        return os.getpid()


class EnvWorker:
    """One environment stepped with the newest weights it was sent; its transitions go to the buffer actor."""

    def __init__(self, env_id: str, seed: int, hidden: int, replay: Any) -> None:
        torch.set_num_threads(1)
        self.rollout = Rollout(env_id, seed, hidden)
        self.replay = replay

    def pid(self) -> int:
        return os.getpid()

    def collect(
        self, steps: int, epsilon: float, version: int, weights: dict[str, torch.Tensor] | None
    ) -> tuple[int, Stats]:
        import ray

        if weights is not None:
            self.rollout.policy.load_state_dict(weights)
            self.rollout.version = version
        rows, returns = self.rollout.run(steps, epsilon)
        arrays = {k: v.numpy() for k, v in rows.items()}
        return steps, ray.get(self.replay.add.remote(arrays, returns))


class RemoteExperience:
    """The learner's side of the :class:`ExperienceServer`: the interface of an ``Experience``.

    Batches come :data:`DRAWS_PER_CALL` at a time, and the next call is sent as soon as one answers,
    so the learner seldom waits on the buffer; ``update_priorities`` does not wait at all. The counts
    are those the last answer carried.
    """

    def __init__(self, handle: Any, stats: Stats, prioritized: bool) -> None:
        self.handle, self.last, self.prioritized = handle, stats, prioritized
        self.pending: Any = None
        self.batches: deque[Batch] = deque()
        self.batch_size = 0

    @classmethod
    def start(cls, capacity: int, obs_dim: int, *, prioritized: bool) -> RemoteExperience:
        ray = connect()
        server = ray.remote(num_cpus=0, max_restarts=0)(ExperienceServer)
        handle = server.remote(capacity, obs_dim, prioritized)
        return cls(handle, ray.get(handle.stats.remote(), timeout=CALL_TIMEOUT_S), prioritized)

    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=CALL_TIMEOUT_S)

    def __len__(self) -> int:
        return self.last.size

    @property
    def env_steps(self) -> int:
        return self.last.env_steps

    def stats(self) -> Stats:
        return self.last

    def observe(self, stats: Stats) -> None:
        """Counts newer than the last seen (an environment actor's push answers with them)."""
        if stats.env_steps >= self.last.env_steps:
            self.last = stats

    def refresh(self) -> Stats:
        self.last = self._get(self.handle.stats.remote())
        return self.last

    def _forget(self) -> None:
        self.pending = None
        self.batches.clear()

    def reseed(self, seed: int) -> None:
        self._get(self.handle.reseed.remote(seed))
        self._forget()

    def sample(self, batch_size: int) -> Batch:
        if batch_size != self.batch_size:
            self._forget()
        if not self.batches:
            ref = self.pending if self.pending is not None else self.handle.draw.remote(batch_size, DRAWS_PER_CALL)
            self.pending, self.batch_size = self.handle.draw.remote(batch_size, DRAWS_PER_CALL), batch_size
            batches, stats = self._get(ref)
            self.batches.extend(batches)
            self.observe(stats)
        return self.batches.popleft()

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        if self.prioritized:
            self.handle.update_priorities.remote(indices, td_errors)

    def state_dict(self) -> dict[str, Any]:
        return self._get(self.handle.state_dict.remote())  # type: ignore[no-any-return]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._get(self.handle.load_state_dict.remote(state))
        self._forget()
        self.refresh()

    def digest(self) -> str:
        return self._get(self.handle.digest.remote())  # type: ignore[no-any-return]

    def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):  # else the counts already held are the last ones
            self.refresh()
        ray.kill(self.handle)


class RayActors:
    """Environment actors on Ray, kept busy while the buffer needs steps, started again when one dies."""

    kind = "ray"

    def __init__(
        self, count: int, env_id: str, seed: int, hidden: int, push: int, experience: RemoteExperience, cpus: float
    ) -> None:
        ray = connect()
        self.worker = ray.remote(num_cpus=cpus, max_restarts=0, max_task_retries=0)(EnvWorker)
        self.env_id, self.seed, self.hidden, self.push = env_id, seed, hidden, push
        self.experience = experience
        self.handles: list[Any] = [None] * count
        self.pid_of: list[int] = [0] * count
        self.starts = [0] * count
        self.sent = [-1] * count
        self.inflight: dict[Any, tuple[int, int]] = {}
        """Each call in flight: the actor's index and which start of it the call went to."""
        self.restarts = 0
        self.calls = 0
        self.message: Message | None = None
        self.weights: Any = None
        for i in range(count):
            self._start(i)

    def _start(self, i: int) -> None:
        import ray

        self.starts[i] += 1
        seed = actor_seed(self.seed, i, self.starts[i])
        handle = self.worker.remote(self.env_id, seed, self.hidden, self.experience.handle)
        self.handles[i], self.sent[i] = handle, -1
        self.pid_of[i] = int(ray.get(handle.pid.remote(), timeout=CALL_TIMEOUT_S))

    def publish(self, message: Message) -> None:
        import ray

        self.message = message
        self.weights = ray.put(message[2])

    def _submit(self, i: int) -> None:
        assert self.message is not None
        version, epsilon, _ = self.message
        weights = self.weights if self.sent[i] != version else None
        ref = self.handles[i].collect.remote(self.push, epsilon, version, weights)
        self.sent[i] = version
        self.inflight[ref] = (i, self.starts[i])

    def _finish(self, ref: Any) -> int:
        """Take one answered call; 1 if its actor had died and was started again."""
        import ray
        from ray.exceptions import RayActorError

        i, start = self.inflight.pop(ref)
        try:
            _, stats = ray.get(ref, timeout=CALL_TIMEOUT_S)
        except RayActorError:
            if start != self.starts[i]:
                return 0  # another call to the actor that died, which was already started again
            ray.kill(self.handles[i])
            self._start(i)
            self.restarts += 1
            return 1
        self.experience.observe(stats)
        return 0

    def fill(self, need: int) -> int:
        import ray

        self.calls += 1
        if self.experience.env_steps >= need and self.calls % POLL_EVERY:
            return 0
        restarted = 0
        while True:
            ahead = self.experience.env_steps + self.push * len(self.inflight)
            for _ in range(IN_FLIGHT):
                for i in range(len(self.handles)):
                    calls = sum(1 for a, _ in self.inflight.values() if a == i)
                    if calls < IN_FLIGHT and ahead < need + self.push * len(self.handles) * IN_FLIGHT:
                        self._submit(i)
                        ahead += self.push
            if not self.inflight:
                return restarted  # nothing asked: the buffer already holds what is needed and more
            if self.experience.env_steps >= need:
                ready, _ = ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=0)
            else:
                ready, _ = ray.wait(list(self.inflight), num_returns=1, timeout=1.0)
            for ref in ready:
                restarted += self._finish(ref)
            if self.experience.env_steps >= need and not ready:
                return restarted

    def pids(self) -> list[int]:
        return list(self.pid_of)

    def close(self) -> None:
        import ray

        for handle in self.handles:
            ray.kill(handle)
        self.inflight.clear()


__all__ = [
    "CALL_TIMEOUT_S",
    "DRAWS_PER_CALL",
    "IN_FLIGHT",
    "POLL_EVERY",
    "EnvWorker",
    "ExperienceServer",
    "RayActors",
    "RemoteExperience",
    "connect",
]
