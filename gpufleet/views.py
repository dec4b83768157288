"""The objects gpufleet reports, built once for the CLI's ``--json`` and the server's ``/api/``.

The main ones are pydantic models, so that the CLI, the server and ``/api/openapi.json`` share one
definition: :class:`JobsView` (``gpufleet jobs --json``, ``GET /api/jobs``) of :class:`JobRow` rows,
:class:`JobView` (``gpufleet show ID --json``, ``GET /api/jobs/{id}``), :class:`FleetStatus`
(``gpufleet fleet show --json``) and :class:`FleetPage` (``GET /api/fleet``). Each is read with its
``read`` class method and printed with :meth:`View.to_json`; :func:`job_summary`, :func:`jobs_view`,
:func:`job_view` and :func:`fleet_status` return that JSON object directly.

A job's view carries, under each feature's name, that feature's summary, typed by its model
(:mod:`gpufleet.jobs.features`; ``rl`` for actor-learner jobs): the view knows no feature by name.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, create_model

from gpufleet.errors import Conflict, NotFound, ParameterError, UsageError
from gpufleet.jobs import features
from gpufleet.jobs.events import NOTABLE, EventKind
from gpufleet.jobs.failure import LIST_TAIL_BYTES, TAIL_BYTES, job_failure, read_log_tail
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import JOBS_PAGE, Event, Job, Store, attempt_gpus, latest_step
from gpufleet.paths import attempt_log, checkpoints_dir, state_db

if TYPE_CHECKING:
    from gpufleet.spec import JobSpec
    from gpufleet.telemetry import DiagnosisConfig, Finding


class View(BaseModel):
    """Base of the reported objects: frozen, each field documented where it is declared.

    The docstring under a field becomes its schema description only when :func:`document_views` runs
    (``/api/openapi.json``): pydantic's ``use_attribute_docstrings`` would read this file's source at every
    class, a tenth of a second of every ``gpufleet jobs`` and ``show`` that prints no schema.
    """

    model_config = ConfigDict(frozen=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON object as the CLI prints it and the API serves it: a field never set is left out, not null
        (a fleet view without a fleet, a figure a job never reported)."""
        return self.model_dump(exclude_unset=True)


class JobFailure(View):
    """Why a failed job failed: how its last attempt ended and the line of that attempt's log that says why."""

    attempt: int | None
    """The failed attempt; null when the job failed before any started."""
    exit: str
    """How it ended: ``exit code 1``, ``killed by SIGKILL``, ``lost after 3 restarts (max_restarts)``."""
    line: str | None
    """The last exception of its log (``RuntimeError: boom at step 80``), else its last lines; null: empty."""
    hint: str | None
    """The command that prints the whole log (``gpufleet logs 2``)."""


class JobRow(View):
    """One job in a list: who, where, how far."""

    id: int
    name: str
    team: str
    priority: int
    state: JobState
    reason: str | None
    """Why a queued job waits or a job failed; null when nothing is to be said."""
    failure: JobFailure | None
    """Why a failed job failed, from the end of its last attempt's log; null unless it failed."""
    backend: str
    gpu_type: str
    """Where the last placement put it, else what its spec asks for."""
    gpus: int
    """GPUs per node."""
    nodes: int
    world_size: int
    strategy: str | None
    """The distributed strategy (ddp, fsdp); null for a job without a ``distributed`` block."""
    provider: str
    offer: str | None
    """The fleet offer its last attempt was placed on."""
    spot: bool
    attempts: int
    restarts: int
    step: int | None
    """The latest step its runtime reported; null before any."""
    submitted_at: float
    updated_at: float

    @classmethod
    def read(cls, store: Store, job: Job, *, tail_bytes: int = LIST_TAIL_BYTES) -> JobRow:
        """``tail_bytes``: what is read of a failed job's last log (a list reads little of each)."""
        spec = job.spec
        failure = job_failure(store, store.path.parent, job, tail_bytes=tail_bytes)
        placed = store.last_event(job.id, EventKind.PLACED)
        offer = placed.data.get("offer") if placed is not None else None
        return cls(
            id=job.id,
            name=job.name,
            team=job.team,
            priority=job.priority,
            state=job.state,
            reason=job.reason,
            failure=JobFailure(**failure.to_dict()) if failure is not None else None,
            backend=job.backend,
            gpu_type=str(placed.data.get("gpu_type") or spec.resources.gpu_type) if placed else spec.resources.gpu_type,
            gpus=spec.resources.gpus,
            nodes=spec.resources.nodes,
            world_size=spec.world_size,
            strategy=spec.distributed.strategy if spec.distributed is not None else None,
            provider=spec.provider,
            offer=offer if isinstance(offer, str) else None,
            spot=spec.spot,
            attempts=len(store.attempts(job.id)),
            restarts=job.restarts,
            step=latest_step(store, job.id),
            submitted_at=job.submitted_at,
            updated_at=job.updated_at,
        )


