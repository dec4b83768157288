"""Numerical debugging: bitwise determinism, the seed band, and spikes found as the runtime finds them."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import typer
from typer.testing import CliRunner

from gpufleet.cli.debug import debug_app
from gpufleet.devtools.debug import check_determinism, find_spikes, plot_losses
from gpufleet.errors import UsageError
from gpufleet.jobs.events import read_events
from gpufleet.runtime import EventLog, TrainSession
from gpufleet.spec import CheckpointPolicy, HealthPolicy, parse_spec

TINY: dict[str, Any] = {
    "name": "tiny",
    "entrypoint": "gpufleet.workloads.tinylm:train",
    "args": {"embed": 32, "context": 16, "batch_size": 8, "layers": 1, "heads": 2, "eval_batches": 1},
}
_CALLS = itertools.count()


def noisy_train(steps: int = 6, seed: int = 0, ckpt_dir: str = "checkpoints") -> None:
    """Seeded like a real job, but from the third step its loss is scaled by a counter no seed resets."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with TrainSession.from_env(model=model, optimizer=optimizer, total_steps=steps, ckpt_dir=ckpt_dir) as sess:
        for step in sess.steps():
            x = torch.randn(8, 2)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            if step >= 2:
                loss = loss * (1 + 1e-3 * next(_CALLS))
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            sess.report(loss)


def cli() -> typer.Typer:
    app = typer.Typer()
    app.add_typer(debug_app, name="debug")
    return app


def test_tiny_lm_is_bitwise_deterministic_on_cpu_and_seeds_spread(tmp_path: Path) -> None:
    report = check_determinism(parse_spec(TINY), steps=6, seeds=(0, 1))
    assert report.identical and report.first_loss_step is None and report.first_tensor is None
    assert report.tensors_compared > 10 and report.tensors_differing == 0
    assert len(report.losses["run1"]) == 6 and report.losses["run1"] == report.losses["run2"]
    assert report.max_seed_spread > 0 and len(report.seed_spread) == 6
    png = plot_losses(report, tmp_path / "losses.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(report.to_dict())


def test_nondeterministic_loop_reports_first_step_and_tensor(tmp_path: Path) -> None:
    spec = tmp_path / "noisy.yaml"
    spec.write_text(json.dumps({"name": "noisy", "entrypoint": f"{__name__}:noisy_train"}))
    out = CliRunner().invoke(cli(), ["debug", "determinism", str(spec), "--steps", "5", "--seeds", "3,4", "--json"])
    assert out.exit_code == 1, out.output
    data = json.loads(out.output)
    assert not data["identical"] and data["first_loss_step"] == 3
    assert data["losses"]["run1"][:2] == data["losses"]["run2"][:2]
    assert data["first_tensor"] == "model.weight" and data["first_tensor_max_abs_diff"] > 0
    assert 0 < data["tensors_differing"] <= data["tensors_compared"] and data["other_entries_differing"] > 0
    assert data["seeds"] == [3, 4] and data["max_seed_spread"] > 0


def test_determinism_cli_text_and_plot(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(TINY))
    png = tmp_path / "band.png"
    out = CliRunner().invoke(cli(), ["debug", "determinism", str(spec), "--steps", "2", "--plot", str(png)])
    assert out.exit_code == 0, out.output
    assert "identical" in out.output and "seed 0 vs seed 1:" in out.output and png.stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "1"], "--seeds '1'"),
        (["--seeds", "a,b"], "--seeds 'a,b'"),
        (["--seeds", "2,2"], "seeds 2,2"),
        (["--steps", "0"], "--steps 0"),
    ],
)
def test_determinism_rejects_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(TINY))
    out = CliRunner().invoke(cli(), ["debug", "determinism", str(spec), *args])
    assert isinstance(out.exception, UsageError) and message in str(out.exception)


LOSSES = [2.0 + 0.01 * ((7 * i) % 5) for i in range(30)]
LOSSES[14] = 9.0  # step 15: a spike
LOSSES[21] = math.nan  # step 22


def logged_run(path: Path, policy: HealthPolicy) -> list[dict[str, Any]]:
    """Feed LOSSES through a real session (action "mark"); return its "unhealthy" events.

    A checkpoint every 5 steps lets the run end on a healthy save, as a completed run must.
    """
    session = TrainSession(
        ckpt_dir=path.parent / "ckpt",
        model=torch.nn.Linear(1, 1),
        policy=CheckpointPolicy(every_steps=5),
        health=policy,
        events=EventLog(path),
        log_every_s=0.0,
        handle_signals=False,
    )
    with session:
        for step in session.steps():
            session.report(LOSSES[step])
            if session.step == len(LOSSES):
                break
    return [e for e in read_events(path)[0] if e["kind"] == "unhealthy"]


