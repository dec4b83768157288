"""A JobSpec as a SkyPilot task file, for ``sky jobs launch`` (SkyPilot 0.14 managed jobs).

SkyPilot then owns what our Slurm and local backends do themselves: finding capacity across
clouds and regions, and starting a new attempt after a preemption. What must carry over is the
runtime contract, so a recovered attempt restores instead of starting again:

- ``resources``: ``accelerators: {GPU: count}``, ``use_spot``, and ``placement.any_of`` /
  ``placement.ordered`` as SkyPilot's own ``any_of`` / ``ordered`` lists, each entry with its
  ``infra`` (``cloud[/region]``) and ``accelerators``;
- ``job_recovery``: ``EAGER_NEXT_REGION`` for spot jobs (after a preemption the region's spot pool
  is likely drained, so the next attempt goes elsewhere first), ``FAILOVER`` for on-demand ones;
  ``max_restarts_on_errors`` is the spec's ``max_restarts``, and exit code 75
  (``REQUEUE_EXIT_CODE``: saved, requeue me) is in ``recover_on_exit_codes``, which SkyPilot
  always recovers without counting it as an error;
- ``file_mounts``: the checkpoint bucket, mounted (``MOUNT`` mode) at ``/gpufleet/checkpoints``;
  ``GPUFLEET_CKPT_DIR`` is ``/gpufleet/checkpoints/<team>/<name>`` on it. The checkpointer writes
  a step folder's manifest last, so a folder a preemption cut short is never restored. Without a
  bucket the checkpoints stay on the node and a recovered attempt starts from step 0;
- ``envs``: the spec's ``env`` and the ``GPUFLEET_*`` contract of ``job_environment``;
  ``GPUFLEET_JOB_ID`` is SkyPilot's ``SKYPILOT_TASK_ID``, which stays the same across recoveries;
- ``setup`` installs gpufleet; ``run`` writes the spec where ``GPUFLEET_SPEC`` points and
  ``exec``s the entry command (``python -m gpufleet.runtime.launch`` for ``module:function``), so
  SkyPilot's SIGTERM reaches the training process itself and its exit code is the job's.

Providers map to SkyPilot clouds by name (``aws``, ``gcp``, ``lambda`` ...; ``local``, the
spec's default, means no preference). A provider SkyPilot reaches some other way, such as a
Kubernetes cluster, is given with ``infra={"coreweave": "k8s/my-context"}``.

The field names follow ``sky/utils/schemas.py`` (``get_task_schema``, ``get_resources_schema``,
``get_storage_schema``) and the "SkyPilot YAML" reference of SkyPilot 0.14;
``tests/schemas/skypilot_task.json`` restates the part of it this module writes.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpufleet._version import __version__
from gpufleet.errors import ParameterError, UsageError
from gpufleet.jobs.protocol import (
    ENV_CKPT_DIR,
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_SPEC,
    REQUEUE_EXIT_CODE,
    job_environment,
)
from gpufleet.spec import JobSpec, OfferChoice

SKYPILOT_CLOUDS = frozenset(
    {
        "aws", "azure", "gcp", "ibm", "lambda", "scp", "oci", "runpod", "vast", "vsphere", "cudo",
        "fluidstack", "paperspace", "primeintellect", "do", "nebius", "ssh", "slurm", "hyperbolic",
        "seeweb", "shadeform", "yotta", "mithril", "verda",
    }
)  # fmt: skip
"""SkyPilot's ``ALL_CLOUDS`` (``sky/skylet/constants.py``) less ``kubernetes``, which is ``k8s[/context]``."""
KUBERNETES = ("k8s", "kubernetes")
NO_PREFERENCE = "local"
"""The spec's default provider: no cloud preference."""

CKPT_MOUNT = "/gpufleet/checkpoints"
REMOTE_HOME = "/tmp/gpufleet"
"""``GPUFLEET_HOME`` on the node: the spec file and the event log (never on the bucket: no appends there)."""
DEFAULT_REQUIREMENT = f"gpufleet=={__version__}"
BUCKET_SCHEMES = ("s3", "gs", "r2", "cos", "oci", "nebius", "cw")
BUCKET_RE = re.compile(
    rf"^(?:(?:{'|'.join(BUCKET_SCHEMES)})://[A-Za-z0-9][A-Za-z0-9._@-]*"
    r"|https://[a-z0-9]+\.blob\.core\.windows\.net/[a-z0-9][a-z0-9-]*)(?:/[A-Za-z0-9._/-]*)?$"
)
BUCKET_HINT = f"give a bucket URI such as s3://my-bucket/ckpt ({', '.join(BUCKET_SCHEMES)} or Azure https://)"
REGION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
SPEC_HEREDOC = "GPUFLEET_SPEC_JSON"


