"""The figures of an actor-learner job's ``rl`` events, as ``gpufleet show`` prints them."""

from __future__ import annotations

from gpufleet.rl.report import describe, summarize


def test_the_newest_figures_win_and_restarts_add_up_over_attempts() -> None:
    events = [
        {"kind": "step", "attempt": 1, "step": 1},
        {"kind": "rl", "attempt": 1, "actor_kind": "process", "actor_pids": [1, 2], "actor_restarts": 0},
        {"kind": "rl", "attempt": 1, "env_steps_per_s": 100.0, "mean_return_100": 20.0, "actor_restarts": 1},
        {"kind": "rl", "attempt": 1, "env_steps_per_s": 120.0, "actor_restarts": 2, "policy_lag": 7},
        {"kind": "rl", "attempt": 2, "actor_kind": "ray", "actor_restarts": 0},
        {"kind": "rl", "attempt": 2, "env_steps_per_s": 90.0, "buffer_fill": 0.5, "actor_restarts": 1},
        {"kind": "rl", "attempt": 2, "sample_reuse": True},  # not a number: ignored
    ]
    got = summarize(events)
    assert got == {
        "env_steps_per_s": 90.0,
        "mean_return_100": 20.0,
        "policy_lag": 7.0,
        "buffer_fill": 0.5,
        "actor_kind": "ray",
        "actor_restarts": 3,
    }
    line = describe(got)
    assert "env steps/s 90" in line and "buffer 50%" in line and "actor restarts 3" in line
    assert line.endswith("actors: ray")


def test_a_job_without_rl_events_has_no_summary() -> None:
    assert summarize([{"kind": "step", "attempt": 1}]) is None
