"""The standing monitor: new windows only, the policy's state carried over, one retraining job per key.

Real tables on disk, the real drift report and policy; the local backend only queues the retraining
job (its scheduler is not started), which is all a submission is.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import assert_refused, run_cli
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.jobs.store import Store
from gpufleet.paths import state_db
from gpufleet.quality.standing import (
    MonitorConfig,
    StandingMonitor,
    load_monitor_config,
    model_dir,
    read_history,
    retrain_once,
)

SPEC = "name: retrain\nentrypoint: gpufleet.workloads.toy:train\nargs: {steps: 3}\nresources: {gpus: 0}\n"


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """A submission queues the job in the store; no scheduler process is started to run it."""
    monkeypatch.setattr("gpufleet.backends.local.process.ensure_scheduler", lambda home: None)


def table(path: Path, *, shift: float, rows: int = 800, seed: int = 0) -> Path:
    """Two numeric columns and a category; ``shift`` moves f0's mean, f1's spread and the category mix."""
    rng = np.random.default_rng(seed)
    mix = [0.5, 0.5] if shift == 0 else [0.2, 0.8]
    frame = pd.DataFrame(
        {
            "f0": rng.normal(shift, 1.0, rows),
            "f1": rng.normal(0.0, 1.0 + shift, rows),
            "c": rng.choice(["a", "b"], rows, p=mix),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


def write_config(folder: Path, models: list[dict[str, Any]], every: str = "10m") -> Path:
    path = folder / "monitor.yaml"
    path.write_text(json.dumps({"every": every, "models": models}))  # JSON is YAML
    return path


@pytest.fixture
def watched(tmp_path: Path) -> Path:
    """A reference, an empty window folder, a retraining spec and a monitor file over them (persistence 2)."""
    table(tmp_path / "data" / "reference.csv", shift=0.0, rows=1500, seed=1)
    (tmp_path / "data" / "windows").mkdir()
    (tmp_path / "retrain.yaml").write_text(SPEC)
    model = {
        "name": "churn",
        "reference": "data/reference.csv",
        "current": "data/windows/",
        "policy": {"persistence": 2, "alert_share": 0.2, "cooldown_s": 86400},
        "retrain": "retrain.yaml",
    }
    return write_config(tmp_path, [model])


def jobs(home: Path) -> list[int]:
    if not state_db(home).exists():
        return []
    store = Store(state_db(home))
    try:
        return [j.id for j in store.jobs()]
    finally:
        store.close()


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_growing_folder_is_checked_window_by_window_and_retrains_once(watched: Path, home: Path) -> None:
    windows = watched.parent / "data" / "windows"
    monitor = StandingMonitor(load_monitor_config(watched), home)
    assert monitor.run_round(now=1000.0) == []  # nothing has arrived yet

    table(windows / "w1.csv", shift=0.0, seed=2)
    [first] = monitor.run_round(now=1000.0)
    assert (first["window"], first["action"], first["dataset_drift"], first["error"]) == ("w1.csv", "pass", False, None)

    table(windows / "w2.csv", shift=1.0, seed=3)
    [second] = monitor.run_round(now=2000.0)
    assert (second["action"], second["dataset_drift"], second["retrain_job"]) == ("alert", True, None)

    table(windows / "w3.csv", shift=1.0, seed=4)
    # A monitor started afresh (another process, a restart) reads the policy's state from the log.
    [third] = StandingMonitor(load_monitor_config(watched), home).run_round(now=3000.0)
    assert third["action"] == "retrain" and "2 consecutive windows" in third["reasons"][0]
    assert third["retrain_submitted"] is True and jobs(home) == [third["retrain_job"]]

    assert monitor.run_round(now=4000.0) == []  # nothing new: nothing checked, nothing submitted
    assert jobs(home) == [third["retrain_job"]]

    folder = model_dir(home, "churn")
    drift = lines(folder / "drift.jsonl")
    assert [d["window"] for d in drift] == ["w1.csv", "w2.csv", "w3.csv"]
    assert [d["dataset_drift"] for d in drift] == [False, True, True]
    assert {c["column"] for c in drift[1]["columns"]} == {"f0", "f1", "c"}
    assert set(drift[1]["columns"][0]) == {"column", "method", "statistic", "threshold", "drifted"}
    assert drift[1]["share"] == 1.0 and drift[1]["at"] == 2000.0
    [retrain] = lines(folder / "retrains.jsonl")
    assert retrain["key"] == "churn:w3.csv" and retrain["job_id"] == third["retrain_job"]

    history = read_history(home)
    assert list(history) == ["churn"]
    assert [d["action"] for d in history["churn"]["decisions"]] == ["pass", "alert", "retrain"]
    assert history["churn"]["decisions"][2]["evidence"]["drift_streak"] == 2
    assert history["churn"]["drift"] == drift and history["churn"]["retrains"] == [retrain]


def test_a_window_that_cannot_be_read_is_recorded_once_and_other_models_go_on(tmp_path: Path, home: Path) -> None:
    table(tmp_path / "ref.csv", shift=0.0, seed=1)
    table(tmp_path / "good" / "w1.csv", shift=0.0, seed=2)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "w1.csv").write_bytes(b'f0,f1\n1,2\n\x00\xff\xfe,\n"unclosed')
    (bad / "w2.parquet").write_bytes(b"PAR1 but not really")
    (bad / ".w3.csv").write_text("f0\n1\n")  # hidden: still being written, not a window yet
    refs = {"reference": "ref.csv"}
    config = write_config(
        tmp_path, [{"name": "bad", **refs, "current": "bad"}, {"name": "good", **refs, "current": "good"}]
    )
    monitor = StandingMonitor(load_monitor_config(config), home)
    checks = monitor.run_round()
    assert [(c["model"], c["window"], c["action"]) for c in checks] == [
        ("bad", "w1.csv", "error"),
        ("bad", "w2.parquet", "error"),
        ("good", "w1.csv", "pass"),
    ]
    assert all(checks[i]["error"] and "\n" not in checks[i]["error"] for i in (0, 1))
    errors = lines(model_dir(home, "bad") / "drift.jsonl")
    assert [e["window"] for e in errors] == ["w1.csv", "w2.parquet"] and all(e["error"] for e in errors)
    assert not (model_dir(home, "bad") / "decisions.jsonl").exists()  # no evidence, no decision
    assert monitor.run_round() == []  # a bad window is not checked again

    (tmp_path / "ref.csv").unlink()  # the reference goes: one error for the model, its new window waits
    table(tmp_path / "good" / "w2.csv", shift=0.0, seed=3)
    [failed] = monitor.run_round()
    assert (failed["model"], failed["window"], failed["action"]) == ("good", None, "error")
    assert "ref.csv" in failed["error"]
    table(tmp_path / "ref.csv", shift=0.0, seed=1)
    assert [c["window"] for c in monitor.run_round()] == ["w2.csv"]


def test_a_single_file_is_a_window_per_version(tmp_path: Path, home: Path) -> None:
    table(tmp_path / "ref.csv", shift=0.0, seed=1)
    current = table(tmp_path / "today.csv", shift=0.0, seed=2)
    config = write_config(tmp_path, [{"name": "m", "reference": "ref.csv", "current": "today.csv"}])
    monitor = StandingMonitor(load_monitor_config(config), home)
    [first] = monitor.run_round()
    assert first["window"].startswith("today.csv@")
    assert monitor.run_round() == []
    table(current, shift=1.0, seed=3)
    os.utime(current, ns=(2_000_000_000 * 10**9, 2_000_000_000 * 10**9))
    [second] = monitor.run_round()
    assert second["window"] == "today.csv@2033-05-18T03:33:20Z" and second["dataset_drift"] is True


def test_the_metric_comes_from_the_windows_labels_and_scores(tmp_path: Path, home: Path) -> None:
    rng = np.random.default_rng(5)
    table(tmp_path / "ref.csv", shift=0.0, seed=1)
    labelled = pd.read_csv(table(tmp_path / "w" / "w2.csv", shift=0.0, seed=2))
    labelled["label"] = rng.integers(0, 2, len(labelled))
    labelled["score"] = rng.uniform(size=len(labelled))  # a champion no better than chance
    labelled.to_csv(tmp_path / "w" / "w2.csv", index=False)
    table(tmp_path / "w" / "w1.csv", shift=0.0, seed=3)  # no labels yet: no performance evidence
    model = {
        "name": "m",
        "reference": "ref.csv",
        "current": "w",
        "columns": ["f0", "f1", "c"],
        "metric": {"name": "auc", "baseline": 0.9},
    }
    checks = StandingMonitor(load_monitor_config(write_config(tmp_path, [model])), home).run_round()
    assert [c["action"] for c in checks] == ["pass", "retrain"]
    assert "auc" in checks[1]["reasons"][0]
    decisions = read_history(home)["m"]["decisions"]
    assert decisions[0]["evidence"]["metric"] is None
    assert 0.4 < decisions[1]["evidence"]["metric"] < 0.6 and decisions[1]["triggers"] == ["performance"]


def test_two_rounds_at_once_check_each_window_once(watched: Path, home: Path) -> None:
    for i in range(4):
        table(watched.parent / "data" / "windows" / f"w{i}.csv", shift=0.0, seed=10 + i)
    config = load_monitor_config(watched)
    start = threading.Barrier(2)
    results: list[list[dict[str, Any]]] = []

    def round_() -> None:
        start.wait()
        results.append(StandingMonitor(config, home).run_round())

    threads = [threading.Thread(target=round_) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    checked = sorted(c["window"] for r in results for c in r)
    assert checked == ["w0.csv", "w1.csv", "w2.csv", "w3.csv"]
    assert sorted(len(r) for r in results) == [0, 4]
    assert len(lines(model_dir(home, "churn") / "drift.jsonl")) == 4
    assert len(read_history(home)["churn"]["decisions"]) == 4


def test_retrain_once_from_20_threads_submits_one_job(tmp_path: Path, home: Path) -> None:
    spec = tmp_path / "retrain.yaml"
    spec.write_text(SPEC)
    start = threading.Barrier(20)
    got: list[tuple[int, bool]] = []

    def ask() -> None:
        start.wait()
        got.append(retrain_once(home, "churn", "alert-key-1", spec))

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(got) == 20 and len({job for job, _ in got}) == 1
    assert sum(now for _, now in got) == 1
    assert jobs(home) == [got[0][0]]
    other, submitted = retrain_once(home, "churn", "alert-key-2", spec)
    assert submitted and other != got[0][0] and len(jobs(home)) == 2
    assert [r["key"] for r in read_history(home)["churn"]["retrains"]] == ["alert-key-1", "alert-key-2"]


def test_a_failed_submission_is_journaled_and_the_key_stays_unspent(tmp_path: Path, home: Path) -> None:
    spec = tmp_path / "retrain.yaml"
    spec.write_text("name: retrain\n")  # no entrypoint: the spec does not validate
    with pytest.raises(GpufleetError, match="entrypoint"):
        retrain_once(home, "churn", "k1", spec)
    spec.write_text(SPEC)
    job, submitted = retrain_once(home, "churn", "k1", spec)
    assert submitted and jobs(home) == [job]
    failed, done = read_history(home)["churn"]["retrains"]
    assert failed["job_id"] is None and "entrypoint" in failed["error"] and done["job_id"] == job


@pytest.mark.parametrize("name", ["../evil", "..", "a/b", "/abs", ".hidden", "", "x\x00y", "a" * 200])
def test_a_model_name_that_is_not_one_folder_is_refused(tmp_path: Path, home: Path, name: str) -> None:
    table(tmp_path / "ref.csv", shift=0.0)
    config = write_config(tmp_path, [{"name": name, "reference": "ref.csv", "current": "ref.csv"}])
    with pytest.raises(GpufleetError, match=r"models\.0\.name"):
        load_monitor_config(config)
    (tmp_path / "retrain.yaml").write_text(SPEC)
    with pytest.raises(UsageError, match="model name"):
        retrain_once(home, name, "key", tmp_path / "retrain.yaml")
    assert not home.exists()


def _invoke(*args: str) -> tuple[int, str]:
    """Exit code and output as ``gpufleet.cli.app:main`` gives them: a GpufleetError is one line and its code."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    if isinstance(result.exception, GpufleetError):
        return result.exception.exit_code, str(result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


BAD_CONFIGS: list[tuple[str, str]] = [
    ("every: 10 minutes\nmodels: [{name: m, reference: ref.csv, current: w}]", "every: '10 minutes' is not a duration"),
    ("every: 0s\nmodels: [{name: m, reference: ref.csv, current: w}]", "every: '0s' is out of range"),
    ("models: []", "models: List should have at least 1 item"),
    ("models: [{name: m, reference: nope.csv, current: w}]", "models.0.reference: "),
    ("models: [{name: m, reference: w, current: w}]", "models.0.reference: "),
    ("models: [{name: m, reference: ref.csv, current: no/such}]", "models.0.current: "),
    ("models: [{name: m, reference: ref.csv, current: w, policy: {persistence: 0}}]", "persistence=0"),
    ("models: [{name: m, reference: ref.csv, current: w, policy: {persistance: 2}}]", "unknown field 'persistance'"),
    ("models: [{name: m, reference: ref.csv, current: w, policy: {alert_share: .nan}}]", "models.0.policy.alert_share"),
    ("models: [{name: m, reference: ref.csv, current: w, retrain: ref.csv}]", "models.0.retrain: "),
    ("models: [{name: m, reference: ref.csv, current: w, backend: k8s}]", "unknown backend 'k8s'"),
    ("models: [{name: m, reference: ref.csv, current: w, colums: [f0]}]", "models.0.colums: unknown field"),
    ("models: [{name: m, reference: ref.csv, current: w, metric: {name: auc, baseline: 9}}]", "metric.baseline"),
    ("models: [{name: m, reference: ref.csv, current: w}, {name: m, reference: ref.csv, current: w}]", "twice"),
    ("models: [{name: ../m, reference: ref.csv, current: w}]", "models.0.name"),
    ("- just a list", "must be a YAML mapping"),
    ("models: [{name: m, reference: ref.csv, current: w", "malformed YAML"),
]


@pytest.mark.parametrize(("text", "message"), BAD_CONFIGS)
def test_a_bad_monitor_file_exits_2_with_one_line(tmp_path: Path, home: Path, text: str, message: str) -> None:
    table(tmp_path / "ref.csv", shift=0.0)
    (tmp_path / "w").mkdir()
    config = tmp_path / "monitor.yaml"
    config.write_text(text)
    code, out = _invoke("quality", "monitor", "run", str(config), "--once")
    assert code == 2 and message in out and "\n" not in out.strip(), out
    assert not home.exists()


def test_the_cli_refuses_before_it_writes(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, [{"name": "m", "reference": "missing.csv", "current": "w"}])
    code, _, err = run_cli(capsys, monkeypatch, "quality", "monitor", "run", str(config), "--once")
    assert_refused(code, err, home, "models.0.reference", "missing.csv")


def test_run_once_and_history_on_the_command_line(watched: Path, home: Path) -> None:
    windows = watched.parent / "data" / "windows"
    for i, shift in enumerate((0.0, 1.0, 1.0), start=1):
        table(windows / f"w{i}.csv", shift=shift, seed=20 + i)
    code, out = _invoke("quality", "monitor", "run", str(watched), "--once")
    assert code == 0, out
    assert "w3.csv" in out and "retrain" in out and "#1" in out
    code, out = _invoke("quality", "monitor", "run", str(watched), "--once", "--json")
    assert code == 0 and json.loads(out)["rounds"][0]["checks"] == []
    code, out = _invoke("quality", "monitor", "history", "--json")
    history = json.loads(out)["models"]["churn"]
    assert code == 0 and [d["action"] for d in history["decisions"]] == ["pass", "alert", "retrain"]
    code, out = _invoke("quality", "monitor", "history")
    assert code == 0 and "monitor history of churn" in out and "#1" in out

    (windows / "w4.json").write_text("{}")  # not a table: a failed check exits 1
    code, out = _invoke("quality", "monitor", "run", str(watched), "--once", "--json")
    [check] = json.loads(out)["rounds"][0]["checks"]
    assert code == 1 and check["window"] == "w4.json" and "unknown table format" in check["error"]


def test_run_forever_survives_a_failing_round(watched: Path, home: Path, caplog: pytest.LogCaptureFixture) -> None:
    table(watched.parent / "data" / "windows" / "w1.csv", shift=0.0, seed=2)
    config = load_monitor_config(watched).model_copy(update={"every": 0.01})
    stop = threading.Event()
    rounds: list[list[dict[str, Any]]] = []

    class Flaky(StandingMonitor):
        calls = 0

        def run_round(self, now: float | None = None) -> list[dict[str, Any]]:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise OSError("disk full")
            return super().run_round(now)

    def on_round(checks: list[dict[str, Any]]) -> None:
        rounds.append(checks)
        if len(rounds) == 2:
            stop.set()

    with caplog.at_level(logging.ERROR, logger="gpufleet.quality.standing"):
        Flaky(config, home).run_forever(stop, on_round)
    assert [len(r) for r in rounds] == [1, 0]
    assert [r.getMessage() for r in caplog.records] == ["monitor: the round failed: disk full"]


def test_every_is_a_duration(tmp_path: Path) -> None:
    table(tmp_path / "ref.csv", shift=0.0)
    model = {"name": "m", "reference": "ref.csv", "current": "ref.csv"}
    for text, seconds in (("90", 90.0), ("30s", 30.0), ("10m", 600.0), ("1.5h", 5400.0), ("1d", 86400.0)):
        assert load_monitor_config(write_config(tmp_path, [model], every=text)).every == seconds
    assert MonitorConfig.model_validate({"models": [model]}).every == 600.0
