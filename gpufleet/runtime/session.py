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

The session is a facade: it owns the loop's position (step, data cursor, health window, rollbacks)
and the order of a step boundary, and asks its components (``runtime.components``) for verdicts:
the checkpoint manager (save, restore, interval), the preemption guard, the rank agreement and the
reporter. None of them calls back into the session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gpufleet.errors import HealthError
from gpufleet.jobs.events import EventKind, EventLog
from gpufleet.jobs.protocol import ENV_STRATEGY
from gpufleet.runtime.board import PhaseBoard, board_path
from gpufleet.runtime.checkpoint import CheckpointInfo
from gpufleet.runtime.components.agreement import Agreement, PendingStep, RankAgreement
from gpufleet.runtime.components.announce import Announcer
from gpufleet.runtime.components.checkpointer import CheckpointManager, LoopPosition, SaveVerdict
from gpufleet.runtime.components.ckpt_io import RESERVED_NAMES, Stateful, staged, state_registry
from gpufleet.runtime.components.guard import (
    PREEMPT_SIGNALS,
    GuardVerdict,
    Preempted,
    PreemptionGuard,
    preemption_line,
)
from gpufleet.runtime.components.phases import CHECKPOINT, COLLECTIVE, PhaseClock, uses_cuda
from gpufleet.runtime.components.reporter import Reporter, gpu_sampler_from_env
from gpufleet.runtime.components.settings import settings_from_env
from gpufleet.runtime.group import Group, current_group, import_world_defaults
from gpufleet.runtime.health import HealthMonitor, first_nonfinite, loss_values, step_loss
from gpufleet.runtime.interval import PreemptionRate
from gpufleet.runtime.memtier.tier import TierPlace
from gpufleet.runtime.state import RunShape
from gpufleet.spec import CheckpointPolicy, HealthPolicy

if TYPE_CHECKING:
    from gpufleet.telemetry.gpu import GpuSampler

if os.environ.get("WORLD_SIZE", "1") not in ("", "0", "1"):
    # A rank of a group: before the script initialises the world group itself (runtime.group).
    import_world_defaults()

