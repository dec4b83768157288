"""``gpufleet demo --fleet``: a fleet of two providers and two GPU types that acts on its jobs.

Two teams share one Kueue-style cohort over H100s at two providers (AWS and GCP) and L40S at GCP.
What happens, each step decided by the scheduler and the planner, not by the script:

1. language starts two H100 jobs: the first in its nominal quota, the second **borrowing** the H100
   perception lends, on AWS spot (the cheapest H100);
2. perception starts two H100 jobs: the first in the H100 it keeps for itself, the second needs the
   lent one back: the borrower is **reclaimed** (it saves, requeues, waits for quota);
3. a spot **storm** hits AWS us-east-1: two preemptions in the failover window **block the region**,
   and its jobs **fail over** to GCP, their checkpoints copied there (verified, egress charged);
4. every job completes; the cost note prices each attempt at its offer's price, with the egress and
   the move on the timeline.

The scheduler runs in this process on a fresh state folder under ``$GPUFLEET_HOME/demo-fleet/``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.pools import use_fleet
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store, latest_step
from gpufleet.spec import JobSpec, parse_spec

STEP_SECONDS = 0.05
STORM_START_S = 35.0
"""The storm begins this long after the fleet is put in use (by then the quota story has played out)."""

FLEET: dict[str, Any] = {
    "as_of": "2026-12-01",
    "currency": "USD",
    "gpu_types": {
        "H100": {"memory_gib": 80, "throughput": {"training": 1.0}},
        "L40S": {"memory_gib": 48, "throughput": {"training": 0.35}},
    },
    "offers": [
        {"provider": "aws", "region": "us-east-1", "gpu_type": "H100", "gpus_per_node": 1,
         "on_demand_per_gpu_hour": 6.88, "spot_per_gpu_hour": 2.60, "capacity_gpus": 2,
         "spot_preemptions_per_hour": 0.10, "egress_per_gb": 0.09},
        {"provider": "gcp", "region": "us-central1", "gpu_type": "H100", "gpus_per_node": 1,
         "on_demand_per_gpu_hour": 11.06, "spot_per_gpu_hour": 3.70, "capacity_gpus": 2,
         "spot_preemptions_per_hour": 0.08, "egress_per_gb": 0.12},
        {"provider": "gcp", "region": "us-central1", "gpu_type": "L40S", "gpus_per_node": 1,
         "on_demand_per_gpu_hour": 2.25, "capacity_gpus": 1, "egress_per_gb": 0.12},
    ],
    "quotas": [
        {"team": "perception", "gpu_type": "H100", "nominal": 2, "lending_limit": 1, "cohort": "research"},
        {"team": "language", "gpu_type": "H100", "nominal": 1, "borrowing_limit": 1, "cohort": "research"},
        {"team": "language", "gpu_type": "L40S", "nominal": 1, "cohort": "research"},
    ],
    "pools": [
        {"offer": "aws/us-east-1/H100",
         "storms": [{"start_s": STORM_START_S, "end_s": 3600, "preemptions_per_hour": 720}]},
        {"offer": "gcp/us-central1/H100"},
        {"offer": "gcp/us-central1/L40S"},
    ],
    "failover": {"preemptions": 2, "window_minutes": 10, "cooldown_minutes": 60},
    "seed": 0,
}  # fmt: skip


def fleet_demo_specs() -> list[JobSpec]:
    """language's two H100 jobs and its L40S one, then perception's two H100 jobs."""

    def job(name: str, team: str, gpu_type: str, steps: int, spot: bool) -> JobSpec:
        return parse_spec(
            {
                "name": name,
                "team": team,
                "entrypoint": "gpufleet.workloads.toy:train",
                "args": {"steps": steps, "step_seconds": STEP_SECONDS},
                "resources": {"gpu_type": gpu_type, "gpus": 1},
                "spot": spot,
                "checkpoint": {"every_steps": 25, "grace_seconds": 20},
                "placement": {"gpu_hours": steps * STEP_SECONDS / 3600, "checkpoint_gb": 0.001},
            },
            source="demo --fleet",
        )

    return [
        job("lm-pretrain-a", "language", "H100", 1200, True),
        job("lm-pretrain-b", "language", "H100", 600, True),
        job("lm-eval", "language", "L40S", 300, False),
        job("det-a", "perception", "H100", 500, True),
        job("det-b", "perception", "H100", 1000, True),
    ]


@dataclass(frozen=True, slots=True)
class FleetDemo:
    home: Path
    jobs: dict[str, int]
    """Job name -> id."""


STORY = (
    EventKind.PLACED,
    EventKind.RECLAIMED_BY,
    EventKind.SPOT_PREEMPTED,
    EventKind.FAILOVER,
    EventKind.CHECKPOINT_MOVED,
    EventKind.COMPLETED,
)


def story_line(store: Store, job_id: int, kind: str, data: dict[str, Any]) -> str:
    """One line of the demo's story for an event of :data:`STORY`."""
    name = f"#{job_id} {store.job(job_id).name}"
    if kind == EventKind.PLACED:
        market = "spot" if data.get("spot") else "on-demand"
        borrowed = f", borrowing {data['borrowed_gpus']} GPU of the cohort" if data.get("borrowed_gpus") else ""
        return f"{name} placed on {data.get('offer')} {market} at ${data.get('price_per_gpu_hour')}/GPU-h{borrowed}"
    if kind == EventKind.RECLAIMED_BY:
        return f"{name} is reclaimed: job #{data.get('job')}'s team wants its lent H100 back"
    if kind == EventKind.SPOT_PREEMPTED:
        return f"{name} spot-preempted on {data.get('offer')} (storm: {data.get('rate_per_hour')}/h)"
    if kind == EventKind.FAILOVER:
        return f"{name} fails over: {data.get('target')} blocked ({data.get('why')})"
    if kind == EventKind.CHECKPOINT_MOVED:
        money = data.get("egress_money") or 0.0
        return (
            f"{name} checkpoint step {data.get('step')} moved {data.get('source')} -> {data.get('target')}: "
            f"{data.get('bytes')} bytes, verified, egress ${money:.6f}"
        )
    return f"{name} completed"


