"""Fleet files: what the local backend accepts as its pools, and the one-line refusals of everything else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_cli

from gpufleet.errors import UsageError
from gpufleet.placement.fleetfile import load_fleet, parse_fleet

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local-fleet.yaml"


def fleet(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    data.update(changes)
    return data


def test_the_example_pools_its_offers_with_their_slots() -> None:
    loaded = load_fleet(EXAMPLE)
    assert [o.key for o in loaded.catalog.offers] == [p.offer for p in loaded.pools]
    assert loaded.storm_rate("aws/us-east-1/H100", 120) == 360 and loaded.storm_rate("aws/us-east-1/H100", 10) == 0
    assert loaded.failover.policy().window_hours == pytest.approx(10 / 60)


def test_slots_become_the_planners_capacity_and_pools_can_be_left_out() -> None:
    data = fleet(pools=[{"offer": "aws/us-east-1/H100", "slots": 3}, {"offer": "coreweave/us-east-04/L40S"}])
    data["quotas"] = []
    loaded = parse_fleet(data)
    assert [(o.key, o.capacity_gpus) for o in loaded.catalog.offers] == [
        ("aws/us-east-1/H100", 3),
        ("coreweave/us-east-04/L40S", 2),
    ]
    everything = parse_fleet({k: v for k, v in fleet().items() if k != "pools"})
    assert len(everything.pools) == 3


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pools": [{"offer": "aws/eu-west-1/H100"}]}, "unknown offer 'aws/eu-west-1/H100'"),
        ({"pools": [{"offer": "aws/us-east-1/H100"}, {"offer": "aws/us-east-1/H100"}]}, "pooled twice"),
        ({"pools": []}, "pools is empty"),
        ({"pools": [{"offer": "aws/us-east-1/H100", "slots": -1}]}, "slots"),
        (
            {
                "pools": [
                    {"offer": "aws/us-east-1/H100", "storms": [{"start_s": 5, "end_s": 1, "preemptions_per_hour": 1}]}
                ]
            },
            "end_s 1 is not after start_s 5",
        ),
        (
            {
                "pools": [
                    {
                        "offer": "aws/us-east-1/H100",
                        "storms": [{"start_s": 0, "end_s": 9, "preemptions_per_hour": float("nan")}],
                    }
                ]
            },
            "preemptions_per_hour",
        ),
        ({"failover": {"preemptions": 0}}, "failover.preemptions"),
        ({"seed": -1}, "seed"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_bad_fleet_file_is_refused_naming_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_fleet(fleet(**changes))


def test_a_quota_larger_than_the_pooled_slots_or_lending_more_than_it_has_is_refused() -> None:
    small = fleet(pools=[{"offer": "aws/us-east-1/H100", "slots": 1}, {"offer": "coreweave/us-east-04/L40S"}])
    with pytest.raises(UsageError, match="nominal 2 exceeds the 1 H100 GPUs"):
        parse_fleet(small)
    lender = fleet()
    lender["quotas"][0]["lending_limit"] = 5
    with pytest.raises(UsageError, match="lending_limit 5 exceeds nominal 2"):
        parse_fleet(lender)
    negative = fleet()
    negative["offers"][0]["spot_per_gpu_hour"] = -1
    with pytest.raises(UsageError, match="negative"):
        parse_fleet(negative)


def test_the_fleet_commands(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run_cli(capsys, monkeypatch, "fleet", "show", "--json")
    assert code == 0 and json.loads(out) == {"fleet": None}
    assert not home.exists()  # showing nothing writes nothing
    code, _, err = run_cli(capsys, monkeypatch, "fleet", "down", "aws")
    assert code == 2 and "has no fleet" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(fleet(pools=[{"offer": "nope/x/H100"}])))
    code, _, err = run_cli(capsys, monkeypatch, "fleet", "use", str(bad))
    assert code == 2 and "unknown offer 'nope/x/H100'" in err and len(err.strip().splitlines()) == 1
    assert not (home / "fleet" / "fleet.yaml").exists()
    code, out, _ = run_cli(capsys, monkeypatch, "fleet", "use", str(EXAMPLE), "--json")
    assert code == 0 and [p["state"] for p in json.loads(out)["pools"]] == ["up", "up", "up"]
    code, _, err = run_cli(capsys, monkeypatch, "fleet", "down", "azure")
    assert code == 2 and "'azure' is not in the fleet" in err
    code, out, _ = run_cli(capsys, monkeypatch, "fleet", "down", "aws/us-east-1", "--abrupt", "--json")
    assert code == 0 and json.loads(out) == {"down": {"aws/us-east-1": True}}
    code, out, _ = run_cli(capsys, monkeypatch, "fleet", "show", "--json")
    assert [p["state"] for p in json.loads(out)["pools"]] == ["down", "up", "up"]
    code, _, err = run_cli(capsys, monkeypatch, "fleet", "up", "gcp")
    assert code == 2 and "gcp is not marked down" in err
    code, out, _ = run_cli(capsys, monkeypatch, "fleet", "up", "aws/us-east-1", "--json")
    assert code == 0 and json.loads(out) == {"down": {}}
    code, out, _ = run_cli(capsys, monkeypatch, "fleet", "off", "--json")
    assert code == 0 and json.loads(out)["was_in_use"] is True


def test_damaged_fleet_state_files_are_one_line_or_ignored(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_cli(capsys, monkeypatch, "fleet", "use", str(EXAMPLE))[0] == 0
    marks = home / "fleet" / "marks.json"
    marks.write_text("[" * 50_000)  # not what gpufleet wrote: read as no marks
    code, out, _ = run_cli(capsys, monkeypatch, "fleet", "show", "--json")
    assert code == 0 and json.loads(out)["down"] == {}
    marks.unlink()
    marks.mkdir()
    code, _, err = run_cli(capsys, monkeypatch, "fleet", "down", "aws")
    assert code == 2 and "is not a regular file" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, monkeypatch, "fleet", "off")
    assert code == 2 and "is not a regular file" in err
    marks.rmdir()
    lock = home / "fleet" / "marks.lock"
    lock.unlink(missing_ok=True)
    code, _, err = run_cli(capsys, monkeypatch, "fleet", "up", "aws")
    assert code == 2 and "not marked down" in err and not lock.exists()
