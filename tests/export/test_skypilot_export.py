"""The SkyPilot export: every task validates against SkyPilot's schema, and its ``run`` really runs.

``tests/schemas/skypilot_task.json`` restates what ``sky/utils/schemas.py`` accepts (see its
description); the negative tests prove it rejects what SkyPilot rejects. Where SkyPilot itself is
installed, ``sky.Task.from_yaml`` reads the file as well.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]
import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli.export import export_app
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.export.skypilot import (
    CKPT_MOUNT,
    parse_infra_map,
    skypilot_infra,
    skypilot_task,
    skypilot_yaml,
)
from gpufleet.jobs.protocol import REQUEUE_EXIT_CODE
from gpufleet.runtime import CheckpointDir
from gpufleet.spec import JobSpec, parse_spec

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "skypilot_task.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def schema_errors(task: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(task)]


def make_spec(**fields: Any) -> JobSpec:
    data: dict[str, Any] = {"name": "pretrain_7b", "team": "perception", "entrypoint": "gpufleet.workloads.toy:train"}
    return parse_spec({**data, **fields})


SPECS = {
    "spot-ordered": make_spec(
        resources={"gpu_type": "H100", "gpus": 8, "cpus": 16},
        spot=True,
        max_restarts=4,
        env={"HF_HOME": "/data/hf"},
        placement={"ordered": [{"provider": "aws", "region": "us-east-1"}, {"provider": "gcp"}, {"gpu_type": "L40S"}]},
    ),
    "on-demand-any-of": make_spec(
        entrypoint=["torchrun", "--nproc-per-node", "4", "train.py", "--lr", "3e-4"],
        workdir="/srv/code",
        resources={"gpu_type": "L40S", "gpus": 4},
        provider="lambda",
        placement={"any_of": [{"provider": "lambda", "region": "us-east-1"}, {"region": "us-west-2"}]},
    ),
    "cpu-on-a-cloud": make_spec(resources={"gpu_type": "cpu", "gpus": 0, "cpus": 2}, provider="aws"),
}


def test_the_schema_itself_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert "sky/utils/schemas.py" in SCHEMA["description"] and "0.14" in SCHEMA["description"]


@pytest.mark.parametrize("bucket", [None, "s3://fleet-ckpt/runs"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_exported_task_validates_against_the_skypilot_schema(name: str, bucket: str | None) -> None:
    task = skypilot_task(SPECS[name], bucket=bucket)
    assert schema_errors(task) == []
    assert yaml.safe_load(skypilot_yaml(task)) == task  # the YAML text says exactly the mapping


@pytest.mark.parametrize(
    ("where", "change"),
    [
        ("top level", lambda t: t.update(resources_=t["resources"])),
        ("resources", lambda t: t["resources"].update(gpus=8)),
        ("an ordered entry", lambda t: t["resources"]["ordered"][0].update(spot=True)),
        ("job_recovery", lambda t: t["resources"]["job_recovery"].update(max_restarts=3)),
        ("infra", lambda t: t["resources"]["ordered"][0].update(infra="no-such-cloud/us-east-1")),
        ("recover_on_exit_codes", lambda t: t["resources"]["job_recovery"].update(recover_on_exit_codes=[300])),
        ("a storage mount", lambda t: t["file_mounts"][CKPT_MOUNT].update(mode="STREAM")),
        ("envs", lambda t: t["envs"].update({"BAD-NAME": "x"})),
        ("an entry's accelerators", lambda t: t["resources"]["ordered"][0].update(accelerators={"H100": 8, "A100": 8})),
    ],
)
def test_the_schema_rejects_what_skypilot_rejects(where: str, change: Any) -> None:
    task = copy.deepcopy(skypilot_task(SPECS["spot-ordered"], bucket="s3://fleet-ckpt"))
    assert schema_errors(task) == []
    change(task)
    assert schema_errors(task), f"a broken {where} passed the schema"


def test_resources_carry_gpus_spot_recovery_and_the_preference_order() -> None:
    spec = SPECS["spot-ordered"]
    resources = skypilot_task(spec)["resources"]
    assert resources["accelerators"] == {spec.resources.gpu_type: spec.resources.gpus}
    assert resources["use_spot"] is True
    assert resources["job_recovery"] == {
        "strategy": "EAGER_NEXT_REGION",
        "max_restarts_on_errors": spec.max_restarts,
        "recover_on_exit_codes": [REQUEUE_EXIT_CODE],
    }
    ordered = resources["ordered"]
    assert [e.get("infra") for e in ordered] == ["aws/us-east-1", "gcp", None]
    assert [e["accelerators"] for e in ordered] == [{"H100": 8}, {"H100": 8}, {"L40S": 8}]  # unset type: the spec's
    assert "any_of" not in resources and "infra" not in resources


def test_on_demand_jobs_fail_over_and_keep_their_command_and_workdir() -> None:
    spec = SPECS["on-demand-any-of"]
    task = skypilot_task(spec)
    assert task["resources"]["use_spot"] is False
    assert task["resources"]["job_recovery"]["strategy"] == "FAILOVER"
    assert [e.get("infra") for e in task["resources"]["any_of"]] == ["lambda/us-east-1", "*/us-west-2"]
    assert task["workdir"] == spec.workdir
    assert task["run"].rstrip().endswith("exec torchrun --nproc-per-node 4 train.py --lr 3e-4")


def test_the_bucket_is_mounted_where_the_job_checkpoints() -> None:
    spec = SPECS["spot-ordered"]
    task = skypilot_task(spec, bucket="gs://fleet-ckpt/runs")
    ((mount, storage),) = task["file_mounts"].items()
    assert storage == {"source": "gs://fleet-ckpt/runs", "mode": "MOUNT"}
    assert task["envs"]["GPUFLEET_CKPT_DIR"].startswith(mount + "/")
    assert task["envs"]["HF_HOME"] == "/data/hf" and task["envs"]["GPUFLEET_BACKEND"] == "skypilot"
    without = skypilot_task(spec)
    assert "file_mounts" not in without and not without["envs"]["GPUFLEET_CKPT_DIR"].startswith(mount)


@pytest.mark.parametrize("bucket", ["fleet-ckpt", "ftp://x/y", "s3://bucket with space", "s3://b/$(id)"])
def test_a_bad_bucket_is_a_usage_error(bucket: str) -> None:
    with pytest.raises(UsageError, match="bucket"):
        skypilot_task(SPECS["spot-ordered"], bucket=bucket)


def test_providers_become_skypilot_infra() -> None:
    assert skypilot_infra("aws", "eu-west-1") == "aws/eu-west-1"
    assert skypilot_infra("local", None) is None and skypilot_infra(None, None) is None
    assert skypilot_infra(None, "us-east-1") == "*/us-east-1"
    assert skypilot_infra("k8s", "my-ctx") == "k8s/my-ctx"
    mapping = parse_infra_map(["coreweave=k8s/cw-east", "nscale=AWS"])
    assert skypilot_infra("coreweave", "us-east-04", mapping) == "k8s/cw-east"
    assert skypilot_infra("nscale", "us-east-1", mapping) == "aws/us-east-1"
    with pytest.raises(UsageError, match="coreweave"):
        skypilot_infra("coreweave", None)
    with pytest.raises(UsageError, match="region"):
        skypilot_infra("aws", "us-east-1/../x")
    for bad in ("coreweave", "coreweave=notacloud/x", "=aws"):
        with pytest.raises(UsageError, match=r"^infra="):
            parse_infra_map([bad])


def test_an_unmapped_provider_in_placement_is_a_usage_error() -> None:
    spec = make_spec(resources={"gpu_type": "L40S", "gpus": 8}, placement={"any_of": [{"provider": "coreweave"}]})
    with pytest.raises(UsageError, match="map it with infra coreweave="):
        skypilot_task(spec)
    task = skypilot_task(spec, infra={"coreweave": "k8s/cw"})
    assert task["resources"]["any_of"] == [{"infra": "k8s/cw", "accelerators": {"L40S": 8}}]
    assert schema_errors(task) == []


def _run(task: dict[str, Any], tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """Run the task's ``run`` as SkyPilot does (bash, with ``envs`` exported), node paths under tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "python"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, **task["envs"], **extra_env}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    for key in ("GPUFLEET_HOME", "GPUFLEET_JOB_DIR", "GPUFLEET_SPEC", "GPUFLEET_EVENTS", "GPUFLEET_CKPT_DIR"):
        env[key] = str(tmp_path / "node" / env[key].lstrip("/"))
    return subprocess.run(["bash", "-c", task["run"]], env=env, capture_output=True, text=True, timeout=240)


