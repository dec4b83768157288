"""Sharded save throughput: ``save_sharded`` from 2 ranks against ``dd conv=fsync`` on the same filesystem.

    .venv/bin/python bench/dist_save_throughput.py [--json] [--ranks 2] [--mib 512] [--repeats 5] [--dir DIR]

Started without torchrun, it starts itself under ``torch.distributed.run --standalone`` (gloo on
CPU, one thread per rank). The state is what a distributed job saves: a model of 8 square
``Linear`` layers sharded with FSDP2 (``fully_shard`` on each layer, then the root) and its AdamW
state after one step (two moments the size of the weights), so weights + moments come to
``--mib`` in all, each rank holding half. Every round the ranks save it the way the session does
(``dcp_state`` into ``gpufleet.runtime.sharded.save_sharded``: each rank writes its shards,
sha256 hashed while written and fsynced, rank 0 commits ``manifest.json`` after a barrier), timed
on rank 0 from a barrier until every rank returns the committed manifest; and rank 0 alone runs
``dd if=/dev/zero bs=1M conv=fsync`` of the same size into the same folder (timed by dd's own
figure), the other ranks waiting. Files are deleted (and ``sync`` called) after every run; one
untimed round of each comes first. Target: median save rate >= 0.95 x median dd rate. The spread
is the lowest and highest of the per-round ratios (each save against the dd run just before it),
reported with the medians: on a shared machine one slow round moves a single ratio a long way.

``--dir`` (default: a temporary folder in ``$GPUFLEET_HOME``, ``~/.gpufleet``, or the nearest
folder above it that exists) decides the filesystem, which is reported.
"""

from __future__ import annotations

import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as common
import torch

TARGET_RATIO = 0.95
LAYERS = 8
MIB = 1024 * 1024
WORK_ENV = "GPUFLEET_BENCH_DIST_SAVE_DIR"
DD_ELAPSED_RE = re.compile(r"copied, ([0-9.]+) s")
SHARD_RE = re.compile(r"__([0-9]+)_[0-9]+\.distcp")


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed run: wall seconds, bytes written, CPU seconds spent (every rank or dd, user + system)."""

    seconds: float
    nbytes: int
    cpu_s: float

    @property
    def mibps(self) -> float:
        return self.nbytes / MIB / self.seconds


def default_parent() -> Path:
    """Where a job's checkpoints would go: ``$GPUFLEET_HOME`` if it exists, else the nearest folder above it."""
    from gpufleet.paths import gpufleet_home

    path = gpufleet_home().resolve()
    while not path.is_dir() and path != path.parent:
        path = path.parent
    return path


def build_state(total_bytes: int, world_size: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An FSDP2 model and its AdamW state, weights and both moments float32: ``total_bytes`` in all.

    The width is rounded to a multiple of the world size, so every rank holds an equal shard.
    """
    from torch.distributed.fsdp import fully_shard

    weights = total_bytes // (3 * 4)
    width = max(world_size, round(math.sqrt(weights / LAYERS) / world_size) * world_size)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(LAYERS)))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    model(torch.randn(4, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def run_dd(target: Path, count: int) -> tuple[Sample, str]:
    """One ``dd bs=1M conv=fsync`` run, timed by dd's own figure (else the wall time); and which timing it was."""
    argv = ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}", "conv=fsync"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"dd failed ({proc.returncode}): {proc.stderr.strip()}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    size = target.stat().st_size
    target.unlink()
    os.sync()
    match = DD_ELAPSED_RE.search(proc.stderr)
    if match and float(match.group(1)) > 0:
        return Sample(float(match.group(1)), size, cpu), "dd"
    return Sample(wall, size, cpu), "wall"


