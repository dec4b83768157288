"""The cost cache against a cold computation, after seeded random sequences of what backends write.

Each sequence submits jobs, starts, steps, checkpoints, preempts, fails and cancels them, writes late events,
notices and reasons, the way the local scheduler, the runtime's ingestion and remote sync write them; between
writes it reads ``cost_summary`` through the cache, for every job, one team, some jobs or another rate card,
at a frozen clock. Every read's figures must equal those of the same read with a cache in memory (what a
deleted cache gives): every job exactly; the team and fleet sums, which the cache keeps by triggers as rows
come and go, to one unit of their 6th significant digit (a sum in another order may round the other way).

Ten sequences run in ``make test`` (about 15 s); ``GPUFLEET_SOAK=1`` (``make soak``) runs a hundred.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_cost_cache import spec

from gpufleet.cost.gather import cost_summary
from gpufleet.jobs.store import Store

SEEDS = range(100) if os.environ.get("GPUFLEET_SOAK") else range(10)
STEPS = 120
TEAMS = ("nlp", "vision", "rl")
GPUS = ("H100", "A100", "L4", "TPUv9")  # TPUv9: priced by no card, so reported unpriced
PHASES = ("data_wait", "compute", "collective", "optimizer", "straggler_wait")
CARDS = {
    "usd": "currency: USD\nrates:\n  - {gpu_type: H100, on_demand: 3.1, spot: 1.3}\n"
    "  - {gpu_type: L4, on_demand: 0.7}\n",
    "eur": "currency: EUR\nrates:\n  - {gpu_type: '*', on_demand: 1.0, spot: 0.5}\n",
}


class Fleet:
    """A store written as backends write it, at a clock the test moves."""

    def __init__(self, rng: random.Random, home: Path, clock: list[float]) -> None:
        self.rng, self.clock = rng, clock
        self.store = Store(home / "state.db")
        self.offsets: dict[int, int] = {}
        self.step: dict[int, int] = {}

    def now(self) -> float:
        return self.clock[0]

    def jobs(self, *states: str) -> list[Any]:
        return [j for j in self.store.jobs() if j.state in states]

    def open_attempt(self, job_id: int) -> Any:
        return next((a for a in self.store.attempts(job_id) if a.ended_at is None), None)

    def runtime(self, job_id: int, events: list[dict[str, Any]]) -> None:
        """Events of the job's own process, as ingested from its events file."""
        self.offsets[job_id] = self.offsets.get(job_id, 0) + 1
        self.store.add_runtime_events(job_id, events, self.offsets[job_id])

    def pick_running(self) -> tuple[Any, int] | None:
        """A running job with an open attempt, and that attempt's number (None: no such job)."""
        running = [j for j in self.jobs("running") if self.open_attempt(j.id) is not None]
        if not running:
            return None
        job = self.rng.choice(running)
        return job, self.open_attempt(job.id).n

    # ---- what backends write ---------------------------------------------------------------------
    def submit(self) -> None:
        r = self.rng
        job = spec(f"j{r.randrange(99)}", r.choice(TEAMS), r.choice(GPUS), spot=r.random() < 0.6, gpus=r.choice((1, 4)))
        self.store.add_job(job, "local")

    def start(self) -> None:
        queued = self.jobs("queued")
        if not queued:
            return self.submit()
        job, now = self.rng.choice(queued), self.now()
        n = len(self.store.attempts(job.id)) + 1
        self.store.begin_attempt(job.id, n, now)
        if self.rng.random() < 0.2:
            return  # the process never said it started (it died at once, or is still importing)
        self.store.set_attempt_pid(job.id, n, 4242)
        gpus = job.spec.total_gpus
        self.store.add_event(job.id, "attempt_start", attempt=n, ts=now, pid=4242, gpus=gpus, world_size=gpus)
        first = self.step.get(job.id, 0)
        self.runtime(
            job.id,
            [
                {"ts": now + 1, "kind": "session_start", "attempt": n, "total_steps": 1000},
                {
                    "ts": now + 2,
                    "kind": "restore",
                    "attempt": n,
                    "step": first or None,
                    "seconds": 0.5,
                    "cause": "start",
                },
                {"ts": now + 3, "kind": "train_start", "attempt": n, "step": first},
            ],
        )
        return None

    def steps(self) -> None:
        picked = self.pick_running()
        if picked is None:
            return self.start()
        (job, n), r, now = picked, self.rng, self.now()
        k = r.randint(1, 5)
        events: list[dict[str, Any]] = []
        for i in range(k):
            self.step[job.id] = self.step.get(job.id, 0) + 1
            event = {"ts": now - k + i, "kind": "step", "attempt": n, "step": self.step[job.id], "loss": 1.0}
            if r.random() < 0.3:
                event["phase_totals_s"] = {p: [r.uniform(0, 5)] * job.spec.total_gpus for p in PHASES}
            events.append(event)
        if r.random() < 0.3:
            events.append({"ts": now, "kind": "checkpoint", "attempt": n, "step": self.step[job.id], "seconds": 2.5})
        if r.random() < 0.15:  # a step ingested late: an older time, a newer id
            events.append({"ts": now - 50, "kind": "step", "attempt": n, "step": 1, "loss": 2.0})
        if r.random() < 0.1:
            to = max(0, self.step[job.id] - 3)
            events.append(
                {"ts": now, "kind": "rollback", "attempt": n, "from_step": self.step[job.id], "to_step": to,
                 "restore_seconds": 1.5, "redone_seconds": 4.0, "skip_from": 1, "skip_to": 2}
            )  # fmt: skip
        self.runtime(job.id, events)
        return None

    def end(self) -> None:
        picked = self.pick_running()
        if picked is None:
            return self.start()
        (job, n), r, now = picked, self.rng, self.now()
        how = r.choice(("completed", "completed", "preempted", "failed", "killed", "requeued", "lost", "cancelled"))
        if how in ("preempted", "cancelled"):
            self.store.update_attempt(job.id, n, state="stopping", sigterm_at=now - 3)
            self.store.add_event(job.id, "sigterm", attempt=n, ts=now - 3, reason=how, grace=30.0)
        step = self.step.get(job.id, 0)
        if how == "completed":
            self.runtime(job.id, [{"ts": now - 1, "kind": "session_end", "attempt": n, "status": "completed"}])
        elif how in ("preempted", "requeued"):
            self.runtime(
                job.id,
                [
                    {
                        "ts": now - 2,
                        "kind": "checkpoint",
                        "attempt": n,
                        "step": step,
                        "seconds": 0.7,
                        "reason": "preempt",
                    },
                    {"ts": now - 1.5, "kind": "session_end", "attempt": n, "status": "requeue", "step": step},
                ],
            )
        code, outcome, state = {
            "completed": (0, "completed", "completed"),
            "preempted": (75, "preempted", "queued"),
            "failed": (1, "failed", "failed"),
            "killed": (-9, "failed", "failed"),
            "requeued": (75, "requeued", "queued"),
            "lost": (-9, "lost", "queued"),
            "cancelled": (-15, "cancelled", "cancelled"),
        }[how]
        ended = now - (r.uniform(0, 20) if r.random() < 0.3 else 0.0)  # the process ended before it was reaped
        restarts = job.restarts + 1 if state == "queued" else None
        self.store.end_attempt(
            job.id, n, ended_at=ended, exit_code=code, outcome=outcome, job_state=state, reason=None, restarts=restarts
        )
        return None

    def cancel_queued(self) -> None:
        queued = self.jobs("queued")
        if queued:
            job = self.rng.choice(queued)
            self.store.set_job_state(job.id, "cancelled", reason="cancelled while queued")
            self.store.add_event(job.id, "cancelled")

    def late_event(self) -> None:
        """A line of an ended job's events file ingested after its end, or a notice written late."""
        ended = [j for j in self.jobs("completed", "failed", "cancelled") if self.store.attempts(j.id)]
        if not ended:
            return
        job = self.rng.choice(ended)
        attempt = self.rng.choice(self.store.attempts(job.id))
        if self.rng.random() < 0.5:
            at = (attempt.ended_at or self.now()) - 5
            self.runtime(job.id, [{"ts": at, "kind": "checkpoint", "attempt": attempt.n, "step": 1, "seconds": 9.0}])
        else:
            at = attempt.started_at + 1
            self.store.add_event(job.id, "preemption_notice", attempt=attempt.n, ts=at, source="aws", lead_s=120.0)

    def notice(self) -> None:
        picked = self.pick_running()
        if picked is not None:
            job, n = picked
            self.store.add_event(job.id, "preemption_notice", attempt=n, ts=self.now(), source="gcp", lead_s=30.0)

    def reason(self) -> None:
        every = self.store.jobs()
        if every:
            self.store.set_reason(self.rng.choice(every).id, f"waits for r{self.rng.randrange(9)}")


