"""Scripted scenarios that show a capability end to end (``gpufleet quality demo``, the labs).

They use the library as a user would and are not imported by it.

Floor 12 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/, data/, rl/,
workloads/, devtools/, placement/, backends/, export/, quality/, sweeps/.
"""

__all__: list[str] = []