def recovery_strategy(spec: JobSpec) -> str:
    """``EAGER_NEXT_REGION`` for spot jobs, ``FAILOVER`` for on-demand ones."""
    return "EAGER_NEXT_REGION" if spec.spot else "FAILOVER"


def skypilot_infra(provider: str | None, region: str | None, infra: Mapping[str, str] | None = None) -> str | None:
    """SkyPilot's ``infra`` (``cloud[/region]``, ``*/region``, ``k8s[/context]``), or ``None`` for anywhere."""
    if region is not None and not REGION_RE.match(region):
        raise UsageError(f"region {region!r} cannot be a SkyPilot region: use letters, digits, '.', '_', ':' or '-'")
    overrides = dict(infra or {})
    if provider is None or provider == NO_PREFERENCE:
        return f"*/{region}" if region else None
    if provider in overrides:
        target = overrides[provider]
        if target in SKYPILOT_CLOUDS:
            return f"{target}/{region}" if region else target
        return target  # a full infra (k8s/<context>, cloud/region): it names the place itself
    if provider in KUBERNETES:
        return f"k8s/{region}" if region else "k8s"
    if provider in SKYPILOT_CLOUDS:
        return f"{provider}/{region}" if region else provider
    raise ParameterError(
        "provider {provider!r} is not a SkyPilot cloud: map it with {infra:name} {provider!s}=<cloud or k8s/<context>> "
        "(SkyPilot clouds: {clouds!s}, k8s)",
        provider=provider,
        infra=overrides,
        clouds=", ".join(sorted(SKYPILOT_CLOUDS)),
    )


def parse_infra_map(infra: list[str]) -> dict[str, str]:
    """``["coreweave=k8s/cw-context"]`` -> ``{"coreweave": "k8s/cw-context"}``; checked as SkyPilot would."""
    mapping: dict[str, str] = {}
    for item in infra:
        provider, sep, target = item.partition("=")
        if not sep or not provider or not re.match(r"^(?:\*|[A-Za-z0-9][A-Za-z0-9._-]*)(?:/\S+)?$", target):
            raise ParameterError(
                "{infra} is not PROVIDER=INFRA, e.g. coreweave=k8s/my-context or nscale=aws", infra=item
            )
        cloud, slash, rest = target.partition("/")
        cloud = cloud.lower()
        if cloud not in SKYPILOT_CLOUDS and cloud not in KUBERNETES and cloud != "*":
            raise ParameterError("{infra}: {cloud!r} is not a SkyPilot cloud (nor k8s)", infra=item, cloud=cloud)
        mapping[provider] = cloud + slash + rest
    return mapping


def _accelerators(gpu_type: str, gpus: int) -> dict[str, int] | None:
    if gpu_type == "cpu" or gpus == 0:
        return None
    return {gpu_type: gpus}


def _choice(choice: OfferChoice, spec: JobSpec, infra: Mapping[str, str] | None) -> dict[str, Any]:
    """One ``any_of``/``ordered`` entry; an unset GPU type is the spec's own."""
    entry: dict[str, Any] = {}
    where = skypilot_infra(choice.provider, choice.region, infra)
    if where is not None:
        entry["infra"] = where
    accelerators = _accelerators(choice.gpu_type or spec.resources.gpu_type, spec.resources.gpus)
    if accelerators is not None:
        entry["accelerators"] = accelerators
    return entry


