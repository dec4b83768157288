"""Naming a straggler online: which rank holds the others up, in which phase, since when, at what cost.

Rank 0 feeds :class:`StragglerDetector` the per-rank phase seconds of each agreement window (every
rank's, summed by the agreement's all-reduce). Over a sliding window of at least ``window`` steps it
compares each rank's **compute** and **data_wait** per step with the median of the other ranks'.
A rank is named when it exceeds that median by ``factor`` in two of the last three windows (one
noisy window names nobody, one quiet window does not hide it) and by a material amount
(``MIN_SHARE`` of the others' step, at least ``MIN_SECONDS``: a data wait that goes from 0.1 ms to
0.3 ms is 3x but costs nothing). The first ``window`` steps of an attempt are not judged.

The cause is the phase: ByteDance's straggler study (OSDI '25) found most stragglers are not
broken hardware but uneven work or data, so "rank 3 waits on its data loader" and "rank 3
computes slowly on host X" call for different fixes.

The tax is what the others paid: the sum over the other ranks of their ``straggler_wait`` (their
collective time beyond the least of any rank) from the first slow step to the last, in seconds of
one rank (times the GPUs a rank holds: GPU-seconds).

Pure arithmetic: no torch, no I/O; the reporter writes the events it returns.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.runtime.components.phases import COMPUTE, DATA, PHASES, TRAIN

WATCHED = {"compute": TRAIN, "data_wait": DATA}
"""The phases a straggler is named in (a collective or optimizer slowdown shows in every rank's step), and
the figure each is compared on: a rank's compute by its training forward and backward (``phases.TRAIN``:
without the evaluations and the user code that every rank runs alike), falling back on all of ``compute``
where no rank reports one (a model the hooks did not see run forward)."""
MIN_SHARE = 0.05
"""A rank's excess must be at least this share of the other ranks' median step to count."""
MIN_SECONDS = 0.001
MAX_FACTOR = 1000.0
"""A factor beyond any useful precision (the others' median can be near zero in data wait)."""
CONFIRM = 2
"""Of the last ``LOOKS`` windows, how many must find a rank slow before it is named (and fast before it ends):
one noisy window names nobody, and one window a descheduled rank loses does not hide a real straggler."""
LOOKS = 3


@dataclass(frozen=True, slots=True)
class Window:
    """One agreement's worth of steps: per rank, its seconds in each phase over those steps."""

    first_step: int
    last_step: int
    phases: tuple[tuple[float, ...], ...]
    """``phases[rank][phase]`` in the order of ``PHASES``, then ``TRAIN`` (when the ranks time it)."""
    straggler_wait: tuple[float, ...]

    @property
    def steps(self) -> int:
        return max(1, self.last_step - self.first_step + 1)


@dataclass(slots=True)
class Straggler:
    """A rank named slow in one phase, and what the others paid for it so far."""

    rank: int
    phase: str
    factor: float
    first_step: int
    last_step: int
    tax_s: float = 0.0
    open: bool = True

    def fields(self, host: str, gpus_per_rank: int, step: int) -> dict[str, object]:
        return {
            "step": step,
            "rank": self.rank,
            "host": host,
            "phase": self.phase,
            "factor": round(self.factor, 3),
            "first_step": self.first_step,
            "last_step": self.last_step,
            "tax_s": round(self.tax_s, 6),
            "gpus_per_rank": gpus_per_rank,
            "status": "named" if self.open else "ended",
        }


@dataclass(slots=True)
class StragglerDetector:
    """See the module docstring. ``observe`` each window; it returns the stragglers named or ended by it."""

    factor: float = 1.5
    """``distributed.straggler_factor``: a rank this many times slower than the others' median is named."""
    window: int = 12
    """Steps the comparison sums over (the newest windows that cover at least this many); also the steps of an
    attempt that are not judged at all (the first ones: allocator, caches, a compilation, pages faulted in)."""
    _recent: deque[Window] = field(default_factory=lambda: deque(maxlen=64))
    _looks: dict[tuple[int, str], deque[tuple[bool, int]]] = field(default_factory=dict)
    """(rank, phase) -> its last ``LOOKS`` verdicts: (slow, first step of that window)."""
    _start: int | None = None
    active: dict[tuple[int, str], Straggler] = field(default_factory=dict)

    def observe(self, window: Window) -> list[Straggler]:
        """The stragglers this window named or ended, as they stand now (copies: the detector goes on)."""
        return [dataclasses.replace(s) for s in self._observe(window)]

    def _observe(self, window: Window) -> list[Straggler]:
        if self._start is None:
            self._start = window.first_step
        for straggler in self.active.values():
            others = [w for r, w in enumerate(window.straggler_wait) if r != straggler.rank]
            straggler.tax_s += sum(others)
            straggler.last_step = window.last_step
        world = len(window.phases)
        if world < 2 or window.last_step < self._start + self.window:
            return []
        self._recent.append(window)
        span = self._span()
        changed: list[Straggler] = []
        for rank in range(world):
            for name, index in WATCHED.items():
                ratio = _ratio(span, rank, index)
                slow = ratio is not None and ratio >= self.factor
                looks = self._looks.setdefault((rank, name), deque(maxlen=LOOKS))
                looks.append((slow, window.first_step))
                verdict = self._verdict((rank, name), looks, ratio, window.last_step)
                if verdict is not None:
                    changed.append(verdict)
        return changed

    def _verdict(
        self, key: tuple[int, str], looks: deque[tuple[bool, int]], ratio: float | None, last_step: int
    ) -> Straggler | None:
        """Named when ``CONFIRM`` of the last ``LOOKS`` windows were slow; ended when as many were not."""
        slow = [first for was_slow, first in looks if was_slow]
        current = self.active.get(key)
        if current is not None:
            if ratio is not None and looks[-1][0]:
                current.factor = ratio
            if len(looks) - len(slow) >= CONFIRM:
                del self.active[key]
                current.open = False
                return current
            return None
        if len(slow) < CONFIRM or ratio is None or not looks[-1][0]:
            return None
        since = min(slow)
        named = Straggler(key[0], key[1], ratio, since, last_step, tax_s=self._tax_since(key[0], since))
        self.active[key] = named
        return named

    def close(self) -> list[Straggler]:
        """The session ends: every named straggler ends with its tax."""
        out = list(self.active.values())
        for straggler in out:
            straggler.open = False
        self.active.clear()
        return out

    def _span(self) -> list[Window]:
        """The newest windows covering at least ``window`` steps."""
        out: list[Window] = []
        steps = 0
        for w in reversed(self._recent):
            out.append(w)
            steps += w.steps
            if steps >= self.window:
                break
        return out

    def _tax_since(self, rank: int, since: int) -> float:
        return sum(
            wait for w in self._recent if w.last_step >= since for r, wait in enumerate(w.straggler_wait) if r != rank
        )


def _ratio(span: Sequence[Window], rank: int, index: int) -> float | None:
    """``rank``'s seconds a step in phase ``index`` over the others' median, when its excess is material."""
    steps = sum(w.steps for w in span)
    world = len(span[0].phases)
    if any(len(w.phases) != world for w in span):
        return None
    if index == TRAIN and not any(
        len(w.phases[r]) > TRAIN and w.phases[r][TRAIN] > 0 for w in span for r in range(world)
    ):
        index = COMPUTE
    per_rank = [sum(w.phases[r][index] for w in span) / steps for r in range(world)]
    step_time = [sum(sum(w.phases[r][: len(PHASES)]) for w in span) / steps for r in range(world)]
    others = [per_rank[r] for r in range(world) if r != rank]
    median = statistics.median(others)
    typical_step = statistics.median(step_time[r] for r in range(world) if r != rank)
    excess = per_rank[rank] - median
    if excess < max(MIN_SECONDS, MIN_SHARE * typical_step):
        return None
    return min(MAX_FACTOR, per_rank[rank] / median) if median > 0 else MAX_FACTOR


__all__ = ["CONFIRM", "LOOKS", "MIN_SHARE", "WATCHED", "Straggler", "StragglerDetector", "Window"]
