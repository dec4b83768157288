"""The parts a ``TrainSession`` is made of; each owns its state, none calls back into the session.

::

    announce.py      Announcer            the job's event log, and the lines a person should also see
    guard.py         PreemptionGuard      SIGTERM/SIGUSR1 in and out, the flag, save-then-exit or go on
    agreement.py     RankAgreement        the ranks judge the same numbers: one all-reduce per few steps,
                                          and the watch that names a rank that stops stepping
    checkpointer.py  CheckpointManager    folder, interval, background writer, keep/best, save, restore,
                                          rollback, the fits and fingerprint checks
    ckpt_io.py       (functions)          how one checkpoint is written, found and loaded (sharded too)
    reporter.py      Reporter             step events, MFU, rank timings, the GPU sampler, session_end,
                                          the exporters and the price from the environment
    phases.py        PhaseClock           hooks on the model and optimizer: each step's data wait,
                                          compute, collective, optimizer and checkpoint seconds
    stragglers.py    StragglerDetector    names a rank slow in compute or data wait, with its tax
    settings.py      settings_from_env    what the backend exported, read into a session's arguments

``gpufleet.runtime.session`` composes them: it owns the loop's position (step, data cursor, health
window) and the order of a step boundary, asks each component for a verdict (a frozen dataclass
or an enum) and decides what happens next, so that order reads in one place.

What a component may import: ``announce``; the runtime's building blocks (``runtime.checkpoint``,
``runtime.sharded``, ``runtime.group``, ``runtime.state``, ``runtime.interval``, ...);
``gpufleet.jobs``, ``gpufleet.estimate``, ``gpufleet.telemetry``, ``gpufleet.spec``. Never
``runtime.session``, never ``gpufleet.cost`` or ``gpufleet.placement`` (a job's price comes from its
environment). Two helpers are used by one component each: ``ckpt_io`` by ``checkpointer``, the
reporter's constructors by ``settings``, ``phases`` and ``stragglers`` by ``reporter`` (and the session,
which owns the clock); no other component imports another.

The memory tier of checkpoints is ``runtime.memtier`` (RAM copies that outlive a rank), owned by
``checkpointer`` as its first tier: snapshots at step boundaries, restore own RAM, then a peer's,
then the disk. Recovering a lost rank in place is a verdict of ``guard`` fed by ``agreement``
(their module docstrings say where).
"""
