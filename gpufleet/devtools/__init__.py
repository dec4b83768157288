"""Tools for the person writing a training loop, behind ``gpufleet debug`` and ``gpufleet profile``.

``debug``: is the loop deterministic, where did the loss spike; ``resumecheck``: does a resumed
run end where an uninterrupted one does; ``profile``: where a step's time goes.

Floor 9 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/, data/, rl/,
workloads/.
"""

__all__: list[str] = []
