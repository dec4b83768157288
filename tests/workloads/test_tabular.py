"""The tabular workload as a fleet job: bit-exact resume after preemption, its output folder, its input errors."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import assert_bitwise_equal

from gpufleet.errors import UsageError
from gpufleet.jobs.events import read_events
from gpufleet.runtime import CheckpointDir, Preempted, TrainSession
from gpufleet.workloads.tabular import MODEL_FORMAT, auc, file_sha256, load_model, make_dataset, train

ROWS = 1200
HOLDOUT_ROWS = 240  # round(ROWS * 0.2), the default holdout share
RUN: dict[str, Any] = {"steps": 40, "batch_size": 128, "lr": 0.02, "hidden": 16, "seed": 7}
FEATURES = ["x0", "x1", "x2", "x3", "segment"]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # A net this small trains fastest on one thread; more only spin against other processes on a 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def dataset() -> pd.DataFrame:
    return make_dataset(ROWS, seed=11)


@pytest.fixture(scope="module")
def data_csv(dataset: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tabular-data") / "train.csv"
    dataset.to_csv(path, index=False)
    return path


def use_job_dir(job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the job's checkpoints, events and output folder at ``job_dir``, as a backend would."""
    monkeypatch.setenv("GPUFLEET_JOB_DIR", str(job_dir))
    monkeypatch.setenv("GPUFLEET_CKPT_DIR", str(job_dir / "ckpt"))
    monkeypatch.setenv("GPUFLEET_EVENTS", str(job_dir / "events.jsonl"))