def test_spikes_match_the_runtime_verdicts(tmp_path: Path) -> None:
    policy = HealthPolicy(action="mark", min_history=5, window=10)
    runtime = logged_run(tmp_path / "events.jsonl", policy)
    assert [(e["step"], e["reason"]) for e in runtime] == [(15, "spike"), (22, "nan")]
    spikes = find_spikes(tmp_path / "events.jsonl", policy)
    assert [(s.step, s.reason) for s in spikes] == [(15, "spike"), (22, "nan")]
    assert spikes[0].zscore == runtime[0]["zscore"] and spikes[0].loss == 9.0
    assert spikes[1].loss is not None and math.isnan(spikes[1].loss) and spikes[1].zscore is None
    assert [(s.step, s.zscore) for s in find_spikes(tmp_path, policy)] == [(15, spikes[0].zscore), (22, None)]
    assert [s.source for s in spikes] == ["runtime", "runtime"]  # both were logged as unhealthy

    csv = tmp_path / "losses.csv"
    csv.write_text("step,loss\n" + "".join(f"{i + 1},{v}\n" for i, v in enumerate(LOSSES)))
    from_csv = find_spikes(csv, policy)
    assert [(s.step, s.reason, s.zscore) for s in from_csv] == [(s.step, s.reason, s.zscore) for s in spikes]


def test_spikes_reports_what_the_runtime_flagged_though_step_events_are_sampled(tmp_path: Path) -> None:
    """The runtime judged step 15 against 14 losses; the log holds only a few sampled ``step`` events.

    A replay of those alone never reaches ``min_history``, so it used to say "0 unhealthy" while
    the log held the ``unhealthy`` event that caused a rollback.
    """
    losses = [2.0 + 0.01 * ((7 * i) % 5) for i in range(40)]
    losses[14] = 900.0  # data position 14: the 15th step
    policy = HealthPolicy(window=10, min_history=5, action="rollback")
    path = tmp_path / "events.jsonl"
    session = TrainSession(
        ckpt_dir=tmp_path / "ckpt",
        model=torch.nn.Linear(1, 1),
        policy=CheckpointPolicy(every_steps=5),
        health=policy,
        events=EventLog(path),
        log_every_s=3600.0,  # one step event at the start and one at the end
        handle_signals=False,
        echo=False,
    )
    with session:
        for _ in session.steps():
            session.report(losses[session.data_position])
            if session.step == 20:
                break
    events = read_events(path)[0]
    bad = [e for e in events if e["kind"] == "unhealthy"]
    assert [(e["step"], e["reason"]) for e in bad] == [(15, "spike")] and bad[0]["zscore"] > 100
    assert any(e["kind"] == "rollback" for e in events)
    assert sum(e["kind"] == "step" for e in events) < policy.min_history

    spikes = find_spikes(tmp_path, policy)
    assert [(s.step, s.loss, s.reason, s.zscore, s.source) for s in spikes] == [
        (15, 900.0, "spike", bad[0]["zscore"], "runtime")
    ]
    (tmp_path / "spec.json").write_text(json.dumps({"name": "j", "entrypoint": "m:f", "health": policy.model_dump()}))
    out = CliRunner().invoke(cli(), ["debug", "spikes", str(tmp_path)])
    assert out.exit_code == 0 and "1 unhealthy (1 logged by the runtime)" in out.output, out.output
    assert "runtime" in out.output.splitlines()[1]


def test_spikes_cli_by_job_id_and_bad_input(tmp_path: Path, home: Path) -> None:
    job = home / "jobs" / "1"
    job.mkdir(parents=True)
    logged_run(job / "events.jsonl", HealthPolicy(action="mark", min_history=5, window=10))
    spec = {"name": "j", "entrypoint": "m:f", "health": {"window": 10, "min_history": 5}}
    (job / "spec.json").write_text(json.dumps(spec))
    out = CliRunner().invoke(cli(), ["debug", "spikes", "1", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["losses"] == 30 and data["policy"]["window"] == 10
    assert [(s["step"], s["loss"]) for s in data["spikes"]] == [(15, 9.0), (22, "nan")]
    out = CliRunner().invoke(cli(), ["debug", "spikes", "1", "--zscore", "1000"])
    assert out.exit_code == 0 and "1 unhealthy (1 logged by the runtime) of 30" in out.output  # only the NaN

    for args, message in [
        (["99"], "job 99 has no events"),
        ([str(tmp_path / "nope.jsonl")], "nope.jsonl"),
        (["1", "--zscore", "0"], "--zscore 0"),
        (["1", "--window", "3"], "--window 3"),
    ]:
        out = CliRunner().invoke(cli(), ["debug", "spikes", *args])
        assert isinstance(out.exception, UsageError) and message in str(out.exception), args
    bad = tmp_path / "bad.csv"
    bad.write_text("step,loss\n1,oops\n")
    with pytest.raises(UsageError, match="line 2"):
        find_spikes(bad)
    (tmp_path / "nocols.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match="`step` and `loss`"):
        find_spikes(tmp_path / "nocols.csv")