def skypilot_resources(spec: JobSpec, infra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The task's ``resources`` section."""
    resources: dict[str, Any] = {}
    accelerators = _accelerators(spec.resources.gpu_type, spec.resources.gpus)
    if accelerators is not None:
        resources["accelerators"] = accelerators
    resources["cpus"] = f"{spec.resources.cpus}+"
    resources["use_spot"] = spec.spot
    choices = spec.placement.any_of or spec.placement.ordered
    if choices:
        kind = "any_of" if spec.placement.any_of else "ordered"
        resources[kind] = [_choice(c, spec, infra) for c in choices]
    else:
        where = skypilot_infra(spec.provider, None, infra)
        if where is not None:
            resources["infra"] = where
    resources["job_recovery"] = {
        "strategy": recovery_strategy(spec),
        "max_restarts_on_errors": spec.max_restarts,
        "recover_on_exit_codes": [REQUEUE_EXIT_CODE],
    }
    return resources


def skypilot_envs(spec: JobSpec, *, bucket: str | None) -> dict[str, str]:
    """The spec's env and the ``GPUFLEET_*`` contract, as the node sees it."""
    env = job_environment(spec, 1, Path(REMOTE_HOME), "skypilot")
    del env[ENV_JOB_ID]  # set by `run` from SKYPILOT_TASK_ID, known only on the node
    if bucket is not None:
        env[ENV_CKPT_DIR] = f"{CKPT_MOUNT}/{spec.team}/{spec.name}"
    return env


def run_script(spec: JobSpec) -> str:
    """``run``: write the spec file, then ``exec`` the entry command (its exit code is the job's).

    The spec goes in a quoted here-document as one line of ASCII JSON: the shell expands nothing
    in it, and it can never equal the closing delimiter. The command's words are shell-quoted.
    """
    argv = ["python", "-m", "gpufleet.runtime.launch"] if spec.callable_entrypoint else list(spec.command or [])
    return "\n".join(
        [
            "set -e",
            f'mkdir -p "${ENV_JOB_DIR}" "${ENV_CKPT_DIR}"',
            f"cat > \"${ENV_SPEC}\" <<'{SPEC_HEREDOC}'",
            json.dumps(spec.model_dump(mode="json"), ensure_ascii=True, separators=(",", ":")),
            SPEC_HEREDOC,
            f'export {ENV_JOB_ID}="${{SKYPILOT_TASK_ID:-{spec.name}}}"',
            f"exec {shlex.join(argv)}",
            "",
        ]
    )


def check_bucket(bucket: str) -> str:
    if not BUCKET_RE.match(bucket):
        raise UsageError(f"bucket {bucket!r} is not a bucket URI: {BUCKET_HINT}")
    return bucket


def skypilot_task(
    spec: JobSpec,
    *,
    bucket: str | None = None,
    workdir: str | None = None,
    infra: Mapping[str, str] | None = None,
    requirement: str = DEFAULT_REQUIREMENT,
) -> dict[str, Any]:
    """The SkyPilot task (a mapping ready for YAML) that runs ``spec`` as a managed job.

    ``workdir`` (default: the spec's own, set for command entrypoints) is synced to the node and
    is where ``run`` starts; ``infra`` maps providers SkyPilot does not know by name.
    """
    task: dict[str, Any] = {"name": spec.name}
    workdir = workdir if workdir is not None else spec.workdir
    if workdir is not None:
        task["workdir"] = workdir
    task["resources"] = skypilot_resources(spec, infra)
    if bucket is not None:
        task["file_mounts"] = {CKPT_MOUNT: {"source": check_bucket(bucket), "mode": "MOUNT"}}
    task["envs"] = skypilot_envs(spec, bucket=bucket)
    task["setup"] = f"python -m pip install {shlex.quote(requirement)}\n"
    task["run"] = run_script(spec)
    return task


def task_warnings(spec: JobSpec, *, bucket: str | None) -> list[str]:
    """What the caller should hear about the exported task (the task itself stays valid)."""
    if bucket is None:
        return [
            f"no --bucket: {spec.name}'s checkpoints stay on the node, so an attempt SkyPilot recovers "
            "elsewhere starts from step 0; give --bucket s3://... to keep them"
        ]
    return []


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (``run``, ``setup``, a spec file) as ``|`` blocks, as people write them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # a value used twice is written twice, never as an &anchor


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def block_yaml(documents: Iterable[Mapping[str, Any]]) -> str:
    """YAML documents (``---`` between them), keys in the order given, multi-line strings as blocks."""
    return yaml.dump_all(
        [dict(d) for d in documents], Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=120
    )


def skypilot_yaml(task: Mapping[str, Any]) -> str:
    """The task as YAML text, keys in SkyPilot's documented order."""
    return block_yaml([task])


__all__ = [
    "BUCKET_HINT",
    "BUCKET_RE",
    "BUCKET_SCHEMES",
    "CKPT_MOUNT",
    "DEFAULT_REQUIREMENT",
    "KUBERNETES",
    "NO_PREFERENCE",
    "REGION_RE",
    "REMOTE_HOME",
    "SKYPILOT_CLOUDS",
    "SPEC_HEREDOC",
    "block_yaml",
    "check_bucket",
    "parse_infra_map",
    "recovery_strategy",
    "run_script",
    "skypilot_envs",
    "skypilot_infra",
    "skypilot_resources",
    "skypilot_task",
    "skypilot_yaml",
    "task_warnings",
]
