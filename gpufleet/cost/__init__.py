"""Floor 7 of the layers (README, "Layout"; ``tests/test_layers.py``): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/.
"""

__all__: list[str] = []