@pytest.fixture
def job_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Environment as a backend would export it, with a spec that checkpoints every 10 steps."""
    spec = {
        "name": "tabular",
        "entrypoint": "gpufleet.workloads.tabular:train",
        "checkpoint": {"every_steps": 10, "keep": 2},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    monkeypatch.setenv("GPUFLEET_SPEC", str(tmp_path / "spec.json"))
    monkeypatch.setenv("GPUFLEET_ATTEMPT", "1")
    monkeypatch.delenv("GPUFLEET_FAULT", raising=False)
    monkeypatch.delenv("GPUFLEET_GPU_SOURCE", raising=False)
    use_job_dir(tmp_path / "job", monkeypatch)
    return tmp_path / "job"


def stop_before_closing(monkeypatch: pytest.MonkeyPatch, stops: dict[int, str]) -> dict[int, str]:
    """Make the session stop when it closes step ``k`` (1-based) for each ``k`` in ``stops``, once each.

    ``"sigterm"`` sends the process a real SIGTERM (the session's handler sets the flag), ``"request"``
    calls ``request_preemption``; either way ``report`` then saves at that step boundary and raises
    ``Preempted``. ``tabular.train`` has no per-step hook, so ``report`` is wrapped for the test.
    Returns the stops still pending.
    """
    original = TrainSession.report
    pending = dict(stops)

    def report(self: TrainSession, loss: float | torch.Tensor, **kwargs: Any) -> None:
        how = pending.pop(self.step + 1, None)
        if how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        elif how == "request":
            self.request_preemption()
        original(self, loss, **kwargs)

    monkeypatch.setattr(TrainSession, "report", report)
    return pending


def model_tensors(output: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(output / "model" / "model.pt", weights_only=True)
    return state


def final_checkpoint(job_dir: Path) -> dict[str, Any]:
    info, _ = CheckpointDir(job_dir / "ckpt").latest()
    assert info is not None and info.step == RUN["steps"]
    _, state = CheckpointDir(job_dir / "ckpt").load(info.path)
    return state


# ---- (1) preempted and resumed == uninterrupted ------------------------------------------------


def test_preempted_twice_and_resumed_is_bit_exact(
    job_env: Path, data_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = train(str(data_csv), **RUN)
    ref_output = job_env / "output"
    ref_events, _ = read_events(job_env / "events.jsonl")
    assert sum(e["kind"] == "preempt_signal" for e in ref_events) == 0

    resumed_dir = tmp_path / "resumed"
    use_job_dir(resumed_dir, monkeypatch)
    output = resumed_dir / "output"
    # A SIGTERM mid-way between periodic checkpoints, then an in-process request; then the run finishes.
    pending = stop_before_closing(monkeypatch, {13: "sigterm", 27: "request"})
    before = signal.getsignal(signal.SIGTERM)
    for attempt, stop_step in ((1, 13), (2, 27)):
        monkeypatch.setenv("GPUFLEET_ATTEMPT", str(attempt))
        with pytest.raises(Preempted) as stop:
            train(str(data_csv), **RUN)
        assert stop.value.step == stop_step and stop.value.code == 75
        info, _ = CheckpointDir(resumed_dir / "ckpt").latest()
        assert info is not None and info.step == stop_step
        assert info.manifest is not None and info.manifest.reason == "preempt"
        # A preempted attempt writes no model and no metrics: the registry never sees half a job.
        assert not output.exists()
        assert signal.getsignal(signal.SIGTERM) is before  # the session put the handler back
    assert not pending
    monkeypatch.setenv("GPUFLEET_ATTEMPT", "3")
    resumed = train(str(data_csv), **RUN)

    # Each later attempt restored from the previous attempt's preemption checkpoint.
    events, _ = read_events(resumed_dir / "events.jsonl")
    restores = [(e["attempt"], e["step"]) for e in events if e["kind"] == "restore"]
    assert restores == [(1, None), (2, 13), (3, 27)]
    assert [e["signal"] for e in events if e["kind"] == "preempt_signal"] == ["SIGTERM", "SIGTERM"]

    # Every tensor of the final model, and the optimizer's state, are bitwise those of the uninterrupted run.
    ref_tensors, tensors = model_tensors(ref_output), model_tensors(output)
    assert ref_tensors.keys() == tensors.keys() and len(tensors) == 4
    for name, tensor in ref_tensors.items():
        assert torch.equal(tensor, tensors[name]), name
    ref_state, state = final_checkpoint(job_env), final_checkpoint(resumed_dir)
    assert_bitwise_equal(ref_state["model"], state["model"], "model")
    assert_bitwise_equal(ref_state["optimizer"], state["optimizer"], "optimizer")
    assert state["trainer"]["data_position"] == ref_state["trainer"]["data_position"] == RUN["steps"]

    # Same holdout metrics, same final loss, same model.json.
    assert resumed["metrics"] == reference["metrics"]
    assert resumed["final_loss"] == reference["final_loss"]
    assert resumed["steps"] == reference["steps"] == RUN["steps"]
    saved = json.loads((output / "metrics.json").read_text())
    assert saved["metrics"] == json.loads((ref_output / "metrics.json").read_text())["metrics"]
    assert json.loads((output / "model" / "model.json").read_text()) == json.loads(
        (ref_output / "model" / "model.json").read_text()
    )


def test_other_seed_gives_another_model(job_env: Path, data_csv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The equality above is not vacuous: the seed does reach the weights and the holdout split."""
    a = train(str(data_csv), **{**RUN, "steps": 5})
    a_tensors = model_tensors(job_env / "output")
    use_job_dir(job_env.parent / "other-seed", monkeypatch)
    b = train(str(data_csv), **{**RUN, "steps": 5, "seed": RUN["seed"] + 1})
    b_tensors = model_tensors(job_env.parent / "other-seed" / "output")
    assert not torch.equal(a_tensors["body.0.weight"], b_tensors["body.0.weight"])
    assert a["metrics"] != b["metrics"]


# ---- (2) the output folder -------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_output_folder_holds_model_and_sane_metrics(
    job_env: Path, dataset: pd.DataFrame, tmp_path: Path, suffix: str
) -> None:
    data = tmp_path / f"train{suffix}"
    if suffix == ".csv":
        dataset.to_csv(data, index=False)
    else:
        dataset.to_parquet(data, index=False)
    result = train(str(data), **RUN)

    output = job_env / "output"  # $GPUFLEET_JOB_DIR/output when no `out` is given
    files = sorted(str(p.relative_to(output)) for p in output.rglob("*") if p.is_file())
    assert files == ["metrics.json", "model/model.json", "model/model.pt"]

    saved = json.loads((output / "metrics.json").read_text())
    metrics = saved["metrics"]
    assert saved["metrics"] == result["metrics"]
    assert set(metrics) == {"auc", "accuracy", "log_loss", "brier", "positive_rate", "rows"}
    assert metrics["auc"] > 0.85  # the generated labels are learnable: far above chance (0.5)
    assert metrics["accuracy"] > 0.75
    assert metrics["log_loss"] < 0.5 < np.log(2)  # better than predicting 0.5 everywhere
    assert metrics["brier"] < 0.15 < 0.25
    assert 0.2 < metrics["positive_rate"] < 0.8
    assert metrics["rows"] == HOLDOUT_ROWS
    assert saved["steps"] == RUN["steps"] and np.isfinite(saved["final_loss"])
    assert saved["params"] == {**RUN, "target": "label", "holdout": 0.2, "flip_negatives": 0.0}
    assert saved["features"] == FEATURES
    assert saved["lineage"] == {
        "data": str(data.resolve()),
        "data_sha256": file_sha256(data),
        "rows": ROWS,
        "train_rows": ROWS - HOLDOUT_ROWS,
        "holdout_rows": HOLDOUT_ROWS,
    }

    meta = json.loads((output / "model" / "model.json").read_text())
    assert meta["format"] == MODEL_FORMAT
    assert meta["metrics"] == metrics and meta["hidden"] == RUN["hidden"] and meta["threshold"] == 0.5
    assert meta["encoder"]["numeric"] == FEATURES[:4]
    assert meta["encoder"]["categorical"] == {"segment": ["east", "north", "south"]}
    assert meta["data_sha256"] == file_sha256(data)

    # model.pt is a plain state_dict; the folder loads back into a model that ranks the rows well.
    tensors = model_tensors(output)
    assert {name: tuple(t.shape) for name, t in tensors.items()} == {
        "body.0.weight": (RUN["hidden"], 7),  # 4 standardised numbers + 3 one-hot segments
        "body.0.bias": (RUN["hidden"],),
        "body.2.weight": (1, RUN["hidden"]),
        "body.2.bias": (1,),
    }
    probs = load_model(output / "model").predict(dataset.drop(columns=["label"]))
    assert probs.shape == (ROWS,) and ((probs > 0) & (probs < 1)).all()
    assert auc(dataset["label"].to_numpy(), probs) > 0.85


