"""An actor-learner DQN job: actor processes step environments, the learner trains from a replay buffer.

``gpufleet.rl.dqn:train`` is a JobSpec entrypoint (``examples/rl-cartpole.yaml``). ``actors`` actors
each step a Gymnasium environment with the newest policy weights they were sent, epsilon-greedy, and
push their transitions, tagged with the policy version that chose them, to the replay buffer (an
:class:`~gpufleet.rl.replay.Experience`). The learner (this process) samples batches and takes a
double-DQN step against a target network (Mnih et al. 2015; van Hasselt et al. 2016), and publishes its
weights every ``broadcast_every`` updates. Where the actors run is a :class:`Collector`: spawned
processes feeding the learner's buffer (:class:`Actors`), or on the Ray backend Ray actors pushing to a
buffer that is a Ray actor too (:mod:`gpufleet.rl.on_ray`). With ``actors: 0`` the learner steps the
environment itself (:class:`Inline`), in order, so a run is a function of its seed.

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
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from gpufleet.errors import SpecError
from gpufleet.extras import require
from gpufleet.rl.feature import RL, RL_DONE, RL_RESTORED
from gpufleet.rl.replay import RETURNS_KEPT, Experience, ReplayBuffer
from gpufleet.runtime import TrainSession

if TYPE_CHECKING:
    from gpufleet.rl.on_ray import RemoteExperience

SOLVED_RETURN = 195.0
"""CartPole's classic bar: a mean return of 195 over 100 consecutive episodes."""


def make_env(env_id: str, seed: int) -> Any:
    gym = require("gymnasium", "rl", "the RL workload (gpufleet.rl.dqn)")

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


Message = tuple[int, float, dict[str, torch.Tensor]]
"""What the learner publishes: its version (updates done), the exploration epsilon, the Q-network's weights."""


class Collector(Protocol):
    """Where transitions come from: the learner itself, actor processes, or Ray actors."""

    kind: str
    restarts: int

    def publish(self, message: Message) -> None:
        """Send the newest weights and epsilon; actors pick them up before their next rollout."""

    def fill(self, need: int) -> int:
        """Return once the experience holds ``need`` environment steps; the actors restarted meanwhile."""

    def pids(self) -> list[int]: ...

    def close(self) -> None: ...


class Inline:
    """No actors: the learner steps the environment itself, in order, so a run is a function of its seed."""

    kind = "inline"
    restarts = 0

    def __init__(self, rollout: Rollout, experience: Experience, push: int) -> None:
        self.rollout, self.experience, self.push = rollout, experience, push
        self.epsilon = 1.0

    def publish(self, message: Message) -> None:
        self.rollout.version, self.epsilon = message[0], message[1]
        self.rollout.policy.load_state_dict(message[2])

    def fill(self, need: int) -> int:
        while self.experience.env_steps < need:
            self.experience.add(*self.rollout.run(min(self.push, need - self.experience.env_steps), self.epsilon))
        return 0

    def pids(self) -> list[int]:
        return []

    def close(self) -> None:
        pass


class Actors:
    """Actor processes (spawned), started again when one dies; the learner adds what they send."""

    kind = "process"

    def __init__(
        self, count: int, env_id: str, seed: int, hidden: int, push: int, experience: Experience | None = None
    ) -> None:
        self.ctx = mp.get_context("spawn")
        self.env_id, self.seed, self.hidden, self.push = env_id, seed, hidden, push
        self.experience = experience
        self.out = self.ctx.Queue(maxsize=4 * max(1, count))
        self.stop = self.ctx.Event()
        self.weights = [self.ctx.Queue() for _ in range(count)]
        self.procs: list[Any] = [None] * count
        self.starts = [0] * count
        self.restarts = 0
        self.last: Message | None = None
        for i in range(count):
            self._start(i)

    def _start(self, i: int) -> None:
        self.starts[i] += 1
        seed = actor_seed(self.seed, i, self.starts[i])
        proc = self.ctx.Process(
            target=_actor,
            args=(i, self.env_id, seed, self.hidden, self.push, self.weights[i], self.out, self.stop),
            daemon=True,
            name=f"gpufleet-actor-{i}",
        )
        proc.start()
        self.procs[i] = proc

    def check(self) -> int:
        """Start again every actor that died; give it the newest weights. Returns how many were restarted."""
        restarted = 0
        for i, proc in enumerate(self.procs):
            if not proc.is_alive():
                proc.join(0)
                self.weights[i] = self.ctx.Queue()
                if self.last is not None:
                    self.weights[i].put(self.last)
                self._start(i)
                restarted += 1
        self.restarts += restarted
        return restarted

    def publish(self, message: Message) -> None:
        self.last = message
        for q in self.weights:
            q.put(message)

    def fill(self, need: int) -> int:
        assert self.experience is not None
        restarted = 0
        while self.experience.env_steps < need:
            try:
                _, _, arrays, got = self.out.get(timeout=1.0)
                self.experience.add(arrays, got)
            except queue.Empty:
                pass
            restarted += self.check()
        return restarted

    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.procs]

    def close(self) -> None:
        self.stop.set()
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def actor_seed(seed: int, actor: int, start: int) -> int:
    """Each actor, and each restart of it, explores with its own seed."""
    return seed + 1000 * (actor + 1) + start


ACTOR_BACKENDS = ("auto", "process", "ray")


