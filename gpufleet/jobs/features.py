"""The feature registry: what a feature (RL, data staging, sweeps, a plugin) adds to a job, declared as data.

A :class:`Feature` names its event kinds, each with a typed payload; the metric families the exporter
derives from those payloads; and, when it has one, the summary it adds to a job's view (``show --json``,
``GET /api/jobs/{id}``) with the one line ``gpufleet show`` prints for it. The core reads only this
registry, so a feature exists without editing the event enum, the exporter, the views or the CLI
(cf. torchtitan's ``register_train_spec``).

Features register themselves by calling :func:`register` when their module is imported. Which modules
those are is declared once, as ``gpufleet.features`` entry points of the installed packages
(``pyproject.toml``; gpufleet's own list is :mod:`gpufleet.features`): the first lookup loads them,
in whatever process it runs (the CLI, the server, a job's exporter), and one that cannot be imported
(a missing optional dependency) is skipped without stopping the others (:func:`skipped`).

Reading stays lenient: a payload is validated field by field, and a value that does not fit its field
is dropped, never raised (:func:`read_payload`). An old or foreign log line, or a kind nobody
registered, is shown as it was written. This module imports only the standard library, pydantic and
:mod:`gpufleet.errors`, so anything may import it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from gpufleet.errors import ParameterError

ENTRY_POINT_GROUP = "gpufleet.features"
"""The entry-point group whose objects register features: a :class:`Feature`, a callable, or a module."""
BUILTIN_NAME = "gpufleet"
"""The name of gpufleet's own entry in :data:`ENTRY_POINT_GROUP` (``pyproject.toml``)."""

ENVELOPE = ("ts", "attempt", "kind")
"""The keys every event line has; the rest is its payload."""

RESERVED_NAMES = frozenset({"job", "checkpoint", "rank"})
"""Feature names taken by the core's metrics (``gpufleet_job_*``, ``gpufleet_checkpoint_*``, ``gpufleet_rank_*``)."""

RESERVED_LABELS = frozenset(
    {"job_id", "job_name", "team", "attempt", "backend", "backend_job_id", "gpu_type", "provider", "job", "instance"}
)
"""Labels a family may not declare: the exporter's on every series (``gpufleet.telemetry.metrics.LABELS``) and
those Prometheus sets on a scrape."""

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _json_number(value: Any) -> Any:
    """A JSON number as written (an int stays an int); a bool or a string is no measurement."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a number")
    return value


Number = Annotated[int | float, BeforeValidator(_json_number)]
"""A payload's numeric field: ``True`` or ``"nan"`` (how a NaN is written) are refused, so a reader drops them."""


