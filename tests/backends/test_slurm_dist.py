"""Jobs of several ranks on the Slurm backend, without a cluster: sbatch and srun arguments, each
task's rank variables, and the batch script run for real against a fake ``srun`` and ``scontrol``."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_slurm_unit import FakeSlurm

from gpufleet.backends.base import Feature
from gpufleet.backends.slurm.backend import (
    SlurmBackend,
    allocated_cpus,
    batch_script,
    runs_ranks,
    sbatch_argv,
    slurm_usage,
    srun_argv,
)
from gpufleet.backends.slurm.rank import first_host, master_port, node_address, rank_environment, tasks_on_node
from gpufleet.jobs.protocol import rank_argv
from gpufleet.paths import job_dir
from gpufleet.runtime.group import lost_marker
from gpufleet.spec import JobSpec, parse_spec


def dist_spec(**resources: int) -> JobSpec:
    return parse_spec(
        {
            "name": "lm-ddp",
            "team": "perception",
            "entrypoint": ["python", "train.py", "--name", "$(rm -rf /)"],
            "resources": {"nodes": 1, "gpus": 2, "cpus": 4, **resources},
            "distributed": {"strategy": "ddp", "timeout_seconds": 60},
        }
    )


def script_launcher(nodes: int) -> JobSpec:
    return dist_spec(nodes=nodes).copy_with(distributed={"strategy": "ddp", "launcher": "script"})


# ---- sbatch and srun -------------------------------------------------------------------------


def test_sbatch_asks_for_one_task_per_rank_with_its_share_of_the_cpus(tmp_path: Path) -> None:
    argv = sbatch_argv(dist_spec(), 7, tmp_path, tmp_path / "job.sbatch")
    at = argv.index("--nodes=1")
    assert argv[at + 1 : at + 3] == ["--ntasks-per-node=2", "--cpus-per-task=2"]
    assert "--ntasks=1" not in argv and "--gres=gpu:2" in argv and "--requeue" in argv
    two_nodes = sbatch_argv(dist_spec(nodes=2, gpus=1, cpus=3), 7, tmp_path, tmp_path / "job.sbatch")
    assert {"--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=3", "--gres=gpu:1"} <= set(two_nodes)  # gres per node
    assert allocated_cpus(dist_spec(nodes=2, gpus=1, cpus=3)) == 6 and allocated_cpus(dist_spec(cpus=3)) == 2


def test_srun_runs_every_rank_behind_the_rank_shim_and_kills_only_a_stuck_one() -> None:
    spec = dist_spec(nodes=2)
    argv = srun_argv(spec)
    split = argv.index("--")
    assert argv[:4] == ["srun", "--label", "--kill-on-bad-exit=0", "--wait=120"]  # the 60 s group timeout + 60
    assert {"--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=2"} <= set(argv[:split])
    assert argv[split - 3 : split] == [sys.executable, "-m", "gpufleet.backends.slurm.rank"]
    assert argv[split + 1 :] == rank_argv(spec) == [sys.executable, "train.py", "--name", "$(rm -rf /)"]


def test_a_script_launcher_runs_once_per_node() -> None:
    assert not runs_ranks(script_launcher(1))  # one process that starts its own ranks, as on the local backend
    argv = srun_argv(script_launcher(2))
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--per-node"} <= set(argv)


def test_one_rank_keeps_the_exec_script(tmp_path: Path) -> None:
    one = dist_spec().copy_with(distributed=None, resources={"gpus": 1, "cpus": 2})
    assert (
        not runs_ranks(one)
        and "execvp" in batch_script(one, 7, tmp_path)
        and "srun" not in batch_script(one, 7, tmp_path)
    )
    assert {"--nodes=1", "--ntasks=1", "--cpus-per-task=2"} <= set(sbatch_argv(one, 7, tmp_path, tmp_path / "s"))


def test_group_batch_script_notes_signals_first_and_runs_srun_as_a_child(tmp_path: Path) -> None:
    script = batch_script(dist_spec(), 7, tmp_path)
    tree = ast.parse(script)  # valid Python; values are literals
    assert script.startswith(f"#!{sys.executable}\n") and "execvp" not in script and "shell" not in script
    first = [type(node).__name__ for node in tree.body[:3]]
    assert first == ["Import", "Assign", "For"] and "signal.SIGTERM" in ast.unparse(tree.body[2])  # before anything
    assert "run_group(spec['srun'], attempt, signals.stops, signals.adopt)" in ast.unparse(tree.body[-1])
    payload = next(n for n in ast.walk(tree) if isinstance(n, ast.Constant) and str(n.value).startswith('{"srun"'))
    assert json.loads(str(payload.value))["srun"] == srun_argv(dist_spec())
    assert script.count("$(rm -rf /)") == 1  # only inside that literal


def test_backend_declares_ranks_and_nodes_and_submits_them(home: Path) -> None:
    assert {Feature.MULTI_RANK, Feature.MULTI_NODE} <= SlurmBackend.features
    fake = FakeSlurm()
    job_id = SlurmBackend(home, runner=fake).submit(dist_spec(nodes=2, gpus=1))
    (sbatch,) = fake.calls
    assert "--nodes=2" in sbatch and "run_group" in (job_dir(home, job_id) / "job.sbatch").read_text()


def test_usage_counts_the_cpus_of_every_task(home: Path) -> None:
    """A CPU-only cluster bills the job's CPUs: nodes x tasks x CPUs per task, what sbatch asked for."""
    fake = FakeSlurm(sacct="4242|COMPLETED|2026-12-02T10:00:00|2026-12-02T10:01:00|0:0|60|cpu=6,node=2|perception\n")
    backend = SlurmBackend(home, runner=fake)
    backend.submit(dist_spec(nodes=2, gpus=1, cpus=3))
    backend.sync()
    report = slurm_usage(backend.store, runner=fake)
    assert report["ok"] and report["accounts"][0]["ledger_seconds"] == 360, report