def main(argv: list[str]) -> int:
    p = common.parser("save_sharded throughput from several ranks vs dd conv=fsync on the same filesystem.")
    p.add_argument("--ranks", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--mib", type=int, default=512, help="state size in MiB, all ranks together (default 512)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each writer (default 5)")
    p.add_argument("--dir", type=Path, default=None, help="folder to write in (default: on $GPUFLEET_HOME's disk)")
    args = p.parse_args(argv)
    if args.ranks < 2 or args.mib < 4 or args.repeats < 1:
        p.error("--ranks must be >= 2, --mib >= 4 and --repeats >= 1")
    if common.under_torchrun():
        return run_rank(args.mib * MIB, args.repeats, Path(os.environ[WORK_ENV]))
    parent = args.dir if args.dir is not None else default_parent()
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-dist-save-", dir=parent))
    try:
        return common.run_ranks(__file__, argv, args.ranks, json_mode=args.json, env={WORK_ENV: str(work)})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_rank(total_bytes: int, repeats: int, work: Path) -> int:
    from gpufleet.runtime.checkpoint import CheckpointDir
    from gpufleet.runtime.dist_state import dcp_state, strategy_of
    from gpufleet.runtime.group import current_group
    from gpufleet.runtime.manifest import CheckpointManifest, rank_filename, step_dirname
    from gpufleet.runtime.sharded import save_sharded
    from gpufleet.runtime.state import capture_rng

    torch.set_num_threads(1)
    group = current_group()
    say = common.progress if group.is_main else (lambda message: None)
    fs = common.filesystem_of(work)
    say(f"writing in {work}: {fs.describe()}")
    say(f"building a {total_bytes / MIB:.0f} MiB FSDP2 state on {group.world_size} ranks ...")
    model, optimizer = build_state(total_bytes, group.world_size)
    objects: dict[str, Any] = {"model": model, "optimizer": optimizer}
    ckpts = CheckpointDir(work / "checkpoints", keep=1000)

    def save(step: int) -> tuple[Sample, CheckpointManifest]:
        trainer = {"step": step, "data_position": step, "health_history": [2.5] * 50, "rollbacks": 0}
        group.barrier()
        cpu = time.process_time()
        started = time.perf_counter()
        manifest = save_sharded(
            ckpts,
            group,
            step,
            dcp_state(objects, trainer),
            {"rng": capture_rng()},
            healthy=True,
            loss=2.5,
            data_position=step,
            reason="bench",
            meta={"attempt": 1},
            job=None,
            fingerprint=None,
            metrics={},
            strategy=strategy_of(model),
        )
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        sample = Sample(seconds, manifest.total_bytes, sum(group.gather(cpu)))
        if group.is_main:
            shutil.rmtree(ckpts.root / step_dirname(step))
            os.sync()
        group.barrier()
        return sample, manifest

    def dd(count: int) -> tuple[Sample, str] | None:
        group.barrier()
        out = run_dd(work / "dd.bin", count) if group.is_main else None
        group.barrier()
        return out

    say("warming up (one untimed run of each writer) ...")
    _, manifest = save(0)
    count = max(1, round(manifest.total_bytes / MIB))
    dd(count)
    runs: dict[str, list[Sample]] = {"dd": [], "save": []}
    dd_timing = "dd"
    for r in range(repeats):
        timed = dd(count)
        if timed is not None:
            runs["dd"].append(timed[0])
            dd_timing = timed[1]
        runs["save"].append(save(r + 1)[0])
        if group.is_main:
            say(
                f"round {r + 1}/{repeats}: dd {runs['dd'][-1].mibps:.0f} MiB/s, save {runs['save'][-1].mibps:.0f} MiB/s"
            )
    if not group.is_main:
        return 0

    shards = {r: 0 for r in range(group.world_size)}
    for name, entry in manifest.files.items():  # DCP's FileSystemWriter: __<rank>_<n>.distcp
        if (match := SHARD_RE.fullmatch(name)) is not None:
            shards[int(match.group(1))] += entry.bytes
    rank_files = sum(manifest.files[rank_filename(r)].bytes for r in range(group.world_size))
    rate = {name: common.median([s.mibps for s in samples]) for name, samples in runs.items()}
    cpu = {name: common.median([s.cpu_s for s in samples]) for name, samples in runs.items()}
    best = {name: max(s.mibps for s in samples) for name, samples in runs.items()}
    vs_dd = {name: common.ratio(rate[name], rate["dd"]) for name in runs}
    per_round = [common.ratio(s.mibps, d.mibps) for s, d in zip(runs["save"], runs["dd"], strict=True)]
    spread = (min(per_round), max(per_round))
    best_vs_dd = {name: common.ratio(best[name], best["dd"]) for name in runs}
    ok = vs_dd["save"] >= TARGET_RATIO
    cores = len(os.sched_getaffinity(0))
    ceiling = common.ratio(runs["save"][-1].nbytes / MIB * cores, cpu["save"])
    labels = {"dd": "dd bs=1M conv=fsync (baseline)", "save": f"save_sharded, {group.world_size} ranks"}
    rows = [
        [
            labels[name],
            f"{samples[-1].nbytes / MIB:.1f}",
            f"{rate[name]:.0f}",
            " ".join(f"{s.mibps:.0f}" for s in samples),
            f"{best_vs_dd[name]:.2f}",
            f"{cpu[name]:.2f}",
            f"{vs_dd[name]:.2f}",
            f">= {TARGET_RATIO}" if name == "save" else "",
        ]
        for name, samples in runs.items()
    ]
    table = common.format_table(
        f"Sharded save throughput, {fs.describe()}, median of {repeats}",
        ["writer", "MiB", "MiB/s", "runs MiB/s", "best/dd best", "CPU s", "vs dd", "target"],
        rows,
    )
    table += (
        "\nMiB/s, CPU s (all ranks together) and vs dd are medians; best/dd best compares the fastest runs"
        f"\n(noise only slows runs down). State: FSDP2 model of {LAYERS} Linear layers + AdamW moments, float32;"
        "\nshard files "
        + ", ".join(f"rank {r} {b / MIB:.1f} MiB" for r, b in shards.items())
        + f"; rank files {rank_files / 1024:.1f} KiB; {len(manifest.files)} files in all"
        + f"\nits CPU alone caps save_sharded at {ceiling:.0f} MiB/s on {cores} free cores"
        + f"\nsave/dd per round: {' '.join(f'{r:.2f}' for r in per_round)} (spread {spread[0]:.2f}-{spread[1]:.2f})"
    )
    result: dict[str, Any] = {
        "benchmark": "dist_save_throughput",
        "ranks": group.world_size,
        "directory": str(work),
        "filesystem": {"type": fs.fs_type, "device": fs.device, "mount_point": fs.mount_point},
        "same_device_as_repo": common.same_device(work, common.REPO_ROOT),
        "repeats": repeats,
        "state_bytes": manifest.total_bytes,
        "shard_bytes_by_rank": shards,
        "dd_timing": dd_timing,
        **{
            name: {
                "bytes": samples[-1].nbytes,
                "median_mibps": rate[name],
                "median_cpu_s": cpu[name],
                "runs_mibps": [s.mibps for s in samples],
                "ratio_vs_dd": common.finite_or_none(vs_dd[name]),
                "best_mibps": best[name],
                "best_ratio_vs_best_dd": common.finite_or_none(best_vs_dd[name]),
            }
            for name, samples in runs.items()
        },
        "ratio_per_round": [common.finite_or_none(r) for r in per_round],
        "ratio_spread": {"min": common.finite_or_none(spread[0]), "max": common.finite_or_none(spread[1])},
        "cores": cores,
        "save_cpu_ceiling_mibps": common.finite_or_none(ceiling),
        "target": {"ratio_save_vs_dd_min": TARGET_RATIO},
    }
    verdict = (
        f"save_sharded/dd = {vs_dd['save']:.2f}, per round {spread[0]:.2f}-{spread[1]:.2f} (target >= {TARGET_RATIO})"
    )
    common.write_rank_result(result=result, table=table, verdict=verdict, ok=ok)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
