"""What a job writes is untrusted: hostile lines of its event log and GPU log, and a damaged state database.

Each test pins one violation fuzzing found: a reader that crashed (a 5,000-digit number, deep
nesting, an infinite step, a lone surrogate, a rank given as a string) or a command that printed
a traceback instead of one line. A hostile line is skipped (an event line is quarantined with an
``events_rejected`` warning), a NaN loss is kept as the measurement it is, and ``--json`` output
stays standard JSON.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli

from gpufleet.backends.base import ingest_events
from gpufleet.cost.ledger import build_ledger
from gpufleet.cost.rates import load_rates
from gpufleet.cost.usage import job_usages
from gpufleet.devtools.debug import read_losses
from gpufleet.errors import StoreError
from gpufleet.jobs.events import read_events_checked
from gpufleet.jobs.store import Outcome, Store
from gpufleet.spec import parse_spec
from gpufleet.telemetry.diagnose import series_from_samples
from gpufleet.telemetry.gpu import job_gpu_samples, read_gpu_log
from gpufleet.telemetry.gpu.log import MAX_LINE_BYTES
from gpufleet.telemetry.ranks import rank_findings
from gpufleet.telemetry.tracing import job_spans

T0 = 1_796_000_000.0
UTIL, SM = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE"


def strict_json(text: str) -> Any:
    """``text`` as standard JSON: NaN, Infinity and -Infinity are errors."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant} in output")

    return json.loads(text, parse_constant=refuse)


def good_events(ranks: int = 2) -> list[dict[str, Any]]:
    """Two attempts of a distributed job, the first preempted, as its runtime reports them."""
    out: list[dict[str, Any]] = []
    ts, step = T0, 0
    for n in (1, 2):
        ts = T0 + 2 + 31 * (n - 1)
        hosts = [{"rank": r, "host": f"node-{r}"} for r in range(ranks)]
        out += [
            {"ts": ts, "attempt": n, "kind": "session_start", "pid": 1000 + n, "total_steps": 20},
            {"ts": ts + 0.01, "attempt": n, "kind": "restore", "step": step or None, "seconds": 0.01},
            {"ts": ts + 0.02, "attempt": n, "kind": "train_start", "step": step, "data_position": step},
            {"ts": ts + 0.03, "attempt": n, "kind": "group", "world_size": ranks, "ranks": hosts},
        ]
        for _ in range(10):
            step, ts = step + 1, ts + 0.5
            waits = {"rank_step_s": [0.1] * ranks, "rank_wait_s": [0.0] * ranks}  # no straggler
            out.append({"ts": ts, "attempt": n, "kind": "step", "step": step, "loss": 5.0 / step, **waits})
            if step % 5 == 0:
                out.append({"ts": ts + 0.01, "attempt": n, "kind": "checkpoint", "step": step, "seconds": 0.01})
        status = "completed" if n == 2 else "requeue"
        out.append({"ts": ts + 0.4, "attempt": n, "kind": "session_end", "status": status, "step": step})
    return out


def make_job(home: Path, lines: list[str], *, ingest: bool = True, ranks: int = 2) -> int:
    """A completed job of ``ranks`` GPUs, preempted once, whose event log ends with ``lines``, ingested
    the way the scheduler ingests it (``ingest_events``)."""
    store = Store(home / "state.db")
    spec = {"name": "lm", "team": "nlp", "entrypoint": "m:f", "resources": {"gpus": ranks, "gpu_type": "H100"}}
    if ranks > 1:
        spec["distributed"] = {"strategy": "ddp"}
    job_id = store.add_job(parse_spec(spec), "local")
    for n in (1, 2):
        start = T0 + 1 + 31 * (n - 1)
        store.add_attempt(job_id, n, pid=1000 + n, started_at=start)
        store.add_event(job_id, "attempt_start", attempt=n, ts=start, pid=1000 + n, gpus=ranks)
        outcome = Outcome.COMPLETED if n == 2 else Outcome.PREEMPTED
        store.update_attempt(job_id, n, state="ended", ended_at=start + 29, exit_code=0, outcome=outcome)
    store.set_job_state(job_id, "completed")
    folder = home / "jobs" / str(job_id)
    folder.mkdir(parents=True)
    text = "\n".join([*(json.dumps(e) for e in good_events(ranks)), *lines]) + "\n"
    (folder / "events.jsonl").write_bytes(text.encode("utf-8", "surrogatepass"))
    if ingest:
        ingest_events(store, home, store.job(job_id))
    store.close()
    return job_id


