"""TrainSession: the part of gpufleet that lives inside a training process.

::

    with TrainSession.from_env(model=model, optimizer=opt, scheduler=sched, total_steps=1000) as s:
        for step in s.steps():                       # restores the last healthy checkpoint first
            x, y = batch(s.data_position)            # the data cursor is checkpointed too
            loss = train_step(x, y)
            s.report(loss, tokens=x.numel())         # health, checkpoints, preemption, metrics

``report`` is the step boundary. There the session judges the loss (NaN, inf, spike), rolls back
to the last healthy checkpoint and skips the offending batches when it is bad, saves a checkpoint
when the policy says so, and, when SIGTERM or SIGUSR1 arrived during the step, saves and exits
with ``REQUEUE_EXIT_CODE`` so the scheduler puts the job back in the queue.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gpufleet.cost.rates import load_rates
from gpufleet.errors import CheckpointError, CheckpointSpaceError, GpufleetError, HealthError, SpecError
from gpufleet.estimate.mfu import utilization
from gpufleet.estimate.peak import gpu_peak
from gpufleet.jobs.events import EventKind, EventLog, append_event
from gpufleet.jobs.protocol import ENV_STRATEGY, REQUEUE_EXIT_CODE
from gpufleet.runtime.checkpoint import (
    CheckpointDir,
    CheckpointInfo,
    CheckpointManifest,
    Expectation,
    model_fingerprint,
    state_dict_mismatch,
)
from gpufleet.runtime.dist_state import apply_dcp_state, dcp_state, dcp_template, reseeded_rng, strategy_of
from gpufleet.runtime.group import (
    Group,
    PeerLost,
    current_group,
    dist_timeout,
    import_world_defaults,
    is_peer_loss,
    mark_lost,
    mark_session_end,
)
from gpufleet.runtime.health import HealthMonitor, first_nonfinite, loss_values, step_loss
from gpufleet.runtime.interval import AutoInterval, PreemptionRate, rate_from
from gpufleet.runtime.state import RunShape, capture_rng, hyperparameter_changes, is_plain, restore_rng, run_change
from gpufleet.runtime.watchdog import RankInfo, RankWatch, stall_seconds
from gpufleet.spec import CheckpointPolicy, HealthPolicy, Telemetry, parse_spec
from gpufleet.telemetry.metrics import exporter_from_env, labels_from_env

if TYPE_CHECKING:
    from gpufleet.telemetry.gpu import GpuSampler

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

if os.environ.get("WORLD_SIZE", "1") not in ("", "0", "1"):
    # A rank of a group: before the script initialises the world group itself (runtime.group).
    import_world_defaults()


@dataclass(frozen=True, slots=True)
class _Step:
    """A step reported by a rank of a group and not yet agreed on."""

    values: list[float]
    tokens: int
    batches: int
    metrics: dict[str, float]
    seconds: float


@dataclass(frozen=True, slots=True)
class _Write:
    """A checkpoint being written in the background (``checkpoint.async``)."""

    step: int
    reason: str
    healthy: bool
    nonfinite: str | None
    stall_seconds: float
    """How long the training loop stood still for it (the in-memory copy)."""
    future: Future[CheckpointManifest]


def staged(value: Any) -> Any:
    """A copy of a state that training can no longer change: tensors cloned, containers rebuilt.

    What an asynchronous save writes while the loop goes on updating the weights and the
    optimizer in place (a DTensor clones its local shard and keeps its placement).
    """
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, io.BytesIO):
        return io.BytesIO(value.getvalue())
    if isinstance(value, dict):
        return {key: staged(item) for key, item in value.items()}
    if isinstance(value, list):
        return [staged(item) for item in value]
    if isinstance(value, tuple):
        return tuple(staged(item) for item in value)
    return copy.deepcopy(value)


def _job_peak_flops(gpu_type: str, gpus: int) -> float | None:
    """Dense BF16 peak of the job's GPUs from the datasheet table, or ``None`` (CPU, unknown GPU)."""
    try:
        return gpu_peak(gpu_type).peak_flops("bf16") * gpus if gpus > 0 else None
    except GpufleetError:
        return None


def gpu_sampler_from_env(env: Mapping[str, str], telemetry: Telemetry, gpus: int, attempt: int) -> GpuSampler | None:
    """The GPU sampler the job asks for (``telemetry.gpu_source``, or ``GPUFLEET_GPU_SOURCE`` when set).

    Under gpufleet every round is recorded to ``jobs/<id>/gpu/attempt-<n>.jsonl``, which
    ``gpufleet diagnose JOB`` and the fleet report read back.
    """
    choice = env.get("GPUFLEET_GPU_SOURCE") or telemetry.gpu_source
    if choice == "none":
        return None
    from gpufleet.telemetry.gpu import GpuRecorder, GpuSampler, gpu_log_path, open_source

    job_id = env.get("GPUFLEET_JOB_ID", "")
    seed = int(job_id) * 1000 + attempt if job_id.isdigit() else attempt
    source = open_source(choice, job_id=job_id, gpus=max(1, gpus), sample_seconds=telemetry.sample_seconds, seed=seed)
    if source is None:
        return None
    folder = env.get("GPUFLEET_JOB_DIR")
    recorder = GpuRecorder(gpu_log_path(Path(folder), attempt), source.description) if folder else None
    return GpuSampler(source, telemetry.sample_seconds, recorder=recorder)


class Stateful(Protocol):
    def state_dict(self) -> Any: ...
    def load_state_dict(self, state: Any, /) -> Any: ...


class Preempted(SystemExit):
    """Raised at a step boundary after the preemption checkpoint is durable."""

    def __init__(self, step: int) -> None:
        super().__init__(REQUEUE_EXIT_CODE)
        self.step = step


RESUME_MODES = ("auto", "never", "must")
RESERVED_NAMES = frozenset({"trainer"})


