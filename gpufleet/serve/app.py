"""``gpufleet serve``: one ASGI app over a ``$GPUFLEET_HOME``: pages, a JSON API, the alert webhook.

The JSON API answers with the objects the CLI prints with ``--json``, built by the same functions
(:mod:`gpufleet.views`, :func:`gpufleet.cost.gather.cost_summary`, :func:`gpufleet.quality.standing.read_history`):
``GET /api/jobs`` is ``gpufleet jobs --json``, ``GET /api/jobs/{id}`` is ``gpufleet show ID --json``,
``GET /api/cost`` is ``gpufleet cost --json``, ``GET /api/fleet`` adds the counts and the queue to
``gpufleet fleet show --json``. ``GET /api/jobs/{id}/goodput`` tells where the job's GPU time went and
``GET /metrics`` serves the same buckets for every job to Prometheus (:mod:`gpufleet.serve.goodput`);
like the other reads, both are open to whoever passes the Host check. ``POST /api/jobs/{id}/preempt``,
``/cancel``, ``/hold`` and ``/release``, and the registry's ``promote`` and ``rollback``, act like the
commands of the same name, behind the bearer token
(:mod:`gpufleet.serve.auth`). ``POST /hooks/alerts`` is the signed webhook of
:mod:`gpufleet.quality.webhook` (same signature, replay window and idempotency), whose retrain alerts
submit the retraining job the monitor file names for the model, once per key.

The pages (``/``, ``/jobs/{id}``, ``/cost``, ``/quality``) are static HTML and one script that reads
the API, so what a person sees is what a program gets. Every route reads the store afresh, so the
server needs no restart when jobs come and go: each thread keeps one connection in autocommit mode
(:mod:`gpufleet.serve.stores`), which sees every commit and holds no transaction between requests.
The heavy views are built at most once per ``--cache`` seconds (:class:`ViewCache`) and kept as the
encoded bytes served (:mod:`gpufleet.serve.body`): a request that finds one fresh is answered on the
event loop, without a thread, a validation or an encoding.
The page of a job that is not there (or of an id that is no job id) is a 404 page saying so, with the
way back to the fleet; the API still answers such a request with its JSON 404.

Every request first passes :class:`gpufleet.serve.guard.Guard` (its Host, its token before its body,
its body's size, the response's security headers, no host path in a body); the server's connections
are bounded by :mod:`gpufleet.serve.limits`. A job's ``env`` values are never served (names only).
Every refusal answers the ``http_status`` of its :mod:`gpufleet.errors` class: bad input 400 (422 for a
value the API validates), an unknown job or model 404, a request the state refuses 409, a service that
does not answer 503 (504 when it was waited for), with the body ``{"detail": message}``.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from gpufleet.errors import GpufleetError, NotFound, UsageError
from gpufleet.extras import required
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import JOBS_PAGE, Store
from gpufleet.paths import has_store, state_db
from gpufleet.serve.auth import action_refusal
from gpufleet.serve.body import JsonEncoder, json_response
from gpufleet.serve.cache import ViewCache
from gpufleet.serve.fleet_view import fleet_view
from gpufleet.serve.guard import MAX_BODY_BYTES, Guard, accepted_hosts
from gpufleet.serve.limits import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from gpufleet.serve.series import series_view
from gpufleet.serve.stores import forget_thread_stores, thread_store
from gpufleet.serve.timeline import Bucket

with required("fastapi", "serve", "gpufleet serve"):
    from fastapi import Body, FastAPI, HTTPException, Query, Request
    from fastapi import Path as PathParam
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
    from starlette.concurrency import run_in_threadpool

log = logging.getLogger("gpufleet.serve")

LOG_TAIL_BYTES = 256 << 10
"""A log page shows at most the last 256 KiB of an attempt's log."""

