"""Per-rank phase timing: what it costs a step, how fast it names a straggler, how fast it names a hang.

    .venv/bin/python bench/rank_phases.py [--json] [--rounds 30] [--trials 10] [--parts overhead,detection,hang]
        [--straggler-factor F]

Three parts, each against its target (exit 1 when one is missed):

- **overhead**: a 2-rank DDP tinylm loop (gloo on CPU, two accumulated micro-batches a step) inside a
  ``TrainSession``, with phase timing on and off (``phase_timing=False``, what ``GPUFLEET_PHASE_TIMING=0``
  does), in ``--rounds`` interleaved rounds (on, off, off, on, ...; a fresh session each). Each
  round's figure is the median time of a block of ``agree_every`` steps (each block pays one
  agreement); the overhead is the median over rounds of on / off - 1, in rank 0's wall time (the
  target, <= 1 %) and in its CPU time (shown: on a shared machine it is less exposed to the neighbours).
- **detection**: ``--trials`` real 2-rank runs each (``tests/runtime/_user_ddp_loop.py`` under
  ``torch.distributed.run`` with the job's spec, event log and checkpoint folder exported as a backend
  does) of (a) rank 1's compute 1.5x slower from step 31 (its forwards also busy-loop for half its own
  compute time of a step), (b) rank 1's data 3x slower from step 31, (c) no fault. Target: in (a) and
  (b) every trial names rank 1 in the right phase (a ``straggler`` event) within 20 steps of the onset,
  and names nothing else; in (c) no ``straggler`` event at all.
- **hang**: a 2-rank job on the local backend (``distributed.recovery`` requeue) whose rank 1 is
  SIGSTOPped mid-run. Target: a ``rank_stalled`` event names rank 1 with ``hung: true`` within
  max(10 x median step, 30 s) of the stop (the defaults of ``hang_factor`` and ``hang_floor_seconds``),
  and the job completes in its second attempt.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common as common

SCRIPT = common.REPO_ROOT / "tests" / "runtime" / "_user_ddp_loop.py"
PARTS = ("overhead", "detection", "hang")
TARGET_OVERHEAD = 0.01
ONSET = 31
WITHIN_STEPS = 20
TRIAL_STEPS = 60
SCENARIOS = {"compute": ("compute", 1.5), "data": ("data_wait", 3.0)}
"""Injected fault -> (the phase the straggler must be named in, the slowdown factor)."""
HANG_STEPS = 240
HANG_STOP_AT = 40
TIMEOUT_S = 600.0


def main(argv: list[str]) -> int:
    p = common.parser("Per-rank phase timing: overhead, straggler detection, hang detection.")
    p.add_argument(
        "--rounds",
        type=int,
        default=30,
        help="interleaved rounds of the overhead (default 30: fewer leave its median to the noise)",
    )
    p.add_argument("--steps", type=int, default=48, help="timed steps per session of the overhead (default 48)")
    p.add_argument("--trials", type=int, default=10, help="runs of each detection scenario (default 10)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated parts (default {','.join(PARTS)})")
    p.add_argument(
        "--straggler-factor", type=float, default=None, help="distributed.straggler_factor (default: the spec's)"
    )
    args = p.parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if args.rounds < 1 or args.steps < 8 or args.trials < 1 or not parts or set(parts) - set(PARTS):
        p.error(f"--rounds and --trials must be >= 1, --steps >= 8, --parts a subset of {','.join(PARTS)}")
    if args.straggler_factor is not None and not 1 < args.straggler_factor <= 1000:
        p.error(f"--straggler-factor {args.straggler_factor}: give a number above 1 (distributed.straggler_factor)")
    if common.under_torchrun():
        return overhead_rank(args.rounds, args.steps)
    result: dict[str, Any] = {"benchmark": "rank_phases", "parts": parts}
    tables: list[str] = []
    verdicts: list[str] = []
    ok = True
    for part in parts:
        figures, table, verdict, met = RUNNERS[part](args)
        result[part] = {**figures, "target_met": met}
        tables.append(table)
        verdicts.append(verdict)
        ok = ok and met
    return common.finish(
        json_mode=args.json, result=result, table="\n\n".join(tables), verdict="; ".join(verdicts), ok=ok
    )


# ---- overhead: one torchrun, phase timing on and off in interleaved sessions ----------------------------


def overhead_part(args: Any) -> tuple[dict[str, Any], str, str, bool]:
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-bench-phases-"))
    out = folder / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__]
    cmd += ["--rounds", str(args.rounds), "--steps", str(args.steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", common.RANK_RESULT_ENV: str(out)}
    common.progress(f"overhead: {args.rounds} rounds of phase timing on and off, 2 ranks under torchrun (gloo)")
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False, timeout=TIMEOUT_S)
        if proc.returncode != 0 or not out.exists():
            return (
                {"error": f"torchrun exited {proc.returncode}"},
                "overhead: the ranks failed",
                "overhead: no figure",
                False,
            )
        payload = json.loads(out.read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return payload["result"], payload["table"], payload["verdict"], bool(payload["ok"])


def overhead_rank(rounds: int, steps: int) -> int:
    """One rank of the overhead part; rank 0 writes the figures (``common.write_rank_result``)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from gpufleet.runtime.group import current_group
    from gpufleet.workloads.tinylm import build

    torch.set_num_threads(1)
    group = current_group()
    corpus, plain, _, _ = build(
        seed=1337, context=CONTEXT, layers=2, heads=4, embed=128, dropout=0.1, lr=3e-3, steps=10_000
    )
    model = DistributedDataParallel(plain)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def step(at: int) -> tuple[list[torch.Tensor], int]:
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for micro in range(2):
            x, y = corpus.batch("train", 2 * at + micro, BATCH, CONTEXT, 1337)
            x, y = x[group.rank :: group.world_size], y[group.rank :: group.world_size]
            with model.no_sync() if micro == 0 else contextlib.nullcontext():
                _, loss = model(x, y)
                (loss / 2).backward()
            losses.append(loss.detach())
        optimizer.step()
        return losses, 2 * x.numel()

    made = Path(tempfile.mkdtemp(prefix="gpufleet-bench-phases-ranks-")) if group.is_main else None
    work: Path = group.broadcast(made)
    blocks: dict[str, dict[bool, list[float]]] = {m: {True: [], False: []} for m in METRICS}
    ratios: dict[str, list[float]] = {m: [] for m in METRICS}
    seen: dict[bool, bool] = {True: False, False: False}
    try:
        for r in range(rounds):
            for timing in (True, False) if r % 2 == 0 else (False, True):
                folder = work / f"round-{r}-{int(timing)}"
                times, phases_seen = timed_session(model, optimizer, step, group, folder, timing, steps)
                for metric in METRICS:
                    blocks[metric][timing].extend(times[metric])
                seen[timing] = seen[timing] or phases_seen
            for metric in METRICS:
                on, off = (blocks[metric][t][-len(times[metric]) :] for t in (True, False))
                ratios[metric].append(common.ratio(common.median(on), common.median(off)))
    finally:
        group.barrier()
        if group.is_main:
            shutil.rmtree(work, ignore_errors=True)
    if not group.is_main:
        return 0
    write_overhead(blocks, ratios, seen, params=sum(p.numel() for p in plain.parameters()))
    return 0


