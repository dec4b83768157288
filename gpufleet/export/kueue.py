"""A JobSpec and the catalogue's team quotas as Kueue manifests (``kueue.x-k8s.io/v1beta2``).

Kueue admits a suspended Job once its ClusterQueue has quota for it, and preempts (suspends) it
again when a higher-priority workload or a lender reclaiming its quota needs the room: the
preemption our runtime already survives. The catalogue's quotas are Kueue's model, so they map
one to one:

- one ``ResourceFlavor`` per GPU type, whose ``nodeLabels`` select that GPU's nodes
  (``nvidia.com/gpu.product`` as NVIDIA's GPU Feature Discovery writes it, for the types in
  ``GPU_PRODUCTS``; ``gpufleet/gpu-type`` otherwise, a label the cluster's admin sets);
- one ``ClusterQueue`` per team, one resource group covering ``cpu``, ``memory`` and
  ``nvidia.com/gpu``, one flavor per GPU type the team has a quota for: ``nominalQuota``,
  ``borrowingLimit`` and ``lendingLimit`` in GPUs, and CPU and memory scaled by the same factor
  (``cpus_per_gpu``, ``memory_gib_per_gpu``: the catalogue counts GPUs only) so borrowed GPUs come
  with their host share; ``cohortName`` (v1beta2's spelling; v1beta1 said ``cohort``) and a
  ``Cohort`` object per cohort; a provider-specific quota wins over a ``*`` one for the spec's
  provider;
- one ``LocalQueue`` per team in the namespace, and a ``WorkloadPriorityClass`` for the spec's
  priority;
- the job: a ``ConfigMap`` holding the spec (``GPUFLEET_SPEC``) and a ``batch/v1`` ``Job``
  labelled ``kueue.x-k8s.io/queue-name``, created ``suspend: true`` (Kueue unsuspends it),
  ``restartPolicy: Never`` with a ``podFailurePolicy`` that ignores exit code 75 (saved, requeue
  me) and disruptions (preemption, eviction, node drain), so only real failures count toward
  ``backoffLimit`` = ``max_restarts``; ``terminationGracePeriodSeconds`` is the checkpoint grace
  plus ``GRACE_MARGIN_S`` for the interpreter to exit after its last save. Checkpoints go to a
  PersistentVolumeClaim when one is named (else an ``emptyDir``: a new pod starts from step 0).

``kueue_problems`` checks the rules Kueue enforces beyond the CRDs' OpenAPI schemas (CEL rules
and its admission webhook), so a manifest can be checked whole without a cluster.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from gpufleet._version import __version__
from gpufleet.errors import UsageError
from gpufleet.export.skypilot import block_yaml
from gpufleet.jobs.protocol import ENV_CKPT_DIR, ENV_JOB_ID, ENV_SPEC, REQUEUE_EXIT_CODE, job_environment
from gpufleet.placement.catalog import WILDCARD, Catalog, Quota
from gpufleet.spec import JobSpec

KUEUE_API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GPU = "nvidia.com/gpu"
COVERED = ("cpu", "memory", GPU)
PRODUCT_LABEL = "nvidia.com/gpu.product"
FALLBACK_LABEL = "gpufleet/gpu-type"
GPU_PRODUCTS = {
    "h100": "NVIDIA-H100-80GB-HBM3",
    "h200": "NVIDIA-H200",
    "a100": "NVIDIA-A100-SXM4-80GB",
    "a100-80gb": "NVIDIA-A100-SXM4-80GB",
    "a100-40gb": "NVIDIA-A100-SXM4-40GB",
    "l40s": "NVIDIA-L40S",
    "l4": "NVIDIA-L4",
    "a10g": "NVIDIA-A10G",
    "t4": "Tesla-T4",
}
"""GPU Feature Discovery's ``nvidia.com/gpu.product`` value: the NVML device name, spaces as '-'."""
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpufleet"}
DEFAULT_IMAGE = f"gpufleet:{__version__}"
"""An image with gpufleet (and the job's code) installed; build and push your own."""
GRACE_MARGIN_S = 15
CONTAINER = "train"
SPEC_MOUNT = "/etc/gpufleet"
CKPT_MOUNT = "/gpufleet/checkpoints"
POD_HOME = "/tmp/gpufleet"
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{unit: Decimal(1000) ** (i + 1) for i, unit in enumerate("kMGTPE")},
    **{f"{unit}i": Decimal(1024) ** (i + 1) for i, unit in enumerate("KMGTPE")},
}


def k8s_name(value: str, what: str) -> str:
    """A gpufleet name (``[a-z0-9._-]``) as a Kubernetes DNS-1123 label: ``_`` and ``.`` become ``-``."""
    name = re.sub(r"[._]", "-", value.lower()).strip("-")
    if not DNS_LABEL_RE.match(name) or len(name) > 63:
        raise UsageError(f"{what} {value!r} cannot be a Kubernetes name: use lowercase letters, digits and '-'")
    return name


