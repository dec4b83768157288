"""The local scheduler with 10,000 jobs queued: its decisions per second, and how long a submit waits to run.

    .venv/bin/python bench/scheduler_queue.py [--json] [--finished 1000,100000] [--queued 10000] [--slots 4]
        [--rounds 30] [--latency-runs 5] [--bound 2.0]

A home used for months holds tens of thousands of finished jobs behind the ones waiting; the scheduler
must not slow down with them. Each home is a copy of one of ``bench/growth.py``'s (kept under
``.dev/growth/``, written there once if missing; never changed here) in a temporary folder, in which the
jobs it left unfinished are ended (their attempts name made-up PIDs, which a scheduler adopting them
would signal), so that it holds exactly ``N`` finished jobs, and ``--queued`` jobs are queued into it.

1. Decisions (in this process, ``LocalScheduler.tick`` with ``--slots`` slots, warm start off): each
   round waits, untimed, until the attempts of the round before have exited, then times the one tick
   that reaps them and starts the next ``--slots`` queued jobs. Each job runs ``true`` behind the
   attempt's death-signal shim, so the spawn (fork and exec, timed apart around the scheduler's own
   ``_start``) is the only part that is not the scheduler's: a decision is the rest of the tick per job
   started (read the queue, choose, record the attempt and its events, reap the one before). The rounds
   of the homes alternate, each home first every other round, so a busy machine slows both alike; the
   copies are on disk before (fsync), so that no write-back of one slows its rounds. Target: the median
   decision at the largest home within ``--bound`` times the one at the smallest. A cost that grows with the finished
   jobs at all (a scan of them, a list of them) would show about x100 from 1,000 to 100,000; a B-tree
   one level deeper costs a few percent, and two interleaved runs of the same home differ by up to
   x1.3 on a shared machine: hence x2. Apart from the rounds, "queue read" times the read of the queue's
   head a tick makes (``Store.queued_ids`` reads 64 ids a page, and a tick stops at the first job that
   does not fit): flat in the jobs queued as in the jobs ended.
2. Submit to running (the scheduler process a user gets, started as ``LocalBackend.submit`` starts it,
   ``process.ensure_scheduler``, with 2 slots): the queue's first job (priority 1, ``sleep``) holds one
   slot, and the other queued jobs (priority 0) need 2, so the second slot stays free. "free slot": a
   priority-1 job that runs ``true`` is submitted with ``LocalBackend.submit`` while the slot is free,
   after a pause of 0 to 0.2 s (the scheduler has just reaped the one before: a submit right then would
   always wait a whole poll); timed from before the submit to the ``started_at`` the scheduler records
   with the job's ``running`` state (one transaction). "turn": a priority-1 job holds the free slot for
   a second, the same quick job is submitted behind it, and the wait is timed from the moment the first
   one's process ends (it writes the time as its last act) to the quick job's ``started_at``. Medians of
   ``--latency-runs``; the scheduler polls every 0.1 s, so either waits half of that on average.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import _common as common
import growth

from gpufleet.backends.local import LocalBackend, LocalScheduler, process
from gpufleet.backends.local.scheduler import no_fleet
from gpufleet.backends.local.warm import AttemptProcess
from gpufleet.jobs.store import TERMINAL, Store, _stored_spec
from gpufleet.paths import job_dir, state_db
from gpufleet.spec import JobSpec, parse_spec

BOUND = 2.0
HEADER = ["finished", "decision ms (IQR)", "decisions/s", "spawn ms", "starts/s", "queue read ms", "free slot ms"]
HEADER += ["of which submit ms", "turn ms"]
LATENCY_SLOTS = 2
HOLD_S = 1.0
"""How long the job ahead of the quick one holds the slot in the "turn" case (its submit must land before)."""
QUIET = {"GPUFLEET_WARM_START": "0"}
"""The attempts run ``true`` and ``sh``, which a warm server (an interpreter with torch imported) cannot fork."""


def job_spec(name: str, team: str, command: list[str], *, priority: int = 0, gpus: int = 1) -> JobSpec:
    fields = {"name": name, "team": team, "entrypoint": command, "priority": priority, "resources": {"gpus": gpus}}
    return parse_spec(fields)


def copy_home(source: Path, into: Path) -> int:
    """``into``: a home with ``source``'s store and every job of it finished; returns how many.

    Each job ``source`` holds cancelled also gets the handled cancel request ``gpufleet cancel`` leaves
    behind (``growth.py`` writes none), which every tick's look for new requests passes over."""
    into.mkdir(mode=0o700)
    shutil.copyfile(state_db(source), state_db(into))
    db = sqlite3.connect(state_db(into))
    ended = ",".join(f"'{s}'" for s in TERMINAL)
    with db:
        db.execute(  # what `gpufleet cancel` left of each cancelled job: a handled request
            "INSERT INTO requests (job_id, kind, grace, created_at, handled_at)"
            " SELECT id, 'cancel', NULL, updated_at, updated_at FROM jobs WHERE state='cancelled'"
        )
        db.execute(
            "UPDATE attempts SET state='ended', ended_at=COALESCE(ended_at, started_at),"
            " outcome=COALESCE(outcome, 'cancelled'), exit_code=COALESCE(exit_code, 75) WHERE state!='ended'"
        )
        db.execute(f"UPDATE jobs SET state='cancelled', reason='ended before the bench' WHERE state NOT IN ({ended})")
    finished = int(db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])
    db.close()
    return finished


