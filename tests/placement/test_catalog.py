"""The offer catalogue: the shipped example loads, and every bad item is named in the error."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.errors import SpecError, UsageError
from gpufleet.placement.catalog import Catalog, load_batch, load_catalog, parse_batch, parse_catalog
from gpufleet.placement.planner import check_jobs
from gpufleet.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "catalog.yaml"


def raw() -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_example_catalogue_has_two_types_three_providers_and_a_cohort() -> None:
    cat = load_catalog(EXAMPLE)
    assert {"H100", "L40S"} <= set(cat.gpu_types)
    assert len(cat.providers) >= 3
    assert any(q.cohort for q in cat.quotas)
    assert all(o.source for o in cat.offers), "every price row names its source"


def test_lookups() -> None:
    cat = load_catalog(EXAMPLE)
    h100 = cat.offers_for(gpu_type="H100")
    assert h100 and all(o.gpu_type == "H100" for o in h100)
    aws_east = cat.offers_for(provider="aws", region="us-east-1")
    assert {o.key for o in aws_east} == {"aws/us-east-1/H100", "aws/us-east-1/L40S"}
    assert cat.throughput("L40S", "finetune") == cat.gpu_types["L40S"].throughput["finetune"]
    assert cat.throughput("L40S", "no-such-workload") is None
    assert cat.throughput("A100", "training") is None
    assert {q.team for q in cat.quotas_for("language")} == {"language"}
    assert cat.offer("aws/us-east-1/H100").provider == "aws"
    with pytest.raises(UsageError, match="no offer 'aws/nowhere/H100'"):
        cat.offer("aws/nowhere/H100")


def _set(section: str, index: int, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        d[section][index][key] = value

    return mutate


def _dup_offer(d: dict[str, Any]) -> None:
    d["offers"].append(dict(d["offers"][0]))


def _dup_quota(d: dict[str, Any]) -> None:
    d["quotas"].append(dict(d["quotas"][0]))


def _zero_throughput(d: dict[str, Any]) -> None:
    d["gpu_types"]["L40S"]["throughput"]["training"] = 0


def _other_cohort(d: dict[str, Any]) -> None:
    d["quotas"][2]["cohort"] = "elsewhere"


BAD: list[tuple[str, Callable[[dict[str, Any]], None], list[str]]] = [
    ("negative price", _set("offers", 1, "on_demand_per_gpu_hour", -1.0), ["aws/us-west-2/H100", "negative"]),
    ("negative spot", _set("offers", 1, "spot_per_gpu_hour", -0.5), ["aws/us-west-2/H100", "negative"]),
    ("spot above on-demand", _set("offers", 2, "spot_per_gpu_hour", 9.0), ["aws/us-east-1/L40S", "above"]),
    ("unknown offer type", _set("offers", 3, "gpu_type", "A100"), ["offers[3]", "gcp/us-central1/A100", "'A100'"]),
    ("unknown quota type", _set("quotas", 0, "gpu_type", "B200"), ["quotas[0]", "perception/B200", "'B200'"]),
    ("duplicate offer", _dup_offer, ["aws/us-east-1/H100", "duplicate"]),
    ("duplicate quota", _dup_quota, ["perception/H100@*", "duplicate"]),
    ("nominal over capacity", _set("quotas", 0, "nominal", 1000), ["perception/H100@*", "1000", "exceeds"]),
    (
        "nominal over provider capacity",
        _set("quotas", 1, "provider", "coreweave"),
        ["language/H100@coreweave", "0 H100"],
    ),
    ("lending above nominal", _set("quotas", 0, "lending_limit", 17), ["perception/H100@*", "lending_limit 17"]),
    ("zero throughput", _zero_throughput, ["throughput.training", "> 0"]),
    ("two cohorts for a team", _other_cohort, ["language/L40S@*", "one cohort"]),
    ("bad provider name", _set("offers", 0, "provider", "AWS East"), ["offers[0]", "AWS East"]),
]


@pytest.mark.parametrize(("mutate", "words"), [(m, w) for _, m, w in BAD], ids=[n for n, _, _ in BAD])
def test_bad_item_is_named(mutate: Callable[[dict[str, Any]], None], words: list[str]) -> None:
    data = raw()
    parse_catalog(copy.deepcopy(data), "cat.yaml")  # the unmutated example is valid
    mutate(data)
    with pytest.raises(UsageError) as err:
        parse_catalog(data, "cat.yaml")
    message = str(err.value)
    assert message.startswith("cat.yaml: ")
    for word in words:
        assert word in message


def test_nominal_within_provider_capacity_is_fine() -> None:
    data = raw()
    data["quotas"][1].update(provider="lambda", nominal=16, borrowing_limit=None)
    cat = parse_catalog(data)
    assert cat.quotas[1].provider == "lambda"


def test_a_catalogue_needs_offers() -> None:
    data = raw()
    data["offers"], data["quotas"] = [], []
    with pytest.raises(UsageError, match="offers"):
        parse_catalog(data)


def test_malformed_and_non_mapping_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("offers: [\n", encoding="utf-8")
    with pytest.raises(UsageError, match="malformed YAML"):
        load_catalog(bad)
    bad.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(UsageError, match="must be a YAML mapping"):
        load_catalog(bad)
    with pytest.raises(UsageError, match="cannot read catalogue"):
        load_catalog(tmp_path / "missing.yaml")


def test_gpu_type_name_defaults_to_its_key_and_must_match() -> None:
    data = raw()
    assert isinstance(parse_catalog(data), Catalog)
    data["gpu_types"]["H100"]["name"] = "H200"
    with pytest.raises(UsageError, match="differs from its key"):
        parse_catalog(data)


JOB = {"name": "a", "entrypoint": "m.n:f", "resources": {"gpu_type": "H100", "gpus": 8}}


def test_batch_list_or_jobs_mapping(tmp_path: Path) -> None:
    assert [j.name for j in parse_batch([JOB, {**JOB, "name": "b"}])] == ["a", "b"]
    assert [j.name for j in parse_batch({"jobs": [JOB]})] == ["a"]
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump({"jobs": [JOB]}), encoding="utf-8")
    assert load_batch(path)[0].resources.gpus == 8
    with pytest.raises(UsageError, match="non-empty YAML list"):
        parse_batch({"name": "a"})
    with pytest.raises(SpecError, match=r"jobs\[1\]: resources.gpus"):
        parse_batch([JOB, {**JOB, "name": "b", "resources": {"gpus": -1}}], "b.yaml")


def test_job_with_unknown_gpu_type_names_job_and_type() -> None:
    cat = load_catalog(EXAMPLE)
    job = parse_spec({**JOB, "name": "lost", "resources": {"gpu_type": "A100", "gpus": 1}})
    with pytest.raises(UsageError, match=r"job 'lost': unknown gpu_type 'A100'") as err:
        check_jobs([job], cat)
    assert "ask for one of them (resources.gpu_type" in str(err.value) and "--catalog" in str(err.value)
    choice = parse_spec({**JOB, "name": "picky", "placement": {"any_of": [{"gpu_type": "TPUv5"}]}})
    with pytest.raises(UsageError, match=r"job 'picky': unknown gpu_type 'TPUv5'"):
        check_jobs([choice], cat)
    with pytest.raises(UsageError, match="appears twice"):
        check_jobs([parse_spec(JOB), parse_spec(JOB)], cat)
    with pytest.raises(UsageError, match=r"deadline_hours needs placement\.gpu_hours"):
        check_jobs([parse_spec({**JOB, "placement": {"deadline_hours": 3}})], cat)
