"""Floor 7 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/.
"""

__all__: list[str] = []
