"""The voice the session's components share: events in the job's log, and the few a person should see.

It exists so that the checkpoint manager, the reporter and the rank agreement can each say what
they did without calling back into the session. It imports the event log and nothing else of
gpufleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.jobs.events import EventLog


@dataclass(frozen=True, slots=True)
class Announcer:
    """Writes events to ``events``; with ``echo`` the ones meant for a person go to stdout too."""

    events: EventLog
    echo: bool = True
    """Print restores, rollbacks and refusals (rank 0 of a group only, so a line appears once)."""

    def emit(self, kind: str, **data: Any) -> None:
        self.events.emit(kind, **data)

    def say(self, kind: str, message: str, **data: Any) -> None:
        """An event that a person running the script should also see on stdout."""
        self.events.emit(kind, message=message, **data)
        self.print(message)

    def print(self, message: str) -> None:
        if self.echo:
            print(f"gpufleet: {message}", flush=True)


__all__ = ["Announcer"]