LOOP_JOB_EVENTS = 2_000
"""``GET /api/jobs/{id}`` of a job with at most this many events is answered on the event loop: about 1.5 ms at
2,000 events on the 2-core machine. Handed to a thread of the pool, the same view waited for the interpreter
lock while the loop served other requests, at every SQLite call (which releases it): 35-45 ms at p50 under 20
clients, the slowest route by far (``bench/serve_load.py``). A larger job's view, which reads more, is still
built in a thread, so the loop is never held for long."""
MAX_ID = 2**63 - 1
"""The largest job id or attempt number (SQLite's INTEGER): a larger one is refused (422), never a 500."""
JobId = Annotated[int, PathParam(ge=1, le=MAX_ID, description="A job id (see GET /api/jobs).")]
MAX_QUERY_CHARS = 128
"""The longest query value (a team, a period): longer is refused (422) before anything is looked up."""
Team = Annotated[str | None, Query(max_length=MAX_QUERY_CHARS, description="Only this team's jobs.")]
Seconds = Annotated[float, Query(gt=0, allow_inf_nan=False)]
Limit = Annotated[int, Query(ge=0, le=MAX_ID, description=f"The newest N jobs (default {JOBS_PAGE}); 0: every job.")]
Offset = Annotated[int, Query(ge=0, le=MAX_ID, description="Newest jobs skipped first (the next page).")]
SweepName = Annotated[str, PathParam(max_length=63, description="A sweep's name (see GET /api/sweeps).")]

PERIODS = {"24h": 86_400.0, "7d": 7 * 86_400.0, "30d": 30 * 86_400.0, "all": None}
DEMO_NAME = re.compile(r"^[0-9]{8}-[0-9]{6}$")
"""The folders ``gpufleet quality demo`` makes under ``$GPUFLEET_HOME/quality-demo``."""


@dataclass
class ServeConfig:
    """What ``gpufleet serve`` was started with."""

    home: Path
    token: str | None
    """The bearer token for routes that change state; None: they are refused."""
    monitor: Path | None = None
    """The standing monitor's file: its models' retrain specs answer retrain alerts."""
    webhook_secret: bytes | None = None
    refresh_s: float = 2.0
    """How often the pages poll the API."""
    sync_remote: bool = True
    """Refresh jobs of remote schedulers (Slurm, Ray) from a background thread."""
    cache_s: float = 1.0
    """How old the job list, the fleet view and the cost may be when served (:class:`ViewCache`)."""
    host: str = "127.0.0.1"
    """The interface listened on: a request's ``Host`` may name it (unless it is a wildcard)."""
    allowed_hosts: tuple[str, ...] = ()
    """More names a request's ``Host`` may give (``--allowed-host``), besides loopback ones."""
    request_timeout_s: float = REQUEST_TIMEOUT_S
    """How long a request's head and body may take to arrive (:mod:`gpufleet.serve.limits`)."""
    max_connections: int = MAX_CONNECTIONS
    """Connections open at once, at most (fewer where descriptors are scarce)."""
    extra: dict[str, Any] = field(default_factory=dict)


def _store(home: Path) -> Store | None:
    """The home's store as this thread keeps it (:mod:`gpufleet.serve.stores`): never to be closed by a route."""
    return thread_store(state_db(home))


def _job_store(home: Path, job_id: int) -> Store:
    store = _store(home)
    if store is None:
        raise NotFound(f"no job {job_id}: this home has no jobs")
    try:
        store.job(job_id)
    except NotFound:
        raise NotFound(f"no job {job_id} in this home (GET /api/jobs lists them)") from None
    return store


def cost_view(home: Path, *, team: str | None, since: float | None, period: str) -> dict[str, Any]:
    """``gpufleet cost --json`` of ``team``'s jobs that ran since ``since`` (``None``: all), with the ``period`` asked.

    Ended jobs are read from the cost cache (:func:`gpufleet.cost.gather.cost_summary`), so a build costs the
    jobs that changed, not the jobs there are."""
    from gpufleet.cost.gather import cost_summary

    store = _store(home)
    if store is None:
        return {"currency": None, "total": None, "teams": {}, "jobs": [], "note": None, "period": period}
    summary = cost_summary(store, team=team, since=since, limit=0, with_json=True)
    return {**summary.to_dict(), "period": period}


