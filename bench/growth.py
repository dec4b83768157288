"""How the read-only commands grow with the store: 1,000, 10,000 and 100,000 jobs in one home.

    .venv/bin/python bench/growth.py [--json] [--sizes 1000,10000,100000] [--steps 200] [--runs 5]

A fleet tool is used for months: its store fills with tens of thousands of jobs and millions of event
lines. Each size is a home written straight into the store (no scheduler runs), the way months of use
leave it: jobs of 8 teams, most completed, some failed, cancelled, queued or running, 1 to 3 attempts
each (the first ones preempted), and per job ``--steps`` step events plus a checkpoint event every
50 steps and the backend's own events. Homes are kept under ``.dev/growth/`` (the 100,000-job one
takes minutes to write) and reused by the next run; ``--fresh`` writes them again.

Timed for each size, the way a person runs them (a fresh process each time, bytecode cached; the
median wall and CPU time of ``--runs`` interleaved rounds): ``gpufleet jobs``, ``jobs --json``, ``cost``,
``show ID`` (a job in the middle), and at the largest size, in the same rounds, ``jobs`` and ``cost`` in an
empty home (the floor: what start-up costs in the machine's state of the moment); the p95 of
``GET /api/jobs?limit=50`` (and by team) and of ``GET /api/fleet`` on ``gpufleet serve --cache 0``; one local
scheduler round (``tick``, no slot free) over the queue; and the home's size on disk per job. Target: every
command within ``--target`` seconds (0.5 s) at the largest size; the table shows how each grows from size to size
(x10 jobs: a ratio near 1 is flat, near 10 is linear).
"""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _common as common

TARGET_S = 0.5
API_TARGET_S = 0.05
TEAMS = [f"team-{i}" for i in range(8)]
HOMES = common.REPO_ROOT / ".dev" / "growth"
LAYOUT_VERSION = 1
"""Bumped when what a generated home holds changes, so an old one is not reused."""
GPUFLEET = [sys.executable, "-c", "from gpufleet.cli.app import main; main()"]
CHECKPOINT_EVERY = 50


def _spec_json(name: str, team: str, rng: random.Random) -> str:
    from gpufleet.jobs.store import _stored_spec
    from gpufleet.spec import parse_spec

    gpus = rng.choice([1, 1, 2, 4, 8])
    spec = parse_spec(
        {
            "name": name,
            "team": team,
            "entrypoint": "python train.py --lr 3e-4",
            "workdir": "/srv/train",
            "resources": {"gpus": gpus, "gpu_type": rng.choice(["H100", "A100", "L4"])},
            "checkpoint": {"every_steps": CHECKPOINT_EVERY},
            "spot": rng.random() < 0.6,
        }
    )
    return str(_stored_spec(spec))


