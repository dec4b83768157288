"""A fleet on Slurm without a cluster: partitions and QOS from the fleet file, the planner's pick in sbatch,
Slurm's pending reason in the store, and each run priced at the offer."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from gpufleet.backends.pools import use_fleet
from gpufleet.backends.slurm.backend import SlurmBackend, parse_sacct, plan_slurm, sbatch_argv
from gpufleet.backends.slurm.fleet import ClusterHas, fleet_commands, place_on_slurm, slurm_fleet
from gpufleet.cost.usage import store_usages
from gpufleet.errors import UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Store
from gpufleet.placement.fleetfile import parse_fleet
from gpufleet.spec import JobSpec, parse_spec


def read_yaml_text(text: str) -> object:
    return yaml.safe_load(text)


FLEET = """\
as_of: 2026-12-01
gpu_types:
  H100: {memory_gib: 80, throughput: {training: 1.0}}
  L40S: {memory_gib: 48, throughput: {training: 0.35}}
offers:
  - {provider: onprem, region: rack-a, gpu_type: H100, gpus_per_node: 1, on_demand_per_gpu_hour: 2.0, capacity_gpus: 4}
  - {provider: cloud, region: us-east-1, gpu_type: L40S, gpus_per_node: 1, on_demand_per_gpu_hour: 1.0,
     capacity_gpus: 4}
quotas:
  - {team: perception, gpu_type: H100, provider: "*", nominal: 2}
  - {team: perception, gpu_type: L40S, provider: cloud, nominal: 2}
pools:
  - {offer: onprem/rack-a/H100, partition: gf-h100}
  - {offer: cloud/us-east-1/L40S}
