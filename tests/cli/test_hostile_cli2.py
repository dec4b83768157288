"""Hostile input at the command line, second part: refused before anything is written, markup shown as text,
unopenable paths, truncated tables, malformed URLs, undecodable arguments, absurd numbers.

Every refusal is exit 2 with one line on stderr naming the value, no traceback, and the home untouched.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from conftest import REPO, assert_refused, run_cli
from rich.console import Console

from gpufleet.cli import app as app_module
from gpufleet.cli.render import table
from gpufleet.cli.watch import describe
from gpufleet.errors import SpecError, UsageError
from gpufleet.jobs.store import Event, Store
from gpufleet.spec import parse_spec

SPEC = "name: hostile\nentrypoint: gpufleet.workloads.toy:train\n"
CATALOG = REPO / "examples" / "catalog.yaml"
BATCH = REPO / "examples" / "batch.yaml"
LONG = "a" * 300  # one name over the 255 bytes a file system takes: ENAMETOOLONG


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """A submit that gets through starts no scheduler (so a wrongly accepted spec runs nothing)."""
    monkeypatch.setattr("gpufleet.backends.local.process.ensure_scheduler", lambda home: None)


# --- 1. a refused command creates no store --------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("show", "5"), "no job 5"),
        (("show", "5", "--json"), "no job 5"),
        (("logs", "5"), "no job 5"),
        (("cancel", "5"), "no job 5"),
        (("preempt", "5"), "no job 5"),
        (("preempt", "5", "--grace", "-1"), "--grace -1.0 is invalid"),
        (("preempt", "5", "--grace", "nan"), "--grace nan is invalid"),
        (("resize", "5", "--gpus", "0"), "no job 5"),
        (("resize", "5", "--gpus", "-3"), "--gpus -3 is invalid: give the GPUs per node, from 0 to 1024"),
        (("resize", "5", "--gpus", "1", "--nodes", "0"), "--nodes 0 is invalid"),
        (("trace", "5"), "no job 5"),
        (("diagnose", "5"), "no job 5"),
        (("cost", "--job", "5"), "no job 5"),
        (("slurm", "hold", "5"), "no job 5"),
    ],
)
def test_a_refusal_on_a_new_home_creates_no_store(
    home: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    needle: str,
) -> None:
    code, out, err = run_cli(capsys, monkeypatch, *argv)
    assert_refused(code, err, home, needle)
    assert out == ""


def test_listing_the_jobs_of_a_new_home_creates_no_store(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli(capsys, monkeypatch, "jobs", "--json")
    assert (code, json.loads(out), err) == (0, {"jobs": [], "total": 0, "limit": 50, "offset": 0}, "")
    assert not home.exists()


def test_a_submit_the_backend_cannot_run_creates_no_store(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, no_scheduler: None
) -> None:
    spec = write(tmp_path / "two-nodes.yaml", SPEC + "resources: {gpus: 2, nodes: 2}\ndistributed: {strategy: ddp}\n")
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(spec))
    assert_refused(code, err, home, "local backend does not support jobs over more than one node")
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "soon")
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(write(tmp_path / "ok.yaml", SPEC)))
    assert_refused(code, err, home, "GPUFLEET_LOG_EVERY_S='soon' is invalid")


@pytest.mark.parametrize("argv", [("quality", "doc", "m"), ("registry", "history", "m")])
def test_an_unknown_model_on_a_new_home_creates_no_registry(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, _, err = run_cli(capsys, monkeypatch, *argv)
    assert_refused(code, err, home, "model 'm' is not registered", "(registered: none)")


# --- 2. markup in values is shown as text -------------------------------------------------------


def test_table_cells_and_titles_are_text() -> None:
    console = Console(width=200, record=True)
    console.print(table("in c[/]k", ["[bold]col"], [["[/]"], ["[bold]x[/bold]"]]))
    text = console.export_text()
    assert "in c[/]k" in text and "[bold]col" in text and "[/]" in text and "[bold]x[/bold]" in text


def test_a_job_event_with_markup_is_described_as_text() -> None:
    event = Event(1, 2, 0.0, "unhealthy", "runtime", {"step": "[/]", "loss": "[bold]", "reason": "[red]x"})
    line = describe(event)
    assert line is not None
    console = Console(width=200, record=True)
    console.print(line)
    assert "unhealthy step [/]: loss [bold] ([red]x)" in console.export_text()
    restored = describe(Event(1, 2, 0.0, "restore", "runtime", {"step": 3, "seconds": "[/]"}))
    assert restored is not None and "[/]" in Console(record=True).render_str(restored).plain


def test_drift_column_names_with_markup_are_printed(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = "\n".join(f"{i},{i % 7}" for i in range(40))
    ref = write(tmp_path / "ref.csv", f"[/],[bold]x\n{rows}\n")
    cur = write(tmp_path / "cur.csv", f"[/],[bold]x\n{rows}\n")
    monkeypatch.setenv("COLUMNS", "250")
    code, out, err = run_cli(capsys, monkeypatch, "drift", str(ref), str(cur))
    assert code == 0 and err == "", err
    assert "[/]" in out and "[bold]x" in out


def test_a_checkpoint_folder_with_markup_in_its_name_is_printed(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "c[/]k"
    (folder / "step-00000001").mkdir(parents=True)
    monkeypatch.setenv("COLUMNS", "250")
    code, out, err = run_cli(capsys, monkeypatch, "ckpt", "verify", str(folder), "--job", "[/]x")
    assert code == 1 and "Traceback" not in err, err
    assert f"{folder}/step-00000001: manifest.json is missing" in out
    code, out, err = run_cli(capsys, monkeypatch, "ckpt", "list", str(folder))
    assert code == 0 and str(folder) in out, err


def test_a_workload_class_with_markup_is_printed_by_place_explain(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = {"name": "j", "entrypoint": "m:f", "resources": {"gpu_type": "H100", "gpus": 8}}
    batch = write(tmp_path / "batch.yaml", yaml.safe_dump([{**job, "placement": {"workload": "[/]x"}}]))
    monkeypatch.setenv("COLUMNS", "250")
    code, out, err = run_cli(capsys, monkeypatch, "place", str(batch), "--catalog", str(CATALOG), "--explain")
    assert code == 1 and err == "", err  # infeasible: no GPU type has a throughput for that class
    assert "workload '[/]x'" in out


# --- 3. paths that cannot be read, or named ------------------------------------------------------


def _not_regular(tmp_path: Path, kind: str, suffix: str) -> Path:
    if kind == "fifo":
        path = tmp_path / f"pipe{suffix}"
        os.mkfifo(path)  # no writer: a blocking open or read would hang
        return path
    if kind == "folder":
        path = tmp_path / f"folder{suffix}"
        path.mkdir()
        return path
    path = tmp_path / f"zero{suffix}"
    path.symlink_to("/dev/zero")  # never ends: an unbounded read exhausts memory
    return path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
@pytest.mark.parametrize("surface", ["observe-diagnose", "drift"])
def test_a_file_argument_that_is_not_a_regular_file_is_refused(
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    surface: str,
    kind: str,
) -> None:
    if surface == "drift":
        path = _not_regular(tmp_path, kind, ".csv")
        argv = ["drift", str(path), str(write(tmp_path / "ok.csv", "a\n1\n2\n"))]
    else:
        path = _not_regular(tmp_path, kind, ".txt")
        argv = ["observe", "diagnose", str(path)]
    code, _, err = run_cli(capsys, monkeypatch, *argv)
    assert_refused(code, err, home, str(path), "not a regular file")


@pytest.mark.parametrize(
    "argv",
    [
        ["observe", "diagnose", "DIR/LONG"],
        ["drift", "DIR/LONG.csv", "DIR/LONG.csv"],
        ["debug", "spikes", "DIR/LONG.csv"],
        ["ckpt", "list", "DIR/LONG"],
        ["ckpt", "verify", "DIR/LONG"],
        ["ckpt", "export", "DIR", "--out", "DIR/LONG.pt"],
        ["observe", "rules", "--out", "DIR/LONG.yaml"],
        ["observe", "dashboard", "--out", "DIR/x/LONG/y.json"],
        ["cost", "--out", "DIR/LONG"],
        ["export", "skypilot", "SPEC", "--out", "DIR/LONG.yaml"],
        ["drift", "DIR/ok.csv", "DIR/ok.csv", "--html", "DIR/LONG.html"],
        ["simulate", "--catalog", str(CATALOG), "--jobs", "5", "--out", "DIR/LONG"],
        ["quality", "doc", "m", "--out", "DIR/LONG.md"],
    ],
)
def test_a_path_name_too_long_is_refused_in_one_line(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    write(tmp_path / "ok.csv", "a\n1\n2\n")
    spec = write(tmp_path / "spec.yaml", SPEC)
    words = [a.replace("DIR", str(tmp_path)).replace("LONG", LONG).replace("SPEC", str(spec)) for a in argv]
    before = sorted(tmp_path.rglob("*"))
    code, out, err = run_cli(capsys, monkeypatch, *words)
    line = assert_refused(code, err, home, "aaaa", "(3")  # the path, cut in the middle, with its length
    assert len(line) < 400 and out == ""
    assert sorted(tmp_path.rglob("*")) == before  # no output file, no folder left behind


# --- 4. tables that end early, or do not end ------------------------------------------------------


def test_a_truncated_csv_gz_is_refused_not_taken_for_ctrl_d(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = gzip.compress(("a,b\n" + "".join(f"{i},{i * 2}\n" for i in range(2000))).encode())
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    ok = write(tmp_path / "ok.csv", "a,b\n1,2\n")
    code, _, err = run_cli(capsys, monkeypatch, "drift", str(cut), str(ok))
    assert_refused(code, err, home, str(cut), "truncated")
    not_gz = tmp_path / "plain.csv.gz"
    not_gz.write_bytes(b"a,b\n1,2\n")
    code, _, err = run_cli(capsys, monkeypatch, "drift", str(ok), str(not_gz))
    assert_refused(code, err, home, str(not_gz), "Not a gzipped file")


def test_a_csv_gz_that_decompresses_past_the_limit_is_refused(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpufleet.tables.MAX_TABLE_BYTES", 100_000)
    bomb = tmp_path / "bomb.csv.gz"
    bomb.write_bytes(gzip.compress(b"a,b\n" + b"1,2\n" * 1_000_000))  # 4 MB from a few kB
    assert bomb.stat().st_size < 100_000
    ok = write(tmp_path / "ok.csv", "a,b\n1,2\n")
    code, _, err = run_cli(capsys, monkeypatch, "drift", str(ok), str(bomb))
    assert_refused(code, err, home, str(bomb), "decompresses to more than 100,000 bytes")


# --- 5. trace --endpoint --------------------------------------------------------------------------


@pytest.fixture
def traced_job(home: Path) -> int:
    store = Store(home / "state.db")
    job = store.add_job(parse_spec(yaml.safe_load(SPEC)), "local")
    store.close()
    return job


@pytest.mark.parametrize(
    ("endpoint", "problem"),
    [
        ("http://[", "is not a valid URL"),
        ("http://a:99999", "Port out of range"),
        ("ftp://x", "is not an http(s) URL"),
        ("http://a\nb", "control character"),
        ("http://a b", "whitespace"),
        ("", "is empty"),
        ("http://", "names no host"),
        ("localhost:4318", "is not an http(s) URL"),
    ],
)
def test_a_malformed_trace_endpoint_is_refused_before_the_trace_is_written(
    home: Path,
    traced_job: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    endpoint: str,
    problem: str,
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    code, out, err = run_cli(capsys, monkeypatch, "trace", str(traced_job), "--endpoint", endpoint)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --endpoint "), err
    assert problem in lines[0] and out == ""
    assert not (home / "jobs" / str(traced_job) / "trace.otlp.json").exists()


def test_a_malformed_otel_variable_is_refused_naming_it(
    home: Path, traced_job: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:0")
    code, _, err = run_cli(capsys, monkeypatch, "trace", str(traced_job))
    assert code == 2 and err.startswith("error: OTEL_EXPORTER_OTLP_ENDPOINT='http://collector:0' has port 0"), err
    assert not (home / "jobs" / str(traced_job) / "trace.otlp.json").exists()


# --- 6. undecodable arguments, and characters that break a line ------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("jobs", "--team", "\udcff"), "--team '\\xff' is not UTF-8 text"),
        (("cost", "--team", "a\udcffb"), "--team 'a\\xffb' is not UTF-8 text"),
        (("ckpt", "verify", ".", "--job", "\udcfe"), "--job '\\xfe' is not UTF-8 text"),
        (("registry", "history", "m\udcff"), "MODEL 'm\\xff' is not UTF-8 text"),
    ],
)
def test_an_argument_that_is_not_utf8_is_refused(
    home: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    needle: str,
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, *argv)
    assert_refused(code, err, home, needle)


def test_a_non_utf8_gpu_source_is_refused_before_the_spec_is_stored(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, no_scheduler: None
) -> None:
    spec = write(tmp_path / "spec.yaml", SPEC)
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(spec), "--gpu-source", "scrape:http://n\udcff/m")
    assert_refused(code, err, home, "--gpu-source 'scrape:http://n\\xff/m' is not UTF-8 text")


@pytest.mark.parametrize(
    ("message", "line"),
    [
        ("a\u2028b\u2029c", "error: a\\u2028b\\u2029c"),
        ("bidi \u202eevil", "error: bidi \\u202eevil"),
        ("bytes \udcff kept", "error: bytes \\udcff kept"),
        ("nel\x85 and \x0b\x0c end", "error: nel\\x85 and \\x0b\\x0c end"),
        ("ok [bold] é ü 中文", "error: ok [bold] é ü 中文"),
    ],
)
def test_an_error_line_escapes_what_would_break_or_hide_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, message: str, line: str
) -> None:
    tiny = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @tiny.command()
    def go() -> None:
        raise UsageError(message)

    monkeypatch.setattr(app_module, "app", tiny)
    code, _, err = run_cli(capsys, monkeypatch)
    assert (code, err.splitlines()) == (2, [line])


# --- 7. JobSpec values no job could run with ------------------------------------------------------

HOSTILE_SPECS = {
    "unclosed-quote": ("entrypoint: '\"'\n", "entrypoint", "no closing quotation"),
    "quote-only": ("entrypoint: \"''\"\n", "entrypoint", "names no program"),
    "nul-in-command": ('entrypoint: ["python", "a\\0b"]\n', "entrypoint", "NUL byte"),
    "nul-in-workdir": ('entrypoint: python train.py\nworkdir: "a\\0b"\n', "workdir", "NUL byte"),
    "long-workdir": (f"entrypoint: python train.py\nworkdir: /tmp/{LONG}\n", "workdir", "300 bytes"),
    "nul-in-env": ('entrypoint: m:f\nenv: {A: "x\\0y"}\n', "env", "NUL byte"),
    "window-2**64": ("entrypoint: m:f\nhealth: {window: 18446744073709551616}\n", "health.window", "100000"),
    "every-steps-2**64": (
        "entrypoint: m:f\ncheckpoint: {every_steps: 18446744073709551616}\n",
        "checkpoint.every_steps",
        "1000000000",
    ),
    "keep-huge": ("entrypoint: m:f\ncheckpoint: {keep: 99999999}\n", "checkpoint.keep", "1000"),
    "denormal-step": ("entrypoint: m:f\nplacement: {step_seconds: 5e-324}\n", "placement.step_seconds", "0.000001"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SPECS))
def test_a_spec_no_job_could_run_is_refused_at_submit(
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    no_scheduler: None,
    case: str,
) -> None:
    body, field, problem = HOSTILE_SPECS[case]
    spec = write(tmp_path / "spec.yaml", "name: hostile\n" + body)
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(spec))
    assert_refused(code, err, home, str(spec), f"{field}:", problem)
    with pytest.raises(SpecError):
        parse_spec(yaml.safe_load(spec.read_text(encoding="utf-8")))


def test_entrypoints_a_shell_splits_still_validate() -> None:
    for entrypoint in ("python train.py --lr 0.1", "bash -c 'echo \"a b\"'", ["python", "t.py"], "m.n:f"):
        assert parse_spec({"name": "a", "entrypoint": entrypoint}).entrypoint == entrypoint
    assert parse_spec({"name": "a", "entrypoint": "python 'a b.py'"}).command == ["python", "a b.py"]


def test_a_denormal_step_time_in_a_batch_is_refused_by_place(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = yaml.safe_load(BATCH.read_text(encoding="utf-8"))
    data["jobs"][0]["placement"]["step_seconds"] = 5e-324
    batch = write(tmp_path / "batch.yaml", yaml.safe_dump(data))
    code, _, err = run_cli(capsys, monkeypatch, "place", str(batch), "--catalog", str(CATALOG))
    assert_refused(code, err, home, "jobs[0]: placement.step_seconds")


# --- 8. catalogue numbers outside their physical range ---------------------------------------------


def _catalog(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(CATALOG.read_text(encoding="utf-8"))
    for where, value in changes.items():
        node: Any = data
        *path, last = where.split("__")
        for key in path:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
    return data


@pytest.mark.parametrize(
    ("changes", "needles"),
    [
        ({"offers__0__capacity_gpus": 2**64}, ("offers.0.capacity_gpus", "18,446,744,073,709,551,616", "1,000,000")),
        ({"gpu_types__L40S__throughput__training": 5e-324}, ("throughput.training 4.94066e-324", "0.001 to 1,000")),
        ({"gpu_types__H100__throughput__training": 1e300}, ("throughput.training 1e+300", "0.001 to 1,000")),
        ({"gpu_types__H100__memory_gib": 5e-324}, ("gpu_types.H100.memory_gib", "0.001 to 10,000")),
        ({"quotas__0__nominal": 2**64}, ("quotas.0.nominal", "1,000,000")),
        ({"quotas__0__borrowing_limit": 2**64}, ("quotas.0.borrowing_limit", "1,000,000")),
        ({"currency": "[/]"}, ("currency '[/]' is not a currency code",)),
    ],
)
def test_catalogue_numbers_outside_their_physical_range_are_refused(
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    changes: dict[str, Any],
    needles: tuple[str, ...],
) -> None:
    catalog = write(tmp_path / "catalog.yaml", yaml.safe_dump(_catalog(**changes)))
    code, _, err = run_cli(capsys, monkeypatch, "place", str(BATCH), "--catalog", str(catalog), "--explain")
    assert_refused(code, err, home, str(catalog), *needles)


# --- 9. profile with args its function cannot take --------------------------------------------------


def needs_items(steps: int = 1, items: Any = None) -> None:
    """A job function that fails with a TypeError on a value of the right JSON type but the wrong shape."""
    len(items)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("body", "argv", "needles"),
    [
        ("args: {bogus: 1}\n", (), ("args.bogus", "has no parameter 'bogus'", "steps, step_seconds, seed")),
        ('args: {seed: "abc"}\n', (), ('args.seed is "abc"', "takes an integer for 'seed'")),
        ("args: {step_seconds: true}\n", (), ("args.step_seconds is true", "takes a number")),
        ("", ("--steps", "2147483648"), ("--steps 2147483648", "from 1 to 10000 steps")),
        ("", ("--warmup", "2147483648"), ("--warmup 2147483648",)),
    ],
)
def test_profile_refuses_what_its_job_cannot_run(
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    body: str,
    argv: tuple[str, ...],
    needles: tuple[str, ...],
) -> None:
    spec = write(tmp_path / "spec.yaml", SPEC + body)
    code, out, err = run_cli(capsys, monkeypatch, "profile", str(spec), *argv)
    assert_refused(code, err, home, *needles)
    assert out == ""


@pytest.mark.timeout(300)
def test_profile_names_the_args_when_its_function_fails_with_a_type_error(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = write(tmp_path / "spec.yaml", f"name: t\nentrypoint: {__name__}:needs_items\nargs: {{items: 3}}\n")
    code, _, err = run_cli(capsys, monkeypatch, "profile", str(spec), "--steps", "1", "--warmup", "0")
    assert_refused(code, err, home, f"{__name__}:needs_items failed with TypeError", "items=3")
