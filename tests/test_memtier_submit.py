"""A job whose memory tier cannot fit this host is refused at submit, with the numbers, before anything is stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_refused, run_cli

from gpufleet.backends.local import LocalBackend
from gpufleet.backends.local import backend as local_backend
from gpufleet.errors import UsageError
from gpufleet.runtime.memtier import tier_need_bytes
from gpufleet.spec import parse_spec

TINYLM = "name: tier\nentrypoint: gpufleet.workloads.tinylm:train\n"


@pytest.fixture
def no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpufleet.backends.local.process.ensure_scheduler", lambda home: None)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_memory_tier_larger_than_shared_memory_is_refused_at_submit_with_its_numbers(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, no_scheduler: None
) -> None:
    # 12 bytes a parameter (fp32 weights, AdamW's two moments) of >= 64 * 12 * 16384**2 parameters: terabytes
    spec = write(tmp_path / "big.yaml", TINYLM + "args: {layers: 64, embed: 16384}\ncheckpoint: {memory: {}}\n")
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(spec))
    line = assert_refused(code, err, home, "checkpoint.memory needs", "bytes of shared memory", "free")
    big = {"name": "tier", "entrypoint": "gpufleet.workloads.tinylm:train", "args": {"layers": 64, "embed": 16384}}
    state_bytes = local_backend.memory_state_bytes(parse_spec(big))
    assert state_bytes is not None and f"about {state_bytes} bytes" in line
    assert state_bytes >= 12 * 64 * 12 * 16384**2


def test_the_submit_check_reads_the_free_space_of_shared_memory_and_ram(
    home: Path, monkeypatch: pytest.MonkeyPatch, no_scheduler: None
) -> None:
    spec = parse_spec({"name": "tier", "entrypoint": "gpufleet.workloads.tinylm:train", "checkpoint": {"memory": {}}})
    state_bytes = local_backend.memory_state_bytes(spec) or 0
    need, need_ram = tier_need_bytes(state_bytes, 1, own_keeper=True)
    assert need == 4 * state_bytes and need_ram == 6 * state_bytes  # 4 files in /dev/shm, 2 copies in the keeper
    backend = LocalBackend(home, spawn=False)
    monkeypatch.setattr(local_backend, "room", lambda shm: (need - 1, 1 << 50))
    with pytest.raises(UsageError, match=f"needs {need} bytes of shared memory \\({need - 1} free\\)"):
        backend.submit(spec)
    assert not home.exists() or not any(home.rglob("*"))
    monkeypatch.setattr(local_backend, "room", lambda shm: (1 << 50, need_ram - 1))  # the job's keeper too
    with pytest.raises(UsageError, match=f"{need_ram} of RAM \\({need_ram - 1} available\\)"):
        backend.submit(spec)
    monkeypatch.setenv("GPUFLEET_MEMORY_PEER", "127.0.0.1:7070")  # another node's keeper: only /dev/shm here
    monkeypatch.setattr(local_backend, "room", lambda shm: (need, need))
    assert backend.submit(spec) == 1


def test_a_job_the_estimate_cannot_size_or_without_a_memory_tier_is_not_checked(
    home: Path, monkeypatch: pytest.MonkeyPatch, no_scheduler: None
) -> None:
    monkeypatch.setattr(local_backend, "room", lambda shm: (0, 0))
    backend = LocalBackend(home, spawn=False)
    toy = {"name": "toy", "entrypoint": "gpufleet.workloads.toy:train", "checkpoint": {"memory": {}}}
    assert backend.submit(parse_spec(toy)) == 1  # the runtime checks it at its first snapshot
    assert backend.submit(parse_spec({"name": "tier", "entrypoint": "gpufleet.workloads.tinylm:train"})) == 2
    odd = {**toy, "entrypoint": "gpufleet.workloads.tinylm:train", "args": {"embed": "wide"}}
    assert backend.submit(parse_spec(odd)) == 3