# ---- each task's variables -------------------------------------------------------------------

# What srun gave the second task of a 2-task step on one node and on two nodes (dev Slurm 22.05).
ONE_NODE = {
    "SLURM_JOB_ID": "68",
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_JOB_NODELIST": "vm",
    "SLURM_STEP_NODELIST": "vm",
}
TWO_NODES = {
    **ONE_NODE,
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_JOB_NODELIST": "vm,vm-2",
    "SLURM_STEP_NODELIST": "vm,vm-2",
    "GPUFLEET_MASTER_ADDR": "127.0.0.1",
}


def test_rank_environment_maps_slurm_tasks_to_torch_ranks() -> None:
    assert rank_environment(ONE_NODE) == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "0",
        "MASTER_ADDR": "vm",
        "MASTER_PORT": str(master_port(68)),
        "PYTHONUNBUFFERED": "1",
    }
    two = rank_environment(TWO_NODES)
    assert (two["RANK"], two["LOCAL_RANK"], two["LOCAL_WORLD_SIZE"], two["NODE_RANK"]) == ("1", "0", "1", "1")
    assert two["MASTER_ADDR"] == "127.0.0.1"  # as the batch script resolved it, not the name
    assert rank_environment(TWO_NODES, per_node=True).keys() == {
        "NODE_RANK",
        "NNODES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PYTHONUNBUFFERED",
    }
    with pytest.raises(ValueError, match="SLURM_PROCID is not set"):
        rank_environment({k: v for k, v in ONE_NODE.items() if k != "SLURM_PROCID"})


def test_master_port_is_the_same_for_every_rank_and_above_the_ephemeral_range() -> None:
    assert master_port(68) == master_port(68) != master_port(69)
    assert all(61000 <= master_port(j) < 65000 for j in (1, 3999, 4000, 10**9))


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("vm", "vm"),
        ("vm,vm-2", "vm"),
        ("node[03-04],gpu1", "node03"),
        ("gpu[7,2-3]", "gpu7"),
        ("rack[2-3]-ib", "rack2-ib"),
    ],
)
def test_first_host_of_a_hostlist(nodelist: str, first: str) -> None:
    assert first_host(nodelist) == first


def test_tasks_on_node_and_node_address() -> None:
    assert [tasks_on_node("2(x3),1", n) for n in range(4)] == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="cannot read"):
        tasks_on_node("two", 0)
    assert (
        node_address("vm-2", lambda argv: "NodeName=vm-2 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=vm") == "127.0.0.1"
    )

    def down(argv: list[str]) -> str:
        raise subprocess.CalledProcessError(1, argv)

    assert node_address("vm-2", down) == "vm-2"


def test_rank_shim_sets_the_variables_then_becomes_the_rank() -> None:
    env = {**os.environ, **TWO_NODES}
    show = "import json, os; print(json.dumps({k: os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'MASTER_PORT')}))"
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet.backends.slurm.rank", "--", sys.executable, "-c", show],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(out.stdout) == {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": str(master_port(68))}
    bad = subprocess.run(
        [sys.executable, "-m", "gpufleet.backends.slurm.rank", "true"], capture_output=True, timeout=60
    )
    assert bad.returncode == 2 and b"after `--`" in bad.stderr


