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
import torch
import typer
import yaml
from typer.testing import CliRunner

from gpufleet.cli.debug import debug_app
from gpufleet.devtools.resumecheck import (
    compare_final_states,
    first_loss_difference,
    hints,
    rng_warnings,
    step_losses,
)
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


# ---- the comparison of two final states, on hand-made states ------------------------------------
DROP = object()


def state(changes: dict[tuple[Any, ...], Any] | None = None) -> dict[str, Any]:
    """A checkpoint-shaped state (nested dicts, a list of dicts, tensors of several dtypes, plain values),
    with the entry at each path of ``changes`` replaced (``DROP``: removed)."""
    base: dict[str, Any] = {
        "model": {"0.weight": torch.arange(12.0).reshape(3, 4), "0.bias": torch.zeros(3)},
        "optimizer": {
            "state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.ones(3, 4)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "trainer": {"step": 5, "health_history": [1.5, 1.25], "values": {"best": math.nan}},
        "rank-00001": {"rng": {"torch": torch.arange(8, dtype=torch.uint8), "python": (3, (1, 2, 3), None)}},
    }
    for (*path, last), value in (changes or {}).items():
        node = base
        for key in path:
            node = node[key]
        if value is DROP:
            del node[last]
        else:
            node[last] = value
    return base


def test_identical_states_are_exact_nan_included() -> None:
    found = compare_final_states(state(), state())
    assert found.exact and found.first is None and found.tensors == [] and found.others == []
    assert found.tensors_compared == 5


def test_the_first_differing_tensor_is_named_with_its_largest_difference_and_first_index() -> None:
    weight = torch.arange(12.0).reshape(3, 4)
    weight[1, 2] += 0.25
    weight[2, 3] -= 0.5
    moment = torch.ones(3, 4)
    moment[0, 0] = 2.0
    found = compare_final_states(
        state(), state({("model", "0.weight"): weight, ("optimizer", "state", 0, "exp_avg"): moment})
    )
    assert found.tensors == ["model.0.weight", "optimizer.state.0.exp_avg"] and not found.others
    first = found.first
    assert first is not None and first.name == "model.0.weight" and first.at == (1, 2)
    assert first.max_abs_diff == 0.5
    assert first.describe() == "model.0.weight differs by up to 0.5 (first at [1, 2])"


BIAS = ("model", "0.bias")


@pytest.mark.parametrize(
    ("value", "described"),
    [
        (torch.zeros(3, dtype=torch.float64), "is float32 in the uninterrupted run, float64 in the resumed one"),
        (torch.zeros(4), "is of shape [3] in the uninterrupted run, of shape [4] in the resumed one"),
        (
            torch.zeros(1, 3, dtype=torch.int64),
            "is float32 of shape [3] in the uninterrupted run, int64 of shape [1, 3] in the resumed one",
        ),
        (DROP, "is a float32 tensor of shape [3] in the uninterrupted run, absent in the resumed one"),
        (0.0, "is a float32 tensor of shape [3] in the uninterrupted run, not a tensor (float) in the resumed one"),
        (torch.tensor([0.0, -0.0, 0.0]), "differs only in the sign of a zero (first at [1])"),
        (torch.tensor([0.0, math.nan, 0.0]), "differs by up to inf (first at [1])"),
        (torch.tensor([0.0, 0.0, 1e-7]), "differs by up to 1e-07 (first at [2])"),
    ],
)
def test_a_tensor_that_differs_is_described(value: Any, described: str) -> None:
    found = compare_final_states(state(), state({BIAS: value}))
    assert found.first is not None and found.first.describe() == f"model.0.bias {described}"
    assert found.tensors == ["model.0.bias"] and found.others == []  # named once, as a tensor


def test_a_0d_tensor_and_a_tensor_only_the_resumed_run_holds() -> None:
    found = compare_final_states(state(), state({("optimizer", "state", 0, "step"): torch.tensor(6.0)}))
    assert found.first is not None and found.first.describe() == "optimizer.state.0.step differs by up to 1"
    found = compare_final_states(state(), state({("model", "extra"): torch.ones(2)}))
    assert found.tensors == ["model.extra"] and found.first is not None
    assert found.first.describe() == (
        "model.extra is absent in the uninterrupted run, a float32 tensor of shape [2] in the resumed one"
    )


def test_every_rank_rng_state_and_plain_entry_is_compared() -> None:
    rng = ("rank-00001", "rng")
    found = compare_final_states(
        state(), state({(*rng, "python"): (3, (1, 2, 4), None), ("trainer", "health_history"): [1.5, 1.0]})
    )
    assert found.tensors == [] and found.others == ["trainer.health_history", "rank-00001.rng.python"]
    assert not found.exact and found.first is None
    torch_rng = torch.arange(8, dtype=torch.uint8)
    torch_rng[5] = 0
    found = compare_final_states(state(), state({(*rng, "torch"): torch_rng, ("trainer", "step"): DROP}))
    assert found.tensors == ["rank-00001.rng.torch"] and found.others == ["trainer.step"]
    assert (
        found.first is not None and found.first.describe() == "rank-00001.rng.torch differs by up to 5 (first at [5])"
    )


def test_rng_states_alone_differing_are_warnings_naming_each_generator_on_any_rank() -> None:
    python, numpy = rng_warnings(["rank-00001.rng.python", "trainer.rng.numpy.key", "trainer.rng.numpy.pos"])
    assert python.startswith("Python's random module differs (rank-00001.rng.python) but no weight or loss does")
    assert numpy == (
        "numpy's global RNG differs (trainer.rng.numpy.key, trainer.rng.numpy.pos) but no weight or loss does: "
        "the loop does not use it; seed it if it should"
    )
    (torch_rng,) = rng_warnings(["rank-00000.rng.torch"])
    assert "drew from it a different number of times" in torch_rng and "generator=torch.Generator()" in torch_rng
    assert rng_warnings(["rank-00001.rng.python", "model.w"]) == [] and rng_warnings([]) == []
    (other,) = hints(None, 4, None, ["rank-00001.rng.python", "model.w"])
    assert "every loss matches but model.w ends differently" in other


README_LOOP = """import numpy as np  # imported as scripts do: never seeded, never drawn from
import torch

from gpufleet.runtime import TrainSession

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

with TrainSession.from_env(model=model, optimizer=optimizer, total_steps=6) as s:
    for _ in s.steps():
        x = torch.randn(16, 8)  # a random batch from torch's global RNG, which the checkpoint holds
        loss = (model(x) - x.sin().sum(1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        s.report(loss)
"""


def test_an_unused_unseeded_numpy_rng_is_a_warning_not_a_difference(tmp_path: Path) -> None:
    """The README's loop with torch batches and numpy imported: exact, exit 0, numpy's RNG named in a warning."""
    (tmp_path / "train.py").write_text(README_LOOP)
    spec = write_spec(tmp_path, "readme-loop", entrypoint="python train.py", workdir=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "debug", "resume-check", str(spec), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "exact" and report["exact"] is True and report["first_loss_step"] is None
    assert report["hints"] == [] and all(".rng." in e for e in [report["first_tensor"], *report["other_entries"]])
    assert any(w.startswith("numpy's global RNG differs (trainer.rng.numpy.key") for w in report["warnings"])
