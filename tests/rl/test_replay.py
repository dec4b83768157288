"""The replay buffer: ring order, prioritized draws, a snapshot that restores exactly or refuses."""

from __future__ import annotations

import pytest
import torch

from gpufleet.rl.replay import Experience, ReplayBuffer


def fill(buffer: ReplayBuffer, n: int, start: int = 0) -> None:
    rows = torch.arange(start, start + n, dtype=torch.float32)
    obs = rows.unsqueeze(1).repeat(1, buffer.obs_dim)
    buffer.add(obs, rows.long() % 2, rows, obs + 1, torch.zeros(n), torch.full((n,), 7))


def test_the_ring_keeps_the_newest_capacity_transitions() -> None:
    buffer = ReplayBuffer(5, 3)
    fill(buffer, 8)
    assert len(buffer) == 5 and buffer.added == 8 and buffer.position == 3
    assert sorted(buffer.rewards.tolist()) == [3.0, 4.0, 5.0, 6.0, 7.0]
    fill(buffer, 12, start=100)  # more than the capacity at once
    assert sorted(buffer.rewards.tolist()) == [107.0, 108.0, 109.0, 110.0, 111.0]


def test_a_snapshot_restores_the_same_contents_and_draws() -> None:
    a = ReplayBuffer(64, 4, prioritized=True)
    fill(a, 50)
    batch = a.sample(16, torch.Generator().manual_seed(0))
    a.update_priorities(batch.indices, torch.linspace(0, 3, 16))
    b = ReplayBuffer(64, 4, prioritized=True)
    b.load_state_dict(a.state_dict())
    for name in ("obs", "next_obs", "actions", "rewards", "dones", "versions", "priorities"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    x, y = a.sample(32, torch.Generator().manual_seed(1)), b.sample(32, torch.Generator().manual_seed(1))
    assert torch.equal(x.indices, y.indices) and torch.equal(x.weights, y.weights)


def test_prioritized_draws_favour_large_errors() -> None:
    buffer = ReplayBuffer(100, 1, prioritized=True, alpha=1.0)
    fill(buffer, 100)
    buffer.update_priorities(torch.arange(100), torch.full((100,), 1e-3))
    buffer.update_priorities(torch.tensor([42]), torch.tensor([100.0]))
    g = torch.Generator().manual_seed(0)
    drawn = torch.cat([buffer.sample(100, g).indices for _ in range(10)])
    assert (drawn == 42).float().mean() > 0.9


@pytest.mark.parametrize(
    ("other", "needle"),
    [
        (ReplayBuffer(32, 4, prioritized=True), "capacity"),
        (ReplayBuffer(64, 5, prioritized=True), "obs_dim"),
        (ReplayBuffer(64, 4, prioritized=False), "prioritized"),
    ],
)
def test_a_snapshot_of_another_layout_is_refused_and_nothing_is_loaded(other: ReplayBuffer, needle: str) -> None:
    source = ReplayBuffer(64, 4, prioritized=True)
    fill(source, 10)
    before = other.obs.clone()
    with pytest.raises(ValueError, match=needle):
        other.load_state_dict(source.state_dict())
    assert torch.equal(other.obs, before) and len(other) == 0


def test_a_batch_larger_than_the_capacity_is_refused() -> None:
    buffer = ReplayBuffer(8, 2)
    fill(buffer, 8)
    with pytest.raises(ValueError, match="batch_size=16 is larger than the buffer's capacity=8"):
        buffer.sample(16, torch.Generator())


def test_experience_counts_episodes_and_restores_them_with_the_buffer() -> None:
    a = Experience(ReplayBuffer(16, 2), seed=3)
    rows = {
        "obs": torch.ones(5, 2).numpy(),  # numpy columns, as actors send them
        "actions": torch.zeros(5, dtype=torch.int64).numpy(),
        "rewards": torch.ones(5).numpy(),
        "next_obs": torch.ones(5, 2).numpy(),
        "dones": torch.zeros(5).numpy(),
        "versions": torch.full((5,), 4).numpy(),
    }
    for returns in ([10.0], [], [20.0, 30.0]):
        stats = a.add(rows, returns)
    assert (stats.env_steps, stats.episodes, stats.size, stats.returns) == (15, 3, 15, (10.0, 20.0, 30.0))
    assert stats.mean_return == 20.0
    b = Experience(ReplayBuffer(16, 2))
    b.load_state_dict(a.state_dict())
    assert b.stats() == a.stats() and b.digest() == a.digest()
    a.reseed(7)
    b.reseed(7)
    assert torch.equal(a.sample(8).indices, b.sample(8).indices)


def test_experience_refuses_a_bare_buffer_snapshot_and_keeps_its_own() -> None:
    bare = ReplayBuffer(16, 2)
    fill(bare, 4)
    target = Experience(ReplayBuffer(16, 2))
    target.add(_one(), [5.0])
    before = target.digest()
    with pytest.raises(ValueError, match="not saved by an Experience"):
        target.load_state_dict(bare.state_dict())
    with pytest.raises(ValueError, match="capacity"):
        target.load_state_dict(Experience(ReplayBuffer(8, 2)).state_dict())
    assert target.digest() == before


def _one() -> dict[str, torch.Tensor]:
    return {
        "obs": torch.zeros(1, 2),
        "actions": torch.zeros(1, dtype=torch.int64),
        "rewards": torch.zeros(1),
        "next_obs": torch.zeros(1, 2),
        "dones": torch.zeros(1),
        "versions": torch.zeros(1, dtype=torch.int64),
    }