def run_fleet_demo(home: Path, *, say: Callable[[str], None], timeout_s: float = 900.0) -> FleetDemo:
    """Run the scenario to its end (every job ended); ``say`` gets one line per story event."""
    import time

    home.mkdir(parents=True, exist_ok=True)
    fleet_path = home / "demo-fleet.yaml"
    fleet_path.write_text(yaml.safe_dump(FLEET, sort_keys=False))
    use_fleet(home, fleet_path)
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, poll_s=0.05)
    store = backend.store
    specs = {s.name: s for s in fleet_demo_specs()}
    ids: dict[str, int] = {}
    seen: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s

    def running(name: str) -> bool:
        return name in ids and store.job(ids[name]).state == "running"

    def tick() -> None:
        scheduler.tick()
        for job_id in ids.values():
            events = store.events(job_id, kinds=STORY)
            for event in events[seen.get(job_id, 0) :]:
                say(story_line(store, job_id, event.kind, event.data))
            seen[job_id] = len(events)
        time.sleep(0.05)

    def submit(name: str) -> None:
        ids[name] = backend.submit(specs[name])
        say(f"submitted #{ids[name]} {name}: team {specs[name].team}, {specs[name].resources.gpu_type}")

    # Submissions follow the states the scheduler reaches, never a clock.
    script: list[tuple[Callable[[], bool], list[str]]] = [
        (lambda: True, ["lm-pretrain-a", "lm-pretrain-b", "lm-eval"]),
        (lambda: running("lm-pretrain-a") and running("lm-pretrain-b"), ["det-a"]),
        (lambda: running("det-a") and (latest_step(store, ids["lm-pretrain-b"]) or 0) >= 50, ["det-b"]),
    ]
    try:
        for ready, names in script:
            while not ready():
                if time.monotonic() > deadline:
                    raise TimeoutError("the fleet demo did not reach its next step")
                tick()
            for name in names:
                submit(name)
        while any(store.job(i).state not in ("completed", "failed", "cancelled") for i in ids.values()):
            if time.monotonic() > deadline:
                raise TimeoutError("the fleet demo's jobs did not end")
            tick()
        tick()
    finally:
        scheduler.shutdown()
    return FleetDemo(home, ids)


__all__ = ["FLEET", "STORY", "FleetDemo", "fleet_demo_specs", "run_fleet_demo", "story_line"]
