"""The cost note: three files, JSON equal to the ledger, readable Markdown, a real PNG."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from gpufleet.cost.ledger import AttemptUsage, Ledger, build_ledger
from gpufleet.cost.note import NoteEvent, NotePaths, write_cost_note
from gpufleet.cost.rates import load_rates

T0 = 1_800_000_000.0
GENERATED = T0 + 4000.0


def sample_usages() -> list[AttemptUsage]:
    """Three jobs, two teams: a preempted and resumed spot job, a rollback, a tiny CPU demo."""
    llama = AttemptUsage(
        job_id=1,
        job_name="llama-ft",
        team="nlp",
        attempt=1,
        gpu_type="H100",
        provider="lambda",
        spot=True,
        gpus=1,
        start=T0,
        end=T0,
        outcome="completed",
    )
    vit = replace(llama, job_id=2, job_name="vit-sweep", team="vision", gpu_type="A100", provider="gcp", spot=False)
    demo = replace(vit, job_id=3, job_name="cpu-demo", gpu_type="cpu", provider="local")
    return [
        replace(llama, attempt=1, spot=True, gpus=1, start=T0, end=T0 + 1500, outcome="preempted",
                startup_s=60, checkpoint_s=30, lost_s=200, steps_done=480, steps_redone=64,
                first_step=0, last_step=479, checkpoints=(T0 + 500, T0 + 900, T0 + 1300)),
        replace(llama, attempt=2, spot=True, gpus=1, start=T0 + 1560, end=T0 + 3000, outcome="completed",
                startup_s=50, restore_s=20, checkpoint_s=25, steps_done=585, first_step=416, last_step=1000,
                checkpoints=(T0 + 2000, T0 + 2500, T0 + 2990)),
        replace(vit, attempt=1, spot=False, gpus=2, start=T0 + 200, end=T0 + 2600, outcome="completed",
                startup_s=90, restore_s=40, checkpoint_s=40, lost_s=120, steps_done=2150, steps_redone=150,
                first_step=0, last_step=1999, checkpoints=(T0 + 800, T0 + 1300, T0 + 1900, T0 + 2590),
                rollbacks=(T0 + 1400,)),
        replace(demo, attempt=1, spot=False, gpus=1, start=T0 + 100, end=T0 + 130, outcome="preempted",
                startup_s=4, lost_s=5, steps_done=40, steps_redone=10, first_step=0, last_step=39,
                checkpoints=(T0 + 120,)),
        replace(demo, attempt=2, spot=False, gpus=1, start=T0 + 140, end=T0 + 190, outcome="completed",
                startup_s=3, restore_s=1, steps_done=70, first_step=30, last_step=99, checkpoints=(T0 + 188,)),
    ]  # fmt: skip


def sample_events() -> list[NoteEvent]:
    return [
        NoteEvent(1, T0 + 1500, "preempted", "spot instance reclaimed at step 479"),
        NoteEvent(1, T0 + 1580, "resumed", "resumed from step 416"),
        NoteEvent(2, T0 + 1400, "rollback", "loss spike: rolled back to step 1200"),
        NoteEvent(3, T0 + 130, "preempted", "SIGTERM"),
    ]


def write_sample(out_dir: Path) -> tuple[NotePaths, Ledger]:
    usages = sample_usages()
    ledger = build_ledger(usages, load_rates())
    paths = write_cost_note(out_dir, usages, ledger, title="Fleet demo", events=sample_events(), generated_at=GENERATED)
    return paths, ledger


def test_writes_three_files(tmp_path: Path) -> None:
    out = tmp_path / "notes" / "demo"
    paths, _ = write_sample(out)
    assert paths == NotePaths(out / "cost-note.md", out / "cost-note.json", out / "timeline.png")
    for path in (paths.markdown, paths.json, paths.png):
        assert path.is_file()
    assert sorted(p.name for p in out.iterdir()) == ["cost-note.json", "cost-note.md", "timeline.png"]


def test_json_matches_ledger(tmp_path: Path) -> None:
    paths, ledger = write_sample(tmp_path)
    data = json.loads(paths.json.read_text(encoding="utf-8"))
    assert list(data) == ["title", "generated_at", "currency", "total", "teams", "jobs", "events"]
    assert data["title"] == "Fleet demo"
    assert data["generated_at"] == "2027-01-15T09:06:40Z"
    assert data["currency"] == "USD"
    assert data["total"] == ledger.total.to_dict()
    assert data["teams"] == {team: cost.to_dict() for team, cost in ledger.teams.items()}
    assert [j["job_id"] for j in data["jobs"]] == [1, 2, 3]
    llama = data["jobs"][0]
    assert (llama["name"], llama["team"], llama["gpu_type"], llama["provider"], llama["spot"]) == (
        "llama-ft",
        "nlp",
        "H100",
        "lambda",
        True,
    )
    assert llama["money"] == ledger.jobs[1].to_dict()["money"]
    assert [a["attempt"] for a in llama["attempts"]] == [1, 2]
    first = llama["attempts"][0]
    assert first["outcome"] == "preempted"
    assert first["wall_s"] == 1500
    assert sum(first["seconds"].values()) == pytest.approx(1500)
    assert first["seconds"]["lost"] == 200
    assert [e["kind"] for e in data["events"]] == ["preempted", "rollback", "preempted", "resumed"]
    # Byte-for-byte deterministic.
    again, _ = write_sample(tmp_path / "again")
    assert again.json.read_bytes() == paths.json.read_bytes()


def test_json_floats_are_finite(tmp_path: Path) -> None:
    paths, _ = write_sample(tmp_path)

    def walk(value: object) -> None:
        if isinstance(value, float):
            assert math.isfinite(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(json.loads(paths.json.read_text(encoding="utf-8"), parse_constant=lambda c: pytest.fail(c)))


def test_markdown_reads_well(tmp_path: Path) -> None:
    paths, ledger = write_sample(tmp_path)
    md = paths.markdown.read_text(encoding="utf-8")
    assert md.startswith("# Fleet demo\n")
    for word in ("nlp", "vision", "llama-ft", "vit-sweep", "cpu-demo", "preempted", "rollback"):
        assert word in md
    assert "![timeline](timeline.png)" in md
    assert "## How to read this" in md
    assert "**Useful**" in md and "**Lost**" in md
    assert f"${ledger.total.money:,.2f}" in md
    assert "loss spike: rolled back to step 1200" in md
    assert "0..479" in md and "416..1000" in md


def test_tiny_costs_show_fractions_of_a_cent(tmp_path: Path) -> None:
    # 30 s of one CPU at 0.05/h = 0.000417.
    usages = [u for u in sample_usages() if u.job_id == 3][:1]
    ledger = build_ledger(usages, load_rates())
    paths = write_cost_note(tmp_path, usages, ledger, generated_at=GENERATED)
    md = paths.markdown.read_text(encoding="utf-8")
    assert "$0.000417" in md
    assert "30.0 GPU-seconds" in md
    assert "Lost (GPU-s)" in md


def test_currency_code_when_no_symbol(tmp_path: Path) -> None:
    card = replace(load_rates(), currency="CHF")
    usages = sample_usages()
    paths = write_cost_note(tmp_path, usages, build_ledger(usages, card), generated_at=GENERATED)
    assert " CHF" in paths.markdown.read_text(encoding="utf-8")
    assert "$" not in paths.markdown.read_text(encoding="utf-8")


def test_png_is_a_real_image(tmp_path: Path) -> None:
    paths, _ = write_sample(tmp_path)
    data = paths.png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 5 * 1024


def test_zero_time_and_no_attempts_do_not_crash(tmp_path: Path) -> None:
    zero = AttemptUsage(job_id=7, job_name="instant", team="infra", attempt=1, gpu_type="L4", provider="x",
                        spot=True, gpus=1, start=T0, end=T0, outcome="failed")  # fmt: skip
    ledger = build_ledger([zero], load_rates())
    paths = write_cost_note(tmp_path / "zero", [zero], ledger, generated_at=GENERATED)
    md = paths.markdown.read_text(encoding="utf-8")
    assert "instant" in md and "0.0 %" not in md
    assert json.loads(paths.json.read_text(encoding="utf-8"))["total"]["gpu_hours"] == 0
    assert paths.png.read_bytes().startswith(b"\x89PNG")

    empty = write_cost_note(tmp_path / "empty", [], build_ledger([], load_rates()), generated_at=GENERATED)
    assert json.loads(empty.json.read_text(encoding="utf-8"))["jobs"] == []
    assert empty.png.is_file()


def test_markdown_table_cells_are_escaped(tmp_path: Path) -> None:
    odd = AttemptUsage(job_id=9, job_name="a|b", team="t|1", attempt=1, gpu_type="cpu", provider="local",
                       spot=False, gpus=1, start=T0, end=T0 + 10, outcome="completed")  # fmt: skip
    paths = write_cost_note(tmp_path, [odd], build_ledger([odd], load_rates()), generated_at=GENERATED)
    md = paths.markdown.read_text(encoding="utf-8")
    assert "a\\|b" in md and "t\\|1" in md


def preempted_three_times() -> list[AttemptUsage]:
    """A job preempted three times: 0.0624 s of lost work, 31.5 s of preemption overhead in all.

    Overhead by hand: lost 0.02 + 0.03 + 0.0124 = 0.0624; start-up 2 (attempt 1's shut-down) + 9 + 8.5 + 7
    = 26.5; restore 0.8 + 0.7 + 0.5 = 2.0; saves at the signal 1.0 + 1.0 + 0.9 = 2.9; total 31.4624 of a
    370 s wall (8.5 %). Attempt 4's rollback (5 s redone, 1.2 s reload) is lost and restore, not overhead.
    """
    job = AttemptUsage(job_id=4, job_name="lm-spot", team="nlp", attempt=1, gpu_type="H100", provider="lambda",
                       spot=True, gpus=1, start=T0, end=T0 + 100, outcome="preempted", first_step=0)  # fmt: skip
    return [
        replace(job, attempt=1, startup_s=10.0, shutdown_s=2.0, checkpoint_s=1.5, preempt_save_s=1.0, lost_s=0.02),
        replace(job, attempt=2, start=T0 + 110, end=T0 + 200, outcome="requeued", after_preemption=True,
                startup_s=9.0, shutdown_s=1.5, restore_s=0.8, checkpoint_s=1.0, preempt_save_s=1.0, lost_s=0.03),
        replace(job, attempt=3, start=T0 + 210, end=T0 + 300, after_preemption=True, startup_s=8.5, shutdown_s=0.5,
                restore_s=0.7, checkpoint_s=0.9, preempt_save_s=0.9, lost_s=0.0124),
        replace(job, attempt=4, start=T0 + 310, end=T0 + 400, outcome="completed", after_preemption=True,
                startup_s=7.0, restore_s=1.7, rollback_restore_s=1.2, checkpoint_s=0.5, lost_s=5.0,
                rollback_lost_s=5.0, rollbacks=(T0 + 350,)),
    ]  # fmt: skip


def test_headline_counts_the_whole_preemption_overhead(tmp_path: Path) -> None:
    usages = preempted_three_times()
    ledger = build_ledger(usages, load_rates())
    paths = write_cost_note(tmp_path, usages, ledger, generated_at=GENERATED)
    md = paths.markdown.read_text(encoding="utf-8")
    assert ledger.total.preemption_money == pytest.approx(31.4624 / 3600 * 1.49)  # H100 spot on the default card
    headline = (
        "3 preemptions cost **31.5 GPU-s (8.5 %) of preemption overhead**, about $0.013: 0.0624 GPU-s of lost "
        "work, 26.5 GPU-s of restart start-up and shut-down, 2.00 GPU-s of restore and 2.90 GPU-s of saving at "
        "the signal."
    )
    assert headline in md
    assert "**5.06 GPU-s (1.4 %)** were lost to work redone after 3 preemptions and 1 rollback" in md
    assert "| 31.5 (8.5 %) |" in md  # the team's and the job's rows
    assert "**Preemption overhead**" in md  # and how to read it

    data = json.loads(paths.json.read_text(encoding="utf-8"))
    (job,) = data["jobs"]
    assert job["preemption_overhead_gpu_seconds"] == data["total"]["preemption_overhead_gpu_seconds"] == 31.4624
    assert job["preemption_overhead_gpu_seconds_by_bucket"] == {
        "lost": 0.0624,
        "checkpoint": 2.9,
        "restore": 2.0,
        "staging": 0.0,
        "startup": 26.5,
    }
    assert job["preemption_overhead_share"] == pytest.approx(31.4624 / 370, rel=1e-5)
    assert job["lost_gpu_hours"] == pytest.approx(5.0624 / 3600, rel=1e-5)
    last = job["attempts"][3]
    assert last["after_preemption"] is True
    assert last["preemption_seconds"] == {
        "lost": 0.0,
        "checkpoint": 0.0,
        "restore": 0.5,
        "staging": 0.0,
        "startup": 7.0,
    }


def test_headline_without_preemptions_says_so(tmp_path: Path) -> None:
    usages = [u for u in sample_usages() if u.job_id == 2]
    paths = write_cost_note(tmp_path, usages, build_ledger(usages, load_rates()), generated_at=GENERATED)
    assert "No attempt was preempted." in paths.markdown.read_text(encoding="utf-8")
