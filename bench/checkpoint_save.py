"""Save throughput of ``CheckpointDir.save`` against ``dd conv=fsync`` on the same filesystem.

    .venv/bin/python bench/checkpoint_save.py [--json] [--dir DIR] [--repeats N] [--size-mb MB] [--profile]

A ~512 MB training state (a model, an AdamW-like optimizer with two moments of the same size,
a scheduler and a small trainer entry) is saved with ``CheckpointDir.save`` (sha256 hashed in a
helper thread, fsync per file and per folder) and compared with ``dd if=/dev/zero bs=4M
conv=fsync`` writing the same number of bytes into the same folder. Runs alternate dd, save and
(as information) a plain ``torch.save(path)`` + ``fsync`` without hashing; files are deleted
(and ``sync`` called) between runs. Target: median save rate >= 0.8 x median dd rate.

``--profile`` adds what the save path spends its CPU on: serialising into a null sink with
torch's zip CRC-32 on and off, sha256 alone, and ``CheckpointDir.save`` with torch's CRC-32 off.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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

    On a VM with free page reporting (virtio-balloon), memory freed a few seconds ago has been
    handed back to the host and costs a host page fault on its next use; the page cache a write
    fills comes from those free pages. Touching a buffer and freeing it right before each run puts
    warm pages at the head of the free lists, so every writer starts equally warm.
    """
    if nbytes > 0:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        buf.fill_(1)
        del buf


def run_dd(target: Path, count: int) -> tuple[float, int, str]:
    """Seconds dd took (its own figure, else the subprocess wall time), bytes, and which it was."""
    argv = ["dd", "if=/dev/zero", f"of={target}", f"bs={DD_BLOCK}", f"count={count}", "conv=fsync"]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"dd failed ({proc.returncode}): {proc.stderr.strip()}")
    size = target.stat().st_size
    clear(target)
    match = DD_ELAPSED_RE.search(proc.stderr)
    if match and float(match.group(1)) > 0:
        return float(match.group(1)), size, "dd"
    return wall, size, "wall"


def run_save(root: Path, state: dict[str, Any], step: int) -> tuple[float, int]:
    ckpts = CheckpointDir(root, keep=1000)
    started = time.perf_counter()
    manifest = ckpts.save(step, state, reason="bench")
    seconds = time.perf_counter() - started
    clear(root)
    return seconds, manifest.total_bytes


def run_plain(folder: Path, state: dict[str, Any]) -> tuple[float, int]:
    """``torch.save`` each entry to a path and fsync it: the save path without hashing."""
    folder.mkdir()
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
    seconds = time.perf_counter() - started
    clear(folder)
    return seconds, size


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