class JobsView(View):
    """``gpufleet jobs --json``: a page of the jobs asked for, the newest ``limit`` after the ``offset`` newest,
    oldest first."""

    jobs: list[JobRow]
    total: int
    """How many jobs match the filters in all: more than ``jobs`` holds when the page is not all of them."""
    limit: int | None
    """The page's size (``null``: every job)."""
    offset: int
    """Newest jobs skipped before the page."""

    @classmethod
    def read(
        cls,
        store: Store | None,
        *,
        team: str | None = None,
        state: str | None = None,
        limit: int | None = JOBS_PAGE,
        offset: int = 0,
    ) -> JobsView:
        if store is None:
            return cls(jobs=[], total=0, limit=limit, offset=offset)
        found, total = store.job_page(team=team, states=(state,) if state else None, limit=limit, offset=offset)
        return cls(jobs=[JobRow.read(store, j) for j in found], total=total, limit=limit, offset=offset)


class AttemptRow(View):
    """One attempt of a job."""

    attempt: int
    outcome: str
    """How it ended (completed, preempted, failed...), or its state while it runs."""
    pid: int | None
    gpus: int
    """GPUs it held over all nodes, as its backend recorded them."""
    started_at: float
    ended_at: float | None
    exit_code: int | None


class CheckpointRow(View):
    """One checkpoint folder of a job, as found on disk (not verified)."""

    step: int
    path: str
    healthy: bool | None
    """The manifest's flag; null where the folder has no readable manifest."""
    problem: str | None
    """Why it cannot be restored; null for a sound one."""


class JobView(JobRow):
    """``gpufleet show ID --json``: the job's row, its spec, attempts, notable events and checkpoints, and each
    feature's summary under the feature's name (:func:`job_view_model` types them; null: nothing reported)."""

    model_config = ConfigDict(extra="allow")

    spec: dict[str, Any]
    """The JobSpec, its ``env`` values shown as ``"set"``."""
    attempts: list[AttemptRow]  # type: ignore[assignment]  # JobRow's count, listed here
    events: list[dict[str, Any]]
    """The notable events, oldest first: ``ts``, ``attempt``, ``kind`` and the fields as written."""
    checkpoints: list[CheckpointRow]

    @classmethod
    def read(  # type: ignore[override]
        cls, store: Store, home: Path, job_id: int, *, reveal_env: bool = False
    ) -> JobView:
        """The spec's ``env`` values are ``"set"`` unless ``reveal_env`` (:func:`spec_view`)."""
        from gpufleet.runtime.checkpoint import CheckpointDir  # its manifest models: only what show reads

        job = store.job(job_id)
        row = JobRow.read(store, job, tail_bytes=TAIL_BYTES)
        starts = store.events(job_id, (EventKind.ATTEMPT_START, EventKind.RESIZED))
        attempts = [
            AttemptRow(
                attempt=a.n,
                outcome=a.outcome or a.state,
                pid=a.pid,
                gpus=attempt_gpus(job, a, starts),
                started_at=a.started_at,
                ended_at=a.ended_at,
                exit_code=a.exit_code,
            )
            for a in store.attempts(job_id)
        ]
        kinds = tuple(dict.fromkeys((*NOTABLE, *features.notable_kinds())))
        events = [{"ts": e.ts, "attempt": e.attempt, "kind": e.kind, **e.data} for e in store.events(job_id, kinds)]
        ckpts = [
            CheckpointRow(
                step=i.step, path=str(i.path), healthy=i.manifest.healthy if i.manifest else None, problem=i.problem
            )
            for i in CheckpointDir(checkpoints_dir(home, job_id)).scan(verify=False)
        ]
        values: dict[str, Any] = {
            **row.model_dump(),
            "spec": spec_view(job.spec, reveal_env=reveal_env),
            "attempts": attempts,
            "events": events,
            "checkpoints": ckpts,
            **_summaries(store, job_id),
        }
        return job_view_model().model_validate(values)

    def summaries(self) -> dict[str, features.Summary]:
        """Each feature's summary of this job, by the feature's name (features it logged nothing for left out).

        A field of :func:`job_view_model`'s model, or an extra one for a feature registered after it was built."""
        found = {f.name: getattr(self, f.name, None) for f in features.features() if f.summary is not None}
        return {name: summary for name, summary in found.items() if isinstance(summary, features.Summary)}

    def feature_lines(self) -> list[str]:
        """``<feature>: <its line>`` for each feature summary the job has (``gpufleet show``)."""
        describers = {f.name: f.describe for f in features.features() if f.describe is not None}
        return [f"{name}: {describers[name](s)}" for name, s in self.summaries().items() if name in describers]


