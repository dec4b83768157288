"""An actor-learner DQN job: actor processes step environments, the learner trains from a replay buffer.

``gpufleet.rl.dqn:train`` is a JobSpec entrypoint (``examples/rl-cartpole.yaml``). ``actors`` processes
(multiprocessing, spawned) each step a Gymnasium environment with the newest policy weights they were
sent, epsilon-greedy, and push their transitions, tagged with the policy version that chose them, to
the learner. The learner (this process) keeps the :class:`~gpufleet.rl.replay.ReplayBuffer`, samples
batches and takes a double-DQN step against a target network (Mnih et al. 2015; van Hasselt et al. 2016),
and sends its weights to the actors every ``broadcast_every`` updates. With ``actors: 0`` the learner
steps the environment itself, in order, so a run is a function of its seed.

The learner is a ``TrainSession``: a step is one update, and a checkpoint holds the Q-network, the target
network, the optimizer, the counters and the whole replay buffer, so a preempted job resumes with the
transitions it had. An actor that dies (``kill -9``) is started again by the learner, which counts it
(``rl`` events: ``actor_restarts``); training does not stop. Every ``log_every`` updates an ``rl`` event
carries environment steps/s, updates/s, sample reuse (updates x batch / transitions added), the mean
policy lag of the sampled transitions, the buffer fill and the mean return of the last 100 episodes.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue
import time
from collections import deque
from typing import Any

import torch
from torch import nn

from gpufleet.errors import SpecError
from gpufleet.jobs.events import EventKind
from gpufleet.rl.replay import ReplayBuffer
from gpufleet.runtime import TrainSession

SOLVED_RETURN = 195.0
"""CartPole's classic bar: a mean return of 195 over 100 consecutive episodes."""


def make_env(env_id: str, seed: int) -> Any:
    import gymnasium as gym

    try:
        env = gym.make(env_id)
    except gym.error.Error as err:
        raise SpecError(f"args.env_id={env_id!r} is not a Gymnasium environment here: {err}") from None
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


class QNet(nn.Module):
    def __init__(self, obs_dim: int, actions: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, actions)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]


