"""The checkpoint manager: what a training process saves, when, where, and how it comes back.

It owns the checkpoint folder (``runtime.checkpoint.CheckpointDir``), the interval
(``every_steps``, ``every_seconds``, ``every: auto`` re-estimated by ``runtime.interval``), the
background writer (``checkpoint.async``), ``keep``/``keep_best``, and the state a checkpoint holds
besides the loop's position: every stateful object, the plain values, the log marks and the best
metric. It answers the session with verdicts (:class:`SaveVerdict`, :class:`Restored`); the session
decides what they mean for the loop (a ``REQUEUE`` becomes ``Preempted``).

A checkpoint of this job written for another model is an error, never a silent fallback: the model's
fingerprint is compared with the manifest's, and a mismatch names the first differing tensor.

How one checkpoint is written, found and loaded lives in ``ckpt_io``; this module decides when,
keeps the books, and says what happened.

Imports: ``ckpt_io``, ``announce``, ``runtime.checkpoint``, ``runtime.group``, ``runtime.state``,
``runtime.interval``, ``runtime.memtier``, ``gpufleet.jobs``; nothing of the session.

The memory tier (``checkpoint.memory``; DESIGN.md: own RAM, then a peer's RAM, then disk, each
verified) is a ``runtime.memtier.RamTier`` owned here: ``snapshot`` hands it the same state a disk
checkpoint of this rank holds (:meth:`CheckpointManager.plain_state`), ``restore`` asks it first
(a copy older than the newest disk checkpoint is stale), and :class:`Restored` names the tier used.
A copy from this node's shared memory is loaded mapped (``torch.load(mmap=True)``): a module's
``load_state_dict`` copies out of the mapping, and every other object's tensors are copied once
before its ``load_state_dict`` (an optimizer keeps the tensors it is given), so no tensor of the
run keeps a copy's file alive. In a group, the steps between two agreements are snapshotted
before they are judged (:meth:`CheckpointManager.snapshot`, ``judged=False``); only ``every_steps:
auto``'s measured snapshots need the ranks to meet (:meth:`CheckpointManager.snapshot_meets`).
"""

from __future__ import annotations

import copy
import enum
import math
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.errors import CheckpointError, CheckpointSpaceError
from gpufleet.jobs.events import EventKind
from gpufleet.runtime.checkpoint import CheckpointDir, CheckpointInfo, CheckpointManifest, model_fingerprint
from gpufleet.runtime.components.announce import Announcer
from gpufleet.runtime.components.ckpt_io import (
    Stateful,
    check_fits,
    check_strategy,
    check_values,
    checkpoint_write,
    find_candidate,
    load_objects,
    load_sharded_state,
    named_state,
)
from gpufleet.runtime.dist_state import reseeded_rng
from gpufleet.runtime.group import Group
from gpufleet.runtime.interval import AutoInterval, PreemptionRate, rate_from
from gpufleet.runtime.memtier.tier import MemoryCopy, RamTier, TierPlace
from gpufleet.runtime.state import RunShape, capture_rng, hyperparameter_changes, restore_rng, run_change
from gpufleet.spec import CheckpointPolicy


@dataclass(frozen=True, slots=True)
class LoopPosition:
    """Where the training loop stands: what a checkpoint records of it besides the objects' states."""

    step: int
    data_position: int
    loss: float | None
    health_history: tuple[float, ...] = ()
    rollbacks: int = 0
    run: RunShape | None = None
    """The run's shape as the loop knows it (saving), or as the checkpoint recorded it (restored)."""


@dataclass(frozen=True, slots=True)
class Restored:
    """A checkpoint loaded into every object, the RNG states and the manager's own state."""

    info: CheckpointInfo
    position: LoopPosition
    seconds: float
    tier: str = "disk"
    """Where it came from: ``own`` (this node's shared memory), ``peer`` (a keeper's RAM) or ``disk``."""


class SaveVerdict(enum.StrEnum):
    SAVED = "saved"
    """Committed (its event written)."""
    WRITING = "writing"
    """Handed to the background writer; committed by a later ``finish_write``."""
    NOTHING = "nothing"
    """``finish_write`` with no write in flight."""
    FAILED = "failed"
    """The disk was full: not saved, the last good checkpoint kept, training goes on."""
    REQUEUE = "requeue"
    """The disk was full and the attempt must end asking to be requeued (preempt, final, ``on_no_space``)."""


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


