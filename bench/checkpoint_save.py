"""Save throughput of ``CheckpointDir.save`` against ``dd conv=fsync`` on the same filesystem.

    .venv/bin/python bench/checkpoint_save.py [--json] [--dir DIR] [--repeats N] [--size-mb MB]
                                              [--prefault-mb MB] [--profile]

A ~512 MB training state (a model, an AdamW-like optimizer with two moments of the same size,
a scheduler and a small trainer entry) is saved with ``CheckpointDir.save`` (sha256 hashed in a
helper thread, fsync per file and per folder) and compared with ``dd if=/dev/zero bs=4M
conv=fsync`` writing the same number of bytes into the same folder. Runs alternate dd, save and
(as information) a plain ``torch.save(path)`` + ``fsync`` without hashing; files are deleted
(and ``sync`` called) between runs. Target: median save rate >= 0.8 x median dd rate.

Before each run the script touches and frees ``--prefault-mb`` of memory (0 turns it off): on a
VM whose freed memory goes back to the host (virtio-balloon free page reporting), filling the page
cache sometimes costs several times more CPU, at random, for either writer; this tries to hand
every writer warm pages. It does not remove the spread: read the medians, not single runs.

``--profile`` adds what the save path spends its CPU on: serialising into a null sink with
torch's zip CRC-32 on and off, sha256 alone, and ``CheckpointDir.save`` with torch's CRC-32 off.
"""

from __future__ import annotations

import io
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as common
import torch

from gpufleet.runtime.checkpoint import CheckpointDir

TARGET_RATIO = 0.8
DD_BLOCK = 4 * 1024 * 1024
LAYERS = 8
DD_ELAPSED_RE = re.compile(r"copied, ([0-9.]+) s")


def make_state(size_bytes: int) -> dict[str, Any]:
    """A training state of about ``size_bytes``: model, two optimizer moments, scheduler, trainer."""
    numel = max(1, size_bytes // (3 * LAYERS * 4))
    gen = torch.Generator().manual_seed(0)
    model = {f"layers.{i}.weight": torch.randn(numel, generator=gen) for i in range(LAYERS)}
    optimizer = {
        "state": {
            i: {
                "step": torch.tensor(100.0),
                "exp_avg": torch.randn(numel, generator=gen) * 1e-3,
                "exp_avg_sq": torch.rand(numel, generator=gen) * 1e-6,
            }
            for i in range(LAYERS)
        },
        "param_groups": [
            {
                "lr": 3e-4,
                "betas": (0.9, 0.95),
                "eps": 1e-8,
                "weight_decay": 0.1,
                "amsgrad": False,
                "params": list(range(LAYERS)),
            }
        ],
    }
    scheduler = {"last_epoch": 100, "_step_count": 101, "base_lrs": [3e-4], "_last_lr": [2.9e-4]}
    trainer = {"step": 100, "data_position": 100, "rng": torch.get_rng_state(), "health_history": [2.5] * 50}
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "trainer": trainer}


def tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    return []


def clear(path: Path) -> None:
    """Delete a file or folder and flush the filesystem, so the next run starts clean."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    os.sync()


def prefault(nbytes: int) -> None:
    """Touch and free ``nbytes`` of memory just before a timed run.

    On a VM with free page reporting (virtio-balloon), memory freed a few seconds ago may have been
    handed back to the host and cost a host page fault on its next use; the page cache a write
    fills comes from free pages. Touching a buffer and freeing it right before each run aims to put
    warm pages at the head of the free lists, so that every writer starts alike (a mitigation only).
    """
    if nbytes > 0:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        buf.fill_(1)
        del buf


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed run: wall seconds, bytes written, CPU seconds spent (all threads, user + system)."""

    seconds: float
    nbytes: int
    cpu_s: float

    @property
    def gbps(self) -> float:
        return self.nbytes / 1e9 / self.seconds


