"""``gpufleet serve``: the fleet as a service (pages, a JSON API, the alert webhook, the standing monitor).

Floor 13 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/, data/, rl/,
workloads/, devtools/, placement/, backends/, export/, quality/, sweeps/, demos/, features.py, views.py.
"""
