"""Job metrics for Prometheus, fed by the runtime's events.

The exporter listens to the session's event log, so metrics and the event history can never
disagree. Exposed (prometheus-client), per attempt::

    gpufleet_job_step                       gauge    optimizer steps completed
    gpufleet_job_loss                       gauge    last reported training loss
    gpufleet_job_tokens_per_second          gauge
    gpufleet_job_mfu                        gauge    when FLOPs per token and the GPU peak are known
    gpufleet_job_restarts                   gauge    attempts before this one
    gpufleet_checkpoint_save_seconds        histogram
    gpufleet_checkpoint_bytes               gauge    size of the last checkpoint
    gpufleet_job_restores_total             counter
    gpufleet_job_preemptions_total          counter  SIGTERM/SIGUSR1 seen at a step boundary
    gpufleet_job_rollbacks_total            counter
    gpufleet_job_gpus                       gauge    GPUs the attempt holds
    gpufleet_job_gpu_seconds_total          counter  GPUs x seconds since the attempt started
    gpufleet_job_cost_total                 counter  the same, priced with the rate card (label currency)
    gpufleet_rank_step_seconds              gauge    per rank (label rank): a distributed job's mean step
                                                     time outside the step agreement, since the last step event
    gpufleet_rank_wait_seconds              gauge    per rank: mean time it waited in the step agreement for
                                                     the others (the rank that never waits holds them up)
    gpufleet_rank_phase_seconds             gauge    per rank, host and phase (data_wait, compute, collective,
                                                     optimizer, checkpoint, straggler_wait): its mean seconds a
                                                     step in that phase since the last step event

Labels: ``job_id``, ``job_name``, ``team``, ``attempt``, ``backend``, ``backend_job_id``,
``gpu_type``, ``provider``. (Not ``job``: Prometheus sets that label itself on every scrape and
would rename ours ``exported_job``.)

Features add their own families (``gpufleet_rl_*``, ``gpufleet_data_*``), declared with their event kinds
(:mod:`gpufleet.jobs.features`); each is exported from the attempt's first event that feeds it.

Two modes: ``GPUFLEET_METRICS_PORT`` serves ``/metrics`` on 127.0.0.1 (``0`` picks a free port,
written to ``<job dir>/metrics.port``); ``GPUFLEET_METRICS_TEXTFILE`` rewrites a file for the
node exporter's textfile collector (batch nodes without an open port). With
``GPUFLEET_PROMETHEUS_TARGETS`` naming a Prometheus ``file_sd`` directory, a served attempt
registers itself there and removes its file when its session ends.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.jobs import features
from gpufleet.jobs.events import EventKind

if TYPE_CHECKING:
    from gpufleet.telemetry.dcgm import ScrapeResult
    from gpufleet.telemetry.exporter import ExpositionServer
    from gpufleet.telemetry.gpu import GpuSampler

LABELS = ("job_id", "job_name", "team", "attempt", "backend", "backend_job_id", "gpu_type", "provider")


class JobMetrics:
    """A private registry of one attempt's metrics, updated from runtime events.

    ``gpus`` and ``price_per_gpu_hour`` (from the rate card) add the attempt's GPU time and money,
    computed at scrape time, so PromQL can sum GPU-hours and cost per team.
    """

    def __init__(
        self,
        labels: Mapping[str, str],
        *,
        gpus: int = 0,
        price_per_gpu_hour: float | None = None,
        currency: str = "USD",
        started: float | None = None,
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.labels = {name: str(labels.get(name, "")) for name in LABELS}
        self.gpus, self.price, self.currency = gpus, price_per_gpu_hour, currency
        self.started = time.time() if started is None else started
        self.server: ExpositionServer | None = None
        self.registry = CollectorRegistry()
        names = list(LABELS)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, names, registry=self.registry).labels(**self.labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, names, registry=self.registry).labels(**self.labels)

        self.step = gauge("gpufleet_job_step", "Optimizer steps completed.")
        self.loss = gauge("gpufleet_job_loss", "Last reported training loss.")
        self.tokens = gauge("gpufleet_job_tokens_per_second", "Training throughput in tokens per second.")
        self.mfu = gauge("gpufleet_job_mfu", "Model FLOPs utilization (PaLM appendix B), 0..1.")
        self.restarts = gauge("gpufleet_job_restarts", "Attempts of this job before the current one.")
        self.ckpt_bytes = gauge("gpufleet_checkpoint_bytes", "Size of the last checkpoint in bytes.")
        self.ckpt_seconds = Histogram(
            "gpufleet_checkpoint_save_seconds",
            "Checkpoint save time.",
            names,
            registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        ).labels(**self.labels)
        self.restores = counter("gpufleet_job_restores", "Checkpoints restored (start or rollback).")
        self.preemptions = counter("gpufleet_job_preemptions", "Preemption signals handled at a step boundary.")
        self.rollbacks = counter("gpufleet_job_rollbacks", "Rollbacks to the last healthy checkpoint.")
        self.rank_step = Gauge(
            "gpufleet_rank_step_seconds",
            "Mean step seconds of each rank outside the step agreement (distributed jobs).",
            [*names, "rank"],
            registry=self.registry,
        )
        self.rank_wait = Gauge(
            "gpufleet_rank_wait_seconds",
            "Mean seconds each rank waited in the step agreement for the other ranks (distributed jobs).",
            [*names, "rank"],
            registry=self.registry,
        )
        self.rank_phase = Gauge(
            "gpufleet_rank_phase_seconds",
            "Mean seconds a step each rank spent in each phase (data_wait, compute, collective, optimizer, "
            "checkpoint; straggler_wait: the part of collective spent waiting for slower ranks).",
            [*names, "rank", "host", "phase"],
            registry=self.registry,
        )
        self._hosts: list[str] = []
        """Each rank's host, from the attempt's ``group`` event."""
        self.families: dict[str, Any] = {}
        """The features' metric families (:mod:`gpufleet.jobs.features`), each made at its first event: a job
        that logs no ``rl`` event exports no RL gauge."""
        self.restarts.set(max(0, int(self.labels["attempt"] or 1) - 1))
        if gpus > 0:
            self.registry.register(_GpuTimeCollector(self))

    def __call__(self, event: Mapping[str, Any]) -> None:
        """Update from one runtime event (an ``EventLog`` listener)."""
        kind = event.get("kind")
        if kind == EventKind.STEP:
            self.step.set(float(event.get("step", 0)))
            loss = event.get("loss")
            if isinstance(loss, (int, float)):
                self.loss.set(float(loss))
            self.tokens.set(float(event.get("tokens_per_s", 0.0)))
            if isinstance(event.get("mfu"), (int, float)):
                self.mfu.set(float(event["mfu"]))
            for gauge, key in ((self.rank_step, "rank_step_s"), (self.rank_wait, "rank_wait_s")):
                values = event.get(key)
                if isinstance(values, list):
                    for rank, value in enumerate(values):
                        if isinstance(value, (int, float)) and not isinstance(value, bool):
                            gauge.labels(**self.labels, rank=str(rank)).set(float(value))
            self._phases(event.get("rank_phase_s"))
        elif kind == EventKind.GROUP and isinstance(event.get("ranks"), list):
            self._hosts = [
                str(r.get("host", "?"))[:253] if isinstance(r, dict) else "?" for r in event["ranks"][:65536]
            ]
        elif kind == EventKind.CHECKPOINT:
            self.ckpt_seconds.observe(float(event.get("seconds", 0.0)))
            self.ckpt_bytes.set(float(event.get("bytes", 0)))
            self.step.set(float(event.get("step", 0)))
        elif kind == EventKind.RESTORE and event.get("step") is not None:
            self.restores.inc()
            self.step.set(float(event["step"]))
        elif kind == EventKind.PREEMPT_SIGNAL:
            self.preemptions.inc()
        elif kind == EventKind.ROLLBACK:
            self.rollbacks.inc()
        if isinstance(kind, str):
            self._record(kind, event)

    def _phases(self, phases: Any) -> None:
        """``rank_phase_s`` of a step event: ``{phase: [seconds of rank 0, rank 1, ...]}`` (malformed: skipped)."""
        if not isinstance(phases, dict):
            return
        for phase, values in phases.items():
            if not isinstance(phase, str) or not isinstance(values, list) or len(phase) > 32:
                continue
            for rank, value in enumerate(values[:65536]):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    host = self._hosts[rank] if rank < len(self._hosts) else ""
                    labels = {**self.labels, "rank": str(rank), "host": host, "phase": phase}
                    self.rank_phase.labels(**labels).set(float(value))

    def _record(self, kind: str, event: Mapping[str, Any]) -> None:
        """Update the metric families features derive from ``kind``'s payload (most kinds have none)."""
        families = features.metric_families(kind)
        if not families:
            return
        payload = features.read_payload(event)
        for family in families:
            metric = self.families.get(family.name)
            if metric is None:
                metric = self.families[family.name] = self._family(family)
            for extra, value in family.values(payload):
                if len(extra) != len(family.labels):
                    continue  # a sample that does not name each of the family's labels
                child = metric.labels(**self.labels, **dict(zip(family.labels, extra, strict=True)))
                if family.type == "gauge":
                    child.set(value)
                elif value > 0:
                    child.inc(value)

    def _family(self, family: features.MetricFamily) -> Any:
        from prometheus_client import Counter, Gauge

        made = Gauge if family.type == "gauge" else Counter
        return made(family.name, family.help, [*LABELS, *family.labels], registry=self.registry)

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _GpuTimeCollector:
    """GPUs held, GPU-seconds and money so far, evaluated when Prometheus scrapes."""

    def __init__(self, metrics: JobMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m, names = self.m, list(LABELS)
        values = [m.labels[n] for n in LABELS]
        gpu_seconds = m.gpus * max(0.0, time.time() - m.started)
        held = GaugeMetricFamily("gpufleet_job_gpus", "GPUs held by the attempt.", labels=names)
        held.add_metric(values, m.gpus)
        yield held
        used = CounterMetricFamily("gpufleet_job_gpu_seconds", "GPU-seconds since the attempt started.", labels=names)
        used.add_metric(values, gpu_seconds)
        yield used
        if m.price is not None:
            cost = CounterMetricFamily(
                "gpufleet_job_cost",
                "Money since the attempt started, at the rate card's price.",
                labels=[*names, "currency"],
            )
            cost.add_metric([*values, m.currency], gpu_seconds / 3600.0 * m.price)
            yield cost


_REWRITE_AFTER = frozenset(
    {
        EventKind.STEP,
        EventKind.CHECKPOINT,
        EventKind.RESTORE,
        EventKind.PREEMPT_SIGNAL,
        EventKind.ROLLBACK,
        EventKind.SESSION_END,
    }
)
"""The core's kinds that change a metric; a feature's kinds that feed a metric family do too."""


class TextfileWriter:
    """Rewrites a textfile-collector file atomically after each event that changes a metric."""

    def __init__(self, metrics: JobMetrics, path: Path) -> None:
        self.metrics = metrics
        self.path = path

    def __call__(self, event: Mapping[str, Any]) -> None:
        kind = str(event.get("kind"))
        if kind in _REWRITE_AFTER or features.metric_families(kind):
            from prometheus_client import write_to_textfile

            write_to_textfile(str(self.path), self.metrics.registry)


def serve(metrics: JobMetrics, port: int, port_file: Path | None = None, gpu: GpuSampler | None = None) -> int:
    """Serve ``/metrics`` on 127.0.0.1 in a daemon thread; return the bound port.

    With a GPU sampler, the page also carries the latest round of the job's GPU series under
    dcgm-exporter's names and labels, so one scrape target gives both. The sampler's thread renders each
    round as it reads it, so a scrape only joins the bytes (the page is as old as the round).
    """
    from gpufleet.telemetry.exporter import DcgmRenderer, ExpositionServer

    renderer = DcgmRenderer()

    def render_ahead(result: ScrapeResult) -> None:
        renderer.render(result.samples)  # kept by the renderer: the scrape's render of this round returns it

    if gpu is not None and gpu.on_round is None:  # each round rendered as it is read: a scrape sends those bytes
        gpu.on_round = render_ahead

    def render() -> bytes:
        page = metrics.exposition()
        latest = gpu.latest() if gpu is not None else None
        if latest is not None and latest.samples:
            page += renderer.render(latest.samples)
        return page

    metrics.server = ExpositionServer(render, port=port)
    bound = metrics.server.start()
    if port_file is not None:
        port_file.write_text(str(bound), encoding="utf-8")
    return bound


class TargetRegistration:
    """A ``file_sd`` entry for one attempt's endpoint, removed when the session ends."""

    def __init__(self, directory: Path, port: int, labels: Mapping[str, str]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"gpufleet-job-{labels['job_id'] or 'adhoc'}-{labels['attempt']}-{os.getpid()}.json"
        entry = [{"targets": [f"127.0.0.1:{port}"], "labels": {k: v for k, v in labels.items() if v}}]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry), encoding="utf-8")
        tmp.rename(self.path)  # Prometheus never reads a half-written file

    def __call__(self, event: Mapping[str, Any]) -> None:
        if event.get("kind") == EventKind.SESSION_END:
            self.path.unlink(missing_ok=True)


