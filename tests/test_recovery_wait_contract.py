"""What ``distributed.recovery: wait`` changes in the backend-to-process contract, without starting a rank."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import SpecError
from gpufleet.jobs.protocol import entry_argv, job_environment, rerun_argv
from gpufleet.spec import JobSpec, parse_spec


def group(entrypoint: Any, recovery: str = "wait") -> JobSpec:
    return parse_spec(
        {
            "name": "g",
            "entrypoint": entrypoint,
            "resources": {"gpus": 2},
            "distributed": {"strategy": "ddp", "recovery": recovery, "recovery_timeout_seconds": 45},
        }
    )


def test_a_script_under_wait_runs_through_the_launcher_that_can_re_run_it() -> None:
    argv = entry_argv(group("python train.py --lr 3e-3"))
    assert argv[argv.index("--") + 1 :] == ["-m", "gpufleet.runtime.launch", "--script", "train.py", "--lr", "3e-3"]
    module = entry_argv(group(["python3", "-m", "pkg.train", "--x"]))
    assert module[module.index("--") + 1 :] == ["-m", "gpufleet.runtime.launch", "--module", "pkg.train", "--x"]
    plain = entry_argv(group("python train.py", recovery="requeue"))
    assert plain[plain.index("--") + 1 :] == ["train.py"]


@pytest.mark.parametrize("command", ["bash run.sh", "python -u train.py", "python -m", "/usr/bin/python3 train.py"])
def test_a_command_that_cannot_be_re_run_in_process_is_refused_under_wait(command: str) -> None:
    with pytest.raises(SpecError, match="recovery: wait re-runs each surviving rank") as err:
        group(command)
    assert "python train.py" in str(err.value) and "recovery: requeue" in str(err.value)
    assert group(command, recovery="requeue").command is not None  # requeue runs any command
    assert rerun_argv(command.split()) is None


def test_wait_exports_the_recovery_and_its_timeout_and_requeue_exports_nothing(tmp_path: Path) -> None:
    env = job_environment(group("gpufleet.workloads.tinylm:train"), 1, tmp_path, "local")
    assert env["GPUFLEET_RECOVERY"] == "wait" and float(env["GPUFLEET_RECOVERY_TIMEOUT_S"]) == 45.0
    plain = job_environment(group("gpufleet.workloads.tinylm:train", recovery="requeue"), 1, tmp_path, "local")
    assert "GPUFLEET_RECOVERY" not in plain and "GPUFLEET_RECOVERY_TIMEOUT_S" not in plain
    assert sys.executable in entry_argv(group("gpufleet.workloads.tinylm:train"))[0]
