"""Per-step overhead of the distributed session: a 2-rank DDP tinylm loop bare vs inside a ``TrainSession``.

    .venv/bin/python bench/dist_step_overhead.py [--json] [--ranks 2] [--rounds 5] [--steps 30]
        [--warmup 10] [--agree-every 4]

Started without torchrun, it starts itself under ``torch.distributed.run --standalone`` (gloo
on CPU) and prints rank 0's result. Every rank builds the same tinylm (batch 32 split among the
ranks, context 64), wrapped in ``DistributedDataParallel``, and trains it with two loops in
turn, step by step (bare, session, session, bare, ...): the bare DDP loop, and the same loop
reporting to a ``TrainSession`` whose ranks meet every ``--agree-every`` steps (one all-reduce,
read at the next step boundary so it overlaps that step's compute; no checkpoint inside the timed
window, so no meeting is waited for at once). The one all-reduce is
also timed on its own. Target: overhead <= 2%, on the median step when the ranks meet at every
step, on the mean step otherwise (the median would hide the one step in k that pays); the
all-reduce alone is reported as a share of the bare step.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as common
import torch

TARGET_OVERHEAD = 0.02
AGREE_SHARE_MAX = 0.01
SEED = 1337
BATCH_SIZE = 32
CONTEXT = 64


def main(argv: list[str]) -> int:
    p = common.parser("Per-step overhead of the distributed TrainSession on a DDP tinylm loop.")
    p.add_argument("--ranks", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each variant (default 5)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per variant per round (default 30)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps of each variant first (default 10)")
    p.add_argument(
        "--agree-every",
        type=int,
        default=4,
        help="the session's distributed.agree_every (default 4, as in a JobSpec); above 1 the overhead is "
        "judged on mean steps",
    )
    args = p.parse_args(argv)
    if args.ranks < 2 or args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.agree_every < 1:
        p.error("--ranks must be >= 2, --rounds, --steps and --agree-every >= 1, --warmup >= 0")
    if not common.under_torchrun():
        return common.run_ranks(__file__, argv, args.ranks, json_mode=args.json)

    from torch.nn.parallel import DistributedDataParallel

    from gpufleet.runtime import EventLog, TrainSession
    from gpufleet.runtime.group import current_group
    from gpufleet.spec import CheckpointPolicy, HealthPolicy
    from gpufleet.workloads.tinylm import build

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    group = current_group()
    total_steps = 2 * (args.warmup + args.rounds * args.steps) + 10
    corpus, plain, _, _ = build(
        seed=SEED, context=CONTEXT, layers=2, heads=4, embed=128, dropout=0.1, lr=3e-3, steps=total_steps
    )
    model = DistributedDataParallel(plain)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    position = 0

    def step(at: int) -> tuple[torch.Tensor, int]:
        x, y = corpus.batch("train", at, BATCH_SIZE, CONTEXT, SEED)
        x, y = x[group.rank :: group.world_size], y[group.rank :: group.world_size]
        _, loss = model(x, y)
        assert loss is not None
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss, x.numel()

    made = Path(tempfile.mkdtemp(prefix="gpufleet-bench-dist-step-")) if group.is_main else None
    work: Path = group.broadcast(made)  # one folder: rank 0 makes it, every rank uses it
    bare: list[float] = []
    session: list[float] = []
    agree: list[float] = []
    inside: list[float] = []
    try:
        sess = TrainSession(
            ckpt_dir=work / "checkpoints",
            model=model,
            optimizer=optimizer,
            total_steps=None,
            policy=CheckpointPolicy(every_steps=100_000, keep=3),
            health=HealthPolicy(),
            events=EventLog(work / "events.jsonl") if group.is_main else None,
            group=group,
            agree_every=args.agree_every,
        )
        with sess:
            steps = sess.steps()
            for i in range(2 * (args.warmup + args.rounds * args.steps)):
                timed = i >= 2 * args.warmup
                started = time.perf_counter()
                if (i + i // 2) % 2 == 0:  # ABBA: bare, session, session, bare, ...
                    step(position)
                    position += 1
                    if timed:
                        bare.append(time.perf_counter() - started)
                else:
                    next(steps)
                    loss, tokens = step(sess.data_position)
                    before = time.perf_counter()
                    sess.report(loss, tokens=tokens)
                    if timed:
                        ended = time.perf_counter()
                        session.append(ended - started)
                        inside.append(ended - before)
            for _ in range(200):
                started = time.perf_counter()
                group.agree([1.0, 0.0, 0.0, 0.0])
                agree.append(time.perf_counter() - started)
    finally:
        group.barrier()
        if group.is_main:
            shutil.rmtree(work, ignore_errors=True)
    if not group.is_main:
        return 0
    bare_med, sess_med, agree_med = common.median(bare), common.median(session), common.median(agree)
    bare_mean, sess_mean = statistics.fmean(bare), statistics.fmean(session)
    # Agreeing every k steps, k-1 session steps in k skip it: the median would hide the one that pays.
    by_mean = args.agree_every > 1
    overhead = common.ratio(sess_mean, bare_mean) - 1 if by_mean else common.ratio(sess_med, bare_med) - 1
    agree_share = common.ratio(agree_med, bare_med)
    ok = overhead <= TARGET_OVERHEAD
    params = sum(p.numel() for p in plain.parameters())
    inside_mean = statistics.fmean(inside)
    rows = [
        ["bare DDP loop (baseline)", str(len(bare)), f"{bare_med * 1e3:.2f}", f"{bare_mean * 1e3:.2f}", "", ""],
        [
            "inside TrainSession",
            str(len(session)),
            f"{sess_med * 1e3:.2f}",
            f"{sess_mean * 1e3:.2f}",
            f"{overhead:+.2%}",
            "<= 2%",
        ],
        [
            "  of which in report() (info)",
            str(len(inside)),
            f"{common.median(inside) * 1e3:.3f}",
            f"{inside_mean * 1e3:.3f}",
            "",
            "",
        ],
        [
            "  the agreement alone",
            str(len(agree)),
            f"{agree_med * 1e3:.3f}",
            "",
            f"{agree_share:.2%}",
            "< 1%",
        ],
    ]
    table = common.format_table(
        f"Step time, tinylm DDP on {group.world_size} ranks (gloo, 1 thread each; {params:,} params, "
        f"global batch {BATCH_SIZE}, context {CONTEXT}), {args.rounds * args.steps} steps each, "
        f"ranks agree every {args.agree_every} step(s); overhead on the {'mean' if by_mean else 'median'}",
        ["variant", "steps", "median ms", "mean ms", "overhead", "target"],
        rows,
    )
    result: dict[str, Any] = {
        "benchmark": "dist_step_overhead",
        "ranks": group.world_size,
        "params": params,
        "agree_every": args.agree_every,
        "overhead_on": "mean" if by_mean else "median",
        "bare_median_s": bare_med,
        "session_median_s": sess_med,
        "bare_mean_s": bare_mean,
        "session_mean_s": sess_mean,
        "report_mean_s": inside_mean,
        "overhead": overhead,
        "agree_median_s": agree_med,
        "report_median_s": common.median(inside),
        "agree_share_of_bare_step": agree_share,
        "target": {"overhead_max": TARGET_OVERHEAD, "agree_share_max": AGREE_SHARE_MAX},
    }
    verdict = f"overhead {overhead:+.2%} (target <= {TARGET_OVERHEAD:.0%}); agreement {agree_share:.2%} of a step"
    common.write_rank_result(result=result, table=table, verdict=verdict, ok=ok)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