def _summaries(store: Store, job_id: int) -> dict[str, features.Summary | None]:
    """Each feature with a summary: its summary of the job's events of its kinds (``None``: it logged none)."""
    out: dict[str, features.Summary | None] = {}
    for feature in features.features():
        if feature.summarize is None:
            continue
        found = store.events(job_id, sorted(feature.kinds)) if feature.kinds else []
        out[feature.name] = feature.summarize(
            [{"kind": e.kind, "attempt": e.attempt, "ts": e.ts, **e.data} for e in found]
        )
    return out


_VIEW_MODELS: dict[int, type[JobView]] = {}


def _field_docstrings() -> dict[str, dict[str, str]]:
    """Each class of this module: the docstring written under each of its fields, by class and field name."""
    import ast
    import inspect
    import sys

    from gpufleet.spec import attribute_docstrings

    tree = ast.parse(inspect.getsource(sys.modules[__name__]))
    return {node.name: attribute_docstrings(node.body) for node in tree.body if isinstance(node, ast.ClassDef)}


def document_views() -> None:
    """Give every view model's fields the docstring written under them as their description, for a schema.

    Idempotent. The models are rebuilt in the order they are defined (a model holds only models defined
    before it; one built by :func:`job_view_model` after its base), so each takes in the rebuilt ones it holds.
    """
    docs = _field_docstrings()
    models: list[type[View]] = []
    todo: list[type[View]] = [View]
    while todo:  # breadth first: a base before the models built on it
        model = todo.pop(0)
        models.append(model)
        todo.extend(model.__subclasses__())
    order = {name: i for i, name in enumerate(docs)}
    models.sort(key=lambda m: order.get(m.__name__, len(order)))
    for model in models:
        for name, info in model.model_fields.items():
            if info.description is None:
                info.description = next(
                    (docs[c.__name__][name] for c in model.__mro__ if name in docs.get(c.__name__, {})), None
                )
    for model in models:
        model.model_rebuild(force=True)


def job_view_model() -> type[JobView]:
    """:class:`JobView` with a field per registered feature summary, typed by its model (what
    ``/api/openapi.json`` documents); rebuilt when the registered features change."""
    generation = features.generation()
    model = _VIEW_MODELS.get(generation)
    if model is None:
        summaries: dict[str, Any] = {}
        for f in features.features():
            if f.summary is None:
                continue
            if f.name in JobView.model_fields or hasattr(JobView, f.name):
                raise ParameterError("feature {name}'s summary would hide a job's own field: rename it", name=f.name)
            summaries[f.name] = (f.summary | None, None)
        model = create_model("JobView", __base__=JobView, __doc__=JobView.__doc__, **summaries)
        _VIEW_MODELS.clear()
        _VIEW_MODELS[generation] = model
    return model


