"""`gpufleet show ID` names the memory tier's copies and the step each holds, as `ckpt list` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from gpufleet.backends.local import LocalBackend
from gpufleet.paths import job_dir
from gpufleet.runtime.memtier.shm import OwnStore, job_key
from gpufleet.spec import parse_spec


def test_show_lists_the_own_copies_of_a_job_with_a_memory_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home, shm = tmp_path / "home", tmp_path / "shm"
    monkeypatch.setenv("GPUFLEET_HOME", str(home))
    monkeypatch.setenv("GPUFLEET_SHM_DIR", str(shm))
    spec = {"name": "ram", "entrypoint": "gpufleet.workloads.toy:train", "checkpoint": {"memory": {"every_steps": 1}}}
    backend = LocalBackend(home, spawn=False)
    job = backend.submit(parse_spec(spec))
    plain = backend.submit(parse_spec({"name": "disk", "entrypoint": "gpufleet.workloads.toy:train"}))
    store = OwnStore(shm, job_key(job_dir(home, job)), rank=0)
    for step in (6, 7):
        store.write(step, {"w": torch.zeros(2)}, fingerprint=None)

    code, out, err = run_cli(capsys, monkeypatch, "show", str(job), "--json")
    assert code == 0, err
    memory = json.loads(out)["memory"]
    assert memory["own"] == {"0": [7, 6]}

    code, out, err = run_cli(capsys, monkeypatch, "show", str(job))
    assert code == 0, err
    assert "memory tier" in out and "7 6" in out

    code, out, err = run_cli(capsys, monkeypatch, "show", str(plain), "--json")
    assert code == 0, err
    assert "memory" not in json.loads(out)
