"""The memory tier's two promises: a snapshot every step costs <= 2 % of a step, and RAM restores >= 5x faster.

    .venv/bin/python bench/memtier.py [--json] [--steps 60] [--warmup 10] [--mib 512]

(b) first, in this process: a state of ``--mib`` MiB (float32 tensors) is written once to disk as a
checkpoint (``CheckpointDir.save``) and once to the node's shared memory as a memory copy; the disk
files are fsynced and dropped from the page cache (``POSIX_FADV_DONTNEED``) so the disk read is a
disk read; then each is restored the way a restore does it (disk: ``CheckpointDir.load``, every
byte read and checked against its sha256, ``torch.load(weights_only=True)``; RAM: ``OwnStore.load``,
the file mapped, checked against its chunked CRC-32 (a thread per core, up to 4), its tensors views of
the mapping), three times in turn, and the medians compared. Target: RAM >= 5x faster. The
breakdown of each side (read, hash, load, and the copy into a model's tensors that follows either,
as ``load_state_dict`` does) is timed apart in the same rounds and printed with it.

(a) then under ``torch.distributed.run --standalone`` (2 ranks, gloo on CPU, 1 thread each), a DDP
tinylm trains inside two ``TrainSession``s in turn, step by step (ABBA): one without a memory tier,
one with ``checkpoint.memory: {every_steps: 1}`` (own copy and the job's keeper); no disk checkpoint
in the timed window. Target: the tier's session takes <= 2 % longer per step (mean: the snapshot's
write runs in the background, the copy in the step). Exit 1 when a target is missed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _common as common
import torch

OVERHEAD_MAX = 0.02
SPEEDUP_MIN = 5.0
SEED = 1337
BATCH_SIZE = 32
CONTEXT = 64
RESTORE_ENV = "GPUFLEET_BENCH_MEMTIER_RESTORE"


def _drop_cache(folder: Path) -> None:
    for file in folder.iterdir():
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _part(parts: dict[str, list[float]], name: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    parts.setdefault(name, []).append(time.perf_counter() - started)


def _copy_into(target: dict[str, torch.Tensor], loaded: dict[str, Any]) -> None:
    """What ``load_state_dict`` does with a loaded state: one copy into the model's own tensors."""
    for name, tensor in target.items():
        tensor.copy_(loaded["model"][name])


