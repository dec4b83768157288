"""Features plug in through :mod:`gpufleet.jobs.features`: a kind, a metric family and a ``show`` line,
with no core file touched; logs stay readable whatever kinds they hold; the core imports no feature."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.errors import ParameterError
from gpufleet.jobs import features
from gpufleet.jobs.events import EventKind, read_events
from gpufleet.jobs.features import EventType, Feature, MetricFamily, Number, Payload, Summary, from_field
from gpufleet.jobs.store import Store
from gpufleet.paths import state_db
from gpufleet.spec import parse_spec
from gpufleet.telemetry.metrics import LABELS, JobMetrics, TextfileWriter
from gpufleet.views import JobView, job_view_model

ROOT = Path(__file__).resolve().parents[1]
TOY_TICK = "toy_tick"


class ToyTick(Payload):
    speed: Number | None = None
    lane: str | None = None


class ToySummary(Summary):
    ticks: int
    top_speed: float | None = None


def _summarize(events: Sequence[Mapping[str, Any]]) -> ToySummary | None:
    speeds = [e["speed"] for e in events if isinstance(e.get("speed"), int | float)]
    return ToySummary(ticks=len(events), top_speed=max(speeds, default=None)) if events else None


def _by_lane(payload: ToyTick) -> list[tuple[tuple[str, ...], float]]:
    return [((payload.lane or "none",), float(payload.speed))] if payload.speed is not None else []


TOY = Feature(
    name="toy",
    events=(EventType(kind=TOY_TICK, doc="A toy's tick.", payload=ToyTick, notable=True),),
    metrics=(
        MetricFamily(
            name="gpufleet_toy_speed", type="gauge", help="Toy speed.", kind=TOY_TICK, values=from_field("speed")
        ),
        MetricFamily(
            name="gpufleet_toy_lane_ticks",
            type="counter",
            help="Ticks.",
            kind=TOY_TICK,
            values=_by_lane,
            labels=("lane",),
        ),
    ),
    summary=ToySummary,
    summarize=_summarize,
    describe=lambda s: f"{s.ticks} ticks, top speed {s.top_speed}",
)


@pytest.fixture
def toy() -> Iterator[Feature]:
    features.register(TOY)
    yield TOY
    features.unregister(TOY.name)


def value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in exposition")


def _job_with_events(home: Path, *events: dict[str, Any]) -> int:
    store = Store(state_db(home))
    job = store.add_job(parse_spec({"name": "t", "team": "a", "entrypoint": "x:y"}), "local")
    for event in events:
        store.add_event(job, attempt=1, **event)
    return job


def test_a_registered_feature_is_exported_without_a_core_change(toy: Feature) -> None:
    metrics = JobMetrics({"job_id": "3", "attempt": "1"})
    assert "gpufleet_toy_" not in metrics.exposition().decode()  # made at its first event
    metrics({"ts": time.time(), "attempt": 1, "kind": TOY_TICK, "speed": 7.5, "lane": "left"})
    metrics({"ts": time.time(), "attempt": 1, "kind": TOY_TICK, "speed": 2, "lane": "left"})
    text = metrics.exposition().decode()
    assert value(text, "gpufleet_toy_speed") == 2.0 and 'job_id="3"' in text
    assert "gpufleet_toy_lane_ticks_total{" in text and 'lane="left"' in text
    assert value(text, "gpufleet_toy_lane_ticks_total") == 9.5


def test_the_textfile_is_rewritten_after_a_feature_event(toy: Feature, tmp_path: Path) -> None:
    metrics = JobMetrics({"job_id": "3"})
    writer = TextfileWriter(metrics, tmp_path / "job.prom")
    for listener in (metrics, writer):
        listener({"kind": TOY_TICK, "speed": 1.5})
    assert value((tmp_path / "job.prom").read_text(), "gpufleet_toy_speed") == 1.5


def test_the_data_feature_exports_the_staging_gauges() -> None:
    metrics = JobMetrics({"job_id": "3"})
    assert "gpufleet_data_" not in metrics.exposition().decode()
    metrics({"kind": "data_staged", "seconds": 2.5, "bytes_copied": 1000, "copy_bytes_per_s": True})
    text = metrics.exposition().decode()
    assert value(text, "gpufleet_data_stage_seconds") == 2.5 and value(text, "gpufleet_data_staged_bytes") == 1000
    assert value(text, "gpufleet_data_reused_files") == 0 and value(text, "gpufleet_data_stage_bytes_per_second") == 0


def test_a_registered_feature_is_in_show_and_its_json(toy: Feature, home: Path) -> None:
    job = _job_with_events(home, {"kind": TOY_TICK, "speed": 4.0}, {"kind": TOY_TICK, "speed": 9.0})
    shown = CliRunner().invoke(app, ["show", str(job)])
    assert shown.exit_code == 0, shown.output
    assert "toy: 2 ticks, top speed 9.0" in shown.stdout and "toy_tick" in shown.stdout
    as_json = CliRunner().invoke(app, ["show", str(job), "--json"])
    view = json.loads(as_json.stdout)
    assert view["toy"] == {"ticks": 2, "top_speed": 9.0} and view["rl"] is None
    assert [e["kind"] for e in view["events"]].count(TOY_TICK) == 2
    typed = JobView.read(Store(state_db(home)), home, job)
    assert isinstance(typed.summaries()["toy"], ToySummary)


def test_a_kind_nobody_registered_and_a_bad_payload_are_read_and_shown_raw(toy: Feature, home: Path) -> None:
    log = home / "events.jsonl"
    log.parent.mkdir(parents=True)
    lines = [
        {"ts": 1.0, "attempt": 1, "kind": "from_a_newer_gpufleet", "what": ["x", 1]},
        {"ts": 2.0, "attempt": 1, "kind": TOY_TICK, "speed": "fast", "lane": 3, "extra": True},
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    events, _ = read_events(log)
    assert events == lines
    assert features.read_payload(events[0]) is None
    payload = features.read_payload(events[1])
    assert isinstance(payload, ToyTick) and payload.speed is None and payload.lane is None
    assert payload.model_extra == {"extra": True}
    metrics = JobMetrics({"job_id": "3"})
    for event in events:
        metrics(event)  # neither raises
    assert "gpufleet_toy_speed{" not in metrics.exposition().decode()
    job = _job_with_events(home, {"kind": TOY_TICK, "speed": "fast"}, {"kind": "from_a_newer_gpufleet", "n": 1})
    shown = CliRunner().invoke(app, ["show", str(job)])
    assert shown.exit_code == 0, shown.output
    assert "speed=fast" in shown.stdout


def test_registration_refuses_clashes_and_bad_declarations(toy: Feature) -> None:
    tick = EventType(kind=TOY_TICK, doc="again")
    with pytest.raises(ParameterError, match="toy_tick"):
        features.register(Feature(name="other", events=(tick,)))
    with pytest.raises(ParameterError, match="registered already"):
        features.register(Feature(name="toy"))
    features.register(TOY)  # the same declaration again: nothing
    with pytest.raises(ParameterError, match="gpufleet_other_"):
        Feature(name="other", events=(EventType(kind="o", doc=""),), metrics=(TOY.metrics[0],))
    with pytest.raises(ParameterError, match="does not declare"):
        Feature(
            name="toy2", metrics=(MetricFamily(name="gpufleet_toy2_x", type="gauge", help="", kind="o", values=list),)
        )

    class Strict(Payload):
        needed: int

    with pytest.raises(ParameterError, match="needed"):
        EventType(kind="k", doc="", payload=Strict)
    with pytest.raises(ParameterError, match="job"):
        Feature(name="job")
    with pytest.raises(ParameterError, match="team"):
        MetricFamily(name="gpufleet_x_y", type="gauge", help="", kind="k", values=list, labels=("team",))
    assert set(LABELS) <= features.RESERVED_LABELS


def test_the_shipped_features_register_their_kinds_not_the_core() -> None:
    names = [f.name for f in features.features()]
    assert {"rl", "data", "sweeps"} <= set(names)
    assert {"rl", "rl_restored", "rl_done", "pruned"}.isdisjoint(set(EventKind))
    assert {"rl_restored", "rl_done", "pruned", "data_staged"} <= set(features.notable_kinds())
    assert features.metric_families("rl")[0].name == "gpufleet_rl_env_steps_per_second"


CORE = ["gpufleet/jobs", "gpufleet/telemetry", "gpufleet/views.py", "gpufleet/cli/jobs.py"]
FEATURES = ("gpufleet.rl", "gpufleet.data", "gpufleet.sweeps", "gpufleet.features")


def _imported(path: Path) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports, at any depth (inside functions too), absolute or relative."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module or ""]).strip(".")
            yield from ((node.lineno, f"{module}.{alias.name}") for alias in node.names)


def test_the_core_imports_no_feature() -> None:
    files = [p for part in CORE for p in ((ROOT / part).rglob("*.py") if (ROOT / part).is_dir() else [ROOT / part])]
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in files
        for line, name in _imported(path)
        if name.startswith(FEATURES)
    ]
    assert files and not bad, bad


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


def test_importing_the_core_loads_no_feature_and_loading_features_loads_nothing_heavy() -> None:
    done = _python(
        """
        import sys
        import gpufleet.jobs.events, gpufleet.telemetry.metrics, gpufleet.views
        print(sorted(m for m in sys.modules if m.startswith(("gpufleet.rl", "gpufleet.data", "gpufleet.sweeps"))))
        heavy = ("torch", "gymnasium", "optuna", "fsspec", "pyarrow")
        before = {m for m in heavy if m in sys.modules}
        from gpufleet.features import load_features
        print(load_features())
        print(sorted(m for m in heavy if m in sys.modules and m not in before))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "{}", "[]"]


