"""The whole quality chain through the local backend and a real MLflow store, as `gpufleet quality demo` runs it.

Drift -> policy -> signed alert -> retraining job (preempted once, resumed) -> challenger registered ->
validated -> canary -> promoted; and with a worse challenger, the same chain rolls the aliases back.
Fails under CI, and skips elsewhere, when MLflow is not installed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import service_missing

from gpufleet.demos.quality_chain import ChainConfig, run_quality_demo
from gpufleet.jobs.store import Store


@pytest.fixture
def chain_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    try:
        import mlflow  # noqa: F401
    except ImportError:
        service_missing("MLflow is not installed: `pip install 'gpufleet[quality]'`")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("GPUFLEET_USER", "chain-test")
    home.mkdir(parents=True)
    return home


def mlflow_client(uri: str) -> Any:
    import mlflow

    from gpufleet.quality.registry import quiet_mlflow

    with quiet_mlflow():
        return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


@pytest.mark.timeout(240)
def test_drift_alert_retrain_preempt_register_canary_promote(chain_home: Path) -> None:
    lines: list[str] = []
    result = run_quality_demo(chain_home, ChainConfig(preempt=True), lines.append)
    assert result["ok"] is True, result.get("outcome")
    assert result["outcome"] == "promoted"

    # the policy: persistence over two windows, each decision logged with its evidence
    assert [w["decision"]["action"] for w in result["windows"]] == ["alert", "retrain"]
    assert all(w["report"]["dataset_drift"] for w in result["windows"])
    logged = [json.loads(x) for x in (chain_home / "quality" / "decisions.jsonl").read_text().splitlines()]
    assert [d["action"] for d in logged] == ["alert", "retrain"]
    assert logged[1]["evidence"]["drift_streak"] == 2 and logged[1]["thresholds"]["persistence"] == 2

    # the webhook: accepted once; the replay and the tampered copy were refused and submitted nothing
    hook = result["webhook"]
    assert hook["accepted"]["status"] == 202 and hook["replayed"]["status"] == 409
    assert hook["tampered"]["status"] == 401 and hook["jobs_submitted"] == 1
    store = Store(chain_home / "state.db")
    assert len(store.jobs()) == 2  # the champion's training and one retraining

    # the job: preempted once, resumed from its checkpoint on the local fleet
    job = result["job"]
    assert job["state"] == "completed" and job["outcomes"] == ["preempted", "completed"]
    assert job["resumed_from_step"] and job["resumed_from_step"] >= 100
    assert (Path(job["folder"]) / "output" / "model" / "model.json").is_file()

    # MLflow, read with its own client: aliases moved, the run carries its data's digest
    c = mlflow_client(result["tracking_uri"])
    champion = c.get_model_version_by_alias(result["model"], "champion")
    assert str(champion.version) == job["version"]
    assert str(c.get_model_version_by_alias(result["model"], "previous").version) == result["champion"]["version"]
    run = c.get_run(job["run_id"])
    digests = {i.dataset.name: i.dataset.digest for i in run.inputs.dataset_inputs}
    current = chain_home / "quality" / "data" / "current.parquet"
    assert digests["current"] == hashlib.sha256(current.read_bytes()).hexdigest()[:32]
    assert run.data.params["job_id"] == str(job["id"])

    # the gates: the challenger beat the champion offline and on served decisions
    validation = result["validation"]
    assert validation["verdict"]["action"] == "pass"
    assert validation["challenger"]["auc"] > validation["champion"]["auc"]
    assert result["live"]["verdict"]["action"] == "promote"

    events = result["history"]["events"]
    assert [(e["action"], e["alias"]) for e in events][-1] == ("promote", "champion")
    assert {e["who"] for e in events} >= {"gpufleet quality demo"}
    assert any("preempting job" in line for line in lines)


@pytest.mark.timeout(240)
def test_a_worse_challenger_passes_the_auc_gate_and_is_rolled_back_by_the_canary(chain_home: Path) -> None:
    result = run_quality_demo(chain_home, ChainConfig(worse=True), None)
    assert result["ok"] is True and result["outcome"] == "rolled_back"
    assert result["validation"]["verdict"]["action"] == "pass"  # ranking intact: AUC cannot see it
    assert result["live"]["verdict"]["action"] == "rollback"
    assert result["live"]["verdict"]["numbers"]["diff"] < -0.02
    c = mlflow_client(result["tracking_uri"])
    model = result["model"]
    assert str(c.get_model_version_by_alias(model, "champion").version) == result["champion"]["version"]
    assert "previous" not in c.get_registered_model(model).aliases
    assert "gpufleet.rolled_back" in c.get_model_version(model, result["job"]["version"]).tags
    actions = [(e["action"], e["alias"], e["from_version"], e["to_version"]) for e in result["history"]["events"]]
    assert actions[-2:] == [
        ("rollback", "champion", result["job"]["version"], result["champion"]["version"]),
        ("rollback", "previous", result["champion"]["version"], None),
    ]