def restore_figures(mib: int, rounds: int = 3) -> dict[str, Any]:
    """(b): seconds to restore a ``mib`` MiB state from own RAM and from disk (page cache dropped)."""
    import hashlib
    import io
    import mmap

    from gpufleet.runtime.checkpoint import CheckpointDir
    from gpufleet.runtime.memtier.copies import checksum
    from gpufleet.runtime.memtier.flat import load
    from gpufleet.runtime.memtier.shm import OwnStore, shm_root

    torch.manual_seed(SEED)
    chunk = 64 * 1024 * 1024 // 4
    weights = {f"w{i}": torch.randn(chunk) for i in range(mib // 64)}
    state = {"model": weights, "trainer": {"step": 1, "rng": torch.get_rng_state()}}
    target = {name: torch.empty_like(t) for name, t in weights.items()}
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-memtier-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    own = OwnStore(shm_root(os.environ), f"bench{os.getpid():x}"[:16], 0)
    folder = work / "step-00000001"
    disk_s, ram_s = [], []
    disk_parts: dict[str, list[float]] = {}
    ram_parts: dict[str, list[float]] = {}
    try:
        ckpts = CheckpointDir(work)
        ckpts.save(1, state)
        own.write(1, state, fingerprint=None)
        for _ in range(rounds):
            _drop_cache(folder)
            started = time.perf_counter()
            ckpts.load(folder)
            disk_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            loaded = own.load(own.header(1))
            ram_s.append(time.perf_counter() - started)
            with _part(ram_parts, "copy"):
                _copy_into(target, loaded)
            del loaded
            # the same work again, part by part
            _drop_cache(folder)
            with _part(disk_parts, "read"):
                data = (folder / "model.pt").read_bytes()
            with _part(disk_parts, "hash"):
                hashlib.sha256(data).hexdigest()
            with _part(disk_parts, "load"):
                plain = torch.load(io.BytesIO(data), weights_only=True)
            with _part(disk_parts, "copy"):
                _copy_into(target, {"model": plain})
            del data, plain
            with open(own.path(1), "rb") as fh:
                mapped = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            with memoryview(mapped) as view, _part(ram_parts, "hash"):
                checksum(view)
            with _part(ram_parts, "load"):
                load(mapped)
            del mapped
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(own.job_folder, ignore_errors=True)
    disk, ram = common.median(disk_s), common.median(ram_s)
    disk_copy, ram_copy = common.median(disk_parts["copy"]), common.median(ram_parts["copy"])
    return {
        "mib": mib,
        "disk_s": disk,
        "ram_s": ram,
        "speedup": common.ratio(disk, ram),
        "speedup_with_copy": common.ratio(disk + disk_copy, ram + ram_copy),
        "disk_parts_s": {k: common.median(v) for k, v in disk_parts.items()},
        "ram_parts_s": {k: common.median(v) for k, v in ram_parts.items()},
    }


def main(argv: list[str]) -> int:
    p = common.parser("Step overhead and restore speed of the memory tier.")
    p.add_argument("--steps", type=int, default=60, help="timed steps per variant (default 60)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per variant first (default 10)")
    p.add_argument("--mib", type=int, default=512, help="state size of the restore test, MiB (default 512)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.mib < 64:
        p.error("--steps must be >= 1, --warmup >= 0, --mib >= 64")
    if not common.under_torchrun():
        common.progress(f"restoring a {args.mib} MiB state from disk and from own RAM")
        restored = restore_figures(args.mib)
        env = {RESTORE_ENV: json.dumps(restored)}
        return common.run_ranks(__file__, argv, 2, json_mode=args.json, env=env)
    return rank_main(args)


def rank_main(args: Any) -> int:
    from torch.nn.parallel import DistributedDataParallel

    from gpufleet.runtime import EventLog, TrainSession
    from gpufleet.runtime.group import current_group
    from gpufleet.runtime.memtier import release
    from gpufleet.runtime.memtier.shm import shm_root
    from gpufleet.runtime.memtier.tier import TierPlace
    from gpufleet.spec import CheckpointPolicy, MemoryTier
    from gpufleet.workloads.tinylm import build

    torch.set_num_threads(1)
    group = current_group()
    total = 2 * (args.warmup + args.steps) + 10
    corpus, plain, _, _ = build(
        seed=SEED, context=CONTEXT, layers=2, heads=4, embed=128, dropout=0.1, lr=3e-3, steps=total
    )
    model = DistributedDataParallel(plain)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    made = Path(tempfile.mkdtemp(prefix="gpufleet-bench-memtier-")) if group.is_main else None
    work: Path = group.broadcast(made)
    place = TierPlace(shm_root=shm_root(os.environ), job_dir=work / "job", peer_address=None, ranks_per_node=2)
    times: dict[str, list[float]] = {"none": [], "tier": []}
    sessions = {}
    for name, memory in (("none", None), ("tier", MemoryTier(every_steps=1))):
        sessions[name] = TrainSession(
            ckpt_dir=work / name,
            model=model,
            optimizer=optimizer,
            policy=CheckpointPolicy(every_steps=100_000, memory=memory),
            events=EventLog(work / f"{name}.jsonl") if group.is_main else None,
            group=group,
            agree_every=4,
            memory=place if memory is not None else None,
            echo=False,
            handle_signals=False,
        )
    try:
        with sessions["none"] as s_none, sessions["tier"] as s_tier:
            loops = {"none": (s_none, s_none.steps()), "tier": (s_tier, s_tier.steps())}
            for i in range(2 * (args.warmup + args.steps)):
                name = "none" if (i + i // 2) % 2 == 0 else "tier"  # ABBA
                sess, steps = loops[name]
                started = time.perf_counter()
                next(steps)
                x, y = corpus.batch("train", i, BATCH_SIZE, CONTEXT, SEED)
                x, y = x[group.rank :: group.world_size], y[group.rank :: group.world_size]
                _, loss = model(x, y)
                assert loss is not None
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                sess.report(loss, tokens=x.numel())
                if i >= 2 * args.warmup:
                    times[name].append(time.perf_counter() - started)
            tier = s_tier._ckpt.tier
            snapshots, skips = (tier.snapshots, tier.busy_skips) if tier is not None else (0, 0)
            peer_skips = tier.peer_skips if tier is not None else 0
    finally:
        group.barrier()
        if group.is_main:
            release(place.job_dir)
            shutil.rmtree(work, ignore_errors=True)
    if not group.is_main:
        return 0
    none_mean, tier_mean = statistics.fmean(times["none"]), statistics.fmean(times["tier"])
    overhead = common.ratio(tier_mean, none_mean) - 1
    restored = json.loads(os.environ[RESTORE_ENV])
    ok_overhead, ok_restore = overhead <= OVERHEAD_MAX, restored["speedup"] >= SPEEDUP_MIN
    parts = {
        side: ", ".join(f"{k} {v:.3f}" for k, v in restored[f"{side}_parts_s"].items()) for side in ("disk", "ram")
    }
    rows = [
        ["(a) session, no memory tier", f"{none_mean * 1e3:.2f} ms/step", "", ""],
        ["(a) session, memory every step", f"{tier_mean * 1e3:.2f} ms/step", f"{overhead:+.2%}", "<= +2%"],
        ["    snapshots taken / skipped busy / peer sends skipped", f"{snapshots} / {skips} / {peer_skips}", "", ""],
        [f"(b) restore {restored['mib']} MiB from disk", f"{restored['disk_s']:.3f} s", "", ""],
        [
            f"(b) restore {restored['mib']} MiB from own RAM",
            f"{restored['ram_s']:.3f} s",
            f"{restored['speedup']:.1f}x",
            ">= 5x",
        ],
        ["    with the copy into the model (either side)", "", f"{restored['speedup_with_copy']:.1f}x", ""],
        [f"    disk parts (s): {parts['disk']}", "", "", ""],
        [f"    RAM parts (s): {parts['ram']}", "", "", ""],
    ]
    table = common.format_table(
        f"Memory tier: tinylm DDP on {group.world_size} ranks (gloo, 1 thread each), {args.steps} steps a variant",
        ["what", "time", "ratio", "target"],
        rows,
    )
    result = {
        "benchmark": "memtier",
        "ranks": group.world_size,
        "session_mean_s": none_mean,
        "tier_mean_s": tier_mean,
        "overhead": overhead,
        "snapshots": snapshots,
        "busy_skips": skips,
        "peer_skips": peer_skips,
        "restore": restored,
        "target": {"overhead_max": OVERHEAD_MAX, "speedup_min": SPEEDUP_MIN},
    }
    verdict = f"overhead {overhead:+.2%} (<= 2%); RAM restore {restored['speedup']:.1f}x faster than disk (>= 5x)"
    common.write_rank_result(result=result, table=table, verdict=verdict, ok=ok_overhead and ok_restore)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
