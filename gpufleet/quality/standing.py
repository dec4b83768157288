"""The standing quality monitor: the drift -> policy -> retrain chain of ``gpufleet quality demo``, kept running.

A YAML file names the models to watch; for each, a reference table and where the current data
arrives (one file, or a folder that grows by one file per window)::

    every: 10m
    models:
      - name: churn
        reference: data/reference.csv
        current: data/windows/
        columns: [f0, f1]
        metric: {name: auc, baseline: 0.91}
        policy: {persistence: 2, alert_share: 0.2, cooldown_s: 86400}
        alarms: {alpha: 0.01, correction: bh, wasserstein_floor: 0.1}   # the default false-alarm control
        retrain: specs/retrain.yaml
        backend: local

A round (:meth:`StandingMonitor.run_round`) checks every window it has not checked yet: the drift
report against the reference, the policy's decision (its state carried over from the model's
decision log, so persistence and cool-down hold across rounds and restarts) and, on ``retrain``,
the retraining JobSpec submitted once. Everything is appended under
``$GPUFLEET_HOME/quality/monitor/<model>/``:

- ``drift.jsonl``: one line per window checked (its per-column drift, or the error that stopped it);
  it is also what the monitor remembers: a window whose name, size and modification time are on a
  line is never checked again;
- ``decisions.jsonl``: the policy's :class:`~gpufleet.quality.policy.DecisionLog`;
- ``retrains.jsonl``: the retraining jobs submitted (and the submissions that failed), one per key;
- ``performance.jsonl``: with ``estimate``, each window's estimated metric and, once its labels arrived
  (``labels``), the realised one (:mod:`gpufleet.quality.performance`).

Rounds may overlap (``gpufleet serve --monitor`` and a ``quality monitor run --once`` from cron):
each model's round holds an ``flock`` on ``round.lock``, so the second round waits and finds the
windows checked. Retraining goes through :func:`retrain_once`, which the web server's alert
webhook calls too: one job per key, whichever process asks first, under ``retrain.lock``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import math
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidatorFunctionWrapHandler, field_validator, model_validator

from gpufleet.errors import GpufleetError, SpecError, UsageError
from gpufleet.fmt import shown_path
from gpufleet.quality.monitor import AlarmControl
from gpufleet.quality.performance import EstimateConfig
from gpufleet.quality.policy import (
    Decision,
    DecisionLog,
    Evidence,
    PolicyConfig,
    PolicyState,
    decide,
    evidence_from_report,
)
from gpufleet.quality.registry import MODEL_NAME_RE, check_model_name
from gpufleet.yamlio import read_yaml, validate

if TYPE_CHECKING:
    import pandas as pd

    from gpufleet.quality.drift import DriftReport
    from gpufleet.quality.outbox import DeliveryReport

log = logging.getLogger(__name__)

REFERENCE = "the monitor file format in docs/quality-labs.md (Standing monitor)"
MIN_EVERY_S = 1.0
MAX_EVERY_S = 7 * 86400.0
"""Bounds of ``every``: a round a second at most, a week between rounds at the longest."""
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*([smhd]?)")
_DURATION_HINT = "write a number of seconds or one with a unit: 90, 30s, 10m, 1h, 1d"
_MODEL_NAME_HINT = "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"


def _duration(value: object) -> float:
    """``10m``, ``30s``, ``1h``, ``1d`` or a number of seconds, in seconds; a ``ValueError`` for pydantic to place."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a duration: {_DURATION_HINT}")
    if isinstance(value, str):
        match = _DURATION_RE.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"{value[:40]!r} is not a duration: {_DURATION_HINT}")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        seconds = float(value)
    if not (math.isfinite(seconds) and MIN_EVERY_S <= seconds <= MAX_EVERY_S):
        raise ValueError(f"{value!r} is out of range: give {MIN_EVERY_S:g}s to {MAX_EVERY_S / 86400:g}d")
    return seconds