def read(store: Store, cached: bool, **narrow: Any) -> dict[str, Any]:
    summary = cost_summary(store, limit=None, with_json=True, cached=cached, **narrow)
    assert summary.json_text is not None
    return dict(json.loads(summary.json_text))


def within_last_digit(warm: Any, cold: Any, where: str) -> None:
    """Sums kept in another order: equal, or one unit of the 6th significant digit apart."""
    if isinstance(warm, dict) and isinstance(cold, dict):
        assert warm.keys() == cold.keys(), where
        for key in warm:
            within_last_digit(warm[key], cold[key], f"{where}.{key}")
    elif isinstance(warm, float) and isinstance(cold, float) and warm != cold:
        unit = 10 ** (math.floor(math.log10(max(abs(warm), abs(cold)))) - 5)
        assert abs(warm - cold) <= 1.01 * unit, f"{where}: warm {warm} cold {cold}"
    else:
        assert warm == cold, f"{where}: warm {warm!r} cold {cold!r}"


@pytest.mark.parametrize("seed", SEEDS)
def test_every_cached_read_equals_a_cold_one(
    seed: int, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [2_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])  # every reader and writer in this process
    rng = random.Random(seed)
    home.mkdir()
    fleet = Fleet(rng, home, clock)
    cards = {}
    for name, text in CARDS.items():
        cards[name] = tmp_path / f"{name}.yaml"
        cards[name].write_text(text)
    writes: list[Callable[[], None]] = [fleet.submit, fleet.start, fleet.steps, fleet.steps, fleet.end]
    writes += [fleet.cancel_queued, fleet.late_event, fleet.notice, fleet.reason]
    for step in range(STEPS):
        clock[0] += rng.choice((0.0, 1.0, 10.0, 60.0))  # 0: writes and reads at one instant
        rng.choice(writes)()
        if rng.random() < 0.5:
            continue
        narrow: dict[str, Any] = {}
        pick = rng.random()
        ids = [j.id for j in fleet.store.jobs()]
        if pick < 0.2:
            narrow["team"] = rng.choice(TEAMS)
        elif pick < 0.35 and ids:
            narrow["job_ids"] = sorted(rng.sample(ids, min(len(ids), rng.randint(1, 3))))
        elif pick < 0.5:
            narrow["rates_path"] = cards[rng.choice(sorted(cards))]
        warm, cold = read(fleet.store, True, **narrow), read(fleet.store, False, **narrow)
        where = f"seed {seed}, step {step}, {narrow or 'every job'}"
        assert warm["jobs"] == cold["jobs"], where
        within_last_digit(
            {k: v for k, v in warm.items() if k != "jobs"}, {k: v for k, v in cold.items() if k != "jobs"}, where
        )
