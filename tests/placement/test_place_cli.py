"""``gpufleet place``: exit codes, ``--json``, ``--explain`` and ``--block``, through a tiny Typer app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner, Result

from gpufleet.cli.place import place_command
from gpufleet.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "examples" / "catalog.yaml"
BATCH = REPO / "examples" / "batch.yaml"

app = typer.Typer()
app.command("place")(place_command)


@app.callback()
def _root() -> None:
    """Keep ``place`` a subcommand, as in the real app."""


def run(*args: str) -> Result:
    return CliRunner().invoke(app, ["place", *args], env={"COLUMNS": "220"})


def test_example_places_every_job_on_both_gpu_types() -> None:
    result = run(str(BATCH), "--catalog", str(CATALOG))
    assert result.exit_code == 0, result.output
    assert "H100" in result.output and "L40S" in result.output
    assert "infeasible" not in result.output


def test_json_is_one_object_with_every_decision() -> None:
    result = run(str(BATCH), "--catalog", str(CATALOG), "--json")
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    jobs = yaml.safe_load(BATCH.read_text(encoding="utf-8"))["jobs"]
    assert out["ok"] is True and [d["job"] for d in out["decisions"]] == [j["name"] for j in jobs]
    types = {d["choice"]["gpu_type"] for d in out["decisions"]}
    assert types == {"H100", "L40S"}
    assert all(d["rejected"] for d in out["decisions"])
    assert out["total_cost"] == pytest.approx(sum(d["choice"]["cost"]["total"] for d in out["decisions"]))


def test_infeasible_job_exits_1_and_still_prints_the_plan(tmp_path: Path) -> None:
    jobs = yaml.safe_load(BATCH.read_text(encoding="utf-8"))["jobs"]
    jobs.append({**jobs[0], "name": "huge", "resources": {"gpu_type": "H100", "gpus": 512}})
    batch = tmp_path / "batch.yaml"
    batch.write_text(yaml.safe_dump(jobs), encoding="utf-8")
    result = run(str(batch), "--catalog", str(CATALOG))
    assert result.exit_code == 1
    assert "infeasible" in result.output and "huge" in result.output and "over_capacity" in result.output
    assert "pretrain-1b" in result.output, "the placed jobs are printed too"
    as_json = run(str(batch), "--catalog", str(CATALOG), "--json")
    assert as_json.exit_code == 1
    out = json.loads(as_json.stdout)
    assert out["ok"] is False and out["infeasible"] == 1


def test_explain_lists_rejected_candidates() -> None:
    result = run(str(BATCH), "--catalog", str(CATALOG), "--explain")
    assert result.exit_code == 0
    assert "rejected" in result.output and "costlier" in result.output and "preference_order" in result.output


def test_block_moves_jobs_and_rejects_unknown_targets() -> None:
    plain = json.loads(run(str(BATCH), "--catalog", str(CATALOG), "--json").stdout)
    first = plain["decisions"][0]["choice"]["offer"]
    provider, region, _ = first.split("/")
    blocked = run(str(BATCH), "--catalog", str(CATALOG), "--json", "--block", f"{provider}/{region}")
    moved = json.loads(blocked.stdout)
    assert moved["blocked"] == [f"{provider}/{region}"]
    assert not moved["decisions"][0]["choice"]["offer"].startswith(f"{provider}/{region}/")
    bad = run(str(BATCH), "--catalog", str(CATALOG), "--block", "nowhere/us-east-1")
    assert isinstance(bad.exception, UsageError) and "matches no offer" in str(bad.exception)


def test_bad_catalogue_is_a_usage_error(tmp_path: Path) -> None:
    data = yaml.safe_load(CATALOG.read_text(encoding="utf-8"))
    data["offers"][0]["on_demand_per_gpu_hour"] = -1
    bad = tmp_path / "catalog.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = run(str(BATCH), "--catalog", str(bad))
    assert isinstance(result.exception, UsageError) and "aws/us-east-1/H100" in str(result.exception)


def test_worked_example_in_the_docs_is_the_real_output() -> None:
    doc = (REPO / "docs" / "placement.md").read_text(encoding="utf-8")
    command = "$ gpufleet place examples/batch.yaml --catalog examples/catalog.yaml --explain\n"
    shown = doc.split(command, 1)[1].split("```", 1)[0].strip("\n")
    result = CliRunner().invoke(
        app, ["place", str(BATCH), "--catalog", str(CATALOG), "--explain"], env={"COLUMNS": "140"}
    )
    printed = "\n".join(line.rstrip() for line in result.output.splitlines()).strip("\n")
    assert printed == shown
