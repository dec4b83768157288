"""A spot notice on the local backend: the running job saves at once, exits 75, and waits out the drain."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import drive, run_cli
from test_notices import Fake, fake, iso, never_link_local

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.notices import NoticeDrain, attach
from gpufleet.cost.gather import cost_report
from gpufleet.jobs.store import latest_step
from gpufleet.spec import parse_spec

__all__ = ["fake", "never_link_local"]  # fixtures shared with the unit tests

ACTION = "/latest/meta-data/spot/instance-action"


class DrainingScheduler(LocalScheduler):
    """The local scheduler as it consults a notice drain: no attempt starts while one is in force."""

    drain: NoticeDrain | None = None

    def _schedule(self) -> None:
        if self.drain is not None and self.drain.draining():
            return
        super()._schedule()


@pytest.fixture
def watched(home: Path, fake: Fake) -> Iterator[tuple[LocalBackend, DrainingScheduler]]:
    fake.answer("PUT", "/latest/api/token", 200, "tok")
    fake.answer("GET", ACTION, 404)
    drain = attach(home, {"GPUFLEET_NOTICES": "aws", "GPUFLEET_NOTICE_URL_AWS": fake.url}, poll_s=0.05)
    assert drain is not None and drain.watcher is not None
    scheduler = DrainingScheduler(home, slots=1, poll_s=0.02)
    scheduler.drain = drain
    yield LocalBackend(home, spawn=False), scheduler
    drain.watcher.stop()
    scheduler.shutdown(grace_s=5)


def test_spot_notice_saves_at_once_drains_and_shows_its_lead_in_the_cost_note(
    watched: tuple[LocalBackend, DrainingScheduler],
    fake: Fake,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend, scheduler = watched
    spec: dict[str, Any] = {
        "name": "spotty",
        "team": "t",
        "entrypoint": "gpufleet.workloads.toy:train",
        "args": {"steps": 300, "step_seconds": 0.02},
        "checkpoint": {"every_steps": 1000, "grace_seconds": 60},  # no periodic save: only the notice's
    }
    job = backend.submit(parse_spec(spec))
    drive(scheduler, lambda: (latest_step(backend.store, job) or 0) >= 10)

    fake.answer("GET", ACTION, 200, json.dumps({"action": "terminate", "time": iso(time.time() + 120)}))
    drive(scheduler, lambda: backend.store.attempts(job)[0].outcome is not None)
    first = backend.store.attempts(job)[0]
    assert (first.exit_code, first.outcome) == (75, "requeued")
    notice = backend.store.events(job, kinds=("preemption_notice",))[0]
    assert notice.attempt == 1 and notice.data["source"] == "aws"
    assert 100 <= notice.data["lead_s"] <= 120
    saved = backend.store.events(job, kinds=("checkpoint",))
    signalled = backend.store.events(job, kinds=("preempt_signal",))[0]
    assert [e.data["reason"] for e in saved] == ["preempt"]
    assert saved[0].data["step"] == signalled.data["step"] and signalled.data["signal"] == "SIGUSR1"

    for _ in range(20):  # the notice is in force: the requeued job is not started again
        scheduler.tick()
    assert len(backend.store.attempts(job)) == 1 and backend.store.job(job).state == "queued"

    fake.answer("GET", ACTION, 404)  # withdrawn
    drive(scheduler, lambda: backend.store.job(job).state == "completed")
    restored = next(e for e in backend.store.events(job, kinds=("restore",)) if e.attempt == 2)
    assert restored.data["step"] == signalled.data["step"]  # no step lost

    report = cost_report(backend.store, job_ids=[job], out=tmp_path / "note")
    assert report.note is not None
    markdown = report.note.markdown.read_text()
    assert (
        "## Preemption notices" in markdown and "a spot notice (aws) 1" in markdown and "s ahead; saved in" in markdown
    )
    attempts = json.loads(report.note.json.read_text())["jobs"][0]["attempts"]
    assert attempts[0]["preemption_notice"]["source"] == "aws" and attempts[1]["preemption_notice"] is None

    code, out, _ = run_cli(capsys, monkeypatch, "cost", "--job", str(job), "--json")
    assert code == 0
    (listed,) = json.loads(out)["jobs"][0]["preemption_notices"]
    assert listed["attempt"] == 1 and listed["source"] == "aws" and 100 <= listed["lead_s"] <= 120
    assert listed["saved_s"] > 0
