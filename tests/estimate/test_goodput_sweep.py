"""The Monte Carlo sweeps ``gpufleet goodput --plot`` draws: each point is the one-scenario simulation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gpufleet.errors import ParameterError
from gpufleet.estimate.goodput import Scenario, monte_carlo, monte_carlo_sweep

ONE = Scenario(
    gpus=1000,
    gpu_mtbf_hours=3600.0,
    work_hours=100.0,
    save_seconds=60.0,
    restart_seconds=600.0,
    interval_seconds=1800.0,
)


def test_each_point_is_the_simulation_of_that_scenario() -> None:
    taus = [600.0, 3600.0]
    swept = monte_carlo_sweep(ONE, intervals=taus, trials=40, seed=5)
    assert swept == [monte_carlo(replace(ONE, interval_seconds=t), trials=40, seed=5).effective_fraction for t in taus]
    sizes = [10, 5000]
    by_size = monte_carlo_sweep(ONE, sizes=sizes, trials=40, seed=5)
    assert by_size == [monte_carlo(replace(ONE, gpus=n), trials=40, seed=5).effective_fraction for n in sizes]
    assert by_size[0] > by_size[1]  # more GPUs, more interruptions


def test_a_point_without_progress_is_nan_and_the_knobs_are_exclusive() -> None:
    hopeless = replace(ONE, restart_seconds=1e9)
    assert all(math.isnan(y) for y in monte_carlo_sweep(hopeless, sizes=[100_000], trials=10, seed=0))
    with pytest.raises(ParameterError, match="intervals"):
        monte_carlo_sweep(ONE, intervals=[60.0], sizes=[8])
