"""The Kueue export: Kueue objects validate against the vendored CRDs, the Job against Kubernetes.

Kueue objects are checked against the ``openAPIV3Schema`` of the version they name, from the CRDs
in ``../shared/schemas/kueue`` beside the clone or ``$GPUFLEET_KUEUE_CRDS`` (``x-kubernetes-*``
keywords are annotations to jsonschema), closed
the way a strict API server closes them (unknown fields are errors unless a schema preserves
them), plus ``kueue_problems`` for the CEL and webhook rules. Core kinds go through
``kubernetes-validate`` in strict mode. The negative tests prove each validator can fail.
"""

from __future__ import annotations

import copy
import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]
import kubernetes_validate  # type: ignore[import-untyped, unused-ignore]
import pytest
import yaml
from conftest import service_missing
from typer.testing import CliRunner

from gpufleet.cli.export import export_app
from gpufleet.errors import UsageError
from gpufleet.export.kueue import (
    QUEUE_LABEL,
    kueue_manifests,
    kueue_problems,
    kueue_yaml,
    node_labels,
    parse_quantity,
)
from gpufleet.jobs.protocol import REQUEUE_EXIT_CODE
from gpufleet.placement.catalog import Catalog, load_catalog, parse_catalog
from gpufleet.spec import JobSpec, parse_spec

