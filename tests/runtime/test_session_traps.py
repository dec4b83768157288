"""Traps a new user falls into when porting a script to TrainSession, each pinned by a test.

The loop here is written the way people write theirs: a small model, an optimizer, a random
batch per step from the position helper, sometimes gradient accumulation.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpufleet.errors import CheckpointError, HealthError
from gpufleet.jobs.events import EventLog
from gpufleet.jobs.protocol import entry_argv
from gpufleet.runtime import CheckpointDir, Preempted, TrainSession
from gpufleet.runtime.data import batch_generator, random_batch_indices
from gpufleet.spec import CheckpointPolicy, HealthPolicy, KeepBest, parse_spec

DATA_X = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
DATA_Y = DATA_X @ torch.tensor([1.0, -2.0, 0.5, 3.0])


def make(
    tmp_path: Path,
    *,
    steps: int = 20,
    every: int = 5,
    health: HealthPolicy | None = None,
    width: int = 4,
    lr: float = 0.05,
    **kwargs: Any,
) -> tuple[TrainSession, torch.nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(width, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    policy = kwargs.pop("policy", CheckpointPolicy(every_steps=every, keep=2))
    sess = TrainSession(
        ckpt_dir=tmp_path / "ckpt",
        model=model,
        optimizer=optimizer,
        total_steps=steps,
        policy=policy,
        health=health or HealthPolicy(min_history=3, window=10),
        events=EventLog(None),
        log_every_s=0.0,
        **kwargs,
    )
    return sess, model, optimizer


def micro_loss(model: torch.nn.Module, position: int) -> torch.Tensor:
    ix = random_batch_indices(7, position, len(DATA_X), 16)
    out: torch.Tensor = torch.nn.functional.mse_loss(model(DATA_X[ix]).squeeze(-1), DATA_Y[ix])
    return out


def train(
    sess: TrainSession,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    accum: int = 1,
    poison: Callable[[TrainSession, int], bool] = lambda s, m: False,
    report_all: bool = True,
    after_step: Callable[[TrainSession], None] | None = None,
) -> None:
    with sess:
        for _ in sess.steps():
            losses = []
            for m in range(accum):
                loss = micro_loss(model, sess.data_position + m) / accum
                if poison(sess, m):
                    loss = loss * float("nan")
                loss.backward()  # type: ignore[no-untyped-call]
                losses.append(loss.detach() * accum)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sess.report(losses if report_all else losses[-1], batches=accum)
            if after_step is not None:
                after_step(sess)


def kinds(sess: TrainSession, kind: str) -> list[dict[str, Any]]:
    return [e for e in sess.events.memory if e["kind"] == kind]


# ---- trap 1: a finite loss does not make a finite state -----------------------------------------
def test_job_never_completes_with_nan_weights_it_rolls_back(tmp_path: Path) -> None:
    sess, model, opt = make(tmp_path, steps=12, every=5)
    corrupted: list[int] = []

    def corrupt_last(s: TrainSession) -> None:  # the last step breaks the weights, its loss was finite
        if s.step == 12 and not corrupted:
            corrupted.append(s.step)
            with torch.no_grad():
                model.weight[0, 1] = float("nan")

    train(sess, model, opt, after_step=corrupt_last)
    assert sess.step == 12 and corrupted == [12]
    assert all(torch.isfinite(p).all() for p in model.parameters())
    bad = kinds(sess, "unhealthy")
    assert bad and bad[0]["reason"] == "nonfinite_state" and bad[0]["tensor"] == "model.weight"
    assert kinds(sess, "rollback")[0]["to_step"] == 10
    assert kinds(sess, "session_end")[-1]["status"] == "completed"
    info, _ = CheckpointDir(tmp_path / "ckpt").latest()
    assert info is not None and info.step == 12 and info.manifest is not None and info.manifest.healthy


def test_mark_mode_fails_instead_of_completing_on_nan_weights(tmp_path: Path) -> None:
    sess, model, opt = make(tmp_path, steps=6, health=HealthPolicy(min_history=3, window=10, action="mark"))

    def corrupt(s: TrainSession) -> None:
        if s.step == 6:
            with torch.no_grad():
                model.bias.fill_(float("inf"))

    with pytest.raises(HealthError, match="unhealthy state"):
        train(sess, model, opt, after_step=corrupt)
    assert kinds(sess, "session_end")[-1]["status"] == "failed"


def test_nan_optimizer_state_is_caught_at_the_checkpoint(tmp_path: Path) -> None:
    sess, model, opt = make(tmp_path, steps=12, every=5, health=HealthPolicy(min_history=3, window=10, action="mark"))
    with pytest.raises(HealthError), sess:
        for _ in sess.steps():
            loss = micro_loss(model, sess.data_position)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
            if sess.step == 9:  # after the update, before the step's report and checkpoint
                opt.state[model.weight]["exp_avg_sq"][0, 0] = float("nan")
            sess.report(loss)
    ckpt = next(e for e in kinds(sess, "checkpoint") if e["step"] == 10)
    assert ckpt["healthy"] is False and ckpt["nonfinite"] == "optimizer.state.0.exp_avg_sq"


# ---- trap 2: gradient accumulation ----------------------------------------------------------------
def test_every_micro_batch_is_judged_and_named(tmp_path: Path) -> None:
    sess, model, opt = make(tmp_path, steps=12, every=4)
    hit: list[int] = []

    def poison(s: TrainSession, m: int) -> bool:  # the first of 3 micro-batches of step 7 is bad
        if s.step == 6 and m == 0 and not hit:
            hit.append(s.data_position)
            return True
        return False

    train(sess, model, opt, accum=3, poison=poison)
    bad = kinds(sess, "unhealthy")
    assert len(bad) == 1 and bad[0]["step"] == 7 and bad[0]["micro_batch"] == 0
    assert bad[0]["data_position"] == hit[0] == 18
    rollback = kinds(sess, "rollback")[0]
    assert rollback["to_step"] == 4 and rollback["skip_from"] == 12 and rollback["skip_to"] == 19
    assert sess.step == 12 and all(torch.isfinite(p).all() for p in model.parameters())


def test_reporting_only_the_last_micro_loss_is_still_caught_by_the_state_check(tmp_path: Path) -> None:
    """The old habit: the bad micro-batch was not the last, its NaN never reached report()."""
    sess, model, opt = make(tmp_path, steps=10, every=5)
    done: list[int] = []

    def poison(s: TrainSession, m: int) -> bool:
        if s.step == 9 and m == 0 and not done:
            done.append(1)
            return True
        return False

    train(sess, model, opt, accum=2, poison=poison, report_all=False)
    assert [e["reason"] for e in kinds(sess, "unhealthy")] == ["nonfinite_state"]
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---- trap 4: a pending preemption is visible mid-step --------------------------------------------
def test_preempt_requested_lets_a_long_evaluation_stop(tmp_path: Path) -> None:
    sess, model, opt = make(tmp_path, steps=50, every=100)
    evaluated: list[int] = []
    with pytest.raises(Preempted) as stop, sess:
        for _ in sess.steps():
            loss = micro_loss(model, sess.data_position)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
            if sess.step == 3:
                for i in range(10_000):  # a long evaluation
                    if i == 5:
                        os.kill(os.getpid(), signal.SIGTERM)
                    if sess.preempt_requested:
                        break
                    evaluated.append(i)
            sess.report(loss)
    assert evaluated == list(range(5)) and stop.value.step == 4
    assert [e["reason"] for e in kinds(sess, "checkpoint")] == ["preempt"]


def test_leaving_the_loop_on_a_preemption_is_a_preemption_not_a_completion(tmp_path: Path) -> None:
    sess, model, opt = make(tmp_path, steps=50, every=100)
    with pytest.raises(Preempted) as stop, sess:
        for _ in sess.steps():
            if sess.preempt_requested:
                break  # the user's own way out
            loss = micro_loss(model, sess.data_position)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
            sess.report(loss)
            if sess.step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
    assert stop.value.step == 3
    assert [e["reason"] for e in kinds(sess, "checkpoint")] == ["preempt"]
    assert kinds(sess, "session_end")[-1]["status"] == "requeue"


# ---- trap 5: explicit resume behaviour ------------------------------------------------------------
def test_rerunning_a_finished_script_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sess, model, opt = make(tmp_path, steps=6)
    train(sess, model, opt)
    capsys.readouterr()
    sess, model, opt = make(tmp_path, steps=6)
    train(sess, model, opt)
    out = capsys.readouterr().out
    assert "resumed from" in out and "step 6" in out
    assert "already at step 6 of 6: nothing to train" in out


def test_changed_model_shape_is_a_clear_error_naming_the_keys(tmp_path: Path) -> None:
    sess, model, opt = make(tmp_path, steps=5)
    train(sess, model, opt)
    sess, model, opt = make(tmp_path, steps=10, width=6)
    with pytest.raises(CheckpointError, match=r"step-00000005 does not fit the model: .*weight"):
        train(sess, model, opt)


def test_changed_optimizer_settings_are_announced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sess, model, opt = make(tmp_path, steps=5)
    train(sess, model, opt)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.5)
    sess = TrainSession(ckpt_dir=tmp_path / "ckpt", model=model, optimizer=opt, total_steps=8, events=EventLog(None))
    train(sess, model, opt)
    changed = kinds(sess, "config_changed")
    assert changed and "weight_decay=0.01 in the checkpoint, 0.5 in this run" in changed[0]["message"]
    assert "weight_decay" in capsys.readouterr().out


def test_resume_must_and_never(tmp_path: Path) -> None:
    sess, model, opt = make(tmp_path, steps=5, resume="must")
    with pytest.raises(CheckpointError, match="resume: must"):
        train(sess, model, opt)
    sess, model, opt = make(tmp_path, steps=5)
    train(sess, model, opt)
    sess, model, opt = make(tmp_path, steps=5, resume="never")
    with pytest.raises(CheckpointError, match=r"resume: never, but .* already holds checkpoints \(steps 5..5\)"):
        train(sess, model, opt)
    sess, model, opt = make(tmp_path, steps=8, resume="must")
    train(sess, model, opt)
    assert kinds(sess, "restore")[0]["step"] == 5 and sess.step == 8


def test_resume_is_a_spec_field() -> None:
    spec = parse_spec({"name": "a", "entrypoint": "m:f", "resume": "must"})
    assert spec.resume == "must"
    with pytest.raises(Exception, match="resume"):
        parse_spec({"name": "a", "entrypoint": "m:f", "resume": "sometimes"})


# ---- trap 6: `python` means gpufleet's interpreter ------------------------------------------------
@pytest.mark.parametrize("first", ["python", "python3", "python3.11"])
def test_a_bare_python_runs_gpufleets_interpreter(first: str) -> None:
    spec = parse_spec({"name": "a", "entrypoint": f"{first} train.py --lr 3e-3"})
    assert entry_argv(spec) == [sys.executable, "train.py", "--lr", "3e-3"]
    other = parse_spec({"name": "a", "entrypoint": "/usr/bin/python3 train.py"})
    assert entry_argv(other)[0] == "/usr/bin/python3"


# ---- trap 7: plain values and the best checkpoint -------------------------------------------------
def test_plain_values_are_saved_and_restored(tmp_path: Path) -> None:
    config = {"lr": 0.05, "layers": [1, 2]}
    sess, model, opt = make(tmp_path, steps=5, extra={"best_val_loss": 1e9, "config": config})
    with sess:
        for _ in sess.steps():
            loss = micro_loss(model, sess.data_position)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
            sess.values["best_val_loss"] = min(sess.values["best_val_loss"], loss.item())
            sess.report(loss)
    best = sess.values["best_val_loss"]
    sess, model, opt = make(tmp_path, steps=5, extra={"best_val_loss": 1e9, "config": {}})
    with sess:
        pass
    assert sess.values["best_val_loss"] == best and sess.values["config"] == config
    with pytest.raises(ValueError, match=r"extra\['bad'\] is a object"):
        make(tmp_path, extra={"bad": object()})


def test_keep_best_survives_pruning(tmp_path: Path) -> None:
    policy = CheckpointPolicy(every_steps=2, keep=1, keep_best=KeepBest(metric="val_loss", mode="min"))
    sess, model, opt = make(tmp_path, steps=20, policy=policy)
    val = {4: 0.9, 8: 0.3, 12: 0.5, 16: 0.4}
    with sess:
        for _ in sess.steps():
            if sess.step in val and sess.due("eval", every=4):
                sess.log("eval", val_loss=val[sess.step])
            loss = micro_loss(model, sess.data_position)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
            sess.report(loss)
    steps = [i.step for i in CheckpointDir(tmp_path / "ckpt").scan()]
    assert steps == [8, 20]
    assert [e["reason"] for e in kinds(sess, "checkpoint") if e["step"] == 8] == ["periodic", "best"]


# ---- trap 10: a rollback does not evaluate the restored step twice ---------------------------------
def test_due_does_not_repeat_an_evaluation_after_a_rollback(tmp_path: Path) -> None:
    sess, model, opt = make(tmp_path, steps=12, every=4)
    evals: list[int] = []
    done: list[int] = []

    with sess:
        for _ in sess.steps():
            if sess.due("eval", every=4):
                evals.append(sess.step)
                sess.log("eval", val_loss=1.0)
            loss = micro_loss(model, sess.data_position)
            if sess.step == 5 and not done:
                done.append(1)
                loss = loss * float("nan")
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
            sess.report(loss)
    assert kinds(sess, "rollback")[0]["to_step"] == 4
    assert evals == [0, 4, 8]


def eval_loop(tmp_path: Path, name: str, rollback_at: int | None) -> tuple[TrainSession, torch.nn.Module]:
    """Evaluation every 4 steps that draws from the global RNG and keeps a best value in ``values``."""
    sess, model, opt = make(tmp_path / name, steps=14, every=4, extra={"best": 1e9})
    sess.inject_rollback_at = rollback_at
    with sess:
        for _ in sess.steps():
            if sess.due("eval", every=4):
                noise = float(torch.rand(()))  # an evaluation that consumes random numbers
                sess.values["best"] = min(sess.values["best"], float(micro_loss(model, 10_000).detach()) + noise)
                sess.log("eval", val_loss=sess.values["best"])
            loss = micro_loss(model, sess.data_position) * (1 + float(torch.rand(())))
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
            sess.report(loss)
    return sess, model


def test_a_replayed_rollback_to_an_evaluated_step_is_exact(tmp_path: Path) -> None:
    """Rolled back to step 8 (checkpointed, then evaluated), the replay resumes after the evaluation."""
    plain, plain_model = eval_loop(tmp_path, "plain", None)
    replay, replay_model = eval_loop(tmp_path, "replay", 10)
    assert kinds(replay, "rollback")[0]["to_step"] == 8
    assert [e["step"] for e in kinds(replay, "eval")] == [0, 4, 8, 12]
    assert replay.values == plain.values
    for a, b in zip(plain_model.parameters(), replay_model.parameters(), strict=True):
        assert torch.equal(a, b)


# ---- checkpoints that are what they claim ---------------------------------------------------------
def test_a_checkpoint_of_another_job_is_refused(tmp_path: Path) -> None:
    sess, model, opt = make(tmp_path, steps=5, job="7")
    train(sess, model, opt)
    other = tmp_path / "other"
    sess, model, opt = make(other, steps=10, job="8")
    train(sess, model, opt)
    shutil.copytree(other / "ckpt" / "step-00000010", tmp_path / "ckpt" / "step-00000010")
    sess, model, opt = make(tmp_path, steps=6, job="7")
    train(sess, model, opt)
    skipped = kinds(sess, "checkpoint_skipped")
    assert skipped and skipped[0]["step"] == 10 and "job 8" in skipped[0]["reason"]
    assert kinds(sess, "restore")[0]["step"] == 5


def test_a_full_disk_keeps_training_and_the_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufleet.errors import CheckpointSpaceError

    sess, model, opt = make(tmp_path, steps=12, every=4)
    real_save = CheckpointDir.save

    def full(self: CheckpointDir, step: int, *args: Any, **kwargs: Any) -> Any:
        if step == 8:
            raise CheckpointSpaceError(
                f"no space left on {self.root}: 1234 bytes needed, 10 free", path=self.root, needed=1234, free=10
            )
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(CheckpointDir, "save", full)
    train(sess, model, opt)
    failed = kinds(sess, "checkpoint_failed")
    assert len(failed) == 1 and failed[0]["step"] == 8 and "1234 bytes needed" in failed[0]["message"]
    assert [e["step"] for e in kinds(sess, "checkpoint")] == [4, 12]
    assert kinds(sess, "session_end")[-1]["status"] == "completed"


def test_a_full_disk_at_the_preemption_save_still_requeues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.errors import CheckpointSpaceError

    sess, model, opt = make(tmp_path, steps=12, every=4)
    real_save = CheckpointDir.save

    def full(self: CheckpointDir, step: int, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("reason") == "preempt":
            raise CheckpointSpaceError(
                f"no space left on {self.root}: 1234 bytes needed, 10 free", path=self.root, needed=1234, free=10
            )
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(CheckpointDir, "save", full)
    with pytest.raises(Preempted):
        train(sess, model, opt, after_step=lambda s: s.request_preemption() if s.step == 6 else None)
    assert CheckpointDir(tmp_path / "ckpt").latest()[0] is not None


# ---- the batch helper -----------------------------------------------------------------------------
def test_batches_are_a_pure_function_of_the_position() -> None:
    a = torch.randint(100, (5,), generator=batch_generator(3, 41))
    torch.manual_seed(123)  # the global RNG does not matter
    b = torch.randint(100, (5,), generator=batch_generator(3, 41))
    assert torch.equal(a, b)
    assert not torch.equal(random_batch_indices(3, 41, 1000, 8), random_batch_indices(3, 42, 1000, 8))
    assert not torch.equal(random_batch_indices(3, 41, 1000, 8), random_batch_indices(4, 41, 1000, 8))
