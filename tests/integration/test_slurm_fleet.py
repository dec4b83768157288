"""A fleet on a real Slurm: pools are partitions, team quotas are QOS limits Slurm enforces.

The dev cluster's nodes declare 4 GPUs each (``gres/gpu``, scripts/dev-slurm). The fleet has an
H100 pool and an L40S pool; perception's H100 quota is 2 GPUs. A first 2-GPU job takes it; a second
one that must run on H100 pends in Slurm with ``QOSGrpGRES``, which ``gpufleet jobs`` shows; a third
that may also run on L40S overflows to the L40S partition and is priced at that offer's rate.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import follow_home, run_cli

from gpufleet.backends.slurm.backend import run_slurm
from gpufleet.cost.usage import store_usages
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store, latest_step

REPO = Path(__file__).resolve().parents[2]
FLEET = (REPO / "examples" / "slurm-fleet.yaml").read_text(encoding="utf-8")
"""The example fleet: an H100 pool (partition gf-h100) and an L40S one (gf-l40s); perception's H100 quota is 2."""


def job_file(tmp_path: Path, name: str, types: list[str], steps: int, pace: float) -> Path:
    spec = {
        "name": name,
        "team": "perception",
        "entrypoint": "gpufleet.workloads.tinylm:train",
        "args": {"steps": steps, "step_seconds": pace},
        "resources": {"gpus": 2, "cpus": 1, "gpu_type": types[0]},
        "placement": {"any_of": [{"gpu_type": t} for t in types], "gpu_hours": 0.01},
        "checkpoint": {"every_steps": 10},
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


@pytest.mark.timeout(600)
def test_a_team_over_its_slurm_quota_pends_with_slurms_reason_and_a_flexible_job_overflows(
    slurm: dict[str, str],
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    (tmp_path / "fleet.yaml").write_text(FLEET, encoding="utf-8")
    assert run_cli(capsys, monkeypatch, "fleet", "use", str(tmp_path / "fleet.yaml"))[0] == 0
    code, out, err = run_cli(capsys, monkeypatch, "slurm", "fleet", "--apply", "--json")
    assert code == 0, err
    applied = json.loads(out)
    assert [p["name"] for p in applied["partitions"]] == ["gf-h100", "gf-l40s"]
    qos = run_slurm(["sacctmgr", "-n", "-P", "show", "qos", "where", "name=gf-perception-h100", "format=GrpTRES"])
    assert qos.stdout.strip() == "gres/gpu=2"  # Slurm holds the limit, not gpufleet

    def submit(path: Path) -> int:
        code, out, err = run_cli(capsys, monkeypatch, "submit", str(path), "--backend", "slurm", "--json")
        assert code == 0, err
        return int(json.loads(out)["id"])

    store = Store(home / "state.db")
    first = submit(job_file(tmp_path, "first", ["H100"], 2000, 0.05))  # holds perception's 2 H100 until cancelled
    follow_home(home, lambda: (latest_step(store, first) or 0) >= 1)
    second = submit(job_file(tmp_path, "second", ["H100"], 20, 0.0))
    flexible = submit(job_file(tmp_path, "flexible", ["H100", "L40S"], 20, 0.0))
    try:
        placed = {j: store.last_event(j, EventKind.PLACED) for j in (first, second, flexible)}
        assert {j: (p.data["partition"], p.data["qos"]) for j, p in placed.items() if p} == {
            first: ("gf-h100", "gf-perception-h100"),
            second: ("gf-h100", "gf-perception-h100"),  # the quota is full: it waits in Slurm's queue
            flexible: ("gf-l40s", "gf-perception-l40s"),  # overflow to the next feasible offer
        }
        follow_home(home, lambda: "QOSGrpGRES" in (store.job(second).reason or ""))
        code, out, _ = run_cli(capsys, monkeypatch, "jobs", "--json")
        rows = {r["id"]: r for r in json.loads(out)["jobs"]}
        assert rows[second]["state"] == "queued"
        assert rows[second]["reason"].startswith("waiting: Slurm QOSGrpGRES (QOS gf-perception-h100")
        code, out, _ = run_cli(capsys, monkeypatch, "jobs")
        assert "QOSGrpGRES" in out  # the why column
        follow_home(home, lambda: store.job(flexible).state == "completed")
    finally:
        for job in (first, second, flexible):
            run_cli(capsys, monkeypatch, "cancel", str(job))
    (usage,) = store_usages(store, job_ids=[flexible])
    assert (usage.offer, usage.price_per_gpu_hour, usage.gpu_type) == ("cloud/us-east-1/L40S", 1.0, "L40S")


@pytest.mark.timeout(600)
def test_a_sweep_runs_its_trials_as_slurm_jobs(
    slurm: dict[str, str],
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three trials through sbatch; the driver follows them with sacct and ends each with its val_loss."""
    sweep = {
        "name": "slurm-sweep",
        "base": {
            "name": "lm",
            "team": "perception",
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": {"steps": 8, "eval_every": 4, "batch_size": 8, "context": 16, "layers": 1, "embed": 32},
            "resources": {"gpus": 0, "cpus": 1, "gpu_type": "cpu"},
        },
        "space": {"lr": {"grid": [0.001, 0.003, 0.01]}},
        "objective": {"metric": "val_loss"},
        "budget": {"trials": 3},
        "parallelism": 2,
        "sampler": {"kind": "grid"},
    }
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep), encoding="utf-8")
    code, out, err = run_cli(
        capsys, monkeypatch, "sweep", "run", str(path), "--backend", "slurm", "--poll", "0.5", "--json"
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["finished"] == 3 and sorted(r["params"]["lr"] for r in result["rows"]) == [0.001, 0.003, 0.01]
    store = Store(home / "state.db")
    for row in result["rows"]:
        job = store.job(row["job"])
        assert job.backend == "slurm" and job.backend_ref and job.state == "completed"
        (final,) = [e for e in store.events(job.id, kinds=("eval",)) if e.data["step"] == 8]
        assert row["value"] == final.data["val_loss"]
