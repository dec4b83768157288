"""``python -m gpufleet.data.stage_in -- ARGV...``: stage the job's data in, then become ``ARGV``.

``rank_argv`` puts this in front of every rank of a job whose spec has a ``data`` block, on every
backend. It reads the backend's contract (``GPUFLEET_SPEC``, ``GPUFLEET_JOB_DIR``,
``GPUFLEET_ATTEMPT``, ``GPUFLEET_EVENTS``), stages once per attempt and data folder (the first rank
to take the lock copies; the others find the attempt's marker), logs a ``data_staged`` event with
the seconds, files and bytes, and ``exec``s the rank's process, which keeps the pid the backend
signals. A failure logs ``data_stage_failed`` naming the file and exits 1 without training.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from gpufleet.data.stage import StageError, default_cache, stage_for_attempt
from gpufleet.jobs.events import EventKind, append_event
from gpufleet.jobs.protocol import ENV_ATTEMPT, ENV_DATA_DIR, ENV_EVENTS, ENV_JOB_DIR, ENV_SPEC
from gpufleet.numpy_cpu import without_own_setting
from gpufleet.spec import parse_spec

USAGE = "usage: python -m gpufleet.data.stage_in -- ARGV..."


class _Lines:
    """Progress as log lines (an attempt's log is a file): at most one per 10% or 10 seconds."""

    def __init__(self) -> None:
        self.next_share = 0.1
        self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        share = done / total if total else 1.0
        if share >= self.next_share or now - self.last >= 10.0:
            print(f"gpufleet: staging data: {done / 1e6:,.1f} of {total / 1e6:,.1f} MB", file=sys.stderr, flush=True)
            self.next_share = share + 0.1
            self.last = now


def main(argv: list[str]) -> int:
    args = argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    spec_path, job_folder = os.environ.get(ENV_SPEC), os.environ.get(ENV_JOB_DIR)
    if not spec_path or not job_folder:
        print(
            f"gpufleet.data.stage_in: {ENV_SPEC} and {ENV_JOB_DIR} must be set; run jobs with `gpufleet submit`",
            file=sys.stderr,
        )
        return 2
    spec = parse_spec(json.loads(Path(spec_path).read_text(encoding="utf-8")), source=spec_path)
    attempt = int(os.environ.get(ENV_ATTEMPT) or 1)
    events_path = os.environ.get(ENV_EVENTS)
    data_root = Path(os.environ.get(ENV_DATA_DIR) or Path(job_folder) / "data")
    home = Path(os.environ.get("GPUFLEET_HOME") or Path(job_folder).parent.parent)
    if spec.data is not None:
        started = time.perf_counter()
        try:
            report = stage_for_attempt(spec.data, data_root, attempt, cache_root=default_cache(home), progress=_Lines())
        except (StageError, OSError) as err:
            print(f"gpufleet: data staging failed: {err}", file=sys.stderr, flush=True)
            append_event(
                events_path,
                attempt,
                EventKind.DATA_STAGE_FAILED,
                error=str(err),
                file=err.file if isinstance(err, StageError) else err.filename,
                seconds=time.perf_counter() - started,
            )
            return 1
        if report is not None:
            rate = report.copy_bytes_per_s
            print(
                f"gpufleet: staged {report.files} files ({report.bytes / 1e6:,.1f} MB) in {report.seconds:.2f} s: "
                f"{report.files_copied} copied, {report.files_reused} reused"
                + (f", {rate / 1e6:,.0f} MB/s" if rate else ""),
                file=sys.stderr,
                flush=True,
            )
            append_event(events_path, attempt, EventKind.DATA_STAGED, **report.to_json())
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(args[0], args, without_own_setting(os.environ))  # the job's own code: the user's environment
    except OSError as err:
        print(f"gpufleet: cannot start {args[0]!r}: {err.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))


__all__ = ["main"]