class PoolRow(View):
    """One pool of the fleet: an offer with its slots, prices, state, storm and jobs."""

    offer: str
    slots: int
    on_demand_per_gpu_hour: float
    spot_per_gpu_hour: float | None
    state: Literal["up", "down", "blocked"]
    """``down``: marked down or in an outage; ``blocked``: failover keeps jobs off it."""
    storm_per_hour: int | float
    """Injected spot preemptions per hour now."""
    jobs: list[int]
    """The running jobs placed on it."""
    blocks: list[dict[str, Any]]
    """The failover blocks on it, and why."""


class FleetStatus(View):
    """``gpufleet fleet show --json``: the local backend's fleet; only ``fleet`` (null) when none is in use."""

    fleet: str | None
    """The fleet file in use."""
    seconds: float | None = None
    """Since the fleet began (storms and outages are timed from it)."""
    down: dict[str, bool] | None = None
    """Targets marked down, each with whether it went down abruptly."""
    pools: list[PoolRow] | None = None
    quotas: list[dict[str, Any]] | None = None
    failover: dict[str, Any] | None = None

    @classmethod
    def read(cls, home: Path) -> FleetStatus:
        from gpufleet.backends.pools import active_fleet, matches, read_failover, read_marks  # placement, numpy

        fleet = active_fleet(home)
        if fleet is None:
            return cls(fleet=None)
        marks = read_marks(home)
        now = time.time()
        seconds, hours = marks.seconds(now), marks.seconds(now) / 3600
        blocks = read_failover(home, fleet).active(hours)
        running = running_on(home)
        pools = []
        for o in fleet.catalog.offers:
            outage = fleet.outage(o.key, seconds)
            down = [t for t in marks.down if matches(t, o.key)]
            blocked = [b.to_dict() for b in blocks if matches(b.target, o.key)]
            pools.append(
                PoolRow(
                    offer=o.key,
                    slots=o.capacity_gpus,
                    on_demand_per_gpu_hour=o.on_demand_per_gpu_hour,
                    spot_per_gpu_hour=o.spot_per_gpu_hour,
                    state="down" if down or outage is not None else "blocked" if blocked else "up",
                    storm_per_hour=fleet.storm_rate(o.key, seconds),
                    jobs=running.get(o.key, []),
                    blocks=blocked,
                )
            )
        return cls(
            fleet=str(home / "fleet" / "fleet.yaml"),
            seconds=seconds,
            down=marks.down,
            pools=pools,
            quotas=[q.model_dump() for q in fleet.catalog.quotas],
            failover=fleet.failover.model_dump(),
        )


RATE_WINDOW = 20
"""The step events a job's step rate is measured over: the latest attempt's last ones (its speed now)."""