AGREE_EVERY = 4
WARMUP_STEPS = 8
BATCH = 16
"""Rows of a micro-batch over both ranks."""
CONTEXT = 32
METRICS = ("wall", "cpu")


def timed_session(
    model: Any, optimizer: Any, step: Callable[[int], Any], group: Any, folder: Path, timing: bool, steps: int
) -> tuple[dict[str, list[float]], bool]:
    """One session of ``steps`` timed steps: the wall and CPU seconds of each block of ``AGREE_EVERY`` steps,
    and whether the session's step events carried per-rank phases."""
    from gpufleet.runtime import EventLog, TrainSession
    from gpufleet.spec import CheckpointPolicy, HealthPolicy

    events = folder / "events.jsonl"
    sess = TrainSession(
        ckpt_dir=folder / "checkpoints",
        model=model,
        optimizer=optimizer,
        total_steps=WARMUP_STEPS + steps,
        policy=CheckpointPolicy(every_steps=100_000, keep=1),
        health=HealthPolicy(),
        events=EventLog(events) if group.is_main else None,
        group=group,
        agree_every=AGREE_EVERY,
        log_every_s=0.5,
        echo=False,
        phase_timing=timing,
    )
    ends: dict[str, list[float]] = {m: [] for m in METRICS}
    with sess:
        for _ in sess.steps():
            losses, tokens = step(sess.data_position)
            sess.report(losses, tokens=tokens)
            if sess.step >= WARMUP_STEPS and sess.step % AGREE_EVERY == 0:
                ends["wall"].append(time.perf_counter())
                ends["cpu"].append(time.process_time())
    seen = group.is_main and any("rank_phase_s" in e for e in read_events(events) if e.get("kind") == "step")
    return {m: [b - a for a, b in itertools.pairwise(ends[m])] for m in METRICS}, seen


