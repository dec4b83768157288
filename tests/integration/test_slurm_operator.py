"""`gpufleet slurm ...` against the real cluster: each gesture runs, prints its native command, and acts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gpufleet.backends.slurm.backend import SlurmBackend, run_slurm
from gpufleet.errors import ServiceUnavailable
from gpufleet.spec import parse_spec


def gpufleet(home: Path, *args: str, check: int = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFLEET_HOME": str(home), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "gpufleet.cli", *args], capture_output=True, text=True, env=env)
    assert proc.returncode == check, (proc.stdout, proc.stderr)
    return proc


def slurm_state(ref: str) -> str:
    return run_slurm(["squeue", "-h", "-j", ref, "-o", "%T"]).stdout.strip()


def test_hold_release_and_requeue_a_job(slurm: dict[str, str], home: Path) -> None:
    backend = SlurmBackend(home)
    spec = parse_spec(
        {
            "name": "held",
            "team": "perception",
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": 5, "step_seconds": 0.01},
            "resources": {"cpus": 2, "gpus": 0},
        }
    )
    blocker = backend.submit(spec.copy_with(name="blocker", args={"steps": 10_000, "step_seconds": 0.01}))
    job = backend.submit(spec)  # waits behind the blocker, which holds both CPUs
    ref = backend.store.job(job).backend_ref
    assert ref
    held = gpufleet(home, "slurm", "hold", str(job))
    assert f"scontrol hold {ref}" in held.stdout
    assert slurm_state(ref) == "PENDING"
    reason = run_slurm(["squeue", "-h", "-j", ref, "-o", "%r"]).stdout.strip()
    assert "Held" in reason
    out = json.loads(gpufleet(home, "slurm", "release", f"slurm:{ref}", "--json").stdout)
    assert out["command"] == ["scontrol", "release", ref]
    gpufleet(home, "submit", "--help")  # the CLI stays importable with a Slurm job in the store
    gpufleet(home, "slurm", "hold", "nosuch", check=2)
    backend.cancel(blocker)
    backend.cancel(job)


def test_account_add_and_list(slurm: dict[str, str], home: Path) -> None:
    team = f"robotics{uuid.uuid4().hex[:6]}"
    added = gpufleet(home, "slurm", "account", "add", team, "--fairshare", "7")
    assert f"sacctmgr -i add account {team}" in added.stdout
    listing = json.loads(gpufleet(home, "slurm", "account", "list", "--json").stdout)
    assert any(a["account"] == team and a["fairshare"] == "7" for a in listing["associations"])
    again = gpufleet(home, "slurm", "account", "add", team)  # adding it twice is not an error
    assert "already exists" in again.stdout


def test_drain_and_resume_the_node(slurm: dict[str, str], home: Path) -> None:
    node = run_slurm(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()[0]
    try:
        gpufleet(home, "slurm", "drain", node, "--reason", "gpufleet test")
        state = run_slurm(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout
        assert "drain" in state
    finally:
        gpufleet(home, "slurm", "resume", node)
    assert "drain" not in run_slurm(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout


def test_missing_client_commands_say_how_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ServiceUnavailable, match="scripts/dev-slurm up") as caught:  # exit 3, not "bad input"
        run_slurm(["sinfo"])
    assert caught.value.exit_code == 3