def _job_story(job_id: int, rng: random.Random, start: float, steps: int) -> dict[str, Any]:
    """One job's rows: its state, attempts and events, as a scheduler and the runtime would have left them."""
    roll = rng.random()
    state = (
        "completed"
        if roll < 0.90
        else "failed"
        if roll < 0.95
        else "cancelled"
        if roll < 0.97
        else "queued"
        if roll < 0.99
        else "running"
    )
    n_attempts = 0 if state == "queued" else rng.choice([1, 1, 1, 1, 1, 1, 1, 2, 2, 3])
    events: list[tuple[int, int | None, float, str, str, str]] = [
        (job_id, None, start, "queued", "backend", '{"priority": 0}')
    ]
    attempts: list[tuple[int, int, str, int, float, float | None, int | None, str | None]] = []
    ts, step = start + rng.uniform(1, 60), 0
    per_attempt = max(1, steps // max(n_attempts, 1))
    for n in range(1, n_attempts + 1):
        last = n == n_attempts
        began = ts
        events.append((job_id, n, ts, "placed", "backend", json.dumps({"offer": "local/cpu", "gpu_type": "H100"})))
        events.append((job_id, n, ts, "attempt_start", "backend", json.dumps({"gpus": 1, "world_size": 1})))
        events.append((job_id, n, ts + 1, "session_start", "runtime", json.dumps({"pid": 1000 + n})))
        events.append((job_id, n, ts + 2, "train_start", "runtime", json.dumps({"step": step, "data_position": step})))
        for _ in range(per_attempt):
            step += 1
            ts += 30.0
            loss = 3.0 / (1 + step / 100)
            data = {"step": step, "loss": round(loss, 6), "tokens_per_s": 51234.5, "data_position": step * 32}
            events.append((job_id, n, ts, "step", "runtime", json.dumps(data)))
            if step % CHECKPOINT_EVERY == 0:
                ckpt = {"step": step, "seconds": 0.8, "bytes": 52428800, "why": "every_steps"}
                events.append((job_id, n, ts, "checkpoint", "runtime", json.dumps(ckpt)))
        running = last and state == "running"
        outcome = None if running else ("preempted" if not last else state)
        ended = None if running else ts + 5
        code = None if running else (0 if outcome == "completed" else 1 if outcome == "failed" else 75)
        if not running:
            events.append((job_id, n, ts + 4, "session_end", "runtime", json.dumps({"status": outcome})))
            events.append((job_id, n, ts + 5, "attempt_end", "backend", json.dumps({"outcome": outcome})))
        attempts.append((job_id, n, "running" if running else "ended", 4000 + n, began, ended, code, outcome))
        ts += rng.uniform(60, 600)
    return {"state": state, "attempts": attempts, "events": events, "updated": ts}


def build_home(home: Path, n_jobs: int, steps: int, seed: int = 0) -> None:
    """Write a home of ``n_jobs`` jobs straight into its store (minutes for 100,000)."""
    from gpufleet.jobs.store import Store
    from gpufleet.paths import state_db

    home.mkdir(parents=True)
    Store(state_db(home)).close()  # the schema, as gpufleet writes it
    rng = random.Random(seed)
    specs = {(team, i): _spec_json(f"run-{i}", team, rng) for team in TEAMS for i in range(4)}
    db = sqlite3.connect(state_db(home))
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    start = time.time() - 90 * 86400
    batch = 2000
    for first in range(1, n_jobs + 1, batch):
        jobs, attempts, events = [], [], []
        for job_id in range(first, min(first + batch, n_jobs + 1)):
            team = TEAMS[job_id % len(TEAMS)]
            at = start + job_id * (80 * 86400 / n_jobs)
            story = _job_story(job_id, rng, at, steps)
            spec = specs[(team, job_id % 4)]
            name = f"run-{job_id % 4}"
            reason = "exit code 1" if story["state"] == "failed" else None
            jobs.append((job_id, name, team, 0, "local", story["state"], spec, at, story["updated"], 0, reason))
            attempts += story["attempts"]
            events += story["events"]
        with db:
            db.executemany(
                "INSERT INTO jobs (id, name, team, priority, backend, state, spec, submitted_at, updated_at,"
                " restarts, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                jobs,
            )
            db.executemany(
                "INSERT INTO attempts (job_id, n, state, pid, started_at, ended_at, exit_code, outcome)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                attempts,
            )
            db.executemany(
                "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, ?, ?, ?, ?, ?)", events
            )
        common.progress(f"  {min(first + batch - 1, n_jobs):,} of {n_jobs:,} jobs written")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def home_for(n_jobs: int, steps: int, fresh: bool) -> Path:
    """The generated home of ``n_jobs`` jobs, written once and reused (``fresh``: written again)."""
    import shutil

    home = HOMES / f"v{LAYOUT_VERSION}-{n_jobs}-jobs-{steps}-steps"
    done = home / ".complete"
    if fresh and home.exists():
        shutil.rmtree(home)
    if not done.exists():
        if home.exists():
            shutil.rmtree(home)  # a run stopped while writing it
        common.progress(f"writing a home of {n_jobs:,} jobs ({steps} step events each) in {home}")
        build_home(home, n_jobs, steps)
        done.write_text("")
    return home


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


API_PATHS = {"/api/jobs": "/api/jobs?limit=50", "/api/jobs?team=": "/api/jobs?team=team-3&limit=50"}
"""The paged list (target p95 <= 50 ms), filtered by team too, timed against a served home with its cache off."""
FLEET_PATH = "/api/fleet"


def api_p95(home: Path, runs: int, env: dict[str, str], paths: dict[str, str]) -> dict[str, float]:
    """p95 seconds of ``runs`` GETs of each path on ``gpufleet serve`` over ``home``, its view cache off
    (``--cache 0``: every answer is read from the store), one connection kept alive, after the server's own
    warm-up and one warm-up GET of each path."""
    import http.client
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpufleet-growth-") as folder:
        port_file = Path(folder) / "port"
        argv = [*GPUFLEET, "serve", "--port", "0", "--no-token", "--cache", "0", "--port-file", str(port_file)]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            while not port_file.exists() or not port_file.read_text().strip():
                if proc.poll() is not None:
                    said = proc.stderr.read().decode()[-300:] if proc.stderr else ""
                    raise SystemExit(f"gpufleet serve exited {proc.returncode}: {said}")
                time.sleep(0.05)
            conn = http.client.HTTPConnection("127.0.0.1", int(port_file.read_text()), timeout=600)
            # The server brings the cost cache up to date as it starts, and a cost request waits for that: one
            # for a team with no jobs (a small answer) waits for the start to settle, so the timed GETs do not
            # share the CPU with it.
            conn.request("GET", "/api/cost?team=growth-bench-none")
            conn.getresponse().read()
            out = {}
            for name, path in paths.items():
                times = []
                for i in range(runs + 1):
                    started = time.perf_counter()
                    conn.request("GET", path)
                    response = conn.getresponse()
                    response.read()
                    if response.status != 200:
                        raise SystemExit(f"GET {path}: {response.status}")
                    if i:  # the first warms the imports and the page cache
                        times.append(time.perf_counter() - started)
                out[name] = sorted(times)[max(0, math.ceil(0.95 * len(times)) - 1)]
            conn.close()
            return out
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def scheduler_tick_s(home: Path, runs: int) -> float:
    """Median seconds of one local scheduler decision round (``tick``) over ``home``'s queue, no slot free (so
    nothing is launched): what each of its rounds costs with that many jobs waiting and ended behind it."""
    from gpufleet.backends.local.scheduler import LocalScheduler, no_fleet

    sched = LocalScheduler(home, slots=0, fleet=no_fleet)
    sched.tick()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        sched.tick()
        times.append(time.perf_counter() - started)
    sched.store.close()
    return common.median(times)


FLOOR = ("jobs", "cost")
"""Commands also timed in an empty home, in the same rounds as the largest size: start-up, imports and drawing,
which no store makes faster (the growth a store adds is the difference)."""


def commands(n_jobs: int) -> Iterator[tuple[str, list[str]]]:
    yield "jobs", ["jobs"]
    yield "jobs --json", ["jobs", "--json"]
    yield "cost", ["cost"]
    yield "show ID", ["show", str(n_jobs // 2)]


def plot(result: dict[str, Any], path: Path) -> str:
    """The curves of ``result`` (what ``--json`` prints): seconds of each command and p95 of each GET, by jobs."""
    from gpufleet.plotting import figure, save_figure

    sizes = sorted(int(n) for n in result["sizes"])
    rows = [result["sizes"][str(n)] for n in sizes]
    fig, (cli, api) = figure(1, 2, size=(11, 4.2))
    colours = {}
    for name in rows[0]["commands"]:
        (line,) = cli.plot(sizes, [r["commands"][name]["wall"] for r in rows], marker="o", label=f"gpufleet {name}")
        colours[name] = line.get_color()
    cli.axhline(result["target_s"], color="grey", linestyle="--", label=f"target {result['target_s']} s")
    for name, figures in result.get("floor", {}).items():  # the same command with no job, in the same rounds
        colour = colours.get(name, "grey")
        cli.axhline(figures["wall"], color=colour, linestyle=":", label=f"gpufleet {name} with no job (floor)")
    for name in rows[0]["api_p95"]:
        api.plot(sizes, [r["api_p95"][name] * 1000 for r in rows], marker="o", label=f"GET {name}")
    api.axhline(API_TARGET_S * 1000, color="grey", linestyle="--", label="paged list target")
    for ax, unit in ((cli, "seconds, fresh process (median)"), (api, "ms (p95)")):
        ax.set_xscale("log")
        ax.set_xlabel("jobs in the home")
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    cli.set_title("read-only commands")
    api.set_title("gpufleet serve --cache 0")
    return save_figure(fig, path)


def main() -> int:
    p = common.parser(__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--sizes", default="1000,10000,100000", help="jobs per home, comma-separated")
    p.add_argument("--steps", type=int, default=200, help="step events per job")
    p.add_argument("--runs", type=int, default=5, help="fresh processes timed per command and size")
    p.add_argument("--target", type=float, default=TARGET_S, help="seconds a command may take at the largest size")
    p.add_argument("--fresh", action="store_true", help="write the homes again")
    p.add_argument("--plot", type=Path, help="also draw the curves into this image (.png, .svg)")
    p.add_argument("--api-runs", type=int, default=50, help="GETs timed per API path and size (p95)")
    p.add_argument("--api-target", type=float, default=API_TARGET_S, help="p95 seconds of the paged API list")
    p.add_argument("--fleet-up-to", type=int, default=100_000, help="time GET /api/fleet only up to this many jobs")
    args = p.parse_args()
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        p.error(f"--sizes {args.sizes!r}: give whole numbers of jobs, e.g. 1000,10000")
    if not sizes or sizes[0] < 2:
        p.error(f"--sizes {args.sizes!r}: give sizes of at least 2 jobs")
    if args.runs < 1 or args.steps < 1:
        p.error("--runs and --steps: give at least 1")
    env = {**os.environ, "COLUMNS": "120", "PYTHONPYCACHEPREFIX": str(HOMES / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    figures: dict[int, dict[str, Any]] = {}
    empty = HOMES / "empty"  # the floor: the same commands where there is no job at all
    empty.mkdir(parents=True, exist_ok=True)
    floor: dict[str, dict[str, float]] = {}
    for n in sizes:
        home = home_for(n, args.steps, args.fresh)
        env["GPUFLEET_HOME"] = str(home)
        row: dict[str, Any] = {"disk_bytes_per_job": disk_bytes(home) / n, "commands": {}}
        cases = [(name, [*GPUFLEET, *argv], dict(env)) for name, argv in commands(n)]
        if n == sizes[-1]:  # timed in the same rounds: what the machine's state adds to every command
            cases += [(f"floor {name}", [*GPUFLEET, name], {**env, "GPUFLEET_HOME": str(empty)}) for name in FLOOR]
        common.progress(f"{n:,} jobs: {', '.join(name for name, _, _ in cases)} ({args.runs} interleaved rounds)")
        for name, (wall, cpu) in common.interleaved_times(cases, args.runs).items():
            if name.startswith("floor "):
                floor[name.removeprefix("floor ")] = {"wall": wall, "cpu": cpu}
            else:
                row["commands"][name] = {"wall": wall, "cpu": cpu}
        row["scheduler_tick_s"] = scheduler_tick_s(home, args.runs * 4)
        common.progress(f"{n:,} jobs: GET {', '.join(API_PATHS.values())} ({args.api_runs} each)")
        row["api_p95"] = api_p95(home, args.api_runs, env, API_PATHS)
        if n <= args.fleet_up_to:
            common.progress(f"{n:,} jobs: GET {FLEET_PATH} ({max(3, args.api_runs // 10)})")
            row["api_p95"].update(api_p95(home, max(3, args.api_runs // 10), env, {FLEET_PATH: FLEET_PATH}))
        figures[n] = row
    largest = figures[sizes[-1]]["commands"]
    slowest = max(v["wall"] for v in largest.values())
    api_slowest = max(figures[sizes[-1]]["api_p95"][name] for name in API_PATHS)
    ok = slowest <= args.target and api_slowest <= args.api_target
    names = [name for name, _ in commands(sizes[0])]
    rows = []
    for i, n in enumerate(sizes):
        cells = [f"{n:,}"]
        for name in names:
            wall = figures[n]["commands"][name]["wall"]
            growth = ""
            if i:
                prev = figures[sizes[i - 1]]["commands"][name]["wall"]
                growth = f" (x{common.ratio(wall, prev):.1f})"
            cells.append(f"{wall:.3f}{growth}")
        api = figures[n]["api_p95"]
        cells += [f"{api[name] * 1000:.1f}" for name in API_PATHS]
        cells.append(f"{api[FLEET_PATH] * 1000:.0f}" if FLEET_PATH in api else "-")
        cells.append(f"{figures[n]['scheduler_tick_s'] * 1000:.2f}")
        cells.append(f"{figures[n]['disk_bytes_per_job'] / 1024:.1f}")
        rows.append(cells)
    result = {
        "floor": floor,
        "runs": args.runs,
        "steps_per_job": args.steps,
        "target_s": args.target,
        "sizes": {str(n): figures[n] for n in sizes},
        "slowest_at_largest_s": slowest,
        "api_p95_at_largest_s": api_slowest,
    }
    if args.plot is not None:
        common.progress(f"curves: {plot(result, args.plot)}")
    return common.finish(
        json_mode=args.json,
        result=result,
        table=common.format_table(
            f"read-only commands, median wall s of {args.runs} fresh processes (growth from the size before)",
            ["jobs", *names, *(f"{p} p95 ms" for p in API_PATHS), f"{FLEET_PATH} p95 ms", "tick ms", "KiB/job"],
            rows,
        ),
        verdict=f"slowest command at {sizes[-1]:,} jobs: {slowest:.3f} s (target {args.target:.3f} s); "
        f"paged API p95 {api_slowest * 1000:.1f} ms (target {args.api_target * 1000:.0f} ms); "
        f"in the same rounds, with no job at all: "
        + ", ".join(f"{name} {v['wall']:.3f} s" for name, v in floor.items()),
        ok=ok,
    )


if __name__ == "__main__":
    sys.exit(main())