def test_run_writes_the_spec_and_launches_the_function_which_checkpoints(tmp_path: Path) -> None:
    spec = make_spec(
        args={"steps": 12, "step_seconds": 0.0},
        checkpoint={"every_steps": 4},
        env={"NOTE": "quotes ' \" and $(no expansion) `here`"},
    )
    task = yaml.safe_load(skypilot_yaml(skypilot_task(spec, bucket="s3://fleet-ckpt")))  # as SkyPilot reads it
    proc = _run(task, tmp_path)
    assert proc.returncode == 0, proc.stderr
    spec_file = tmp_path / "node" / task["envs"]["GPUFLEET_SPEC"].lstrip("/")
    assert parse_spec(json.loads(spec_file.read_text(encoding="utf-8"))) == spec
    ckpt = tmp_path / "node" / task["envs"]["GPUFLEET_CKPT_DIR"].lstrip("/")
    assert max(i.step for i in CheckpointDir(ckpt).scan(verify=True)) == 12


def test_run_passes_arguments_literally_and_returns_the_commands_exit_code(tmp_path: Path) -> None:
    literal = "$(touch pwned); 'single' \"double\" `tick` \\n"
    code = f"import os, sys; print(sys.argv[1]); print(os.environ['GPUFLEET_JOB_ID']); sys.exit({REQUEUE_EXIT_CODE})"
    spec = make_spec(entrypoint=[sys.executable, "-c", code, literal])
    task = yaml.safe_load(skypilot_yaml(skypilot_task(spec)))
    proc = _run(task, tmp_path, SKYPILOT_TASK_ID="sky-managed-7")
    assert proc.returncode == REQUEUE_EXIT_CODE, proc.stderr
    assert proc.stdout.splitlines() == [literal, "sky-managed-7"]
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_sky_reads_the_exported_task(tmp_path: Path) -> None:
    sky = pytest.importorskip("sky", reason="SkyPilot is not installed (pip install skypilot)")
    path = tmp_path / "task.yaml"
    path.write_text(skypilot_yaml(skypilot_task(SPECS["spot-ordered"], bucket="s3://fleet-ckpt")), encoding="utf-8")
    task = sky.Task.from_yaml(str(path))
    assert task.name == SPECS["spot-ordered"].name


