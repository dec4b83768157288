"""Environment steps/s of 1, 2 and 4 actor processes against one process stepping the same environment.

    .venv/bin/python bench/rl_actors.py [--json] [--seconds 5] [--env CartPole-v1]

Each side runs ``--seconds``: the baseline is ``gpufleet.rl.dqn.Rollout`` stepped in this process (the
policy network's forward pass for each action, epsilon 0.1, pushes of 64 transitions); each actor
count starts ``Actors`` (spawned processes, the same code) and counts the transitions the learner
receives from the queue, after the actors' start-up. Where a Ray cluster answers (``scripts/dev-ray
up``), 1, 2 and 4 Ray environment actors (``gpufleet.rl.on_ray``) are measured too: the transitions
that land in the buffer actor, the learner keeping every actor busy. The learner's updates/s (a double-DQN step on a
batch of 64) are measured in this process too. Target: 2 actors at least 1.5x one process (the
machine has 2 cores; 4 actors share them).
"""

from __future__ import annotations

import queue
import sys
import time
from collections.abc import Sequence

import _common as common

TARGET = 1.5


def inline(env: str, seconds: float) -> float:
    from gpufleet.rl.dqn import Rollout

    rollout = Rollout(env, 0, 64)
    steps, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        rows, _ = rollout.run(64, 0.1)
        steps += int(rows["obs"].shape[0])
    return steps / (time.monotonic() - t0)


def with_actors(env: str, count: int, seconds: float) -> float:
    from gpufleet.rl.dqn import Actors, QNet

    pool = Actors(count, env, 0, 64, 64)
    try:
        pool.publish((0, 0.1, QNet(4, 2, 64).state_dict()))  # epsilon 0.1, as the baseline: a forward pass a step
        pool.out.get(timeout=120)  # the first push: the actors are up
        time.sleep(0.5)
        while True:  # drop what was stepped before the weights arrived
            try:
                pool.out.get_nowait()
            except queue.Empty:
                break
        steps, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            try:
                _, _, arrays, _ = pool.out.get(timeout=1.0)
                steps += int(arrays["obs"].shape[0])
            except queue.Empty:
                pass
        return steps / (time.monotonic() - t0)
    finally:
        pool.close()


def ray_cluster() -> bool:
    """Join the Ray cluster gpufleet would use (``$GPUFLEET_RAY_ADDRESS``, else the dev one); False if none."""
    import tempfile
    from pathlib import Path

    from gpufleet.backends.ray.backend import RayCluster, cluster_problem
    from gpufleet.errors import ServiceUnavailable

    if cluster_problem() is not None:
        return False
    try:
        RayCluster.connect(Path(tempfile.mkdtemp(prefix="rl-bench-")))
    except ServiceUnavailable:
        return False
    return True


def with_ray_actors(env: str, count: int, seconds: float) -> float:
    """Environment steps/s landing in the buffer actor from ``count`` Ray environment actors, kept busy."""
    from gpufleet.rl.dqn import QNet
    from gpufleet.rl.on_ray import RayActors, RemoteExperience

    experience = RemoteExperience.start(1_000_000, 4, prioritized=False)
    actors = RayActors(count, env, 0, 64, 64, experience, 0.0)
    try:
        actors.publish((0, 0.1, QNet(4, 2, 64).state_dict()))
        actors.fill(64 * count)  # the first pushes: the actors are up
        start, t0 = experience.refresh().env_steps, time.monotonic()
        while time.monotonic() - t0 < seconds:
            actors.fill(experience.env_steps + 64 * count)
        return (experience.refresh().env_steps - start) / (time.monotonic() - t0)
    finally:
        actors.close()
        experience.close()


def updates_per_s(seconds: float) -> float:
    import torch

    from gpufleet.rl.dqn import QNet
    from gpufleet.rl.replay import ReplayBuffer

    q, target = QNet(4, 2, 64), QNet(4, 2, 64)
    opt = torch.optim.Adam(q.parameters(), lr=5e-4)
    buffer = ReplayBuffer(50_000, 4)
    n = 10_000
    buffer.add(
        torch.randn(n, 4), torch.randint(2, (n,)), torch.rand(n), torch.randn(n, 4), torch.zeros(n), torch.zeros(n)
    )
    g = torch.Generator().manual_seed(0)
    done, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        b = buffer.sample(64, g)
        with torch.no_grad():
            goal = b.rewards + 0.99 * target(b.next_obs).gather(1, q(b.next_obs).argmax(1, keepdim=True)).squeeze(1)
        loss = torch.nn.functional.smooth_l1_loss(q(b.obs).gather(1, b.actions.unsqueeze(1)).squeeze(1), goal)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        done += 1
    return done / (time.monotonic() - t0)


def main(argv: Sequence[str]) -> int:
    import torch

    p = common.parser(__doc__.splitlines()[0] if __doc__ else "rl actors")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--env", default="CartPole-v1")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rates = {"1 process": inline(args.env, args.seconds)}
    for count in (1, 2, 4):
        common.progress(f"{count} actor(s)")
        rates[f"{count} actor(s)"] = with_actors(args.env, count, args.seconds)
    if ray_cluster():
        for count in (1, 2, 4):
            common.progress(f"{count} Ray actor(s)")
            rates[f"{count} Ray actor(s)"] = with_ray_actors(args.env, count, args.seconds)
    else:
        common.progress("no Ray cluster (scripts/dev-ray up): Ray actors not measured")
    learner = updates_per_s(args.seconds)
    base = rates["1 process"]
    rows = [[k, f"{v:,.0f}", f"{v / base:.2f}x"] for k, v in rates.items()]
    rows.append(["learner updates/s (batch 64)", f"{learner:,.0f}", ""])
    ratio = rates["2 actor(s)"] / base
    return common.finish(
        json_mode=args.json,
        result={"env_steps_per_s": rates, "learner_updates_per_s": learner, "ratio_2_actors": ratio},
        table=common.format_table(
            f"{args.env}: environment steps/s, {args.seconds:g} s each", ["side", "steps/s", "vs 1 process"], rows
        ),
        verdict=f"2 actors stepped {ratio:.2f}x one process (target >= {TARGET:g}x)",
        ok=ratio >= TARGET,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
