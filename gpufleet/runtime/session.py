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

import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gpufleet.errors import CheckpointError, GpufleetError, HealthError
from gpufleet.estimate.mfu import utilization
from gpufleet.estimate.peak import gpu_peak
from gpufleet.runtime.checkpoint import CheckpointDir, CheckpointInfo
from gpufleet.runtime.events import EventLog
from gpufleet.runtime.health import HealthMonitor
from gpufleet.runtime.protocol import REQUEUE_EXIT_CODE
from gpufleet.runtime.state import capture_rng, restore_rng
from gpufleet.spec import CheckpointPolicy, HealthPolicy, Telemetry, parse_spec
from gpufleet.telemetry.metrics import exporter_from_env, labels_from_env

if TYPE_CHECKING:
    from gpufleet.telemetry.gpu import GpuSampler

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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


class TrainSession:
    """Restore-or-init, step loop, health, checkpoints and the preemption guard."""

    def __init__(
        self,
        *,
        ckpt_dir: str | Path,
        model: Stateful,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        extra: Mapping[str, Stateful] | None = None,
        total_steps: int | None = None,
        policy: CheckpointPolicy | None = None,
        health: HealthPolicy | None = None,
        events: EventLog | None = None,
        log_every_s: float = 1.0,
        handle_signals: bool = True,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        gpu_sampler: GpuSampler | None = None,
    ) -> None:
        self.gpu_sampler = gpu_sampler
        """Samples the job's GPUs in a thread while the session is open (see ``gpu_sampler_from_env``)."""
        self.ckpts = CheckpointDir(Path(ckpt_dir), keep=(policy or CheckpointPolicy()).keep)
        self.policy = policy or CheckpointPolicy()
        self.health_policy = health or HealthPolicy()
        self.events = events or EventLog(None)
        self.total_steps = total_steps
        self.log_every_s = log_every_s
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        """Dense peak FLOP/s of all the job's GPUs; with ``flops_per_token``, step events carry MFU."""
        self._objects: dict[str, Stateful] = {"model": model}
        if optimizer is not None:
            self._objects["optimizer"] = optimizer
        if scheduler is not None:
            self._objects["scheduler"] = scheduler
        for name, obj in (extra or {}).items():
            if name in self._objects or name == "trainer":
                raise ValueError(f"extra state name {name!r} is reserved")
            self._objects[name] = obj
        self._model = model
        self._handle_signals = handle_signals
        self._previous_handlers: dict[int, Any] = {}
        self._preempt_signal: int | None = None
        self.step = 0
        """Optimizer steps completed."""
        self.data_position = 0
        """Index of the next batch in the data stream; advances by one a step, jumps on rollback."""
        self.monitor = HealthMonitor(self.health_policy)
        self.rollbacks = 0
        self.last_loss: float | None = None
        self._last_saved_step: int | None = None
        self._last_save_time = time.monotonic()
        self._unhealthy_since_save = False
        self._step_started = time.monotonic()
        self._step_seconds: dict[int, float] = {}
        self._last_log = 0.0
        self._window_tokens = 0
        self._window_start = time.monotonic()
        self._entered = False

    # ---- construction from the backend's environment ---------------------------------------
    @classmethod
    def from_env(
        cls,
        *,
        model: Stateful,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        extra: Mapping[str, Stateful] | None = None,
        total_steps: int | None = None,
        ckpt_dir: str | Path = "checkpoints",
        flops_per_token: float | None = None,
    ) -> TrainSession:
        """Build a session from what the backend exported (``GPUFLEET_*``), or local defaults.

        Under gpufleet, checkpoints go to ``$GPUFLEET_CKPT_DIR``, policies come from the job's
        spec and events to the job's event log; run by hand, checkpoints go to ``ckpt_dir``.
        """
        env = os.environ
        policy, health, peak, gpu_type, provider = CheckpointPolicy(), HealthPolicy(), None, "", ""
        telemetry, gpus, spot = Telemetry(), 1, False
        if env.get("GPUFLEET_SPEC"):
            spec_path = Path(env["GPUFLEET_SPEC"])
            spec = parse_spec(json.loads(spec_path.read_text(encoding="utf-8")), source=str(spec_path))
            policy, health = spec.checkpoint, spec.health
            peak = _job_peak_flops(spec.resources.gpu_type, spec.resources.gpus)
            gpu_type, provider = spec.resources.gpu_type, spec.provider
            telemetry, gpus, spot = spec.telemetry, spec.resources.gpus, spec.spot
        events_path = env.get("GPUFLEET_EVENTS")
        # Under a plain sbatch script (not submitted by gpufleet), Slurm numbers the runs.
        attempt = int(env.get("GPUFLEET_ATTEMPT") or int(env.get("SLURM_RESTART_COUNT") or 0) + 1)
        events = EventLog(Path(events_path) if events_path else None, attempt=attempt)
        labels = {**labels_from_env(env, gpu_type, provider), "attempt": str(attempt)}
        sampler = gpu_sampler_from_env(env, telemetry, gpus, attempt)
        events.listeners.extend(exporter_from_env(env, labels, gpu=sampler, gpus=gpus, spot=spot))
        return cls(
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
        )

    # ---- context manager: restore on entry, handlers in, handlers out ----------------------
    def __enter__(self) -> TrainSession:
        self.events.emit("session_start", pid=os.getpid(), total_steps=self.total_steps)
        self.ckpts.clean_temporaries()
        if self.gpu_sampler is not None:
            self.gpu_sampler.start()
            self.events.emit("gpu_source", source=self.gpu_sampler.source.description)
        self.restore()
        if self._handle_signals and threading.current_thread() is threading.main_thread():
            for sig in PREEMPT_SIGNALS:
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
        self._entered = True
        self._step_started = time.monotonic()
        self._window_start = time.monotonic()
        self.events.emit("train_start", step=self.step, data_position=self.data_position)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()
        if self.gpu_sampler is not None:
            self.gpu_sampler.close()
        if exc_type is None:
            if self._last_saved_step != self.step and self.step > 0:
                self.save("final")
            self.events.emit("session_end", status="completed", step=self.step)
        elif isinstance(exc, Preempted):
            self.events.emit("session_end", status="requeue", step=self.step)
        else:
            self.events.emit("session_end", status="failed", step=self.step, error=f"{exc_type.__name__}: {exc}")
        self.events.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the save happens at the next step boundary, never inside a step.
        self._preempt_signal = signum

    def request_preemption(self, signum: int = signal.SIGTERM) -> None:
        """Ask for a save-and-requeue at the next step boundary (what SIGTERM does)."""
        self._preempt_signal = signum

    # ---- the loop -----------------------------------------------------------------------------
    def steps(self) -> Iterator[int]:
        """Yield the index of each step to run, from the restored step to ``total_steps``."""
        if not self._entered:
            raise RuntimeError("use TrainSession as a context manager: `with session: for step in session.steps()`")
        while self.total_steps is None or self.step < self.total_steps:
            yield self.step

    def report(self, loss: float | torch.Tensor, *, tokens: int = 0, batches: int = 1, **metrics: float) -> None:
        """Close the current step: judge its loss, then checkpoint, roll back or exit as needed."""
        value = float(loss.detach().item() if isinstance(loss, torch.Tensor) else loss)
        now = time.monotonic()
        verdict = self.monitor.judge(value)
        if not verdict.healthy:
            self.events.emit(
                "unhealthy",
                step=self.step + 1,
                loss=value,
                reason=verdict.reason,
                zscore=verdict.zscore,
                data_position=self.data_position,
            )
            if self.health_policy.action == "rollback":
                self._rollback(bad_batch_end=self.data_position + batches)
                return
            self._unhealthy_since_save = True
        else:
            self.monitor.accept(value)
        self._step_seconds[self.step] = now - self._step_started
        self.step += 1
        self.data_position += batches
        self.last_loss = value
        self._window_tokens += tokens
        if now - self._last_log >= self.log_every_s or self.step == self.total_steps:
            elapsed = max(now - self._window_start, 1e-9)
            tokens_per_s = self._window_tokens / elapsed
            if self.flops_per_token and self.peak_flops and "mfu" not in metrics:
                metrics["mfu"] = utilization(tokens_per_s, self.flops_per_token, self.peak_flops)
            self.events.emit(
                "step",
                step=self.step,
                loss=value,
                tokens_per_s=tokens_per_s,
                data_position=self.data_position,
                **metrics,
            )
            self._last_log, self._window_tokens, self._window_start = now, 0, now
        if self._preempt_signal is not None:
            self._preempt()
        if self._save_due(now):
            self.save("periodic")
        self._step_started = time.monotonic()

    def log(self, kind: str = "metrics", **data: Any) -> None:
        """Record anything else (validation loss, test metrics) in the job's event log."""
        self.events.emit(kind, step=self.step, **data)

    # ---- checkpoints -----------------------------------------------------------------------
    def _save_due(self, now: float) -> bool:
        p = self.policy
        if p.every_steps is not None and self.step % p.every_steps == 0:
            return True
        return p.every_seconds is not None and now - self._last_save_time >= p.every_seconds

    def _weights_finite(self) -> bool:
        params = getattr(self._model, "parameters", None)
        if params is None:
            return True
        return all(bool(torch.isfinite(p).all()) for p in params())

    def save(self, reason: str = "manual") -> None:
        """Write a checkpoint of every stateful object, the step, cursor and RNG states."""
        healthy = not self._unhealthy_since_save and self._weights_finite()
        state: dict[str, Any] = {name: obj.state_dict() for name, obj in self._objects.items()}
        state["trainer"] = {
            "step": self.step,
            "data_position": self.data_position,
            "rng": capture_rng(),
            "health_history": list(self.monitor.history),
            "rollbacks": self.rollbacks,
        }
        manifest = self.ckpts.save(
            self.step,
            state,
            healthy=healthy,
            loss=self.last_loss,
            data_position=self.data_position,
            reason=reason,
            meta={"attempt": self.events.attempt},
        )
        self._last_saved_step = self.step
        self._last_save_time = time.monotonic()
        self._unhealthy_since_save = False
        self._step_seconds.clear()
        self.events.emit(
            "checkpoint",
            step=self.step,
            seconds=manifest.save_seconds,
            bytes=manifest.total_bytes,
            healthy=healthy,
            reason=reason,
            path=str(self.ckpts.root / f"step-{self.step:08d}"),
        )
        self.ckpts.prune()

    def _preempt(self) -> None:
        signum = self._preempt_signal
        name = signal.Signals(signum).name if signum is not None else "request"
        self.events.emit("preempt_signal", signal=name, step=self.step)
        if self._last_saved_step != self.step:
            self.save("preempt")
        raise Preempted(self.step)

    def restore(self, before_step: int | None = None, cause: str = "start") -> CheckpointInfo | None:
        """Load the newest complete, verified, healthy checkpoint; report the ones skipped."""
        started = time.perf_counter()
        while True:
            info, skipped = self.ckpts.latest(before_step=before_step)
            for bad in skipped:
                self.events.emit("checkpoint_skipped", step=bad.step, path=str(bad.path), reason=bad.problem)
            if info is None:
                if before_step is None:
                    self.events.emit("restore", step=None, seconds=time.perf_counter() - started, cause=cause)
                return None
            try:
                manifest, state = self.ckpts.load(info.path)
                break
            except CheckpointError as err:  # changed between verify and load: skip it too
                self.events.emit("checkpoint_skipped", step=info.step, path=str(info.path), reason=str(err))
                before_step = info.step
        for name, obj in self._objects.items():
            if name not in state:
                raise CheckpointError(f"{info.path} has no {name}.pt: was it written by another training script?")
            obj.load_state_dict(state[name])
        trainer = state["trainer"]
        self.step = int(trainer["step"])
        self.data_position = int(trainer["data_position"])
        self.monitor = HealthMonitor(self.health_policy, [float(x) for x in trainer["health_history"]])
        self.rollbacks = int(trainer.get("rollbacks", 0))
        restore_rng(trainer["rng"])
        self.last_loss = manifest.loss
        self._last_saved_step = self.step
        self._last_save_time = time.monotonic()
        self.events.emit(
            "restore", step=self.step, seconds=time.perf_counter() - started, path=str(info.path), cause=cause
        )
        return info

    def _rollback(self, bad_batch_end: int) -> None:
        bad_step = self.step + 1  # steps are counted from 1: checkpoint step-N holds the state after N
        if self.rollbacks >= self.health_policy.max_rollbacks:
            raise HealthError(
                f"step {bad_step} is unhealthy after {self.rollbacks} rollbacks (health.max_rollbacks); "
                "lower the learning rate or raise health.max_rollbacks"
            )
        started = time.monotonic()
        # Work thrown away: the steps since the last save in this attempt, and the bad one.
        redone_seconds = sum(self._step_seconds.values()) + (started - self._step_started)
        rollbacks = self.rollbacks + 1
        info = self.restore(before_step=bad_step, cause="rollback")
        if info is None:
            raise HealthError(
                f"step {bad_step} is unhealthy and no healthy checkpoint precedes it; "
                "save more often (checkpoint.every_steps) so there is one to return to"
            )
        self.rollbacks = rollbacks
        self.ckpts.drop_after(self.step)
        skip_to = bad_batch_end + self.health_policy.skip_extra_batches
        self.events.emit(
            "rollback",
            from_step=bad_step,
            to_step=self.step,
            skip_from=self.data_position,
            skip_to=skip_to,
            redone_steps=bad_step - self.step,
            redone_seconds=redone_seconds,
            restore_seconds=time.monotonic() - started,
        )
        self.data_position = skip_to
        self._step_seconds.clear()
        self._unhealthy_since_save = False
        self._step_started = time.monotonic()
