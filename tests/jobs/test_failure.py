"""Why a job failed, read from the end of its last attempt's log: the exception, how it died, or its last lines."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpufleet.jobs.failure import LINE_MAX, Failure, failure_line, job_failure, printable, read_log_tail
from gpufleet.jobs.store import Store
from gpufleet.paths import attempt_log, state_db
from gpufleet.spec import parse_spec

CHAINED = """step 79 loss 1.0
step 80 loss 1.0
Traceback (most recent call last):
  File "train.py", line 6, in <module>
    raise ValueError("inner")
ValueError: inner

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "train.py", line 8, in <module>
    raise RuntimeError("boom at step 80") from e
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
RuntimeError: boom at step 80
"""

TORCHRUN = """[rank1]: Traceback (most recent call last):
[rank1]:   File "train.py", line 3, in <module>
[rank1]:     main()
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
E1105 12:00:00 agent failed
Traceback (most recent call last):
  File "torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
"""


@pytest.mark.parametrize(
    ("log", "line"),
    [
        (CHAINED, "RuntimeError: boom at step 80"),
        (TORCHRUN, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        (
            'Traceback (most recent call last):\n  File "t.py", line 1\nValueError: first line\nsecond line\n\nbye\n',
            "ValueError: first line | second line",
        ),
        (
            'step 3\nTraceback (most recent call last):\n  File "t.py", line 9, in f\nKeyboardInterrupt\n',
            "KeyboardInterrupt",
        ),
        (
            # torchrun without rank prefixes: the agent's log lines follow the rank's traceback.
            'Traceback (most recent call last):\n  File "t.py", line 1\ntorch.OutOfMemoryError: CUDA out of memory\n'
            "E1105 12:00:00.123000 77 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1)\n"
            "I1105 12:00:00.124000 77 torch/distributed/elastic/agent/server/api.py:1] done\n",
            "torch.OutOfMemoryError: CUDA out of memory",
        ),
        (
            'Traceback (most recent call last):\n  File "t.py", line 1\nRuntimeError: boom\n'
            "gpufleet: the group did not re-form within 120 s; the attempt is requeued\n",
            "RuntimeError: boom",
        ),
        (
            'Traceback (most recent call last):\n  File "t.py", line 1\nValueError: bad\n'
            "2026-12-06 01:02:03,456 INFO shutting down\nERROR:root:cleanup failed\n",
            "ValueError: bad",
        ),
        ("step 1\nstep 2\nKilled\n", "Killed"),
        (
            "step 1\ngpufleet: step 42 is unhealthy after 3 rollbacks (health.max_rollbacks)\nbye\n",
            "gpufleet: step 42 is unhealthy after 3 rollbacks (health.max_rollbacks)",
        ),
        ("a\n\nb\nc\nd\n", "b | c | d"),
        ("\x1b[31mstep 1\x1b[0m\n", "step 1"),
        ("", None),
    ],
)
def test_the_line_that_says_why(log: str, line: str | None) -> None:
    assert failure_line(log) == line


def test_a_partial_tail_drops_its_cut_first_line() -> None:
    assert failure_line("oss 1.0\nstep 9\n", partial=True) == "step 9"


def test_what_a_job_wrote_is_escaped_and_capped() -> None:
    assert printable("RuntimeError: \x07bell\u202eflip\ttab") == "RuntimeError: \\x07bell\\u202eflip\\ttab"
    long = failure_line("ValueError: " + "x" * 5000 + "\n")
    assert long is not None and len(long) == LINE_MAX and long.endswith("...")


def _failed_job(home: Path, log: bytes | None, *, exit_code: int = 1, reason: str = "exit code 1") -> tuple[Store, int]:
    store = Store(state_db(home))
    job_id = store.add_job(parse_spec({"name": "boom", "entrypoint": "python train.py"}), "local")
    now = time.time()
    store.add_attempt(job_id, 1, os.getpid(), now)
    store.end_attempt(
        job_id, 1, ended_at=now, exit_code=exit_code, outcome="failed", job_state="failed", reason=reason, restarts=0
    )
    if log is not None:
        path = attempt_log(home, job_id, 1)
        path.parent.mkdir(parents=True)
        path.write_bytes(log)
    return store, job_id


def test_a_failed_job_names_its_attempt_exit_line_and_where_to_read_more(tmp_path: Path) -> None:
    store, job_id = _failed_job(tmp_path, CHAINED.encode())
    failure = job_failure(store, tmp_path, store.job(job_id))
    assert failure == Failure(
        attempt=1, exit="exit code 1", line="RuntimeError: boom at step 80", hint="gpufleet logs 1"
    )
    assert failure.describe() == "exit code 1: RuntimeError: boom at step 80"


def test_only_the_tail_is_read(tmp_path: Path) -> None:
    store, job_id = _failed_job(tmp_path, b"x" * 100_000 + b"\n" + CHAINED.encode())
    failure = job_failure(store, tmp_path, store.job(job_id), tail_bytes=4096)
    assert failure is not None and failure.line == "RuntimeError: boom at step 80"


def test_a_lost_job_without_a_log_says_how_it_ended(tmp_path: Path) -> None:
    store, job_id = _failed_job(tmp_path, None, exit_code=-9, reason="lost after 3 restarts (max_restarts)")
    failure = job_failure(store, tmp_path, store.job(job_id))
    assert failure is not None and failure.line is None
    assert failure.describe() == "lost after 3 restarts (max_restarts)"


def test_a_job_that_did_not_fail_has_no_failure(tmp_path: Path) -> None:
    store = Store(state_db(tmp_path))
    job_id = store.add_job(parse_spec({"name": "ok", "entrypoint": "python train.py"}), "local")
    assert job_failure(store, tmp_path, store.job(job_id)) is None


def test_a_log_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    store, job_id = _failed_job(tmp_path, None)
    secret = tmp_path / "secret"
    secret.write_text("RuntimeError: the operator's secret\n")
    attempt_log(tmp_path, job_id, 1).parent.mkdir(parents=True)
    attempt_log(tmp_path, job_id, 1).symlink_to(secret)
    assert read_log_tail(attempt_log(tmp_path, job_id, 1), 1024) is None
    failure = job_failure(store, tmp_path, store.job(job_id))
    assert failure is not None and failure.line is None
