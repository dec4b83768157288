"""``gpufleet debug resume-check`` on distributed specs: 2 ranks on this machine, sharded final states gathered.

Each check runs three attempts of two ranks (gloo on CPU) through the group launcher, as the local
backend starts them, without ``GPUFLEET_LOCAL_SLOTS``. The CLI runs as a subprocess with a generous
timeout, a safety net only: a rank that never exits fails the test instead of blocking the suite.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.devtools.resumecheck import compare_final_states, final_checkpoint
from gpufleet.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
DDP_PORT = REPO / "tests" / "ports" / "ddp_sampler_port.py"
TWO_RANKS = {"resources": {"gpu_type": "cpu", "gpus": 2, "cpus": 2}, "checkpoint": {"every_steps": 2}}
SAFETY_NET_S = 900


def write_spec(tmp_path: Path, name: str, strategy: str = "ddp", **fields: Any) -> Path:
    path = tmp_path / f"{name}.yaml"
    spec = {"name": name, **TWO_RANKS, "distributed": {"strategy": strategy, "timeout_seconds": 60}, **fields}
    path.write_text(yaml.safe_dump(spec))
    return path


def resume_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "debug", "resume-check", *args],
        capture_output=True,
        text=True,
        timeout=SAFETY_NET_S,
        check=False,
    )


def test_a_ddp_job_resumes_exactly_with_every_rank_compared(tmp_path: Path, home: Path) -> None:
    args = {"steps": 6, "embed": 16, "context": 8, "batch_size": 4, "layers": 1, "heads": 2, "eval_batches": 1}
    spec = write_spec(tmp_path, "tiny-ddp", entrypoint="gpufleet.workloads.tinylm:train", args=args)
    kept = tmp_path / "kept"
    proc = resume_check(str(spec), "--keep", str(kept))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("exact: tiny-ddp (2 ranks) preempted at step 3 of 6, resumed in a new process")
    assert "gathered from the 2 ranks' shards with every rank's RNG states" in proc.stdout
    assert "preempted, attempt 1: exit 75" in proc.stderr and "preempted, attempt 2: exit 0" in proc.stderr

    job = load_spec(spec)
    (step, uninterrupted), (_, resumed) = (final_checkpoint(kept / "jobs" / n, job) for n in ("1", "2"))
    assert step == 6 and {"model", "optimizer", "trainer", "rank-00000", "rank-00001"} <= set(resumed)
    assert uninterrupted["trainer"]["step"] == 6  # the trainer blob, gathered as its value
    rng = resumed["rank-00001"]["rng"]["torch"].clone()
    rng[-1] ^= 1
    resumed["rank-00001"]["rng"]["torch"] = rng
    found = compare_final_states(uninterrupted, resumed)
    assert found.tensors == ["rank-00001.rng.torch"], found  # rank 1's own state is compared, not only rank 0's


@pytest.mark.slow  # make soak; make test catches a naive single-process port (test_resume_check.py)
def test_a_ddp_port_whose_loader_draws_from_the_global_rng_is_caught(tmp_path: Path, home: Path) -> None:
    # 32 rows, 2 ranks, 4 per batch: 4 steps an epoch; the preemption at step 3 resumes mid-epoch, where
    # the rebuilt DataLoader iterator draws one seed more from the restored RNG and dropout shifts.
    command = f"python {DDP_PORT} 2 --batch_size 4 --samples 32 --snapshot_path {tmp_path / 'snapshot.pt'}"
    spec = write_spec(tmp_path, "ddp-port", entrypoint=command, workdir=str(tmp_path))
    proc = resume_check(str(spec), "--at", "3", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "differs" and report["failure"] is None and report["world_size"] == 2
    assert report["exit_codes"] == {"uninterrupted": [0], "preempted": [75, 0]}
    assert report["first_loss_step"] == 4
    first = report["first_tensor"]
    assert first.startswith("model.") and report["first_tensor_max_abs_diff"] > 0
    assert re.fullmatch(
        rf"{re.escape(first)} differs by up to [0-9.e+-]+ \(first at \[\d+(, \d+)*\]\)", report["first_difference"]
    )
    assert report["first_tensor_at"] is not None and report["tensors_differing"] >= 1
    assert any("DataLoader" in hint for hint in report["hints"])


def test_a_multi_node_spec_is_refused_before_anything_runs(tmp_path: Path, home: Path) -> None:
    spec = write_spec(
        tmp_path,
        "two-nodes",
        entrypoint="gpufleet.workloads.tinylm:train",
        resources={"gpu_type": "cpu", "nodes": 2, "gpus": 2, "cpus": 2},
    )
    kept = tmp_path / "kept"
    proc = resume_check(str(spec), "--keep", str(kept))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "'two-nodes' spans 2 nodes (resources.nodes)" in proc.stderr and "resources.nodes: 1" in proc.stderr
    assert not kept.exists() and not list(tmp_path.glob("**/events.jsonl"))
