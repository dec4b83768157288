"""Helpers shared by the benchmarks in ``bench/``: argument parsing, statistics, filesystems, output.

Every benchmark compares ratios against a baseline measured in the same run (the machine is
shared, so absolute timings mean little), prints a small table (or, with ``--json``, one JSON
object on stdout) and exits 0 when its target is met, 1 otherwise. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpufleet  # noqa: F401  (imported before numpy, as in every command: numpy's CPU kernels as users get them)

REPO_ROOT = Path(__file__).resolve().parent.parent


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the ``--json`` flag every benchmark has."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    return p


def progress(message: str) -> None:
    """A progress line on stderr (stdout is kept for the table or the JSON object)."""
    print(message, file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, ``inf`` (or ``nan`` for 0/0) when the denominator is 0."""
    if denominator == 0:
        return float("nan") if numerator == 0 else float("inf")
    return numerator / denominator


@dataclass(frozen=True, slots=True)
class Filesystem:
    """The mount a path lives on, from ``/proc/self/mounts``."""

    mount_point: str
    device: str
    fs_type: str

    def describe(self) -> str:
        return f"{self.fs_type} on {self.device} (mounted at {self.mount_point})"


def filesystem_of(path: Path) -> Filesystem:
    """The longest mount point that contains ``path``; ``unknown`` fields off Linux."""
    resolved = str(path.resolve())
    best = Filesystem("?", "unknown", "unknown")
    try:
        lines = Path("/proc/self/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        device, mount_point, fs_type = fields[0], fields[1].replace("\\040", " "), fields[2]
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and (best.mount_point == "?" or len(mount_point) >= len(best.mount_point)):
            best = Filesystem(mount_point, device, fs_type)
    return best


def same_device(a: Path, b: Path) -> bool:
    """Whether two existing paths are on the same block device."""
    return os.stat(a).st_dev == os.stat(b).st_dev


def format_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: left-aligned first column, right-aligned others."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join(parts).rstrip()

    rule = "-" * len(line(["-" * w for w in widths]))
    return "\n".join([title, rule, line(header), rule, *(line(r) for r in rows), rule])


def finish(*, json_mode: bool, result: dict[str, Any], table: str, verdict: str, ok: bool) -> int:
    """Print the table and verdict (or the JSON object) and return the exit status."""
    if json_mode:
        print(json.dumps({**result, "target_met": ok}, indent=None, sort_keys=True, allow_nan=False, default=str))
    else:
        print(table)
        print(f"{'PASS' if ok else 'FAIL'}: {verdict}")
    return 0 if ok else 1


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN or inf."""
    return value if value == value and abs(value) != float("inf") else None


RANK_RESULT_ENV = "GPUFLEET_BENCH_RESULT"
"""Where rank 0 of a benchmark started by ``run_ranks`` writes its result (a JSON file)."""


def under_torchrun() -> bool:
    """Whether this process is a rank that torchrun started (it sets ``RANK``)."""
    return "RANK" in os.environ


def run_ranks(
    script: str, argv: Sequence[str], ranks: int, *, json_mode: bool, env: dict[str, str] | None = None
) -> int:
    """Run ``script argv`` as ``ranks`` ranks under ``torch.distributed.run --standalone`` (gloo on CPU).

    Rank 0 hands back its figures with ``write_rank_result``; this prints them as ``finish`` does and
    returns the exit status (2 when the ranks failed). Each rank gets one thread (``OMP_NUM_THREADS=1``),
    ``env`` on top; its stderr (the progress lines) passes through, its stdout is dropped.
    """
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="gpufleet-bench-ranks-"))
    out = folder / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", script, *argv]
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {}), RANK_RESULT_ENV: str(out)}
    progress(f"starting {ranks} ranks under torchrun (gloo)")
    try:
        proc = subprocess.run(cmd, env=child_env, stdout=subprocess.DEVNULL, check=False)
        if proc.returncode != 0 or not out.exists():
            progress(f"torchrun exited {proc.returncode}")
            return 2
        payload = json.loads(out.read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return finish(
        json_mode=json_mode,
        result=payload["result"],
        table=payload["table"],
        verdict=payload["verdict"],
        ok=bool(payload["ok"]),
    )


def write_rank_result(*, result: dict[str, Any], table: str, verdict: str, ok: bool) -> None:
    """Rank 0 under ``run_ranks``: hand the figures back to the process that started the ranks."""
    payload = {"result": result, "table": table, "verdict": verdict, "ok": ok}
    Path(os.environ[RANK_RESULT_ENV]).write_text(json.dumps(payload, allow_nan=False, default=str), encoding="utf-8")


def bench_venv(venv: Path, requirements: Sequence[str], probe: str) -> Path:
    """The python of a benchmark's own virtualenv (another library's pins, kept out of ``.venv``), created with
    ``requirements`` (a minute or two, once) unless its python already runs ``probe``."""
    import subprocess

    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0:
        return python
    progress(f"creating {venv} with {' '.join(requirements)} (once) ...")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True)
    return python


def run_json_script(python: Path, script: str, args: Sequence[str], env: dict[str, str]) -> dict[str, Any] | None:
    """Run ``python -c script args`` (another library in its own venv) and read the JSON object its last line
    prints; ``None`` (its stderr's tail shown) when it fails."""
    import subprocess

    proc = subprocess.run([str(python), "-c", script, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        progress(proc.stderr[-3000:])
        return None
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def process_times(argv: Sequence[str], runs: int, env: dict[str, str]) -> tuple[float, float]:
    """The median wall and CPU (user + system) seconds of ``runs`` fresh processes of ``argv`` (each must exit 0),
    after one untimed run. The CPU time is what it costs on a busy machine, where its wall time waits for a core."""
    return interleaved_times([("", argv, env)], runs)[""]


def interleaved_times(
    cases: Sequence[tuple[str, Sequence[str], dict[str, str]]], runs: int
) -> dict[str, tuple[float, float]]:
    """:func:`process_times` of each ``(name, argv, env)``, run in ``runs`` interleaved rounds (each case once a
    round, after one untimed run of each): a machine whose speed drifts during the runs moves every case alike,
    so the cases compare with each other."""
    import resource
    import subprocess
    import time

    for _, argv, env in cases:
        first = subprocess.run(list(argv), env=env, capture_output=True, text=True)
        if first.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {first.stderr.strip()[-300:]}")
    walls: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    cpus: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for _ in range(runs):
        for name, argv, env in cases:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run(list(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            walls[name].append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus[name].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return {name: (median(walls[name]), median(cpus[name])) for name, _, _ in cases}


def set_environ(values: dict[str, str]) -> dict[str, str | None]:
    """Set ``values`` in this process's environment; returns the old values (``None``: unset) to restore."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    return saved


def restore_environ(saved: dict[str, str | None]) -> None:
    """Put back what :func:`set_environ` replaced: each name its old value, or unset again."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def peak_rss_mib() -> float:
    """The process's peak resident set size so far, in MiB (``ru_maxrss`` counts KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def traced_mib(fn: Callable[[], object]) -> tuple[float, float]:
    """Peak and still-held MiB that ``tracemalloc`` saw allocated during ``fn()`` (numpy's arrays included)."""
    import tracemalloc

    tracemalloc.start()
    try:
        kept = fn()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return peak / 2**20, held / 2**20
