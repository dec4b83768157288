"""Start-up time of the ``gpufleet`` command: what a person waits for before any work is done.

    .venv/bin/python bench/cli_startup.py [--json] [--runs 10] [--target 0.3]

Timed, each the median wall and CPU time of ``--runs`` fresh processes: ``gpufleet --help``, ``--version``,
``jobs`` and ``show 1`` in a temporary ``GPUFLEET_HOME`` holding one completed job (``examples/toy.yaml``,
written straight into the store: no scheduler runs), and ``import gpufleet.cli.app`` alone, with the
bytecode cached as an installed package has it (one untimed run first). Target: each command within
``--target`` seconds (0.3 s on an idle machine).

Baseline, in the same run: ``python -c "import typer, rich.console"``, the floor every command pays
(Python, Typer, Rich); the ratio to it is what gpufleet adds. The machine may be busy: compare the
ratios, and rerun on an idle machine before reading the absolute figures against the target.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import _common as common

TARGET_S = 0.3
FLOOR = [sys.executable, "-c", "import typer, rich.console"]
GPUFLEET = [sys.executable, "-c", "from gpufleet.cli.app import main; main()"]
"""The console script's code, run by this interpreter (the same as ``.venv/bin/gpufleet``)."""
COMMANDS = {
    "--help": ["--help"],
    "--version": ["--version"],
    "jobs": ["jobs"],
    "show 1": ["show", "1"],
}


def one_job_home(folder: Path) -> Path:
    """A home whose store holds one completed job, as the scheduler would have left it."""
    from gpufleet.jobs.store import Store
    from gpufleet.paths import state_db
    from gpufleet.spec import load_spec

    home = folder / "home"
    home.mkdir()
    store = Store(state_db(home))
    job_id = store.add_job(load_spec(common.REPO_ROOT / "examples" / "toy.yaml"), "local")
    store.set_job_state(job_id, "completed")
    store.close()
    return home


def main() -> int:
    p = common.parser(__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--runs", type=int, default=10, help="fresh processes timed per command")
    p.add_argument("--target", type=float, default=TARGET_S, help="seconds each command may take")
    args = p.parse_args()
    if args.runs < 1:
        p.error(f"--runs {args.runs}: give at least 1 (a median needs a run)")
    if not args.target > 0:
        p.error(f"--target {args.target}: give a number of seconds above 0")
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-cli-") as folder:
        env = {**os.environ, "GPUFLEET_HOME": str(one_job_home(Path(folder))), "COLUMNS": "100"}
        # Bytecode cached as an installed package has it (PYTHONDONTWRITEBYTECODE would compile every module
        # on every start), kept in the temporary folder, not the source tree.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(folder) / "pycache")
        common.progress(f"baseline: {' '.join(FLOOR[1:])}")
        floor = common.process_times(FLOOR, args.runs, env)
        figures: dict[str, tuple[float, float]] = {}
        for name, argv in COMMANDS.items():
            common.progress(f"gpufleet {name}")
            figures[name] = common.process_times([*GPUFLEET, *argv], args.runs, env)
        common.progress("import gpufleet.cli.app")
        figures["import gpufleet.cli.app"] = common.process_times(
            [sys.executable, "-c", "import gpufleet.cli.app"], args.runs, env
        )
    slowest = max(wall for name, (wall, _) in figures.items() if name in COMMANDS)
    ok = slowest <= args.target
    rows = [["python + typer + rich (floor)", f"{floor[0]:.3f}", f"{floor[1]:.3f}", "1.00"]]
    rows += [
        [name, f"{wall:.3f}", f"{cpu:.3f}", f"{common.ratio(wall, floor[0]):.2f}"]
        for name, (wall, cpu) in figures.items()
    ]
    result = {
        "runs": args.runs,
        "target_s": args.target,
        "floor_s": {"wall": floor[0], "cpu": floor[1]},
        "median_s": {name: {"wall": wall, "cpu": cpu} for name, (wall, cpu) in figures.items()},
        "slowest_command_s": slowest,
    }
    return common.finish(
        json_mode=args.json,
        result=result,
        table=common.format_table(
            f"gpufleet start-up, median of {args.runs} runs", ["", "wall s", "cpu s", "wall x floor"], rows
        ),
        verdict=f"slowest command {slowest:.3f} s (target {args.target:.3f} s)",
        ok=ok,
    )


if __name__ == "__main__":
    sys.exit(main())
