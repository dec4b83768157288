"""The sampler: a daemon thread that reads a GPU source every few seconds and records each round.

``GpuSampler`` reads a source (``sources``) every few seconds and hands each round to a
``GpuRecorder`` (``log``), which appends it to ``jobs/<id>/gpu/attempt-<N>.jsonl``, and to an
optional callback; ``latest()`` is what the job's metrics endpoint serves. Apart from both
because it is the only part with a thread and a schedule, and it must never take the training
process down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpufleet.errors import UsageError
from gpufleet.telemetry.dcgm import ScrapeResult
from gpufleet.telemetry.gpu.log import GpuRecorder
from gpufleet.telemetry.gpu.sources import GpuSource

log = logging.getLogger(__name__)


class GpuSampler:
    """Reads a source every ``every_s`` seconds in a daemon thread; records and hands on each round.

    A round that raises (a buggy source, a full disk) is logged once and counted in ``errors``;
    the thread goes on, so GPU telemetry never takes the training process down. ``stop`` does not
    take a last round: the latest one is at most ``every_s`` old, and a final read could block on
    a slow exporter while a preempted process needs its grace period for the checkpoint.
    ``close`` stops and also closes the source and the recorder.
    """

    def __init__(
        self,
        source: GpuSource,
        every_s: float,
        *,
        recorder: GpuRecorder | None = None,
        on_round: Callable[[ScrapeResult], None] | None = None,
    ) -> None:
        if not every_s > 0:
            raise UsageError(f"sampling period {every_s} s must be positive")
        self.source, self.every_s, self.recorder, self.on_round = source, every_s, recorder, on_round
        self.errors = 0
        self.rounds = 0
        self._latest: ScrapeResult | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufleet-gpu-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _round(self) -> None:
        try:
            result = self.source.read()
            self._latest = result
            if self.recorder is not None:
                self.recorder.write(result)
            if self.on_round is not None:
                self.on_round(result)
            self.rounds += 1
        except Exception:
            self.errors += 1
            if self.errors == 1:
                log.warning("GPU sampling round from %s failed; going on", self.source.description, exc_info=True)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._round()
            next_at = max(next_at + self.every_s, time.monotonic())
            if self._stop.wait(next_at - time.monotonic()):
                break

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the round in progress (at most ``timeout`` seconds of waiting)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """``stop``, then close the source and the recorder (for a caller that handed both over)."""
        self.stop(timeout)
        self.source.close()
        if self.recorder is not None:
            self.recorder.close()

    def latest(self) -> ScrapeResult | None:
        """The last round read, or ``None`` before the first."""
        return self._latest


__all__ = ["GpuSampler", "log"]
