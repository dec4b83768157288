"""``gpufleet goodput``: Daly's closed form, the Monte Carlo against it, the optima, policies, bad input, JSON."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import REPO, run_cli

from gpufleet.cli import app as app_module
from gpufleet.cli.goodput import goodput
from gpufleet.errors import ParameterError, UsageError
from gpufleet.estimate.goodput import (
    LLAMA3,
    Cause,
    FailureMix,
    Scenario,
    analytic,
    branches,
    daly_interval,
    daly_wall_time,
    evaluate,
    load_mix,
    monte_carlo,
    monte_carlo_sweep,
    optimum_interval,
    policies,
    spare_availability,
    spares_for,
    young_interval,
)

H = 3600.0

# One cause, restart 600 s, save 60 s, interval 1800 s; 1000 GPUs of 3600 h each: the job's MTBF is 3.6 h.
ONE = Scenario(
    gpus=1000,
    gpu_mtbf_hours=3600.0,
    work_hours=100.0,
    save_seconds=60.0,
    restart_seconds=600.0,
    interval_seconds=1800.0,
)
LLAMA = Scenario(
    gpus=16_384,
    gpu_mtbf_hours=LLAMA3.gpu_mtbf_hours() or 0.0,
    planned_per_day=LLAMA3.planned_per_day() or 0.0,
    mix=LLAMA3,
    work_hours=300.0,
    save_seconds=30.0,
    restart_seconds=120.0,
    restore_seconds=60.0,
    reschedule_seconds=300.0,
)


# --- closed forms ------------------------------------------------------------------------------------------------


def test_daly_closed_form_by_hand() -> None:
    # M = 3600, R = 600, tau = 1800, delta = 60, T_s = 36000: 3600 e^(1/6) (e^(1860/3600) - 1) 36000/1800,
    # worked to 40 digits with decimal.Decimal.
    assert daly_wall_time(36_000, 1800, 60, 600, 3600) == pytest.approx(57_535.768079104461, rel=1e-12)
    # No failures (M -> infinity): the work plus one save per interval.
    assert daly_wall_time(36_000, 1800, 60, 600, 1e12) == pytest.approx(36_000 * (1 + 60 / 1800), rel=1e-6)


def test_analytic_engine_is_dalys_form_for_one_cause() -> None:
    g = analytic(ONE)
    expected = daly_wall_time(100 * H, 1800, 60, 600, ONE.mtbf_seconds)
    assert ONE.mtbf_seconds == pytest.approx(3.6 * H)
    assert g.wall_hours * H == pytest.approx(expected, rel=1e-12)
    assert g.work_hours + g.save_hours + g.rework_hours + g.restart_hours == pytest.approx(g.wall_hours, rel=1e-12)
    assert g.interruptions == pytest.approx(g.wall_hours / 3.6, rel=1e-12)  # Poisson over the wall time
    assert g.lost_gpu_hours == pytest.approx(1000 * (g.wall_hours - 100))


def test_young_and_dalys_higher_order_optimum() -> None:
    assert young_interval(50, 5000) == pytest.approx(math.sqrt(2 * 50 * 5000))  # 707.1 s
    # Daly: sqrt(2 delta M) [1 + sqrt(delta/2M)/3 + (delta/2M)/9] - delta, by hand (decimal): 674.166 s.
    assert daly_interval(50, 5000) == pytest.approx(674.16628495387338, rel=1e-12)
    assert daly_interval(300, 100) == 100  # delta >= 2M: tau = M
    auto = replace(ONE, interval_seconds=None)
    tau, source = auto.interval()
    assert source == "daly" and tau == pytest.approx(daly_interval(60, ONE.mtbf_seconds))
    best = optimum_interval(ONE)
    assert tau == pytest.approx(best, rel=0.01)  # Daly's optimum is the model's optimum
    young = analytic(replace(ONE, interval_seconds=young_interval(60, ONE.mtbf_seconds)))
    assert analytic(auto).wall_hours <= young.wall_hours


def test_spare_pool_is_poisson() -> None:
    assert spare_availability(3, 2.0, 1.0) == pytest.approx(0.676676416183063, rel=1e-12)  # P(Poisson(2) < 3)
    assert spare_availability(0, 2.0, 1.0) == 0.0
    assert spares_for(0.99, 2.0, 1.0) == 7  # P(Poisson(2) < 6) = 0.983, P(Poisson(2) < 7) = 0.995
    assert spare_availability(spares_for(0.99, 0.3, 48), 0.3, 48) >= 0.99


# --- the Monte Carlo ---------------------------------------------------------------------------------------------


def test_monte_carlo_agrees_with_daly_within_one_percent() -> None:
    closed = analytic(ONE)
    mc = monte_carlo(ONE, trials=2000, seed=7)
    assert mc.spread is not None
    assert mc.wall_hours == pytest.approx(closed.wall_hours, rel=0.01)
    assert abs(mc.wall_hours - closed.wall_hours) < 4 * mc.spread.wall_hours_stderr + 1e-3 * closed.wall_hours
    assert mc.work_hours + mc.save_hours + mc.rework_hours + mc.restart_hours == pytest.approx(mc.wall_hours)


def test_monte_carlo_agrees_on_the_llama3_mix_with_signals_and_spares() -> None:
    s = replace(LLAMA, save_on_signal=True, signal_save_seconds=45.0, spares=10, interval_seconds=1200.0)
    assert {b.signal for b in branches(s)} == {True, False} and 0 < s.spare_availability() < 1
    closed, mc = analytic(s), monte_carlo(s, trials=400, seed=3)
    assert mc.wall_hours == pytest.approx(closed.wall_hours, rel=0.01)
    assert mc.interruptions == pytest.approx(closed.interruptions, rel=0.02)
    for a, m in zip(closed.causes, mc.causes, strict=True):
        assert a.name == m.name
    top = closed.causes[0], mc.causes[0]  # faulty GPU, the largest cause
    assert top[1].restart_hours == pytest.approx(top[0].restart_hours, rel=0.05)
    assert top[1].rework_hours == pytest.approx(top[0].rework_hours, rel=0.05)


def test_monte_carlo_is_seeded_and_takes_weibull() -> None:
    a, b = monte_carlo(ONE, trials=50, seed=1), monte_carlo(ONE, trials=50, seed=1)
    assert a.wall_hours == b.wall_hours
    assert monte_carlo(ONE, trials=50, seed=2).wall_hours != a.wall_hours
    weibull = evaluate(replace(ONE, weibull_shape=0.7), "montecarlo", trials=200, seed=1)
    assert 0 < weibull.effective_fraction < 1
    with pytest.raises(ParameterError, match="Monte Carlo"):
        evaluate(replace(ONE, weibull_shape=0.7), "analytic")


# --- sanity of the model -----------------------------------------------------------------------------------------


def test_more_gpus_lower_effective_fraction() -> None:
    fractions = [analytic(replace(LLAMA, gpus=n)).effective_fraction for n in (1_000, 4_000, 16_384, 50_000, 100_000)]
    assert fractions == sorted(fractions, reverse=True) and fractions[0] > 0.95
    assert analytic(replace(ONE, gpus=2000)).effective_fraction < analytic(ONE).effective_fraction


def test_policies_improve_what_they_claim() -> None:
    given = replace(LLAMA, interval_seconds=3600.0)
    result = {p.name: (p, analytic(p.scenario)) for p in policies(given)}
    base = result["as given"][1]
    for name in ("save on signal", "Young/Daly interval", "async checkpoints", "fast restore", "hot spares"):
        assert result[name][1].effective_fraction > base.effective_fraction, name
    every = result["all of the above"][1]
    assert all(every.effective_fraction >= g.effective_fraction for _, g in result.values())
    # what each one claims to cut
    assert result["save on signal"][1].causes[-1].rework_hours == 0 < base.causes[-1].rework_hours  # planned
    assert result["async checkpoints"][1].save_hours < base.save_hours
    assert result["fast restore"][1].restart_hours < base.restart_hours
    spares = result["hot spares"][0].scenario
    assert spares.spare_availability() >= 0.99 and result["hot spares"][1].restart_hours < base.restart_hours
    assert result["Young/Daly interval"][1].interval_seconds < 3600


def test_save_longer_than_mtbf_and_no_progress_are_refused() -> None:
    with pytest.raises(ParameterError, match="MTBF"):
        replace(ONE, save_seconds=4 * H)
    with pytest.raises(ParameterError, match="cannot make progress"):
        analytic(replace(ONE, interval_seconds=200 * H))
    with pytest.raises(ParameterError, match="no restart would complete"):  # e^(-λ·restart) underflows to 0
        analytic(replace(ONE, restart_seconds=1e9, reschedule_seconds=0))


def test_mix_file(tmp_path: Path) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text(
        "name: lab\nreference_gpus: 1000\nreference_hours: 100\ncauses:\n"
        "  - {name: gpu, count: 8, reschedule: true}\n  - {name: bug, count: 2, restart_seconds: 30}\n"
        "  - {name: upgrade, count: 5, planned: true}\n",
        encoding="utf-8",
    )
    mix = load_mix(path)
    assert mix.gpu_mtbf_hours() == pytest.approx(1000 * 100 / 10) and mix.planned_per_day() == pytest.approx(1.2)
    s = replace(ONE, mix=mix, planned_per_day=1.2, reschedule_seconds=100)
    assert [b.restart for b in branches(s)] == [700, 30, 600]
    path.write_text("causes:\n  - {name: gpu, count: 1, share: 2}\n", encoding="utf-8")
    with pytest.raises(UsageError, match="exactly one of count or share"):
        load_mix(path)
    with pytest.raises(ParameterError, match="no planned cause"):
        replace(ONE, mix=FailureMix("unplanned", "test", (Cause("gpu", 1.0),)), planned_per_day=1.0)
    path.write_text("reference_gpus: 8\ncauses:\n  - {name: gpu, share: 1}\n", encoding="utf-8")
    with pytest.raises(UsageError, match="give every cause a count"):
        load_mix(path)


def test_the_documented_mix_file_loads(tmp_path: Path) -> None:
    text = (REPO / "docs" / "goodput.md").read_text(encoding="utf-8")
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "mix.yaml").write_text(block, encoding="utf-8")
    mix = load_mix(tmp_path / "mix.yaml")
    assert mix.causes[0].name == "GPU (Xid 79, 48, 94)" and mix.planned_per_day() == pytest.approx(12 / 92)


# --- the command ---------------------------------------------------------------------------------------------------

ARGS = ("--gpus", "16384", "--mix", "llama3", "--work-hours", "300", "--save-seconds", "30", "--restart-seconds", "120")


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """``gpufleet goodput ...`` through ``main()`` (what renders errors): exit code, stdout, stderr."""
    app = typer.Typer(pretty_exceptions_enable=False, add_completion=False)

    @app.callback()
    def _group() -> None:
        """gpufleet, with goodput only."""

    app.command("goodput")(goodput)
    monkeypatch.setattr(app_module, "app", app)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str) -> tuple[int, str, str]:
        return run_cli(capsys, monkeypatch, "goodput", *args)

    return run


def _no_nan(token: str) -> None:
    raise AssertionError(f"non-standard JSON constant {token}")


def test_json_has_the_figures(cli: Any) -> None:
    code, out, err = cli(*ARGS, "--restore-seconds", "60", "--reschedule-seconds", "300", "--json")
    assert code == 0, err
    data = json.loads(out, parse_constant=_no_nan)
    for key in ("mtbf_hours", "interval_seconds", "effective_fraction", "lost_gpu_hours", "loss_hours", "causes"):
        assert key in data
    assert set(data["loss_hours"]) == {"saves", "rework", "restarts"}
    assert data["mtbf_hours"] == pytest.approx(54 * 24 / 466, rel=1e-9)  # the paper's 466 interruptions in 54 days
    assert data["interval_source"] == "daly" and data["young_interval_seconds"] > data["interval_seconds"]
    names = [p["name"] for p in data["policies"]]
    assert names[0] == "as given" and names[-1] == "all of the above" and len(names) == 7
    assert all(0 < p["effective_fraction"] < 1 for p in data["policies"])
    assert len(data["causes"]) == 19 and data["mix"]["source"].startswith("Llama Team")


def test_montecarlo_json_and_table(cli: Any) -> None:
    code, out, err = cli(*ARGS, "--engine", "montecarlo", "--trials", "100", "--seed", "5", "--no-policies", "--json")
    assert code == 0, err
    data = json.loads(out, parse_constant=_no_nan)
    assert data["montecarlo"]["trials"] == 100 and abs(data["analytic"]["montecarlo_minus_analytic_wall"]) < 0.01
    code, out, err = cli(*ARGS, "--interval-seconds", "1800", "--save-on-signal", "--spares", "4")
    assert code == 0, err
    for needle in ("effective fraction", "where the wall time goes", "loss by cause", "policies", "hot spares"):
        assert needle in out
    assert "30.0 min" in out and "free " in out and "[bold]" not in out


def test_plots(cli: Any, tmp_path: Path) -> None:
    interval, fleet = tmp_path / "i.png", tmp_path / "sub" / "f.png"
    code, out, err = cli(*ARGS, "--plot-interval", str(interval), "--plot-fleet", str(fleet), "--json")
    assert code == 0, err
    assert json.loads(out)["files"] == {"interval": str(interval), "fleet": str(fleet)}
    assert interval.read_bytes()[:4] == fleet.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (("--save-seconds", "nan"), ("--save-seconds nan", "finite")),
        (("--save-seconds", "inf"), ("--save-seconds inf",)),
        (("--restart-seconds", "0"), ("--restart-seconds 0",)),
        (("--work-hours", "-1"), ("--work-hours -1",)),
        (("--gpu-mtbf-hours", "nan"), ("--gpu-mtbf-hours nan",)),
        (("--gpus", "0"), ("--gpus 0",)),
        (("--gpus", "10000001"), ("--gpus 10000001", "10,000,000")),
        (("--trials", "100001", "--engine", "montecarlo"), ("--trials 100001", "100,000")),
        (("--trials", "0"), ("--trials 0",)),
        (("--interval-seconds", "-5"), ("--interval-seconds -5",)),
        (("--interval-seconds", "soon"), ("--interval-seconds 'soon'",)),
        (("--interval-seconds", "1e7"), ("cannot make progress", "--interval-seconds")),
        (("--save-seconds", "20000"), ("--save-seconds 20000", "MTBF")),
        (("--engine", "magic"), ("--engine 'magic'",)),
        (("--weibull-shape", "0.7"), ("--weibull-shape 0.7", "montecarlo")),
        (("--mix", "nowhere"), ("--mix 'nowhere'",)),
        (("--restore-seconds", "-1"), ("--restore-seconds -1",)),
        (("--async-stall-seconds", "0"), ("--async-stall-seconds 0",)),
        (("--spares", "-2"), ("--spares -2",)),
        (("--planned-per-day", "inf"), ("--planned-per-day inf",)),
    ],
)
def test_bad_input_is_one_line_exit_2(cli: Any, extra: tuple[str, ...], needles: tuple[str, ...]) -> None:
    args = list(ARGS)
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    code, out, err = cli(*args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and out == "" and len(lines) == 1, (code, err)
    assert lines[0].startswith("error:") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_no_mtbf_without_a_mix(cli: Any) -> None:
    code, _, err = cli("--gpus", "8", "--work-hours", "1", "--save-seconds", "1", "--restart-seconds", "1")
    assert code == 2 and "--gpu-mtbf-hours" in err


# --- the Monte Carlo sweeps `gpufleet goodput --plot` draws: each point is the one-scenario simulation ---


def test_each_point_is_the_simulation_of_that_scenario() -> None:
    taus = [600.0, 3600.0]
    swept = monte_carlo_sweep(ONE, intervals=taus, trials=40, seed=5)
    assert swept == [monte_carlo(replace(ONE, interval_seconds=t), trials=40, seed=5).effective_fraction for t in taus]
    sizes = [10, 5000]
    by_size = monte_carlo_sweep(ONE, sizes=sizes, trials=40, seed=5)
    assert by_size == [monte_carlo(replace(ONE, gpus=n), trials=40, seed=5).effective_fraction for n in sizes]
    assert by_size[0] > by_size[1]  # more GPUs, more interruptions


def test_a_point_without_progress_is_nan_and_the_knobs_are_exclusive() -> None:
    hopeless = replace(ONE, restart_seconds=1e9)
    assert all(math.isnan(y) for y in monte_carlo_sweep(hopeless, sizes=[100_000], trials=10, seed=0))
    with pytest.raises(ParameterError, match="intervals"):
        monte_carlo_sweep(ONE, intervals=[60.0], sizes=[8])