RESUME_MODES = ("auto", "never", "must")


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
        memory: TierPlace | None = None,
        phase_timing: bool = True,
        straggler_factor: float = 1.5,
        hang: tuple[float, float] = (10.0, 30.0),
        gpus_per_rank: int = 1,
    ) -> None:
        if resume not in RESUME_MODES:
            raise ValueError(f"resume={resume!r}: choose one of {', '.join(RESUME_MODES)}")
        self.group = group if group is not None else current_group()
        """The ranks of this attempt (a group of one for a single process): they take every decision together."""
        objects, values = state_registry(model, optimizer, scheduler, extra)
        # One job, one event log: rank 0 writes it; the other ranks keep their newest events in memory,
        # a bounded few (a rank that trains for weeks must not hoard its step events).
        if events is None or not self.group.is_main:
            attempt = events.attempt if events is not None else 1
            events = EventLog(None, attempt=attempt, keep_last=None if self.group.is_main else 100)
        self._voice = Announcer(events, echo and self.group.is_main)
        self._ckpt = CheckpointManager(
            Path(ckpt_dir),
            objects=objects,
            values=values,
            group=self.group,
            voice=self._voice,
            policy=policy,
            job=job,
            resume=resume,
            preemption_rate=preemption_rate,
            memory=memory,
        )
        self._guard = PreemptionGuard(handle_signals=handle_signals, distributed=self.group.distributed)
        self._agreement = RankAgreement(self.group, agree_every)
        self._clock_due = False
        """A time-based save the ranks agreed on at an agreement read late: taken at the next decision."""
        self._reporter = Reporter(self._voice, self.group, log_every_s, flops_per_token, peak_flops, gpu_sampler)
        self._phases: PhaseClock | None = None
        """Where each step's time goes (``components.phases``); ``phase_timing=False`` (``GPUFLEET_PHASE_TIMING=0``)
        leaves the model and optimizer unhooked."""
        if phase_timing:
            self._phases = PhaseClock(cuda=uses_cuda(model))
            self._phases.attach(model, optimizer)
        self._ranks_policy = (straggler_factor, hang, gpus_per_rank)
        self.events, self.ckpts, self.policy = events, self._ckpt.ckpts, self._ckpt.policy
        self.values = values
        """Plain values saved with every checkpoint and restored with it (``extra`` entries without
        ``state_dict``): read and assign them here, e.g. ``s.values["best_val_loss"] = v``."""
        self.auto_interval, self.gpu_sampler = self._ckpt.auto_interval, gpu_sampler
        """``checkpoint: {every: auto}``'s estimator; the GPU sampler (``gpu_sampler_from_env``): the components'."""
        self.echo, self.agree_every, self.log_every_s = self._voice.echo, agree_every, log_every_s
        """As given to the components (which hold them): changing them here changes nothing."""
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.health_policy = health or HealthPolicy()
        self.monitor = HealthMonitor(self.health_policy)
        self.total_steps = total_steps
        self.resume = resume
        """``auto``, ``never`` or ``must`` (see ``JobSpec.resume``)."""
        self.job = job
        """This run's identity (the job id under gpufleet); a checkpoint of another job is refused."""
        self.step = 0
        """Optimizer steps completed."""
        self.data_position = 0
        """Index of the next batch in the data stream; advances by ``batches`` a step, jumps on rollback."""
        self.global_batch: int | None = None
        """Examples a step reads over all ranks, when the script says (``note_data``): saved with each checkpoint."""
        self.epoch_batches: int | None = None
        """Data positions per epoch, when the script says (``note_data``)."""
        self.rollbacks = 0
        self.last_loss: float | None = None
        self.inject_rollback_at: int | None = None
        """Debugging: once, after this step, roll back to the previous checkpoint and replay (no skip)."""
        self._injected_rollback = False
        self._run_checked = False
        self._entered = False
        self._step_started = time.monotonic()

    # ---- the preemption guard ---------------------------------------------------------------
    @property
    def inject_preempt_at(self) -> int | None:
        """Debugging: behave as if SIGTERM arrived when this attempt's training reaches this step."""
        return self._guard.inject_at

    @inject_preempt_at.setter
    def inject_preempt_at(self, step: int | None) -> None:
        self._guard.inject_at = step

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
        env = settings_from_env(os.environ, ckpt_dir=ckpt_dir, resume=resume)
        session = cls(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            extra=extra,
            total_steps=total_steps,
            flops_per_token=flops_per_token,
            **env.arguments,
        )
        session.inject_preempt_at, session.inject_rollback_at = env.inject_preempt_at, env.inject_rollback_at
        return session

    # ---- context manager: restore on entry, handlers in, handlers out ----------------------
    def __enter__(self) -> TrainSession:
        self.events.emit(EventKind.SESSION_START, pid=os.getpid(), total_steps=self.total_steps, resume=self.resume)
        try:
            self._open()
        except BaseException as err:
            self._reporter.close()
            self._reporter.end(err, self.step, preempted=isinstance(err, Preempted))
            self._guard.disarm()
            raise
        return self

    def _open(self) -> None:
        self._ckpt.prepare(os.environ.get(ENV_STRATEGY))
        self._reporter.open()
        self._ckpt.check_start(self.restore() is not None, self.step, self.total_steps)
        self._guard.arm()
        if self.group.distributed:
            factor, hang, gpus_per_rank = self._ranks_policy
            folder = self._agreement.watch(self.events, self.step, self.ckpts.root / ".ranks", hang=hang)
            if self._phases is not None:
                self._phases.board = PhaseBoard(board_path(folder, self.group.rank))
                self._reporter.watch_stragglers(self._agreement.hosts, factor, gpus_per_rank)
        self._ckpt.start_writer()
        self._entered = True
        self._ckpt.announce_interval()
        self._step_started = time.monotonic()
        self._reporter.restart()
        self._agreement.restart()
        if self._phases is not None:
            self._phases.restart()
        self.events.emit(EventKind.TRAIN_START, step=self.step, data_position=self.data_position)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # The preemption handlers stay until session_end is written: torchrun SIGTERMs the ranks
        # still alive as soon as one dies, and a rank that dies of it before writing its lost-rank
        # marker and session_end leaves an attempt that reads as failed instead of requeued.
        self._agreement.close()
        if self._phases is not None:
            self._phases.detach()
        if exc is not None:  # a write in flight ends (or fails) before the process does; its error is moot,
            with contextlib.suppress(Exception, Preempted):  # and so is a full disk's requeue: exc is what happened
                self._finish_write()
        self._ckpt.close_writer()
        self._reporter.close()
        try:
            if exc is None:
                self._finish()
                self.group.drain()  # no collective's tensors left to a gloo worker when the script tears down
        except BaseException as err:
            exc = err
            raise
        finally:
            try:
                self._reporter.end(exc, self.step, preempted=isinstance(exc, Preempted))
            finally:
                self._guard.disarm()

    def _finish(self) -> None:
        """A session that ends normally ends on a healthy, saved state, or not ``completed`` at all."""
        self._settle(decide=True)  # the loop was left between two agreements: judge those steps first
        if self._guard.requested and (self.total_steps is None or self.step < self.total_steps):
            self._preempt()  # the loop was left early because of SIGTERM: that is a preemption
        bad = self.nonfinite_state()
        if bad is not None or self._ckpt.unhealthy_since_save:
            what = f"{bad} holds NaN or inf" if bad else "a step since the last checkpoint was unhealthy"
            reason = "nonfinite_state" if bad else "unhealthy_step"
            message = f"the final state at step {self.step} is unhealthy: {what}"
            self._voice.say(EventKind.UNHEALTHY, message, step=self.step, reason=reason, tensor=bad)
            raise HealthError(
                f"training ended at step {self.step} on an unhealthy state ({what}); the job is not completed. "
                "Use health.action: rollback, or loop with `for _ in session.steps()` so it can roll back"
            )
        self._finish_write()
        if self._ckpt.last_saved_step != self.step and self.step > 0:
            self._save("final", bad)

    def _preempt(self) -> None:
        """Save (unless this step is saved), say so in the attempt's log, and exit to be requeued."""
        self.events.emit(EventKind.PREEMPT_SIGNAL, signal=self._guard.signal_name, step=self.step)
        step, started = self.step, time.perf_counter()
        folder = self._ckpt.ckpts.root / f"step-{step:08d}"
        saved = f"checkpoint step {step} was already saved ({folder})"
        try:
            self._finish_write()  # the write in flight is committed before the process exits
            if self._ckpt.last_saved_step != step:
                self._save("preempt", self.nonfinite_state())
                saved = f"saved checkpoint step {step} ({folder}) in {time.perf_counter() - started:.2f} s"
        except Preempted:  # the disk is full: the last good checkpoint is kept
            last = self._ckpt.last_saved_step
            kept = f"the last saved is step {last}" if last is not None else "none was saved in this attempt"
            self._voice.print(
                preemption_line(self._guard.signal_name, step, f"checkpoint not saved (no space), {kept}")
            )
            raise
        except Exception as err:
            failed = f"the checkpoint could not be saved ({type(err).__name__}: {err})"
            self._voice.print(f"{self._guard.signal_name} at step {step}: {failed}")
            raise
        self._voice.print(preemption_line(self._guard.signal_name, step, saved))
        raise Preempted(step)

    def request_preemption(self, signum: int = signal.SIGTERM) -> None:
        """Ask for a save-and-requeue at the next step boundary (what SIGTERM does)."""
        self._guard.request(signum)

    @property
    def preempt_requested(self) -> bool:
        """True once SIGTERM/SIGUSR1 arrived: a long evaluation should stop and reach ``report``.

        The save happens at the next ``report`` (or when the session ends); work inside a step
        that outlasts the grace period is killed with the process. Check this in any loop that
        can take long (evaluation, generation) and ``break``. In a group: what the ranks agreed
        in the last agreement read (a step late for one read at the next boundary), the same on each.
        """
        return self._guard.requested

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

    def _check_run(self) -> None:
        """Once, as the loop starts: a resumed run whose global batch or ``total_steps`` changed says so."""
        self._run_checked = True
        self._ckpt.check_run(self._run_shape(), self.step, self.data_position)

    def due(self, kind: str, every: int) -> bool:
        """True when ``step % every == 0`` and nothing of ``kind`` was logged at this step yet.

        ``if s.due("eval", every=250): ...; s.log("eval", val_loss=v)`` evaluates once per step:
        a rollback to a checkpoint whose step was already evaluated in this process comes back
        with what that evaluation left (``values``, RNG states) and does not evaluate it again;
        steps replayed after it hold other weights and are evaluated anew.
        """
        if every <= 0:
            raise ValueError(f"every={every} must be at least 1")
        return self.step % every == 0 and self._ckpt.logged.get(kind) != self.step

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
        phases = self._phases
        if phases is not None:
            phases.end_step()
        try:
            self._report(loss, tokens, batches, metrics)
        finally:
            if phases is not None:
                phases.begin_step()

    def _report(
        self,
        loss: float | torch.Tensor | Sequence[float | torch.Tensor],
        tokens: int,
        batches: int | None,
        metrics: dict[str, float],
    ) -> None:
        if not self._run_checked:  # a loop of its own, without steps()
            self._check_run()
        values = loss_values(loss)
        batches = len(values) if batches is None else batches
        now = time.monotonic()
        pending = PendingStep(values, tokens, batches, dict(metrics), now - self._step_started)
        if not self.group.distributed:
            self._close_step(pending, now, decide=True)
            if self._phases is not None:
                phases, steps = self._phases.take()
                self._reporter.note_phases([tuple(phases)], steps, self.step)
            return
        # A group closes its steps together, at each agreement (every ``agree_every`` steps, and the last). An
        # agreement that decides nothing is read at the next step boundary (``RankAgreement.send``): first that.
        if not self._receive():
            return  # a step it judged was rolled back: this one was taken on a state thrown away
        self.step += 1  # provisional until the agreement judges it
        self.data_position += batches
        # The ranks also wait for an agreement at every step a checkpoint, the last step or an injected fault
        # is due, so those land on the same steps as for one process, on a judged state (the count is the same
        # on every rank); and at the step after an agreement that asks for a stop or a time-based save.
        every = self.policy.every_steps
        due = (
            (self.total_steps is not None and self.step >= self.total_steps)
            or (every is not None and self.step % every == 0)
            or self.step in (self.inject_preempt_at, self.inject_rollback_at)
            or self._ckpt.snapshot_meets(self.step)
            or self._guard.requested
            or self._clock_due
        )
        if not self._agreement.hold(pending, due=due):
            self._between(pending.seconds)
            return
        if due:
            self._flush(now)
            return
        phases = self._phases.take()[0] if self._phases is not None else []
        pending_steps = self._agreement.take()
        self._agreement.send(
            pending_steps, now, preempt=self._guard.raised_here, seconds_due=self._ckpt.seconds_due(now), phases=phases
        )
        self._between(pending.seconds)
        if self._ckpt.write_done():
            self._finish_write()

    def _between(self, seconds: float) -> None:
        """A group's step left unjudged for now: the loop goes on (a due memory snapshot says it is not judged yet)."""
        with self._stall(CHECKPOINT):
            self._ckpt.snapshot(self._position(), seconds, judged=False)
        self._step_started = time.monotonic()
        self._agreement.progress(self.step)

    def _receive(self) -> bool:
        """Judge the steps of the agreement in flight, if any (waiting for it); False when one was rolled back.

        The state in memory is already a step further: the agreement judges the steps, and carries a
        stop or a time-based save to the next decision point, never acting on a state it did not judge.
        """
        received = self._agreement.receive()
        if received is None:
            return True
        return self._judge(*received, decide=False)

    def _settle(self, *, decide: bool) -> bool:
        """Judge every step reported so far, waiting for the ranks; False when one was rolled back.

        Before acting on the state in memory outside a step boundary: the end of the session (which
        also ``decide``s), a save asked for by the script (which leaves the decisions to the next step).
        """
        if not self._receive():
            return False
        return not self._agreement.pending or self._flush(time.monotonic(), decide=decide)

    def _flush(self, now: float, *, decide: bool = True) -> bool:
        """The ranks agree on the pending steps (the last one just reported), then judge and close each."""
        pending = self._agreement.take()
        phases = self._phases.take()[0] if self._phases is not None else []
        agreed = self._agreement.agree(
            pending, now, preempt=self._guard.raised_here, seconds_due=self._ckpt.seconds_due(now), phases=phases
        )
        return self._judge(pending, agreed, decide=decide)

    def _judge(self, pending: Sequence[PendingStep], agreed: Agreement, *, decide: bool) -> bool:
        """Close each agreed step; at a decision point (``decide``) the last one also decides. False: rolled back."""
        self.step -= len(pending)  # back to the first pending step: each is counted once judged
        self.data_position -= sum(p.batches for p in pending)
        if self._phases is not None:
            self._phases.add(COLLECTIVE, self._agreement.last_wait)
            self._reporter.note_phases(agreed.rank_phases, len(pending), self.step + len(pending))
        self._guard.note_agreement(agreed.preempt)
        if decide:
            self._ckpt.note_agreed_due(agreed.seconds_due or self._clock_due)
            self._clock_due = False
        else:
            self._clock_due = self._clock_due or agreed.seconds_due
        self._reporter.note_ranks(agreed)
        for i, (step, judged) in enumerate(zip(pending, agreed.steps, strict=True)):
            as_agreed = dataclasses.replace(step, values=judged.losses, tokens=judged.tokens)
            if not self._close_step(as_agreed, judged.ended, decide=decide and i == len(pending) - 1):
                return False  # rolled back: the steps after the bad one are thrown away
        return True

    def _close_step(self, step: PendingStep, now: float, *, decide: bool) -> bool:
        """Judge one step and count it; at a decision point also inject, preempt and save. False: rolled back."""
        values, batches = step.values, step.batches
        verdict, micro = self.monitor.judge_step(values)
        value = step_loss(values)
        if not verdict.healthy:
            position, bad_end = _bad_batches(values, micro, batches, self.data_position)
            loss = values[micro] if micro is not None else value
            self._reporter.unhealthy_step(self.step + 1, loss, verdict.reason, verdict.zscore, position, micro, values)
            if self.health_policy.action == "rollback":
                self._rollback(self.step + 1, skip_to=bad_end + self.health_policy.skip_extra_batches)
                return False
            self._ckpt.note_unhealthy()
        else:
            self.monitor.accept(value)
        self._ckpt.note_step(self.step + 1, step.seconds)
        self.step += 1
        self.data_position += batches
        self.last_loss = value
        self._ckpt.note_metrics(self.step, step.metrics)
        self._guard.note_step(self.step)
        last = self.step == self.total_steps
        self._reporter.step(
            self.step, value, step.tokens, self.data_position, step.seconds, now, step.metrics, last=last
        )
        injected = self.inject_rollback_at is not None and self.inject_rollback_at <= self.step
        if injected and not self._injected_rollback and decide:
            self._injected_rollback = True
            self._rollback(self.step, skip_to=None, injected=True)
            return False
        if not decide:
            return True
        if self._guard.decide() is GuardVerdict.SAVE_AND_EXIT:
            self._preempt()
        with self._stall(CHECKPOINT):
            if self._ckpt.take_due(now):
                bad = self.nonfinite_state()
                if bad is not None and self.health_policy.action == "rollback":
                    self._roll_back_bad_state(bad, "before a checkpoint")
                    return False
                self._save("periodic", bad)
            self._ckpt.snapshot(self._position(), step.seconds)  # checkpoint.memory: a RAM copy when one is due
            self._step_started = time.monotonic()
            self._agreement.progress(self.step)
            if self._ckpt.write_done():
                self._finish_write()  # a failed write is dealt with where every rank waits for it, together
        return True

    @contextlib.contextmanager
    def _stall(self, phase: int) -> Iterator[None]:
        """Count the time of the block as ``phase`` of the step boundary (a checkpoint stall)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            if self._phases is not None:
                self._phases.add(phase, time.perf_counter() - started)

    def log(self, kind: str = EventKind.METRICS.value, **data: Any) -> None:
        """Record anything else (validation loss, test metrics) in the job's event log.

        A value of ``checkpoint.keep_best``'s metric that beats every earlier one is saved with
        the state it was measured on, so the best checkpoint exists and survives pruning.
        """
        best = self.policy.keep_best
        if self.group.distributed and best is not None and best.metric in data:
            value = data[best.metric]
            if isinstance(value, (int, float)) and not isinstance(value, bool):  # the mean over ranks decides
                data = {**data, best.metric: self._agreement.mean(float(value))}
        kind = str(kind)  # a plain str, also for an EventKind: the trainer state is loaded with weights_only
        self.events.emit(kind, step=self.step, **data)
        self._ckpt.logged[kind] = self.step
        if self._ckpt.note_metrics(self.step, data) and self.step > 0:
            self.save("best")
        self._ckpt.keep_after_log(self.step)

    # ---- checkpoints -----------------------------------------------------------------------
    def _named_state(self) -> Iterator[tuple[str, Any]]:
        """Every tensor of the model and the optimizer state, named for a message."""
        return self._ckpt.named_state()

    def nonfinite_state(self) -> str | None:
        """The first weight or optimizer tensor holding NaN or inf, or ``None`` (see ``first_nonfinite``).

        Run at every checkpoint save and at the end of training: a loss can be finite while the
        state it leaves behind is not (gradient accumulation, a bad last step). In a group every
        rank's shard is checked.
        """
        return self._agreement.first(first_nonfinite(self._ckpt.named_state()))

    def _roll_back_bad_state(self, bad: str, when: str) -> None:
        """Weights or optimizer state went non-finite while every reported loss was finite."""
        self._voice.say(
            EventKind.UNHEALTHY,
            f"{bad} holds NaN or inf at step {self.step} ({when}), though the reported losses were finite",
            step=self.step,
            reason="nonfinite_state",
            tensor=bad,
            data_position=self.data_position,
        )
        self._rollback(self.step, skip_to=self.data_position)

    def save(self, reason: str = "manual") -> None:
        """Write a checkpoint of every stateful object, the step, cursor, plain values and RNG states.

        In a group the steps not yet agreed on are judged first, the ranks waiting for each other: a
        checkpoint only holds a state the ranks found healthy. Nothing is saved when one of them was
        rolled back (the loop is back on a saved state).
        """
        if self.group.distributed and not self._settle(decide=False):
            return
        self._save(reason, self.nonfinite_state())

    def _run_shape(self) -> RunShape:
        return RunShape(self.group.world_size, self.global_batch, self.total_steps, self.epoch_batches)

    def _position(self) -> LoopPosition:
        history = tuple(self.monitor.history)
        return LoopPosition(self.step, self.data_position, self.last_loss, history, self.rollbacks, self._run_shape())

    def _save(self, reason: str, nonfinite: str | None) -> None:
        self._requeue_if(self._ckpt.save(self._position(), reason, nonfinite))

    def _finish_write(self) -> None:
        """Wait for the checkpoint being written in the background (if any), then record it."""
        self._requeue_if(self._ckpt.finish_write())

    def _requeue_if(self, verdict: SaveVerdict) -> None:
        """A save that found the disk full where the job must not go on without it: exit to be requeued."""
        if verdict is SaveVerdict.REQUEUE:
            raise Preempted(self.step)

    def restore(self, before_step: int | None = None, cause: str = "start") -> CheckpointInfo | None:
        """Load the newest complete, verified, healthy checkpoint of this job; report the ones skipped."""
        restored = self._ckpt.restore(before_step=before_step, cause=cause)
        if restored is None:
            return None
        at = restored.position
        self.step, self.data_position, self.rollbacks, self.last_loss = at.step, at.data_position, at.rollbacks, at.loss
        self.monitor = HealthMonitor(self.health_policy, list(at.health_history))
        return restored.info

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
        redone_seconds = self._ckpt.work_since_save() + (started - self._step_started)
        rollbacks = self.rollbacks + (0 if injected else 1)
        if self.restore(before_step=bad_step, cause="rollback") is None:
            raise HealthError(_no_checkpoint_before(bad_step, self.step))
        self.rollbacks = rollbacks
        self._ckpt.rolled_back(self.step)
        target = self.data_position if skip_to is None else skip_to
        self._reporter.rolled_back(
            from_step=bad_step,
            to_step=self.step,
            skip_from=self.data_position,
            skip_to=target,
            redone_seconds=redone_seconds,
            restore_seconds=time.monotonic() - started,
            injected=injected,
        )
        self.data_position = target
        self._step_started = time.monotonic()
        self._agreement.progress(self.step)


def _no_checkpoint_before(bad_step: int, step: int) -> str:
    """Why a rollback found nothing to return to: too few saves, or a model bad from its first step."""
    if step > 0:
        return (
            f"step {bad_step} is unhealthy and no healthy checkpoint precedes it; "
            "save more often (checkpoint.every_steps) so there is one to return to"
        )
    return (
        f"step {bad_step} is unhealthy before any update of the model: its initialisation or the first "
        "batch produced the NaN or inf, so no checkpoint can help; check the model's initialisation "
        "(uninitialised tensors, such as `torch.empty` or `to_empty` without a reset) and the first batch"
    )


def _bad_batches(values: list[float], micro: int | None, batches: int, data_position: int) -> tuple[int, int]:
    """The data position of an unhealthy step's offending micro-batch, and the end of what a rollback skips.

    A step of several micro-batches that each read the same number of positions skips up to the
    bad one; otherwise the whole step's batches.
    """
    per = batches // len(values) if len(values) > 1 and batches % len(values) == 0 else 0
    position = data_position + (micro or 0) * per
    return position, (position + per if per and micro is not None else data_position + batches)


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