def model_dir(home: Path, model: str) -> Path:
    """``$GPUFLEET_HOME/quality/monitor/<model>``: where the monitor keeps a model's history.

    The name is checked as the registry checks it, which is what keeps it one folder: no ``/``, ``..`` or NUL.
    """
    return home / "quality" / "monitor" / check_model_name(model)


# ---- the file ---------------------------------------------------------------------------------


def _checked_dataclass(kind: Any, whose: str, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A dataclass block of a model (``policy``, ``alarms``): an unknown field named with the known ones, and the
    dataclass's own checks (``UsageError``) turned into the validation error that names the block."""
    known = [f.name for f in dataclasses.fields(kind)]
    unknown = [k for k in value if k not in known] if isinstance(value, dict) else []
    if unknown:
        raise ValueError(f"unknown field {str(unknown[0])[:40]!r}: the {whose} fields are {', '.join(known)}")
    try:
        return handler(value)
    except UsageError as err:
        raise ValueError(str(err)) from None


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class MetricConfig(_Strict):
    """The champion's metric on a window's labels: the window's rows carry the label and the champion's score.

    A window without both columns (its labels have not arrived) has no performance evidence.
    """

    name: Literal["auc", "accuracy"]
    baseline: float = Field(ge=0, le=1)
    """The metric at validation: a drop from it is what the policy's ``alert_drop``/``retrain_drop`` measure."""
    label: str = Field(default="label", min_length=1, max_length=256)
    score: str = Field(default="score", min_length=1, max_length=256)
    """The champion's score (a probability): accuracy counts it as positive from 0.5."""


class ModelConfig(_Strict):
    """One watched model: its data, its policy and what to submit when the policy says retrain."""

    name: str
    reference: Path
    current: Path
    """A table (each new version of it is a window) or a folder (each file in it is a window, by name)."""
    columns: list[str] | None = Field(default=None, min_length=1, max_length=10_000)
    metric: MetricConfig | None = None
    estimate: EstimateConfig | None = None
    """The metric estimated on each window without labels (CBPE, DLE): the policy decides on it, not on drift."""
    labels: Path | None = None
    """Where labels arrive later, keyed by ``id_column``: a table or a folder of them (needs ``estimate``)."""
    id_column: str = Field(default="id", min_length=1, max_length=256)
    """The row id shared by the windows and the labels; never a drift column."""
    policy: PolicyConfig = PolicyConfig()
    alarms: AlarmControl = AlarmControl()
    """Which columns count as drifted: tests, Benjamini-Hochberg at ``alpha``, effect floors (``monitor``)."""
    retrain: Path | None = None
    backend: str = Field(default="local", max_length=64)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not MODEL_NAME_RE.match(value):
            raise ValueError(f"{value[:70]!r} is not a valid model name: {_MODEL_NAME_HINT}")
        return value

    @field_validator("policy", mode="wrap")
    @classmethod
    def _policy(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> PolicyConfig:
        policy: PolicyConfig = _checked_dataclass(PolicyConfig, "policy's", value, handler)
        return policy

    @field_validator("alarms", mode="wrap")
    @classmethod
    def _alarms(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> AlarmControl:
        alarms: AlarmControl = _checked_dataclass(AlarmControl, "alarms'", value, handler)
        return alarms

    @model_validator(mode="after")
    def _labels_need_an_estimate(self) -> ModelConfig:
        if self.labels is not None and self.estimate is None:
            raise ValueError("labels needs estimate: name the metric, target and score the labels are for")
        return self

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: list[str] | None) -> list[str] | None:
        twice = _first_repeat(value or [])
        if twice is not None:
            raise ValueError(f"column {twice[:70]!r} is named twice: name each column once")
        return value


class WebhookConfig(_Strict):
    """Where the monitor sends its ``alert`` and ``retrain`` decisions: signed, through the durable outbox."""

    url: str = Field(max_length=2048)
    """The receiver, e.g. ``http://127.0.0.1:8080/hooks/alerts`` (``gpufleet serve --webhook-secret-file``)."""
    secret_file: Path | None = None
    """The shared secret's file (relative to the monitor file); default ``$GPUFLEET_WEBHOOK_SECRET`` or ``..._FILE``."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        from gpufleet.quality.outbox import check_url

        try:
            return check_url(value)
        except UsageError as err:
            raise ValueError(str(err)) from None


class MonitorConfig(_Strict):
    """The monitor file: how often a round runs under ``gpufleet serve --monitor``, and the models."""

    every: float = 600.0
    """Seconds between rounds (written ``10m``, ``30s``, ``1h``, ``1d`` or a number of seconds)."""
    models: list[ModelConfig] = Field(min_length=1, max_length=1000)
    webhook: WebhookConfig | None = None
    """Send alert and retrain decisions to this receiver too (the outbox: ``gpufleet quality webhook log``)."""

    @field_validator("every", mode="before")
    @classmethod
    def _every(cls, value: object) -> float:
        return _duration(value)

    @field_validator("models")
    @classmethod
    def _unique(cls, value: list[ModelConfig]) -> list[ModelConfig]:
        twice = _first_repeat([m.name for m in value])
        if twice is not None:
            raise ValueError(f"model {twice!r} is listed twice: give each model once")
        return value


def _first_repeat(names: list[str]) -> str | None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def load_monitor_config(path: Path | str) -> MonitorConfig:
    """The monitor file, validated, with relative paths resolved against its folder.

    Bad input raises :class:`SpecError` naming the field (``models.0.reference``) and the fix,
    before anything is written: the reference must be a table, ``current`` a table or a folder,
    ``retrain`` a valid JobSpec, ``backend`` a known one.
    """
    from gpufleet.backends import registered
    from gpufleet.spec import load_spec

    path = Path(path)
    source = str(path)
    data = read_yaml(path, what="monitor file", error=SpecError)
    config = validate(MonitorConfig, data, source=source, what="a monitor file", reference=REFERENCE, error=SpecError)
    folder = path.absolute().parent
    models = []
    for i, model in enumerate(config.models):
        where = f"{source}: models.{i}"
        reference, current = folder / model.reference, folder / model.current
        retrain = folder / model.retrain if model.retrain is not None else None
        labels = folder / model.labels if model.labels is not None else None
        _check_data(reference, f"{where}.reference", folder_ok=False)
        _check_data(current, f"{where}.current", folder_ok=True)
        if labels is not None:
            _check_data(labels, f"{where}.labels", folder_ok=True)
        if model.backend not in registered():
            known = ", ".join(sorted(registered()))
            raise SpecError(f"{where}.backend: unknown backend {model.backend[:40]!r}: use one of {known}")
        if retrain is not None:
            try:
                load_spec(retrain)
            except GpufleetError as err:
                raise SpecError(f"{where}.retrain: {err}") from None
        paths = {"reference": reference, "current": current, "retrain": retrain, "labels": labels}
        models.append(model.model_copy(update=paths))
    return config.model_copy(update={"models": models, "webhook": _check_webhook(config.webhook, folder, source)})


def _check_webhook(hook: WebhookConfig | None, folder: Path, source: str) -> WebhookConfig | None:
    """The webhook with its secret file resolved against the monitor file's folder; refused unless the secret loads."""
    from gpufleet.quality.webhook import load_secret

    if hook is None:
        return None
    secret_file = folder / hook.secret_file if hook.secret_file is not None else None
    try:
        load_secret(secret_file)
    except UsageError as err:
        raise SpecError(f"{source}: webhook.secret_file: {err}") from None
    return hook.model_copy(update={"secret_file": secret_file})


def _check_data(path: Path, where: str, *, folder_ok: bool) -> None:
    """Refuse (:class:`SpecError`, naming ``where``) all but a CSV or Parquet file, or a folder if ``folder_ok``."""
    from gpufleet.tables import table_format

    expect = "a CSV or Parquet file" + (" or a folder of them" if folder_ok else "")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SpecError(f"{where}: {shown_path(path)} does not exist: give {expect}") from None
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise SpecError(f"{where}: cannot use {shown_path(path)}: {reason}") from None
    if folder_ok and stat.S_ISDIR(st.st_mode):
        return
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"{where}: {shown_path(path)} is not a regular file: give {expect}")
    try:
        table_format(path)
    except UsageError as err:
        raise SpecError(f"{where}: {err}") from None


# ---- the files of a model ---------------------------------------------------------------------


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    """Hold ``path`` exclusively: each call opens its own descriptor, so threads exclude each other as processes do."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _append(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, written in one call and synced: a reader sees whole lines, a crash loses none it was told of."""
    line = json.dumps(record, sort_keys=True, allow_nan=False, default=str) + "\n"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file (none if it is missing); a torn or foreign line is skipped, not fatal."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as err:
        raise UsageError(f"cannot read {shown_path(path)}: {err.strerror}") from None
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


# ---- retraining -------------------------------------------------------------------------------


RETRAIN_KEY_ENV = "GPUFLEET_RETRAIN_KEY"
"""The variable a retraining job carries its key in: how a submission the journal missed is found again."""


def retrain_once(home: Path, model: str, key: str, spec_path: Path, backend: str = "local") -> tuple[int, bool]:
    """Submit the JobSpec at ``spec_path`` for ``model`` once per ``key``: ``(job_id, submitted_now)``.

    The journal ``retrains.jsonl`` is read and written under an ``flock``, so two threads or two
    processes (the monitor's round, the webhook of ``gpufleet serve``) asking with the same key get
    the same job. A submission that fails is journaled with its error and raised; the key stays
    unspent, so a later call may try again.

    A process killed between the submission and its journal line must not cost a second job when the
    alert is retried: an intent line (``retrains.intents.jsonl``) is synced before each submission
    and the job carries its key in ``$GPUFLEET_RETRAIN_KEY``, so a key with an intent but no journal
    line is first looked for among the fleet's jobs (the only time the store is read).
    """
    from gpufleet.backends import get_backend
    from gpufleet.spec import load_spec

    folder = model_dir(home, model)
    journal = folder / "retrains.jsonl"
    intents = folder / "retrains.intents.jsonl"
    with _flock(folder / "retrain.lock"):
        for line in _read_lines(journal):
            job_id = line.get("job_id")
            if line.get("key") == key and isinstance(job_id, int) and not isinstance(job_id, bool):
                return job_id, False
        record: dict[str, Any] = {"key": key, "at": time.time(), "spec": str(spec_path), "backend": backend}
        if any(line.get("key") == key for line in _read_lines(intents)):
            found = _submitted_with_key(home, backend, key)
            if found is not None:
                _append(journal, {**record, "job_id": found, "recovered": True})
                return found, False
        _append(intents, {"key": key, "at": record["at"]})
        try:
            job_id = get_backend(backend, home).submit(load_spec(spec_path), env={RETRAIN_KEY_ENV: key})
        except GpufleetError as err:
            _append(journal, {**record, "job_id": None, "error": str(err)})
            raise
        _append(journal, {**record, "job_id": job_id})
        return job_id, True


def _submitted_with_key(home: Path, backend: str, key: str) -> int | None:
    """The job an interrupted :func:`retrain_once` submitted for ``key`` (its ``$GPUFLEET_RETRAIN_KEY``), if any."""
    from gpufleet.backends import get_backend
    from gpufleet.paths import state_db

    if not state_db(home).exists():
        return None
    jobs = get_backend(backend, home).store.jobs()
    return next((job.id for job in jobs if job.env.get(RETRAIN_KEY_ENV) == key), None)


# ---- a round ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Window:
    name: str
    path: Path
    size: int
    mtime_ns: int

    @property
    def stamp(self) -> tuple[str, int, int]:
        return self.name, self.size, self.mtime_ns

    def line(self, at: float) -> dict[str, Any]:
        """What every ``drift.jsonl`` line of this window starts with: the :attr:`stamp` marks it checked."""
        return {"window": self.name, "at": at, "size": self.size, "mtime_ns": self.mtime_ns}


def _stamp(line: dict[str, Any]) -> tuple[str, int, int] | None:
    """The window a ``drift.jsonl`` line records as checked (``None`` for a line that is not one of ours)."""
    window, size, mtime_ns = line.get("window"), line.get("size"), line.get("mtime_ns")
    if isinstance(window, str) and isinstance(size, int) and isinstance(mtime_ns, int):
        return window, size, mtime_ns
    return None


def _windows(current: Path) -> list[_Window]:
    """The windows at ``current``, oldest name first.

    A folder: each regular file in it, by name (a hidden one, ``.name``, is a file still being
    written: write a window there, then rename it into place). A file: one window per version of
    it, named after the file and its modification time, so that each version is a window of its own.
    """
    try:
        if os.path.isdir(current):
            with os.scandir(current) as entries:
                found = []
                for entry in entries:
                    if entry.name.startswith(".") or not entry.is_file():
                        continue
                    st = entry.stat()
                    found.append(_Window(_label(entry.name), Path(entry.path), st.st_size, st.st_mtime_ns))
            return sorted(found, key=lambda w: w.name)
        st = os.stat(current)
    except OSError as err:
        raise UsageError(f"cannot list {shown_path(current)}: {err.strerror}") from None
    when = datetime.fromtimestamp(st.st_mtime_ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return [_Window(f"{_label(current.name)}@{when}", current, st.st_size, st.st_mtime_ns)]


def _label(name: str) -> str:
    """A file name as a window's name: bytes that are not UTF-8 shown as ``\\xNN``, so it prints and stores as text."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _metric(metric: MetricConfig, frame: pd.DataFrame) -> float | None:
    """The champion's metric on the window's labelled rows; ``None`` before the labels arrive (NaN: one class only)."""
    import numpy as np
    import pandas as pd

    if metric.label not in frame.columns or metric.score not in frame.columns:
        return None
    labels = pd.to_numeric(frame[metric.label], errors="coerce").to_numpy(dtype=np.float64)
    scores = pd.to_numeric(frame[metric.score], errors="coerce").to_numpy(dtype=np.float64)
    keep = np.isfinite(labels) & np.isfinite(scores)
    y, p = labels[keep] >= 0.5, scores[keep]
    if not y.size:
        return None
    if metric.name == "accuracy":
        return float(((p >= 0.5) == y).mean())
    if y.all() or not y.any():
        return math.nan  # AUC needs both classes: the policy alerts on a metric it cannot compute
    from scipy.stats import mannwhitneyu

    u = float(mannwhitneyu(p[y], p[~y]).statistic)  # AUC = U / (positives x negatives), ties count one half
    return u / (int(y.sum()) * int((~y).sum()))


def _realised(
    model: ModelConfig, cfg: EstimateConfig, window: _Window | None, labels: pd.DataFrame
) -> dict[str, Any] | None:
    """The realised line of a window whose labels may have come (``None``: too few yet), or what ends the wait."""
    from gpufleet.quality.performance import realised_line
    from gpufleet.tables import read_table

    if window is None:
        return {"record": "realised", "metric": cfg.metric, "error": "the window was rewritten or removed"}
    try:
        return realised_line(cfg, read_table(window.path), labels, id_column=model.id_column)
    except GpufleetError as err:
        return {"record": "realised", "metric": cfg.metric, "error": _one_line(err)}


def _drift_columns(model: ModelConfig, reference: pd.DataFrame, frame: pd.DataFrame) -> list[str] | None:
    """The columns compared: ``columns``, else both tables' but, with an estimate, the row id and the target.

    A row id differs in every window (it would always drift) and the target is in the labelled reference only.
    """
    if model.columns is not None or model.estimate is None:
        return model.columns
    skip = {model.id_column, model.estimate.target}
    names = [str(c) for c in reference.columns] + [str(c) for c in frame.columns if c not in reference.columns]
    return [n for n in names if n not in skip]


def _drift_line(window: _Window, at: float, report: DriftReport) -> dict[str, Any]:
    from gpufleet.fmt import finite_or_none

    return {
        **window.line(at),
        "status": report.status,
        "dataset_drift": report.dataset_drift,
        "share": finite_or_none(report.share_drifted),
        "columns": [
            {
                "column": c.column,
                "method": c.method,
                "statistic": finite_or_none(c.statistic),
                "threshold": finite_or_none(c.threshold),
                "drifted": c.drift,
            }
            for c in report.columns
        ],
    }


def _check(
    model: str,
    window: str | None,
    *,
    action: str | None = None,
    reasons: list[str] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """One line of a round's result (what ``--once`` prints)."""
    return {
        "model": model,
        "window": window,
        "action": action,
        "reasons": reasons or [],
        "dataset_drift": None,
        "share": None,
        "retrain_job": None,
        "retrain_submitted": False,
        "error": error,
        "kind": "window",
        "estimated": None,
        "realised": None,
    }


class StandingMonitor:
    """The models of one monitor file, checked round by round against ``home``'s history."""

    def __init__(self, config: MonitorConfig, home: Path) -> None:
        self.config = config
        self.home = home

    def run_round(self, now: float | None = None) -> list[dict[str, Any]]:
        """Check every new window of every model; one result per window checked (or per model that failed).

        ``now`` is the decisions' clock (default: the time the model's turn starts). A model whose
        windows cannot be listed or whose reference cannot be read gets one error result and leaves
        its windows unchecked for the next round; a window that cannot be read or compared is
        recorded with its error and is not checked again.
        """
        checks: list[dict[str, Any]] = []
        for model in self.config.models:
            try:
                checks += self._round(model, now)
            except (GpufleetError, OSError) as err:
                checks.append(_check(model.name, None, action="error", error=_one_line(err)))
        return checks

    def _round(self, model: ModelConfig, now: float | None) -> list[dict[str, Any]]:
        from gpufleet.tables import read_table

        folder = model_dir(self.home, model.name)
        with _flock(folder / "round.lock"):
            seen = {_stamp(line) for line in _read_lines(folder / "drift.jsonl")}
            pending = [w for w in _windows(model.current) if w.stamp not in seen]
            if not pending and model.labels is None:
                return []
            decisions = DecisionLog(folder / "decisions.jsonl")
            state = decisions.state()
            at = time.time() if now is None else now
            checks = []
            if pending:
                reference = read_table(model.reference)
            for window in pending:
                check, state = self._window(model, folder, window, reference, decisions, state, at)
                checks.append(check)
            if model.labels is not None:
                checks += self._late_labels(model, folder, decisions, state, at)
            return checks

    def _window(
        self,
        model: ModelConfig,
        folder: Path,
        window: _Window,
        reference: pd.DataFrame,
        decisions: DecisionLog,
        state: PolicyState,
        at: float,
    ) -> tuple[dict[str, Any], PolicyState]:
        """Check one window: drift, decision, retrain; the result and the policy's next state."""
        from gpufleet.quality.monitor import controlled_report
        from gpufleet.tables import read_table

        try:
            frame = read_table(window.path)
            report = controlled_report(reference, frame, model.alarms, columns=_drift_columns(model, reference, frame))
        except GpufleetError as err:
            message = _one_line(err)
            _append(folder / "drift.jsonl", {**window.line(at), "error": message})
            return _check(model.name, window.name, action="error", error=message), state
        metric = model.metric
        more: dict[str, Any] = {
            "metric_name": metric.name if metric else None,
            "metric": _metric(metric, frame) if metric else None,
            "baseline_metric": metric.baseline if metric else None,
        }
        estimated, estimate_error = self._estimate(model, folder, window, reference, frame, at)
        evidence = evidence_from_report(report, window=window.name, at=at, **{**more, **estimated})
        decision: Decision = decide(model.policy, state, evidence)
        decisions.append(decision)
        queued = self._queue_decision(model.name, window.name, decision, report)
        _append(folder / "drift.jsonl", _drift_line(window, at, report))  # last: it marks the window checked
        check = _check(model.name, window.name, action=decision.action, reasons=list(decision.reasons))
        check.update(dataset_drift=report.dataset_drift, share=report.share_drifted, error=estimate_error)
        check.update(estimated=evidence.estimated, realised=evidence.metric if estimated else None)
        self._retrain(model, window.name, decision, check)
        if queued is not None:
            check["error"] = "; ".join(filter(None, [check["error"], queued]))
        return check, decision.state

    def _retrain(self, model: ModelConfig, window: str, decision: Decision, check: dict[str, Any]) -> None:
        """On ``retrain``, submit the model's JobSpec once per window (key ``<model>:<window>``), into ``check``."""
        if decision.action != "retrain" or model.retrain is None:
            return
        try:
            key = f"{model.name}:{window}"
            job_id, submitted = retrain_once(self.home, model.name, key, model.retrain, model.backend)
            check.update(retrain_job=job_id, retrain_submitted=submitted)
        except GpufleetError as err:
            check["error"] = "; ".join(filter(None, [check["error"], f"retrain not submitted: {_one_line(err)}"]))

    def _estimate(
        self, model: ModelConfig, folder: Path, window: _Window, reference: pd.DataFrame, frame: pd.DataFrame, at: float
    ) -> tuple[dict[str, Any], str | None]:
        """The window's estimate as policy evidence, recorded in ``performance.jsonl``; ``({}, error)`` without one.

        A window whose estimate cannot be made is still judged, on drift alone, and the error is reported.
        """
        from gpufleet.quality.performance import estimate_line, estimate_record, evidence_fields

        cfg = model.estimate
        if cfg is None:
            return {}, None
        try:
            est = estimate_record(cfg, reference, frame, id_column=model.id_column)
            line = {**window.line(at), **estimate_line(cfg, est, len(frame))}
        except (GpufleetError, ValueError) as err:
            message = _one_line(err)
            record = {**window.line(at), "record": "estimate", "metric": cfg.metric, "error": message}
            _append(folder / "performance.jsonl", record)
            return {}, f"no estimate: {message}"
        _append(folder / "performance.jsonl", line)
        return evidence_fields(cfg, line), None

    def _late_labels(
        self, model: ModelConfig, folder: Path, decisions: DecisionLog, state: PolicyState, at: float
    ) -> list[dict[str, Any]]:
        """Checked windows whose labels arrived: the realised metric beside the estimate, one decision each."""
        from gpufleet.quality.performance import evidence_fields, labels_pending, read_labels

        cfg, path = model.estimate, folder / "performance.jsonl"
        if cfg is None or model.labels is None:
            return []
        decided = {d.window: d.at for d in decisions.read() if d.evidence.get("kind") == "labels"}
        waiting = labels_pending(_read_lines(path), decided)
        if not waiting:
            return []
        try:
            labels = read_labels(model.labels, id_column=model.id_column, target=cfg.target)
            windows = {w.stamp: w for w in _windows(model.current)}
        except GpufleetError as err:
            return [_check(model.name, None, action="error", error=f"labels: {_one_line(err)}")]
        checks = []
        for line in waiting:
            stamp = (line["window"], line["size"], line["mtime_ns"])
            result = _realised(model, cfg, windows.get(stamp), labels)
            if result is None:
                continue  # not enough of its rows are labelled yet
            record = {"window": stamp[0], "size": stamp[1], "mtime_ns": stamp[2], "at": at, **result}
            if result.get("realised") is None:
                _append(path, record)
                checks.append(_check(model.name, stamp[0], action="error", error=f"labels: {result.get('error')}"))
                continue
            fields = evidence_fields(cfg, line)
            evidence = Evidence(
                window=stamp[0],
                at=at,
                kind="labels",
                metric_name=cfg.metric,
                metric=result["realised"],
                baseline_metric=fields["estimate_reference"],
                **fields,
            )
            decision = decide(model.policy, state, evidence)
            decisions.append(decision)
            _append(path, record)  # after the decision: the decision log is what says a window was decided
            state = decision.state
            check = _check(model.name, stamp[0], action=decision.action, reasons=list(decision.reasons))
            check.update(kind="labels", estimated=evidence.estimated, realised=evidence.metric)
            self._retrain(model, stamp[0], decision, check)
            checks.append(check)
        return checks

    def _queue_decision(self, model: str, window: str, decision: Decision, report: DriftReport) -> str | None:
        """Queue an alert or retrain for the webhook; the error if it could not be queued.

        It is queued before the window is marked checked: a crash in between checks the window again,
        and its key (:func:`~gpufleet.quality.outbox.decision_key`) is not queued twice.
        """
        hook = self.config.webhook
        if hook is None or decision.action not in ("alert", "retrain"):
            return None
        from gpufleet.fmt import finite_or_none
        from gpufleet.quality.outbox import Outbox, decision_key, outbox_dir

        payload = {
            "model": model,
            "action": decision.action,
            "window": window[:128],
            "reasons": [reason[:500] for reason in decision.reasons[:20]],
            "evidence": {"dataset_drift": report.dataset_drift, "share_drifted": finite_or_none(report.share_drifted)},
        }
        try:
            Outbox(outbox_dir(self.home)).enqueue(
                payload, url=hook.url, key=decision_key(model, window), secret_file=hook.secret_file
            )
        except (GpufleetError, OSError, ValueError) as err:
            return f"webhook not queued: {_one_line(err)}"
        return None

    def deliver(self, seconds: float | None = None) -> DeliveryReport | None:
        """Send what the outbox holds that is due, for at most ``seconds``; ``None`` when no webhook is named.

        A sender already at work (``gpufleet quality webhook send --forever``) makes this pass ``busy``.
        """
        if self.config.webhook is None:
            return None
        from gpufleet.quality.outbox import Outbox, outbox_dir

        until = None if seconds is None else time.time() + seconds
        return Outbox(outbox_dir(self.home)).deliver_due(until=until)

    def run_forever(
        self, stop: threading.Event, on_round: Callable[[list[dict[str, Any]]], None] | None = None
    ) -> None:
        """A round, then wait ``every`` (or until ``stop`` is set), until ``stop`` is set.

        A round that fails is logged as one line and the next one runs on time: a standing monitor
        outlives a bad file, a full disk or a backend that is down for a while.
        """
        while not stop.is_set():
            try:
                checks = self.run_round()
                for check in checks:
                    if check["error"]:
                        log.warning("monitor: %s %s: %s", check["model"], check["window"] or "", check["error"])
                if on_round is not None:
                    on_round(checks)
                sent = self.deliver(self.config.every / 2)
                if sent is not None and sent.failed:
                    log.warning(
                        "monitor: webhook: %d event(s) failed for good; see `gpufleet quality webhook log`",
                        len(sent.failed),
                    )
            except Exception as err:  # noqa: BLE001 - one bad round must not end the monitor
                log.error("monitor: the round failed: %s", _one_line(err))
            stop.wait(self.config.every)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


# ---- history ----------------------------------------------------------------------------------


def read_history(home: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per model the monitor has checked: its ``decisions``, ``drift`` lines and ``retrains`` journal, oldest first."""
    from gpufleet.quality.performance import performance_series

    root = home / "quality" / "monitor"
    try:
        names = sorted(p.name for p in root.iterdir() if p.is_dir() and MODEL_NAME_RE.match(p.name))
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise UsageError(f"cannot read {shown_path(root)}: {err.strerror}") from None
    history = {}
    for name in names:
        folder = root / name
        history[name] = {
            "decisions": [d.to_dict() for d in DecisionLog(folder / "decisions.jsonl").read()],
            "drift": _read_lines(folder / "drift.jsonl"),
            "retrains": _read_lines(folder / "retrains.jsonl"),
            "performance": performance_series(_read_lines(folder / "performance.jsonl")),
        }
    return history


__all__ = [
    "MAX_EVERY_S",
    "MIN_EVERY_S",
    "RETRAIN_KEY_ENV",
    "MetricConfig",
    "ModelConfig",
    "MonitorConfig",
    "StandingMonitor",
    "WebhookConfig",
    "load_monitor_config",
    "model_dir",
    "read_history",
    "retrain_once",
]
