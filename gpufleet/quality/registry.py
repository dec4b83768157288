"""The model registry: MLflow (sqlite backend by default), plus the alias history MLflow lacks.

Where: ``$MLFLOW_TRACKING_URI`` when set, else ``sqlite:///$GPUFLEET_HOME/mlflow.db`` with
artifacts under ``$GPUFLEET_HOME/mlartifacts`` (no server needed). Everything written here is
plain MLflow, readable by MLflow's own client and UI:

- a finished training job becomes a **run** (params, holdout metrics, the loss curve, its
  datasets through ``log_input`` with their sha256 digests) and a **model version** whose
  artifact is a pyfunc model (``loader_module=gpufleet.workloads.tabular``: weights and JSON,
  no pickled code), so ``mlflow.pyfunc.load_model("models:/NAME@champion")`` predicts;
- **aliases** ``@champion``, ``@challenger`` and ``@previous`` say which version serves.

MLflow keeps only the current alias of each version, not who moved it, when or why. Every move
made through :class:`Registry` is therefore also recorded twice, append-only: a line in
``alias-history.jsonl`` beside the sqlite store (or under ``$GPUFLEET_HOME/registry/`` for a
remote tracking server), and a ``gpufleet.alias_event.NNNNN`` tag on the version concerned, so
the history travels with the registry itself. ``gpufleet registry history`` reads the file and
falls back to the tags.

gpufleet does not send MLflow's usage telemetry: ``MLFLOW_DISABLE_TELEMETRY`` defaults to true
here (set it to ``false`` to opt in). MLflow's deprecation warnings are silenced inside these
calls only: they concern MLflow's code, not the caller's.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import logging
import os
import re
import socket
import time
import urllib.parse
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpufleet.errors import Conflict, NotFound, ServiceUnavailable, UsageError
from gpufleet.extras import require
from gpufleet.paths import gpufleet_home
from gpufleet.quality.deploy import (
    CHALLENGER,
    CHAMPION,
    PREVIOUS,
    AliasMove,
    plan_promotion,
    plan_rejection,
    plan_rollback,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
EVENT_TAG = "gpufleet.alias_event."
COUNTER_TAG = "gpufleet.alias_events"
HISTORY_FILE = "alias-history.jsonl"
LOADER_MODULE = "gpufleet.workloads.tabular"


def mlflow_module() -> ModuleType:
    """``import mlflow`` with telemetry off by default, or a UsageError naming the extra that installs it."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    return require("mlflow", "quality", "gpufleet's model registry")


@contextlib.contextmanager
def quiet_mlflow() -> Iterator[None]:
    """Silence warnings raised inside MLflow and its database layer, and its INFO chatter."""
    loggers = [logging.getLogger(n) for n in ("mlflow", "alembic")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"(mlflow|sqlalchemy|alembic)(\.|$)")
        for lg in loggers:
            lg.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


UNREACHABLE_MARKS = ("Max retries exceeded", "Connection refused", "Failed to establish a new connection")
"""Words of MLflow's error (its HTTP client's) when no tracking server answers at the URI."""


@contextlib.contextmanager
def mlflow_errors(uri: str) -> Iterator[None]:
    """Turn MLflow's own failures (store unreachable, bad URI) into one-line gpufleet errors.

    An ``http(s)://`` server that does not accept a connection within :data:`PROBE_TIMEOUT_S` is refused
    at once: MLflow's own client retries for minutes before it gives up.
    """
    _probe(uri)
    try:
        yield
    except Exception as err:
        if isinstance(err, UsageError) or not type(err).__module__.startswith("mlflow"):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if any(mark in str(err) for mark in UNREACHABLE_MARKS):
            raise _unreachable(uri) from None
        raise UsageError(f"MLflow at {uri} failed: {first} (check $MLFLOW_TRACKING_URI)") from None


PROBE_TIMEOUT_S = 3.0
"""How long :func:`mlflow_errors` waits for an HTTP tracking server to accept a connection."""