def on_disk(path: Path) -> None:
    """Wait until ``path`` is written out, so that the kernel's write-back of a fresh copy is not timed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def queue(home: Path, specs: Sequence[JobSpec], laid_out: int) -> list[int]:
    """Queue ``specs`` in ``home``'s store, in order, as ``submit`` records them (the job row and its ``queued``
    event); the first ``laid_out`` also get the folder ``submit`` leaves (``logs/``, ``spec.json``)."""
    db = sqlite3.connect(state_db(home))
    first = int(db.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0]) + 1
    now = time.time()
    ids = list(range(first, first + len(specs)))
    stored = {id(s): _stored_spec(s) for s in specs}
    with db:
        db.executemany(
            "INSERT INTO jobs (id, name, team, priority, backend, state, spec, submitted_at, updated_at)"
            " VALUES (?, ?, ?, ?, 'local', 'queued', ?, ?, ?)",
            [(i, s.name, s.team, s.priority, stored[id(s)], now, now) for i, s in zip(ids, specs, strict=True)],
        )
        db.executemany(
            "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, NULL, ?, 'queued', 'backend', ?)",
            [(i, now, f'{{"priority": {s.priority}}}') for i, s in zip(ids, specs, strict=True)],
        )
    db.close()
    on_disk(state_db(home))
    for job_id, spec in zip(ids[:laid_out], specs, strict=False):
        folder = job_dir(home, job_id)
        (folder / "logs").mkdir(mode=0o700, parents=True)
        (folder / "spec.json").write_text(spec.model_dump_json(indent=2), encoding="utf-8")
    return ids


def drop_queued(home: Path) -> None:
    """Forget the jobs still queued (those of part 1), so that part 2 queues its own into the same history."""
    db = sqlite3.connect(state_db(home))
    for (job_id,) in db.execute("SELECT id FROM jobs WHERE state='queued'").fetchall():
        shutil.rmtree(job_dir(home, job_id), ignore_errors=True)
    with db:
        db.execute("DELETE FROM events WHERE job_id IN (SELECT id FROM jobs WHERE state='queued')")
        db.execute("DELETE FROM jobs WHERE state='queued'")
    db.close()


class TimedScheduler(LocalScheduler):
    """The local scheduler, with the time spent starting processes (fork and exec) summed apart."""

    spawn_s = 0.0

    def _start(self, argv: list[str], env: Mapping[str, str], workdir: str | None, log: IO[bytes]) -> AttemptProcess:
        started = time.perf_counter()
        try:
            return super()._start(argv, env, workdir, log)
        finally:
            self.spawn_s += time.perf_counter() - started


def decision_rounds(homes: dict[int, Path], slots: int, rounds: int) -> dict[int, dict[str, Any]]:
    """Per home: the median seconds of a decision, of a spawn and of a tick per job started, and of a read of the
    queue's head (the first page of ``Store.queued_ids``), over ``rounds`` rounds (see part 1)."""
    scheds = {n: TimedScheduler(home, slots=slots, fleet=no_fleet) for n, home in homes.items()}
    seen: dict[int, dict[str, list[float]]] = {n: {"tick": [], "spawn": [], "queue": []} for n in homes}
    warmup = 3

    def settle() -> None:  # no attempt of any home still running: each tick has the machine to itself
        for sched in scheds.values():
            for run in sched.running.values():
                run.proc.wait()

    try:
        for r in range(warmup + rounds):
            for n, sched in sorted(scheds.items(), reverse=r % 2 == 1):  # each home first every other round
                settle()
                spawn0 = sched.spawn_s
                began = time.perf_counter()
                sched.tick()
                took = time.perf_counter() - began
                if len(sched.running) != slots:
                    raise SystemExit(f"{n:,} finished: a round started {len(sched.running)} jobs, not {slots}")
                if r >= warmup:
                    seen[n]["tick"].append(took / slots)
                    seen[n]["spawn"].append((sched.spawn_s - spawn0) / slots)
            if r % 10 == 0:
                common.progress(f"  decision round {r + 1} of {warmup + rounds}")
        for _ in range(rounds):  # apart from the ticks
            for n, sched in scheds.items():
                began = time.perf_counter()
                next(iter(sched.store.queued_ids()))
                seen[n]["queue"].append(time.perf_counter() - began)
    finally:
        for sched in scheds.values():
            sched.shutdown(grace_s=5)
            sched.store.close()
    out: dict[int, dict[str, Any]] = {}
    for n, s in seen.items():
        decide = sorted(t - sp for t, sp in zip(s["tick"], s["spawn"], strict=True))
        out[n] = {
            "decision_s": common.median(decide),
            "decision_iqr_s": [decide[len(decide) // 4], decide[(3 * len(decide)) // 4]],
            "spawn_s": common.median(s["spawn"]),
            "tick_per_job_s": common.median(s["tick"]),
            "queue_read_s": common.median(s["queue"]),
            "decisions_per_s": 1 / common.median(decide),
            "starts_per_s": 1 / common.median(s["tick"]),
        }
    return out


def wait_for(what: str, ready: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def started_at(store: Store, job_id: int, timeout: float = 60.0) -> float:
    """The ``started_at`` of the job's first attempt, once the scheduler has recorded it."""
    wait_for(f"job {job_id} to start", lambda: bool(store.attempts(job_id)), timeout)
    return store.attempts(job_id)[0].started_at


def ended(store: Store, job_id: int) -> Callable[[], bool]:
    return lambda: store.job(job_id).state in TERMINAL


def submit_latencies(home: Path, runs: int, stamps: Path) -> dict[str, Any]:
    """Part 2 on ``home`` (its queue already in place): the scheduler process, started as ``submit`` starts it."""
    saved = common.set_environ(
        {**QUIET, "GPUFLEET_HOME": str(home), "GPUFLEET_LOCAL_SLOTS": str(LATENCY_SLOTS),
         "GPUFLEET_SCHEDULER_IDLE_S": "300"}
    )  # fmt: skip
    backend = LocalBackend(home)
    store = backend.store
    quick = job_spec("quick", "team-0", ["true"], priority=1)
    free, submit, turn, turn_total = [], [], [], []
    phase = random.Random(0)
    try:
        head = next(iter(store.queued_ids()))
        process.ensure_scheduler(home)
        started_at(store, head)  # the holder of the first slot runs: the queue's head now needs 2
        for _ in range(runs):
            time.sleep(phase.uniform(0, 0.2))  # a user's submit lands anywhere in the scheduler's 0.1 s poll
            before = time.time()
            job = backend.submit(quick)
            submit.append(time.time() - before)
            free.append(started_at(store, job) - before)
            wait_for(f"job {job} to end", ended(store, job))
        for i in range(runs):
            stamp = stamps / f"held-{i}"
            holder = job_spec("holder", "team-0", ["sh", "-c", f"sleep {HOLD_S}; date +%s.%N > {stamp}"], priority=1)
            held = backend.submit(holder)
            started_at(store, held)
            before = time.time()
            job = backend.submit(quick)
            start = started_at(store, job)
            exited = float(stamp.read_text())
            if before >= exited:
                common.progress(f"  turn {i}: the slot was free before the submit (slow submit); not counted")
            else:
                turn.append(start - exited)
                turn_total.append(start - before)
            wait_for(f"job {job} to end", ended(store, job))
    finally:
        pid = process.scheduler_pid(home)
        if pid is not None and pid > 0:
            os.kill(pid, signal.SIGTERM)  # it preempts the holder and exits
            wait_for("the scheduler to exit", lambda: process.scheduler_pid(home) is None)
        store.close()
        common.restore_environ(saved)
    if not turn:
        raise SystemExit("no 'turn' run counted: every submit took longer than the holder's second")
    return {
        "free_slot_s": common.median(free),
        "free_slot_runs_s": free,
        "submit_call_s": common.median(submit),
        "turn_s": common.median(turn),
        "turn_runs_s": turn,
        "turn_submit_to_running_s": common.median(turn_total),
    }


def main() -> int:
    p = common.parser(__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--finished", default="1000,100000", help="finished jobs per home (growth.py's sizes)")
    p.add_argument("--queued", type=int, default=10_000, help="jobs queued into each home")
    p.add_argument("--slots", type=int, default=4, help="slots of the decision rounds (jobs started per round)")
    p.add_argument("--rounds", type=int, default=30, help="timed decision rounds per home")
    p.add_argument("--latency-runs", type=int, default=5, help="submits timed per case and home")
    p.add_argument("--bound", type=float, default=BOUND, help="largest/smallest median decision allowed")
    p.add_argument("--steps", type=int, default=200, help="step events per job of growth.py's homes")
    args = p.parse_args()
    try:
        sizes = sorted({int(s) for s in args.finished.split(",") if s.strip()})
    except ValueError:
        p.error(f"--finished {args.finished!r}: give whole numbers of jobs, e.g. 1000,100000")
    if len(sizes) < 2 or sizes[0] < 2:
        p.error(f"--finished {args.finished!r}: give two sizes or more, of at least 2 jobs")
    laid_out = args.slots * (args.rounds + 4)
    if args.queued < laid_out or args.rounds < 1 or args.latency_runs < 1 or args.slots < 1:
        p.error(f"--queued must cover the jobs the rounds start ({laid_out}); --rounds, --slots, --latency-runs >= 1")
    t0 = time.monotonic()
    saved = common.set_environ(QUIET)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-sched-"))
    try:
        homes, finished = {}, {}
        teams = growth.TEAMS
        decide_specs = [job_spec(f"queued-{i % 4}", teams[i % len(teams)], ["true"]) for i in range(len(teams) * 4)]
        for n in sizes:
            source = growth.home_for(n, args.steps, fresh=False)
            common.progress(f"copying the home of {n:,} jobs ({state_db(source).stat().st_size / 2**20:,.0f} MiB)")
            homes[n] = work / f"home-{n}"
            finished[n] = copy_home(source, homes[n])
            queue(homes[n], [decide_specs[i % len(decide_specs)] for i in range(args.queued)], laid_out)
        common.progress(f"decisions: {args.rounds} rounds of {args.slots} starts per home, interleaved")
        decisions = decision_rounds(homes, args.slots, args.rounds)
        latency = {}
        for n in sizes:
            drop_queued(homes[n])
            holder = job_spec("first", "team-1", ["sleep", "600"], priority=1)
            big = [job_spec(f"big-{i % 4}", teams[i % len(teams)], ["true"], gpus=2) for i in range(len(teams) * 4)]
            queue(homes[n], [holder, *(big[i % len(big)] for i in range(args.queued - 1))], 1)
            common.progress(f"{n:,} finished: submit to running, {args.latency_runs} runs per case")
            latency[n] = submit_latencies(homes[n], args.latency_runs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        common.restore_environ(saved)
    small, large = sizes[0], sizes[-1]
    growth_ratio = common.ratio(decisions[large]["decision_s"], decisions[small]["decision_s"])
    ok = growth_ratio <= args.bound
    elapsed = time.monotonic() - t0
    rows = []
    for n in sizes:
        d, lat = decisions[n], latency[n]
        lo, hi = d["decision_iqr_s"]
        rows.append([
            f"{finished[n]:,}",
            f"{d['decision_s'] * 1000:.2f} ({lo * 1000:.2f}-{hi * 1000:.2f})",
            f"{d['decisions_per_s']:,.0f}",
            f"{d['spawn_s'] * 1000:.2f}",
            f"{d['starts_per_s']:,.0f}",
            f"{d['queue_read_s'] * 1000:.1f}",
            f"{lat['free_slot_s'] * 1000:.0f}",
            f"{lat['submit_call_s'] * 1000:.0f}",
            f"{lat['turn_s'] * 1000:.0f}",
        ])  # fmt: skip
    result = {
        "queued": args.queued,
        "slots": args.slots,
        "rounds": args.rounds,
        "latency_runs": args.latency_runs,
        "finished": {str(n): finished[n] for n in sizes},
        "decisions": {str(n): decisions[n] for n in sizes},
        "latency": {str(n): latency[n] for n in sizes},
        "decision_ratio": growth_ratio,
        "bound": args.bound,
        "seconds": elapsed,
    }
    return common.finish(
        json_mode=args.json,
        result=result,
        table=common.format_table(
            f"local scheduler, {args.queued:,} jobs queued: medians ({args.rounds} rounds of {args.slots} starts; "
            f"{args.latency_runs} submits)",
            HEADER,
            rows,
        ),
        verdict=f"decision cost x{growth_ratio:.2f} from {finished[small]:,} to {finished[large]:,} finished jobs "
        f"(bound x{args.bound:g}); {elapsed:.0f} s",
        ok=ok,
    )


if __name__ == "__main__":
    sys.exit(main())