def node_labels(gpu_type: str) -> dict[str, str]:
    """The labels of the nodes that carry ``gpu_type``."""
    product = GPU_PRODUCTS.get(gpu_type.lower())
    return {PRODUCT_LABEL: product} if product else {FALLBACK_LABEL: gpu_type}


def parse_quantity(value: int | str) -> Decimal:
    """A Kubernetes quantity (``8``, ``"96Gi"``, ``"500m"``) as a number."""
    if isinstance(value, int):
        return Decimal(value)
    match = QUANTITY_RE.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None


def kueue_problems(manifest: Mapping[str, Any]) -> list[str]:
    """What Kueue would refuse in ``manifest`` beyond its CRD's OpenAPI schema; ``[]`` when nothing.

    ClusterQueue rules: every flavor lists the covered resources in their order (CRD CEL rule
    "flavors must have the same number of resources as the coveredResources", and the webhook's
    name check); no borrowing or lending limit without a cohort (CEL rule "borrowingLimit must be
    nil when cohort is empty"); a lending limit at most the nominal quota (webhook). A Job must
    name its LocalQueue in ``kueue.x-k8s.io/queue-name``.
    """
    kind, name = manifest.get("kind"), manifest.get("metadata", {}).get("name")
    if kind == "ClusterQueue":
        return _cluster_queue_problems(str(name), manifest.get("spec", {}))
    if kind == "Job" and not manifest.get("metadata", {}).get("labels", {}).get(QUEUE_LABEL):
        return [f"Job {name}: label {QUEUE_LABEL} is missing; Kueue would never admit it"]
    return []


def _cluster_queue_problems(name: str, spec: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    for group in spec.get("resourceGroups", []):
        covered = list(group.get("coveredResources", []))
        for flavor in group.get("flavors", []):
            resources = flavor.get("resources", [])
            flavor_name = f"ClusterQueue {name} flavor {flavor.get('name')}"
            if [r.get("name") for r in resources] != covered:
                problems.append(f"{flavor_name}: resources must be {covered}, in order")
            for r in resources:
                where, nominal = f"{flavor_name} {r.get('name')}", r.get("nominalQuota")
                limits = [k for k in ("borrowingLimit", "lendingLimit") if k in r]
                if limits and not spec.get("cohortName"):
                    problems.append(f"{where}: {' and '.join(limits)} need a cohortName")
                lend, own = _quantity(r.get("lendingLimit")), _quantity(nominal)
                if lend is not None and own is not None and lend > own:
                    problems.append(f"{where}: lendingLimit {r['lendingLimit']} exceeds nominalQuota {nominal}")
    return problems


def _quantity(value: Any) -> Decimal | None:
    """A quantity to compare, or ``None`` when absent or unreadable (the schema reports the latter)."""
    try:
        return None if value is None else parse_quantity(value)
    except (TypeError, ValueError):
        return None


def team_quotas(catalog: Catalog, provider: str) -> dict[str, list[Quota]]:
    """Each team's quotas that hold at ``provider``: per GPU type, its own quota over a ``*`` one."""
    teams: dict[str, dict[str, Quota]] = {}
    for quota in catalog.quotas:
        if quota.provider not in (WILDCARD, provider):
            continue
        chosen = teams.setdefault(quota.team, {})
        held = chosen.get(quota.gpu_type)
        if held is None or held.provider == WILDCARD:
            chosen[quota.gpu_type] = quota
    return {team: list(by_type.values()) for team, by_type in teams.items()}


def _scaled(quota: Quota, resource: str, cpus_per_gpu: int, memory_gib_per_gpu: int) -> dict[str, Any]:
    def amount(gpus: int) -> int | str:
        if resource == "cpu":
            return gpus * cpus_per_gpu
        if resource == "memory":
            return f"{gpus * memory_gib_per_gpu}Gi"
        return gpus

    entry: dict[str, Any] = {"name": resource, "nominalQuota": amount(quota.nominal)}
    if quota.borrowing_limit is not None:
        entry["borrowingLimit"] = amount(quota.borrowing_limit)
    if quota.lending_limit is not None:
        entry["lendingLimit"] = amount(quota.lending_limit)
    return entry


def resource_flavor(gpu_type: str) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": k8s_name(gpu_type, "GPU type"), "labels": dict(MANAGED_BY)},
        "spec": {"nodeLabels": node_labels(gpu_type)},
    }