def test_a_feature_that_fails_to_import_is_skipped_and_the_others_load(tmp_path: Path) -> None:
    """Entry points (as an install writes them): a broken one is named, gpufleet's own still register, and a
    bare exporter, which nothing loaded features for, exports RL's gauges."""
    info = tmp_path / "plugins-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugins\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[gpufleet.features]\nbroken = no_such_module_anywhere:FEATURE\ngpufleet = gpufleet.features:register_builtin\n"
    )
    done = _python(
        """
        import gpufleet.features
        gpufleet.features.BUILTIN += ("gpufleet.no_such_feature",)
        from gpufleet.jobs import features
        from gpufleet.telemetry.metrics import JobMetrics
        metrics = JobMetrics({"job_id": "1"})
        metrics({"kind": "rl", "env_steps_per_s": 5.0})
        print("gpufleet_rl_env_steps_per_second{" in metrics.exposition().decode())
        print(sorted(f.name for f in features.features()))
        print(sorted(features.skipped()))
        """,
        PYTHONPATH=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True", "['data', 'rl', 'sweeps']", "['broken', 'gpufleet.no_such_feature']"]


def test_the_openapi_document_has_the_typed_views() -> None:
    from gpufleet.serve.app import openapi_document

    document = openapi_document()
    schemas = document["components"]["schemas"]
    job = schemas["JobView"]["properties"]
    assert {"id", "state", "gpus", "step", "spec", "attempts", "events", "checkpoints", "rl"} <= set(job)
    assert job["attempts"]["items"]["$ref"].endswith("/AttemptRow")
    assert "RlSummary" in json.dumps(job["rl"]) and "env_steps_per_s" in schemas["RlSummary"]["properties"]
    assert "GPUs per node." in json.dumps(job["gpus"])

    def returned(path: str) -> str:
        return json.dumps(document["paths"][path]["get"]["responses"]["200"])

    assert "JobView" in returned("/api/jobs/{job_id}") and "JobsView" in returned("/api/jobs")
    assert "FleetPage" in returned("/api/fleet")
    assert job_view_model().model_fields["rl"].annotation is not None


def test_a_process_without_our_entry_point_still_registers_gpufleets_features() -> None:
    """Run from a source tree (or an install older than the entry point): no metadata names gpufleet's own
    features, and a bare exporter in a job process still exports the data and RL gauges."""
    done = _python(
        """
        import importlib.metadata as md
        real = md.entry_points
        md.entry_points = lambda **kw: [p for p in real(**kw) if p.name != "gpufleet"]
        from gpufleet.jobs import features
        from gpufleet.telemetry.metrics import JobMetrics
        metrics = JobMetrics({"job_id": "1"})
        metrics({"kind": "rl", "env_steps_per_s": 5.0})
        print("gpufleet_rl_env_steps_per_second{" in metrics.exposition().decode())
        print(sorted(f.name for f in features.features()), sorted(features.skipped()))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True", "['data', 'rl', 'sweeps'] []"]
