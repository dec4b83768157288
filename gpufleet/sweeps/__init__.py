"""Hyper-parameter sweeps whose trials are gpufleet jobs (Optuna studies)."""