class CheckpointManager:
    """Save, restore and roll back the state of one training process (a rank: its part of the group's)."""

    def __init__(
        self,
        root: Path,
        *,
        objects: Mapping[str, Stateful],
        values: dict[str, Any],
        group: Group,
        voice: Announcer,
        policy: CheckpointPolicy | None = None,
        job: str | None = None,
        resume: str = "auto",
        preemption_rate: PreemptionRate | None = None,
        clock: Callable[[], float] = time.monotonic,
        memory: TierPlace | None = None,
    ) -> None:
        self.policy = policy or CheckpointPolicy()
        best = self.policy.keep_best
        self.ckpts = CheckpointDir(root, keep=self.policy.keep, keep_best=(best.metric, best.mode) if best else None)
        self.auto_interval = (
            AutoInterval(preemption_rate or rate_from({}, self.policy)) if self.policy.every == "auto" else None
        )
        """``checkpoint: {every: auto}``: the interval re-estimated from this run's saves (``runtime.interval``)."""
        self.objects = dict(objects)
        self.values = values
        """Plain values saved with every checkpoint and restored with it (the session's ``values``, shared)."""
        self.group, self.voice, self.job, self.resume = group, voice, job, resume
        self.fingerprint: str | None = None
        self.logged: dict[str, int] = {}
        """Kind -> the last step it was logged at; saved, so a resume right after an evaluation skips it."""
        self.best: float | None = None
        self._metric: tuple[int, float] | None = None
        self._after_log: dict[int, dict[str, Any]] = {}
        """Step -> plain values, log marks, RNG and best metric just after a ``log`` at a step that has a
        checkpoint: a rollback to that checkpoint resumes after the evaluation instead of repeating it."""
        self.last_saved_step: int | None = None
        self.saved_run: RunShape | None = None
        """What a step and the run meant in the checkpoint restored at start (``None``: fresh, or not recorded)."""
        self._clock = clock
        self._last_save_time = clock()
        self._work_seconds = 0.0
        """Seconds of the steps closed since the last save: the work a rollback throws away."""
        self.unhealthy_since_save = False
        self._owed = False
        self._agreed_seconds_due = False
        self._writer: ThreadPoolExecutor | None = None
        self._write_group: Group | None = None
        """Distributed ``checkpoint.async``: the ranks' process group for the background writes."""
        self._in_flight: _Write | None = None
        self.tier = (
            RamTier(self.policy.memory, memory, group=group, voice=voice, job=job)
            if self.policy.memory is not None and memory is not None
            else None
        )
        """``checkpoint.memory``: this rank's memory tier (``None``: disk only)."""

    @property
    def model(self) -> Stateful:
        return self.objects["model"]

    # ---- opening and closing -------------------------------------------------------------
    def prepare(self, strategy: str | None = None) -> None:
        """Collective, before the first restore: clear temporaries, check the strategy, fingerprint the model.

        ``strategy`` is the job's ``distributed.strategy``; ``fsdp`` on a model without parameters
        shards nothing, so it is refused. ``resume: never`` over another run's checkpoints is refused.
        """
        if self.group.is_main:
            self.ckpts.clean_temporaries()
        self.group.barrier()
        check_strategy(self.model, self.group, strategy)
        self.fingerprint = model_fingerprint(self.model.state_dict())
        if self.tier is not None and strategy == "fsdp":  # a rank holds shards: only the disk reshards them
            self.tier.close()
            self.tier = None
            self.voice.emit(EventKind.TIER_SKIPPED, tier="own", step=None, reason="sharded")
        if self.resume != "never" or (self.job is not None and self.voice.events.attempt > 1):
            return
        found = self.ckpts.scan(verify=False)
        if found:
            raise CheckpointError(
                f"resume: never, but {self.ckpts.root} already holds checkpoints "
                f"(steps {found[0].step}..{found[-1].step}) of an earlier run: "
                "remove them or choose another checkpoint directory"
            )

    def start_writer(self) -> None:
        """Collective with ``checkpoint.async``: the thread (and a group's own process group) for background writes."""
        if self.policy.async_save:
            self._write_group = self.group.side_group()
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpufleet-ckpt-write")

    def announce_interval(self) -> None:
        if self.auto_interval is not None:
            interval = self.auto_interval.event()
            self.voice.say(EventKind.CHECKPOINT_INTERVAL, f"checkpoint every: auto: {interval['why']}", **interval)

    def check_start(self, restored: bool, step: int, total_steps: int | None) -> None:
        """After the restore at start: ``resume: must`` needs a checkpoint; the last step leaves nothing to do."""
        if not restored and self.resume == "must":
            raise CheckpointError(
                f"resume: must, but {self.ckpts.root} holds no restorable checkpoint; "
                "run with resume: auto to start from scratch"
            )
        if total_steps is not None and step >= total_steps:
            self.voice.say(
                EventKind.NOTHING_TO_TRAIN,
                f"{self.ckpts.root} is already at step {step} of {total_steps}: nothing to train "
                "(resume: never, or remove the checkpoints, to start over)",
                step=step,
            )

    def check_run(self, run: RunShape, step: int, data_position: int) -> None:
        """As the loop starts: a resumed run whose global batch or ``total_steps`` changed says so.

        Announced, not refused: ``gpufleet resize`` is a deliberate change, and a script with a
        per-rank batch cannot keep its global batch on every world size; what must not happen is
        that the run changes without anybody being told (``run_changed``, on stdout too).
        """
        fields = run_change(self.saved_run, run, data_position) if self.saved_run is not None else None
        if fields is not None:
            message = str(fields.pop("message"))
            self.voice.say(EventKind.RUN_CHANGED, message, step=step, **fields)

    def close_writer(self) -> None:
        """Wait for the background threads to end (the caller finished or abandoned the write in flight)."""
        if self.tier is not None:
            self.tier.close()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    # ---- when to save ----------------------------------------------------------------------
    def note_step(self, step: int, seconds: float) -> None:
        """A step closed in ``seconds``; ``step`` is the count of steps after it."""
        self._work_seconds += seconds
        if self.auto_interval is not None:
            self.auto_interval.note_step(seconds)
        self._owed |= self.policy.every_steps is not None and step % self.policy.every_steps == 0
        if self.tier is not None:
            self.tier.note_judged(step, healthy=not self.unhealthy_since_save)

    def note_unhealthy(self) -> None:
        """A step was unhealthy and kept (``health.action`` is not rollback): the next save is marked unhealthy."""
        self.unhealthy_since_save = True

    def note_agreed_due(self, due: bool) -> None:
        """Distributed: whether a time-based save was due on any rank at the last step agreement."""
        self._agreed_seconds_due = due

    def seconds_due(self, now: float) -> bool:
        """``every_seconds`` or ``every: auto``'s interval has passed since the last save (this rank's clock)."""
        since, p, auto = now - self._last_save_time, self.policy, self.auto_interval
        return (p.every_seconds is not None and since >= p.every_seconds) or (auto is not None and auto.due(since))

    def take_due(self, now: float) -> bool:
        """At a decision point: save now? (a multiple of ``every_steps`` was reached, or the interval passed)."""
        if self._owed:
            self._owed = False
            return True
        return self._agreed_seconds_due if self.group.distributed else self.seconds_due(now)

    def work_since_save(self) -> float:
        return self._work_seconds

    # ---- log marks and the best metric --------------------------------------------------------
    def note_metrics(self, step: int, data: Mapping[str, Any]) -> bool:
        """Remember the ``keep_best`` metric measured at ``step``; True when it is a new best."""
        best = self.policy.keep_best
        value = data.get(best.metric) if best else None
        if best is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        self._metric = (step, float(value))
        improved = self.best is None or (value < self.best if best.mode == "min" else value > self.best)
        if improved:
            self.best = float(value)
        return improved

    def keep_after_log(self, step: int) -> None:
        """After a ``log`` at ``step``: if ``step`` has a checkpoint, a rollback to it resumes from here."""
        in_flight = self._in_flight is not None and self._in_flight.step == step
        if self.last_saved_step != step and not in_flight:
            return
        self._after_log[step] = {
            "values": copy.deepcopy(self.values),
            "logged": dict(self.logged),
            "rng": capture_rng(),
            "best": self.best,
        }
        for old in sorted(self._after_log)[: -(self.policy.keep + 2)]:
            del self._after_log[old]

    def named_state(self) -> Iterator[tuple[str, Any]]:
        """Every tensor of the model and the optimizer state, named for a message."""
        return named_state(self.objects)

    # ---- saving ------------------------------------------------------------------------------
    def save(self, at: LoopPosition, reason: str, nonfinite: str | None) -> SaveVerdict:
        """Write a checkpoint of ``at`` and every object (``periodic`` with ``checkpoint.async``: in the background)."""
        healthy = not self.unhealthy_since_save and nonfinite is None
        check_values(self.values)
        trainer = self._trainer(at)
        best = self.policy.keep_best
        metric = self._metric
        fields: dict[str, Any] = {
            "healthy": healthy,
            "loss": at.loss,
            "data_position": at.data_position,
            "reason": reason,
            "meta": {"attempt": self.voice.events.attempt},
            "job": self.job,
            "fingerprint": self.fingerprint,
            "metrics": {best.metric: metric[1]} if best and metric and metric[0] == at.step else {},
        }
        background = self._writer is not None and reason == "periodic"
        earlier = self.finish_write()  # one write at a time, in step order
        if earlier is SaveVerdict.REQUEUE:
            return earlier
        started = time.perf_counter()
        through = (self._write_group or self.group) if background else None
        write = checkpoint_write(self.ckpts, self.group, self.objects, at.step, trainer, fields, background=through)
        if background and self._writer is not None:
            stall = time.perf_counter() - started
            self._in_flight = _Write(at.step, reason, healthy, nonfinite, stall, self._writer.submit(write))
            self._mark_saved_now()
            return SaveVerdict.WRITING
        try:
            manifest = write()
        except CheckpointSpaceError as err:
            return self._failed(err, at.step, reason)
        self._saved(manifest, at.step, reason, healthy, nonfinite)
        return SaveVerdict.SAVED

    def _trainer(self, at: LoopPosition) -> dict[str, Any]:
        """The trainer entry of a checkpoint (without the RNG states, captured by the writer)."""
        return {
            "step": at.step,
            "data_position": at.data_position,
            "health_history": list(at.health_history),
            "rollbacks": at.rollbacks,
            "objects": sorted([*self.objects, "trainer"]),
            "values": dict(self.values),
            "logged": dict(self.logged),
            "best": self.best,
            "run": (at.run or RunShape(self.group.world_size)).to_state(),
        }

    def plain_state(self, at: LoopPosition) -> dict[str, Any]:
        """What a single-process checkpoint of this rank holds: every object's state, the trainer and the RNG."""
        plain: dict[str, Any] = {name: obj.state_dict() for name, obj in self.objects.items()}
        plain["trainer"] = {**self._trainer(at), "rng": capture_rng()}
        return plain

    def snapshot_due(self, step: int) -> bool:
        """A memory-tier snapshot is due at ``step``."""
        return self.tier is not None and self.tier.due(step)

    def snapshot_meets(self, step: int) -> bool:
        """A group must meet at ``step`` for its snapshot: only while ``every_steps: auto`` measures.

        A fixed interval falls on the same steps on every rank by construction; ``auto``'s
        measured snapshots end in one all-reduce that picks the interval, taken where the ranks meet.
        """
        return self.tier is not None and self.tier.every is None and self.tier.due(step)

    def snapshot(self, at: LoopPosition, step_seconds: float, *, judged: bool = True) -> float | None:
        """At a step boundary: a memory-tier copy of ``at`` when one is due; the seconds the loop waited.

        ``judged=False``: a group's step not yet judged by the ranks' agreement (the copy says so).
        """
        if self.tier is None:
            return None
        check_values(self.values)
        loss = at.loss if at.loss is not None and math.isfinite(at.loss) else None
        fields = {
            "healthy": not self.unhealthy_since_save,
            "loss": loss,
            "job": self.job,
            "fingerprint": self.fingerprint,
        }
        return self.tier.snapshot(
            at.step, lambda: self.plain_state(at), fields=fields, step_seconds=step_seconds, judged=judged
        )

    def write_done(self) -> bool:
        """The background write in flight finished without an error (a failed one is met where all ranks wait)."""
        write = self._in_flight
        return write is not None and write.future.done() and write.future.exception() is None

    def writing_step(self) -> int | None:
        return self._in_flight.step if self._in_flight is not None else None

    def finish_write(self) -> SaveVerdict:
        """Wait for the checkpoint being written in the background (if any), then record it."""
        write, self._in_flight = self._in_flight, None
        if write is None:
            return SaveVerdict.NOTHING
        try:
            manifest = write.future.result()
        except CheckpointSpaceError as err:
            return self._failed(err, write.step, write.reason)
        self._saved(manifest, write.step, write.reason, write.healthy, write.nonfinite, stall=write.stall_seconds)
        return SaveVerdict.SAVED

    def _mark_saved_now(self) -> None:
        self._last_save_time = self._clock()
        self.unhealthy_since_save = False
        self._work_seconds = 0.0

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
        self.last_saved_step = step if self.last_saved_step is None else max(step, self.last_saved_step)
        if stall is None:
            self._mark_saved_now()
        self.voice.emit(
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
            self.voice.emit(EventKind.CHECKPOINT_INTERVAL, **self.auto_interval.event())

    def _failed(self, err: CheckpointSpaceError, step: int, reason: str) -> SaveVerdict:
        self.voice.say(
            EventKind.CHECKPOINT_FAILED,
            f"checkpoint at step {step} not saved: {err}; the last good checkpoint is kept",
            step=step,
            reason=reason,
            needed=err.needed,
            free=err.free,
        )
        self._last_save_time = self._clock()
        if reason in ("preempt", "final") or self.policy.on_no_space == "requeue":
            return SaveVerdict.REQUEUE
        return SaveVerdict.FAILED

    # ---- restoring -----------------------------------------------------------------------------
    def restore(self, *, before_step: int | None = None, cause: str = "start") -> Restored | None:
        """Load the newest complete, verified, healthy checkpoint of this job; report the ones skipped."""
        if self.resume == "never" and cause == "start" and (self.job is None or self.voice.events.attempt == 1):
            self.voice.emit(EventKind.RESTORE, step=None, seconds=0.0, cause=cause)
            return None
        started = time.perf_counter()
        if self.tier is not None:
            restored = self._restore_memory(self.tier, before_step, cause, started)
            if restored is not None:
                return restored
        info, manifest, state, skipped = find_candidate(self.ckpts, self.group, self.objects, self.job, before_step)
        for bad in skipped:
            self.voice.say(
                EventKind.CHECKPOINT_SKIPPED,
                f"skipped {bad.path.name}: {bad.problem}",
                step=bad.step,
                path=str(bad.path),
                reason=bad.problem,
            )
        if info is None or manifest is None:
            if before_step is None:
                self.voice.emit(EventKind.RESTORE, step=None, seconds=time.perf_counter() - started, cause=cause)
            return None
        optimizer = self.objects.get("optimizer")
        current_optimizer = optimizer.state_dict() if cause == "start" and optimizer is not None else None
        changes: list[str] = []
        if state is None:  # sharded
            args = (self.ckpts, self.group, self.objects, info.path, manifest, self.fingerprint)
            trainer, rng = load_sharded_state(*args)
        else:
            check_fits(info.path, self.model, self.fingerprint, manifest.fingerprint, state)
            changes = hyperparameter_changes(state.get("optimizer"), current_optimizer) if current_optimizer else []
            load_objects(info.path, self.objects, state)
            trainer = state["trainer"]
            rng = trainer["rng"]
        position = LoopPosition(
            step=int(trainer["step"]),
            data_position=int(trainer["data_position"]),
            loss=manifest.loss,
            health_history=tuple(float(x) for x in trainer["health_history"]),
            rollbacks=int(trainer.get("rollbacks", 0)),
            run=RunShape.from_state(trainer.get("run")),
        )
        self._load_marks(trainer, position.step, rng, cause)
        if cause == "start":  # compared with this run's as the loop starts (an older checkpoint has none)
            self.saved_run = position.run
        self.last_saved_step, self._last_save_time = position.step, self._clock()
        seconds = time.perf_counter() - started
        self._announce_restore(info, position.step, seconds, cause, changes)
        return Restored(info, position, seconds)

    def _newest_disk_step(self, before_step: int | None) -> int | None:
        """The newest healthy checkpoint of this job on disk (manifests only): a memory copy older is stale."""
        try:
            infos = self.ckpts.scan(verify=False)
        except (CheckpointError, OSError):
            return None
        steps = [
            i.step
            for i in infos
            if i.manifest is not None
            and i.problem is None
            and (before_step is None or i.step < before_step)
            and (self.job is None or i.manifest.job in (None, self.job))
        ]
        return max(steps, default=None)

    def _restore_memory(self, tier: RamTier, before_step: int | None, cause: str, started: float) -> Restored | None:
        """Collective: load the copy the ranks agreed on (own, then peer RAM), or ``None`` to read the disk."""
        disk_step = self._newest_disk_step(before_step)
        got: MemoryCopy | None = tier.restore(
            before_step=before_step, disk_step=disk_step, fingerprint=self.fingerprint
        )
        if got is None:
            return None
        info = CheckpointInfo(Path(got.where), got.header.step, None, None)
        optimizer = self.objects.get("optimizer")
        current = optimizer.state_dict() if cause == "start" and optimizer is not None else None
        changes = hyperparameter_changes(got.state.get("optimizer"), current) if current else []
        load_objects(info.path, self.objects, _owned(self.objects, got.state) if got.tier == "own" else got.state)
        trainer = got.state["trainer"]
        position = LoopPosition(
            step=int(trainer["step"]),
            data_position=int(trainer["data_position"]),
            loss=got.header.loss,
            health_history=tuple(float(x) for x in trainer["health_history"]),
            rollbacks=int(trainer.get("rollbacks", 0)),
            run=RunShape.from_state(trainer.get("run")),
        )
        self._load_marks(trainer, position.step, trainer["rng"], cause)
        if cause == "start":
            self.saved_run = position.run
        # The disk holds only what it holds: a preemption right after this saves the restored step there.
        self.last_saved_step, self._last_save_time = disk_step, self._clock()
        seconds = time.perf_counter() - started
        self._announce_restore(info, position.step, seconds, cause, changes, tier=got.tier)
        return Restored(info, position, seconds, tier=got.tier)

    def _load_marks(self, trainer: Mapping[str, Any], step: int, rng: Any, cause: str) -> None:
        """The RNG states, values, log marks and best metric of a loaded checkpoint (or of just after its log)."""
        if rng is not None:
            restore_rng(rng)
        else:  # another world size: no saved RNG state for this rank
            reseeded_rng(step, self.group.rank)
            self.voice.emit(EventKind.RNG_RESEEDED, step=step, world_size=self.group.world_size)
        self.values.update(trainer.get("values") or {})
        self.logged = {str(k): int(v) for k, v in (trainer.get("logged") or {}).items()}
        best = trainer.get("best")
        self.best = float(best) if isinstance(best, (int, float)) and not isinstance(best, bool) else None
        after = self._after_log.get(step) if cause == "rollback" else None
        if after is not None:  # this process already ran what was logged at this step: carry on after it
            self.values.update(copy.deepcopy(after["values"]))
            self.logged = dict(after["logged"])
            self.best = after["best"]
            restore_rng(after["rng"])

    def _announce_restore(
        self, info: CheckpointInfo, step: int, seconds: float, cause: str, changes: list[str], tier: str = "disk"
    ) -> None:
        self.voice.emit(EventKind.RESTORE, step=step, seconds=seconds, path=str(info.path), cause=cause, tier=tier)
        if cause == "start" and self.auto_interval is not None:
            self.auto_interval.note_restore(seconds)  # logged with the first interval, as training starts
        if cause == "start":
            where = "" if tier == "disk" else f" ({tier} memory copy)"
            self.voice.print(f"resumed from {info.path}{where} (step {step}) in {seconds:.2f}s")
        if changes:
            self.voice.say(
                EventKind.CONFIG_CHANGED,
                f"{info.path.name} restores optimizer settings that differ from this run's: {'; '.join(changes)}. "
                "The checkpoint's values are used; start over with resume: never to apply the new ones",
                changes=changes,
            )

    # ---- rolling back --------------------------------------------------------------------------
    def rolled_back(self, step: int) -> None:
        """Collective, after a rollback restored ``step``: the checkpoints after it and their marks go."""
        if self.group.is_main:
            self.ckpts.drop_after(step)
        if self.tier is not None:
            self.tier.drop_after(step)
        self.group.barrier()
        self._after_log = {k: v for k, v in self._after_log.items() if k <= step}
        self._work_seconds = 0.0
        self.unhealthy_since_save = False
        self._owed = False


def _owned(objects: Mapping[str, Stateful], state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the tensors of every object that is not a module copied out of the copy's mapping.

    A module's ``load_state_dict`` copies into its own parameters; an optimizer's (or another
    object's) may keep the tensors it is given, and a tensor of a mapped file keeps the file's
    shared memory in use after the file is gone.
    """
    import torch

    def own(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, dict):
            return {k: own(v) for k, v in value.items()}
        if isinstance(value, list):
            return [own(v) for v in value]
        if isinstance(value, tuple):
            return tuple(own(v) for v in value)
        return value

    return {
        name: value if isinstance(objects.get(name), torch.nn.Module) or name == "trainer" else own(value)
        for name, value in state.items()
    }


__all__ = ["CheckpointManager", "LoopPosition", "Restored", "SaveVerdict"]
