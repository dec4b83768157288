"""The ``gpufleet`` command: one file per command group (jobs, ckpt, observe, quality, ...); ``app`` assembles them.

Floor 14 of the layers (README, "Layout"; ``tests/test_layers.py``): the top floor, which may import every
part below it; nothing imports the CLI.
"""

__all__: list[str] = []