# ---- the batch script, run for real ----------------------------------------------------------

FAKE_SRUN = """#!{python}
import json, os, signal, sys, time
out = os.environ["FAKE_OUT"]
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
with open(os.path.join(out, "srun.json"), "w") as fh:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, fh)
mode, code = os.environ["FAKE_SRUN"].split(":")
events, attempt = os.environ["GPUFLEET_EVENTS"], int(os.environ["GPUFLEET_ATTEMPT"])
if mode == "requeue":  # rank 0 saved and said so, then torch's ranks exit non-zero
    with open(events, "a") as fh:
        end = {{"ts": time.time(), "attempt": attempt, "kind": "session_end", "status": "requeue"}}
        fh.write(json.dumps(end) + "\\n")
if mode == "lost":
    open(os.path.join(os.environ["GPUFLEET_JOB_DIR"], f"rank-lost-attempt-{{attempt}}"), "w").close()
if mode == "wait":
    open(os.path.join(out, "srun-ready"), "w").close()
    while not os.path.exists(os.path.join(out, "release")):
        time.sleep(0.02)
with open(os.path.join(out, "srun-signals.json"), "w") as fh:
    json.dump(got, fh)
sys.exit(int(code))
"""

FAKE_SCONTROL = """#!/bin/sh
echo "NodeName=$4 Arch=x86_64 NodeAddr=10.1.2.3 NodeHostName=$4"
"""


def run_batch(home: Path, tmp_path: Path, mode: str, *, restart: int = 0, signal_it: bool = False) -> tuple[int, Any]:
    """Submit a 2-rank job to a fake sbatch, run its script as slurmd would; its exit status and what srun saw."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN.format(python=sys.executable)), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    backend = SlurmBackend(home, runner=FakeSlurm())
    job_id = backend.submit(dist_spec())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "vm,vm-2",
        "FAKE_OUT": str(out),
        "FAKE_SRUN": mode,
        **({"SLURM_RESTART_COUNT": str(restart)} if restart else {}),
    }
    proc = subprocess.Popen([str(job_dir(home, job_id) / "job.sbatch")], env=env)
    if signal_it:
        deadline = time.monotonic() + 60
        while not (out / "srun-ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "fake srun never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # what Slurm sends the batch step at a preemption
        time.sleep(0.3)
        assert proc.poll() is None  # it outlives the signal, to wait for srun
        (out / "release").touch()
    code = proc.wait(timeout=60)
    seen = json.loads((out / "srun.json").read_text())
    seen["signals"] = json.loads((out / "srun-signals.json").read_text())
    seen["log"] = (job_dir(home, job_id) / "logs" / f"attempt-{restart + 1}.log").read_text()
    seen["job_dir"] = job_dir(home, job_id)
    return code, seen


@pytest.mark.parametrize(
    ("mode", "status"),
    # srun's 137 (a task killed by SIGKILL: kill -9, the OOM killer) is a lost rank even without the marker,
    # which the survivors may not have had time to leave before srun killed them.
    [("exit:0", 0), ("exit:3", 3), ("requeue:1", 75), ("lost:137", 75), ("exit:137", 75), ("lost:0", 0)],
)
def test_batch_script_exits_with_the_groups_status(home: Path, tmp_path: Path, mode: str, status: int) -> None:
    code, seen = run_batch(home, tmp_path, mode)
    assert code == status
    assert seen["argv"] == srun_argv(dist_spec())[1:]
    env = seen["env"]
    assert env["GPUFLEET_ATTEMPT"] == "1" and env["GPUFLEET_WORLD_SIZE"] == "2" and env["OMP_NUM_THREADS"] == "2"
    assert env["GPUFLEET_MASTER_ADDR"] == "10.1.2.3"  # the first node's NodeAddr
    assert f"rendezvous at 10.1.2.3:{master_port(4242)}" in seen["log"]


def test_batch_script_outlives_sigterm_and_does_not_forward_it(home: Path, tmp_path: Path) -> None:
    code, seen = run_batch(home, tmp_path, "wait:75", restart=1, signal_it=True)
    assert code == 75 and seen["signals"] == []  # Slurm signals each rank itself: none from the script
    assert seen["env"]["GPUFLEET_ATTEMPT"] == "2"
    starts = [json.loads(line) for line in (seen["job_dir"] / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["attempt"], e["slurm_job_id"]) for e in starts] == [("attempt_start", 2, "4242")]
    assert not lost_marker(seen["job_dir"], 2).exists()