def write_overhead(
    blocks: dict[str, dict[bool, list[float]]], ratios: dict[str, list[float]], seen: dict[bool, bool], params: int
) -> None:
    overhead = {m: common.median(ratios[m]) - 1 for m in METRICS}
    switched = seen[True] and not seen[False]
    ok = overhead["wall"] <= TARGET_OVERHEAD and switched
    median = {(m, t): common.median(blocks[m][t]) for m in METRICS for t in (True, False)}
    rows = [
        [
            "phase timing off (baseline)",
            str(len(blocks["wall"][False])),
            f"{median['wall', False] * 1e3:.2f}",
            f"{median['cpu', False] * 1e3:.2f}",
            "",
            "",
            "",
        ],
        [
            "phase timing on",
            str(len(blocks["wall"][True])),
            f"{median['wall', True] * 1e3:.2f}",
            f"{median['cpu', True] * 1e3:.2f}",
            f"{overhead['wall']:+.2%}",
            f"{overhead['cpu']:+.2%}",
            "wall <= 1%",
        ],
    ]
    table = common.format_table(
        f"Overhead: {AGREE_EVERY}-step blocks of a tinylm DDP step on 2 ranks (gloo, 1 thread each; {params:,} "
        f"params, 2 micro-batches), {len(ratios['wall'])} interleaved rounds; overhead = median over rounds of "
        "on/off (rank 0's wall and CPU time)",
        ["variant", "blocks", "wall ms", "cpu ms", "wall overhead", "cpu overhead", "target"],
        rows,
    )
    result = {
        "block_steps": AGREE_EVERY,
        "rounds": len(ratios["wall"]),
        "round_ratios_wall": ratios["wall"],
        "round_ratios_cpu": ratios["cpu"],
        "median_block_on_s": median["wall", True],
        "median_block_off_s": median["wall", False],
        "median_block_cpu_on_s": median["cpu", True],
        "median_block_cpu_off_s": median["cpu", False],
        "overhead": overhead["wall"],
        "overhead_cpu": overhead["cpu"],
        "phases_in_events_on": seen[True],
        "phases_in_events_off": seen[False],
        "target": {"overhead_max": TARGET_OVERHEAD},
    }
    verdict = f"overhead {overhead['wall']:+.2%} wall, {overhead['cpu']:+.2%} CPU (target <= {TARGET_OVERHEAD:.0%})"
    if not switched:
        verdict += "; phase timing did not switch (step events with and without rank_phase_s expected)"
    common.write_rank_result(result=result, table=table, verdict=verdict, ok=ok)


# ---- detection: real runs of the user's DDP script under torchrun -------------------------------------


