"""What an actor-learner job's ``rl`` events add up to: the figures ``gpufleet show`` prints and Prometheus scrapes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

FIGURES: tuple[tuple[str, str, str], ...] = (
    ("env_steps_per_s", "gpufleet_rl_env_steps_per_second", "Environment steps per second the learner received."),
    ("updates_per_s", "gpufleet_rl_updates_per_second", "Learner updates per second."),
    ("sample_reuse", "gpufleet_rl_sample_reuse", "Updates x batch size / transitions added."),
    ("policy_lag", "gpufleet_rl_policy_lag", "Mean learner version minus the version of the sampled transitions."),
    ("buffer_fill", "gpufleet_rl_buffer_fill", "Replay buffer fill, 0..1."),
    ("mean_return_100", "gpufleet_rl_episode_return", "Mean return of the last 100 episodes."),
    ("env_steps", "gpufleet_rl_env_steps", "Environment steps collected since the job began."),
    ("actor_restarts", "gpufleet_rl_actor_restarts", "Actors started again after they died, this attempt."),
)
"""``(event key, metric name, help)`` for each figure of an ``rl`` event."""


def number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def summarize(events: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The newest figures of ``rl`` events (each key from the last event that had it), the actors' kind,
    and the actor restarts summed over attempts; ``None`` for a job that logged none."""
    out: dict[str, Any] = {}
    restarts: dict[Any, float] = {}
    for event in events:
        if event.get("kind") != "rl":
            continue
        for key, _, _ in FIGURES:
            value = number(event.get(key))
            if value is not None:
                out[key] = value
        if isinstance(event.get("actor_kind"), str):
            out["actor_kind"] = event["actor_kind"]
        attempt_restarts = number(event.get("actor_restarts"))
        if attempt_restarts is not None:
            attempt = event.get("attempt")
            restarts[attempt] = max(restarts.get(attempt, 0.0), attempt_restarts)
    if not out:
        return None
    out["actor_restarts"] = int(sum(restarts.values()))
    return out


def describe(summary: Mapping[str, Any]) -> str:
    """One line for a terminal."""
    parts = [
        ("env steps/s", "env_steps_per_s", "{:,.0f}"),
        ("updates/s", "updates_per_s", "{:,.0f}"),
        ("sample reuse", "sample_reuse", "{:.1f}"),
        ("policy lag", "policy_lag", "{:,.0f}"),
        ("buffer", "buffer_fill", "{:.0%}"),
        ("return (100 ep.)", "mean_return_100", "{:.1f}"),
        ("env steps", "env_steps", "{:,.0f}"),
        ("actor restarts", "actor_restarts", "{}"),
    ]
    line = "  ".join(f"{label} {form.format(summary[key])}" for label, key, form in parts if key in summary)
    kind = summary.get("actor_kind")
    return line + (f"  actors: {kind}" if kind else "")


__all__ = ["FIGURES", "describe", "number", "summarize"]