def train(
    env_id: str = "CartPole-v1",
    actors: int = 2,
    actor_backend: str = "auto",
    actor_cpus: float = 0.0,
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
    if actor_backend not in ACTOR_BACKENDS:
        raise SpecError(f"args.actor_backend={actor_backend!r} is not one of {', '.join(ACTOR_BACKENDS)}")
    if actor_cpus < 0:
        raise SpecError(f"args.actor_cpus={actor_cpus} must be 0 or more (CPUs each Ray actor reserves)")
    on_ray = actors > 0 and (
        actor_backend == "ray" or (actor_backend == "auto" and os.environ.get("GPUFLEET_BACKEND") == "ray")
    )
    torch.manual_seed(seed)
    probe = make_env(env_id, seed)
    obs_dim, n_actions = int(probe.observation_space.shape[0]), int(probe.action_space.n)
    probe.close()
    q = QNet(obs_dim, n_actions, hidden)
    target = QNet(obs_dim, n_actions, hidden)
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=lr)
    experience: Experience | RemoteExperience
    if on_ray:
        from gpufleet.rl import on_ray as ray_side

        remote = ray_side.RemoteExperience.start(buffer_capacity, obs_dim, prioritized=prioritized)
        experience = remote

        def start_collector() -> Collector:
            return ray_side.RayActors(actors, env_id, seed, hidden, push, remote, actor_cpus)

    else:
        local = Experience(ReplayBuffer(buffer_capacity, obs_dim, prioritized=prioritized))
        experience = local

        def start_collector() -> Collector:
            if actors:
                return Actors(actors, env_id, seed, hidden, push, local)
            return Inline(Rollout(env_id, seed, hidden), local, push)

    sess = TrainSession.from_env(
        model=q,
        optimizer=optimizer,
        extra={"target": target, "replay": experience, "rl": {"solved_at": None}},
        total_steps=updates,
        ckpt_dir=ckpt_dir,
    )
    collector: Collector | None = None
    try:
        with sess:
            state = sess.values["rl"]
            experience.reseed(seed * 1_000_003 + sess.step)
            if sess.step > 0:  # resumed: say what the buffer holds, so that it can be compared with the checkpoint
                sess.log(
                    RL_RESTORED,
                    buffer_size=len(experience),
                    buffer_sha256=experience.digest(),
                    env_steps=experience.env_steps,
                )
            collector = start_collector()
            if actors:
                sess.log(RL, actor_kind=collector.kind, actor_pids=collector.pids(), actor_restarts=0)
            t0, steps0, updates0 = time.monotonic(), experience.env_steps, sess.step
            lags: list[float] = []
            solved_at: int | None = state.get("solved_at")

            def publish() -> None:
                share = min(1.0, experience.env_steps / max(1, epsilon_steps))
                epsilon = float(epsilon_start + share * (epsilon_end - epsilon_start))
                assert collector is not None
                collector.publish((sess.step, epsilon, {k: v.clone() for k, v in q.state_dict().items()}))

            publish()
            for _ in sess.steps():
                if collector.fill(max(learning_starts, (sess.step + 1) * env_steps_per_update)):
                    sess.log(RL, actor_restarts=collector.restarts, actor_pids=collector.pids())
                batch = experience.sample(batch_size)
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
                experience.update_priorities(batch.indices, td.detach())
                lags.append(float((sess.step - batch.versions).float().mean()))
                stats = experience.stats()
                if solved_at is None and len(stats.returns) == RETURNS_KEPT and stats.mean_return >= SOLVED_RETURN:
                    solved_at = stats.env_steps
                    state["solved_at"] = solved_at
                sess.report(float(loss.detach()))
                if sess.step % target_every == 0:
                    target.load_state_dict(q.state_dict())
                if sess.step % broadcast_every == 0:
                    publish()
                if sess.step % log_every == 0 or sess.step == updates:
                    seconds = max(1e-9, time.monotonic() - t0)
                    sess.log(
                        RL,
                        env_steps=stats.env_steps,
                        env_steps_per_s=(stats.env_steps - steps0) / seconds,
                        updates_per_s=(sess.step - updates0) / seconds,
                        sample_reuse=sess.step * batch_size / max(1, stats.env_steps),
                        policy_lag=sum(lags) / len(lags) if lags else 0.0,
                        buffer_fill=stats.size / stats.capacity,
                        mean_return_100=stats.mean_return,
                        episodes=stats.episodes,
                        actor_restarts=collector.restarts,
                    )
                    lags.clear()
                if stop_at_return is not None and solved_at is not None and stats.mean_return >= stop_at_return:
                    break
            stats = experience.stats()
            sess.log(
                RL_DONE,
                solved_at_env_step=solved_at,
                env_steps=stats.env_steps,
                mean_return_100=stats.mean_return,
            )
    finally:  # after the session's last save, which reads the buffer
        if collector is not None:
            collector.close()
        experience.close()
    stats = experience.stats()
    return {
        "updates": sess.step,
        "env_steps": stats.env_steps,
        "episodes": stats.episodes,
        "mean_return_100": stats.mean_return if stats.returns else math.nan,
        "solved_at_env_step": solved_at,
        "actor_restarts": collector.restarts if collector is not None else 0,
    }


__all__ = [
    "ACTOR_BACKENDS",
    "SOLVED_RETURN",
    "Actors",
    "Collector",
    "Inline",
    "Message",
    "QNet",
    "Rollout",
    "actor_seed",
    "train",
]
