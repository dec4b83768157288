"""Hostile YAML on every surface that reads it: refused with exit 2 and one line, nothing written.

Each case once broke a real command: a billion-laughs document inside a JobSpec's ``args`` passed
the schema and then ran ``submit`` out of memory (``export``/``profile`` hung); 20,000 nested
brackets raised ``RecursionError``; a 5,000-digit integer raised Python's int-string ``ValueError``;
``/dev/zero`` as a path raised ``MemoryError``; ``inf``/``nan`` passed as numbers. The bounded
reader (:mod:`gpufleet.yamlio`) and the models' ``allow_inf_nan=False`` refuse them all.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from gpufleet.errors import UsageError
from gpufleet.yamlio import MAX_BYTES, MAX_DEPTH, parse_yaml, read_yaml

CATALOG = REPO / "examples" / "catalog.yaml"
SPEC = REPO / "examples" / "toy.yaml"
BATCH = REPO / "examples" / "batch.yaml"
FLEET = REPO / "examples" / "fleet.yaml"
RATES = REPO / "gpufleet" / "cost" / "default_rates.yaml"

# Ten levels of ten aliases each: 10**10 values once expanded, a few hundred bytes as written.
LAUGHS = (
    "[&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol], "
    + ", ".join(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10))
    + "]"
)
HOSTILE = {
    "billion-laughs": (LAUGHS, "expands to more than"),
    "deep-nesting": ("[" * 20_000 + "]" * 20_000, f"nests deeper than {MAX_DEPTH} levels"),
    "huge-integer": ("1" * 5_000, "an integer of 5,000 characters"),
    "recursive-alias": ("&loop [*loop]", "refers to a node that contains it"),
}

# A valid document of each kind, with ``payload`` where the hostile value goes. In a JobSpec it
# sits in ``args``, which takes any mapping: only the reader stands between it and the commands.
SPEC_DOC = "name: hostile\nentrypoint: gpufleet.workloads.toy:train\nargs: {steps: 3, payload: PAYLOAD}\n"
BATCH_DOC = "jobs:\n  - {name: hostile, entrypoint: 'gpufleet.workloads.toy:train', args: {payload: PAYLOAD}}\n"


def _with_payload(path: Path) -> str:
    return path.read_text(encoding="utf-8") + "\npayload: PAYLOAD\n"


# surface -> (document holding PAYLOAD, argv given the hostile file's path)
Surface = tuple[Callable[[], str], Callable[[str], list[str]]]
SURFACES: dict[str, Surface] = {
    "submit": (lambda: SPEC_DOC, lambda p: ["submit", p]),
    "export-skypilot": (lambda: SPEC_DOC, lambda p: ["export", "skypilot", p]),
    "export-kueue": (lambda: SPEC_DOC, lambda p: ["export", "kueue", p, "--catalog", str(CATALOG)]),
    "export-kueue-catalog": (lambda: _with_payload(CATALOG), lambda p: ["export", "kueue", str(SPEC), "--catalog", p]),
    "profile": (lambda: SPEC_DOC, lambda p: ["profile", p]),
    "place-batch": (lambda: BATCH_DOC, lambda p: ["place", p, "--catalog", str(CATALOG)]),
    "place-catalog": (lambda: _with_payload(CATALOG), lambda p: ["place", str(BATCH), "--catalog", p]),
    "cost-rates": (lambda: _with_payload(RATES), lambda p: ["cost", "--rates", p]),
    "report-rates": (lambda: _with_payload(RATES), lambda p: ["observe", "report", "--rates", p]),
    "report-slo": (lambda: "availability: 0.99\npayload: PAYLOAD\n", lambda p: ["observe", "report", "--slo", p]),
    "slurm-topology": (lambda: _with_payload(FLEET), lambda p: ["slurm", "topology", p]),
    "simulate-workload": (
        lambda: "drain_days: 1\npayload: PAYLOAD\n",
        lambda p: ["simulate", "--catalog", str(CATALOG), "--jobs", "1", "--workload", p],
    ),
}
# `gpufleet cost` opens the state store before it reads --rates (gpufleet/cli/jobs.py), so it
# still creates $GPUFLEET_HOME/state.db for a rate card it then refuses.
WRITES_HOME_FIRST = {"cost-rates"}


def refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
    argv: list[str],
    *needles: str,
    surface: str = "",
) -> str:
    """Run the CLI; assert exit 2, one stderr line holding every needle, no traceback, an untouched home."""
    code, _out, err = run_cli(capsys, monkeypatch, *argv)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    if surface not in WRITES_HOME_FIRST:
        assert not home.exists() or not any(home.iterdir()), sorted(home.rglob("*"))
    return lines[0]


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_hostile_document_is_refused_on_every_surface(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
    tmp_path: Path,
    surface: str,
    case: str,
) -> None:
    document, argv = SURFACES[surface]
    payload, problem = HOSTILE[case]
    path = tmp_path / f"{surface}.yaml"
    path.write_text(document().replace("PAYLOAD", payload), encoding="utf-8")
    refused(capsys, monkeypatch, home, argv(str(path)), str(path), problem, surface=surface)


def test_cost_with_a_refused_rate_card_writes_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path
) -> None:
    path = tmp_path / "rates.yaml"
    path.write_text(_with_payload(RATES).replace("PAYLOAD", LAUGHS), encoding="utf-8")
    run_cli(capsys, monkeypatch, "cost", "--rates", str(path))
    assert not home.exists() or not any(home.iterdir())


def test_the_laughs_spec_is_valid_without_its_payload() -> None:
    """The hostile spec is refused for its size alone: with a small payload it validates."""
    from gpufleet.spec import parse_spec

    data = parse_yaml(SPEC_DOC.replace("PAYLOAD", "[&a [x, x], *a, *a]"), source="s", error=UsageError)
    assert parse_spec(data).args["payload"] == [["x", "x"], ["x", "x"], ["x", "x"]]


@pytest.mark.parametrize("surface", sorted(SURFACES))
@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "folder"])
def test_a_path_that_is_not_a_regular_file_is_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
    tmp_path: Path,
    surface: str,
    target: str,
) -> None:
    if target == "fifo":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)  # no writer: a blocking open or read would hang
    elif target == "folder":
        path = tmp_path / "folder.yaml"
        path.mkdir()
    else:
        path = Path(target)
    _, argv = SURFACES[surface]
    refused(capsys, monkeypatch, home, argv(str(path)), str(path), "not a regular file", surface=surface)


@pytest.mark.parametrize("surface", ["submit", "place-catalog", "slurm-topology", "report-slo"])
def test_a_file_over_the_size_limit_is_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
    tmp_path: Path,
    surface: str,
) -> None:
    document, argv = SURFACES[surface]
    text = document().replace("PAYLOAD", "1")
    path = tmp_path / "big.yaml"
    path.write_text(text + "#" * (MAX_BYTES + 1 - len(text)), encoding="utf-8")
    refused(capsys, monkeypatch, home, argv(str(path)), str(path), f"larger than {MAX_BYTES:,} bytes", surface=surface)


NON_FINITE = {
    "spec-args-nested": ("submit", SPEC_DOC.replace("PAYLOAD", "{lr: .inf}"), "args.payload.lr"),
    "spec-args-list": ("export-skypilot", SPEC_DOC.replace("PAYLOAD", "[1.0, .nan]"), "args.payload[1]"),
    "spec-float-field": (
        "export-kueue",
        SPEC_DOC.replace("PAYLOAD", "1") + "checkpoint: {every_steps: 10, grace_seconds: .nan}\n",
        "checkpoint.grace_seconds",
    ),
    "spec-overflow": (
        "profile",
        SPEC_DOC.replace("PAYLOAD", "1") + "placement: {gpu_hours: 1.0e+999}\n",
        "placement.gpu_hours",
    ),
    "batch": ("place-batch", BATCH_DOC.replace("PAYLOAD", "-.inf"), "args.payload"),
    "catalog-price": (
        "place-catalog",
        CATALOG.read_text(encoding="utf-8").replace("on_demand_per_gpu_hour: 6.88", "on_demand_per_gpu_hour: .inf", 1),
        "on_demand_per_gpu_hour",
    ),
    "catalog-throughput": (
        "export-kueue-catalog",
        CATALOG.read_text(encoding="utf-8").replace("finetune: 0.5", "finetune: .nan", 1),
        "throughput.finetune",
    ),
    "rates-cost": ("cost-rates", "rates:\n  - {gpu_type: H100, on_demand: .inf}\n", "rates.0.on_demand"),
    "rates-report": ("report-rates", "rates:\n  - {gpu_type: H100, on_demand: 1.0, spot: .nan}\n", "rates.0.spot"),
    "slo": ("report-slo", "availability: .nan\n", "availability"),
    "fleet": ("slurm-topology", FLEET.read_text(encoding="utf-8").replace("gbps: 400", "gbps: .inf", 1), "gbps"),
    "workload": ("simulate-workload", "drain_days: .inf\n", "drain_days"),
}


@pytest.mark.parametrize("case", sorted(NON_FINITE))
def test_a_non_finite_number_is_refused_naming_its_field(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
    tmp_path: Path,
    case: str,
) -> None:
    surface, text, field = NON_FINITE[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text, encoding="utf-8")
    _, argv = SURFACES[surface]
    line = refused(capsys, monkeypatch, home, argv(str(path)), str(path), field, "finite", surface=surface)
    assert "unknown field" not in line


def test_an_impossible_date_is_a_yaml_error_with_its_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path
) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(CATALOG.read_text(encoding="utf-8").replace("as_of: 2026-12-01", "as_of: 2026-13-45"))
    refused(
        capsys,
        monkeypatch,
        home,
        ["place", str(BATCH), "--catalog", str(path)],
        "malformed YAML at line 8",
        "month must be in 1..12",
    )


def test_the_bounds_leave_legitimate_documents_alone(tmp_path: Path) -> None:
    """Every shipped example reads; depth 64 and 100-digit integers are still accepted."""
    examples = [*sorted((REPO / "examples").rglob("*.yaml")), RATES]
    assert examples and max(p.stat().st_size for p in examples) < MAX_BYTES // 100
    for example in examples:
        read_yaml(example, what="example", error=UsageError)
    deep = "[" * (MAX_DEPTH - 1) + "1" + "]" * (MAX_DEPTH - 1)
    assert parse_yaml(deep, source="s", error=UsageError) is not None
    assert parse_yaml("9" * 100, source="s", error=UsageError) == int("9" * 100)
    anchors = "a: &a {x: 1, y: [1, 2]}\nb: *a\nc: {<<: *a, z: 3}\n"
    assert parse_yaml(anchors, source="s", error=UsageError)["c"] == {"x": 1, "y": [1, 2], "z": 3}


@pytest.mark.parametrize("loader", ["_PyLoader", "_CLoader"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_both_parsers_keep_the_bounds(monkeypatch: pytest.MonkeyPatch, loader: str, case: str) -> None:
    """libyaml's parser when PyYAML has it, PyYAML's own otherwise: the same bounds, the same messages."""
    import gpufleet.yamlload as yamlio

    if not hasattr(yamlio, loader):
        pytest.skip("PyYAML without libyaml")
    monkeypatch.setattr(yamlio, "_Loader", getattr(yamlio, loader))
    payload, problem = HOSTILE[case]
    with pytest.raises(UsageError, match=problem) as err:
        parse_yaml(SPEC_DOC.replace("PAYLOAD", payload), source="spec.yaml", error=UsageError)
    assert str(err.value).startswith("spec.yaml at line 3") and "\n" not in str(err.value)
    fine = parse_yaml(SPEC_DOC.replace("PAYLOAD", "{x: &a [1, 2], y: *a}"), source="s", error=UsageError)
    assert fine["args"]["payload"] == {"x": [1, 2], "y": [1, 2]}


NOT_JSON = {
    "binary": ("{blob: !!binary /w==}", "args.payload.blob is binary data"),
    "set": ("!!set {a, b}", "args.payload is a set"),
    "date": ("2024-01-01", "args.payload is a date or time (2024-01-01): quote it"),
    "pairs": ("!!pairs [a: 1]", "args.payload[0] is a pair"),
    "int-key": ("{1: 2}", "args.payload: key 1 is not text"),
}


@pytest.mark.parametrize("surface", ["submit", "export-skypilot", "export-kueue", "place-batch"])
@pytest.mark.parametrize("case", sorted(NOT_JSON))
def test_args_json_cannot_hold_are_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
    tmp_path: Path,
    surface: str,
    case: str,
) -> None:
    """A value that JSON would turn into something else (or fail on) is refused before anything runs."""
    document, argv = SURFACES[surface]
    payload, problem = NOT_JSON[case]
    path = tmp_path / "spec.yaml"
    path.write_text(document().replace("PAYLOAD", payload), encoding="utf-8")
    refused(capsys, monkeypatch, home, argv(str(path)), str(path), problem, surface=surface)