class Rollout:
    """One environment stepped by a policy, epsilon-greedy: what an actor runs, and the learner with no actors."""

    def __init__(self, env_id: str, seed: int, hidden: int) -> None:
        self.env = make_env(env_id, seed)
        obs_dim = int(self.env.observation_space.shape[0])
        self.policy = QNet(obs_dim, int(self.env.action_space.n), hidden)
        self.version = -1
        self.generator = torch.Generator().manual_seed(seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return = 0.0

    def run(self, steps: int, epsilon: float) -> tuple[dict[str, torch.Tensor], list[float]]:
        rows: dict[str, list[Any]] = {k: [] for k in ("obs", "actions", "rewards", "next_obs", "dones")}
        returns: list[float] = []
        for _ in range(steps):
            obs = torch.as_tensor(self.obs, dtype=torch.float32)
            if float(torch.rand((), generator=self.generator)) < epsilon:
                action = int(torch.randint(int(self.env.action_space.n), (), generator=self.generator))
            else:
                with torch.no_grad():
                    action = int(self.policy(obs).argmax())
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            rows["obs"].append(obs)
            rows["actions"].append(action)
            rows["rewards"].append(float(reward))
            rows["next_obs"].append(torch.as_tensor(next_obs, dtype=torch.float32))
            rows["dones"].append(float(terminated))  # a time limit is not a terminal state
            self.episode_return += float(reward)
            self.obs = next_obs
            if terminated or truncated:
                returns.append(self.episode_return)
                self.episode_return = 0.0
                self.obs, _ = self.env.reset()
        out = {
            "obs": torch.stack(rows["obs"]),
            "actions": torch.tensor(rows["actions"]),
            "rewards": torch.tensor(rows["rewards"]),
            "next_obs": torch.stack(rows["next_obs"]),
            "dones": torch.tensor(rows["dones"]),
            "versions": torch.full((steps,), self.version, dtype=torch.int64),
        }
        return out, returns


def _actor(actor_id: int, env_id: str, seed: int, hidden: int, push: int, weights: Any, out: Any, stop: Any) -> None:
    torch.set_num_threads(1)
    rollout = Rollout(env_id, seed, hidden)
    epsilon = 1.0
    while not stop.is_set():
        try:
            while True:  # the newest weights only
                version, epsilon, state = weights.get_nowait()
                rollout.policy.load_state_dict(state)
                rollout.version = version
        except queue.Empty:
            pass
        rows, returns = rollout.run(push, epsilon)
        # numpy arrays pickle as bytes; a torch tensor would go through a shared-memory segment per tensor
        arrays = {k: v.numpy() for k, v in rows.items()}
        while not stop.is_set():
            try:
                out.put((actor_id, os.getpid(), arrays, returns), timeout=0.5)
                break
            except queue.Full:
                continue


class Actors:
    """The actor processes, started again when one dies."""

    def __init__(self, count: int, env_id: str, seed: int, hidden: int, push: int) -> None:
        self.ctx = mp.get_context("spawn")
        self.env_id, self.seed, self.hidden, self.push = env_id, seed, hidden, push
        self.out = self.ctx.Queue(maxsize=4 * max(1, count))
        self.stop = self.ctx.Event()
        self.weights = [self.ctx.Queue() for _ in range(count)]
        self.procs: list[Any] = [None] * count
        self.starts = [0] * count
        self.restarts = 0
        for i in range(count):
            self._start(i)

    def _start(self, i: int) -> None:
        self.starts[i] += 1
        seed = self.seed + 1000 * (i + 1) + self.starts[i]
        proc = self.ctx.Process(
            target=_actor,
            args=(i, self.env_id, seed, self.hidden, self.push, self.weights[i], self.out, self.stop),
            daemon=True,
            name=f"gpufleet-actor-{i}",
        )
        proc.start()
        self.procs[i] = proc

    def check(self, last: tuple[int, float, dict[str, torch.Tensor]] | None) -> int:
        """Start again every actor that died; give it the newest weights. Returns how many were restarted."""
        restarted = 0
        for i, proc in enumerate(self.procs):
            if not proc.is_alive():
                proc.join(0)
                self.weights[i] = self.ctx.Queue()
                if last is not None:
                    self.weights[i].put(last)
                self._start(i)
                restarted += 1
        self.restarts += restarted
        return restarted

    def broadcast(self, message: tuple[int, float, dict[str, torch.Tensor]]) -> None:
        for q in self.weights:
            q.put(message)

    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.procs]

    def close(self) -> None:
        self.stop.set()
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def train(
    env_id: str = "CartPole-v1",
    actors: int = 2,
    updates: int = 50_000,
    env_steps_per_update: int = 1,
    learning_starts: int = 1_000,
    buffer_capacity: int = 50_000,
    prioritized: bool = False,
    batch_size: int = 64,
    lr: float = 5e-4,
    gamma: float = 0.99,
    hidden: int = 64,
    target_every: int = 250,
    broadcast_every: int = 50,
    epsilon_start: float = 1.0,
    epsilon_end: float = 0.02,
    epsilon_steps: int = 5_000,
    push: int = 64,
    seed: int = 0,
    log_every: int = 200,
    stop_at_return: float | None = SOLVED_RETURN,
    ckpt_dir: str = "checkpoints",
) -> dict[str, Any]:
    """Train a DQN; return the counters and whether (and at which environment step) it was solved."""
    if batch_size > buffer_capacity:
        raise SpecError(
            f"args.buffer_capacity={buffer_capacity} is smaller than args.batch_size={batch_size}: "
            "a batch is drawn from the buffer"
        )
    if actors < 0 or updates < 1 or env_steps_per_update < 1 or push < 1:
        raise SpecError("args.actors must be 0 or more, and updates, env_steps_per_update and push at least 1")
    torch.manual_seed(seed)
    probe = make_env(env_id, seed)
    obs_dim, n_actions = int(probe.observation_space.shape[0]), int(probe.action_space.n)
    probe.close()
    q = QNet(obs_dim, n_actions, hidden)
    target = QNet(obs_dim, n_actions, hidden)
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=lr)
    buffer = ReplayBuffer(buffer_capacity, obs_dim, prioritized=prioritized)
    sess = TrainSession.from_env(
        model=q,
        optimizer=optimizer,
        extra={"target": target, "replay": buffer, "rl": {"env_steps": 0, "episodes": 0, "returns": []}},
        total_steps=updates,
        ckpt_dir=ckpt_dir,
    )
    inline = Rollout(env_id, seed, hidden) if actors == 0 else None
    pool: Actors | None = None
    sampler = torch.Generator()
    with sess:
        counters = sess.values["rl"]
        returns: deque[float] = deque(counters["returns"], maxlen=100)
        sampler.manual_seed(seed * 1_000_003 + sess.step)
        if sess.step > 0:  # resumed: say what the buffer holds, so that it can be compared with the checkpoint
            sess.log(
                "rl_restored", buffer_size=len(buffer), buffer_sha256=buffer.digest(), env_steps=counters["env_steps"]
            )
        pool = Actors(actors, env_id, seed, hidden, push) if actors else None
        if pool is not None:
            sess.log(EventKind.RL, actor_pids=pool.pids(), actor_restarts=0)
        t0, steps0, updates0 = time.monotonic(), counters["env_steps"], sess.step
        lags: list[float] = []
        solved_at: int | None = counters.get("solved_at")
        last: tuple[int, float, dict[str, torch.Tensor]] | None = None

        def epsilon() -> float:
            share = min(1.0, counters["env_steps"] / max(1, epsilon_steps))
            return float(epsilon_start + share * (epsilon_end - epsilon_start))

        def publish() -> tuple[int, float, dict[str, torch.Tensor]]:
            message = (sess.step, epsilon(), {k: v.clone() for k, v in q.state_dict().items()})
            if pool is not None:
                pool.broadcast(message)
            if inline is not None:
                inline.policy.load_state_dict(message[2])
                inline.version = sess.step
            return message

        def take(rows: dict[str, torch.Tensor], got: list[float]) -> None:
            buffer.add(rows["obs"], rows["actions"], rows["rewards"], rows["next_obs"], rows["dones"], rows["versions"])
            counters["env_steps"] += int(rows["obs"].shape[0])
            counters["episodes"] += len(got)
            returns.extend(got)

        last = publish()
        try:
            for _ in sess.steps():
                need = max(learning_starts, (sess.step + 1) * env_steps_per_update)
                while counters["env_steps"] < need:
                    if inline is not None:
                        take(*inline.run(min(push, need - counters["env_steps"]), epsilon()))
                        continue
                    assert pool is not None
                    try:
                        _, _, arrays, got = pool.out.get(timeout=1.0)
                        take({k: torch.from_numpy(v) for k, v in arrays.items()}, got)
                    except queue.Empty:
                        pass
                    if pool.check(last):
                        sess.log(EventKind.RL, actor_restarts=pool.restarts, actor_pids=pool.pids())
                batch = buffer.sample(batch_size, sampler)
                with torch.no_grad():
                    best = q(batch.next_obs).argmax(dim=1, keepdim=True)
                    bootstrap = target(batch.next_obs).gather(1, best).squeeze(1)
                    goal = batch.rewards + gamma * (1.0 - batch.dones) * bootstrap
                value = q(batch.obs).gather(1, batch.actions.unsqueeze(1)).squeeze(1)
                td = value - goal
                loss = (batch.weights * nn.functional.smooth_l1_loss(value, goal, reduction="none")).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                nn.utils.clip_grad_norm_(q.parameters(), 10.0)
                optimizer.step()
                buffer.update_priorities(batch.indices, td)
                lags.append(float((sess.step - batch.versions).float().mean()))
                mean_return = sum(returns) / len(returns) if returns else 0.0
                if solved_at is None and len(returns) == 100 and mean_return >= SOLVED_RETURN:
                    solved_at = counters["env_steps"]
                    counters["solved_at"] = solved_at
                counters["returns"] = list(returns)
                sess.report(float(loss.detach()))
                if sess.step % target_every == 0:
                    target.load_state_dict(q.state_dict())
                if sess.step % broadcast_every == 0:
                    last = publish()
                if sess.step % log_every == 0 or sess.step == updates:
                    seconds = max(1e-9, time.monotonic() - t0)
                    sess.log(
                        EventKind.RL,
                        env_steps=counters["env_steps"],
                        env_steps_per_s=(counters["env_steps"] - steps0) / seconds,
                        updates_per_s=(sess.step - updates0) / seconds,
                        sample_reuse=sess.step * batch_size / max(1, buffer.added),
                        policy_lag=sum(lags) / len(lags) if lags else 0.0,
                        buffer_fill=len(buffer) / buffer.capacity,
                        mean_return_100=mean_return,
                        episodes=counters["episodes"],
                        actor_restarts=pool.restarts if pool is not None else 0,
                    )
                    lags.clear()
                if stop_at_return is not None and solved_at is not None and mean_return >= stop_at_return:
                    break
            sess.log(
                EventKind.RL_DONE,
                solved_at_env_step=solved_at,
                env_steps=counters["env_steps"],
                mean_return_100=sum(returns) / len(returns) if returns else 0.0,
            )
        finally:
            if pool is not None:
                pool.close()
    mean = sum(returns) / len(returns) if returns else math.nan
    return {
        "updates": sess.step,
        "env_steps": counters["env_steps"],
        "episodes": counters["episodes"],
        "mean_return_100": mean,
        "solved_at_env_step": solved_at,
        "actor_restarts": pool.restarts if pool is not None else 0,
    }


__all__ = ["SOLVED_RETURN", "QNet", "Rollout", "train"]
