"""The preemption guard on its own: handlers in and out, the flag, the group's view, an injected preemption."""

from __future__ import annotations

import signal
import threading
from typing import Any

from gpufleet.jobs.protocol import REQUEUE_EXIT_CODE
from gpufleet.runtime.components.guard import PREEMPT_SIGNALS, GuardVerdict, Preempted, PreemptionGuard


class FakeSignals:
    """``signal.signal``'s shape over a table: what is installed, without touching the process."""

    def __init__(self) -> None:
        self.handlers: dict[int, Any] = {sig: f"previous-{sig}" for sig in PREEMPT_SIGNALS}

    def __call__(self, sig: int, handler: Any) -> Any:
        previous, self.handlers[sig] = self.handlers[sig], handler
        return previous


def test_arming_installs_a_handler_for_each_signal_and_disarming_puts_the_old_ones_back() -> None:
    fake = FakeSignals()
    guard = PreemptionGuard(install=fake)
    guard.arm()
    assert guard.armed and all(fake.handlers[sig] == guard.on_signal for sig in PREEMPT_SIGNALS)
    guard.disarm()
    assert not guard.armed and fake.handlers == FakeSignals().handlers


def test_no_handlers_when_the_script_keeps_its_own_or_off_the_main_thread() -> None:
    fake = FakeSignals()
    PreemptionGuard(handle_signals=False, install=fake).arm()
    off_main = PreemptionGuard(install=fake)
    thread = threading.Thread(target=off_main.arm)
    thread.start()
    thread.join()
    assert fake.handlers == FakeSignals().handlers


def test_a_signal_only_sets_the_flag_and_the_next_boundary_decides_to_save_and_exit() -> None:
    guard = PreemptionGuard(install=FakeSignals())
    assert guard.decide() is GuardVerdict.CONTINUE and guard.signal_name == "request"
    guard.on_signal(signal.SIGUSR1, None)
    assert guard.requested and guard.signal_name == "SIGUSR1"
    assert guard.decide() is GuardVerdict.SAVE_AND_EXIT


def test_a_real_sigterm_reaches_the_flag_and_the_previous_handler_comes_back() -> None:
    seen: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        previous = signal.getsignal(signal.SIGTERM)
        guard = PreemptionGuard()
        guard.arm()
        signal.raise_signal(signal.SIGTERM)
        assert guard.requested and guard.signal_name == "SIGTERM" and not seen
        guard.disarm()
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_rank_stops_on_what_the_ranks_agreed_not_on_its_own_signal() -> None:
    asked = PreemptionGuard(distributed=True, install=FakeSignals())
    asked.request()
    assert asked.raised_here and not asked.requested  # told to the others at the next agreement first
    assert asked.decide() is GuardVerdict.CONTINUE
    other = PreemptionGuard(distributed=True, install=FakeSignals())
    for guard in (asked, other):
        guard.note_agreement(True)
    assert other.requested and other.signal_name == "SIGTERM"  # another rank's signal, taken as SIGTERM
    assert asked.decide() is other.decide() is GuardVerdict.SAVE_AND_EXIT


def test_an_injected_preemption_is_owed_until_the_next_decision_point() -> None:
    guard = PreemptionGuard(distributed=True, install=FakeSignals())
    guard.inject_at = 3
    guard.note_step(2)
    assert guard.decide() is GuardVerdict.CONTINUE
    guard.note_step(3)
    guard.note_step(4)  # a step closed between two agreements: not a decision point
    assert guard.decide() is GuardVerdict.SAVE_AND_EXIT and guard.agreed and guard.signal_name == "SIGTERM"


def test_preempted_exits_with_the_requeue_status_and_names_its_step() -> None:
    err = Preempted(7)
    assert isinstance(err, SystemExit) and err.code == REQUEUE_EXIT_CODE and err.step == 7
