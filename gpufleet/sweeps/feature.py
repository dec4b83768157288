"""What sweeps add to a job: the ``pruned`` event their driver stores when it stops a trial's job.

A sweep has no per-job metrics or summary (a trial's figures are the study's, ``gpufleet sweep show``);
its one per-job event is listed among the job's notable events. Registered on import
(:mod:`gpufleet.features` lists this module); imports no Optuna.
"""

from __future__ import annotations

from gpufleet.jobs.features import EventType, Feature, Number, Payload, register

PRUNED = "pruned"


class Pruned(Payload):
    """``pruned``: the sweep, the trial the job ran, the step and the value the pruner judged."""

    sweep: str | None = None
    trial: Number | None = None
    step: Number | None = None
    value: Number | None = None


FEATURE = register(
    Feature(
        name="sweeps",
        events=(
            EventType(
                kind=PRUNED,
                doc="A sweep's pruner stopped the trial this job runs: the sweep, the trial, the step, the value.",
                payload=Pruned,
                notable=True,
            ),
        ),
    )
)

__all__ = ["FEATURE", "PRUNED", "Pruned"]