class Payload(BaseModel):
    """Base of an event's typed payload: every field has a default (an old line may lack it), and keys the
    model does not name are kept (a newer writer's)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class Summary(BaseModel):
    """Base of a feature's summary in a job's view: a figure the job never reported is left unset, and the
    view leaves it out rather than writing ``null`` (views dump with ``exclude_unset``)."""

    model_config = ConfigDict(frozen=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class EventType:
    """One kind of event a feature writes."""

    kind: str
    """The ``kind`` string in ``events.jsonl`` and the database."""
    doc: str
    """What the event says, for a person reading the log."""
    payload: type[Payload] = Payload
    """Its fields beyond ``ts``, ``attempt`` and ``kind``."""
    notable: bool = False
    """Shown among a job's events by ``gpufleet show`` and the job's view."""

    def __post_init__(self) -> None:
        if not _KIND.match(self.kind):
            raise ParameterError("{kind}: use lower-case letters, digits and _ (at most 64)", kind=self.kind)
        required = [name for name, f in self.payload.model_fields.items() if f.is_required()]
        if required:
            raise ParameterError(
                "{kind}'s payload requires {fields}: give every field a default, an old line may lack it",
                kind=self.kind,
                fields=", ".join(required),
            )


Sample = tuple[tuple[str, ...], float]
"""One value of a metric family: its own label values (in the family's ``labels`` order) and the number."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricFamily:
    """A Prometheus family the exporter keeps from one event kind's payloads.

    A gauge is set to each value; a counter is increased by it (a negative amount is ignored). The
    family is exported from the attempt's first such event on: other jobs do not carry it.
    """

    name: str
    """``gpufleet_<feature>_...``; a counter's ``_total`` is added by the client library."""
    type: Literal["gauge", "counter"]
    help: str
    kind: str
    """The event kind whose payloads feed it (one of the feature's)."""
    values: Callable[[Any], Iterable[Sample]]
    """From the payload (the kind's model, read leniently) to the samples to record; none: leave it as it is."""
    labels: tuple[str, ...] = ()
    """Labels of its own, after the job's (``job_id``, ``team``, ...)."""

    def __post_init__(self) -> None:
        bad = [label for label in self.labels if not _LABEL.match(label) or label in RESERVED_LABELS]
        if bad or len(set(self.labels)) != len(self.labels):
            raise ParameterError(
                "{metric}'s labels {labels}: name each once, as Prometheus names, none of the job's own ("
                + ", ".join(sorted(RESERVED_LABELS))
                + ")",
                metric=self.name,
                labels=self.labels,
            )


def from_field(name: str, *, missing: float | None = None) -> Callable[[Any], Iterable[Sample]]:
    """The values of a family without labels of its own: the payload's field ``name``, when it is a number
    (``missing`` when it is not; ``None``: the metric keeps its value)."""

    def values(payload: Any) -> Iterable[Sample]:
        value = getattr(payload, name, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return [((), float(value))]
        return [] if missing is None else [((), missing)]

    return values


Summarize = Callable[[Sequence[Mapping[str, Any]]], Summary | None]
"""From a job's events of the feature's kinds (``kind``, ``attempt``, ``ts`` and the payload, oldest first)
to its summary; ``None`` for a job that logged none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Feature:
    """What one feature adds to a job: its events, its metrics, its summary and the line describing it."""

    name: str
    """Short and lower-case (``rl``): the key of its summary in a job's view, the prefix of its metrics."""
    events: tuple[EventType, ...] = ()
    metrics: tuple[MetricFamily, ...] = ()
    summary: type[Summary] | None = None
    """The model of its summary in a job's view; ``None``: it adds none."""
    summarize: Summarize | None = None
    describe: Callable[[Any], str] | None = None
    """One line for ``gpufleet show`` from the summary (``rl: env steps/s ...`` shows it after the name)."""
    kinds: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or self.name in RESERVED_NAMES:
            raise ParameterError(
                "{name}: a feature's name is lower-case letters, digits and _ (at most 32), not job, checkpoint "
                "or rank",
                name=self.name,
            )
        object.__setattr__(self, "kinds", frozenset(e.kind for e in self.events))
        if len(self.kinds) != len(self.events):
            raise ParameterError("{name} declares an event kind twice", name=self.name)
        for family in self.metrics:
            self._check_family(family)
        if (self.summary is None) != (self.summarize is None) or (self.describe and not self.summary):
            raise ParameterError(
                "{name}: give summary and summarize together (and describe only with them)", name=self.name
            )

    def _check_family(self, family: MetricFamily) -> None:
        prefix = f"gpufleet_{self.name}_"
        if not family.name.startswith(prefix) or not _LABEL.match(family.name):
            raise ParameterError("{metric}: name the feature's metrics " + prefix + "...", metric=family.name)
        if family.kind not in self.kinds:
            raise ParameterError(
                "{metric} is fed by {kind}, which {name} does not declare among its events",
                metric=family.name,
                kind=family.kind,
                name=self.name,
            )


class _Registry:
    """The registered features and their indexes; discovery runs once, on the first lookup."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.features: dict[str, Feature] = {}
        self.types: dict[str, EventType] = {}
        self.families: dict[str, tuple[MetricFamily, ...]] = {}
        self.owners: dict[str, str] = {}
        """Event kind and metric name -> the feature that declared it."""
        self.skipped: dict[str, str] = {}
        self.discovered = False
        self._loading = False
        self.generation = 0
        """Counts changes, so that what is derived from the registry (a view's model) is rebuilt."""

    def add(self, feature: Feature) -> None:
        with self.lock:
            known = self.features.get(feature.name)
            if known == feature:
                return  # the same declaration again (a module imported twice)
            if known is not None:
                raise ParameterError("feature {name} is registered already; unregister it first", name=feature.name)
            for key in (*feature.kinds, *(f.name for f in feature.metrics)):
                if key in self.owners:
                    raise ParameterError(
                        "{key} of feature {name} is declared by feature {owner} already",
                        key=key,
                        name=feature.name,
                        owner=self.owners[key],
                    )
            self.features[feature.name] = feature
            self._index()

    def remove(self, name: str) -> None:
        with self.lock:
            if self.features.pop(name, None) is not None:
                self._index()

    def _index(self) -> None:
        every = list(self.features.values())
        self.types = {e.kind: e for f in every for e in f.events}
        self.owners = {key: f.name for f in every for key in (*f.kinds, *(m.name for m in f.metrics))}
        families: dict[str, list[MetricFamily]] = {}
        for f in every:
            for m in f.metrics:
                families.setdefault(m.kind, []).append(m)
        self.families = {kind: tuple(found) for kind, found in families.items()}
        self.generation += 1

    def discover(self) -> None:
        """Load the entry points once; each one that fails is remembered, none stops the others."""
        if self.discovered:
            return
        with self.lock:  # another thread waits here until the features are in
            if self.discovered or self._loading:  # done, or a feature's module looks up while it loads
                return
            self._loading = True
            try:
                from importlib.metadata import entry_points

                points = list(entry_points(group=ENTRY_POINT_GROUP))
                if not any(p.name == BUILTIN_NAME for p in points):  # run from a source tree, or installed
                    points.insert(0, _builtin_entry())  # before the entry point existed: our own features all the same
                for point in points:
                    try:
                        _run(point.load())
                    except Exception as err:  # noqa: BLE001 - a broken plugin must not break reading a job
                        self.skipped[point.name] = f"{type(err).__name__}: {err}"
            finally:
                self.discovered, self._loading = True, False


def _builtin_entry() -> Any:
    """gpufleet's own entry point, as ``pyproject.toml`` declares it (the value is a name: nothing is imported here)."""
    from importlib.metadata import EntryPoint

    return EntryPoint(name=BUILTIN_NAME, value="gpufleet.features:register_builtin", group=ENTRY_POINT_GROUP)


def _run(loaded: Any) -> None:
    """What an entry point names: a feature is registered, a callable called; a module registered on import."""
    if isinstance(loaded, Feature):
        _REGISTRY.add(loaded)
    elif callable(loaded):
        loaded()


_REGISTRY = _Registry()


def register(feature: Feature) -> Feature:
    """Add ``feature``; registering the same declaration again does nothing.

    Refused (:class:`~gpufleet.errors.ParameterError`): another feature of the same name, or an event
    kind or metric another feature declared.
    """
    _REGISTRY.add(feature)
    return feature


def unregister(name: str) -> None:
    """Remove the feature ``name`` (none: nothing), e.g. one a test registered."""
    _REGISTRY.remove(name)


def discover() -> dict[str, str]:
    """Load the installed features now (otherwise the first lookup does); the entry points skipped, and why."""
    _REGISTRY.discover()
    return dict(_REGISTRY.skipped)


def note_skipped(name: str, reason: str) -> None:
    """Record that the feature module ``name`` could not be loaded (a missing optional dependency)."""
    with _REGISTRY.lock:
        _REGISTRY.skipped[name] = reason


def skipped() -> dict[str, str]:
    """Feature modules that could not be loaded, and why (after discovery)."""
    _REGISTRY.discover()
    return dict(_REGISTRY.skipped)


def features() -> tuple[Feature, ...]:
    """Every registered feature, in the order they registered."""
    _REGISTRY.discover()
    return tuple(_REGISTRY.features.values())


def generation() -> int:
    """A number that changes whenever the registered features do."""
    _REGISTRY.discover()
    return _REGISTRY.generation


def event_type(kind: str) -> EventType | None:
    """The registered declaration of ``kind``; ``None`` for a core kind or one nobody registered."""
    _REGISTRY.discover()
    return _REGISTRY.types.get(kind)


def metric_families(kind: str) -> tuple[MetricFamily, ...]:
    """The metric families fed by events of ``kind`` (none for most kinds: a dictionary lookup per event)."""
    _REGISTRY.discover()
    return _REGISTRY.families.get(kind, ())


def notable_kinds() -> tuple[str, ...]:
    """The registered kinds ``gpufleet show`` lists among a job's events."""
    return tuple(e.kind for f in features() for e in f.events if e.notable)


def read_payload(event: Mapping[str, Any]) -> Payload | None:
    """The payload of ``event`` as its kind's model; ``None`` for a kind nobody registered. Never raises.

    A value that does not fit its field (a string where a number goes, a ``True``) is dropped and the
    field keeps its default: a line from an older or a foreign writer is read for what it holds.
    """
    declared = event_type(str(event.get("kind")))
    if declared is None:
        return None
    data = {k: v for k, v in event.items() if k not in ENVELOPE}
    return lenient(declared.payload, data)


M = TypeVar("M", bound=BaseModel)


def lenient(model: type[M], data: Mapping[str, Any]) -> M:
    """``model`` from ``data``, leaving out each top-level value that fails validation (it keeps its default).

    ``model`` must give every field a default; each round drops at least one key, so this ends.
    """
    kept = dict(data)
    while True:
        try:
            return model.model_validate(kept)
        except ValidationError as err:
            bad = {str(e["loc"][0]) for e in err.errors() if e["loc"]}
            if not bad & kept.keys():
                return model.model_construct()
            kept = {k: v for k, v in kept.items() if k not in bad}


__all__ = [
    "ENTRY_POINT_GROUP",
    "ENVELOPE",
    "RESERVED_LABELS",
    "RESERVED_NAMES",
    "EventType",
    "Feature",
    "MetricFamily",
    "Number",
    "Payload",
    "Sample",
    "Summarize",
    "Summary",
    "discover",
    "event_type",
    "features",
    "from_field",
    "generation",
    "lenient",
    "metric_families",
    "notable_kinds",
    "note_skipped",
    "read_payload",
    "register",
    "skipped",
    "unregister",
]