class TrainSession:
    """Restore-or-init, step loop, health, checkpoints and the preemption guard."""

    def __init__(
        self,
        *,
        ckpt_dir: str | Path,
        model: Stateful,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        extra: Mapping[str, Any] | None = None,
        total_steps: int | None = None,
        policy: CheckpointPolicy | None = None,
        health: HealthPolicy | None = None,
        events: EventLog | None = None,
        log_every_s: float = 1.0,
        handle_signals: bool = True,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        gpu_sampler: GpuSampler | None = None,
        resume: str = "auto",
        job: str | None = None,
        echo: bool = True,
        group: Group | None = None,
        agree_every: int = 4,
        preemption_rate: PreemptionRate | None = None,
    ) -> None:
        if resume not in RESUME_MODES:
            raise ValueError(f"resume={resume!r}: choose one of {', '.join(RESUME_MODES)}")
        self.gpu_sampler = gpu_sampler
        """Samples the job's GPUs in a thread while the session is open (see ``gpu_sampler_from_env``)."""
        self.group = group if group is not None else current_group()
        """The ranks of this attempt (a group of one for a single process): they take every decision together."""
        self.policy = policy or CheckpointPolicy()
        self.auto_interval = (
            AutoInterval(preemption_rate or rate_from({}, self.policy)) if self.policy.every == "auto" else None
        )
        """``checkpoint: {every: auto}``: the interval re-estimated from this run's saves (``runtime.interval``);
        ``preemption_rate`` overrides ``checkpoint.preemptions_per_hour`` (``from_env``: the backend's)."""
        best = self.policy.keep_best
        self.ckpts = CheckpointDir(
            Path(ckpt_dir), keep=self.policy.keep, keep_best=(best.metric, best.mode) if best else None
        )
        self.health_policy = health or HealthPolicy()
        # One job, one event log: rank 0 writes it; the other ranks keep their newest events in memory,
        # a bounded few (a rank that trains for weeks must not hoard its step events).
        self.events = (
            events
            if events is not None and self.group.is_main
            else EventLog(None, attempt=_attempt(events), keep_last=None if self.group.is_main else 100)
        )
        self.total_steps = total_steps
        self.log_every_s = log_every_s
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        """Dense peak FLOP/s of all the job's GPUs; with ``flops_per_token``, step events carry MFU."""
        self.resume = resume
        """``auto``, ``never`` or ``must`` (see ``JobSpec.resume``)."""
        self.job = job
        """This run's identity (the job id under gpufleet); a checkpoint of another job is refused."""
        self.echo = echo and self.group.is_main
        """Print restores, rollbacks and refusals to stdout as well as to the event log."""
        self._objects: dict[str, Stateful] = {"model": model}
        if optimizer is not None:
            self._objects["optimizer"] = optimizer
        if scheduler is not None:
            self._objects["scheduler"] = scheduler
        self.values: dict[str, Any] = {}
        """Plain values saved with every checkpoint and restored with it (``extra`` entries without
        ``state_dict``): read and assign them here, e.g. ``s.values["best_val_loss"] = v``."""
        for name, obj in (extra or {}).items():
            if name in self._objects or name in RESERVED_NAMES:
                raise ValueError(f"extra state name {name!r} is reserved")
            if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
                self._objects[name] = obj
            elif is_plain(obj):
                self.values[name] = obj
            else:
                raise ValueError(
                    f"extra[{name!r}] is a {type(obj).__name__}: give an object with state_dict/load_state_dict, "
                    "or a plain value (number, string, tensor, or lists and dicts of them)"
                )
        self._model = model
        self._handle_signals = handle_signals
        self._previous_handlers: dict[int, Any] = {}
        self._preempt_signal: int | None = None
        self.step = 0
        """Optimizer steps completed."""
        self.data_position = 0
        """Index of the next batch in the data stream; advances by ``batches`` a step, jumps on rollback."""
        self.global_batch: int | None = None
        """Examples a step reads over all ranks, when the script says (``note_data``): saved with each checkpoint."""
        self.epoch_batches: int | None = None
        """Data positions per epoch, when the script says (``note_data``)."""
        self._saved_run: RunShape | None = None
        """What a step and the run meant in the checkpoint restored at start (``None``: fresh, or not recorded)."""
        self._run_checked = False
        self.monitor = HealthMonitor(self.health_policy)
        self.rollbacks = 0
        self.last_loss: float | None = None
        self.inject_preempt_at: int | None = None
        """Debugging: behave as if SIGTERM arrived when this attempt's training reaches this step."""
        self.inject_rollback_at: int | None = None
        """Debugging: once, after this step, roll back to the previous checkpoint and replay (no skip)."""
        self._injected_rollback = False
        self._logged: dict[str, int] = {}
        """Kind -> the last step it was logged at; saved, so a resume right after an evaluation skips it."""
        self._after_log: dict[int, dict[str, Any]] = {}
        """Step -> plain values, log marks, RNG and best metric just after a ``log`` at a step that has a
        checkpoint: a rollback to that checkpoint resumes after the evaluation instead of repeating it."""
        self._best: float | None = None
        self._metric: tuple[int, float] | None = None
        self._fingerprint: str | None = None
        self._last_saved_step: int | None = None
        self._last_save_time = time.monotonic()
        self._unhealthy_since_save = False
        self._step_started = time.monotonic()
        self._step_seconds: dict[int, float] = {}
        self._last_log = 0.0
        self._window_tokens = 0
        self._window_start = time.monotonic()
        self._entered = False
        self._agreed_preempt = False
        """Distributed: a preemption was requested on some rank at the last step boundary."""
        self._agreed_seconds_due = False
        """Distributed: a time-based checkpoint was due on some rank at the last step boundary."""
        self.agree_every = agree_every
        """Distributed: steps per agreement of the ranks (``distributed.agree_every``), and at every
        step a checkpoint is due: a NaN or a SIGTERM on one rank is acted on up to this many steps
        minus one later; one agreement a step costs a few % of a step (the ranks wait for the
        slowest), every 4 steps under 2 % (``bench/dist_step_overhead.py``)."""
        self._pending: list[_Step] = []
        """Distributed: the steps reported since the last agreement, judged at the next one."""
        self._save_owed = False
        self._inject_owed = False
        self._writer: ThreadPoolExecutor | None = None
        """``checkpoint.async``: the thread that writes periodic checkpoints while training goes on."""
        self._write_group: Group | None = None
        """Distributed ``checkpoint.async``: the ranks' process group for the background writes."""
        self._in_flight: _Write | None = None
        self._watch: RankWatch | None = None
        """Distributed: the thread that names a rank that stops stepping (``runtime.watchdog``)."""
        self._agreed_at = time.monotonic()
        """Distributed: when this rank left the last step agreement."""
        self._last_wait = 0.0
        """Distributed: seconds this rank waited in the last step agreement for the others."""
        self._rank_window: list[list[float]] = []
        """Rank 0: per rank, the sums of its step seconds and agreement waits, and the steps, since the
        last step event (``rank_step_s``, ``rank_wait_s``)."""

    # ---- construction from the backend's environment ---------------------------------------
    @classmethod
    def from_env(
        cls,
        *,
        model: Stateful,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        extra: Mapping[str, Any] | None = None,
        total_steps: int | None = None,
        ckpt_dir: str | Path = "checkpoints",
        flops_per_token: float | None = None,
        resume: str | None = None,
    ) -> TrainSession:
        """Build a session from what the backend exported (``GPUFLEET_*``), or local defaults.

        Under gpufleet, checkpoints go to ``$GPUFLEET_CKPT_DIR``, policies come from the job's
        spec and events to the job's event log; run by hand, checkpoints go to ``ckpt_dir``.
        ``resume`` overrides the spec's (``GPUFLEET_RESUME`` overrides both).
        """
        env = os.environ
        policy, health, peak, gpu_type, provider = CheckpointPolicy(), HealthPolicy(), None, "", ""
        telemetry, gpus, spot, spec_resume, agree_every = Telemetry(), 1, False, "auto", 4
        if env.get("GPUFLEET_SPEC"):
            spec_path = Path(env["GPUFLEET_SPEC"])
            spec = parse_spec(json.loads(spec_path.read_text(encoding="utf-8")), source=str(spec_path))
            policy, health = spec.checkpoint, spec.health
            peak = _job_peak_flops(spec.resources.gpu_type, spec.total_gpus)  # MFU counts every rank
            gpu_type, provider = spec.resources.gpu_type, spec.provider
            telemetry, gpus, spot, spec_resume = spec.telemetry, spec.total_gpus, spec.spot, spec.resume
            agree_every = spec.distributed.agree_every if spec.distributed is not None else 1
        rate = rate_from(env, policy) if policy.every == "auto" else None  # a bad one is refused before files open
        group = current_group()
        events_path = env.get("GPUFLEET_EVENTS") if group.is_main else None
        # Under a plain sbatch script (not submitted by gpufleet), Slurm numbers the runs.
        attempt = int(env.get("GPUFLEET_ATTEMPT") or int(env.get("SLURM_RESTART_COUNT") or 0) + 1)
        events = EventLog(Path(events_path) if events_path else None, attempt=attempt)
        labels = {**labels_from_env(env, gpu_type, provider), "attempt": str(attempt)}
        sampler = gpu_sampler_from_env(env, telemetry, gpus, attempt) if group.is_main else None
        if group.is_main:

            def price() -> tuple[float | None, str]:
                card = load_rates(env.get("GPUFLEET_RATES") or None)
                return card.price(labels.get("gpu_type", ""), labels.get("provider", ""), spot=spot), card.currency

            events.listeners.extend(exporter_from_env(env, labels, gpu=sampler, gpus=gpus, price=price))
        session = cls(
            ckpt_dir=env.get("GPUFLEET_CKPT_DIR", str(ckpt_dir)),
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            extra=extra,
            total_steps=total_steps,
            policy=policy,
            health=health,
            events=events,
            log_every_s=float(env.get("GPUFLEET_LOG_EVERY_S", "1.0")),
            flops_per_token=flops_per_token,
            peak_flops=peak,
            gpu_sampler=sampler,
            resume=env.get("GPUFLEET_RESUME") or resume or spec_resume,
            job=env.get("GPUFLEET_JOB_ID") or None,
            group=group,
            agree_every=agree_every,
            preemption_rate=rate,
        )
        session.inject_preempt_at = _env_step(env, "GPUFLEET_DEBUG_PREEMPT_AT")
        session.inject_rollback_at = _env_step(env, "GPUFLEET_DEBUG_ROLLBACK_AT")
        return session

    # ---- context manager: restore on entry, handlers in, handlers out ----------------------
    def __enter__(self) -> TrainSession:
        self.events.emit(EventKind.SESSION_START, pid=os.getpid(), total_steps=self.total_steps, resume=self.resume)
        try:
            self._open()
        except BaseException as err:
            if self.gpu_sampler is not None:
                self.gpu_sampler.close()
            self._emit_end(err)
            self.events.close()
            self._restore_handlers()
            raise
        return self

    def _open(self) -> None:
        if self.group.is_main:
            self.ckpts.clean_temporaries()
        self.group.barrier()
        self._check_strategy()
        self._fingerprint = model_fingerprint(self._model.state_dict())
        self._check_resume_mode()
        if self.gpu_sampler is not None:
            self.gpu_sampler.start()
            self.events.emit(EventKind.GPU_SOURCE, source=self.gpu_sampler.source.description)
        info = self.restore()
        if info is None and self.resume == "must":
            raise CheckpointError(
                f"resume: must, but {self.ckpts.root} holds no restorable checkpoint; "
                "run with resume: auto to start from scratch"
            )
        if self.total_steps is not None and self.step >= self.total_steps:
            self._say(
                EventKind.NOTHING_TO_TRAIN,
                f"{self.ckpts.root} is already at step {self.step} of {self.total_steps}: nothing to train "
                "(resume: never, or remove the checkpoints, to start over)",
                step=self.step,
            )
        if self._handle_signals and threading.current_thread() is threading.main_thread():
            for sig in PREEMPT_SIGNALS:
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
        if self.group.distributed:
            self._start_watch()
        if self.policy.async_save:
            self._write_group = self.group.side_group()
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpufleet-ckpt-write")
        self._entered = True
        if self.auto_interval is not None:
            interval = self.auto_interval.event()
            self._say(EventKind.CHECKPOINT_INTERVAL, f"checkpoint every: auto: {interval['why']}", **interval)
        self._step_started = time.monotonic()
        self._window_start = time.monotonic()
        self._agreed_at = time.monotonic()
        self.events.emit(EventKind.TRAIN_START, step=self.step, data_position=self.data_position)

    def _start_watch(self) -> None:
        """Every rank: say where it runs (rank 0 records it), then watch for a rank that stops stepping."""
        here = RankInfo.here(self.group.rank)
        ranks = [RankInfo(*info) for info in self.group.gather((here.rank, here.host, here.pid))]
        self.events.emit(
            EventKind.GROUP,
            world_size=self.group.world_size,
            backend=self.group.backend,
            ranks=[{"rank": r.rank, "host": r.host, "pid": r.pid} for r in ranks],
        )
        base = os.environ.get("GPUFLEET_JOB_DIR")
        folder = (Path(base) if base else self.ckpts.root / ".ranks") / "ranks" / f"attempt-{self.events.attempt}"
        timeout = dist_timeout()
        self._watch = RankWatch(
            rank=self.group.rank,
            ranks=ranks,
            folder=folder,
            stall_s=stall_seconds(timeout),
            timeout_s=timeout,
            emit=self.events.emit if self.group.is_main else _job_event_writer(self.events.attempt),
        )
        self._watch.progress(self.step)
        self._watch.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # The preemption handlers stay until session_end is written: torchrun SIGTERMs the ranks
        # still alive as soon as one dies, and a rank that dies of it before writing its lost-rank
        # marker and session_end leaves an attempt that reads as failed instead of requeued.
        if self._watch is not None:
            self._watch.close()
        if self._writer is not None:
            if exc is not None:  # a write in flight ends (or fails) before the process does; its error is moot
                with contextlib.suppress(Exception):
                    self._finish_write()
            self._writer.shutdown(wait=True)
            self._writer = None
        if self.gpu_sampler is not None:
            self.gpu_sampler.close()
        try:
            if exc is None:
                self._finish()
                self.group.drain()  # no collective's tensors left to a gloo worker when the script tears down
        except BaseException as err:
            exc = err
            raise
        finally:
            try:
                self._emit_end(exc)
                self.events.close()
            finally:
                self._restore_handlers()

    def _restore_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()

    def _emit_end(self, exc: BaseException | None) -> None:
        """``session_end``: completed, requeue (preempted, or a rank of the group lost) or failed.

        A rank of a group also records its status for the launcher (``group.mark_session_end``):
        only rank 0 writes events, and an attempt whose every rank completed is completed even if
        its processes then fail to exit.
        """
        if exc is None:
            status = "completed"
            self.events.emit(EventKind.SESSION_END, status=status, step=self.step)
        elif isinstance(exc, Preempted):
            status = "requeue"
            self.events.emit(EventKind.SESSION_END, status=status, step=self.step)
        elif self.group.distributed and is_peer_loss(exc):
            status = "requeue"
            if not isinstance(exc, PeerLost):  # DDP's all-reduce in backward found it, not the session
                mark_lost(self.group.rank, str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "")
            self.events.emit(EventKind.SESSION_END, status=status, step=self.step, reason="rank_lost", error=str(exc))
        else:
            status = "failed"
            self.events.emit(EventKind.SESSION_END, status=status, step=self.step, error=f"{type(exc).__name__}: {exc}")
        if self.group.distributed:
            mark_session_end(self.group.rank, status)

    def _finish(self) -> None:
        """A session that ends normally ends on a healthy, saved state, or not ``completed`` at all."""
        if self._pending:  # the loop was left between two agreements: judge those steps first
            self._flush(time.monotonic())
        if self._preempting() and (self.total_steps is None or self.step < self.total_steps):
            self._preempt()  # the loop was left early because of SIGTERM: that is a preemption
        bad = self.nonfinite_state()
        if bad is not None or self._unhealthy_since_save:
            what = f"{bad} holds NaN or inf" if bad else "a step since the last checkpoint was unhealthy"
            self._say(
                EventKind.UNHEALTHY,
                f"the final state at step {self.step} is unhealthy: {what}",
                step=self.step,
                reason="nonfinite_state" if bad else "unhealthy_step",
                tensor=bad,
            )
            raise HealthError(
                f"training ended at step {self.step} on an unhealthy state ({what}); the job is not completed. "
                "Use health.action: rollback, or loop with `for _ in session.steps()` so it can roll back"
            )
        self._finish_write()
        if self._last_saved_step != self.step and self.step > 0:
            self._save("final", bad)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the save happens at the next step boundary, never inside a step.
        self._preempt_signal = signum

    def request_preemption(self, signum: int = signal.SIGTERM) -> None:
        """Ask for a save-and-requeue at the next step boundary (what SIGTERM does)."""
        self._preempt_signal = signum

    @property
    def preempt_requested(self) -> bool:
        """True once SIGTERM/SIGUSR1 arrived: a long evaluation should stop and reach ``report``.

        The save happens at the next ``report`` (or when the session ends); work inside a step
        that outlasts the grace period is killed with the process. Check this in any loop that
        can take long (evaluation, generation) and ``break``.
        """
        if self.group.distributed:  # what the ranks agreed at the last step boundary, the same on each
            return self._agreed_preempt
        return self._preempt_signal is not None

    def _preempting(self) -> bool:
        """Whether to stop for a preemption now (distributed: what every rank agreed, never one rank's view)."""
        return self._agreed_preempt if self.group.distributed else self._preempt_signal is not None

    def _say(self, kind: str, message: str, **data: Any) -> None:
        """An event that a person running the script should also see on stdout."""
        self.events.emit(kind, message=message, **data)
        if self.echo:
            print(f"gpufleet: {message}", flush=True)

    # ---- the loop -----------------------------------------------------------------------------
    def steps(self) -> Iterator[int]:
        """Yield the index of each step to run, from the restored step to ``total_steps``.

        At the end the whole state (weights and optimizer) is checked for NaN and inf; with
        ``health.action: rollback`` a bad final state is rolled back and the loop goes on.
        """
        if not self._entered:
            raise RuntimeError("use TrainSession as a context manager: `with session: for step in session.steps()`")
        if not self._run_checked:
            self._check_run()
        while True:
            while self.total_steps is None or self.step < self.total_steps:
                yield self.step
            bad = self.nonfinite_state() if self.health_policy.action == "rollback" else None
            if bad is None:
                return
            self._roll_back_bad_state(bad, "at the end")

    def note_data(self, *, global_batch: int, epoch_batches: int | None = None) -> None:
        """Say what a step reads: ``global_batch`` examples over all ranks, ``epoch_batches`` positions an epoch.

        Call it before the loop (``ResumableLoader.over`` does). Each checkpoint records it; a
        resume whose global batch differs from the checkpoint's (a per-rank batch on another world
        size) says so with both numbers and what the data position now stands for.
        """
        for name, value in (("global_batch", global_batch), ("epoch_batches", epoch_batches)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"note_data({name}={value!r}): give a whole number of at least 1")
        self.global_batch, self.epoch_batches = global_batch, epoch_batches

    def _run_shape(self) -> RunShape:
        return RunShape(self.group.world_size, self.global_batch, self.total_steps, self.epoch_batches)

    def _check_run(self) -> None:
        """Once, as the loop starts: a resumed run whose global batch or ``total_steps`` changed says so.

        Announced, not refused: ``gpufleet resize`` is a deliberate change, and a script with a
        per-rank batch cannot keep its global batch on every world size; what must not happen is
        that the run changes without anybody being told (``run_changed``, on stdout too).
        """
        self._run_checked = True
        if self._saved_run is None:
            return
        fields = run_change(self._saved_run, self._run_shape(), self.data_position)
        if fields is not None:
            message = str(fields.pop("message"))
            self._say(EventKind.RUN_CHANGED, message, step=self.step, **fields)

    def due(self, kind: str, every: int) -> bool:
        """True when ``step % every == 0`` and nothing of ``kind`` was logged at this step yet.

        ``if s.due("eval", every=250): ...; s.log("eval", val_loss=v)`` evaluates once per step:
        a rollback to a checkpoint whose step was already evaluated in this process comes back
        with what that evaluation left (``values``, RNG states) and does not evaluate it again;
        steps replayed after it hold other weights and are evaluated anew.
        """
        if every <= 0:
            raise ValueError(f"every={every} must be at least 1")
        return self.step % every == 0 and self._logged.get(kind) != self.step

    def report(
        self,
        loss: float | torch.Tensor | Sequence[float | torch.Tensor],
        *,
        tokens: int = 0,
        batches: int | None = None,
        **metrics: float,
    ) -> None:
        """Close the current step: judge its loss, then checkpoint, roll back or exit as needed.

        ``loss`` is the step's loss, or with gradient accumulation the list of every micro-batch's
        loss: each is judged, the event names the offending micro-batch, and a rollback skips up
        to it. ``batches`` is how many data positions the step consumed (default: one per loss).
        """
        if not self._run_checked:  # a loop of its own, without steps()
            self._check_run()
        values = loss_values(loss)
        batches = len(values) if batches is None else batches
        now = time.monotonic()
        if not self.group.distributed:
            self._close_step(values, tokens, batches, metrics, now - self._step_started, now, decide=True)
            return
        # A group closes its steps together, at each agreement (every ``agree_every`` steps, and the last).
        self._pending.append(_Step(values, tokens, batches, dict(metrics), now - self._step_started))
        self.step += 1  # provisional until the agreement judges it
        self.data_position += batches
        # The ranks also meet at every step a checkpoint or an injected fault is due, so those land
        # on the same steps as for one process; the count is the same on every rank.
        due = (
            (self.total_steps is not None and self.step >= self.total_steps)
            or (self.policy.every_steps is not None and self.step % self.policy.every_steps == 0)
            or self.step in (self.inject_preempt_at, self.inject_rollback_at)
        )
        if len(self._pending) < self.agree_every and not due:
            self._step_started = time.monotonic()
            if self._watch is not None:
                self._watch.progress(self.step)
            return
        self._flush(now)

    def _flush(self, now: float) -> None:
        """The ranks agree on the pending steps (the last one just reported), then judge and close each."""
        pending, self._pending = self._pending, []
        self.step -= len(pending)  # back to the first pending step: each is counted once judged
        self.data_position -= sum(p.batches for p in pending)
        agreed = self._agree(pending, now)
        # When each pending step ended (the last one now): its throughput is its own, not that of
        # steps closed a few microseconds apart.
        ends, at = [], now
        for step in reversed(pending):
            ends.append(at)
            at -= step.seconds
        ends.reverse()
        for i, (step, (mean, total), end) in enumerate(zip(pending, agreed, ends, strict=True)):
            if not self._close_step(mean, total, step.batches, step.metrics, step.seconds, end, i == len(pending) - 1):
                return  # rolled back: the steps after the bad one are thrown away

    def _close_step(
        self,
        values: list[float],
        tokens: int,
        batches: int,
        metrics: dict[str, float],
        seconds: float,
        now: float,
        decide: bool,
    ) -> bool:
        """Judge one step and count it; at a decision point also inject, preempt and save. False: rolled back."""
        verdict, micro = self.monitor.judge_step(values)
        value = step_loss(values)
        if not verdict.healthy:
            per = batches // len(values) if len(values) > 1 and batches % len(values) == 0 else 0
            position = self.data_position + (micro or 0) * per
            detail = {"micro_batch": micro, "micro_losses": values} if len(values) > 1 else {}
            self.events.emit(
                EventKind.UNHEALTHY,
                step=self.step + 1,
                loss=values[micro] if micro is not None else value,
                reason=verdict.reason,
                zscore=verdict.zscore,
                data_position=position,
                **detail,
            )
            if self.health_policy.action == "rollback":
                bad_end = position + per if per and micro is not None else self.data_position + batches
                self._rollback(self.step + 1, skip_to=bad_end + self.health_policy.skip_extra_batches)
                return False
            self._unhealthy_since_save = True
        else:
            self.monitor.accept(value)
        self._step_seconds[self.step] = seconds
        if self.auto_interval is not None:
            self.auto_interval.note_step(seconds)
        self.step += 1
        self.data_position += batches
        self.last_loss = value
        self._window_tokens += tokens
        self._note_metrics(metrics)
        p = self.policy
        self._save_owed |= p.every_steps is not None and self.step % p.every_steps == 0
        self._inject_owed |= self.inject_preempt_at == self.step
        if now - self._last_log >= self.log_every_s or self.step == self.total_steps:
            elapsed = max(now - self._window_start, seconds, 1e-9)
            tokens_per_s = self._window_tokens / elapsed
            if self.flops_per_token and self.peak_flops and "mfu" not in metrics:
                metrics["mfu"] = utilization(tokens_per_s, self.flops_per_token, self.peak_flops)
            per_rank: dict[str, list[float]] = {}
            if self._rank_window and self._rank_window[2][0] > 0:  # rank 0 of a group: every rank's timings
                busy, wait, counts = self._rank_window
                per_rank["rank_step_s"] = [round(b / n, 6) for b, n in zip(busy, counts, strict=True)]
                per_rank["rank_wait_s"] = [round(w / n, 6) for w, n in zip(wait, counts, strict=True)]
                self._rank_window = []
            self.events.emit(
                EventKind.STEP,
                step=self.step,
                loss=value,
                tokens_per_s=tokens_per_s,
                data_position=self.data_position,
                **metrics,
                **per_rank,
            )
            self._last_log, self._window_tokens, self._window_start = now, 0, now
        if (
            self.inject_rollback_at is not None
            and self.inject_rollback_at <= self.step
            and not self._injected_rollback
            and decide
        ):
            self._injected_rollback = True
            self._rollback(self.step, skip_to=None, injected=True)
            return False
        if not decide:
            return True
        if self._inject_owed:
            self._inject_owed = False
            self._preempt_signal = signal.SIGTERM
            self._agreed_preempt = True  # the same step on every rank: no need to ask the others
        if self._preempting():
            self._preempt()
        if self._save_due(now):
            self._save_owed = False
            bad = self.nonfinite_state()
            if bad is not None and self.health_policy.action == "rollback":
                self._roll_back_bad_state(bad, "before a checkpoint")
                return False
            self._save("periodic", bad)
        self._step_started = time.monotonic()
        if self._watch is not None:
            self._watch.progress(self.step)
        write = self._in_flight
        if write is not None and write.future.done() and write.future.exception() is None:
            self._finish_write()  # a failed write is dealt with where every rank waits for it, together
        return True

    def _agree(self, pending: Sequence[_Step], now: float) -> list[tuple[list[float], int]]:
        """One all-reduce for the steps since the last one: the mean loss of every micro-batch of each step
        over the ranks, the tokens of all ranks, and whether any rank was asked to stop or saw a
        time-based checkpoint due.

        Every rank then judges the same numbers, so they save, roll back, skip and stop together;
        a NaN on one rank makes the mean NaN everywhere. Each rank must report as many micro-batch
        losses as the others.
        """
        seconds_due = self._seconds_due(now)
        losses = [v for step in pending for v in step.values]
        flags = [*(float(step.tokens) for step in pending), float(self._preempt_signal is not None), float(seconds_due)]
        # Each rank fills its own slot: the sum gives every rank's step seconds (outside the agreement)
        # and its wait in the previous agreement; the rank that never waits holds the others up.
        n, k, world, rank = len(losses), len(pending), self.group.world_size, self.group.rank
        timing = [0.0] * (2 * world)
        timing[rank], timing[world + rank] = (now - self._agreed_at) / k, self._last_wait
        entered = time.monotonic()
        summed = self.group.agree([*losses, *flags, *timing])
        self._agreed_at = time.monotonic()
        self._last_wait = self._agreed_at - entered
        self._agreed_preempt = summed[n + k] > 0
        self._agreed_seconds_due = summed[n + k + 1] > 0
        if self._agreed_preempt and self._preempt_signal is None:
            self._preempt_signal = signal.SIGTERM  # another rank got it first
        if self.group.is_main:
            if not self._rank_window:
                self._rank_window = [[0.0] * world, [0.0] * world, [0.0] * world]
            busy, wait, counts = self._rank_window
            for r in range(world):
                busy[r] += summed[n + k + 2 + r]
                wait[r] += summed[n + k + 2 + world + r]
                counts[r] += 1
        out, at = [], 0
        for i, step in enumerate(pending):
            out.append(([v / world for v in summed[at : at + len(step.values)]], int(summed[n + i])))
            at += len(step.values)
        return out

    def log(self, kind: str = EventKind.METRICS.value, **data: Any) -> None:
        """Record anything else (validation loss, test metrics) in the job's event log.

        A value of ``checkpoint.keep_best``'s metric that beats every earlier one is saved with
        the state it was measured on, so the best checkpoint exists and survives pruning.
        """
        best = self.policy.keep_best
        if self.group.distributed and best is not None and best.metric in data:
            value = data[best.metric]
            if isinstance(value, (int, float)) and not isinstance(value, bool):  # the mean over ranks decides
                data = {**data, best.metric: self.group.agree([float(value)])[0] / self.group.world_size}
        kind = str(kind)  # a plain str, also for an EventKind: the trainer state is loaded with weights_only
        self.events.emit(kind, step=self.step, **data)
        self._logged[kind] = self.step
        if self._note_metrics(data) and self.step > 0:
            self.save("best")
        if self._last_saved_step == self.step or (self._in_flight is not None and self._in_flight.step == self.step):
            self._after_log[self.step] = {
                "values": copy.deepcopy(self.values),
                "logged": dict(self._logged),
                "rng": capture_rng(),
                "best": self._best,
            }
            for old in sorted(self._after_log)[: -(self.policy.keep + 2)]:
                del self._after_log[old]

    def _note_metrics(self, data: Mapping[str, Any]) -> bool:
        """Remember the keep_best metric measured at this step; True when it is a new best."""
        best = self.policy.keep_best
        value = data.get(best.metric) if best else None
        if best is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value):
            return False
        self._metric = (self.step, float(value))
        improved = self._best is None or (value < self._best if best.mode == "min" else value > self._best)
        if improved:
            self._best = float(value)
        return improved

    # ---- checkpoints -----------------------------------------------------------------------
    def _save_due(self, now: float) -> bool:
        if self._save_owed:  # a multiple of every_steps was reached since the last decision point
            return True
        if self.group.distributed:
            return self._agreed_seconds_due
        return self._seconds_due(now)

    def _seconds_due(self, now: float) -> bool:
        """``every_seconds`` or ``every: auto``'s interval has passed since the last save (this rank's clock)."""
        since, p, auto = now - self._last_save_time, self.policy, self.auto_interval
        return (p.every_seconds is not None and since >= p.every_seconds) or (auto is not None and auto.due(since))

    def _named_state(self) -> Iterator[tuple[str, Any]]:
        """Every tensor of the model and the optimizer state, named for a message."""
        for name, obj in self._objects.items():
            if name == "model":
                state = self._model.state_dict()
                yield from ((f"model.{key}", _local(value)) for key, value in state.items())
            elif name == "optimizer":
                state = getattr(obj, "state", None)
                if isinstance(state, Mapping):
                    for index, per_param in enumerate(state.values()):
                        if isinstance(per_param, Mapping):
                            yield from ((f"optimizer.state.{index}.{k}", _local(v)) for k, v in per_param.items())

    def nonfinite_state(self) -> str | None:
        """The first weight or optimizer tensor holding NaN or inf, or ``None`` (see ``first_nonfinite``).

        Run at every checkpoint save and at the end of training: a loss can be finite while the
        state it leaves behind is not (gradient accumulation, a bad last step).
        """
        bad = first_nonfinite(self._named_state())
        if not self.group.distributed:
            return bad
        found = [name for name in self.group.gather(bad) if name is not None]  # every rank's shard is checked
        return found[0] if found else None

    def _roll_back_bad_state(self, bad: str, when: str) -> None:
        """Weights or optimizer state went non-finite while every reported loss was finite."""
        self._say(
            EventKind.UNHEALTHY,
            f"{bad} holds NaN or inf at step {self.step} ({when}), though the reported losses were finite",
            step=self.step,
            reason="nonfinite_state",
            tensor=bad,
            data_position=self.data_position,
        )
        self._rollback(self.step, skip_to=self.data_position)

    def save(self, reason: str = "manual") -> None:
        """Write a checkpoint of every stateful object, the step, cursor, plain values and RNG states."""
        self._save(reason, self.nonfinite_state())

    def _save(self, reason: str, nonfinite: str | None) -> None:
        healthy = not self._unhealthy_since_save and nonfinite is None
        for name, value in self.values.items():
            if not is_plain(value):
                raise CheckpointError(
                    f"values[{name!r}] is a {type(value).__name__}: only numbers, strings, tensors and lists or "
                    "dicts of them are saved; convert it, or pass an object with state_dict/load_state_dict"
                )
        trainer = {
            "step": self.step,
            "data_position": self.data_position,
            "health_history": list(self.monitor.history),
            "rollbacks": self.rollbacks,
            "objects": sorted([*self._objects, "trainer"]),
            "values": dict(self.values),
            "logged": dict(self._logged),
            "best": self._best,
            "run": self._run_shape().to_state(),
        }
        best = self.policy.keep_best
        metrics = {best.metric: self._metric[1]} if best and self._metric and self._metric[0] == self.step else {}
        fields: dict[str, Any] = {
            "healthy": healthy,
            "loss": self.last_loss,
            "data_position": self.data_position,
            "reason": reason,
            "meta": {"attempt": self.events.attempt},
            "job": self.job,
            "fingerprint": self._fingerprint,
            "metrics": metrics,
        }
        step, background = self.step, self._writer is not None and reason == "periodic"
        self._finish_write()  # one write at a time, in step order
        started = time.perf_counter()
        write: Callable[[], CheckpointManifest]
        if self.group.distributed:  # every rank writes its shards; rank 0 commits the manifest
            from gpufleet.runtime.sharded import save_sharded  # torch.distributed.checkpoint: 0.7 s to import

            group = self._write_group if background and self._write_group is not None else self.group
            state = dcp_state(self._objects, trainer)
            rank_state = {"rng": capture_rng()}
            strategy = strategy_of(self._model)
            if background:
                state, rank_state = staged(state), staged(rank_state)

            def write() -> CheckpointManifest:
                return save_sharded(self.ckpts, group, step, state, rank_state, strategy=strategy, **fields)

        else:
            plain: dict[str, Any] = {name: obj.state_dict() for name, obj in self._objects.items()}
            plain["trainer"] = {**trainer, "rng": capture_rng()}
            if background:
                plain = staged(plain)

            def write() -> CheckpointManifest:
                manifest = self.ckpts.save(step, plain, **fields)
                if background:  # a synchronous save prunes after its event
                    with contextlib.suppress(OSError, CheckpointError):
                        self.ckpts.prune()
                return manifest

        if background and self._writer is not None:
            stall = time.perf_counter() - started
            self._in_flight = _Write(step, reason, healthy, nonfinite, stall, self._writer.submit(write))
            self._last_save_time = time.monotonic()
            self._unhealthy_since_save = False
            self._step_seconds.clear()
            return
        try:
            manifest = write()
        except CheckpointSpaceError as err:
            self._save_failed(err, step, reason)
            return
        self._saved(manifest, step, reason, healthy, nonfinite)

    def _finish_write(self) -> None:
        """Wait for the checkpoint being written in the background (if any), then record it."""
        write, self._in_flight = self._in_flight, None
        if write is None:
            return
        try:
            manifest = write.future.result()
        except CheckpointSpaceError as err:
            self._save_failed(err, write.step, write.reason)
            return
        self._saved(manifest, write.step, write.reason, write.healthy, write.nonfinite, stall=write.stall_seconds)

    def _save_failed(self, err: CheckpointSpaceError, step: int, reason: str) -> None:
        self._say(
            EventKind.CHECKPOINT_FAILED,
            f"checkpoint at step {step} not saved: {err}; the last good checkpoint is kept",
            step=step,
            reason=reason,
            needed=err.needed,
            free=err.free,
        )
        self._last_save_time = time.monotonic()
        if reason in ("preempt", "final") or self.policy.on_no_space == "requeue":
            raise Preempted(self.step) from None

    def _saved(
        self,
        manifest: CheckpointManifest,
        step: int,
        reason: str,
        healthy: bool,
        nonfinite: str | None,
        stall: float | None = None,
    ) -> None:
        """A committed checkpoint: remember it, and say so (``stall``: it was written in the background)."""
        self._last_saved_step = step if self._last_saved_step is None else max(step, self._last_saved_step)
        if stall is None:
            self._last_save_time = time.monotonic()
            self._unhealthy_since_save = False
            self._step_seconds.clear()
        self.events.emit(
            EventKind.CHECKPOINT,
            step=step,
            seconds=manifest.save_seconds,
            bytes=manifest.total_bytes,
            healthy=healthy,
            reason=reason,
            path=str(self.ckpts.root / f"step-{step:08d}"),
            **({"nonfinite": nonfinite} if nonfinite else {}),
            **({"background": True, "stall_seconds": stall} if stall is not None else {}),
        )
        if not self.group.distributed and stall is None:  # a sharded save prunes on rank 0 once committed
            self.ckpts.prune()
        if self.auto_interval is not None and self.auto_interval.note_save(
            manifest.save_seconds if stall is None else stall
        ):
            self.events.emit(EventKind.CHECKPOINT_INTERVAL, **self.auto_interval.event())

    def _preempt(self) -> None:
        signum = self._preempt_signal
        name = signal.Signals(signum).name if signum is not None else "request"
        self.events.emit(EventKind.PREEMPT_SIGNAL, signal=name, step=self.step)
        self._finish_write()  # the write in flight is committed before the process exits
        if self._last_saved_step != self.step:
            self._save("preempt", self.nonfinite_state())
        raise Preempted(self.step)

    def _check_strategy(self) -> None:
        """``distributed.strategy: fsdp`` on a model without parameters shards nothing: say so, do not train."""
        parameters = getattr(self._model, "parameters", None)
        if os.environ.get(ENV_STRATEGY) != "fsdp" or not self.group.distributed or not callable(parameters):
            return
        if not any(True for _ in parameters()):
            raise SpecError(
                f"distributed.strategy is fsdp, but the {type(self._model).__name__} given to TrainSession has no "
                "parameters to shard: give the model with its parameters, or use strategy ddp or none"
            )

    def _check_resume_mode(self) -> None:
        """``resume: never`` starts from scratch; another run's checkpoints are not mixed in silently."""
        if self.resume != "never" or (self.job is not None and self.events.attempt > 1):
            return
        found = self.ckpts.scan(verify=False)
        if found:
            raise CheckpointError(
                f"resume: never, but {self.ckpts.root} already holds checkpoints "
                f"(steps {found[0].step}..{found[-1].step}) of an earlier run: "
                "remove them or choose another checkpoint directory"
            )

    def restore(self, before_step: int | None = None, cause: str = "start") -> CheckpointInfo | None:
        """Load the newest complete, verified, healthy checkpoint of this job; report the ones skipped."""
        if self.resume == "never" and cause == "start" and (self.job is None or self.events.attempt == 1):
            self.events.emit(EventKind.RESTORE, step=None, seconds=0.0, cause=cause)
            return None
        started = time.perf_counter()
        if self.group.distributed:
            from gpufleet.runtime.sharded import sharded_candidate

            expect = Expectation(job=self.job)
            info, manifest, skipped = sharded_candidate(self.ckpts, self.group, before_step=before_step, expect=expect)
            state: dict[str, Any] | None = None
            single = [
                bad
                for bad in skipped
                if bad.manifest is not None
                and bad.manifest.format != "dcp"
                and bad.manifest.healthy
                and (self.job is None or bad.manifest.job in (None, self.job))
            ]
            if single and (info is None or single[0].step > info.step):
                # Starting over (or from an older sharded one) would silently throw that progress away.
                raise CheckpointError(
                    f"{single[0].path.name} (step {single[0].step}) was written by a single process (torch format), "
                    f"which a group of {self.group.world_size} ranks cannot reshard: resume the job with one rank "
                    "(resources.gpus: 1, no distributed block), or start over with resume: never in a fresh "
                    "checkpoint directory"
                )
        else:
            expect = Expectation(job=self.job, objects=frozenset([*self._objects, "trainer"]))
            # A sharded checkpoint loads here too: a job cut down to one process reshards it.
            info, manifest, state, skipped = self.ckpts.restore_candidate(
                before_step=before_step, expect=expect, formats=("torch", "dcp")
            )
        for bad in skipped:
            self._say(
                EventKind.CHECKPOINT_SKIPPED,
                f"skipped {bad.path.name}: {bad.problem}",
                step=bad.step,
                path=str(bad.path),
                reason=bad.problem,
            )
        if info is None or manifest is None:
            if before_step is None:
                self.events.emit(EventKind.RESTORE, step=None, seconds=time.perf_counter() - started, cause=cause)
            return None
        optimizer = self._objects.get("optimizer")
        current_optimizer = optimizer.state_dict() if cause == "start" and optimizer is not None else None
        if state is None:  # distributed
            trainer, rng = self._load_sharded(info.path, manifest)
            changes: list[str] = []
        else:
            self._check_fits(info.path, manifest.fingerprint, state)
            changes = hyperparameter_changes(state.get("optimizer"), current_optimizer) if current_optimizer else []
            for name, obj in self._objects.items():
                try:
                    obj.load_state_dict(state[name])
                except (RuntimeError, ValueError, KeyError, TypeError) as err:
                    raise CheckpointError(
                        f"{info.path} does not fit this run's {name}: {str(err).splitlines()[0][:300]}; "
                        "start over with resume: never in a fresh checkpoint directory"
                    ) from None
            trainer = state["trainer"]
            rng = trainer["rng"]
        self.step = int(trainer["step"])
        self.data_position = int(trainer["data_position"])
        self.monitor = HealthMonitor(self.health_policy, [float(x) for x in trainer["health_history"]])
        self.rollbacks = int(trainer.get("rollbacks", 0))
        if cause == "start":  # compared with this run's as the loop starts (an older checkpoint has none)
            self._saved_run = RunShape.from_state(trainer.get("run"))
        if rng is not None:
            restore_rng(rng)
        else:  # another world size: no saved RNG state for this rank
            reseeded_rng(self.step, self.group.rank)
            self.events.emit(EventKind.RNG_RESEEDED, step=self.step, world_size=self.group.world_size)
        self.values.update(trainer.get("values") or {})
        self._logged = {str(k): int(v) for k, v in (trainer.get("logged") or {}).items()}
        best = trainer.get("best")
        self._best = float(best) if isinstance(best, (int, float)) and not isinstance(best, bool) else None
        after = self._after_log.get(self.step) if cause == "rollback" else None
        if after is not None:  # this process already ran what was logged at this step: carry on after it
            self.values.update(copy.deepcopy(after["values"]))
            self._logged = dict(after["logged"])
            self._best = after["best"]
            restore_rng(after["rng"])
        self.last_loss = manifest.loss
        self._last_saved_step = self.step
        self._last_save_time = time.monotonic()
        seconds = time.perf_counter() - started
        self.events.emit(EventKind.RESTORE, step=self.step, seconds=seconds, path=str(info.path), cause=cause)
        if cause == "start" and self.auto_interval is not None:
            self.auto_interval.note_restore(seconds)  # logged with the first interval, as training starts
        if cause == "start" and self.echo:
            print(f"gpufleet: resumed from {info.path} (step {self.step}) in {seconds:.2f}s", flush=True)
        if changes:
            self._say(
                EventKind.CONFIG_CHANGED,
                f"{info.path.name} restores optimizer settings that differ from this run's: {'; '.join(changes)}. "
                "The checkpoint's values are used; start over with resume: never to apply the new ones",
                changes=changes,
            )
        return info

    def _load_sharded(self, path: Path, manifest: CheckpointManifest) -> tuple[dict[str, Any], Any]:
        """Every rank loads its part of a sharded checkpoint (resharded when the world size changed)."""
        if manifest.fingerprint is not None and manifest.fingerprint != self._fingerprint:
            raise CheckpointError(
                f"{path} does not fit the model: it was written for another architecture; start over with "
                "resume: never in a fresh checkpoint directory, or restore the old model"
            )
        from gpufleet.runtime.sharded import load_sharded

        state = dcp_template(self._objects)
        try:
            rank_state = load_sharded(self.ckpts, self.group, path, state)
            trainer = apply_dcp_state(self._objects, state)
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{path} does not fit this run: {str(err).splitlines()[0][:300]}; "
                "start over with resume: never in a fresh checkpoint directory"
            ) from None
        return trainer, (rank_state or {}).get("rng")

    def _check_fits(self, path: Path, fingerprint: str | None, state: Mapping[str, Any]) -> None:
        """A checkpoint of this job written for another model shape is an error, not a silent fallback."""
        if fingerprint is None or fingerprint == self._fingerprint:
            return
        mismatch = state_dict_mismatch(state["model"], self._model.state_dict())
        raise CheckpointError(
            f"{path} does not fit the model: {mismatch}; the model changed since it was written: "
            "start over with resume: never in a fresh checkpoint directory, or restore the old model"
        )

    def _rollback(self, bad_step: int, *, skip_to: int | None, injected: bool = False) -> None:
        """Back to the newest healthy checkpoint before ``bad_step``; data resumes at ``skip_to``.

        ``skip_to=None`` replays the same batches (an injected rollback: a correct script must
        then reproduce the uninterrupted run exactly).
        """
        if self.rollbacks >= self.health_policy.max_rollbacks and not injected:
            raise HealthError(
                f"step {bad_step} is unhealthy after {self.rollbacks} rollbacks (health.max_rollbacks); "
                "lower the learning rate or raise health.max_rollbacks"
            )
        self._finish_write()  # the checkpoint to go back to may be the one being written
        started = time.monotonic()
        # Work thrown away: the steps since the last save in this attempt, and the bad one.
        redone_seconds = sum(self._step_seconds.values()) + (started - self._step_started)
        rollbacks = self.rollbacks + (0 if injected else 1)
        info = self.restore(before_step=bad_step, cause="rollback")
        if info is None:
            raise HealthError(
                f"step {bad_step} is unhealthy and no healthy checkpoint precedes it; "
                "save more often (checkpoint.every_steps) so there is one to return to"
                if self.step > 0
                else f"step {bad_step} is unhealthy before any update of the model: its initialisation or the first "
                "batch produced the NaN or inf, so no checkpoint can help; check the model's initialisation "
                "(uninitialised tensors, such as `torch.empty` or `to_empty` without a reset) and the first batch"
            )
        self.rollbacks = rollbacks
        if self.group.is_main:
            self.ckpts.drop_after(self.step)
        self.group.barrier()
        self._after_log = {k: v for k, v in self._after_log.items() if k <= self.step}
        target = self.data_position if skip_to is None else skip_to
        skipped = f", skipping batches {self.data_position}..{target - 1}" if target > self.data_position else ""
        self._say(
            EventKind.ROLLBACK,
            f"rolled back from step {bad_step} to healthy step {self.step}{skipped}"
            + (" (injected)" if injected else ""),
            from_step=bad_step,
            to_step=self.step,
            skip_from=self.data_position,
            skip_to=target,
            redone_steps=bad_step - self.step,
            redone_seconds=redone_seconds,
            restore_seconds=time.monotonic() - started,
            **({"injected": True} if injected else {}),
        )
        self.data_position = target
        self._step_seconds.clear()
        self._unhealthy_since_save = False
        self._save_owed = False
        self._step_started = time.monotonic()
        if self._watch is not None:
            self._watch.progress(self.step)


def _attempt(events: EventLog | None) -> int:
    return events.attempt if events is not None else 1


def _job_event_writer(attempt: int) -> Any:
    """For a rank other than 0: append one event to the job's log (a watchdog report), if there is one."""
    path = os.environ.get("GPUFLEET_EVENTS")
    return functools.partial(append_event, path, attempt)


def _local(value: Any) -> Any:
    """This rank's part of a sharded tensor (a DTensor's local shard); anything else as it is."""
    to_local = getattr(value, "to_local", None)
    return to_local() if callable(to_local) else value


def _env_step(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r} must be a step number of at least 1")
    return int(raw)


__all__ = [
    "PREEMPT_SIGNALS",
    "RESERVED_NAMES",
    "RESUME_MODES",
    "Preempted",
    "Stateful",
    "TrainSession",
    "gpu_sampler_from_env",
    "staged",
]