"""


def job(name: str = "lm", gpus: int = 2, types: Sequence[str] = ("H100",), team: str = "perception") -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "team": team,
            "entrypoint": ["python", "train.py"],
            "resources": {"gpus": gpus, "cpus": 1, "gpu_type": types[0]},
            "placement": {"any_of": [{"gpu_type": t} for t in types], "gpu_hours": 0.01},
        }
    )


class FakeSlurm:
    """Records commands; sbatch answers the next job id, sacct the canned runs."""

    def __init__(self, sacct: str = "") -> None:
        self.calls: list[list[str]] = []
        self.sacct = sacct
        self.squeue = ""
        self.next = 100

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        out = ""
        if argv[0] == "sbatch":
            self.next += 1
            out = f"{self.next}\n"
        elif argv[0] == "sacct":
            out = self.sacct
        elif argv[0] == "squeue":
            out = self.squeue
        return subprocess.CompletedProcess(list(argv), 0, out, "")

    def sbatch(self, n: int) -> list[str]:
        return [c for c in self.calls if c[0] == "sbatch"][n]


@pytest.fixture
def fleet_home(home: Path, tmp_path: Path) -> Path:
    (tmp_path / "fleet.yaml").write_text(FLEET, encoding="utf-8")
    use_fleet(home, tmp_path / "fleet.yaml")
    return home


def test_pools_are_partitions_and_quotas_are_qos_with_a_gpu_limit() -> None:
    sf = slurm_fleet(parse_fleet(read_yaml_text(FLEET)))
    assert [(p.name, p.offer) for p in sf.partitions] == [
        ("gf-h100", "onprem/rack-a/H100"),
        ("cloud-us-east-1-l40s", "cloud/us-east-1/L40S"),  # named after its offer
    ]
    assert [(q.name, q.gpus) for q in sf.qos] == [("gf-perception-h100", 2), ("gf-perception-l40s-cloud", 2)]
    has = ClusterHas(partitions=frozenset({"gf-h100"}), accounts=frozenset(), qos=frozenset({"gf-perception-h100"}))
    todo = [" ".join(c) for c in fleet_commands(sf, has, nodes="ALL", cluster="c", user="alice")]
    assert todo[0].startswith("scontrol update PartitionName=gf-h100 Nodes=ALL")  # exists: updated
    assert todo[1].startswith("scontrol create PartitionName=cloud-us-east-1-l40s")
    assert "sacctmgr -i add account perception cluster=c Description=gpufleet team perception" in todo
    assert "sacctmgr -i add user alice account=perception cluster=c" in todo
    assert "sacctmgr -i add qos gf-perception-h100" not in todo  # there already
    assert "sacctmgr -i add qos gf-perception-l40s-cloud" in todo
    assert "sacctmgr -i modify qos where name=gf-perception-h100 set GrpTRES=gres/gpu=2" in todo


def test_two_pools_on_one_partition_and_a_bad_partition_name_are_refused() -> None:
    data = read_yaml_text(
        FLEET.replace("  - {offer: cloud/us-east-1/L40S}", "  - {offer: cloud/us-east-1/L40S, partition: gf-h100}")
    )
    with pytest.raises(UsageError, match="share the Slurm partition 'gf-h100'"):
        slurm_fleet(parse_fleet(data))
    with pytest.raises(UsageError, match="partition"):
        parse_fleet(read_yaml_text(FLEET.replace("partition: gf-h100", "partition: 'a b;rm'")))


def test_submit_passes_the_planners_partition_qos_and_gres_and_overflows_when_the_quota_is_full(
    fleet_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_SLURM_GRES", "0")  # a fleet's jobs ask for their GPUs all the same
    fake = FakeSlurm()
    backend = SlurmBackend(fleet_home, runner=fake)
    first = backend.submit(job("first"))
    argv = fake.sbatch(0)
    assert "--partition=gf-h100" in argv and "--qos=gf-perception-h100" in argv and "--gres=gpu:2" in argv
    flexible = backend.submit(job("flexible", types=("H100", "L40S")))  # H100 quota held by `first`
    argv = fake.sbatch(1)
    assert "--partition=cloud-us-east-1-l40s" in argv and "--qos=gf-perception-l40s-cloud" in argv
    waits = backend.submit(job("waits"))  # H100 only: full, so Slurm's queue of the H100 pool
    assert "--partition=gf-h100" in fake.sbatch(2)
    placed = {j: backend.store.last_event(j, EventKind.PLACED) for j in (first, flexible, waits)}
    events = {j: e.data for j, e in placed.items() if e is not None}
    assert len(events) == 3
    assert events[flexible]["price_per_gpu_hour"] == 1.0
    assert "every pool is full" in events[waits]["why"]


def test_jobs_no_quota_can_ever_hold_are_refused_at_submit(fleet_home: Path) -> None:
    store = Store(fleet_home / "state.db")
    with pytest.raises(UsageError, match=r"fits no pool.*nominal 2"):
        place_on_slurm(fleet_home, store, 1, job(gpus=3))
    # In a cohort the planner would have it borrow; Slurm's GrpTRES does not lend.
    cohort = FLEET.replace(
        '  - {team: perception, gpu_type: H100, provider: "*", nominal: 2}',
        '  - {team: perception, gpu_type: H100, provider: "*", nominal: 2, cohort: r}\n'
        '  - {team: planning, gpu_type: H100, provider: "*", nominal: 2, cohort: r}',
    ).replace("provider: cloud, nominal: 2}", "provider: cloud, nominal: 2, cohort: r}")
    (fleet_home.parent / "cohort.yaml").write_text(cohort, encoding="utf-8")
    use_fleet(fleet_home, fleet_home.parent / "cohort.yaml")
    with pytest.raises(UsageError, match=r"quota on Slurm is 2 .*does not lend"):
        place_on_slurm(fleet_home, store, 1, job(gpus=3))
    with pytest.raises(UsageError, match="fits no pool"):
        place_on_slurm(fleet_home, store, 1, job(team="nobody"))
    assert place_on_slurm(fleet_home, store, 1, job(gpus=0)) is None  # a CPU job is not the fleet's


def test_a_pending_run_shows_slurms_reason_and_each_run_is_priced_at_the_offer(fleet_home: Path) -> None:
    # sacct keeps the reason of the job's last state change; squeue has slurmctld's reason now.
    fake = FakeSlurm(sacct="101|PENDING|Unknown|Unknown|0:0|0||perception|None\n")
    fake.squeue = "101|QOSGrpGRES\n"
    backend = SlurmBackend(fleet_home, runner=fake)
    job_id = backend.submit(job("waits"))
    backend.sync()
    assert ["squeue", "-h", "-t", "PD", "-j", "101", "-o", "%i|%r"] in fake.calls
    assert backend.store.job(job_id).reason == (
        "waiting: Slurm QOSGrpGRES (QOS gf-perception-h100: team perception's H100 quota is full)"
    )
    fake.sacct = "101|PENDING|Unknown|Unknown|0:0|0||perception|Priority\n"
    plan, _ = plan_slurm(backend.store.job(job_id), [], parse_sacct(fake.sacct), 0.0)
    assert plan.reason is None  # only queued: nothing to explain
    fake.sacct = "101|COMPLETED|2026-12-02T10:00:00|2026-12-02T11:00:00|0:0|3600|cpu=1,gres/gpu=2|perception|None\n"
    backend.sync()
    (usage,) = store_usages(backend.store, job_ids=[job_id])
    assert (usage.offer, usage.price_per_gpu_hour, usage.gpus) == ("onprem/rack-a/H100", 2.0, 2)


def test_sbatch_without_a_fleet_is_unchanged(tmp_path: Path) -> None:
    argv = sbatch_argv(job(), 7, tmp_path, tmp_path / "job.sbatch")
    assert "--partition=low" in argv and not any(a.startswith("--qos") for a in argv)


def test_the_fleet_commands_without_a_cluster_name_the_partitions_and_the_qos_limits(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fleet.yaml").write_text(FLEET, encoding="utf-8")
    code, out, err = run_cli(capsys, monkeypatch, "slurm", "fleet", str(tmp_path / "fleet.yaml"), "--nodes", "gpu[1-8]")
    assert code == 0, err
    assert "PartitionName=gf-h100 Nodes=gpu[1-8] PriorityTier=1 PreemptMode=REQUEUE State=UP" in out
    assert "sacctmgr -i modify qos where name=gf-perception-h100 set GrpTRES=gres/gpu=2" in out
    assert "sacctmgr -i modify account where name=perception cluster=CLUSTER set qos+=gf-perception-h100" in out
    code, out, err = run_cli(capsys, monkeypatch, "slurm", "fleet", str(tmp_path / "fleet.yaml"), "--json")
    assert code == 0 and json.loads(out)["qos"][0] == {
        "name": "gf-perception-h100",
        "team": "perception",
        "gpu_type": "H100",
        "provider": "*",
        "grp_gpus": 2,
    }
    code, _, err = run_cli(capsys, monkeypatch, "slurm", "fleet")
    assert code == 2 and "no fleet in use" in err
    code, _, err = run_cli(capsys, monkeypatch, "slurm", "fleet", str(tmp_path / "fleet.yaml"), "--nodes", "a;rm")
    assert code == 2 and "--nodes" in err