def cluster_queue(team: str, quotas: list[Quota], *, cpus_per_gpu: int, memory_gib_per_gpu: int) -> dict[str, Any]:
    """A team's ClusterQueue: one flavor per GPU type it has a quota for."""
    spec: dict[str, Any] = {}
    cohort = quotas[0].cohort
    if cohort is not None:
        spec["cohortName"] = k8s_name(cohort, "cohort")
    spec["namespaceSelector"] = {}
    spec["queueingStrategy"] = "BestEffortFIFO"
    spec["preemption"] = {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    flavors = [
        {
            "name": k8s_name(q.gpu_type, "GPU type"),
            "resources": [_scaled(q, r, cpus_per_gpu, memory_gib_per_gpu) for r in COVERED],
        }
        for q in quotas
    ]
    spec["resourceGroups"] = [{"coveredResources": list(COVERED), "flavors": flavors}]
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": k8s_name(team, "team"), "labels": dict(MANAGED_BY)},
        "spec": spec,
    }


def local_queue(team: str, namespace: str) -> dict[str, Any]:
    name = k8s_name(team, "team")
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "spec": {"clusterQueue": name},
    }


def priority_class_name(priority: int) -> str:
    return f"gpufleet-priority-{priority}" if priority >= 0 else f"gpufleet-priority-minus-{-priority}"


def priority_class(priority: int) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": priority_class_name(priority), "labels": dict(MANAGED_BY)},
        "value": priority,
        "description": f"gpufleet JobSpec priority {priority}: higher preempts lower",
    }


def _fits(spec: JobSpec, quota: Quota | None) -> None:
    """The job can be admitted at all: its team has a quota of its GPU type, large enough."""
    gpu_type, gpus = spec.resources.gpu_type, spec.resources.gpus
    if quota is None:
        raise UsageError(
            f"team {spec.team!r} has no {gpu_type} quota in the catalogue for provider {spec.provider!r}: "
            f"add one under quotas (team: {spec.team}, gpu_type: {gpu_type}) or change resources.gpu_type"
        )
    borrow = 0 if quota.cohort is None else quota.borrowing_limit
    if borrow is not None and gpus > quota.nominal + borrow:
        raise UsageError(
            f"{spec.name} asks {gpus} {gpu_type} GPUs but team {spec.team}'s quota admits at most "
            f"{quota.nominal} nominal + {borrow} borrowed: lower resources.gpus or raise the quota"
        )


def _env(spec: JobSpec) -> list[dict[str, Any]]:
    env = job_environment(spec, 1, Path(POD_HOME), "kueue")
    env[ENV_SPEC] = f"{SPEC_MOUNT}/spec.json"
    env[ENV_CKPT_DIR] = f"{CKPT_MOUNT}/{spec.team}/{spec.name}"
    del env[ENV_JOB_ID]  # the Job's uid, the same for every pod (attempt) it starts
    uid = {"fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}}
    return [{"name": ENV_JOB_ID, "valueFrom": uid}, *({"name": k, "value": v} for k, v in env.items())]


def job_manifests(
    spec: JobSpec, *, namespace: str, image: str, queue: str, checkpoint_claim: str | None, flavor: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The spec's ConfigMap and its suspended ``batch/v1`` Job."""
    name = k8s_name(spec.name, "job name")
    labels = {**MANAGED_BY, "gpufleet/team": k8s_name(spec.team, "team"), "gpufleet/job": name}
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-spec", "namespace": namespace, "labels": labels},
        "data": {"spec.json": json.dumps(spec.model_dump(mode="json"), indent=2)},
    }
    argv = ["python", "-m", "gpufleet.runtime.launch"] if spec.callable_entrypoint else list(spec.command or [])
    amounts: dict[str, int | str] = {"cpu": spec.resources.cpus, GPU: spec.resources.gpus}
    checkpoints: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": checkpoint_claim}} if checkpoint_claim else {"emptyDir": {}}
    )
    container = {
        "name": CONTAINER,
        "image": image,
        "command": argv,
        "env": _env(spec),
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
            {"name": "checkpoints", "mountPath": CKPT_MOUNT},
        ],
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**labels, QUEUE_LABEL: queue, PRIORITY_LABEL: priority_class_name(spec.priority)},
        },
        "spec": {
            "suspend": True,
            "backoffLimit": spec.max_restarts,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "Ignore",
                        "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [REQUEUE_EXIT_CODE]},
                    },
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": math.ceil(spec.checkpoint.grace_seconds) + GRACE_MARGIN_S,
                    "nodeSelector": dict(flavor),
                    "containers": [container],
                    "volumes": [
                        {"name": "spec", "configMap": {"name": f"{name}-spec"}},
                        {"name": "checkpoints", **checkpoints},
                    ],
                },
            },
        },
    }
    return [config_map, job]