def _unreachable(uri: str) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"no MLflow server answers at {uri}: start it (mlflow server --host 127.0.0.1 --port PORT), "
        "or point $MLFLOW_TRACKING_URI at a running one"
    )


def _probe(uri: str) -> None:
    """Raise ``ServiceUnavailable`` when ``uri`` is an HTTP(S) server that accepts no connection (quickly)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a bad port: MLflow says so
        return
    try:
        socket.create_connection((parts.hostname, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError:
        raise _unreachable(uri) from None


def tracking_uri(home: Path | None = None) -> str:
    """``$MLFLOW_TRACKING_URI``, else the sqlite file under ``$GPUFLEET_HOME``."""
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if env:
        return env
    return f"sqlite:///{(home or gpufleet_home()).resolve() / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else ``None``."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def history_path(uri: str, home: Path | None = None) -> Path:
    """``alias-history.jsonl`` beside a sqlite store, else under ``$GPUFLEET_HOME/registry/``."""
    db = sqlite_path(uri)
    return db.parent / HISTORY_FILE if db is not None else (home or gpufleet_home()) / "registry" / HISTORY_FILE


def check_model_name(name: str) -> str:
    if not MODEL_NAME_RE.match(name):
        raise UsageError(f"invalid model name {name!r}: use letters, digits, '.', '_' or '-' (at most 128)")
    return name


def default_who() -> str:
    """``$GPUFLEET_USER``, else ``user@host``: who moved an alias."""
    explicit = os.environ.get("GPUFLEET_USER", "").strip()
    if explicit:
        return explicit
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True, slots=True)
class AliasEvent:
    """One alias move: who moved ``alias`` of ``model`` from one version to another, when and why."""

    seq: int
    model: str
    alias: str
    from_version: str | None
    to_version: str | None
    action: str
    """``register``, ``promote``, ``rollback``, ``reject`` or ``canary``."""
    who: str
    when: float
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": 1, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AliasEvent:
        fields = ("seq", "model", "alias", "from_version", "to_version", "action", "who", "when", "why")
        try:
            return cls(**{k: data[k] for k in fields})
        except (KeyError, TypeError) as err:
            raise UsageError(f"not an alias event: {err}") from None


@dataclass(frozen=True, slots=True)
class DatasetRef:
    """A data file a run used, logged with ``mlflow.log_input``."""

    name: str
    path: Path
    context: str
    """``training``, ``reference``, ``evaluation``..."""
    target: str | None = "label"


@dataclass(frozen=True, slots=True)
class RegisteredVersion:
    model: str
    version: str
    run_id: str
    model_uri: str


class Registry:
    """One MLflow tracking/registry store and its alias history."""

    def __init__(self, home: Path | None = None, uri: str | None = None) -> None:
        self.home = home or gpufleet_home()
        self.uri = uri or tracking_uri(self.home)
        self.history_file = history_path(self.uri, self.home)
        self.mlflow = mlflow_module()
        db = sqlite_path(self.uri)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
        with quiet_mlflow():
            self.client: MlflowClient = self.mlflow.MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)

    # ---- reading -------------------------------------------------------------------------
    def _missing(self, err: Exception) -> bool:
        return getattr(err, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")

    def models(self) -> list[str]:
        with quiet_mlflow():
            return sorted(m.name for m in self.client.search_registered_models(max_results=1000))

    def aliases(self, model: str) -> dict[str, str]:
        """Alias -> version of a registered model (``NotFound`` when it is not registered)."""
        check_model_name(model)
        with quiet_mlflow():
            try:
                found = self.client.get_registered_model(model)
            except self.mlflow.exceptions.MlflowException as err:
                if not self._missing(err):
                    raise
                known = ", ".join(self.models()) or "none"
                raise NotFound(f"model {model!r} is not registered in {self.uri} (registered: {known})") from None
        return {str(k): str(v) for k, v in found.aliases.items()}

    def versions(self, model: str) -> list[ModelVersion]:
        self.aliases(model)
        with quiet_mlflow():
            found = self.client.search_model_versions(f"name='{model}'", max_results=10000)
        return sorted(found, key=lambda v: int(v.version))

    def version(self, model: str, version: str) -> ModelVersion:
        if not str(version).isdigit():
            raise UsageError(f"version {version!r} of {model!r} is not a version number (1, 2, ...)")
        versions = self.versions(model)
        for v in versions:
            if str(v.version) == str(version):
                return v
        known = ", ".join(str(v.version) for v in versions) or "none"
        raise NotFound(f"model {model!r} has no version {version} (versions: {known})")

    def model_tags(self, model: str) -> dict[str, str]:
        self.aliases(model)
        with quiet_mlflow():
            return dict(self.client.get_registered_model(model).tags)

    def load(self, model: str, alias: str) -> Any:
        """The pyfunc model ``models:/MODEL@ALIAS`` (``predict(frame)`` gives probabilities)."""
        if alias not in self.aliases(model):
            raise NotFound(f"model {model!r} has no @{alias} alias")
        with quiet_mlflow(), self._tracking():
            return self.mlflow.pyfunc.load_model(f"models:/{model}@{alias}")

    # ---- writing runs and versions ---------------------------------------------------------
    @contextlib.contextmanager
    def _tracking(self) -> Iterator[None]:
        """Point MLflow's fluent API at this store for the duration, then restore it exactly.

        ``mlflow.set_tracking_uri`` also exports ``MLFLOW_TRACKING_URI``: both the module state
        and the environment are put back, so nothing leaks into later calls or child processes.
        """
        from mlflow.tracking._model_registry import utils as registry_utils
        from mlflow.tracking._tracking_service import utils as tracking_utils

        env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
        saved = (tracking_utils._tracking_uri, registry_utils._registry_uri)
        self.mlflow.set_tracking_uri(self.uri)
        self.mlflow.set_registry_uri(self.uri)
        try:
            yield
        finally:
            tracking_utils._tracking_uri, registry_utils._registry_uri = saved
            for key, value in env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        location = None
        if sqlite_path(self.uri) is not None:
            location = (Path(self.uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
        return str(self.client.create_experiment(name, artifact_location=location))

    def set_version_tags(self, model: str, version: str, tags: Mapping[str, str]) -> None:
        with quiet_mlflow():
            for key, value in tags.items():
                self.client.set_model_version_tag(model, str(version), key, value[:5000])

    def set_model_tags(self, model: str, tags: Mapping[str, str]) -> None:
        with quiet_mlflow():
            for key, value in tags.items():
                self.client.set_registered_model_tag(model, key, value)

    def log_training_run(
        self,
        model: str,
        output: Path,
        *,
        datasets: Sequence[DatasetRef],
        params: Mapping[str, Any] | None = None,
        loss_curve: Sequence[tuple[int, float]] = (),
        tags: Mapping[str, str] | None = None,
        who: str | None = None,
        why: str = "registered after training",
        alias: str | None = CHALLENGER,
    ) -> RegisteredVersion:
        """Log a finished ``gpufleet.workloads.tabular`` job's output as a run and a new version.

        ``output`` holds ``metrics.json`` and ``model/``; the version gets ``alias`` (recorded).
        """
        from gpufleet.tables import read_table
        from gpufleet.workloads.tabular import file_sha256

        check_model_name(model)
        try:
            result = json.loads((output / "metrics.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise UsageError(f"{output} holds no readable metrics.json ({err}): did the training job finish?") from None
        mlflow = self.mlflow
        with quiet_mlflow(), self._tracking():
            experiment = self._experiment(f"gpufleet-{model}")
            with mlflow.start_run(experiment_id=experiment, run_name=(tags or {}).get("gpufleet.job", None)) as run:
                mlflow.set_tags({"gpufleet.model": model, **(tags or {})})
                mlflow.log_params({**result["params"], **(params or {})})
                mlflow.log_metrics({f"holdout_{k}": float(v) for k, v in result["metrics"].items()})
                for step, loss in loss_curve:
                    mlflow.log_metric("train_loss", float(loss), step=int(step))
                example = None
                for ref in datasets:
                    frame = read_table(ref.path)
                    sha = file_sha256(ref.path)
                    dataset = mlflow.data.from_pandas(
                        frame, source=str(ref.path.resolve()), name=ref.name, targets=ref.target, digest=sha[:32]
                    )
                    mlflow.log_input(dataset, context=ref.context, tags={"gpufleet.sha256": sha})
                    if example is None and ref.context == "training":
                        example = frame.drop(columns=[c for c in (ref.target,) if c in frame.columns]).head(5)
                with contextlib.redirect_stderr(io.StringIO()):  # "Successfully registered model ..."
                    info = mlflow.pyfunc.log_model(
                        name="model",
                        loader_module=LOADER_MODULE,
                        data_path=str(output / "model"),
                        input_example=example,
                        pip_requirements=_requirements(),
                        registered_model_name=model,
                        metadata={"gpufleet_format": "gpufleet-tabular/1"},
                    )
        version = str(info.registered_model_version)
        with quiet_mlflow():
            for key, value in {"gpufleet.run_id": run.info.run_id, **(tags or {})}.items():
                self.client.set_model_version_tag(model, version, key, str(value))
        if alias is not None:
            current = self.aliases(model)
            self.apply(model, [AliasMove(alias, current.get(alias), version)], action="register", who=who, why=why)
        return RegisteredVersion(model, version, run.info.run_id, f"models:/{model}/{version}")

    # ---- aliases and their history ---------------------------------------------------------
    def apply(
        self, model: str, moves: Sequence[AliasMove], *, action: str, who: str | None, why: str
    ) -> list[AliasEvent]:
        """Make the alias moves in MLflow and record each one (JSONL line + version tag)."""
        who = who or default_who()
        events = []
        seq = self._next_seq(model)
        for move in moves:
            with quiet_mlflow():
                if move.to_version is None:
                    self.client.delete_registered_model_alias(model, move.alias)
                else:
                    self.client.set_registered_model_alias(model, move.alias, move.to_version)
            event = AliasEvent(
                seq, model, move.alias, move.from_version, move.to_version, action, who, time.time(), why
            )
            self._record(event)
            events.append(event)
            seq += 1
        return events

    def _next_seq(self, model: str) -> int:
        tags = self.model_tags(model)
        from_tags = int(tags.get(COUNTER_TAG, "0") or 0)
        from_file = max((e.seq for e in self._read_file(model)), default=0)
        return max(from_tags, from_file) + 1

    def _record(self, event: AliasEvent) -> None:
        self.history_file.parent.mkdir(parents=True, exist_ok=True)
        with self.history_file.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(event.to_dict(), sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        tagged = event.to_version or event.from_version
        body = {**event.to_dict(), "why": event.why[:2000]}
        with quiet_mlflow():
            if tagged is not None:
                self.client.set_model_version_tag(
                    event.model, tagged, f"{EVENT_TAG}{event.seq:05d}", json.dumps(body, sort_keys=True)
                )
            self.client.set_registered_model_tag(event.model, COUNTER_TAG, str(event.seq))

    def promote(self, model: str, version: str, *, who: str | None = None, why: str) -> list[AliasEvent]:
        """``@champion`` to ``version``; the old champion becomes ``@previous``."""
        self.version(model, version)
        return self.apply(model, plan_promotion(self.aliases(model), str(version)), action="promote", who=who, why=why)

    def confirm(self, model: str, version: str, *, who: str | None = None, why: str) -> list[AliasEvent]:
        """Record that ``version``, already ``@champion`` (a canary's provisional move), stays: a
        history event with the same from and to version, so the audit trail says why it stayed."""
        if self.aliases(model).get(CHAMPION) != str(version):
            raise Conflict(f"version {version} of {model!r} is not @champion: promote it instead")
        return self.apply(model, [AliasMove(CHAMPION, str(version), str(version))], action="promote", who=who, why=why)

    def rollback(self, model: str, *, who: str | None = None, why: str) -> list[AliasEvent]:
        """``@champion`` back to ``@previous``; the rolled-back version is tagged."""
        aliases = self.aliases(model)
        moves = plan_rollback(aliases, repr(model))
        events = self.apply(model, moves, action="rollback", who=who, why=why)
        bad = aliases.get(CHAMPION)
        if bad is not None:
            with quiet_mlflow():
                self.client.set_model_version_tag(model, bad, "gpufleet.rolled_back", why[:2000])
        return events

    def reject(self, model: str, version: str, *, who: str | None = None, why: str) -> list[AliasEvent]:
        """Drop ``@challenger`` from a version that failed validation or its guard."""
        self.version(model, version)
        events = self.apply(model, plan_rejection(self.aliases(model), str(version)), action="reject", who=who, why=why)
        with quiet_mlflow():
            self.client.set_model_version_tag(model, str(version), "gpufleet.rejected", why[:2000])
        return events

    def _read_file(self, model: str) -> list[AliasEvent]:
        if not self.history_file.exists():
            return []
        out = []
        for n, line in enumerate(self.history_file.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError:
                raise UsageError(f"{self.history_file}:{n} is not JSON; the history is append-only") from None
            if data.get("model") == model:
                out.append(AliasEvent.from_dict(data))
        return out

    def history_from_tags(self, model: str) -> list[AliasEvent]:
        """The alias history as MLflow itself stores it (version tags), oldest first."""
        events = []
        for v in self.versions(model):
            for key, value in v.tags.items():
                if key.startswith(EVENT_TAG):
                    events.append(AliasEvent.from_dict(json.loads(value)))
        return sorted(events, key=lambda e: e.seq)

    def history(self, model: str) -> tuple[list[AliasEvent], str]:
        """The alias history and where it came from: the JSONL file, completed by MLflow's tags.

        The file keeps the full text; the tags travel with the registry (another machine, a lost
        file). Events are merged by sequence number, the file's copy winning.
        """
        self.aliases(model)
        from_file = {e.seq: e for e in self._read_file(model)}
        from_tags = {e.seq: e for e in self.history_from_tags(model)}
        merged = {**from_tags, **from_file}
        sources = [str(self.history_file)] if from_file else []
        if set(from_tags) - set(from_file) or not from_file:
            sources.append("mlflow version tags")
        return [merged[k] for k in sorted(merged)], " + ".join(sources)

    def run_inputs(self, run_id: str) -> list[dict[str, Any]]:
        """A run's datasets: name, digest, source, context, sha256."""
        with quiet_mlflow():
            run = self.client.get_run(run_id)
        out = []
        for item in run.inputs.dataset_inputs if run.inputs is not None else []:
            tags = {t.key: t.value for t in item.tags}
            try:
                rows = json.loads(item.dataset.profile or "{}").get("num_rows")
            except ValueError:
                rows = None
            out.append(
                {
                    "name": item.dataset.name,
                    "digest": item.dataset.digest,
                    "source": item.dataset.source,
                    "context": tags.get("mlflow.data.context"),
                    "sha256": tags.get("gpufleet.sha256"),
                    "rows": rows,
                }
            )
        return out

    def run(self, run_id: str) -> Any:
        with quiet_mlflow():
            return self.client.get_run(run_id)


def _requirements() -> list[str]:
    """The logged model's pip requirements (pinned to what trained it; no slow inference)."""
    out = []
    for dist in ("torch", "numpy", "pandas"):
        try:
            out.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            out.append(dist)
    return out


__all__ = [
    "CHALLENGER",
    "CHAMPION",
    "EVENT_TAG",
    "PREVIOUS",
    "AliasEvent",
    "DatasetRef",
    "RegisteredVersion",
    "Registry",
    "check_model_name",
    "default_who",
    "history_path",
    "mlflow_errors",
    "mlflow_module",
    "quiet_mlflow",
    "tracking_uri",
]