def run_dd(target: Path, count: int) -> tuple[Sample, str]:
    """One dd run, timed by dd's own figure (else the subprocess wall time); and which timing it was."""
    argv = ["dd", "if=/dev/zero", f"of={target}", f"bs={DD_BLOCK}", f"count={count}", "conv=fsync"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"dd failed ({proc.returncode}): {proc.stderr.strip()}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    size = target.stat().st_size
    clear(target)
    match = DD_ELAPSED_RE.search(proc.stderr)
    if match and float(match.group(1)) > 0:
        return Sample(float(match.group(1)), size, cpu), "dd"
    return Sample(wall, size, cpu), "wall"


def run_save(root: Path, state: dict[str, Any], step: int) -> Sample:
    ckpts = CheckpointDir(root, keep=1000)
    cpu = time.process_time()
    started = time.perf_counter()
    manifest = ckpts.save(step, state, reason="bench")
    sample = Sample(time.perf_counter() - started, manifest.total_bytes, time.process_time() - cpu)
    clear(root)
    return sample


def run_plain(folder: Path, state: dict[str, Any]) -> Sample:
    """``torch.save`` each entry to a path and fsync it: the save path without hashing."""
    folder.mkdir()
    cpu = time.process_time()
    started = time.perf_counter()
    size = 0
    for name, obj in state.items():
        path = folder / f"{name}.pt"
        torch.save(obj, str(path))
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        size += path.stat().st_size
    sample = Sample(time.perf_counter() - started, size, time.process_time() - cpu)
    clear(folder)
    return sample


class _NullSink(io.RawIOBase):
    """A writable file that drops what it is given (serialisation cost without I/O)."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return memoryview(data).nbytes


def _crc32_option(enabled: bool) -> Callable[[], None]:
    """Set torch.save's zip CRC-32 option; return a function that puts the old value back."""
    serialization: Any = torch.serialization
    if not hasattr(serialization, "set_crc32_options"):
        raise RuntimeError("this torch has no torch.serialization.set_crc32_options")
    old = bool(serialization.get_crc32_options())
    serialization.set_crc32_options(enabled)
    return lambda: serialization.set_crc32_options(old)


def profile(state: dict[str, Any], root: Path, repeats: int, total: int, warm: int) -> dict[str, float]:
    """GB/s of the pieces of the save path, each the median of ``repeats``."""
    import hashlib

    def timed(fn: Callable[[], None]) -> Sample:
        cpu = time.process_time()
        started = time.perf_counter()
        fn()
        return Sample(time.perf_counter() - started, total, time.process_time() - cpu)

    def rate(fn: Callable[[], Sample]) -> float:
        return common.median([fn().gbps for _ in range(repeats)])

    def serialize() -> None:
        for obj in state.values():
            torch.save(obj, _NullSink())  # type: ignore[arg-type]

    def sha256() -> None:
        for t in tensors(state):
            hashlib.sha256(t.numpy().data.cast("B")).digest()

    def save() -> Sample:
        prefault(warm)
        return run_save(root, state, 1)

    out: dict[str, float] = {}
    try:
        restore = _crc32_option(True)
    except RuntimeError:
        return {"serialize_null_sink_gbps": rate(lambda: timed(serialize)), "sha256_gbps": rate(lambda: timed(sha256))}
    try:
        out["serialize_null_sink_crc_on_gbps"] = rate(lambda: timed(serialize))
        _crc32_option(False)
        out["serialize_null_sink_crc_off_gbps"] = rate(lambda: timed(serialize))
        out["ckpt_save_crc_off_gbps"] = rate(save)
    finally:
        restore()
    out["sha256_gbps"] = rate(lambda: timed(sha256))
    return out


def main(argv: list[str]) -> int:
    p = common.parser("CheckpointDir.save throughput vs dd conv=fsync on the same filesystem.")
    p.add_argument("--dir", type=Path, default=None, help="folder to write in (default: a temp folder under /tmp)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each writer (default 3)")
    p.add_argument("--size-mb", type=int, default=512, help="state size in MiB (default 512)")
    p.add_argument(
        "--prefault-mb",
        type=int,
        default=None,
        help="memory touched and freed before each run (default: 1.5 x the state; 0: off)",
    )
    p.add_argument("--profile", action="store_true", help="also break the save path down (information only)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.size_mb < 4:
        p.error("--repeats must be >= 1 and --size-mb >= 4")

    parent = args.dir if args.dir is not None else Path("/tmp")
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-ckpt-", dir=parent))
    fs = common.filesystem_of(work)
    repo_fs = common.filesystem_of(common.REPO_ROOT)
    same_disk = common.same_device(work, common.REPO_ROOT)
    common.progress(f"writing in {work}: {fs.describe()}")
    if not same_disk:
        common.progress(f"note: the repository is on another filesystem ({repo_fs.describe()})")
    try:
        common.progress(f"building a {args.size_mb} MiB state ...")
        state = make_state(args.size_mb * 1024 * 1024)
        total = tensor_bytes(state)
        count = max(1, round(total / DD_BLOCK))
        warm = (args.size_mb * 3 // 2 if args.prefault_mb is None else args.prefault_mb) * 1024 * 1024
        common.progress("warming up (one untimed run of each writer) ...")
        run_dd(work / "dd.bin", count)
        run_save(work / "ckpt", state, 0)

        runs: dict[str, list[Sample]] = {"dd": [], "save": [], "plain": []}
        dd_timing = "dd"
        for r in range(args.repeats):
            prefault(warm)
            sample, dd_timing = run_dd(work / "dd.bin", count)
            runs["dd"].append(sample)
            prefault(warm)
            runs["save"].append(run_save(work / "ckpt", state, r + 1))
            prefault(warm)
            runs["plain"].append(run_plain(work / "plain", state))
            common.progress(
                f"round {r + 1}/{args.repeats}: dd {runs['dd'][-1].gbps:.2f} GB/s, "
                f"save {runs['save'][-1].gbps:.2f} GB/s, torch.save+fsync {runs['plain'][-1].gbps:.2f} GB/s"
            )
        prof = profile(state, work / "profile", args.repeats, total, warm) if args.profile else {}
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rate = {name: common.median([x.gbps for x in samples]) for name, samples in runs.items()}
    cpu = {name: common.median([x.cpu_s for x in samples]) for name, samples in runs.items()}
    size = {name: samples[-1].nbytes for name, samples in runs.items()}
    vs_dd = {name: common.ratio(rate[name], rate["dd"]) for name in runs}
    best = {name: max(x.gbps for x in samples) for name, samples in runs.items()}
    best_vs_dd = {name: common.ratio(best[name], best["dd"]) for name in runs}
    ok = vs_dd["save"] >= TARGET_RATIO
    labels = {
        "dd": "dd bs=4M conv=fsync (baseline)",
        "save": "CheckpointDir.save",
        "plain": "torch.save(path)+fsync, no hash (info)",
    }
    rows = [
        [
            labels[name],
            f"{size[name] / 2**20:.0f}",
            f"{rate[name]:.2f}",
            " ".join(f"{x.gbps:.2f}" for x in runs[name]),
            f"{best_vs_dd[name]:.2f}",
            f"{cpu[name]:.2f}",
            f"{vs_dd[name]:.2f}",
            f">= {TARGET_RATIO}" if name == "save" else "",
        ]
        for name in runs
    ]
    for key, value in prof.items():
        rows.append([f"profile: {key.removesuffix('_gbps')} (info)", "", f"{value:.2f}", "", "", "", "", ""])
    save_extra = common.ratio(rate["plain"], rate["save"]) - 1.0
    table = common.format_table(
        f"Checkpoint save throughput, {fs.describe()}, median of {args.repeats}",
        ["writer", "MiB", "GB/s", "runs GB/s", "best/dd best", "CPU s", "vs dd", "target"],
        rows,
    )
    table += (
        f"\nGB/s, CPU s and vs dd are medians; best/dd best compares the fastest runs (noise only slows runs"
        f"\ndown). save takes {save_extra:+.0%} longer than torch.save(path)+fsync without hashing (medians)."
    )
    result: dict[str, Any] = {
        "benchmark": "checkpoint_save",
        "directory": str(work),
        "filesystem": {"type": fs.fs_type, "device": fs.device, "mount_point": fs.mount_point},
        "same_device_as_repo": same_disk,
        "repeats": args.repeats,
        "prefault_bytes": warm,
        "state_bytes": total,
        "dd_timing": dd_timing,
        **{
            name: {
                "bytes": size[name],
                "median_gbps": rate[name],
                "median_cpu_s": cpu[name],
                "runs_gbps": [x.gbps for x in runs[name]],
                "ratio_vs_dd": common.finite_or_none(vs_dd[name]),
                "best_gbps": best[name],
                "best_ratio_vs_best_dd": common.finite_or_none(best_vs_dd[name]),
            }
            for name in runs
        },
        "save_extra_time_vs_plain": common.finite_or_none(save_extra),
        "target": {"ratio_save_vs_dd_min": TARGET_RATIO},
        "profile_gbps": prof,
    }
    verdict = f"save/dd = {vs_dd['save']:.2f} (target >= {TARGET_RATIO})"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
