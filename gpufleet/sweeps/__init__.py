"""Hyper-parameter sweeps whose trials are gpufleet jobs (Optuna studies).

Floor 11 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/, data/, rl/,
workloads/, devtools/, placement/, backends/.
"""