def exporter_from_env(
    env: Mapping[str, str],
    labels: Mapping[str, str],
    gpu: GpuSampler | None = None,
    *,
    gpus: int = 0,
    price: Callable[[], tuple[float | None, str]] | None = None,
) -> list[Any]:
    """The listeners the environment asks for (none unless a metrics variable is set).

    ``price`` gives the price of one of the job's GPUs per hour and its currency (from the rate
    card; asked only when metrics are wanted and the job has GPUs).
    """
    port, textfile = env.get("GPUFLEET_METRICS_PORT"), env.get("GPUFLEET_METRICS_TEXTFILE")
    if port is None and textfile is None:
        return []
    per_hour, currency = price() if price is not None and gpus > 0 else (None, "USD")
    metrics = JobMetrics(labels, gpus=gpus, price_per_gpu_hour=per_hour, currency=currency)
    staged = _staged_report(env)
    if staged is not None:  # staged by gpufleet.data.stage_in before this process started
        metrics({**staged, "kind": EventKind.DATA_STAGED})
    listeners: list[Any] = [metrics]
    if port is not None:
        job_dir = env.get("GPUFLEET_JOB_DIR")
        bound = serve(metrics, int(port), Path(job_dir) / "metrics.port" if job_dir else None, gpu=gpu)
        if env.get("GPUFLEET_PROMETHEUS_TARGETS"):
            listeners.append(TargetRegistration(Path(env["GPUFLEET_PROMETHEUS_TARGETS"]), bound, metrics.labels))
    if textfile is not None:
        listeners.append(TextfileWriter(metrics, Path(textfile)))
    return listeners


