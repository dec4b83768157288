"""``gpufleet drift REF CUR``: CSV and Parquet in; JSON, table or HTML out; exit 1 on drift if asked, 2 on bad input."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from gpufleet.cli.quality import drift_command, split_assignments, split_columns
from gpufleet.errors import GpufleetError, ParameterError, UsageError
from gpufleet.tables import read_table

app = typer.Typer(pretty_exceptions_enable=False)
app.command("drift")(drift_command)
app.command("noop")(lambda: None)  # two commands, so `drift` stays a subcommand as in the real app


def _run(*args: str) -> tuple[int, str]:
    """Exit code and output as ``gpufleet.cli.app:main`` gives them: a GpufleetError is one line and its code."""
    result = CliRunner().invoke(app, ["drift", *args], env={"COLUMNS": "200"})
    if isinstance(result.exception, GpufleetError):
        return result.exception.exit_code, f"error: {result.exception}"
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


@pytest.fixture
def tables(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A reference CSV, a drifted Parquet (age and city moved) and a Parquet like the reference."""
    g = np.random.default_rng(0)

    def frame(n: int, age: float, cities: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "age": g.normal(age, 10, n),
                "income": g.lognormal(10, 0.5, n),
                "city": g.choice(["paris", "lyon", "lille"], n, p=cities),
            }
        )

    ref, drifted, same = tmp_path / "ref.csv", tmp_path / "drifted.parquet", tmp_path / "same.parquet"
    frame(3000, 40, [0.5, 0.3, 0.2]).to_csv(ref, index=False)
    frame(2000, 46, [0.2, 0.4, 0.4]).to_parquet(drifted)
    frame(2000, 40, [0.5, 0.3, 0.2]).to_parquet(same)
    return ref, drifted, same


def test_json_has_the_contract_keys(tables: tuple[Path, Path, Path]) -> None:
    ref, drifted, _ = tables
    code, out = _run(str(ref), str(drifted), "--json")
    data = json.loads(out)
    assert code == 0 and data["dataset_drift"] is True and data["share_drifted"] == pytest.approx(2 / 3)
    assert set(data["columns"]) == {"age", "income", "city"}
    for col in data["columns"].values():
        assert {"method", "statistic", "p_value", "threshold", "drift", "status", "reason"} <= set(col)
    assert data["columns"]["age"]["method"] == "wasserstein" and data["columns"]["city"]["method"] == "jensenshannon"
    assert [data["columns"][c]["drift"] for c in ("age", "income", "city")] == [True, False, True]


def test_fail_on_drift_exits_1_only_on_drift(tables: tuple[Path, Path, Path]) -> None:
    ref, drifted, same = tables
    assert _run(str(ref), str(drifted), "--fail-on-drift")[0] == 1
    code, out = _run(str(ref), str(same), "--fail-on-drift")
    assert code == 0 and "no dataset drift" in out


def test_methods_thresholds_and_columns(tables: tuple[Path, Path, Path]) -> None:
    ref, drifted, _ = tables
    args = [str(ref), str(drifted), "--columns", "age,city", "--method", "psi", "--method", "age=ks"]
    code, out = _run(*args, "--threshold", "city=0.5", "--json")
    cols = json.loads(out)["columns"]
    assert code == 0 and set(cols) == {"age", "city"}
    assert (cols["age"]["method"], cols["age"]["threshold"]) == ("ks", 0.05)
    assert cols["age"]["p_value"] is not None and cols["age"]["drift"] is True
    assert (cols["city"]["method"], cols["city"]["threshold"], cols["city"]["drift"]) == ("psi", 0.5, False)
    assert cols["city"]["extra"]["psi_null_quantile"] > 0


