"""The preemption guard: SIGTERM or SIGUSR1 sets a flag; a step boundary turns it into save-then-exit.

A scheduler that takes the machine back sends SIGTERM and waits a grace period. Saving inside the
signal handler would interrupt a step halfway (weights updated, optimizer not), so the handler only
records the signal; the session asks :meth:`PreemptionGuard.decide` at each step boundary and, on
``SAVE_AND_EXIT``, saves and raises :class:`Preempted`, whose exit status
(``REQUEUE_EXIT_CODE``) asks the scheduler to queue the job again.

In a group of ranks one rank's signal is not enough to stop: the ranks must stop at the same step.
The guard then answers with what the rank agreement reported (:meth:`note_agreement`), the same on
every rank.

Imports: ``signal`` and ``threading``, and the requeue exit code from ``gpufleet.jobs.protocol``;
nothing of torch or the session.

Seam for in-place recovery: today a stop is always ``SAVE_AND_EXIT``. Recovering without a restart
(a lost rank replaced, the group re-formed) would be another :class:`GuardVerdict` member that
:meth:`PreemptionGuard.decide` returns when the agreement reports a recoverable loss; the session
then restores from the checkpoint manager's fastest tier instead of exiting.
"""

from __future__ import annotations

import enum
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from gpufleet.jobs.protocol import REQUEUE_EXIT_CODE

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

Install = Callable[[int, Any], Any]
"""How a handler is put in place and the previous one returned: ``signal.signal``'s shape."""


class Preempted(SystemExit):
    """Raised at a step boundary after the preemption checkpoint is durable."""

    def __init__(self, step: int) -> None:
        super().__init__(REQUEUE_EXIT_CODE)
        self.step = step


class GuardVerdict(enum.StrEnum):
    """What a step boundary does about preemption."""

    CONTINUE = "continue"
    SAVE_AND_EXIT = "save_and_exit"
    """Save (unless this step is saved already), then raise :class:`Preempted`."""


class PreemptionGuard:
    """The preemption flag of one process, its signal handlers, and an injected preemption."""

    def __init__(
        self,
        *,
        handle_signals: bool = True,
        distributed: bool = False,
        signals: Sequence[int] = PREEMPT_SIGNALS,
        install: Install = signal.signal,
    ) -> None:
        self.handle_signals = handle_signals
        """Install the handlers while armed (a script that handles SIGTERM itself passes ``False``)."""
        self.distributed = distributed
        """A rank of a group: stop when the ranks agreed to, never on this rank's view alone."""
        self.signals = tuple(signals)
        self.install = install
        self.received: int | None = None
        """The signal that asked this process to stop (``SIGTERM`` for a request or another rank's)."""
        self.agreed = False
        """Distributed: some rank was asked to stop, as of the last step agreement."""
        self.inject_at: int | None = None
        """Debugging: behave as if SIGTERM arrived when training reaches this step."""
        self._injection_owed = False
        self._previous: dict[int, Any] = {}

    def arm(self) -> None:
        """Install the handlers (from the main thread only: Python runs handlers there)."""
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            self._previous[sig] = self.install(sig, self.on_signal)

    def disarm(self) -> None:
        """Put back the handlers that were there before :meth:`arm`."""
        for sig, handler in self._previous.items():
            self.install(sig, handler)
        self._previous.clear()

    @property
    def armed(self) -> bool:
        return bool(self._previous)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the save happens at the next step boundary, never inside a step.
        self.received = signum
        _told_to_stop[0] = signum

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask for a save-and-requeue at the next step boundary (what SIGTERM does)."""
        self.received = signum

    @property
    def raised_here(self) -> bool:
        """This process was asked to stop: what it tells the other ranks at the next agreement."""
        return self.received is not None

    @property
    def requested(self) -> bool:
        """Whether to stop now: this process's flag, or in a group what every rank agreed."""
        return self.agreed if self.distributed else self.received is not None

    @property
    def signal_name(self) -> str:
        """``SIGTERM``, ``SIGUSR1``, or ``request`` when nothing asked."""
        return signal.Signals(self.received).name if self.received is not None else "request"

    def note_agreement(self, any_rank: bool) -> None:
        """The ranks agreed whether any of them was asked to stop; one that was not takes SIGTERM as its reason."""
        self.agreed = any_rank
        if any_rank and self.received is None:
            self.received = signal.SIGTERM

    def note_step(self, step: int) -> None:
        """A step was counted: an injected preemption at it is acted on at the next decision point."""
        self._injection_owed |= self.inject_at == step

    def decide(self) -> GuardVerdict:
        """At a step boundary where the session may stop: save and exit, or go on."""
        if self._injection_owed:
            self._injection_owed = False
            self.received = signal.SIGTERM
            self.agreed = True  # the same step on every rank: no need to ask the others
        return GuardVerdict.SAVE_AND_EXIT if self.requested else GuardVerdict.CONTINUE


def preemption_line(signal_name: str, step: int, saved: str) -> str:
    """The line a preempted attempt's log ends with, after its last step's:
    ``SIGTERM at step 80: saved checkpoint step 80 (.../step-00000080) in 0.12 s, exiting 75 (requeue)``.

    ``saved`` says what became of the state (saved, already saved, not saved and why); without this
    line the log of a preempted attempt reads like one that stopped for no reason.
    """
    asked = "preemption requested" if signal_name == "request" else signal_name
    return f"{asked} at step {step}: {saved}, exiting {REQUEUE_EXIT_CODE} (requeue)"


_told_to_stop: list[int | None] = [None]


def told_to_stop() -> int | None:
    """The preemption signal any guard of this process received, even one whose session then ended otherwise.

    A session that ends because its group broke (a peer lost mid-collective) drops its own flag; a rank
    that would then wait for the group to re-form must know it was told to stop meanwhile.
    """
    return _told_to_stop[0]


__all__ = ["PREEMPT_SIGNALS", "GuardVerdict", "Preempted", "PreemptionGuard", "preemption_line", "told_to_stop"]
