"""The reporter: what a training process tells the outside world about its steps, GPUs and money.

Step events at most every ``log_every_s`` (throughput over the window since the last one, MFU when
the model's FLOPs per token and the GPUs' peak are known), every rank's step and wait times on rank
0 of a group, every rank's phase seconds (``rank_phase_s`` a step over the window, ``phase_totals_s``
since training started, see ``components.phases``) and the stragglers they reveal
(``components.stragglers``: a ``straggler`` event when one is named and when it ends), the GPU
sampler's thread, the ``session_end`` that says how the attempt ended, and
the listeners that export all of it (Prometheus, a textfile) with the attempt's price.

MFU is the PaLM paper's model FLOPs utilization (Chowdhery et al. 2022, appendix B): achieved
model FLOP/s (tokens a second times FLOPs per token) over the peak FLOP/s of every GPU of the job;
``gpufleet.estimate.mfu`` computes it, ``gpufleet.estimate.peak`` holds the datasheet peaks.

The price of a GPU-hour comes from the attempt's environment (``GPUFLEET_PRICE_PER_GPU_HOUR``,
``GPUFLEET_CURRENCY``), which the backend exports: a training process reads no rate card.

Imports: ``gpufleet.estimate``, ``gpufleet.telemetry``, ``gpufleet.jobs``, ``runtime.group``; never
``gpufleet.cost`` or ``gpufleet.placement``, nothing of the session.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.errors import GpufleetError, UsageError
from gpufleet.estimate.mfu import utilization
from gpufleet.estimate.peak import gpu_peak
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.protocol import CURRENCY_RE, ENV_CURRENCY, ENV_PRICE
from gpufleet.runtime.components.announce import Announcer
from gpufleet.runtime.components.phases import COLLECTIVE, PHASES, REPORTED, straggler_waits
from gpufleet.runtime.components.stragglers import Straggler, StragglerDetector, Window
from gpufleet.runtime.group import Group, PeerLost, is_peer_loss, mark_lost, mark_session_end
from gpufleet.spec import Telemetry
from gpufleet.telemetry.metrics import exporter_from_env, labels_from_env

if TYPE_CHECKING:
    from gpufleet.runtime.components.agreement import Agreement
    from gpufleet.telemetry.gpu import GpuSampler

DEFAULT_CURRENCY = "USD"


def price_from_env(env: Mapping[str, str]) -> tuple[float | None, str]:
    """The price of one GPU-hour and its currency, as the backend exported them; no price when unset.

    A malformed value is refused (``UsageError`` naming the variable) before the session opens a file.
    """
    raw = env.get(ENV_PRICE, "").strip()
    currency = env.get(ENV_CURRENCY, "").strip() or DEFAULT_CURRENCY
    if not CURRENCY_RE.fullmatch(currency):
        raise UsageError(
            f"{ENV_CURRENCY}={env.get(ENV_CURRENCY)!r} is invalid: give a currency code such as USD, or unset it"
        )
    if not raw:
        return None, currency
    try:
        price = float(raw)
    except ValueError:
        price = math.nan
    if not math.isfinite(price) or price < 0:
        raise UsageError(
            f"{ENV_PRICE}={raw!r} is invalid: give a price per GPU-hour, 0 or more (e.g. 2.5), or unset it"
        )
    return price, currency


def job_peak_flops(gpu_type: str, gpus: int) -> float | None:
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


def listeners_from_env(
    env: Mapping[str, str],
    *,
    gpu_type: str,
    provider: str,
    attempt: int,
    sampler: GpuSampler | None,
    gpus: int,
    price: tuple[float | None, str],
) -> list[Any]:
    """The exporters the environment asks for, labelled with the job and priced with ``price``."""
    labels = {**labels_from_env(env, gpu_type, provider), "attempt": str(attempt)}
    return exporter_from_env(env, labels, gpu=sampler, gpus=gpus, price=lambda: price)


class Reporter:
    """Step events over a window, MFU, per-rank timings, the GPU sampler's life and ``session_end``."""

    def __init__(
        self,
        voice: Announcer,
        group: Group,
        log_every_s: float = 1.0,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        gpu_sampler: GpuSampler | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.voice = voice
        self.group = group
        self.log_every_s = log_every_s
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        """Dense peak FLOP/s of all the job's GPUs; with ``flops_per_token``, step events carry MFU."""
        self.gpu_sampler = gpu_sampler
        """Samples the job's GPUs in a thread while the session is open (see ``gpu_sampler_from_env``)."""
        self._last_log = 0.0
        self._window_tokens = 0
        self._window_start = clock()
        self._ranks: list[list[float]] = []
        """Rank 0: per rank, the sums of its step seconds and agreement waits, and the agreements, since
        the last step event (``rank_step_s``, ``rank_wait_s``)."""
        self._clock = clock
        self._phase_window: list[list[float]] = []
        """Rank 0: per rank, its seconds in each reported phase (``phases.REPORTED``) since the last step event."""
        self._phase_steps = 0
        self._phase_totals: list[list[float]] = []
        """Rank 0: per rank, its seconds in each reported phase since training started in this attempt."""
        self._detector: StragglerDetector | None = None
        self._hosts: list[str] = []
        self._gpus_per_rank = 1

    def open(self) -> None:
        if self.gpu_sampler is not None:
            self.gpu_sampler.start()
            self.voice.emit(EventKind.GPU_SOURCE, source=self.gpu_sampler.source.description)

    def close(self) -> None:
        if self.gpu_sampler is not None:
            self.gpu_sampler.close()

    def restart(self) -> None:
        """Training starts: the first window counts from here."""
        self._window_start = self._clock()

    def watch_stragglers(self, hosts: list[str], factor: float, gpus_per_rank: int) -> None:
        """Rank 0 of a group: name stragglers from the phases of each agreement (``straggler_factor``)."""
        if self.group.is_main:
            self._detector = StragglerDetector(factor=factor)
            self._hosts, self._gpus_per_rank = hosts, max(1, gpus_per_rank)

    def note_phases(
        self, per_rank: list[tuple[float, ...]] | tuple[tuple[float, ...], ...], steps: int, last_step: int
    ) -> None:
        """Rank 0: the phase seconds of every rank over the ``steps`` steps ending at ``last_step``."""
        if not self.group.is_main or not per_rank or steps <= 0:
            return
        waits = straggler_waits([p[COLLECTIVE] for p in per_rank])
        rows = [[*p[: len(PHASES)], w] for p, w in zip(per_rank, waits, strict=True)]
        if len(self._phase_totals) != len(rows) or len(self._phase_totals[0]) != len(rows[0]):
            self._phase_totals = [[0.0] * len(rows[0]) for _ in rows]
            self._phase_window, self._phase_steps = [], 0
        if not self._phase_window:
            self._phase_window = [[0.0] * len(rows[0]) for _ in rows]
        for r, row in enumerate(rows):
            for i, value in enumerate(row):
                self._phase_window[r][i] += value
                self._phase_totals[r][i] += value
        self._phase_steps += steps
        if self._detector is not None and len(rows) > 1:
            window = Window(last_step - steps + 1, last_step, tuple(tuple(p) for p in per_rank), tuple(waits))
            for straggler in self._detector.observe(window):
                self._straggler(straggler, last_step)

    def _straggler(self, straggler: Straggler, step: int) -> None:
        host = self._hosts[straggler.rank] if straggler.rank < len(self._hosts) else "?"
        fields = straggler.fields(host, self._gpus_per_rank, step)
        gpu_s = straggler.tax_s * self._gpus_per_rank
        if straggler.open:
            message = (
                f"rank {straggler.rank} on {host} is a straggler in {straggler.phase} "
                f"(x{straggler.factor:.1f} the other ranks' median from step {straggler.first_step}); "
                f"the others have waited {gpu_s:.2f} GPU-s for it"
            )
        else:
            message = (
                f"rank {straggler.rank} on {host} was a straggler in {straggler.phase} from step "
                f"{straggler.first_step} to {straggler.last_step}: the others waited {gpu_s:.2f} GPU-s for it"
            )
        self.voice.say(EventKind.STRAGGLER, message, **fields)

    def phase_totals(self) -> dict[str, list[float]]:
        """Rank 0: ``phase_totals_s`` (per reported phase, each rank's seconds since training started)."""
        if not self._phase_totals:
            return {}
        return {name: [round(row[i], 6) for row in self._phase_totals] for i, name in enumerate(REPORTED)}

    def note_ranks(self, agreement: Agreement) -> None:
        """Rank 0: add one agreement's timings of every rank to the window."""
        if not self.group.is_main:
            return
        world = len(agreement.rank_step_s)
        if not self._ranks:
            self._ranks = [[0.0] * world, [0.0] * world, [0.0] * world]
        busy, wait, counts = self._ranks
        for r in range(world):
            busy[r] += agreement.rank_step_s[r]
            wait[r] += agreement.rank_wait_s[r]
            counts[r] += 1

    def step(
        self,
        step: int,
        loss: float,
        tokens: int,
        data_position: int,
        seconds: float,
        now: float,
        metrics: Mapping[str, float],
        *,
        last: bool,
    ) -> bool:
        """Count a closed step; emit a ``step`` event when the window is over (or at the ``last`` step)."""
        self._window_tokens += tokens
        if now - self._last_log < self.log_every_s and not last:
            return False
        elapsed = max(now - self._window_start, seconds, 1e-9)
        tokens_per_s = self._window_tokens / elapsed
        extra = dict(metrics)
        if self.flops_per_token and self.peak_flops and "mfu" not in extra:
            extra["mfu"] = utilization(tokens_per_s, self.flops_per_token, self.peak_flops)
        self.voice.emit(
            EventKind.STEP,
            step=step,
            loss=loss,
            tokens_per_s=tokens_per_s,
            data_position=data_position,
            **extra,
            **self._take_ranks(),
        )
        self._last_log, self._window_tokens, self._window_start = now, 0, now
        return True

    def _take_ranks(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self._phase_window and self._phase_steps > 0:
            n = self._phase_steps
            out["rank_phase_s"] = {
                name: [round(row[i] / n, 6) for row in self._phase_window] for i, name in enumerate(REPORTED)
            }
            out["phase_totals_s"] = self.phase_totals()
            self._phase_window, self._phase_steps = [], 0
        if not self._ranks or self._ranks[2][0] <= 0:
            return out
        busy, wait, counts = self._ranks
        self._ranks = []
        return {
            **out,
            "rank_step_s": [round(b / n, 6) for b, n in zip(busy, counts, strict=True)],
            "rank_wait_s": [round(w / n, 6) for w, n in zip(wait, counts, strict=True)],
        }

    def unhealthy_step(
        self,
        step: int,
        loss: float,
        reason: str | None,
        zscore: float | None,
        data_position: int,
        micro: int | None,
        losses: list[float],
    ) -> None:
        """A step whose loss was NaN, inf or a spike (with several micro-batches: which one, and all their losses)."""
        detail = {"micro_batch": micro, "micro_losses": losses} if len(losses) > 1 else {}
        self.voice.emit(
            EventKind.UNHEALTHY,
            step=step,
            loss=loss,
            reason=reason,
            zscore=zscore,
            data_position=data_position,
            **detail,
        )

    def rolled_back(
        self,
        *,
        from_step: int,
        to_step: int,
        skip_from: int,
        skip_to: int,
        redone_seconds: float,
        restore_seconds: float,
        injected: bool,
    ) -> None:
        """A rollback: where from, where to, the batches skipped and the work redone (also on stdout)."""
        skipped = f", skipping batches {skip_from}..{skip_to - 1}" if skip_to > skip_from else ""
        self.voice.say(
            EventKind.ROLLBACK,
            f"rolled back from step {from_step} to healthy step {to_step}{skipped}"
            + (" (injected)" if injected else ""),
            from_step=from_step,
            to_step=to_step,
            skip_from=skip_from,
            skip_to=skip_to,
            redone_steps=from_step - to_step,
            redone_seconds=redone_seconds,
            restore_seconds=restore_seconds,
            **({"injected": True} if injected else {}),
        )

    def end(self, exc: BaseException | None, step: int, *, preempted: bool) -> str:
        """``session_end``: completed, requeue (preempted, or a rank of the group lost) or failed; the log closes.

        A rank of a group also records its status for the launcher (``group.mark_session_end``):
        only rank 0 writes events, and an attempt whose every rank completed is completed even if
        its processes then fail to exit.
        """
        if self._detector is not None:
            for straggler in self._detector.close():
                self._straggler(straggler, step)
        totals = self.phase_totals()
        extra: dict[str, Any] = {"phase_totals_s": totals} if totals else {}
        if exc is None:
            status = "completed"
            self.voice.emit(EventKind.SESSION_END, status=status, step=step, **extra)
        elif preempted:
            status = "requeue"
            self.voice.emit(EventKind.SESSION_END, status=status, step=step, **extra)
        elif self.group.distributed and is_peer_loss(exc):
            status = "requeue"
            if not isinstance(exc, PeerLost):  # DDP's all-reduce in backward found it, not the session
                mark_lost(self.group.rank, str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "")
            self.voice.emit(
                EventKind.SESSION_END, status=status, step=step, reason="rank_lost", error=str(exc), **extra
            )
        else:
            status = "failed"
            self.voice.emit(
                EventKind.SESSION_END, status=status, step=step, error=f"{type(exc).__name__}: {exc}", **extra
            )
        if self.group.distributed:
            mark_session_end(self.group.rank, status)
        self.voice.events.close()
        return status


__all__ = [
    "DEFAULT_CURRENCY",
    "Reporter",
    "gpu_sampler_from_env",
    "job_peak_flops",
    "listeners_from_env",
    "price_from_env",
]
