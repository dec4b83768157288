"""Where a rank's step time goes: data wait, compute, collective, optimizer, checkpoint.

Every second between two step boundaries of a rank falls in exactly one phase, from hooks the
training loop does not see:

- a forward pre-hook on the model: the time from the end of the previous step (or of the last
  backward) to the first forward is **data_wait** (the batch being fetched);
- a post-accumulate-grad hook on each parameter marks when this rank's last gradient was ready;
  the backward ends in a callback queued behind the engine's own (DDP's bucketed all-reduce,
  FSDP's reduce-scatter wait in theirs): from the last gradient to that end is **collective**,
  the time this rank was blocked waiting for the others' gradients; before it, **compute**;
- the optimizer's step pre- and post-hooks bound **optimizer**;
- at the step boundary the session adds what it measured itself: the checkpoint stall
  (**checkpoint**) and its wait in the rank agreement (**collective**); anything else (user code
  between the backward and the optimizer, an evaluation after it) is **compute**.

``straggler_wait`` is derived across ranks at each agreement (:func:`straggler_waits`): the part of
a rank's collective time beyond the least any rank spent there in the same steps, i.e. the time it
waited for a slower rank rather than for the wire.

On CUDA the host runs ahead of the GPU, so host clocks around asynchronous kernels measure
launches, not work: there each mark records a CUDA event on the current stream, and the phases
are the elapsed times between events, read when the totals are taken (at the agreement, where the
session synchronises anyway). To keep that to a few events a step, only the parameter whose
gradient came last in the previous backward records one.

The hooks cost a clock read and two assignments each (``bench/rank_phases.py``: under 1 % of a
2-rank DDP step). ``GPUFLEET_PHASE_TIMING=0`` switches them off.

Each rank also publishes its current phase and a heartbeat (bumped at every forward) in a
16-byte file of the attempt's rank folder (:class:`PhaseBoard`, memory-mapped, no system call
per update), so the watchdog of another rank can say where a frozen rank stopped and whether it
still moves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpufleet.jobs.rank_phases import PHASES as REPORTED  # the keys of rank_phase_s and phase_totals_s
from gpufleet.jobs.rank_phases import STRAGGLER_WAIT
from gpufleet.jobs.rank_phases import TIMED_PHASES as PHASES  # the order of the agreement vector
from gpufleet.runtime.board import (
    AFTER_BACKWARD,
    AFTER_OPTIMIZER,
    AT_BOUNDARY,
    AT_START,
    BOARD_PHASE,
    IN_BACKWARD,
    IN_FORWARD,
    IN_OPTIMIZER,
    PhaseBoard,
    board_path,
)

DATA, COMPUTE, COLLECTIVE, OPTIMIZER, CHECKPOINT = range(5)
TRAIN = 5
"""Not a phase: the work of a training forward (gradients on) and its backward. An evaluation, user code and
the session's bookkeeping are left out, so it is what ranks compare on when one is slow (an evaluation every
few steps, as long on every rank, would drown the difference). On CUDA the GPU time from the forward to the
last gradient; on the host the CPU time of the rank's thread over the forward and backward, which does not
count the time the thread was kept off its CPU by others (the gloo workers, another process): on a shared
host those make the wall time of equal work differ by tens of percent between ranks."""


def uses_cuda(model: Any) -> bool:
    """Whether the model's parameters live on a CUDA device (then the phases are timed with CUDA events)."""
    if not isinstance(model, torch.nn.Module):
        return False
    first = next(iter(model.parameters()), None)
    return first is not None and first.device.type == "cuda"