# ---- (3) bad input ---------------------------------------------------------------------------


def test_missing_data_file_is_a_usage_error(job_env: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "train.csv"
    with pytest.raises(UsageError, match=r"nowhere/train\.csv: no such file; check the path"):
        train(str(missing), **RUN)
    assert not (job_env / "ckpt").exists() and not (job_env / "output").exists()


def test_unknown_target_column_is_a_usage_error_naming_the_columns(job_env: Path, data_csv: Path) -> None:
    with pytest.raises(UsageError, match="no target column 'churned'; columns are x0, x1, x2, x3, segment, label"):
        train(str(data_csv), **{**RUN, "target": "churned"})
    assert not (job_env / "ckpt").exists() and not (job_env / "output").exists()


def _write(frame: pd.DataFrame, name: str) -> Callable[[Path], Path]:
    def write(folder: Path) -> Path:
        path = folder / name
        frame.to_csv(path, index=False)
        return path

    return write


def _write_text(text: str, name: str) -> Callable[[Path], Path]:
    def write(folder: Path) -> Path:
        path = folder / name
        path.write_text(text)
        return path

    return write


_SMALL = make_dataset(200, seed=1)


def test_training_data_is_read_within_the_table_reader_bounds(
    job_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workload reads through :mod:`gpufleet.tables`: a file over its size limit is refused before pandas."""
    import gpufleet.tables

    path = _write(_SMALL, "train.csv")(tmp_path)
    monkeypatch.setattr(gpufleet.tables, "MAX_TABLE_BYTES", path.stat().st_size - 1)
    with pytest.raises(UsageError, match=r"train\.csv.*larger than"):
        train(str(path), **RUN)
    assert not (job_env / "output").exists()


@pytest.mark.parametrize(("name", "sep"), [("train.csv.gz", ","), ("train.tsv", "\t")])
def test_training_data_may_be_gzipped_or_tab_separated(job_env: Path, tmp_path: Path, name: str, sep: str) -> None:
    """The shapes the drift report reads, the workload reads too: ``.csv.gz`` and ``.tsv``."""
    _SMALL.to_csv(tmp_path / name, index=False, sep=sep)
    assert train(str(tmp_path / name), **{**RUN, "steps": 2})["lineage"]["rows"] == len(_SMALL)


@pytest.mark.parametrize(
    ("make", "kwargs", "match"),
    [
        (_write(_SMALL, "train.json"), {}, r"unknown table format; give a \.csv, \.tsv or \.parquet file"),
        (_write(_SMALL.head(9), "tiny.csv"), {}, "9 rows are too few"),
        (_write(_SMALL[["label"]], "labels.csv"), {}, "no feature column besides the target 'label'"),
        (_write(_SMALL, "train.csv"), {"holdout": 1.0}, "0 < holdout < 1"),
        (_write(_SMALL, "train.csv"), {"steps": 0}, "steps >= 1"),
        (_write(_SMALL, "train.csv"), {"flip_negatives": 1.0}, "flip_negatives < 1"),
    ],
    ids=["suffix", "too-few-rows", "no-features", "holdout", "steps", "flip-negatives"],
)
def test_other_bad_input_is_a_usage_error(
    job_env: Path, tmp_path: Path, make: Callable[[Path], Path], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(UsageError, match=match):
        train(str(make(tmp_path)), **{**RUN, **kwargs})
    assert not (job_env / "output").exists()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        pytest.param(
            _write(_SMALL.assign(label=_SMALL["label"].map({0: "no", 1: "yes"})), "yes-no.csv"),
            "must hold 0/1 labels",
            id="string-labels",
        ),
        pytest.param(_write_text("", "empty.csv"), "cannot read it as csv", id="empty-file"),
        pytest.param(
            _write(_SMALL.assign(label=_SMALL["label"].where(_SMALL.index % 5 != 0)), "nan-labels.csv"),
            "none missing; row 0 has nan",
            id="missing-labels",
        ),
    ],
)
def test_unusable_table_is_a_usage_error(
    job_env: Path, tmp_path: Path, make: Callable[[Path], Path], match: str
) -> None:
    with pytest.raises(UsageError, match=match):
        train(str(make(tmp_path)), **RUN)
    assert not (job_env / "output").exists()
