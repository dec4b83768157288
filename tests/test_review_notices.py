"""Preemption notices on a node whose store or signals fail for a moment."""

from __future__ import annotations

from test_notices import Scripted, wait_for

from gpufleet.backends.notices import Notice, NoticeWatcher


def test_a_notice_whose_handling_failed_is_handled_again_at_the_next_poll() -> None:
    notice = Notice("aws", 100.0, 10.0, "terminate")
    source = Scripted([notice])  # the provider keeps saying it
    handled: list[Notice] = []
    calls: list[Notice] = []
    logged: list[str] = []

    def flaky(n: Notice) -> None:
        calls.append(n)
        if len(calls) == 1:
            raise OSError("database is locked")
        handled.append(n)

    watcher = NoticeWatcher([source], flaky, poll_s=0.001, log=logged.append).start()
    try:
        wait_for(lambda: source.polls > 6)
    finally:
        watcher.stop()
    assert handled == [notice]  # handled once it could be, and only once
    assert logged == ["handling the aws notice failed: database is locked"]
