"""The states a job moves through and the ways an attempt ends, as the store and JSON spell them.

Both are ``StrEnum``: a member equals its string (``JobState.QUEUED == "queued"``), is stored as it
and is written to JSON as it, so databases and outputs written with bare strings read the same.
"""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    """A job's state, as the ``jobs`` table and every JSON output spell it (members equal those strings)."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Outcome(enum.StrEnum):
    """How an attempt ended, as the ``attempts`` table and ``attempt_end`` events spell it."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    """The attempt exited 75 (``REQUEUE_EXIT_CODE``): it saved and asked to be run again."""
    LOST = "lost"
    """Nobody saw it end (its process or its scheduler vanished)."""
    FAILED = "failed"


__all__ = ["JobState", "Outcome"]
