"""Training stall of a background (``checkpoint.async``) save against a synchronous one, on 2 ranks.

    .venv/bin/python bench/dist_async_save.py [--json] [--ranks 2] [--mib 256] [--every 10] [--saves 4]
                                              [--rounds 2] [--batch 8] [--dir DIR]

Started without torchrun, it starts itself under ``torch.distributed.run --standalone`` (gloo on
CPU, one thread per rank). Every rank builds the state of ``dist_save_throughput``: a model of 8
square ``Linear`` layers sharded with FSDP2 and its AdamW state, weights + moments ``--mib`` in all.
It is trained, from the same start each time, through a real ``TrainSession`` that checkpoints
every ``--every`` steps: with synchronous saves, and with ``checkpoint: {async: true}`` (the state
is copied in memory and written in a background thread through a process group of its own);
``--rounds`` runs of each, in ABBA order (sync, async, async, sync, ...) since the load of the
machine drifts. Each step draws a batch of ``--batch`` random rows, minimises the mean square of
the output, and closes with ``session.report``. The first save of each run (and the steps before
it) is untimed; then ``--saves`` saves are timed, and the figures pool every run of a variant.

The stall of a checkpoint is measured two ways on rank 0:

* wall: the median time of ``report`` at a step that saves minus its median at a step that does
  not (everything the loop waits for: the health check of the state, the copy or the write, the
  ranks' agreement); the check of the state alone (``nonfinite_state``) is timed too;
* events: the ``checkpoint`` events' ``seconds`` (the write) for a synchronous save, and
  ``stall_seconds`` (the in-memory copy) for a background one.

A background save whose predecessor was still being written waits for it first (one write at a
time); such saves are counted and left out of the stall, and their extra time is reported on its
own. Also reported (information): the time of a whole interval of ``--every`` steps, and of a step
while a background write runs (the write takes CPU from training). Target: wall stall of the
background save <= 0.20 x the synchronous save's.

``--dir`` (default: a temporary folder in ``$GPUFLEET_HOME``, ``~/.gpufleet``, or the nearest
folder above it that exists) decides the filesystem, which is reported.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as common
import torch
from dist_save_throughput import LAYERS, MIB, build_state, default_parent

TARGET_RATIO = 0.20
WORK_ENV = "GPUFLEET_BENCH_DIST_ASYNC_DIR"
VARIANTS = ("sync", "async")


@dataclass(frozen=True, slots=True)
class Step:
    """One step on rank 0: which step it closed, its compute and ``report`` seconds, what happened in it."""

    step: int
    compute_s: float
    report_s: float
    saves: bool
    writing: bool
    """A background write was running when the step began."""
    waited: bool
    """A save that found the previous background write not yet recorded (it waited for it)."""

    @property
    def seconds(self) -> float:
        return self.compute_s + self.report_s


@dataclass
class Run:
    """One training run (``sync`` or ``async``) on rank 0: its steps and its ``checkpoint`` events."""

    variant: str
    steps: list[Step] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    state_bytes: int = 0
    check_s: list[float] = field(default_factory=list)
    """``nonfinite_state()`` timed on its own after training: the check of the state before every save."""


def main(argv: list[str]) -> int:
    p = common.parser("Training stall of a background checkpoint vs a synchronous one, FSDP2 on several ranks.")
    p.add_argument("--ranks", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--mib", type=int, default=256, help="weights + AdamW state in MiB, all ranks (default 256)")
    p.add_argument("--every", type=int, default=10, help="steps between checkpoints (default 10)")
    p.add_argument("--saves", type=int, default=4, help="timed checkpoints per run, after an untimed one (default 4)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each variant, in ABBA order (default 2)")
    p.add_argument("--batch", type=int, default=8, help="rows of each rank's batch (default 8)")
    p.add_argument("--dir", type=Path, default=None, help="folder to write in (default: on $GPUFLEET_HOME's disk)")
    args = p.parse_args(argv)
    if args.ranks < 2 or args.mib < 4 or args.every < 3 or args.saves < 1 or args.rounds < 1 or args.batch < 1:
        p.error("--ranks must be >= 2, --mib >= 4, --every >= 3, and --saves, --rounds, --batch >= 1")
    if common.under_torchrun():
        return run_rank(args.mib * MIB, args.every, args.saves, args.rounds, args.batch, Path(os.environ[WORK_ENV]))
    parent = args.dir if args.dir is not None else default_parent()
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-dist-async-", dir=parent))
    try:
        return common.run_ranks(__file__, argv, args.ranks, json_mode=args.json, env={WORK_ENV: str(work)})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def train(variant: str, total_bytes: int, every: int, saves: int, batch: int, ckpt_dir: Path) -> Run:
    """Train a fresh state for ``(saves + 1) * every`` steps in a session that checkpoints every ``every``."""
    from gpufleet.runtime import EventLog, TrainSession
    from gpufleet.runtime.group import current_group
    from gpufleet.spec import CheckpointPolicy, HealthPolicy

    group = current_group()
    model, optimizer = build_state(total_bytes, group.world_size)
    width = int(next(model.parameters()).shape[1])  # a DTensor: the global shape
    events = EventLog(None)
    generator = torch.Generator().manual_seed(1000 + group.rank)
    policy = CheckpointPolicy.model_validate({"every_steps": every, "keep": 2, "async": variant == "async"})
    run = Run(variant)
    writing: int | None = None  # step of the background write not yet recorded
    sess = TrainSession(
        ckpt_dir=ckpt_dir,
        model=model,
        optimizer=optimizer,
        total_steps=(saves + 1) * every,
        policy=policy,
        health=HealthPolicy(spike_zscore=None),  # random batches: only NaN and inf are unhealthy
        events=events,
        handle_signals=False,
        echo=False,
        group=group,
    )
    with sess:
        for _ in sess.steps():
            x = torch.randn(batch, width, generator=generator)
            started = time.perf_counter()
            loss = model(x).square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            value = float(loss.detach())
            reporting = time.perf_counter()
            seen = len(events.memory)
            busy = writing is not None
            sess.report(value)
            ended = time.perf_counter()
            saves_now = sess.step % every == 0
            recorded = {int(e["step"]) for e in events.memory[seen:] if e["kind"] == "checkpoint"}
            waited = saves_now and writing is not None and writing in recorded
            if writing in recorded:
                writing = None
            if saves_now and variant == "async" and sess.step not in recorded:
                writing = sess.step
            step = Step(sess.step, reporting - started, ended - reporting, saves_now, busy, waited)
            run.steps.append(step)
            if saves_now and group.is_main:
                common.progress(
                    f"{variant}: save at step {step.step}: report {step.report_s * 1e3:.0f} ms"
                    + (" (the previous write was still running)" if waited else "")
                )
    for _ in range(3):  # every rank (a collective), once the last write is done
        started = time.perf_counter()
        sess.nonfinite_state()
        run.check_s.append(time.perf_counter() - started)
    run.checkpoints = [e for e in events.memory if e["kind"] == "checkpoint"]
    sizes = [int(e["bytes"]) for e in run.checkpoints]
    run.state_bytes = sizes[-1] if sizes else 0
    return run


@dataclass(frozen=True, slots=True)
class Figures:
    """What the runs of one variant come to (rank 0)."""

    plain_report_s: float
    save_report_s: float
    stall_wall_s: float
    event_s: float
    """Synchronous: the write (``seconds``); background: the in-memory copy (``stall_seconds``)."""
    write_s: float
    """The write itself (the events' ``seconds``), in the loop or in the background."""
    saves: int
    waited: int
    wait_extra_s: float | None
    """Background: median extra ``report`` time of the saves that waited, over those that did not."""
    plain_step_s: float
    writing_step_s: float | None
    """Background: median step while a write runs (the write and training share the CPU)."""
    interval_s: float
    """Median time of the ``every`` steps up to and including a save."""
    interval_cost_s: float
    """``interval_s`` minus ``every`` plain steps: what a checkpoint costs the loop in all."""
    check_s: float
    """``nonfinite_state()`` on its own: part of the ``report`` of every step that saves."""


def figures(runs: list[Run], every: int) -> Figures:
    """The medians over every run of one variant (each run's first save and the steps up to it left out)."""
    timed = [s for run in runs for s in run.steps if s.step > every]
    plain = [s for s in timed if not s.saves and not s.writing] or [s for s in timed if not s.saves]
    saving = [s for s in timed if s.saves]
    clean = [s for s in saving if not s.waited]
    waited = [s for s in saving if s.waited]
    plain_report = common.median([s.report_s for s in plain])
    save_report = common.median([s.report_s for s in clean or saving])
    events = [e for run in runs for e in run.checkpoints if int(e["step"]) > every]
    background = runs[0].variant == "async"
    writing = [s.seconds for s in timed if s.writing and not s.saves]
    intervals = [
        sum(t.seconds for t in run.steps if s.step - every < t.step <= s.step)
        for run in runs
        for s in run.steps
        if s.saves and s.step > every
    ]
    plain_step = common.median([s.seconds for s in plain])
    interval = common.median(intervals)
    return Figures(
        plain_report_s=plain_report,
        save_report_s=save_report,
        stall_wall_s=save_report - plain_report,
        event_s=common.median([float(e["stall_seconds" if background else "seconds"]) for e in events]),
        write_s=common.median([float(e["seconds"]) for e in events]),
        saves=len(saving),
        waited=len(waited),
        wait_extra_s=(common.median([s.report_s for s in waited]) - save_report) if waited and clean else None,
        plain_step_s=plain_step,
        writing_step_s=common.median(writing) if writing else None,
        interval_s=interval,
        interval_cost_s=interval - every * plain_step,
        check_s=common.median([c for run in runs for c in run.check_s]),
    )


def run_rank(total_bytes: int, every: int, saves: int, rounds: int, batch: int, work: Path) -> int:
    from gpufleet.runtime.group import current_group

    torch.set_num_threads(1)
    group = current_group()
    say = common.progress if group.is_main else (lambda message: None)
    fs = common.filesystem_of(work)
    say(f"writing in {work}: {fs.describe()}")
    runs: dict[str, list[Run]] = {variant: [] for variant in VARIANTS}
    try:
        for r in range(rounds):
            for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:  # ABBA: the load drifts
                say(
                    f"round {r + 1}/{rounds}, {variant}: {total_bytes / MIB:.0f} MiB FSDP2 state on "
                    f"{group.world_size} ranks, {(saves + 1) * every} steps, a checkpoint every {every} ..."
                )
                started = time.perf_counter()
                run = train(variant, total_bytes, every, saves, batch, work / f"{variant}-{r}")
                runs[variant].append(run)
                say(f"round {r + 1}/{rounds}, {variant}: done in {time.perf_counter() - started:.1f} s")
    finally:
        group.barrier()
        if group.is_main:
            shutil.rmtree(work, ignore_errors=True)
    if not group.is_main:
        return 0

    got = {name: figures(done, every) for name, done in runs.items()}
    sync, bg = got["sync"], got["async"]
    ratio_wall = common.ratio(bg.stall_wall_s, sync.stall_wall_s)
    ratio_events = common.ratio(bg.event_s, sync.event_s)
    ok = ratio_wall <= TARGET_RATIO
    state_bytes = runs["sync"][0].state_bytes

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.0f}"

    rows = [
        [
            f"{name} save" + (" (baseline)" if name == "sync" else ""),
            f"{f.saves - f.waited}/{f.saves}",
            ms(f.plain_report_s),
            ms(f.save_report_s),
            ms(f.stall_wall_s),
            ms(f.event_s),
            ms(f.write_s),
            f"{common.ratio(f.stall_wall_s, sync.stall_wall_s):.3f}",
            f"<= {TARGET_RATIO}" if name == "async" else "",
        ]
        for name, f in got.items()
    ]
    table = common.format_table(
        f"Checkpoint stall, FSDP2 {LAYERS} Linear + AdamW, {state_bytes / MIB:.0f} MiB on {group.world_size} ranks "
        f"(gloo, 1 thread each), every {every} steps, {rounds} x {saves} saves; {fs.describe()}",
        ["save", "saves", "report ms", "save report ms", "stall ms", "event ms", "write ms", "stall/sync", "target"],
        rows,
    )
    table += (
        "\nreport ms: median report() at a step without a save (and no write running); save report ms: at a step"
        "\nthat saves; stall ms (wall) = the difference; event ms: the checkpoint events' seconds (sync) or"
        "\nstall_seconds (async: the in-memory copy); write ms: the events' seconds (the write). Medians, rank 0."
        "\nsaves: timed saves that did not wait for a previous write / all timed saves."
        f"\nstall/sync by the events: {ratio_events:.3f}"
    )
    table += (
        f"\nof the stall, the check of the state for NaN/inf (nonfinite_state, before every periodic save):"
        f" {ms(sync.check_s)} ms sync, {ms(bg.check_s)} ms async"
    )
    if bg.waited:
        table += (
            f"\n{bg.waited} background save(s) found the previous write still running and waited for it: "
            f"+{ms(bg.wait_extra_s)} ms each (median; '-' when every save waited) -- raise --every"
        )
    table += (
        f"\nsteps (information): plain step {ms(sync.plain_step_s)} ms sync, {ms(bg.plain_step_s)} ms async; "
        f"while a background write runs {ms(bg.writing_step_s)} ms"
        f"\n{every}-step interval ending in a save: sync {ms(sync.interval_s)} ms "
        f"(+{ms(sync.interval_cost_s)} over {every} plain steps), async {ms(bg.interval_s)} ms "
        f"(+{ms(bg.interval_cost_s)})"
    )
    result: dict[str, Any] = {
        "benchmark": "dist_async_save",
        "ranks": group.world_size,
        "directory": str(work),
        "filesystem": {"type": fs.fs_type, "device": fs.device, "mount_point": fs.mount_point},
        "same_device_as_repo": common.same_device(work.parent, common.REPO_ROOT),
        "state_bytes": state_bytes,
        "every_steps": every,
        "timed_saves_per_run": saves,
        "rounds": rounds,
        "batch": batch,
        "stall_measure": "wall: median report() at save steps minus at steps without a save, rank 0; "
        "events: checkpoint seconds (sync), stall_seconds (async)",
        **{
            name: {
                "plain_report_s": f.plain_report_s,
                "save_report_s": f.save_report_s,
                "stall_wall_s": f.stall_wall_s,
                ("stall_event_s" if name == "async" else "save_event_s"): f.event_s,
                "write_s": f.write_s,
                "saves": f.saves,
                "saves_that_waited": f.waited,
                "wait_extra_s": f.wait_extra_s,
                "plain_step_s": f.plain_step_s,
                "step_while_writing_s": f.writing_step_s,
                "interval_s": f.interval_s,
                "interval_cost_s": f.interval_cost_s,
                "state_check_s": f.check_s,
            }
            for name, f in got.items()
        },
        "ratio_stall_vs_sync_wall": common.finite_or_none(ratio_wall),
        "ratio_stall_vs_sync_events": common.finite_or_none(ratio_events),
        "target": {"ratio_stall_vs_sync_max": TARGET_RATIO},
    }
    verdict = (
        f"background stall / synchronous save = {ratio_wall:.3f} by wall time, {ratio_events:.3f} by the events "
        f"(target <= {TARGET_RATIO})"
    )
    common.write_rank_result(result=result, table=table, verdict=verdict, ok=ok)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