def _finite(value: Any) -> float | None:
    """A logged figure as a number JSON can carry (NaN and infinities, and non-numbers, as null)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _latest_steps(store: Store, job_id: int) -> list[Event]:
    """The job's last step events (at most :data:`RATE_WINDOW`, oldest first) of its latest attempt that logged
    one: read newest first and stopped there, so a job with a million steps costs what one with twenty does."""
    found: list[Event] = []
    for e in store.newest_events(job_id, (EventKind.STEP,)):
        if not isinstance(e.data.get("step"), int):
            continue
        if found and e.attempt != found[0].attempt:
            break
        found.append(e)
        if len(found) == RATE_WINDOW:
            break
    return found[::-1]


class JobProgress(View):
    """How far a job's latest session got and how fast it steps now, from its runtime's step events."""

    total_steps: int | None
    """The steps its session said it runs (``session_start``); null where it did not say."""
    steps_per_s: float | None
    """Over the latest attempt's last logged steps (at most :data:`RATE_WINDOW`); null with fewer than two."""
    eta_s: float | None
    """Seconds to ``total_steps`` at that rate, while the job runs; null otherwise."""
    elapsed_s: float | None
    """From its first attempt's start to now while it runs, else to its last attempt's end; null before any."""
    loss: float | None
    """The last logged loss."""
    tokens_per_s: float | None
    """The last logged throughput."""

    @classmethod
    def read(cls, store: Store, job: Job, step: int | None, now: float) -> JobProgress:
        start = store.last_event(job.id, EventKind.SESSION_START)
        total = start.data.get("total_steps") if start is not None else None
        total = total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None
        recent = _latest_steps(store, job.id)
        last = recent[-1] if recent else None
        rate = None
        if len(recent) > 1 and recent[-1].ts > recent[0].ts and recent[-1].data["step"] > recent[0].data["step"]:
            rate = (recent[-1].data["step"] - recent[0].data["step"]) / (recent[-1].ts - recent[0].ts)
        running = job.state == JobState.RUNNING
        eta = max(0, total - step) / rate if running and rate and total is not None and step is not None else None
        attempts = store.attempts(job.id)
        end = now if running else attempts[-1].ended_at if attempts else None
        return cls(
            total_steps=total,
            steps_per_s=rate,
            eta_s=eta,
            elapsed_s=max(0.0, end - attempts[0].started_at) if attempts and end is not None else None,
            loss=_finite(last.data.get("loss")) if last is not None else None,
            tokens_per_s=_finite(last.data.get("tokens_per_s")) if last is not None else None,
        )


def running_gpus(store: Store, job: Job) -> int:
    """The GPUs (over all nodes) ``job``'s running attempt holds (:func:`attempt_gpus`); 0 unless it runs."""
    attempts = store.attempts(job.id) if job.state == JobState.RUNNING else []
    if not attempts:
        return 0
    return attempt_gpus(job, attempts[-1], store.events(job.id, (EventKind.ATTEMPT_START, EventKind.RESIZED)))


class FleetJobRow(JobRow):
    """A job as the fleet page lists it: its row, its run's parameters, the GPUs it holds, its progress."""

    args: dict[str, Any]
    """The spec's ``args``: the run's parameters."""
    gpus_in_use: int
    """GPUs (over all nodes) its running attempt holds; 0 unless it runs."""
    progress: JobProgress

    @classmethod
    def read(  # type: ignore[override]
        cls, store: Store, job: Job, now: float | None = None, *, held: int | None = None
    ) -> FleetJobRow:
        """``held``: the GPUs its running attempt holds, where the caller has them (else read here)."""
        row = JobRow.read(store, job)
        if held is None:
            held = running_gpus(store, job)
        progress = JobProgress.read(store, job, row.step, time.time() if now is None else now)
        return cls(**row.model_dump(exclude_unset=True), args=dict(job.spec.args), gpus_in_use=held, progress=progress)


class Capacity(View):
    """GPUs in use against the GPUs there are: the fleet's pools, else the local scheduler's slots."""

    in_use: int
    """GPUs the running jobs of the local backend hold."""
    total: int | None
    """Its pools' slots (a fleet in use), else its slots; null where ``GPUFLEET_LOCAL_SLOTS`` is invalid."""
    source: Literal["fleet", "local"]
    elsewhere: int
    """GPUs running jobs hold on other backends (Slurm, Kubernetes, Ray), whose totals are theirs to tell."""

    @classmethod
    def read(cls, home: Path, fleet: FleetStatus, held: Sequence[tuple[str, int]]) -> Capacity:
        """``held``: ``(backend, GPUs)`` of every running job (not only those a page lists)."""
        from gpufleet.backends.local.process import scheduler_slots

        local = sum(gpus for backend, gpus in held if backend == "local")
        others = sum(gpus for _, gpus in held) - local
        if fleet.pools is not None:
            return cls(in_use=local, total=sum(p.slots for p in fleet.pools), source="fleet", elsewhere=others)
        try:
            total: int | None = scheduler_slots(home)[0]
        except UsageError:
            total = None
        return cls(in_use=local, total=total, source="local", elsewhere=others)


class QueueRow(View):
    """A queued job, in the order the scheduler considers them (priority, then age)."""

    id: int
    name: str
    team: str
    priority: int
    reason: str | None
    """Why it waits."""


