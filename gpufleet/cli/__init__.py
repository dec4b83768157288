"""The ``gpufleet`` command: one file per command group (jobs, ckpt, observe, quality, ...); ``app`` assembles them.

Floor 14 of the layers (the Layout in docs/architecture.md): the top floor, which may import every
part below it; nothing imports the CLI.
"""

__all__: list[str] = []