def quality_homes(home: Path) -> list[tuple[str, Path]]:
    """The homes whose models the quality page shows: this one, and each ``quality demo`` run under it."""
    out = [("", home)]
    demos = home / "quality-demo"
    if demos.is_dir():
        runs = [p for p in sorted(demos.iterdir()) if p.is_dir() and DEMO_NAME.match(p.name)]
        out += [(f"quality-demo/{p.name}", p) for p in runs]
    return out


def quality_home(home: Path, name: str) -> Path:
    """The home a quality route acts on: ``""`` (this one) or ``quality-demo/<stamp>``, nothing else."""
    for known, path in quality_homes(home):
        if name == known:
            return path
    raise NotFound(f"no quality home {name!r}: use one of those GET /api/quality lists")


def quality_view(home: Path) -> dict[str, Any]:
    """Per home: the registry's models, aliases and alias history, the policy's decisions, the monitor's history."""
    from gpufleet.quality.policy import DecisionLog
    from gpufleet.quality.registry import Registry, sqlite_path, tracking_uri
    from gpufleet.quality.standing import read_history

    homes = []
    for name, path in quality_homes(home):
        models = []
        db = sqlite_path(tracking_uri(path))
        if db is not None and db.exists():
            registry = Registry(path)
            for model in registry.models():
                events, source = registry.history(model)
                models.append(
                    {
                        "name": model,
                        "aliases": registry.aliases(model),
                        "history": [e.to_dict() for e in events],
                        "history_source": source,
                    }
                )
        decisions = [d.to_dict() for d in DecisionLog(path / "quality" / "decisions.jsonl").read()]
        monitor = read_history(path)
        if models or decisions or monitor or name == "":
            homes.append({"home": name, "models": models, "decisions": decisions, "monitor": monitor})
    return {"homes": homes}


STATIC_FILES = frozenset(
    p.name for p in resources.files("gpufleet.serve").joinpath("static").iterdir() if p.name.endswith((".js", ".css"))
)
"""The files ``/static/{name}`` serves: the package's own, listed once; any other name is a 404, never a path."""


@functools.cache
def _static(name: str) -> str:
    """A file of the package's ``static`` folder (only :data:`STATIC_FILES` and ``page.html`` are asked for),
    read once: every page is this template, and the fleet page is asked for every few seconds by each viewer."""
    return resources.files("gpufleet.serve").joinpath("static", name).read_text(encoding="utf-8")


def _page(title: str, page: str, cfg: ServeConfig, **data: Any) -> HTMLResponse:
    import html
    import json

    boot = json.dumps({"page": page, "refresh_s": cfg.refresh_s, "token": cfg.token is not None, **data})
    body = (
        _static("page.html").replace("{{title}}", html.escape(title)).replace("{{boot}}", html.escape(boot, quote=True))
    )
    return HTMLResponse(body, headers={"Cache-Control": "no-store"})


PAGE_MAIN = re.compile(r'<main id="main">.*?</main>', re.DOTALL)
SHOWN_ID_CHARS = 40
"""A page that names a malformed job id shows at most its first 40 characters."""


def _no_job_page(job_id: str, cfg: ServeConfig) -> HTMLResponse:
    """``/jobs/<id>`` for a job that is not there: a page (404) that says so and leads back to the fleet,
    not the API's JSON; written by the server, so it reads the same without its script."""
    import html

    shown = job_id if len(job_id) <= SHOWN_ID_CHARS else job_id[:SHOWN_ID_CHARS] + "…"
    main = (
        f'<main id="main"><h1 id="no-job">no job {html.escape(shown)}</h1>'
        '<p><a href="/">Back to the fleet</a>: it lists the jobs of this home.</p></main>'
    )
    page = bytes(_page(f"gpufleet: no job {shown}", "missing", cfg).body).decode()
    return HTMLResponse(PAGE_MAIN.sub(lambda _: main, page, count=1), 404, headers={"Cache-Control": "no-store"})