class FleetPage(View):
    """``GET /api/fleet``: counts by state and team, the queue and why each job waits, the pools, recent events.

    Its lists are bounded (:mod:`gpufleet.serve.fleet_view`): the counts are of every job, the lists of some."""

    jobs: list[FleetJobRow]
    """By id: the running jobs (the newest 50), the queue's first 25 and the 25 that ended last."""
    jobs_total: int
    """Jobs in the store: more than ``jobs`` lists when the store is large."""
    states: dict[str, int]
    """Jobs per state, of every job."""
    teams: dict[str, dict[str, int]]
    """Per team, jobs per state, of every job."""
    queue: list[QueueRow]
    """The first 25 queued jobs, in the order the scheduler serves them."""
    queue_total: int
    """Jobs queued in all."""
    recent: list[dict[str, Any]]
    """The latest preemptions, rollbacks and failovers (at most 50, newest first) of the 100 jobs updated last:
    ``job`` and ``name`` the job it happened to, ``by`` and ``by_name`` the job that took its GPUs
    (``preempted_by``, ``reclaimed_by``)."""
    fleet: FleetStatus
    capacity: Capacity
    generated_at: float


def job_summary(store: Store, job: Job) -> dict[str, Any]:
    """One job's row as JSON (:class:`JobRow`)."""
    return JobRow.read(store, job).to_json()


def log_view(store: Store, home: Path, job_id: int, attempt: int | None, max_bytes: int) -> dict[str, Any]:
    """The end of an attempt's log (``logs --json``), at most ``max_bytes``; ``size`` is the whole file's.

    The log is read only as a regular file reached through real folders (:func:`read_log_tail`): a job's own
    code, which may write under ``jobs/<id>/``, cannot make this (or the server) show another file.
    """
    attempts = store.attempts(store.job(job_id).id)
    if not attempts:
        raise Conflict(f"job {job_id} has not started yet: no logs")
    n = attempt or attempts[-1].n
    if not 1 <= n <= len(attempts):
        raise NotFound(f"job {job_id} has {len(attempts)} attempt(s); --attempt {n} does not exist")
    path = attempt_log(home, job_id, n)
    text, size = "", 0
    if os.path.lexists(path):
        tail = read_log_tail(path, max_bytes)
        if tail is None:
            raise Conflict(
                f"cannot read {path}: not a regular file in a real folder (a link, a device or a FIFO); "
                "remove it: the attempt's log is written there as a plain file"
            )
        text, size = tail[0].decode("utf-8", errors="replace"), tail[1]
    return {"id": job_id, "attempt": n, "path": str(path), "log": text, "size": size}


def job_diagnosis(home: Path, job: Job, config: DiagnosisConfig) -> tuple[str, list[Finding], list[str]]:
    """What holds ``job`` back (``gpufleet diagnose``): GPU findings from its own GPU series and, for a
    distributed job, the ranks' findings; with the source described and notes on what could not be judged."""
    from gpufleet.jobs.events import iter_events
    from gpufleet.paths import events_file, job_dir
    from gpufleet.telemetry import JobContext, diagnose, series_from_samples
    from gpufleet.telemetry.gpu import job_gpu_samples
    from gpufleet.telemetry.ranks import rank_findings

    samples = job_gpu_samples(job_dir(home, job.id))
    telemetry = job.spec.telemetry
    ranked: list[Finding] = []
    if job.spec.world_size > 1:
        from gpufleet.cost.rates import load_rates
        from gpufleet.cost.recover import attempt_prices
        from gpufleet.cost.usage import job_usages

        # A straggler's tax is priced as the ledger prices the attempt (telemetry sits below cost).
        rates = load_rates()
        store = Store(state_db(home))
        try:
            prices = attempt_prices(job_usages(store, job), rates)
        finally:
            store.close()
        factor = job.spec.distributed.straggler_factor if job.spec.distributed is not None else 1.5
        ranked = rank_findings(
            iter_events(events_file(home, job.id)), straggler_factor=factor, prices=prices, currency=rates.currency
        )
    if not samples and job.spec.world_size > 1:
        source = f"job {job.id} {job.name}: {job.spec.world_size} ranks, no GPU series"
        note = f"no GPU series (telemetry.gpu_source is {telemetry.gpu_source!r}): only the ranks were judged"
        return source, ranked, [note]
    if not samples:
        raise Conflict(
            f"job {job.id} has no GPU series (telemetry.gpu_source is {telemetry.gpu_source!r}); set "
            "telemetry.gpu_source to nvml, scrape:<url> or synthetic:<pattern> in its spec"
        )
    attempts = sorted({s.labels.get("attempt", "?") for s in samples})
    gpus = sorted({s.labels.get("gpu", "?") for s in samples}, key=lambda g: (len(g), g))
    series = series_from_samples(samples)
    source = (
        f"job {job.id} {job.name}: {len(gpus)} GPU(s), {len(attempts)} attempt(s), "
        f"{series.duration_s:.0f} s of GPU series"
    )
    findings = ranked + diagnose(series, JobContext(precision=telemetry.precision), config)
    notes = []
    if series.duration_s < config.min_duration_s:
        notes.append(
            f"the series cover {series.duration_s:.0f} s, less than the {config.min_duration_s:g} s a condition "
            "must hold; lower --min-duration (and --window) to judge a short job"
        )
    return source, findings, notes


