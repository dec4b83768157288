"""What an actor-learner job adds to gpufleet: its events, its Prometheus gauges, its line in ``gpufleet show``.

Registered on import (:mod:`gpufleet.features` lists this module); light on purpose: pydantic and
:mod:`gpufleet.rl.report`, never torch or gymnasium, so a fleet without RL's dependencies still loads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.jobs.features import EventType, Feature, MetricFamily, Number, Payload, Summary, from_field, register
from gpufleet.rl.report import FIGURES, describe, summarize

RL = "rl"
RL_RESTORED = "rl_restored"
RL_DONE = "rl_done"


class RlFigures(Payload):
    """``rl``: the learner's rates and its actors (the first event of an attempt names them)."""

    env_steps: Number | None = None
    env_steps_per_s: Number | None = None
    updates_per_s: Number | None = None
    sample_reuse: Number | None = None
    """Updates x batch size / transitions added."""
    policy_lag: Number | None = None
    """Mean learner version minus the version of the sampled transitions."""
    buffer_fill: Number | None = None
    mean_return_100: Number | None = None
    episodes: Number | None = None
    actor_restarts: Number | None = None
    """Actors started again after they died, this attempt."""
    actor_kind: str | None = None
    """``process`` or ``ray``."""
    actor_pids: list[int] | None = None


class RlRestored(Payload):
    """``rl_restored``: the replay buffer a resumed learner holds, to compare with its checkpoint's."""

    buffer_size: Number | None = None
    buffer_sha256: str | None = None
    env_steps: Number | None = None


class RlDone(Payload):
    """``rl_done``: how the learner ended."""

    solved_at_env_step: Number | None = None
    """The environment step the mean return of 100 episodes first reached the goal (none: never)."""
    env_steps: Number | None = None
    mean_return_100: Number | None = None


class RlSummary(Summary):
    """The newest figure of each kind over a job's ``rl`` events; ``actor_restarts`` summed over attempts."""

    env_steps_per_s: float | None = None
    updates_per_s: float | None = None
    sample_reuse: float | None = None
    policy_lag: float | None = None
    buffer_fill: float | None = None
    mean_return_100: float | None = None
    env_steps: float | None = None
    actor_restarts: int | None = None
    actor_kind: str | None = None


def _summary(events: Sequence[Mapping[str, Any]]) -> RlSummary | None:
    figures = summarize(events)
    return None if figures is None else RlSummary.model_validate(figures)


def _line(summary: RlSummary) -> str:
    return describe(summary.model_dump(exclude_unset=True))


FEATURE = register(
    Feature(
        name="rl",
        events=(
            EventType(
                kind=RL,
                doc="A learner's rates: env steps/s, updates/s, reuse, lag, buffer fill, return, restarts.",
                payload=RlFigures,
            ),
            EventType(
                kind=RL_RESTORED,
                doc="A resumed learner's replay buffer: its size and SHA-256, to compare with the checkpoint's.",
                payload=RlRestored,
                notable=True,
            ),
            EventType(
                kind=RL_DONE,
                doc="A learner ended: the env step it was solved at (or null), the mean return of 100 episodes.",
                payload=RlDone,
                notable=True,
            ),
        ),
        metrics=tuple(
            MetricFamily(name=name, type="gauge", help=doc, kind=RL, values=from_field(key))
            for key, name, doc in FIGURES
        ),
        summary=RlSummary,
        summarize=_summary,
        describe=_line,
    )
)

__all__ = ["FEATURE", "RL", "RL_DONE", "RL_RESTORED", "RlDone", "RlFigures", "RlRestored", "RlSummary"]