def gpu_log(folder: Path, lines: list[str]) -> Path:
    """Attempt 1's GPU log: a header, two series, a round, ``lines``, and a last round."""
    path = folder / "gpu" / "attempt-1.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = [
        json.dumps({"gpufleet_gpu_log": 1, "source": "synthetic:healthy", "started_ms": 1_796_000_001_000}),
        json.dumps({"series": [[0, UTIL, {"gpu": "0"}], [1, SM, {"gpu": "0"}]]}),
        '{"t": 1796000001000, "v": [[0, 50], [1, 0.5]]}',
    ]
    text = "\n".join([*head, *lines, '{"t": 1796000009000, "v": [[0, 60], [1, 0.6]]}']) + "\n"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


def values(path: Path) -> list[tuple[str, float, int | None]]:
    return [(s.name, s.value, s.timestamp_ms) for s in read_gpu_log(path)]


# ---- 1. the GPU log reader ----------------------------------------------------------------------


def test_gpu_log_lines_past_the_digit_and_recursion_limits_are_skipped(tmp_path: Path) -> None:
    path = gpu_log(
        tmp_path,
        [
            '{"t": ' + "9" * 5000 + ', "v": []}',  # int() digit limit: ValueError
            '{"t": 1796000002000, "v": [[0, ' + "1" * 5000 + "]]}",
            "[" * 50_000 + "]" * 50_000,  # RecursionError
            '{"series": [[0, "' + UTIL + '", {"gpu": "' + "[" * 5000 + '"}]]}',  # deep-looking, but a string
        ],
    )
    first, last = 1_796_000_001_000, 1_796_000_009_000
    assert values(path) == [(UTIL, 50.0, first), (SM, 0.5, first), (UTIL, 60.0, last), (SM, 0.6, last)]