class _HostMarks:
    """Marks are host clock readings."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock

    def now(self) -> Any:
        return self.clock()

    @staticmethod
    def elapsed(a: Any, b: Any) -> float:
        return max(0.0, float(b) - float(a))


class _CudaMarks:
    """Marks are CUDA events on the current stream; elapsed times are read once the events completed."""

    def now(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        return event

    @staticmethod
    def elapsed(a: Any, b: Any) -> float:
        b.synchronize()
        return max(0.0, float(a.elapsed_time(b)) / 1000.0)


class PhaseClock:
    """The hooks of one rank and the phase seconds they add up (see the module docstring)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.perf_counter,
        work_clock: Callable[[], float] = time.thread_time,
        cuda: bool = False,
    ) -> None:
        self._marks: _HostMarks | _CudaMarks = _CudaMarks() if cuda else _HostMarks(clock)
        self._host = not cuda
        self._clock = clock
        self._work_clock = work_clock
        """The host's measure of ``TRAIN``: the CPU time of the thread that runs the forward and backward."""
        self._acc = [0.0] * (len(PHASES) + 1)
        self._train_start: Any = None
        self._segments: list[tuple[int, Any, Any]] = []
        """CUDA: (phase, start event, end event) not yet read."""
        self._state = AT_BOUNDARY
        self._mark: Any = self._marks.now()
        self._last_grad: Any = None
        self._last_param: int | None = None
        self._grad_param: int | None = None
        self._queued = False
        self._handles: list[Any] = []
        self.board: PhaseBoard | None = None
        self.steps = 0
        """Steps closed since the last ``take``."""

    # ---- attaching -------------------------------------------------------------------------
    def attach(self, model: Any, optimizer: Any) -> None:
        """Hook the model (forward, gradients) and the optimizer (step); what is not a torch object is skipped."""
        if isinstance(model, torch.nn.Module):
            self._handles.append(model.register_forward_pre_hook(self._forward))
            for param in model.parameters():
                if param.requires_grad:
                    self._handles.append(param.register_post_accumulate_grad_hook(self._grad))  # type: ignore[no-untyped-call]
        if isinstance(optimizer, torch.optim.Optimizer):
            self._handles.append(optimizer.register_step_pre_hook(self._optimizer_start))
            self._handles.append(optimizer.register_step_post_hook(self._optimizer_end))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.board is not None:
            self.board.close()
            self.board = None

    # ---- the hooks (hot path: keep them to a clock read and a few assignments) ---------------
    def _set(self, state: int) -> None:
        self._state = state
        if self.board is not None:
            self.board.phase(state)

    def _close(self, phase: int, end: Any) -> None:
        if self._host:
            self._acc[phase] += max(0.0, end - self._mark)
        else:
            self._segments.append((phase, self._mark, end))
        self._mark = end

    def _forward(self, module: Any, args: Any) -> None:
        if self.board is not None:
            self.board.beat()
        state = self._state
        if state in (AT_START, AFTER_BACKWARD):
            self._close(DATA, self._marks.now())  # the batch (or the next micro-batch) was being fetched
            self._set(IN_FORWARD)
        elif state in (AFTER_OPTIMIZER, IN_OPTIMIZER):
            self._close(COMPUTE, self._marks.now())
            self._set(IN_FORWARD)
        if self._train_start is None and torch.is_grad_enabled():
            # On the host, the work of the rank's own thread (a thread another process or the gloo workers
            # keep off its CPU is not slower at its work); on CUDA, the GPU's time between events.
            self._train_start = (
                self._work_clock() if self._host else self._mark if state != IN_FORWARD else self._marks.now()
            )

    def _grad(self, param: torch.Tensor) -> None:
        key = id(param)
        self._grad_param = key
        if self._host:
            self._last_grad = self._clock()
        elif self._last_param is None or key == self._last_param:
            self._last_grad = self._marks.now()
        if not self._queued:
            self._queued = True
            self._set(IN_BACKWARD)
            # Queued now, this callback runs when the graph is done; the one it queues runs after every
            # callback queued meanwhile (DDP's finalize, which waits for the last bucket's all-reduce).
            torch.autograd.Variable._execution_engine.queue_callback(self._after_graph)

    def _after_graph(self) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)

    def _backward_end(self) -> None:
        end = self._marks.now()
        self._queued = False
        self._last_param = self._grad_param
        last = self._last_grad if self._last_grad is not None else end
        if self._train_start is not None:
            if self._host:
                self._acc[TRAIN] += max(0.0, self._work_clock() - self._train_start)
            else:
                self._segments.append((TRAIN, self._train_start, last))
            self._train_start = None
        self._close(COMPUTE, last)
        self._close(COLLECTIVE, end)
        self._last_grad = None
        self._set(AFTER_BACKWARD)

    def _optimizer_start(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._close(COMPUTE, self._marks.now())  # clipping, unscaling: compute
        self._set(IN_OPTIMIZER)

    def _optimizer_end(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._close(OPTIMIZER, self._marks.now())
        self._set(AFTER_OPTIMIZER)

    # ---- the step boundary (the session) ------------------------------------------------------
    def restart(self) -> None:
        """Training starts (or starts again after a restore): the first step's data wait counts from here."""
        self._mark, self._added, self._train_start = self._marks.now(), 0.0, None
        self._set(AT_START)

    def end_step(self) -> None:
        """``report`` was called: the step's work is over; the boundary's own time follows."""
        self._close(COMPUTE, self._marks.now())
        self.steps += 1
        self._added, self._train_start = 0.0, None
        self._set(AT_BOUNDARY)

    def add(self, phase: int, seconds: float) -> None:
        """Time the session measured at the boundary (a checkpoint stall, the agreement's wait)."""
        seconds = max(0.0, seconds)
        self._acc[phase] += seconds
        self._added += seconds

    def begin_step(self) -> None:
        """The boundary is over: its time not added as a phase was compute (the session's bookkeeping).

        On CUDA the boundary's bookkeeping is host time the GPU may not have waited for: not counted.
        """
        if self._host:
            now = self._clock()
            self._acc[COMPUTE] += max(0.0, now - self._mark - self._added)
            self._mark = now
        else:
            self._mark = self._marks.now()
        self._added = 0.0
        self._set(AT_START)

    _added = 0.0

    def take(self) -> tuple[list[float], int]:
        """The seconds of each phase, then ``TRAIN``'s, and the steps since the last take; start again from zero."""
        for phase, start, end in self._segments:
            self._acc[phase] += self._marks.elapsed(start, end)
        self._segments.clear()
        out, steps = self._acc, self.steps
        self._acc, self.steps = [0.0] * (len(PHASES) + 1), 0
        return out, steps


def straggler_waits(collective: Sequence[float]) -> list[float]:
    """Each rank's collective seconds beyond the least of any rank over the same steps."""
    floor = min(collective) if collective else 0.0
    return [max(0.0, c - floor) for c in collective]


__all__ = [
    "BOARD_PHASE",
    "CHECKPOINT",
    "COLLECTIVE",
    "COMPUTE",
    "DATA",
    "OPTIMIZER",
    "PHASES",
    "REPORTED",
    "STRAGGLER_WAIT",
    "TRAIN",
    "PhaseBoard",
    "PhaseClock",
    "board_path",
    "straggler_waits",
    "uses_cuda",
]