def jobs_view(
    store: Store | None,
    *,
    team: str | None = None,
    state: str | None = None,
    limit: int | None = JOBS_PAGE,
    offset: int = 0,
) -> dict[str, Any]:
    """``{"jobs": [...], "total": N, ...}``: a page of the jobs (of ``team``, in ``state``) as JSON
    (:class:`JobsView`)."""
    return JobsView.read(store, team=team, state=state, limit=limit, offset=offset).to_json()


ENV_SET = "set"
"""What :func:`spec_view` shows in place of each ``env`` value."""


def spec_view(spec: JobSpec, *, reveal_env: bool = False) -> dict[str, Any]:
    """A job's spec as JSON, with its ``env`` values replaced by ``"set"`` (names kept) unless ``reveal_env``.

    The env is where a job's tokens and passwords go: ``show --json`` and the server's API print the
    same object, and neither should hand those values to whoever reads the output.
    """
    out = spec.model_dump()
    if not reveal_env:
        out["env"] = dict.fromkeys(spec.env, ENV_SET)
    return out


def job_view(store: Store, home: Path, job_id: int, *, reveal_env: bool = False) -> dict[str, Any]:
    """One job as JSON (:class:`JobView`): its row, spec, attempts, notable events, checkpoints and feature
    summaries (``show --json``). The spec's ``env`` values are ``"set"`` unless ``reveal_env``."""
    return JobView.read(store, home, job_id, reveal_env=reveal_env).to_json()


def running_on(home: Path) -> dict[str, list[int]]:
    """Offer -> the jobs whose latest attempt was placed there and still runs."""
    if not state_db(home).exists():
        return {}
    store = Store(state_db(home))
    where: dict[str, list[int]] = {}
    for job in store.jobs(states=("running",)):
        placed = store.last_event(job.id, EventKind.PLACED)
        if placed is not None and isinstance(placed.data.get("offer"), str):
            where.setdefault(placed.data["offer"], []).append(job.id)
    return where


def fleet_status(home: Path) -> dict[str, Any]:
    """The fleet as JSON (:class:`FleetStatus`): ``{"fleet": null}`` alone when none is in use."""
    return FleetStatus.read(home).to_json()


__all__ = [
    "ENV_SET",
    "JOBS_PAGE",
    "AttemptRow",
    "Capacity",
    "CheckpointRow",
    "FleetJobRow",
    "FleetPage",
    "FleetStatus",
    "JobFailure",
    "JobProgress",
    "JobRow",
    "JobView",
    "JobsView",
    "PoolRow",
    "QueueRow",
    "View",
    "fleet_status",
    "job_diagnosis",
    "job_summary",
    "job_view",
    "job_view_model",
    "jobs_view",
    "log_view",
    "running_gpus",
    "running_on",
    "spec_view",
]