def read_events(path: Path) -> list[dict[str, Any]]:
    """The event log's valid records (a missing log has none); a torn or malformed line is skipped."""
    from gpufleet.jobs.events import read_events as read_log

    return read_log(path)[0]


def trial_spec(straggler_factor: float | None) -> dict[str, Any]:
    distributed: dict[str, Any] = {"strategy": "ddp", "timeout_seconds": 120}
    if straggler_factor is not None:
        distributed["straggler_factor"] = straggler_factor
    return {
        "name": "rank-phases",
        "entrypoint": ["python", str(SCRIPT), "--steps", str(TRIAL_STEPS)],
        "resources": {"gpus": 2, "cpus": 2},
        "distributed": distributed,
        "checkpoint": {"every_steps": 1000, "keep": 1},
    }


def run_trial(fault: str | None, straggler_factor: float | None) -> list[dict[str, Any]]:
    """One 2-rank run of the user's script; its events."""
    from gpufleet.spec import parse_spec

    folder = Path(tempfile.mkdtemp(prefix="gpufleet-bench-phases-trial-"))
    try:
        spec = parse_spec(trial_spec(straggler_factor), source="bench")
        (folder / "spec.json").write_text(spec.model_dump_json(), encoding="utf-8")
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "GPUFLEET_SPEC": str(folder / "spec.json"),
            "GPUFLEET_EVENTS": str(folder / "events.jsonl"),
            "GPUFLEET_CKPT_DIR": str(folder / "checkpoints"),
            "GPUFLEET_JOB_DIR": str(folder),
        }
        if fault is not None:
            env.update(SLOW_RANK="1", SLOW_FROM=str(ONSET), SLOW_KIND=fault, SLOW_FACTOR=str(SCENARIOS[fault][1]))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(SCRIPT)]
        cmd += ["--steps", str(TRIAL_STEPS)]
        proc = subprocess.run(
            cmd, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False, timeout=TIMEOUT_S
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the run exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-800:]}")
        return read_events(folder / "events.jsonl")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def judge_trial(fault: str | None, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What one run's ``straggler`` events say, against its fault."""
    named = [e for e in events if e.get("kind") == "straggler" and e.get("status") == "named"]
    finals = [e for e in events if e.get("kind") == "straggler"]
    end = next((e for e in events if e.get("kind") == "session_end"), {})
    totals = end.get("phase_totals_s") if isinstance(end.get("phase_totals_s"), dict) else None
    row: dict[str, Any] = {"fault": fault, "stragglers": len(named), "phase_totals_s": totals}
    if fault is None:
        row["ok"] = not finals
        return row
    phase = SCENARIOS[fault][0]
    first = named[0] if named else None
    right = [e for e in named if e.get("rank") == 1 and e.get("phase") == phase]
    wrong = [e for e in named if e not in right]
    delay = int(first["step"]) - ONSET if first is not None and isinstance(first.get("step"), int) else None
    last = [e for e in finals if e.get("rank") == 1 and e.get("phase") == phase]
    row.update(
        named_step=None if first is None else first.get("step"),
        delay_steps=delay,
        factor=None if first is None else first.get("factor"),
        tax_s=last[-1].get("tax_s") if last else None,
        wrong=[(e.get("rank"), e.get("phase"), e.get("step")) for e in wrong],
    )
    row["ok"] = bool(right) and first in right and not wrong and delay is not None and 0 <= delay <= WITHIN_STEPS
    return row


def detection_part(args: Any) -> tuple[dict[str, Any], str, str, bool]:
    rows: dict[str, list[dict[str, Any]]] = {"compute": [], "data": [], "healthy": []}
    for n in range(args.trials):
        for name in ("compute", "data", "healthy"):
            fault = None if name == "healthy" else name
            try:
                row = judge_trial(fault, run_trial(fault, args.straggler_factor))
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                row = {"fault": fault, "ok": False, "error": str(err)[-300:]}
            rows[name].append(row)
            common.progress(f"detection trial {n + 1}/{args.trials} {name}: {summary(row)}")
    return detection_figures(rows)


def summary(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"error {row['error']}"
    if row["fault"] is None:
        return f"{row['stragglers']} straggler event(s)"
    return (
        f"named at step {row['named_step']} (delay {row['delay_steps']}), factor {row['factor']}, wrong {row['wrong']}"
    )


def detection_figures(rows: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], str, str, bool]:
    table_rows = []
    figures: dict[str, Any] = {"onset_step": ONSET, "within_steps": WITHIN_STEPS, "trials": rows}
    for name, runs in rows.items():
        hits = sum(1 for r in runs if r["ok"])
        delays = [r["delay_steps"] for r in runs if r.get("delay_steps") is not None]
        factors = [float(r["factor"]) for r in runs if isinstance(r.get("factor"), int | float)]
        what = f"{hits}/{len(runs)} named right" if name != "healthy" else f"{hits}/{len(runs)} with none"
        table_rows.append(
            [
                name if name == "healthy" else f"{name} x{SCENARIOS[name][1]:g} on rank 1",
                what,
                f"{statistics.median(delays):g}" if delays else "-",
                f"{max(delays)}" if delays else "-",
                f"{statistics.median(factors):.2f}" if factors else "-",
                "10/10" if name != "healthy" else "0 events",
            ]
        )
        figures[f"{name}_ok"] = hits
    figures["data_wait_share_healthy"] = data_share(rows["healthy"])
    ok = all(r["ok"] for runs in rows.values() for r in runs)
    table = common.format_table(
        f"Straggler detection, {TRIAL_STEPS}-step 2-rank DDP runs of {SCRIPT.name}, fault from step {ONSET}; "
        f"healthy data wait {figures['data_wait_share_healthy'] or 0:.0%} of a rank's time",
        ["scenario", "result", "median delay", "max delay", "factor", "target"],
        table_rows,
    )
    verdict = ", ".join(f"{row[0]}: {row[1]}" for row in table_rows)
    return figures, table, verdict, ok


def data_share(healthy: list[dict[str, Any]]) -> float | None:
    """The data wait's share of the ranks' time in the healthy runs (``session_end``'s totals)."""
    shares = []
    for row in healthy:
        totals = row.get("phase_totals_s")
        if not totals:
            continue
        phases = ("data_wait", "compute", "collective", "optimizer", "checkpoint")
        whole = sum(sum(totals.get(p) or []) for p in phases)
        if whole > 0:
            shares.append(sum(totals.get("data_wait") or []) / whole)
    return statistics.median(shares) if shares else None


# ---- hang: a SIGSTOPped rank of a job on the local backend -------------------------------------------


def hang_part(args: Any) -> tuple[dict[str, Any], str, str, bool]:
    with contextlib.redirect_stdout(sys.stderr):  # the in-process scheduler's notes; stdout is the result's
        return run_hang()


def run_hang() -> tuple[dict[str, Any], str, str, bool]:
    from gpufleet.backends.local import LocalBackend, LocalScheduler
    from gpufleet.spec import parse_spec

    home = Path(tempfile.mkdtemp(prefix="gpufleet-bench-phases-hang-"))
    saved = common.set_environ({"GPUFLEET_HOME": str(home), "GPUFLEET_LOCAL_SLOTS": "2"})
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=2, poll_s=0.05)
    stopped: int | None = None
    try:
        spec = parse_spec(
            {
                "name": "rank-phases-hang",
                "entrypoint": ["python", str(SCRIPT), "--steps", str(HANG_STEPS)],
                "resources": {"gpus": 2, "cpus": 2},
                "distributed": {"strategy": "ddp", "timeout_seconds": 300},
                "checkpoint": {"every_steps": 20, "keep": 2, "grace_seconds": 30},
                "max_restarts": 2,
            },
            source="bench",
        )
        job = backend.submit(spec)
        store = backend.store

        def tick_until(what: str, found: Callable[[], Any]) -> Any:
            deadline = time.monotonic() + TIMEOUT_S
            while (value := found()) is None or value is False:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"timed out waiting for {what}")
                scheduler.tick()
                time.sleep(scheduler.poll_s)
            return value

        def running_rank() -> int | None:
            events = [e for e in store.events(job, kinds=["group", "step"]) if e.attempt == 1]
            groups = [e for e in events if e.kind == "group"]
            steps = [int(e.data.get("step") or 0) for e in events if e.kind == "step"]
            if not groups or not steps or max(steps) < HANG_STOP_AT:
                return None
            return int(groups[-1].data["ranks"][1]["pid"])

        pid = tick_until("rank 1 to train", running_rank)
        os.kill(pid, signal.SIGSTOP)
        stopped, stopped_at = pid, time.time()
        common.progress(f"hang: rank 1 (pid {pid}) stopped")

        def stalled() -> Any:
            found = [e for e in store.events(job, kinds=["rank_stalled"]) if e.attempt == 1]
            return found[0] if found else None

        event = tick_until("the rank_stalled event", stalled)
        common.progress(f"hang: named after {event.ts - stopped_at:.1f} s; waiting for the job to recover")
        tick_until("the job to end", lambda: store.job(job).state in ("completed", "failed", "cancelled"))
        return hang_figures(event.data, event.ts - stopped_at, store.job(job).state, store.attempts(job))
    except (TimeoutError, OSError, ValueError, KeyError) as err:
        return {"error": str(err)}, f"hang: {err}", f"hang: {err}", False
    finally:
        if stopped is not None and common_stopped(stopped):
            os.kill(stopped, signal.SIGCONT)
        scheduler.shutdown(grace_s=30)
        common.restore_environ(saved)
        shutil.rmtree(home, ignore_errors=True)