def test_table_and_html_report(tables: tuple[Path, Path, Path], tmp_path: Path) -> None:
    ref, drifted, _ = tables
    page = tmp_path / "report.html"
    code, out = _run(str(ref), str(drifted), "--html", str(page))
    assert code == 0 and "wasserstein" in out and "dataset drift: 2 of 3" in out and str(page) in out
    text = page.read_text(encoding="utf-8")

    class Tags(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []
            self.links: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.append(tag)
            self.links += [v or "" for k, v in attrs if k in {"src", "href"}]

    parser = Tags()
    parser.feed(text)
    assert parser.tags.count("svg") == 3 and parser.tags.count("tr") == 4
    assert "script" not in parser.tags and parser.links == []  # self-contained: nothing to fetch
    assert "dataset drift: 2 of 3 tested columns drifted" in text


def test_html_escapes_column_names(tmp_path: Path) -> None:
    ref, cur = tmp_path / "a.csv", tmp_path / "b.csv"
    frame = pd.DataFrame({"<script>alert(1)</script>": np.arange(50.0)})
    frame.to_csv(ref, index=False)
    frame.to_csv(cur, index=False)
    page = tmp_path / "r.html"
    assert _run(str(ref), str(cur), "--html", str(page))[0] == 0
    text = page.read_text(encoding="utf-8")
    assert "<script>" not in text and "&lt;script&gt;" in text


def test_skipped_columns_are_reported_and_fail_the_gate(tmp_path: Path) -> None:
    ref, cur = tmp_path / "a.csv", tmp_path / "b.csv"
    pd.DataFrame({"x": [1.0] * 20}).to_csv(ref, index=False)
    pd.DataFrame({"x": [2.0] * 20}).to_csv(cur, index=False)
    code, out = _run(str(ref), str(cur), "--json")
    data = json.loads(out)
    assert code == 0 and data["columns"]["x"]["status"] == "skipped" and data["columns"]["x"]["drift"] is None
    assert data["tested"] == 0 and "single value" in data["columns"]["x"]["reason"]
    assert _run(str(ref), str(cur), "--fail-on-drift")[0] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "magic"], "unknown drift method"),
        (["--method", "zip=ks"], "not compared"),
        (["--threshold", "x=abc"], "not a number"),
        (["--threshold", "0.1", "--threshold", "0.2"], "given twice"),
        (["--columns", ","], "--columns is empty"),
        (["--correction", "holm"], "--correction"),
    ],
)
def test_bad_options_exit_2(tables: tuple[Path, Path, Path], args: list[str], message: str) -> None:
    ref, drifted, _ = tables
    code, out = _run(str(ref), str(drifted), *args)
    assert code == 2 and message in out


def test_a_missing_threshold_is_asked_for_by_parameter_in_the_core_and_by_flag_here(
    tables: tuple[Path, Path, Path],
) -> None:
    from gpufleet.quality.drift import drift_report

    ref, drifted, _ = tables
    why = "wasserstein_raw has no scale-free default threshold: give one, e.g. "
    with pytest.raises(ParameterError) as core:
        drift_report(read_table(ref), read_table(drifted), method="wasserstein_raw")
    assert str(core.value) == why + "threshold=0.5"
    assert _run(str(ref), str(drifted), "--method", "wasserstein_raw") == (2, "error: " + why + "--threshold 0.5")


def test_bad_files_exit_2(tables: tuple[Path, Path, Path], tmp_path: Path) -> None:
    ref, _, _ = tables
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    (tmp_path / "data.xlsx").write_bytes(b"")
    for path, message in (
        (tmp_path / "missing.csv", "no such file"),
        (garbage, "cannot read it as parquet"),
        (tmp_path / "data.xlsx", "unknown table format"),
    ):
        code, out = _run(str(ref), str(path))
        assert code == 2 and message in out and str(path) in out


def test_read_table_reads_both_formats(tables: tuple[Path, Path, Path], tmp_path: Path) -> None:
    ref, drifted, _ = tables
    assert list(read_table(ref).columns) == ["age", "income", "city"]
    assert len(read_table(drifted)) == 2000
    tsv = tmp_path / "t.tsv"
    tsv.write_text("a\tb\n1\tx\n2\ty\n", encoding="utf-8")
    assert read_table(tsv)["b"].tolist() == ["x", "y"]


def test_option_parsing() -> None:
    assert split_columns(["a,b", " c "]) == ["a", "b", "c"] and split_columns(None) is None
    assert split_assignments(["psi", "age=ks", "a=b=chi2"], "--method") == ("psi", {"age": "ks", "a=b": "chi2"})
    with pytest.raises(UsageError, match="COLUMN=VALUE"):
        split_assignments(["=ks"], "--method")


def test_html_draws_an_embedding_column() -> None:
    from gpufleet.quality.drift import drift_report
    from gpufleet.quality.html import render_html

    g = np.random.default_rng(1)
    ref, cur = {"emb": g.normal(size=(60, 5))}, {"emb": g.normal(0.5, size=(50, 5))}
    page = render_html(drift_report(ref, cur), ref, cur, title="t")
    assert page.count("<svg") == 1 and "mmd" in page and "dataset drift" in page
