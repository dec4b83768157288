"""Run every benchmark of ``make bench`` in turn, and end with one table of their verdicts.

    .venv/bin/python bench/run_all.py [--only NAME,...] [--json]

Each script runs as ``make bench`` always ran it (its table on stdout, its progress on stderr), and a
miss no longer stops the run: the scripts after it still run, so one slow machine or one missed target
does not hide the figures of the others. The last lines are the verdicts, one per script (``PASS``,
``FAIL`` with the script's own one-line verdict, or the exit status of a script that crashed), and the
exit status is 1 when any script did not pass. ``--json`` prints the verdicts as one JSON object
instead of that table (each script's own table then goes to stderr).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import _common as common

SCRIPTS = (
    "checkpoint_save",
    "step_overhead",
    "preemption_loss",
    "metrics_overhead",
    "dcgm_scrape",
    "planner",
    "simulate",
    "drift_vs_evidently",
    "estimate_vs_nannyml",
    "mmd",
    "false_alarms",
    "dist_step_overhead",
    "dist_save_throughput",
    "dist_preemption_loss",
    "dist_async_save",
    "rank_phases",
    "goodput",
    "sweep_overhead",
    "stage_throughput",
    "rl_actors",
    "serve_load",
    "cli_startup",
    "growth",
    "scheduler_queue",
)
"""The order ``make bench`` runs them in."""
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class Verdict:
    script: str
    status: int
    passed: bool
    verdict: str
    seconds: float


def run(script: str, out: TextIO, folder: Path = HERE) -> Verdict:
    """Run one script, its output passed through to ``out`` line by line, and keep its last ``PASS:``/``FAIL:`` line."""
    path = folder / f"{script}.py"
    started = time.monotonic()
    last = ""
    with subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if line.startswith(("PASS:", "FAIL:")):
                last = line.strip()
    seconds = time.monotonic() - started
    passed = proc.returncode == 0
    if not last:
        last = "PASS" if passed else f"FAIL: exited {proc.returncode} without a verdict"
    return Verdict(script, proc.returncode, passed, last, round(seconds, 1))


def main(argv: list[str] | None = None, scripts: tuple[str, ...] = SCRIPTS, folder: Path = HERE) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated script names (default: every one, in order)")
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(scripts)
    unknown = [s for s in chosen if s not in scripts]
    if unknown:
        p.error(f"--only: no benchmark {unknown[0]!r}; give names from: {', '.join(scripts)}")
    verdicts = []
    for script in chosen:
        common.progress(f"== bench/{script}.py")
        verdicts.append(run(script, sys.stderr if args.json else sys.stdout, folder))
    failed = [v for v in verdicts if not v.passed]
    if args.json:
        print(json.dumps({"verdicts": [asdict(v) for v in verdicts], "failed": len(failed)}, sort_keys=True))
    else:
        rows = [[v.script, "PASS" if v.passed else "FAIL", f"{v.seconds:.0f} s", v.verdict[:140]] for v in verdicts]
        print(common.format_table("make bench", ["script", "", "took", "verdict"], rows))
        print(f"{len(verdicts) - len(failed)} of {len(verdicts)} met their targets")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