def create_app(cfg: ServeConfig) -> FastAPI:
    """The app; every state-changing route is reached only through :class:`Guard`'s token check."""
    from gpufleet.features import load_features
    from gpufleet.views import FleetPage, JobsView, document_views, job_view_model

    for name, why in load_features().items():  # the others load: a job of that feature shows its raw events
        log.warning("feature %s not loaded: %s", name, why)
    document_views()  # the fields' docstrings, in /api/openapi.json
    home = cfg.home
    cache = ViewCache(cfg.cache_s)
    stop = threading.Event()
    warmed = threading.Event()
    warmed.set()  # cleared while the server warms up (its lifespan), if it does
    receiver = _receiver(cfg)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        threads = []
        if cfg.sync_remote:
            threads.append(threading.Thread(target=_sync_loop, args=(home, stop), daemon=True, name="sync"))
        if cfg.monitor is not None:
            from gpufleet.quality.standing import StandingMonitor, load_monitor_config

            monitor = StandingMonitor(load_monitor_config(cfg.monitor), home)
            threads.append(threading.Thread(target=monitor.run_forever, args=(stop,), daemon=True, name="monitor"))
        warmed.clear()
        threads.append(threading.Thread(target=_warm_up, args=(home, warmed), daemon=True, name="warm-up"))
        for t in threads:
            t.start()
        yield
        stop.set()
        cache.close()
        for t in threads:
            if t.name != "warm-up":  # it only reads, and may take long on a large store: not waited for
                t.join(timeout=10)

    app = FastAPI(
        title="gpufleet",
        summary="The fleet's jobs, cost and model quality; the same objects as the CLI's --json.",
        version=_version(),
        openapi_url="/api/openapi.json",
        docs_url=None,  # no third-party script on the origin whose storage holds the token
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.view_cache = cache  # for a look at its size; nothing else reads it
    hosts = accepted_hosts(cfg.host, cfg.allowed_hosts)
    app.add_middleware(
        Guard,
        hosts=hosts,
        check_action=lambda headers: action_refusal(headers, cfg.token),
        home=home,
        max_body=MAX_BODY_BYTES,
    )

    @app.exception_handler(GpufleetError)
    async def _refused(_: Request, err: GpufleetError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=err.http_status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": [_problem(e) for e in err.errors()]}, status_code=422)

    # ---- pages ----------------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def fleet_page() -> HTMLResponse:  # no I/O: answered on the event loop, no thread
        return _page("gpufleet: fleet", "fleet", cfg)

    @app.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
    def job_page(job_id: str) -> HTMLResponse:
        number = int(job_id) if job_id.isascii() and job_id.isdigit() else 0
        if not 1 <= number <= MAX_ID:
            return _no_job_page(job_id, cfg)
        try:
            _job_store(home, number)
        except NotFound:
            return _no_job_page(str(number), cfg)
        return _page(f"gpufleet: job {number}", "job", cfg, job=number)

    @app.get("/cost", response_class=HTMLResponse, include_in_schema=False)
    async def cost_page() -> HTMLResponse:  # no I/O: answered on the event loop, no thread
        return _page("gpufleet: cost", "cost", cfg)

    @app.get("/quality", response_class=HTMLResponse, include_in_schema=False)
    async def quality_page() -> HTMLResponse:  # no I/O: answered on the event loop, no thread
        return _page("gpufleet: quality", "quality", cfg)

    @app.get("/sweeps", response_class=HTMLResponse, include_in_schema=False)
    async def sweeps_page() -> HTMLResponse:  # no I/O: answered on the event loop, no thread
        return _page("gpufleet: sweeps", "sweeps", cfg)

    @app.get("/api/docs", response_class=HTMLResponse, include_in_schema=False)
    async def api_docs_page() -> HTMLResponse:
        return _page("gpufleet: API", "apidocs", cfg)

    @app.get("/docs", include_in_schema=False)
    def docs_redirect() -> RedirectResponse:
        return RedirectResponse("/api/docs")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        types = {".js": "text/javascript", ".css": "text/css"}
        kind = types.get(Path(name).suffix)
        if kind is None or name not in STATIC_FILES:
            raise HTTPException(404, "no such file")
        return Response(_static(name), media_type=kind, headers={"Cache-Control": "no-cache"})

    # ---- the JSON API ---------------------------------------------------------------------------

    def known_team(team: str | None) -> bool:
        """Whether a view of ``team`` may be cached: no team, or one that some job belongs to (one indexed count)."""
        if team is None or cache.ttl_s <= 0:
            return True  # nothing to grow: no team, or nothing cached at all
        store = _store(home)  # not cached: a cache entry per unknown team is what a stream of them must not grow
        return store is not None and store.count_jobs(team=team) > 0

    async def cached_json(key: tuple[Any, ...], build: Callable[[], bytes], team: str | None = None) -> Response:
        """The encoded view of ``key``: from the cache on the event loop while it is fresh (rebuilt ahead of its
        expiry meanwhile), else built (or waited for, while another request builds it) in a thread of the pool;
        a view of an unknown ``team`` is not kept."""
        body: bytes | None = cache.fresh(key, build)
        if body is None:
            body = await run_in_threadpool(lambda: cache.get(key, build) if known_team(team) else build())
        return json_response(body)

    jobs_json = JsonEncoder(lambda: JobsView)
    job_json = JsonEncoder(job_view_model, exclude_unset=True)
    fleet_json = JsonEncoder(lambda: FleetPage, exclude_unset=True)
    any_json = JsonEncoder(lambda: dict[str, Any])

    @app.get("/api/jobs", tags=["jobs"], summary="gpufleet jobs --json", response_model=JobsView)
    async def api_jobs(
        team: Team = None,
        state: JobState | None = None,
        limit: Limit = JOBS_PAGE,
        offset: Offset = 0,
    ) -> Response:
        from gpufleet.views import jobs_view

        wanted = None if state is None else str(state)
        page = None if limit == 0 else limit

        def build() -> bytes:
            return jobs_json(jobs_view(_store(home), team=team, state=wanted, limit=page, offset=offset))

        return await cached_json(("jobs", team, wanted, page, offset), build, team)

    @app.get(
        "/api/jobs/{job_id}",
        tags=["jobs"],
        summary="gpufleet show ID --json",
        response_model=job_view_model(),
        response_model_exclude_unset=True,
    )
    async def api_job(job_id: JobId) -> Response:
        from gpufleet.views import job_view

        def build() -> bytes:
            return job_json(job_view(_job_store(home, job_id), home, job_id))

        store = _store(home)
        if store is None or store.event_count(job_id, at_most=LOOP_JOB_EVENTS + 1) <= LOOP_JOB_EVENTS:
            return json_response(build())  # a millisecond or two: on the event loop, no thread (see LOOP_JOB_EVENTS)
        return json_response(await run_in_threadpool(build))

    @app.get(
        "/api/jobs/{job_id}/series", tags=["jobs"], summary="Loss, tokens/s and MFU per logged step; progress and ETA"
    )
    def api_series(job_id: JobId) -> dict[str, Any]:
        return series_view(_job_store(home, job_id), job_id)

    @app.get(
        "/api/jobs/{job_id}/goodput",
        tags=["jobs"],
        summary="Where the GPU time went: goodput buckets, preemption overhead, each rank's phases, stragglers, hangs",
    )
    def api_goodput(job_id: JobId) -> dict[str, Any]:
        from gpufleet.serve.goodput import job_time_view

        return job_time_view(_job_store(home, job_id), job_id)

    @app.get("/api/jobs/{job_id}/logs", tags=["jobs"], summary="gpufleet logs ID --json (the last 256 KiB)")
    def api_logs(job_id: JobId, attempt: int | None = Query(default=None, ge=1, le=MAX_ID)) -> dict[str, Any]:
        from gpufleet.views import log_view

        store = _job_store(home, job_id)
        return log_view(store, home, job_id, attempt, LOG_TAIL_BYTES)

    @app.get("/api/jobs/{job_id}/trace", tags=["jobs"], summary="The job's spans (gpufleet trace ID)")
    def api_trace(job_id: JobId) -> dict[str, Any]:
        from gpufleet.telemetry.tracing import job_trace

        store = _job_store(home, job_id)
        spans, _ = job_trace(store, home, job_id, now=time.time())
        return {"id": job_id, "spans": [_span(s) for s in spans]}

    @app.get("/api/jobs/{job_id}/diagnosis", tags=["jobs"], summary="gpufleet diagnose ID --json")
    def api_diagnosis(job_id: JobId, window: Seconds = 60.0, min_duration: Seconds = 300.0) -> dict[str, Any]:
        from gpufleet.telemetry import DiagnosisConfig
        from gpufleet.views import job_diagnosis

        job = _job_store(home, job_id).job(job_id)
        config = DiagnosisConfig(window_s=window, min_duration_s=min_duration)
        source, findings, notes = job_diagnosis(home, job, config)
        return {"source": source, "findings": [f.to_dict() for f in findings], "warnings": notes}

    def job_action(verb: str) -> Callable[..., dict[str, Any]]:
        """``POST /api/jobs/{id}/<verb>``: the backend's ``verb`` on the job, as ``gpufleet <verb> ID`` does."""

        def act(job_id: JobId) -> dict[str, Any]:
            getattr(_backend_of(home, job_id), verb)(job_id)
            log.info("job %d: %s requested through the API", job_id, verb)
            return {"id": job_id, "requested": verb, **({"grace": None} if verb == "preempt" else {})}

        return act

    for verb in ("preempt", "cancel", "hold", "release"):
        app.post(
            f"/api/jobs/{{job_id}}/{verb}", tags=["actions"], summary=f"gpufleet {verb} ID (token)", name=f"api_{verb}"
        )(job_action(verb))

    @app.get(
        "/api/fleet",
        tags=["fleet"],
        summary="Jobs by state and team, the queue, the pools, recent events",
        response_model=FleetPage,
        response_model_exclude_unset=True,
    )
    async def api_fleet() -> Response:
        return await cached_json(("fleet",), lambda: fleet_json(fleet_view(home, _store(home))))

    @app.get(
        "/api/cost",
        tags=["cost"],
        summary="gpufleet cost --json, optionally over a period",
        response_model=dict[str, Any],
    )
    async def api_cost(
        team: Team = None, period: Annotated[str, Query(max_length=MAX_QUERY_CHARS)] = "all"
    ) -> Response:
        if period not in PERIODS:
            raise HTTPException(422, f"period={period!r}: use one of {', '.join(PERIODS)}")
        seconds = PERIODS[period]

        def build() -> bytes:
            warmed.wait()  # the warm-up prices what the cost cache lacks: a request waits for it, not doing it again
            since = None if seconds is None else time.time() - seconds
            return any_json(cost_view(home, team=team, since=since, period=period))

        return await cached_json(("cost", team, period), build, team)

    @app.get(
        "/api/cost/timeline",
        tags=["cost"],
        summary="GPU-hours and money per team per hour or day (bucket=auto: by the hour up to two days)",
    )
    def api_cost_timeline(
        team: Team = None,
        period: Annotated[str, Query(max_length=MAX_QUERY_CHARS)] = "all",
        bucket: Bucket = "auto",
    ) -> dict[str, Any]:
        from gpufleet.cost.rates import load_rates
        from gpufleet.cost.usage import store_usages
        from gpufleet.serve.timeline import cost_timeline

        if period not in PERIODS:
            raise HTTPException(422, f"period={period!r}: use one of {', '.join(PERIODS)}")
        seconds = PERIODS[period]

        def build() -> dict[str, Any]:
            store = _store(home)
            usages = [] if store is None else store_usages(store, team=team)
            since = None if seconds is None else time.time() - seconds
            return {**cost_timeline(usages, load_rates(), bucket, since), "period": period}

        return cache.get(("timeline", team, period, bucket), build) if known_team(team) else build()

    @app.get("/api/sweeps", tags=["sweeps"], summary="Every sweep of this home: trials, best, GPU-hours, money")
    def api_sweeps() -> dict[str, Any]:
        from gpufleet.serve.sweep_view import sweeps_view

        return cache.get(("sweeps",), lambda: sweeps_view(home))

    @app.get("/api/sweeps/{name}", tags=["sweeps"], summary="gpufleet sweep show NAME --json")
    def api_sweep(name: SweepName) -> dict[str, Any]:
        from gpufleet.serve.sweep_view import sweep_view

        return sweep_view(home, name)

    @app.get("/metrics", tags=["metrics"], summary="Goodput GPU-seconds and money per job and bucket (Prometheus)")
    def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        from gpufleet.serve.goodput import metrics_text

        body = cache.get(("metrics",), lambda: metrics_text(_store(home)))
        return Response(body, media_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})

    @app.get("/api/quality", tags=["quality"], summary="Registry aliases and history, decisions, the monitor")
    def api_quality() -> dict[str, Any]:
        return quality_view(home)

    @app.post("/api/registry/{model}/promote", tags=["actions"], summary="gpufleet registry promote (token)")
    def api_promote(
        model: str, version: str = Body(...), reason: str = Body(...), home_name: str = Body("")
    ) -> dict[str, Any]:
        if not reason.strip():
            raise HTTPException(422, "give a reason: it is recorded in the alias history")
        with _registry(quality_home(home, home_name), model) as registry:
            events = registry.promote(model, version, why=reason.strip())
        return {"model": model, "events": [e.to_dict() for e in events]}

    @app.post("/api/registry/{model}/rollback", tags=["actions"], summary="gpufleet registry rollback (token)")
    def api_rollback(
        model: str, reason: str = Body(..., embed=True), home_name: str = Body("", embed=True)
    ) -> dict[str, Any]:
        if not reason.strip():
            raise HTTPException(422, "give a reason: it is recorded in the alias history")
        with _registry(quality_home(home, home_name), model) as registry:
            events = registry.rollback(model, why=reason.strip())
        return {"model": model, "events": [e.to_dict() for e in events]}

    # ---- the webhook ----------------------------------------------------------------------------

    @app.post("/hooks/alerts", tags=["webhook"], summary="A signed alert (HMAC, replay window, idempotency)")
    async def hooks_alerts(request: Request) -> JSONResponse:
        from gpufleet.quality.webhook import LENGTH_DIGITS, ascii_int

        if receiver is None:
            return JSONResponse({"status": 503, "reason": "no webhook secret configured"}, status_code=503)
        length = ascii_int(request.headers.get("content-length", "").strip(), LENGTH_DIGITS)
        if length is None:
            return JSONResponse({"status": 411, "reason": "a Content-Length is required"}, status_code=411)
        if length > receiver.max_body:
            reply = receiver.respond(413, f"body of {length} bytes exceeds {receiver.max_body}")
            return JSONResponse(reply.body, status_code=reply.status)
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > receiver.max_body:
                break
        reply = await run_in_threadpool(receiver.handle, dict(request.headers.items()), body)
        return JSONResponse(reply.body, status_code=reply.status)

    return app


def _problem(error: Any) -> dict[str, Any]:
    """One validation error as FastAPI words it, without echoing the input (a NaN there is no JSON)."""
    return {"type": str(error.get("type")), "loc": [str(x) for x in error.get("loc", ())], "msg": str(error.get("msg"))}


def _span(span: Any) -> dict[str, Any]:
    from dataclasses import asdict

    out: dict[str, Any] = asdict(span)
    return out


@contextmanager
def _registry(path: Path, model: str) -> Iterator[Any]:
    """The registry of ``path`` to act on ``model``: 422 for a name no model may have; 404 where there is no
    registry (a refused action creates no store); 503 at once when its tracking server does not answer
    (:func:`gpufleet.quality.registry.mlflow_errors`, as the CLI's registry commands do)."""
    from gpufleet.quality.registry import Registry, check_model_name, mlflow_errors, sqlite_path, tracking_uri

    try:
        check_model_name(model)
    except UsageError as err:
        raise HTTPException(422, str(err)) from None
    uri = tracking_uri(path)
    db = sqlite_path(uri)
    if db is not None and not db.exists():
        raise NotFound(f"model {model!r} is not registered: that home has no registry")
    with mlflow_errors(uri):
        yield Registry(path)


def _backend_of(home: Path, job_id: int) -> Any:
    from gpufleet.backends import get_backend

    return get_backend(_job_store(home, job_id).job(job_id).backend, home)


def _receiver(cfg: ServeConfig) -> Any:
    """The alert receiver; its handler submits the monitor's retrain job for the model, once per key."""
    if cfg.webhook_secret is None:
        return None
    from gpufleet.quality.webhook import KEY_TTL_S, AlertPayload, AlertReceiver

    home = cfg.home

    def handler(alert: AlertPayload, key: str) -> dict[str, Any]:
        if alert.action != "retrain":
            return {"acted": False}
        if cfg.monitor is None:
            raise UsageError(f"no retraining is configured for model {alert.model!r}: start with --monitor FILE")
        from gpufleet.quality.standing import load_monitor_config, retrain_once

        config = load_monitor_config(cfg.monitor)
        model = next((m for m in config.models if m.name == alert.model), None)
        if model is None or model.retrain is None:
            raise UsageError(f"no retraining is configured for model {alert.model!r} in {cfg.monitor.name}")
        job_id, submitted = retrain_once(home, model.name, key, model.retrain, backend=model.backend)
        return {"acted": True, "job_id": job_id, "submitted": submitted}

    journal = home / "quality" / "webhook-keys.jsonl"
    return AlertReceiver(cfg.webhook_secret, handler, journal=journal, key_ttl_s=KEY_TTL_S)


def _warm_up(home: Path, done: threading.Event) -> None:
    """Bring the cost cache up to date and build each heavy view once, as the server starts; then set ``done``.

    The first ``GET /api/cost`` would otherwise price every job the cost cache lacks (all of them on a
    first start: seconds at 200 jobs, minutes at 100,000) while every viewer that asked waits, and the
    first of each view pays for the imports and first reads of its code. The views built here are not
    kept (the cache holds what was asked for); the cost cache (``cache/cost.db``) is. Requests for the
    cost wait for ``done`` (set once every view was built once) rather than price the same jobs a second
    time. The cost's whole JSON is not built here: at 100,000 jobs that is seconds of CPU taken from the
    first requests, for a view that may never be asked for.
    """
    from gpufleet.cost.gather import cost_summary
    from gpufleet.views import jobs_view

    try:
        store = _store(home) if has_store(home) else None
        if store is not None:
            cost_summary(store, limit=0)
            fleet_view(home, _store(home))
            jobs_view(_store(home))
    except Exception as err:  # noqa: BLE001 - a request meets the same problem and answers it
        log.debug("warming up failed: %s", err)
    finally:
        done.set()
        forget_thread_stores()


def _sync_loop(home: Path, stop: threading.Event, every_s: float = 5.0) -> None:
    """Refresh remote schedulers' jobs into the store while the server runs; one line per new problem."""
    from gpufleet.backends import sync_remote

    said = ""
    while not stop.wait(every_s):
        if not has_store(home):
            continue
        store = Store(state_db(home))  # its own, closed after each pass: the routes' are theirs
        try:
            sync_remote(home, store)
            said = ""
        except GpufleetError as err:
            if str(err) != said:
                log.warning("states may be stale: %s", err)
                said = str(err)
        finally:
            store.close()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpufleet")
    except PackageNotFoundError:
        return "0"


def openapi_document(cfg: ServeConfig | None = None) -> dict[str, Any]:
    """The OpenAPI document of the API (what ``GET /api/openapi.json`` serves)."""
    app = create_app(cfg or ServeConfig(home=Path("."), token=None, sync_remote=False))
    return app.openapi()


__all__ = [
    "PERIODS",
    "ServeConfig",
    "ViewCache",
    "create_app",
    "fleet_view",
    "openapi_document",
    "quality_view",
    "series_view",
]