def kueue_manifests(
    spec: JobSpec,
    catalog: Catalog,
    *,
    namespace: str = "default",
    image: str = DEFAULT_IMAGE,
    checkpoint_claim: str | None = None,
    cpus_per_gpu: int = 12,
    memory_gib_per_gpu: int = 96,
) -> list[dict[str, Any]]:
    """Flavors, cohorts, queues and quotas from ``catalog``, then the spec's ConfigMap and Job.

    ``cpus_per_gpu`` and ``memory_gib_per_gpu`` size the host share of a GPU in the quotas (the
    defaults are an AWS g6e.12xlarge's: 48 vCPUs and 384 GiB for 4 L40S).
    """
    if not DNS_LABEL_RE.match(namespace) or len(namespace) > 63:
        raise UsageError(f"namespace {namespace!r} is not a Kubernetes namespace name: lowercase letters, digits, '-'")
    if not image or any(c.isspace() for c in image):
        raise UsageError(f"image {image!r} is not an image reference: give e.g. registry.example.com/gpufleet:0.1.0")
    if checkpoint_claim is not None and not DNS_LABEL_RE.match(checkpoint_claim):
        raise UsageError(f"checkpoint claim {checkpoint_claim!r} is not a PersistentVolumeClaim name")
    if spec.resources.gpu_type == "cpu" or spec.resources.gpus == 0:
        raise UsageError(
            f"{spec.name} asks no GPU (resources: {spec.resources.gpus}x {spec.resources.gpu_type}): "
            "Kueue export queues GPU jobs against the catalogue's GPU quotas"
        )
    if cpus_per_gpu < 1 or memory_gib_per_gpu < 1:
        raise UsageError("cpus_per_gpu and memory_gib_per_gpu must be at least 1")
    teams = team_quotas(catalog, spec.provider)
    own = {q.gpu_type: q for q in teams.get(spec.team, [])}
    _fits(spec, own.get(spec.resources.gpu_type))
    flavor_names = [k8s_name(g, "GPU type") for g in catalog.gpu_types]
    if len(set(flavor_names)) != len(flavor_names):
        raise UsageError(f"GPU types {', '.join(catalog.gpu_types)} collide once lowercased as Kubernetes names")
    cohorts = [c for c in dict.fromkeys(q[0].cohort for q in teams.values()) if c is not None]
    manifests: list[dict[str, Any]] = [resource_flavor(g) for g in catalog.gpu_types]
    manifests += [
        {
            "apiVersion": KUEUE_API,
            "kind": "Cohort",
            "metadata": {"name": k8s_name(c, "cohort"), "labels": dict(MANAGED_BY)},
        }
        for c in cohorts
    ]
    manifests += [
        cluster_queue(t, q, cpus_per_gpu=cpus_per_gpu, memory_gib_per_gpu=memory_gib_per_gpu) for t, q in teams.items()
    ]
    manifests += [local_queue(t, namespace) for t in teams]
    manifests.append(priority_class(spec.priority))
    manifests += job_manifests(
        spec,
        namespace=namespace,
        image=image,
        queue=k8s_name(spec.team, "team"),
        checkpoint_claim=checkpoint_claim,
        flavor=node_labels(spec.resources.gpu_type),
    )
    problems = [p for m in manifests for p in kueue_problems(m)]
    if problems:
        raise UsageError(f"the catalogue makes manifests Kueue would refuse: {problems[0]}")
    return manifests


def manifest_warnings(spec: JobSpec, *, checkpoint_claim: str | None) -> list[str]:
    if checkpoint_claim is None:
        return [
            f"no --checkpoint-claim: {spec.name}'s checkpoints live in an emptyDir, so a pod Kueue restarts "
            "after a preemption starts from step 0; name a PersistentVolumeClaim to keep them"
        ]
    return []


def kueue_yaml(manifests: Iterable[Mapping[str, Any]]) -> str:
    """Multi-document YAML, one document per manifest, in apply order."""
    return block_yaml(manifests)


__all__ = [
    "CKPT_MOUNT",
    "CONTAINER",
    "COVERED",
    "DEFAULT_IMAGE",
    "DNS_LABEL_RE",
    "FALLBACK_LABEL",
    "GPU",
    "GPU_PRODUCTS",
    "GRACE_MARGIN_S",
    "KUEUE_API",
    "MANAGED_BY",
    "POD_HOME",
    "PRIORITY_LABEL",
    "PRODUCT_LABEL",
    "QUANTITY_RE",
    "QUEUE_LABEL",
    "SPEC_MOUNT",
    "cluster_queue",
    "job_manifests",
    "k8s_name",
    "kueue_manifests",
    "kueue_problems",
    "kueue_yaml",
    "local_queue",
    "manifest_warnings",
    "node_labels",
    "parse_quantity",
    "priority_class",
    "priority_class_name",
    "resource_flavor",
    "team_quotas",
]
