"""Tools for the person writing a training loop, behind ``gpufleet debug`` and ``gpufleet profile``.

``debug``: is the loop deterministic, where did the loss spike; ``resumecheck``: does a resumed
run end where an uninterrupted one does; ``profile``: where a step's time goes.
"""

__all__: list[str] = []