REPO = Path(__file__).resolve().parents[2]
CRDS = Path(os.environ.get("GPUFLEET_KUEUE_CRDS") or REPO.parent / "shared" / "schemas" / "kueue")
KUBERNETES = "1.37"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _closed(schema: Any) -> Any:
    """Unknown fields are errors wherever the schema lists properties and does not preserve others."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def crd_validators() -> dict[tuple[str, str], tuple[Any, bool]]:
    """``(apiVersion, kind)`` -> (validator of that version's schema, namespaced)."""
    validators = {}
    if not any(CRDS.glob("kueue.x-k8s.io_*.yaml")):
        service_missing(f"no Kueue CRDs in {CRDS}: set $GPUFLEET_KUEUE_CRDS to Kueue's config/components/crd/bases")
    for path in sorted(CRDS.glob("kueue.x-k8s.io_*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        group, kind, scope = crd["spec"]["group"], crd["spec"]["names"]["kind"], crd["spec"]["scope"]
        for version in crd["spec"]["versions"]:
            schema = _closed(version["schema"]["openAPIV3Schema"])
            validators[(f"{group}/{version['name']}", kind)] = (
                jsonschema.Draft202012Validator(schema),
                scope == "Namespaced",
            )
    return validators


def kueue_errors(obj: dict[str, Any]) -> list[str]:
    """Everything the vendored CRD, the object metadata rules and Kueue's own rules say is wrong."""
    found = crd_validators().get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if found is None:
        return [f"no CRD for {obj.get('apiVersion')} {obj.get('kind')}"]
    validator, namespaced = found
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    meta = obj.get("metadata", {})
    if not DNS_SUBDOMAIN.match(meta.get("name", "")):
        errors.append(f"metadata.name {meta.get('name')!r} is not a DNS subdomain")
    if namespaced != ("namespace" in meta):
        errors.append(f"{obj['kind']} is {'namespaced' if namespaced else 'cluster-scoped'}: metadata.namespace")
    if set(meta) - {"name", "namespace", "labels", "annotations"}:
        errors.append(
            f"unexpected metadata fields {sorted(set(meta) - {'name', 'namespace', 'labels', 'annotations'})}"
        )
    return errors + kueue_problems(obj)


def core_errors(obj: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as err:
        return [f"{'/'.join(map(str, err.path))}: {err.message}"]
    return []


def errors_of(obj: dict[str, Any]) -> list[str]:
    if obj["apiVersion"].startswith("kueue.x-k8s.io/"):
        return kueue_errors(obj)
    return core_errors(obj) + kueue_problems(obj)


CATALOG = parse_catalog(
    {
        "as_of": "2026-12-01",
        "gpu_types": {
            "H100": {"memory_gib": 80, "throughput": {"training": 1.0}},
            "L40S": {"memory_gib": 48, "throughput": {"training": 0.35}},
            "MI300X": {"memory_gib": 192, "throughput": {"training": 1.1}},
        },
        "offers": [
            {"provider": "aws", "region": "us-east-1", "gpu_type": "H100", "gpus_per_node": 8,
             "on_demand_per_gpu_hour": 6.88, "spot_per_gpu_hour": 2.6, "capacity_gpus": 64},
            {"provider": "coreweave", "region": "us-east-04", "gpu_type": "L40S", "gpus_per_node": 8,
             "on_demand_per_gpu_hour": 2.25, "capacity_gpus": 64},
            {"provider": "coreweave", "region": "us-east-04", "gpu_type": "MI300X", "gpus_per_node": 8,
             "on_demand_per_gpu_hour": 2.5, "capacity_gpus": 16},
        ],
        "quotas": [
            {"team": "perception", "gpu_type": "H100", "nominal": 16, "borrowing_limit": 8, "lending_limit": 8,
             "cohort": "research"},
            {"team": "language", "gpu_type": "H100", "nominal": 8, "borrowing_limit": 8, "cohort": "research"},
            {"team": "language", "gpu_type": "L40S", "nominal": 32, "cohort": "research"},
            {"team": "language", "gpu_type": "L40S", "provider": "coreweave", "nominal": 48, "cohort": "research"},
            {"team": "solo", "gpu_type": "MI300X", "nominal": 8},
        ],
    }
)  # fmt: skip


def make_spec(**fields: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": "pretrain_7b",
        "team": "perception",
        "entrypoint": "gpufleet.workloads.tinylm:train",
        "resources": {"gpu_type": "H100", "gpus": 8, "cpus": 16},
        "priority": 10,
        "spot": True,
        "checkpoint": {"every_steps": 50, "grace_seconds": 42.5},
        "max_restarts": 4,
        "env": {"HF_HOME": "/data/hf"},
    }
    return parse_spec({**data, **fields})


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [m for m in by_kind(manifests, kind) if name is None or m["metadata"]["name"] == name]
    return found


SPECS = {
    "perception-h100": make_spec(),
    "language-command": make_spec(
        name="sft.run", team="language", entrypoint=["torchrun", "train.py"], resources={"gpu_type": "L40S", "gpus": 4}
    ),
    "solo-no-cohort": make_spec(team="solo", resources={"gpu_type": "MI300X", "gpus": 8}, priority=-5),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_manifest_validates(name: str) -> None:
    manifests = kueue_manifests(SPECS[name], CATALOG, namespace="ml-train", image="registry.example.com/gpufleet:1")
    assert {m["kind"] for m in manifests} >= {"ResourceFlavor", "ClusterQueue", "LocalQueue", "ConfigMap", "Job"}
    for manifest in manifests:
        assert errors_of(manifest) == [], (manifest["kind"], manifest["metadata"]["name"])
    assert list(yaml.safe_load_all(kueue_yaml(manifests))) == manifests


def test_the_shipped_example_catalogue_exports() -> None:
    catalog = load_catalog(REPO / "examples" / "catalog.yaml")
    team = catalog.quotas[0]
    spec = make_spec(team=team.team, resources={"gpu_type": team.gpu_type, "gpus": 1})
    for manifest in kueue_manifests(spec, catalog):
        assert errors_of(manifest) == [], manifest["kind"]


def _gpu(m: dict[str, Any]) -> dict[str, Any]:
    """The GPU row of the first flavor of a ClusterQueue."""
    row: dict[str, Any] = m["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]
    return row


BROKEN = [
    ("ClusterQueue", "lending above nominal", lambda m: _gpu(m).update(lendingLimit=_gpu(m)["nominalQuota"] + 1)),
    ("ClusterQueue", "misspelt nominalQuota", lambda m: _gpu(m).update(nominalQuotas=_gpu(m).pop("nominalQuota"))),
    ("ClusterQueue", "borrowing without a cohort", lambda m: m["spec"].pop("cohortName")),
    ("ClusterQueue", "a resource missing from a flavor", lambda m: m["spec"]["resourceGroups"][0]["flavors"][0][
        "resources"].pop(1)),
    ("ClusterQueue", "older spelling cohort", lambda m: m["spec"].update(cohort=m["spec"].pop("cohortName"))),
    ("ClusterQueue", "a bad quantity", lambda m: _gpu(m).update(nominalQuota="lots")),
    ("ResourceFlavor", "an unknown spec field", lambda m: m["spec"].update(nodeSelector={"a": "b"})),
    ("LocalQueue", "no namespace", lambda m: m["metadata"].pop("namespace")),
    ("LocalQueue", "an invalid queue name", lambda m: m["spec"].update(clusterQueue="Perception_Team")),
    ("WorkloadPriorityClass", "a priority that is not a number", lambda m: m.update(value="high")),
    ("Job", "no queue label", lambda m: m["metadata"]["labels"].pop(QUEUE_LABEL)),
    ("Job", "a misspelt field", lambda m: m["spec"].update(suspended=m["spec"].pop("suspend"))),
    ("Job", "a count that is not a number", lambda m: m["spec"].update(backoffLimit="four")),
    ("Job", "a pod without containers", lambda m: m["spec"]["template"]["spec"].pop("containers")),
    ("Job", "an exit-code rule without values", lambda m: m["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"].pop(
        "values")),
    ("ConfigMap", "data that is not text", lambda m: m["data"].update({"spec.json": {"nested": True}})),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "what", "change"), BROKEN, ids=[f"{k}: {w}" for k, w, _ in BROKEN])
def test_the_validators_reject_a_broken_manifest(kind: str, what: str, change: Any) -> None:
    names = {"ClusterQueue": "perception", "LocalQueue": "perception", "ResourceFlavor": "h100"}
    manifest = copy.deepcopy(one(kueue_manifests(SPECS["perception-h100"], CATALOG), kind, names.get(kind)))
    assert errors_of(manifest) == []
    change(manifest)
    errors = errors_of(manifest)
    assert errors, f"{kind} with {what} passed validation"


def test_cluster_queues_carry_the_catalogue_quotas_in_the_crds_spelling() -> None:
    manifests = kueue_manifests(SPECS["perception-h100"], CATALOG)
    validator, _ = crd_validators()[("kueue.x-k8s.io/v1beta2", "ClusterQueue")]
    spec_fields = validator.schema["properties"]["spec"]["properties"]
    cohort_field = "cohortName" if "cohortName" in spec_fields else "cohort"
    for quota in CATALOG.quotas:
        if quota.provider != "*":
            continue
        queue = one(manifests, "ClusterQueue", quota.team)
        assert queue["spec"].get(cohort_field) == quota.cohort
        group = queue["spec"]["resourceGroups"][0]
        assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
        (flavor,) = [f for f in group["flavors"] if f["name"] == quota.gpu_type.lower()]
        gpu = flavor["resources"][2]
        assert gpu["nominalQuota"] == quota.nominal
        assert gpu.get("borrowingLimit") == quota.borrowing_limit and gpu.get("lendingLimit") == quota.lending_limit
    assert {c["metadata"]["name"] for c in by_kind(manifests, "Cohort")} == {"research"}
    assert {f["metadata"]["name"] for f in by_kind(manifests, "ResourceFlavor")} == {"h100", "l40s", "mi300x"}
    assert one(manifests, "ResourceFlavor", "h100")["spec"]["nodeLabels"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"
    }


def test_a_provider_quota_wins_over_the_wildcard_for_that_provider() -> None:
    def language_l40s(provider: str) -> int:
        manifests = kueue_manifests(SPECS["language-command"].copy_with(provider=provider), CATALOG)
        flavors = one(manifests, "ClusterQueue", "language")["spec"]["resourceGroups"][0]["flavors"]
        (l40s,) = [f for f in flavors if f["name"] == "l40s"]
        return int(l40s["resources"][2]["nominalQuota"])

    assert language_l40s("coreweave") == 48
    assert language_l40s("local") == 32


def test_the_job_is_queued_suspended_and_survives_preemption() -> None:
    spec = SPECS["perception-h100"]
    manifests = kueue_manifests(spec, CATALOG, namespace="ml-train", checkpoint_claim="fleet-ckpt")
    job = one(manifests, "Job")
    queue = one(manifests, "LocalQueue", job["metadata"]["labels"][QUEUE_LABEL])
    assert queue["metadata"]["namespace"] == job["metadata"]["namespace"] == "ml-train"
    assert one(manifests, "ClusterQueue", queue["spec"]["clusterQueue"])["metadata"]["name"] == "perception"
    priority = one(manifests, "WorkloadPriorityClass", job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"])
    assert priority["value"] == spec.priority
    assert job["spec"]["suspend"] is True
    assert job["spec"]["backoffLimit"] == spec.max_restarts
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] > spec.checkpoint.grace_seconds
    (container,) = pod["containers"]
    requeue = job["spec"]["podFailurePolicy"]["rules"][0]
    assert requeue["action"] == "Ignore"
    assert requeue["onExitCodes"] == {
        "containerName": container["name"],
        "operator": "In",
        "values": [REQUEUE_EXIT_CODE],
    }
    gpus = spec.resources.gpus
    assert (
        container["resources"]["requests"]["nvidia.com/gpu"]
        == container["resources"]["limits"]["nvidia.com/gpu"]
        == gpus
    )
    assert pod["nodeSelector"] == one(manifests, "ResourceFlavor", "h100")["spec"]["nodeLabels"]


def test_the_pod_sees_the_runtime_contract_on_its_volumes() -> None:
    spec = SPECS["language-command"]
    manifests = kueue_manifests(spec, CATALOG, checkpoint_claim="fleet-ckpt")
    pod = one(manifests, "Job")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert container["command"] == spec.command
    assert env["HF_HOME"] == "/data/hf" and env["GPUFLEET_TEAM"] == spec.team
    assert "GPUFLEET_JOB_ID" in env  # from the downward API
    ckpt_volume = next(n for n, p in mounts.items() if env["GPUFLEET_CKPT_DIR"].startswith(p + "/"))
    assert volumes[ckpt_volume]["persistentVolumeClaim"] == {"claimName": "fleet-ckpt"}
    spec_volume = next(n for n, p in mounts.items() if env["GPUFLEET_SPEC"].startswith(p + "/"))
    config_map = one(manifests, "ConfigMap", volumes[spec_volume]["configMap"]["name"])
    file_name = env["GPUFLEET_SPEC"].rsplit("/", 1)[1]
    assert parse_spec(json.loads(config_map["data"][file_name])) == spec


def test_a_job_kueue_could_never_admit_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no L40S quota"):
        kueue_manifests(make_spec(resources={"gpu_type": "L40S", "gpus": 1}), CATALOG)
    with pytest.raises(UsageError, match="at most 16 nominal \\+ 8 borrowed"):
        kueue_manifests(make_spec(resources={"gpu_type": "H100", "gpus": 25}), CATALOG)
    with pytest.raises(UsageError, match="at most 8 nominal \\+ 0 borrowed"):
        kueue_manifests(SPECS["solo-no-cohort"].copy_with(resources={"gpu_type": "MI300X", "gpus": 9}), CATALOG)
    with pytest.raises(UsageError, match="asks no GPU"):
        kueue_manifests(make_spec(resources={"gpu_type": "cpu", "gpus": 0}), CATALOG)
    with pytest.raises(UsageError, match="namespace"):
        kueue_manifests(SPECS["perception-h100"], CATALOG, namespace="ML_Train")
    with pytest.raises(UsageError, match="image"):
        kueue_manifests(SPECS["perception-h100"], CATALOG, image="my image")


def test_quotas_compare_in_kubernetes_units() -> None:
    assert parse_quantity("96Gi") == 96 * 2**30 and parse_quantity("1.5k") == 1500 and parse_quantity(8) == 8
    assert parse_quantity("500m") * 2 == 1
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity("12 GB")
    queue = copy.deepcopy(one(kueue_manifests(SPECS["perception-h100"], CATALOG), "ClusterQueue", "perception"))
    memory = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]
    memory.update(nominalQuota="1Ti", lendingLimit="1024Gi")
    assert kueue_problems(queue) == []
    memory.update(lendingLimit="1025Gi")
    assert kueue_problems(queue) == [
        "ClusterQueue perception flavor h100 memory: lendingLimit 1025Gi exceeds nominalQuota 1Ti"
    ]


def test_unknown_gpu_types_get_a_label_the_admin_sets() -> None:
    assert node_labels("L40S") == {"nvidia.com/gpu.product": "NVIDIA-L40S"}
    assert node_labels("MI300X") == {"gpufleet/gpu-type": "MI300X"}


# ---- the command line ----------------------------------------------------------------------------


def _files(tmp_path: Path, spec: JobSpec, catalog: Catalog | dict[str, Any] = CATALOG) -> tuple[Path, Path]:
    spec_path, catalog_path = tmp_path / "job.yaml", tmp_path / "catalog.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude={"workdir"})), encoding="utf-8")
    data = catalog.model_dump(mode="json") if isinstance(catalog, Catalog) else catalog
    catalog_path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return spec_path, catalog_path


def test_cli_prints_multi_document_yaml_that_validates(tmp_path: Path) -> None:
    spec_path, catalog_path = _files(tmp_path, SPECS["perception-h100"])
    args = ["kueue", str(spec_path), "--catalog", str(catalog_path), "--namespace", "ml-train", "--image", "r/g:1"]
    result = CliRunner().invoke(export_app, args)
    assert result.exit_code == 0, result.output
    manifests = list(yaml.safe_load_all(result.stdout))
    assert len(manifests) > 5 and all(errors_of(m) == [] for m in manifests)
    assert one(manifests, "Job")["spec"]["template"]["spec"]["containers"][0]["image"] == "r/g:1"
    assert "warning:" in result.stderr and "--checkpoint-claim" in result.stderr


def test_cli_json_and_out_file(tmp_path: Path) -> None:
    spec_path, catalog_path = _files(tmp_path, SPECS["perception-h100"])
    out = tmp_path / "manifests.yaml"
    args = ["kueue", str(spec_path), "--catalog", str(catalog_path), "--checkpoint-claim", "ckpt", "--out", str(out)]
    result = CliRunner().invoke(export_app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert (
        payload["warnings"] == [] and list(yaml.safe_load_all(out.read_text(encoding="utf-8"))) == payload["manifests"]
    )


def test_cli_a_bad_catalogue_or_value_is_a_usage_error(tmp_path: Path) -> None:
    data = CATALOG.model_dump(mode="json")
    data["quotas"][0]["lending_limit"] = data["quotas"][0]["nominal"] + 1
    (tmp_path / "good").mkdir()
    _, good_catalog = _files(tmp_path / "good", SPECS["perception-h100"])
    spec_path, bad_catalog = _files(tmp_path, SPECS["perception-h100"], data)
    for args, named in (
        (["--catalog", str(bad_catalog)], "lending_limit"),
        (["--catalog", str(tmp_path / "missing.yaml")], "missing.yaml"),
        (["--catalog", str(good_catalog), "--namespace", "Bad_NS"], "Bad_NS"),
    ):
        result = CliRunner().invoke(export_app, ["kueue", str(spec_path), *args])
        assert isinstance(result.exception, UsageError), (args, result.output)
        assert named in str(result.exception) and result.stdout == ""