def common_stopped(pid: int) -> bool:
    """Whether ``pid`` is still a stopped process (the kill that should have ended it did not come)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] == "T"


def hang_figures(
    data: dict[str, Any], delay: float, state: str, attempts: list[Any]
) -> tuple[dict[str, Any], str, str, bool]:
    median = data.get("median_step_s")
    allowed = max(10 * float(median), 30.0) if isinstance(median, int | float) else 30.0
    outcomes = [str(a.outcome) if a.outcome is not None else None for a in attempts]
    named = data.get("ranks") == [1] and data.get("hung") is True
    recovered = state == "completed" and len(outcomes) >= 2 and outcomes[-1] == "completed"
    ok = named and delay <= allowed and recovered
    figures = {
        "delay_s": delay,
        "allowed_s": allowed,
        "threshold_s": data.get("threshold_s"),
        "median_step_s": median,
        "ranks": data.get("ranks"),
        "phases": data.get("phases"),
        "hung": data.get("hung"),
        "action": data.get("action"),
        "job_state": state,
        "attempt_outcomes": outcomes,
    }
    rows = [
        ["named", f"rank(s) {data.get('ranks')}, hung {data.get('hung')}, phase {data.get('phases')}", "rank 1"],
        ["delay from the stop", f"{delay:.1f} s", f"<= {allowed:.1f} s"],
        ["threshold (event)", f"{data.get('threshold_s')} s (median step {median} s)", ""],
        ["action", str(data.get("action")), "killed"],
        ["attempts", ", ".join(map(str, outcomes)), "requeued, completed"],
    ]
    table = common.format_table(
        f"Hang: rank 1 of a 2-rank DDP job SIGSTOPped past step {HANG_STOP_AT} (local backend, requeue)",
        ["", "measured", "target"],
        rows,
    )
    verdict = f"hang named after {delay:.1f} s (<= {allowed:.1f} s), job {state} in attempt {len(outcomes)}"
    return figures, table, verdict, ok


RUNNERS: dict[str, Callable[[Any], tuple[dict[str, Any], str, str, bool]]] = {
    "overhead": overhead_part,
    "detection": detection_part,
    "hang": hang_part,
}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