def test_gpu_log_line_over_the_length_limit_is_skipped(tmp_path: Path) -> None:
    long_round = '{"t": 1796000002000, "v": [' + ",".join(["[0, 70]"] * (MAX_LINE_BYTES // 7 + 1)) + "]}"
    path = gpu_log(tmp_path, [long_round])
    assert len(long_round) > MAX_LINE_BYTES
    assert [v for _, v, _ in values(path)] == [50.0, 0.5, 60.0, 0.6]


def test_bare_non_finite_values_times_out_of_range_and_lone_surrogates_are_skipped(tmp_path: Path) -> None:
    path = gpu_log(
        tmp_path,
        [
            '{"t": 1e400, "v": [[0, 1]]}',
            '{"t": ' + str(10**30) + ', "v": [[0, 1]]}',
            '{"t": -5, "v": [[0, 1]]}',
            '{"t": 1796000003000, "v": [[0, 1e400], [1, NaN], [0, -Infinity], [0, ' + str(10**400) + "]]}",
            '{"series": [[7, "\\ud800", {"gpu": "0"}], [8, "' + UTIL + '", {"gpu": "\\ud800[/]"}]]}',
            '{"t": 1796000004000, "v": [[7, 1], [8, 2]]}',
        ],
    )
    assert [v for _, v, _ in values(path)] == [50.0, 0.5, 60.0, 0.6]


def test_what_no_gpu_reports_does_not_reach_the_diagnosis(tmp_path: Path) -> None:
    """The writer's own "NaN" and "+Inf" read back as written; the diagnosis leaves them out, and negatives."""
    gpu_log(tmp_path, ['{"t": 1796000005000, "v": [[0, "+Inf"], [1, "NaN"]]}', '{"t": 1796000006000, "v": [[0, -50]]}'])
    samples = job_gpu_samples(tmp_path)
    assert any(math.isinf(s.value) for s in samples) and any(s.value < 0 for s in samples)
    series = series_from_samples(samples)
    for name, array in series.metrics.items():
        known = array[~np.isnan(array)]  # NaN is "unknown", as a missing sample is
        assert known.size and np.isfinite(known).all() and (known >= 0).all(), (name, array)


@pytest.mark.timeout(60)
def test_a_gpu_log_that_is_not_a_regular_file_reads_empty(tmp_path: Path) -> None:
    folder = tmp_path / "gpu"
    (folder / "attempt-1.jsonl").mkdir(parents=True)
    os.mkfifo(folder / "attempt-2.jsonl")  # nobody writes: opening it to read would block forever
    assert job_gpu_samples(tmp_path) == []


def test_diagnose_a_job_with_a_hostile_gpu_log(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    job = make_job(home, [], ranks=1)
    gpu_log(home / "jobs" / str(job), ['{"t": 1796000002000, "v": [[0, 1e400], [1, NaN]]}', "[" * 50_000])
    code, out, err = run_cli(
        capsys, monkeypatch, "diagnose", str(job), "--window", "1", "--min-duration", "1", "--json"
    )
    assert code == 0 and "Traceback" not in err, err
    strict_json(out)


# ---- 2. non-finite numbers in events ------------------------------------------------------------

NON_FINITE_LINES = [
    '{"kind": "checkpoint", "ts": 1796000010.5, "attempt": 1, "step": 5, "seconds": 1e400}',
    '{"kind": "restore", "ts": 1796000003, "attempt": 2, "step": 5, "seconds": -Infinity}',
    '{"kind": "step", "ts": 1796000010, "attempt": 1, "step": 1e400, "loss": 1e400}',
    '{"kind": "rollback", "ts": 1796000010, "attempt": 1, "from_step": 3, "to_step": NaN, "redone_seconds": 1}',
    '{"kind": "step", "ts": 1796000010, "attempt": 1, "step": 4, "loss": 0.5, "rank_wait_s": [1e400, 0.1]}',
    '{"kind": "step", "ts": 1796000010, "attempt": 1, "step": ' + str(10**30) + ', "loss": 1.0}',
]
NAN_LOSS = '{"kind": "unhealthy", "ts": 1796000010.7, "attempt": 1, "step": 9, "loss": NaN, "reason": "nan"}'


def test_non_finite_times_durations_and_steps_are_quarantined_at_ingestion(home: Path) -> None:
    job = make_job(home, [*NON_FINITE_LINES, NAN_LOSS])
    store = Store(home / "state.db")
    rejected = store.last_event(job, "events_rejected")
    assert rejected is not None and rejected.data["lines"] == len(NON_FINITE_LINES), rejected
    assert rejected.data["reason"] == "'seconds' is not a finite number"
    (kept,) = [e for e in store.events(job, ("unhealthy",))]
    assert math.isnan(kept.data["loss"])  # a NaN loss is a measurement: kept
    assert all(math.isfinite(e.data.get("seconds", 0)) for e in store.events(job))
    _, reasons, _ = read_events_checked(home / "jobs" / str(job) / "events.jsonl")
    assert [r.reason for r in reasons] == [
        "'seconds' is not a finite number",
        "'seconds' is not a finite number",
        "'step' is not a finite number",
        "'to_step' is not a finite number",
        "'rank_wait_s' is not a finite number",
        "'step' is an integer beyond 64 bits",
    ]


def test_readers_survive_non_finite_values_stored_before_ingestion_checked_them(home: Path) -> None:
    """An older gpufleet stored such lines: the cost and the trace are still finite, never an OverflowError."""
    job = make_job(home, [])
    store = Store(home / "state.db")
    store.add_runtime_events(job, [json.loads(line) for line in [*NON_FINITE_LINES, NAN_LOSS]], offset=0)
    usages = job_usages(store, store.job(job))
    cost = build_ledger(usages, load_rates()).jobs[job]
    assert all(math.isfinite(v) for v in cost.gpu_hours.values()), cost
    strict_json(json.dumps(cost.to_dict(), allow_nan=False))
    spans = job_spans(store.job(job), store.attempts(job), store.events(job))
    assert all(math.isfinite(s.start) and math.isfinite(s.end) for s in spans)


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "1"],
        ["show", "1", "--json"],
        ["cost", "--json"],
        ["cost"],
        ["trace", "1"],
        ["trace", "1", "--json"],
        ["diagnose", "1", "--json"],
        ["debug", "spikes", "1", "--json"],
        ["debug", "spikes", "1"],
        ["observe", "report", "--json"],
        ["jobs"],
    ],
)
def test_commands_on_a_job_with_hostile_events(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, argv: list[str]
) -> None:
    hostile = [*NON_FINITE_LINES, NAN_LOSS, *SURROGATE_LINES, *RANK_LINES]
    make_job(home, hostile)
    for line in hostile:  # and stored as an older gpufleet would have, where a row can hold them
        event = json.loads(line)
        if "\ud800" not in event["kind"]:
            store = Store(home / "state.db")
            store.add_runtime_events(1, [event], offset=0)
            store.close()
    code, out, err = run_cli(capsys, monkeypatch, *argv)
    assert code == 0 and "Traceback" not in err, (code, err)
    if "--json" in argv:
        strict_json(out)


