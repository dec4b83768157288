"""``gpufleet debug resume-check``: a preempted and resumed run against an uninterrupted one, bit for bit.

Each check starts three real processes (one uninterrupted attempt, two preempted ones); the
training is a few tiny steps, so the time goes to starting Python and torch.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from gpufleet.cli.debug import debug_app
from gpufleet.devtools.resumecheck import first_loss_difference, step_losses
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.workloads.tinylm import TINY

REPO = Path(__file__).resolve().parents[2]
NANOGPT = REPO / "examples" / "nanogpt" / "train.py"
TINY_NANOGPT = (
    "--max-iters 8 --eval-interval 4 --eval-iters 1 --log-interval 100 "
    "--batch-size 4 --block-size 16 --n-layer 1 --n-head 2 --n-embd 16 --gradient-accumulation-steps 2"
)
SMALL = {"resources": {"gpu_type": "cpu", "gpus": 0, "cpus": 1}, "checkpoint": {"every_steps": 2}}


def cli() -> typer.Typer:
    app = typer.Typer()
    app.add_typer(debug_app, name="debug")
    return app


def write_spec(tmp_path: Path, name: str, **fields: Any) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **SMALL, **fields}))
    return path


def tinylm_spec(tmp_path: Path) -> Path:
    return write_spec(tmp_path, "tiny", entrypoint="gpufleet.workloads.tinylm:train", args={**TINY, "steps": 8})


def nanogpt_spec(tmp_path: Path, *flags: str) -> Path:
    command = f"python {NANOGPT} {' '.join(flags)} {TINY_NANOGPT}"
    checkpoint = {"every_steps": 2, "keep_best": {"metric": "val_loss", "mode": "min"}}
    return write_spec(tmp_path, "nanogpt", entrypoint=command, workdir=str(tmp_path), checkpoint=checkpoint)


def resume_check(*args: str) -> tuple[int, dict[str, Any]]:
    out = CliRunner().invoke(cli(), ["debug", "resume-check", *args, "--json"])
    assert out.exception is None or isinstance(out.exception, SystemExit), out.output
    return out.exit_code, json.loads(out.stdout)


def test_tinylm_resumes_exactly_after_a_preemption_and_a_rollback(tmp_path: Path) -> None:
    code, report = resume_check(str(tinylm_spec(tmp_path)), "--rollback-at", "6", "--keep", str(tmp_path / "kept"))
    assert code == 0, report
    assert report["verdict"] == "exact" and report["exact"]
    assert (report["final_step"], report["preempt_at"], report["rollback_at"]) == (8, 4, 6)  # --at: half of 8
    assert report["exit_codes"] == {"uninterrupted": [0], "preempted": [75, 0]}
    assert report["steps_compared"] == 8 and report["tensors_compared"] > 10 and report["tensors_differing"] == 0
    assert report["ignored"] == ["trainer.rollbacks"]
    events = (tmp_path / "kept" / "jobs" / "2" / "events.jsonl").read_text()
    assert '"injected":true' in events  # the rollback did happen, and was replayed exactly


def test_naive_nanogpt_port_differs_right_after_the_resume(tmp_path: Path) -> None:
    code, report = resume_check(str(nanogpt_spec(tmp_path, "--naive-batches")), "--at", "4")
    assert code == 1, report
    assert report["verdict"] == "differs" and report["failure"] is None
    assert report["first_loss_step"] == 5
    old, new = report["first_loss"]
    assert old != new
    assert report["first_tensor"].startswith("model.") and report["first_tensor_max_abs_diff"] > 0
    assert any("global RNG" in hint for hint in report["hints"])


def test_ported_nanogpt_resumes_exactly_with_a_rollback(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli(), ["debug", "resume-check", str(nanogpt_spec(tmp_path)), "--rollback-at", "6"])
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("exact: nanogpt preempted at step 4 of 8 and rolled back once after step 6")
    assert "uninterrupted, attempt 1: exit 0" in out.stderr and "preempted, attempt 2: exit 0" in out.stderr


def test_a_failing_run_shows_its_log_tail(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "boom", entrypoint=["python", "-c", "print('loading...'); raise SystemExit(3)"])
    out = CliRunner().invoke(cli(), ["debug", "resume-check", str(spec)])
    assert out.exit_code == 1
    assert "failed: the uninterrupted run's attempt 1 exited 3; expected exit 0" in out.stdout
    assert "  loading..." in out.stdout.splitlines()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--at", "8"], "--at 8 is not before the run's last step 8"),
        (["--at", "0"], "--at 0 must be a step number of at least 1"),
        (["--rollback-at", "9"], "--rollback-at 9 is beyond the run's last step 8"),
        (["--steps", "1"], "the run ends at step 1"),
    ],
)
def test_bad_steps_are_refused_before_anything_runs(tmp_path: Path, args: list[str], message: str) -> None:
    out = CliRunner().invoke(cli(), ["debug", "resume-check", str(tinylm_spec(tmp_path)), *args])
    assert isinstance(out.exception, UsageError) and message in str(out.exception), out.output
    assert out.exception.exit_code == 2 and "\n" not in str(out.exception)
    assert not list(tmp_path.glob("**/events.jsonl"))


def test_bad_input_of_other_kinds(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "old").write_text("")
    for spec, args, message in [
        (nanogpt_spec(tmp_path), ["--steps", "4"], "set its step count in the spec's command line"),
        (tinylm_spec(tmp_path), ["--keep", str(kept)], "is not an empty folder"),
    ]:
        out = CliRunner().invoke(cli(), ["debug", "resume-check", str(spec), *args])
        assert isinstance(out.exception, UsageError) and message in str(out.exception), out.output
    must = write_spec(tmp_path, "must", entrypoint="gpufleet.workloads.tinylm:train", resume="must")
    out = CliRunner().invoke(cli(), ["debug", "resume-check", str(must)])
    assert isinstance(out.exception, GpufleetError) and "resume: must" in str(out.exception)


def test_missing_spec_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "debug", "resume-check", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "nope.yaml" in proc.stderr


def event(kind: str, **data: Any) -> str:
    return json.dumps({"ts": 0.0, "attempt": 1, "kind": kind, **data}) + "\n"


def test_losses_of_an_injected_rollback_are_compared_after_the_replay(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [event("step", step=s, loss=float(s)) for s in (1, 2, 3, 4)]
    lines.append(event("rollback", from_step=4, to_step=2, injected=True))
    lines += [event("step", step=3, loss=3.0), event("step", step=4, loss=4.5), event("step", step=5, loss="nan")]
    path.write_text("".join(lines))
    losses = step_losses(path)
    assert {k: v for k, v in losses.items() if k < 5} == {1: [1.0], 2: [2.0], 3: [3.0], 4: [4.5]}
    assert len(losses[5]) == 1 and math.isnan(losses[5][0])
    reference = {1: [1.0], 2: [2.0], 3: [3.0], 4: [4.0], 5: [math.nan]}
    assert first_loss_difference(reference, losses) == (4, (4.0, 4.5))
    assert first_loss_difference(reference, {**losses, 4: [4.0]}) == (None, None)  # NaN equals NaN
    cut = {k: v for k, v in reference.items() if k < 5}
    step, (old, new) = first_loss_difference(reference, cut)  # type: ignore[misc]
    assert step == 5 and old is not None and math.isnan(old) and new is None
