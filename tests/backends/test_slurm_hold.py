"""Holding a Slurm job through the backend contract (``scontrol hold``/``release``), and its CLI aliases."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from backend_contract import SLEEPER, FakeSlurm, command_spec
from conftest import run_cli

from gpufleet.backends.slurm.backend import SlurmBackend, waiting_reason
from gpufleet.errors import Conflict


@pytest.fixture
def slurm() -> Iterator[FakeSlurm]:
    fake = FakeSlurm(cpus=1)
    yield fake
    fake.close()


def queued_behind_a_filler(home: Path, fake: FakeSlurm) -> tuple[SlurmBackend, int, int]:
    """A backend over ``fake``, a filler running on its one CPU, and a job pending behind it."""
    backend = SlurmBackend(home, runner=fake)
    filler = backend.submit(command_spec(SLEEPER, name="filler"))
    fake.tick()
    job = backend.submit(command_spec("pass", name="waits"))
    fake.tick()
    backend.sync()
    assert backend.store.job(job).state == "queued"
    return backend, filler, job


def test_hold_is_scontrol_hold_and_the_held_reason_survives_a_sync(home: Path, slurm: FakeSlurm) -> None:
    backend, _, job = queued_behind_a_filler(home, slurm)
    backend.hold(job)
    ref = backend.store.job(job).backend_ref
    assert ref is not None and slurm.jobs[int(ref)].held
    backend.sync()
    reason = backend.store.job(job).reason
    assert reason is not None and reason.startswith("held: `gpufleet release`") and "JobHeldUser" in reason
    assert [e.data.get("via") for e in backend.store.events(job, kinds=["held"])] == ["scontrol hold"]
    backend.release(job)
    assert not slurm.jobs[int(ref)].held
    with pytest.raises(Conflict, match=f"job {job} is not held: nothing to release"):
        backend.release(job)


def test_a_job_that_starts_before_scontrol_hold_is_released_again_and_the_hold_refused(
    home: Path, slurm: FakeSlurm
) -> None:
    backend, filler, job = queued_behind_a_filler(home, slurm)

    def starts_first(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if list(argv[:2]) == ["scontrol", "hold"]:  # the filler ends and the job starts, just before the hold
            slurm(["scancel", str(backend.store.job(filler).backend_ref)])
            slurm.jobs[int(str(backend.store.job(filler).backend_ref))].proc.wait()  # type: ignore[union-attr]
            slurm.tick()
        return slurm(argv)

    backend.run = starts_first
    with pytest.raises(Conflict, match=f"job {job} started meanwhile: preempt it, then hold it"):
        backend.hold(job)
    ref = int(str(backend.store.job(job).backend_ref))
    assert slurm.jobs[ref].proc is not None and not slurm.jobs[ref].held  # a requeue will not hold it
    assert backend.store.events(job, kinds=["held"]) == []


def test_slurm_held_reasons_read_as_held() -> None:
    assert waiting_reason("JobHeldAdmin", None, "t").startswith("held: ")
    assert waiting_reason("Resources", None, "t") == "waiting: Slurm Resources"


def test_slurm_hold_of_a_gpufleet_job_runs_the_job_verb_and_says_so(
    home: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, _, job = queued_behind_a_filler(home, slurm)
    monkeypatch.setattr("gpufleet.cli.slurm.SlurmBackend", lambda home: SlurmBackend(home, runner=slurm))
    monkeypatch.setattr("gpufleet.cli.jobs.get_backend", lambda name, home: SlurmBackend(home, runner=slurm))
    ref = backend.store.job(job).backend_ref
    code, out, err = run_cli(capsys, monkeypatch, "slurm", "hold", str(job))
    assert code == 0, err
    assert f"scontrol hold {ref}" in out and f"`gpufleet hold {job}` is this job's verb" in err
    assert [e.kind for e in backend.store.events(job, kinds=["held"])] == ["held"]
    code, out, err = run_cli(capsys, monkeypatch, "release", str(job), "--json")
    assert (code, json.loads(out)) == (0, {"id": job, "requested": "release"}), err
    assert not slurm.jobs[int(str(ref))].held
