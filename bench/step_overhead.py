"""Per-step overhead of the runtime: the tinylm loop bare vs inside a ``TrainSession``.

    .venv/bin/python bench/step_overhead.py [--json] [--rounds 5] [--steps 40] [--warmup 20] [--threads 1]

One model, optimizer and schedule (``gpufleet.workloads.tinylm.build``, the demo's batch 32 and
context 64) are trained by two loops in turn: the bare loop (batch, forward, backward, clip,
optimizer and schedule steps) and the same loop inside a ``TrainSession`` (health checks on,
events to a temporary JSONL file, ``checkpoint.every_steps`` so large that no checkpoint falls in
the timed window). After a warmup the two alternate step by step (bare, session, session, bare,
...) over several rounds, so that machine noise hits both alike; each step is timed on its own,
and the time spent inside ``steps()`` and ``report()`` is shown as well. Target: overhead of the median
step <= 2%. One checkpoint save of the tiny model is timed too, as information.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _common as common
import torch

from gpufleet.runtime import EventLog, TrainSession
from gpufleet.spec import CheckpointPolicy, HealthPolicy
from gpufleet.workloads.charlm import CharCorpus, CharLM
from gpufleet.workloads.tinylm import build

TARGET_OVERHEAD = 0.02
SEED = 1337
BATCH_SIZE = 32
CONTEXT = 64


class Loop:
    """The tinylm training step, run bare or reported to a session."""

    def __init__(self, *, embed: int, layers: int, heads: int, total_steps: int) -> None:
        torch.use_deterministic_algorithms(True)
        corpus, model, optimizer, schedule = build(
            seed=SEED,
            context=CONTEXT,
            layers=layers,
            heads=heads,
            embed=embed,
            dropout=0.1,
            lr=3e-3,
            steps=total_steps,
        )
        self.corpus: CharCorpus = corpus
        self.model: CharLM = model
        self.optimizer = optimizer
        self.schedule = schedule
        self.position = 0
        model.train()

    def step(self, position: int) -> tuple[torch.Tensor, int]:
        """One optimizer step on batch ``position``; the loss and the tokens it saw."""
        x, y = self.corpus.batch("train", position, BATCH_SIZE, CONTEXT, SEED)
        _, loss = self.model(x, y)
        assert loss is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.schedule.step()
        return loss, x.numel()

    def bare_step(self) -> float:
        """One step of the bare loop; its seconds."""
        started = time.perf_counter()
        self.step(self.position)
        self.position += 1
        return time.perf_counter() - started

    def session_step(self, sess: TrainSession, steps: Iterator[int]) -> tuple[float, float]:
        """One step of ``for _ in sess.steps(): ...; sess.report(loss)``; its seconds, and those in the runtime."""
        started = time.perf_counter()
        next(steps)
        runtime = time.perf_counter() - started
        loss, tokens = self.step(sess.data_position)
        before_report = time.perf_counter()
        sess.report(loss, tokens=tokens, lr=float(self.schedule.get_last_lr()[0]))
        ended = time.perf_counter()
        return ended - started, runtime + ended - before_report


CHECK_ROUNDS = 21


def state_check_seconds(sess: TrainSession) -> tuple[float, float]:
    """Median seconds of the session's fused NaN/inf check of weights and optimizer state, and of
    the obvious per-tensor ``isfinite().all()`` loop over the same tensors (one sync each)."""
    tensors = [t for _, t in sess._named_state() if isinstance(t, torch.Tensor) and t.is_floating_point()]
    fused: list[float] = []
    naive: list[float] = []
    for _ in range(CHECK_ROUNDS):
        started = time.perf_counter()
        assert sess.nonfinite_state() is None
        fused.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert all(bool(torch.isfinite(t).all()) for t in tensors)
        naive.append(time.perf_counter() - started)
    return common.median(fused), common.median(naive)


def main(argv: list[str]) -> int:
    p = common.parser("Per-step overhead of TrainSession on the tinylm training loop.")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each variant (default 5)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per variant per round (default 40)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps of each variant first (default 20)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--embed", type=int, default=128, help="model width (default 128, as the demo)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.threads < 1:
        p.error("--rounds, --steps and --threads must be >= 1, --warmup >= 0")
    torch.set_num_threads(args.threads)
    total_steps = 2 * (args.warmup + args.rounds * args.steps) + 10
    loop = Loop(embed=args.embed, layers=2, heads=4, total_steps=total_steps)
    params = sum(p.numel() for p in loop.model.parameters())

    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-step-"))
    events_path = work / "events.jsonl"
    bare: list[float] = []
    session: list[float] = []
    per_round: list[float] = []
    runtime: list[float] = []
    paired: list[float] = []
    try:
        sess = TrainSession(
            ckpt_dir=work / "checkpoints",
            model=loop.model,
            optimizer=loop.optimizer,
            scheduler=loop.schedule,
            total_steps=None,
            policy=CheckpointPolicy(every_steps=10_000, every_seconds=None, keep=3),
            health=HealthPolicy(),
            events=EventLog(events_path),
        )
        with sess:
            common.progress(
                f"tinylm: {params:,} parameters, batch {BATCH_SIZE}, context {CONTEXT}, "
                f"{args.threads} thread(s); warmup {args.warmup} steps each"
            )
            steps = sess.steps()
            for _ in range(args.warmup):
                loop.bare_step()
                loop.session_step(sess, steps)
            for r in range(args.rounds):
                got_bare: list[float] = []
                got_sess: list[float] = []
                for i in range(2 * args.steps):
                    # Alternate step by step, ABBA: bare, session, session, bare, ...
                    if (i + i // 2) % 2 == 0:
                        got_bare.append(loop.bare_step())
                    else:
                        total, inside = loop.session_step(sess, steps)
                        got_sess.append(total)
                        runtime.append(inside)
                # The k-th bare and k-th session step of a round ran back to back: pair them.
                paired += [t_sess - t_bare for t_bare, t_sess in zip(got_bare, got_sess, strict=True)]
                bare += got_bare
                session += got_sess
                round_overhead = common.ratio(common.median(got_sess), common.median(got_bare)) - 1
                per_round.append(round_overhead)
                common.progress(
                    f"round {r + 1}/{args.rounds}: bare {common.median(got_bare) * 1e3:.2f} ms, "
                    f"session {common.median(got_sess) * 1e3:.2f} ms, overhead {round_overhead:+.2%}"
                )
            saves_before = sum(1 for _ in (work / "checkpoints").glob("step-*"))
            started = time.perf_counter()
            sess.save("bench")
            save_seconds = time.perf_counter() - started
            fused, per_tensor = state_check_seconds(sess)
            ckpt_bytes = sum(f.stat().st_size for f in (work / "checkpoints").rglob("*.pt"))
        events = events_path.read_text(encoding="utf-8").count("\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    bare_med, sess_med = common.median(bare), common.median(session)
    overhead = common.ratio(sess_med, bare_med) - 1
    runtime_med = common.median(runtime)
    paired_overhead = common.ratio(common.median(paired), bare_med)
    runtime_share = common.ratio(runtime_med, bare_med)
    ok = overhead <= TARGET_OVERHEAD and saves_before == 0

    def ms(v: float) -> str:
        return f"{v * 1e3:.2f}"

    def q(values: list[float], frac: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(frac * len(ordered)))]

    rows = [
        ["bare loop (baseline)", str(len(bare)), ms(bare_med), ms(q(bare, 0.1)), ms(q(bare, 0.9)), "", ""],
        [
            "inside TrainSession",
            str(len(session)),
            ms(sess_med),
            ms(q(session, 0.1)),
            ms(q(session, 0.9)),
            f"{overhead:+.2%}",
            f"<= {TARGET_OVERHEAD:.0%}",
        ],
        [
            "  of which in steps()+report() (info)",
            str(len(runtime)),
            ms(runtime_med),
            ms(q(runtime, 0.1)),
            ms(q(runtime, 0.9)),
            f"{runtime_share:+.2%}",
            "",
        ],
        ["one checkpoint save (info)", "1", ms(save_seconds), "", "", "", ""],
        [
            "state NaN/inf check, fused (each save, end)",
            str(CHECK_ROUNDS),
            ms(fused),
            "",
            "",
            f"{common.ratio(fused, save_seconds):.1%} of a save",
            "",
        ],
        [
            "  per-tensor isfinite().all() (baseline)",
            str(CHECK_ROUNDS),
            ms(per_tensor),
            "",
            "",
            f"fused is {common.ratio(per_tensor, fused):.1f}x faster",
            "",
        ],
    ]
    table = common.format_table(
        f"Step time, tinylm ({params:,} params, batch {BATCH_SIZE}, context {CONTEXT}, {args.threads} thread(s)), "
        f"{args.rounds} rounds x {args.steps} steps",
        ["variant", "steps", "median ms", "p10 ms", "p90 ms", "overhead", "target"],
        rows,
    )
    table += (
        f"\nper-round overheads: {' '.join(f'{o:+.2%}' for o in per_round)}"
        f" (median {common.median(per_round):+.2%}); median of back-to-back pair differences"
        f" {paired_overhead:+.2%}\ncheckpoint {ckpt_bytes / 1024:.0f} KiB;"
        f" {events} events logged; checkpoints inside the timed window: {saves_before}"
    )
    result: dict[str, Any] = {
        "benchmark": "step_overhead",
        "params": params,
        "batch_size": BATCH_SIZE,
        "context": CONTEXT,
        "threads": args.threads,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "bare_median_s": bare_med,
        "session_median_s": sess_med,
        "overhead": overhead,
        "per_round_overhead": per_round,
        "paired_overhead": paired_overhead,
        "runtime_median_s": runtime_med,
        "runtime_share_of_bare_step": runtime_share,
        "checkpoints_in_window": saves_before,
        "checkpoint_save_s": save_seconds,
        "state_check_s": fused,
        "state_check_per_tensor_s": per_tensor,
        "checkpoint_bytes": ckpt_bytes,
        "events_logged": events,
        "target": {"overhead_max": TARGET_OVERHEAD},
    }
    verdict = f"overhead {overhead:+.2%} (target <= {TARGET_OVERHEAD:.0%})"
    if saves_before:
        verdict += f"; {saves_before} checkpoint(s) fell inside the timed window"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