def profile(state: dict[str, Any], root: Path, repeats: int, total: int) -> dict[str, float]:
    """GB/s of the pieces of the save path, each the median of ``repeats``."""
    import hashlib

    def rate(fn: Callable[[], int]) -> float:
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            size = fn()
            samples.append(size / 1e9 / (time.perf_counter() - started))
        return common.median(samples)

    def serialize() -> int:
        for obj in state.values():
            torch.save(obj, _NullSink())  # type: ignore[arg-type]
        return total

    def sha256() -> int:
        for t in tensors(state):
            hashlib.sha256(t.numpy().data.cast("B")).digest()
        return total

    def save() -> int:
        return run_save(root, state, 1)[1]

    out: dict[str, float] = {}
    try:
        restore = _crc32_option(True)
    except RuntimeError:
        return {"serialize_null_sink_gbps": rate(serialize), "sha256_gbps": rate(sha256)}
    try:
        out["serialize_null_sink_crc_on_gbps"] = rate(serialize)
        _crc32_option(False)
        out["serialize_null_sink_crc_off_gbps"] = rate(serialize)
        out["ckpt_save_crc_off_gbps"] = rate(save)
    finally:
        restore()
    out["sha256_gbps"] = rate(sha256)
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

        dd_rates: list[float] = []
        save_rates: list[float] = []
        plain_rates: list[float] = []
        dd_source = "dd"
        dd_bytes = save_bytes = plain_bytes = 0
        for r in range(args.repeats):
            prefault(warm)
            seconds, dd_bytes, dd_source = run_dd(work / "dd.bin", count)
            dd_rates.append(dd_bytes / 1e9 / seconds)
            prefault(warm)
            seconds, save_bytes = run_save(work / "ckpt", state, r + 1)
            save_rates.append(save_bytes / 1e9 / seconds)
            prefault(warm)
            seconds, plain_bytes = run_plain(work / "plain", state)
            plain_rates.append(plain_bytes / 1e9 / seconds)
            common.progress(
                f"round {r + 1}/{args.repeats}: dd {dd_rates[-1]:.2f} GB/s, save {save_rates[-1]:.2f} GB/s, "
                f"torch.save+fsync {plain_rates[-1]:.2f} GB/s"
            )
        prof = profile(state, work / "profile", args.repeats, total) if args.profile else {}
    finally:
        shutil.rmtree(work, ignore_errors=True)

    dd_med, save_med, plain_med = (common.median(x) for x in (dd_rates, save_rates, plain_rates))
    save_vs_dd = common.ratio(save_med, dd_med)
    plain_vs_dd = common.ratio(plain_med, dd_med)
    ok = save_vs_dd >= TARGET_RATIO

    def fmt(values: list[float]) -> str:
        return " ".join(f"{v:.2f}" for v in values)

    rows = [
        ["dd bs=4M conv=fsync (baseline)", f"{dd_bytes / 2**20:.0f}", f"{dd_med:.2f}", fmt(dd_rates), "1.00", ""],
        [
            "CheckpointDir.save",
            f"{save_bytes / 2**20:.0f}",
            f"{save_med:.2f}",
            fmt(save_rates),
            f"{save_vs_dd:.2f}",
            f">= {TARGET_RATIO}",
        ],
        [
            "torch.save(path)+fsync, no hash (info)",
            f"{plain_bytes / 2**20:.0f}",
            f"{plain_med:.2f}",
            fmt(plain_rates),
            f"{plain_vs_dd:.2f}",
            "",
        ],
    ]
    for key, value in prof.items():
        rows.append([f"profile: {key.removesuffix('_gbps')} (info)", "", f"{value:.2f}", "", "", ""])
    hashing_cost = common.ratio(plain_med, save_med) - 1.0
    table = common.format_table(
        f"Checkpoint save throughput, {fs.describe()}, median of {args.repeats}",
        ["writer", "MiB", "GB/s", "runs GB/s", "vs dd", "target"],
        rows,
    )
    table += f"\nsave takes {hashing_cost:+.0%} longer than torch.save(path)+fsync without hashing"
    result: dict[str, Any] = {
        "benchmark": "checkpoint_save",
        "directory": str(work),
        "filesystem": {"type": fs.fs_type, "device": fs.device, "mount_point": fs.mount_point},
        "same_device_as_repo": same_disk,
        "repeats": args.repeats,
        "prefault_bytes": warm,
        "state_bytes": total,
        "dd": {"bytes": dd_bytes, "median_gbps": dd_med, "runs_gbps": dd_rates, "timing": dd_source},
        "save": {"bytes": save_bytes, "median_gbps": save_med, "runs_gbps": save_rates},
        "plain_torch_save_fsync": {"bytes": plain_bytes, "median_gbps": plain_med, "runs_gbps": plain_rates},
        "ratio_save_vs_dd": common.finite_or_none(save_vs_dd),
        "ratio_plain_vs_dd": common.finite_or_none(plain_vs_dd),
        "save_extra_time_vs_plain": common.finite_or_none(hashing_cost),
        "target": {"ratio_save_vs_dd_min": TARGET_RATIO},
        "profile_gbps": prof,
    }
    verdict = f"save/dd = {save_vs_dd:.2f} (target >= {TARGET_RATIO})"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