def test_debug_spikes_keeps_a_nan_loss_and_skips_an_infinite_step(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [json.dumps(e) for e in good_events()] + [NAN_LOSS, NON_FINITE_LINES[2]]
    path.write_text("\n".join(lines) + "\n")
    points = read_losses(path)
    assert [p.step for p in points if p.loss is not None and math.isnan(p.loss)] == [9]
    assert all(p.step < 100 for p in points)


# ---- 3. lone surrogates -------------------------------------------------------------------------

SURROGATE_LINES = [
    '{"kind": "\\ud800", "ts": 1796000100, "attempt": 1, "\\ud800": "\\udcff"}',
    '{"kind": "session_end", "ts": 1796000100, "attempt": 1, "status": "failed", "error": "\\ud800\\n[bold]"}',
    '{"kind": "metrics", "ts": 1796000100, "attempt": 1, "nested": [{"\\udcff": 1}]}',
]


def test_a_lone_surrogate_is_quarantined_not_fatal(home: Path) -> None:
    job = make_job(home, [*SURROGATE_LINES, '{"kind": "fine", "ts": 1796000101, "attempt": 1}'])
    store = Store(home / "state.db")
    kinds = [e.kind for e in store.events(job)]
    assert "fine" in kinds and "metrics" not in kinds
    rejected = store.last_event(job, "events_rejected")
    assert rejected is not None and rejected.data["lines"] == 3
    assert "not valid Unicode" in rejected.data["reason"]
    assert store.job(job).events_offset == (home / "jobs" / str(job) / "events.jsonl").stat().st_size


# ---- 4. per-rank events of the wrong shape ------------------------------------------------------

RANK_LINES = [
    '{"kind": "rank_stalled", "ts": 1796000012, "attempt": 1, "rank": "x", "ranks": "all", "waiting": 5}',
    '{"kind": "rank_stalled", "ts": 1796000012, "attempt": 1, "rank": [1], "ranks": [1], "seconds": {}}',
    '{"kind": "rank_stall_cleared", "ts": 1796000013, "attempt": 1}',
    '{"kind": "rank_stalled", "ts": 1796000040, "attempt": 2, "ranks": [[1], "x"], "seconds": "long", "step": 3}',
    '{"kind": "rank_stall_cleared", "ts": 1796000041, "attempt": 2}',
    '{"kind": "group", "ts": 1796000003, "attempt": 1, "ranks": [{"rank": 1e400}, {"rank": "x", "host": 5}]}',
    '{"kind": "step", "ts": 1796000010, "attempt": 1, "step": 4, "rank_step_s": {"0": "x"}, "rank_wait_s": [-1]}',
    '{"kind": "rank_stalled", "ts": 1796000050, "attempt": 2, "ranks": [1], "seconds": 30, "timeout_s": "x"}',
]


def test_rank_events_of_the_wrong_shape_are_skipped() -> None:
    events: list[dict[str, Any]] = [*good_events(), *(json.loads(line) for line in RANK_LINES)]
    events.append({"kind": "rank_stalled", "ts": 1796000045, "attempt": "x", "ranks": [1], "seconds": 1e400})
    assert rank_findings(events) == []
    sound = {"kind": "rank_stalled", "ts": 1796000045, "attempt": 2, "ranks": [1], "seconds": 40.0, "step": 3}
    (hung,) = rank_findings([*events, {**sound, "timeout_s": 120}])
    assert hung.rule_id == "hung_rank" and hung.gpus == ("rank1@node-1",) and hung.threshold == 30.0


def test_diagnose_a_distributed_job_with_hostile_rank_events(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    job = make_job(home, RANK_LINES)
    code, out, err = run_cli(capsys, monkeypatch, "diagnose", str(job), "--json")
    assert code == 0 and "Traceback" not in err, err
    strict_json(out)


# ---- 5. a damaged state database ----------------------------------------------------------------


def clobber_table(db_path: Path, table: str) -> None:
    """Overwrite the root page of ``table`` with garbage: the file still opens, its first page is sound."""
    with sqlite3.connect(db_path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name=?", (table,)).fetchone()[0]
    db.close()
    with db_path.open("r+b") as fh:
        fh.seek((root - 1) * page_size)
        fh.write(bytes(range(256)) * (page_size // 256))


@pytest.mark.parametrize(
    "damage",
    ["jobs pages", "random bytes", "not a database", "bare header", "truncated", "a folder"],
)
def test_a_damaged_state_database_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, damage: str
) -> None:
    make_job(home, [])
    db_path = home / "state.db"
    if damage == "jobs pages":
        clobber_table(db_path, "jobs")
    else:
        good = db_path.read_bytes()
        for path in home.glob("state.db*"):
            path.unlink()
        if damage == "a folder":
            db_path.mkdir()
        else:
            db_path.write_bytes(
                {
                    "random bytes": bytes(range(256)) * 32,
                    "not a database": b"not a database",
                    "bare header": b"SQLite format 3\x00" + b"\x00" * 100,
                    "truncated": good[:1024],
                }[damage]
            )
    for argv in (["jobs"], ["show", "1"], ["cost", "--json"], ["trace", "1"], ["observe", "report"]):
        code, _, err = run_cli(capsys, monkeypatch, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1, (argv, code, err)
        assert str(db_path) in err and "GPUFLEET_HOME" in err and "Traceback" not in err, err


def test_a_damaged_events_table_is_reported_when_a_query_reaches_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    """Only the small tables are checked on open: damage in ``events`` shows as the query steps onto it."""
    job = make_job(home, [])
    clobber_table(home / "state.db", "events")
    store = Store(home / "state.db")  # opens: jobs, attempts and requests are sound
    assert store.job(job).name == "lm"
    with pytest.raises(StoreError, match="is damaged or not a database"):
        store.events(job)
    store.close()
    code, _, err = run_cli(capsys, monkeypatch, "show", str(job))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_rows_of_the_wrong_type_read_as_harmless_values(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    """A hand edit left text where a time, a state or an outcome belongs: the job reads as broken, never a crash."""
    first = make_job(home, [])
    second = make_job(home, [])
    third = make_job(home, [])
    with sqlite3.connect(home / "state.db") as db:
        db.execute("UPDATE jobs SET state='bogus', submitted_at='abc', priority='high' WHERE id=?", (first,))
        db.execute("UPDATE jobs SET spec=?, state='running' WHERE id=?", ("[" * 100_000, second))
        db.execute("UPDATE jobs SET submitted_at=1e308, env='[1]', events_offset=-1 WHERE id=?", (third,))
        db.execute("UPDATE attempts SET outcome='[bold]', started_at='abc', exit_code='x' WHERE n=1")
        db.execute("UPDATE attempts SET ended_at='yesterday', sigterm_at=-1e308 WHERE n=2")
        db.execute(
            "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, 1, 'soon', 'step', 'x', '{}')",
            (first,),
        )
        db.execute(
            "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, 'one', 1, 'step', 'x', '{}')",
            (first,),
        )
        db.execute(
            "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, 1, 1, 'step', 'x', '[1, 2]')",
            (first,),
        )
        db.execute(
            "INSERT INTO events (job_id, attempt, ts, kind, source, data) VALUES (?, 1, 1, 'step', 'x', '{')", (first,)
        )
    db.close()
    store = Store(home / "state.db")
    jobs = {j.id: j for j in store.jobs()}
    assert jobs[first].state == "failed" and "is not a job state" in (jobs[first].reason or "")
    assert jobs[second].state == "failed" and "spec does not validate" in (jobs[second].reason or "")
    assert jobs[first].priority == 0 and jobs[first].submitted_at == jobs[first].updated_at
    assert jobs[third].env == {} and jobs[third].events_offset == 0 and jobs[third].submitted_at < 1e11
    attempts = store.attempts(first)
    assert attempts[0].outcome == Outcome.LOST and attempts[0].started_at == attempts[0].ended_at
    assert attempts[0].exit_code is None and attempts[1].ended_at == attempts[1].started_at
    assert attempts[1].sigterm_at is None
    assert all(isinstance(e.ts, float) and isinstance(e.data, dict) for e in store.events(first))
    store.close()
    for argv in (["jobs"], ["show", "1"], ["show", "2", "--json"], ["cost", "--json"], ["trace", "3"]):
        code, out, err = run_cli(capsys, monkeypatch, *argv)
        assert code == 0 and "Traceback" not in err, (argv, err)
        if "--json" in argv:
            strict_json(out)