# ---- the command line ----------------------------------------------------------------------------


def _spec_file(tmp_path: Path, spec: JobSpec) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude={"workdir"})), encoding="utf-8")
    return path


def test_cli_prints_a_valid_task_and_warns_without_a_bucket(tmp_path: Path) -> None:
    result = CliRunner().invoke(export_app, ["skypilot", str(_spec_file(tmp_path, SPECS["spot-ordered"]))])
    assert result.exit_code == 0, result.output
    assert schema_errors(yaml.safe_load(result.stdout)) == []
    assert "warning:" in result.stderr and "--bucket" in result.stderr


def test_cli_json_and_out_file_carry_the_same_task(tmp_path: Path) -> None:
    spec_path, out = _spec_file(tmp_path, SPECS["spot-ordered"]), tmp_path / "task.yaml"
    args = ["skypilot", str(spec_path), "--bucket", "s3://fleet-ckpt", "--out", str(out), "--json"]
    result = CliRunner().invoke(export_app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["warnings"] == [] and payload["out"] == str(out)
    assert yaml.safe_load(out.read_text(encoding="utf-8")) == payload["task"]
    assert schema_errors(payload["task"]) == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--infra", "coreweave"], UsageError),
        (["--bucket", "not-a-uri"], UsageError),
        (["--out", "/no/such/folder/task.yaml"], UsageError),
        (["--workdir", "/no/such/folder"], UsageError),
    ],
)
def test_cli_bad_values_are_usage_errors(tmp_path: Path, args: list[str], error: type[Exception]) -> None:
    result = CliRunner().invoke(export_app, ["skypilot", str(_spec_file(tmp_path, SPECS["spot-ordered"])), *args])
    assert isinstance(result.exception, error), result.output
    assert result.stdout == ""


def test_cli_a_bad_spec_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: a\nentrypoint: m:f\ngpu: 1\n", encoding="utf-8")
    result = CliRunner().invoke(export_app, ["skypilot", str(path)])
    assert isinstance(result.exception, GpufleetError) and result.exception.exit_code == 2
    assert "gpu" in str(result.exception)
