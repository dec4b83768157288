"""Reinforcement learning on the fleet: actor-learner DQN with a checkpointed replay buffer."""