def _staged_report(env: Mapping[str, str]) -> dict[str, Any] | None:
    """This attempt's staging report (``$GPUFLEET_DATA_DIR/.gpufleet/staged-attempt-N.json``), if any."""
    root = env.get("GPUFLEET_DATA_DIR")
    if not root:
        return None
    path = Path(root) / ".gpufleet" / f"staged-attempt-{env.get('GPUFLEET_ATTEMPT') or '1'}.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def labels_from_env(env: Mapping[str, str] = os.environ, gpu_type: str = "", provider: str = "") -> dict[str, str]:
    return {
        "job_id": env.get("GPUFLEET_JOB_ID", ""),
        "job_name": env.get("GPUFLEET_JOB_NAME", ""),
        "team": env.get("GPUFLEET_TEAM", ""),
        "attempt": env.get("GPUFLEET_ATTEMPT", "1"),
        "backend": env.get("GPUFLEET_BACKEND", ""),
        "backend_job_id": env.get("GPUFLEET_BACKEND_JOB_ID") or env.get("SLURM_JOB_ID", ""),
        "gpu_type": gpu_type,
        "provider": provider,
    }


__all__ = [
    "LABELS",
    "JobMetrics",
    "TargetRegistration",
    "TextfileWriter",
    "exporter_from_env",
    "labels_from_env",
    "serve",
]
