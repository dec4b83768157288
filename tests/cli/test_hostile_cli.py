"""Hostile input at the command line: exit 2, one line on stderr naming the value, no traceback, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from conftest import REPO, assert_refused, run_cli

from gpufleet.cli import app as app_module
from gpufleet.errors import UsageError
from gpufleet.telemetry.dcgm import parse_exposition
from gpufleet.telemetry.gpu.sources import ScrapeSource, check_scrape_url

SPEC = "name: hostile\nentrypoint: gpufleet.workloads.toy:train\n"


# --- 1. Click's own usage errors -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (("show", "0"), ("'job_id'", "got 0", "(see gpufleet show --help)")),
        (("show", "abc"), ("'job_id'", "got abc")),
        (("show", "9" * 5000), ("'job_id'", "(5000 characters)")),
        (("show", "a\nb"), ("'job_id'", "got 'a\\nb'")),
        (("diagnose", "1", "--window", "0"), ("'--window'", "got 0", "(see gpufleet diagnose --help)")),
        (
            ("observe", "diagnose", "--pattern", "healthy", "--gpus", "0"),
            ("'--gpus'", "got 0", "(see gpufleet observe diagnose --help)"),
        ),
        (("show", "--bogus"), ("--bogus",)),
        (("no-such-command",), ("no-such-command", "(see gpufleet --help)")),
    ],
)
def test_click_usage_errors_are_one_line(
    home: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    needles: tuple[str, ...],
) -> None:
    code, out, err = run_cli(capsys, monkeypatch, *argv)
    assert_refused(code, err, home, *needles)
    assert "╭" not in err and "Usage:" not in err and out == ""


def test_help_and_no_arguments_still_print_the_help(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli(capsys, monkeypatch, "show", "--help")
    assert code == 0 and "Usage" in out and err == ""
    code, out, err = run_cli(capsys, monkeypatch, "observe")
    assert code == 2 and "Usage" in out and err == ""


@pytest.mark.parametrize(
    ("raise_", "code", "line"),
    [
        (typer.Exit(0), 0, None),
        (typer.Exit(1), 1, None),
        (typer.Exit(3), 3, None),
        (typer.Abort(), 130, "aborted"),
        (KeyboardInterrupt(), 130, "aborted"),
        (UsageError("bad --x 'a\nb\x1b[31m'; give y"), 2, "error: bad --x 'a\\nb\\x1b[31m'; give y"),
    ],
)
def test_exits_and_errors_keep_their_codes(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    raise_: BaseException,
    code: int,
    line: str | None,
) -> None:
    tiny = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @tiny.command()
    def go() -> None:
        raise raise_

    monkeypatch.setattr(app_module, "app", tiny)
    got, _, err = run_cli(capsys, monkeypatch)
    lines = err.splitlines()
    assert got == code, (got, err)
    assert lines == ([] if line is None else [line]), err


def test_a_command_that_returns_exits_0(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = typer.Typer(add_completion=False)

    @tiny.command()
    def go() -> None:
        print("done")

    monkeypatch.setattr(app_module, "app", tiny)
    assert run_cli(capsys, monkeypatch) == (0, "done\n", "")


# --- 2. an error message with a newline ----------------------------------------------------------


def test_a_newline_in_a_catalogue_name_stays_on_one_line(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "as_of: 2026-12-01\ncurrency: USD\ngpu_types:\n  H100: {memory_gib: 80, throughput: {training: 1.0}}\n"
        'offers:\n  - {provider: "aws\\nevil", region: us-east-1, gpu_type: H100, gpus_per_node: 8,\n'
        "     on_demand_per_gpu_hour: 6.88, capacity_gpus: 32}\n"
    )
    batch = str(REPO / "examples" / "batch.yaml")
    code, _, err = run_cli(capsys, monkeypatch, "place", batch, "--catalog", str(catalog), "--block", "gcp")
    assert_refused(code, err, home, str(catalog), "aws\\nevil")


# --- 3. a scrape URL with a newline --------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("scrape:http://a\nb", "control character"),
        ("scrape:http://a b/metrics", "whitespace"),
        ("scrape:ftp://node/metrics", "is not http"),
        ("scrape:http:///metrics", "names no host"),
        ("scrape:http://node:99999/metrics", "port"),
    ],
)
def test_a_bad_gpu_source_url_is_refused(
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    problem: str,
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(spec), "--gpu-source", url)
    assert_refused(code, err, home, "gpu_source", problem)
    spec.write_text(SPEC + f"telemetry: {{gpu_source: {json.dumps(url)}}}\n")  # a YAML double-quoted string
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(spec))
    assert_refused(code, err, home, str(spec), "gpu_source", problem)


def test_check_scrape_url() -> None:
    assert check_scrape_url("http://node:9400/metrics") == "http://node:9400/metrics"
    assert check_scrape_url("https://[::1]:9400/metrics") == "https://[::1]:9400/metrics"
    for bad in ("http://a\nb", "http://a\tb", "node:9400/metrics", "http://", "http://h:0/"):
        with pytest.raises(ValueError, match="scrape URL"):
            check_scrape_url(bad)
    with pytest.raises(UsageError, match="control character"):
        ScrapeSource("http://a\rb/metrics")


# --- 4. a CSV of losses that is not UTF-8 --------------------------------------------------------


def test_a_non_utf8_loss_csv_is_refused(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    csv = tmp_path / "losses.csv"
    csv.write_bytes(b"step,loss\n1,2.0\n2,\xff\xfe3\n")
    code, _, err = run_cli(capsys, monkeypatch, "debug", "spikes", str(csv))
    assert_refused(code, err, home, str(csv), "not UTF-8")


def test_a_huge_loss_csv_cell_is_refused_briefly(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    csv = tmp_path / "losses.csv"
    csv.write_text("step,loss\n" + "1" * 5000 + ",1.0\n")
    code, _, err = run_cli(capsys, monkeypatch, "debug", "spikes", str(csv))
    assert len(assert_refused(code, err, home, str(csv), "5000 characters")) < 300
    csv.write_text("step,loss\n1," + "9" * 200_000 + "\n")  # over the csv module's field limit
    code, _, err = run_cli(capsys, monkeypatch, "debug", "spikes", str(csv))
    assert_refused(code, err, home, str(csv), "field limit")


# --- 5. a scrape with a 5,000-digit timestamp ----------------------------------------------------

LINE = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="u"} 50'


def test_a_huge_scrape_timestamp_skips_the_line_with_a_warning(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Like every other malformed line of a scrape: skipped with a warning, the rest still read.
    scrape = tmp_path / "scrape.txt"
    scrape.write_text(f"{LINE} {'1' * 5000}\n{LINE} 1700000000000\n")
    code, out, err = run_cli(capsys, monkeypatch, "observe", "diagnose", str(scrape), "--json")
    assert code == 0 and err == "" and "Traceback" not in out
    assert "line 1 skipped: timestamp" in out and "out of range" in out and "1" * 100 not in out
    assert not home.exists() or not any(home.rglob("*"))


@pytest.mark.parametrize("stamp", ["1" * 5000, "0" * 5000 + "1" * 20, str(2**63), str(-(2**63) - 1)])
def test_parse_exposition_skips_out_of_range_timestamps(stamp: str) -> None:
    result = parse_exposition(f"{LINE} {stamp}\n")
    assert result.samples == ()
    assert [w.kind for w in result.warnings] == ["broken_line"] and "out of range" in result.warnings[0].message
    assert len(result.warnings[0].message) < 400


def test_parse_exposition_keeps_64_bit_timestamps() -> None:
    text = f"{LINE} {2**63 - 1}\n{LINE} {-(2**63)}\n{LINE} {'0' * 5000}7\n"
    assert [s.timestamp_ms for s in parse_exposition(text).samples] == [2**63 - 1, -(2**63), 7]
