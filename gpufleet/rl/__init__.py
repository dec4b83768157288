"""Reinforcement learning on the fleet: actor-learner DQN with a checkpointed replay buffer.

Floor 8 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, tables.py, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/.
"""
