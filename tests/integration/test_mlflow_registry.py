"""The registry against real MLflow (sqlite file in tmp): versions, aliases, promotion, rollback, history.

Everything gpufleet writes is read back with MLflow's own client, not through gpufleet: the aliases
(``get_model_version_by_alias``), the versions and their history tags (``search_model_versions``),
the runs' datasets (``run.inputs``) and the model itself (``mlflow.pyfunc.load_model``). Fails
under CI, and skips elsewhere, when MLflow is not installed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from conftest import service_missing
from typer.testing import CliRunner

from gpufleet.errors import UsageError
from gpufleet.quality.registry import EVENT_TAG, DatasetRef, Registry, quiet_mlflow

MODEL = "credit-test"


@dataclass
class Built:
    registry: Registry
    uri: str
    data: Path
    outputs: list[Path]
    versions: list[str]
    runs: list[str]


def _train(tmp: Path, data: Path, name: str, seed: int, mp: pytest.MonkeyPatch) -> Path:
    from gpufleet.workloads.tabular import train

    mp.setenv("GPUFLEET_CKPT_DIR", str(tmp / name / "checkpoints"))
    train(str(data), steps=60, seed=seed, out=str(tmp / name))
    return tmp / name


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    try:
        import mlflow  # noqa: F401
    except ImportError:
        service_missing("MLflow is not installed: `pip install 'gpufleet[quality]'`")
    from gpufleet.workloads.tabular import make_dataset

    tmp = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("GPUFLEET_HOME", str(tmp / "home"))
        mp.setenv("GPUFLEET_USER", "alice@example")
        data = tmp / "train.parquet"
        make_dataset(600, seed=3).to_parquet(data, index=False)
        registry = Registry()
        outputs, versions, runs = [], [], []
        for n in (1, 2):
            out = _train(tmp, data, f"out-{n}", seed=n, mp=mp)
            registered = registry.log_training_run(
                MODEL,
                out,
                datasets=[DatasetRef("train", data, "training")],
                params={"job_id": n},
                loss_curve=[(10, 0.6), (20, 0.5)],
                tags={"gpufleet.job": f"job-{n}"},
                why=f"trained by job {n}",
            )
            outputs.append(out)
            versions.append(registered.version)
            runs.append(registered.run_id)
            if n == 1:
                registry.promote(MODEL, registered.version, why="first champion")
        yield Built(registry, registry.uri, data, outputs, versions, runs)


def client(uri: str) -> Any:
    import mlflow

    with quiet_mlflow():
        return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


def test_store_is_the_sqlite_file_under_gpufleet_home(built: Built) -> None:
    assert built.uri.startswith("sqlite:///") and built.uri.endswith("/home/mlflow.db")
    assert Path(built.uri.removeprefix("sqlite:///")).is_file()
    assert built.registry.history_file == Path(built.uri.removeprefix("sqlite:///")).parent / "alias-history.jsonl"


def test_runs_have_params_metrics_and_datasets_with_digests(built: Built) -> None:
    run = client(built.uri).get_run(built.runs[0])
    assert run.data.params["job_id"] == "1" and run.data.params["steps"] == "60"
    metrics = json.loads((built.outputs[0] / "metrics.json").read_text())["metrics"]
    assert run.data.metrics["holdout_auc"] == pytest.approx(metrics["auc"])
    (item,) = run.inputs.dataset_inputs
    sha = hashlib.sha256(built.data.read_bytes()).hexdigest()
    assert item.dataset.name == "train" and item.dataset.digest == sha[:32]
    tags = {t.key: t.value for t in item.tags}
    assert tags["mlflow.data.context"] == "training" and tags["gpufleet.sha256"] == sha
    history = client(built.uri).get_metric_history(built.runs[0], "train_loss")
    assert [(m.step, m.value) for m in history] == [(10, 0.6), (20, 0.5)]


def test_registered_model_loads_back_and_predicts_like_the_job_output(
    built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    import pandas as pd

    from gpufleet.workloads.tabular import load_model

    monkeypatch.setenv("MLFLOW_TRACKING_URI", built.uri)
    frame = pd.read_parquet(built.data).drop(columns=["label"]).head(50)
    with quiet_mlflow():
        served = mlflow.pyfunc.load_model(f"models:/{MODEL}/{built.versions[1]}").predict(frame)
    local = load_model(built.outputs[1] / "model").predict(frame)
    assert np.asarray(served).shape == (50,)
    np.testing.assert_allclose(np.asarray(served), local, rtol=0, atol=1e-12)
    assert ((local > 0) & (local < 1)).all()


def test_aliases_promotion_and_rollback_as_mlflow_sees_them(built: Built) -> None:
    reg, c = built.registry, client(built.uri)
    v1, v2 = built.versions
    assert str(c.get_model_version_by_alias(MODEL, "champion").version) == v1
    assert str(c.get_model_version_by_alias(MODEL, "challenger").version) == v2

    def aliases() -> dict[str, str]:
        return {k: str(v) for k, v in c.get_registered_model(MODEL).aliases.items()}

    reg.promote(MODEL, v2, why="better on the holdout")
    assert aliases() == {"champion": v2, "previous": v1}
    reg.rollback(MODEL, why="guard failed")
    assert aliases() == {"champion": v1}
    assert c.get_model_version(MODEL, v2).tags["gpufleet.rolled_back"] == "guard failed"
    with pytest.raises(UsageError, match="no @previous"):
        reg.rollback(MODEL, why="again")
    with pytest.raises(UsageError, match="already @champion"):
        reg.promote(MODEL, v1, why="noop")


def test_history_file_and_mlflow_tags_tell_the_same_story(built: Built) -> None:
    reg = built.registry
    events, source = reg.history(MODEL)
    assert source.endswith("alias-history.jsonl")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [(e.action, e.alias, e.from_version, e.to_version) for e in events[:3]] == [
        ("register", "challenger", None, "1"),
        ("promote", "champion", None, "1"),
        ("promote", "challenger", "1", None),
    ]
    assert all(e.who == "alice@example" for e in events)
    # MLflow's own client: every event is a version tag
    from_mlflow = []
    for version in client(built.uri).search_model_versions(f"name='{MODEL}'"):
        from_mlflow += [json.loads(v) for k, v in version.tags.items() if k.startswith(EVENT_TAG)]
    from_mlflow.sort(key=lambda e: e["seq"])
    assert from_mlflow == [e.to_dict() for e in events]
    built.registry.history_file.unlink()  # lost: MLflow still has it all
    events_again, source = reg.history(MODEL)
    assert source == "mlflow version tags" and events_again == events
    reg.promote(MODEL, reg.aliases(MODEL).get("previous") or built.versions[1], why="after the loss")
    merged, source = reg.history(MODEL)
    assert merged[: len(events)] == events and merged[-1].why == "after the loss"
    assert source.endswith("alias-history.jsonl + mlflow version tags")
    reg.rollback(MODEL, why="restore the state the next tests expect")


def test_unknown_model_and_version_are_usage_errors(built: Built) -> None:
    reg = built.registry
    with pytest.raises(UsageError, match=r"not registered.*credit-test"):
        reg.aliases("no-such-model")
    with pytest.raises(UsageError, match="no version 99"):
        reg.promote(MODEL, "99", why="x")
    with pytest.raises(UsageError, match="not a version number"):
        reg.promote(MODEL, "latest", why="x")
    with pytest.raises(UsageError, match="invalid model name"):
        reg.aliases("bad name'; --")


def test_registry_commands(built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.cli.quality import quality_app
    from gpufleet.cli.registry import registry_app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", built.uri)
    app = typer.Typer()
    app.add_typer(registry_app, name="registry")
    app.add_typer(quality_app, name="quality")
    runner = CliRunner()
    v1, v2 = built.versions
    promoted = runner.invoke(app, ["registry", "promote", MODEL, v2, "--reason", "operator", "--json"])
    assert promoted.exit_code == 0, promoted.output
    assert [e["alias"] for e in json.loads(promoted.stdout)["events"]] == ["champion", "previous"]
    shown = runner.invoke(app, ["registry", "history", MODEL, "--json"])
    body = json.loads(shown.stdout)
    assert body["aliases"] == {"champion": v2, "previous": v1}
    assert body["events"][-1]["why"] == "operator"
    rolled = runner.invoke(app, ["registry", "rollback", MODEL, "--reason", "canary failed"])
    assert rolled.exit_code == 0 and "@champion 2 -> 1" in rolled.stdout
    again = runner.invoke(app, ["registry", "rollback", MODEL, "--reason", "x"])
    assert isinstance(again.exception, UsageError)
    doc = runner.invoke(app, ["quality", "doc", MODEL, "--json"])
    markdown = json.loads(doc.stdout)["markdown"]
    sha = hashlib.sha256(built.data.read_bytes()).hexdigest()
    for needle in ("Annex IV", "2 December 2027", "2 August 2028", sha, "canary failed", "## 9. Post-market"):
        assert needle in markdown
