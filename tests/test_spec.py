from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.errors import SpecError
from gpufleet.spec import load_spec, parse_spec

GOOD = """
name: tinylm
team: perception
entrypoint: gpufleet.workloads.tinylm:train
args: {steps: 10}
resources: {gpu_type: A100, gpus: 1, cpus: 2}
priority: 5
checkpoint: {every_steps: 5, keep: 2, grace_seconds: 10}
max_restarts: 3
env: {FOO: bar}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_good_spec_loads(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.callable_entrypoint == "gpufleet.workloads.tinylm:train"
    assert spec.command is None
    assert spec.resources.cpus == 2 and spec.checkpoint.keep == 2 and spec.env == {"FOO": "bar"}


def test_command_entrypoint_is_split_not_shelled(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, "name: a\nentrypoint: python train.py --lr '1e-3; rm -rf /'\n"))
    assert spec.command == ["python", "train.py", "--lr", "1e-3; rm -rf /"]
    assert spec.workdir == str(tmp_path.resolve())


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: a\nentrypoint: m:f\nresources: {gpus: -1}\n", "resources.gpus"),
        (
            "name: a\nentrypoint: m:f\nresourses: {gpus: 1}\n",
            "resourses: unknown field (did you mean 'resources'? see the fields in docs/reference/jobspec.md)",
        ),
        ("name: a\n", "entrypoint: required field is missing"),
        ("name: ../etc\nentrypoint: m:f\n", "name"),
        ("name: a\nentrypoint: m:f\ncheckpoint: {every_steps: null}\n", "checkpoint"),
        ("name: a\nentrypoint: 'bad:module:thing'\n", "entrypoint"),
        ("name: a\nentrypoint: m:f\nenv: {GPUFLEET_X: y}\n", "env"),
        ("name: a\nentrypoint: m:f\nhealth: {window: 10, min_history: 20}\n", "health"),
    ],
)
def test_bad_specs_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, text))
    message = str(err.value)
    assert field in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The misspelt name comes first: it is why the required field is missing.
        ("name: a\nentrypiont: python train.py\n", "job.yaml: entrypiont: unknown field (did you mean 'entrypoint'?"),
        (
            "name: a\nentrypoint: m:f\ncheckpoint: {every_step: 100}\n",
            "checkpoint.every_step: unknown field (did you mean 'every_steps'?",
        ),
        (
            "name: a\nentrypoint: m:f\ndistributed: {stratgy: ddp}\n",
            "distributed.stratgy: unknown field (did you mean 'strategy'?",
        ),
        (
            "name: a\nentrypoint: m:f\ndata: {sources: [{sorce: a}]}\n",
            "data.sources.0.sorce: unknown field (did you mean 'source'?",
        ),
        ("name: a\nentrypoint: m:f\ncolour: blue\n", "colour: unknown field (check its spelling against"),
    ],
)
def test_a_misspelt_field_is_named_with_the_field_it_is_closest_to(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, text))
    assert expected in str(err.value) and "docs/reference/jobspec.md" in str(err.value)


@pytest.mark.parametrize(
    ("example", "key", "reader"),
    [
        ("batch.yaml", "jobs", "gpufleet place FILE"),
        ("catalog.yaml", "offers", "gpufleet place --catalog FILE"),
        ("local-fleet.yaml", "offers", "gpufleet fleet use FILE"),
        ("slurm-fleet.yaml", "offers", "gpufleet fleet use FILE"),
        ("sweep.yaml", "space", "gpufleet sweep run FILE"),
        ("fleet.yaml", "switches", "gpufleet slurm topology FILE"),
        ("monitor.yaml", "models", "gpufleet quality monitor run FILE"),
    ],
)
def test_another_gpufleet_file_is_named_for_what_it_is(example: str, key: str, reader: str) -> None:
    path = Path(__file__).parents[1] / "examples" / example
    with pytest.raises(SpecError) as err:
        load_spec(path)
    message = str(err.value)
    assert message.startswith(f"{path}: not a JobSpec: its `{key}` makes it ") and reader in message
    assert "\n" not in message


def test_every_example_job_spec_loads() -> None:
    """No example that is a JobSpec is refused as another kind of file."""
    from gpufleet.spec import OTHER_FILES

    others = {key for key, _ in OTHER_FILES}
    for path in sorted((Path(__file__).parents[1] / "examples").glob("*.yaml")):
        if others.isdisjoint(yaml.safe_load(path.read_text())):
            assert load_spec(path).name


def test_malformed_yaml_gives_line(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="malformed YAML at line 3"):
        load_spec(write(tmp_path, "name: a\nentrypoint: [unclosed\n"))


def test_non_mapping_and_unreadable(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="must be a YAML mapping"):
        load_spec(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "missing.yaml")


def test_yaml_tags_are_not_executed(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="malformed YAML"):
        load_spec(write(tmp_path, "name: !!python/object/apply:os.system ['true']\nentrypoint: m:f\n"))


def test_spec_is_frozen_and_copy_validates() -> None:
    spec = parse_spec({"name": "a", "entrypoint": "m:f"})
    with pytest.raises(Exception, match="frozen"):
        spec.name = "b"
    assert spec.copy_with(priority=3).priority == 3
    with pytest.raises(SpecError, match="priority"):
        spec.copy_with(priority=10_000)


def test_distributed_block_and_world_size() -> None:
    plain = parse_spec({"name": "a", "entrypoint": "m:f", "resources": {"gpus": 2}})
    assert plain.distributed is None and plain.resources.nodes == 1
    assert (plain.world_size, plain.ranks_per_node, plain.total_gpus) == (1, 1, 2)  # one process, two GPUs
    ddp = parse_spec({"name": "a", "entrypoint": "m:f", "resources": {"gpus": 4}, "distributed": {"strategy": "ddp"}})
    assert ddp.distributed is not None
    assert (ddp.distributed.launcher, ddp.distributed.timeout_seconds) == ("torchrun", 300.0)
    assert (ddp.world_size, ddp.ranks_per_node, ddp.total_gpus) == (4, 4, 4)
    nodes = ddp.copy_with(resources={"gpus": 8, "nodes": 2}, distributed={"strategy": "fsdp", "launcher": "script"})
    assert (nodes.world_size, nodes.total_gpus) == (16, 16)
    cpu_nodes = ddp.copy_with(resources={"gpus": 0, "nodes": 3})
    assert (cpu_nodes.world_size, cpu_nodes.ranks_per_node, cpu_nodes.total_gpus) == (3, 1, 0)


def test_distributed_spec_round_trips_and_old_specs_parse() -> None:
    spec = parse_spec(
        {
            "name": "a",
            "entrypoint": "m:f",
            "resources": {"gpus": 2, "nodes": 1},
            "distributed": {"strategy": "ddp", "timeout_seconds": 12.5},
        }
    )
    assert parse_spec(json.loads(spec.model_dump_json())) == spec
    old = {"name": "a", "entrypoint": "m:f", "resources": {"gpu_type": "cpu", "gpus": 1, "cpus": 1}}
    assert parse_spec(old).world_size == 1
    assert parse_spec(json.loads(parse_spec(old).model_dump_json())) == parse_spec(old)


@pytest.mark.parametrize(
    ("data", "field", "fix"),
    [
        ({"resources": {"gpus": 0}, "distributed": {}}, "distributed:", "drop the `distributed` block, or raise"),
        ({"resources": {"gpus": 1}, "distributed": {}}, "distributed:", "raise resources.gpus to 2 or more"),
        (
            {"resources": {"gpus": 1, "nodes": 2}},
            "resources.nodes:",
            "add one, or set resources.nodes to 1",
        ),
        ({"resources": {"nodes": 0}}, "resources.nodes:", "greater than or equal to 1"),
        ({"resources": {"nodes": 2000}, "distributed": {}}, "resources.nodes:", "less than or equal to 1024"),
        ({"resources": {"gpus": 2}, "distributed": {"strategy": "zero"}}, "distributed.strategy:", "'ddp'"),
        ({"resources": {"gpus": 2}, "distributed": {"launcher": "mpirun"}}, "distributed.launcher:", "'torchrun'"),
        ({"resources": {"gpus": 2}, "distributed": {"timeout_seconds": 0}}, "distributed.timeout_seconds:", "0"),
        ({"resources": {"gpus": 2}, "distributed": {"timeout_seconds": 1e6}}, "distributed.timeout_seconds:", "86400"),
        (
            {"resources": {"gpus": 2}, "distributed": {"timeout_seconds": math.inf}},
            "distributed.timeout_seconds:",
            "finite",
        ),
        ({"resources": {"gpus": 2}, "distributed": {"nodes": 2}}, "distributed.nodes:", "unknown field"),
    ],
)
def test_bad_distributed_specs_name_the_field_and_the_fix(data: dict[str, Any], field: str, fix: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "a", "entrypoint": "m:f", **data})
    message = str(err.value)
    assert f"<spec>: {field}" in message and fix in message
    assert "\n" not in message
