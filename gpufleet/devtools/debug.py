"""Numerical debugging: is the training loop deterministic, and where did the loss spike?

``check_determinism`` runs the job's function three times in this process: twice with one seed
(on CPU with ``torch.use_deterministic_algorithms`` the two must agree bit for bit; otherwise the
first step whose loss differs and the first checkpoint tensor that differs are reported), and
once with a second seed, whose distance from the first is the noise floor any comparison of two
runs (a change of learning rate, a kernel) has to beat.

``find_spikes`` reports every step the runtime itself logged as unhealthy, with its reason and
z-score, and replays the other logged losses through the runtime's own
:class:`~gpufleet.runtime.health.HealthMonitor` (judge each loss, keep the healthy ones), so a
CSV of losses is judged exactly as the runtime would have judged it.
"""

from __future__ import annotations

import csv
import math
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpufleet.devtools.profile import check_args, entrypoint_function, isolated_job
from gpufleet.errors import CheckpointError, ParameterError, UsageError
from gpufleet.jobs.events import EventKind, read_events
from gpufleet.runtime.health import HealthMonitor
from gpufleet.spec import HealthPolicy, JobSpec
from gpufleet.workloads import MAX_SEED


@dataclass(frozen=True, slots=True, kw_only=True)
class DeterminismReport:
    job: str
    steps: int
    seeds: tuple[int, int]
    losses: dict[str, list[float]]
    """``run1`` and ``run2`` (first seed), ``seed2``: the loss after each step."""
    identical: bool
    """Losses and every tensor of the final checkpoints are bitwise equal across the two runs."""
    first_loss_step: int | None
    """First step (counted from 1) whose loss differs between the two runs."""
    first_tensor: str | None
    """First checkpoint entry that differs, as ``file.key.key``."""
    first_tensor_max_abs_diff: float | None
    tensors_compared: int
    tensors_differing: int
    other_entries_differing: int
    """Non-tensor checkpoint entries (loss history, counters) that differ."""
    seed_spread: list[float]
    """``|loss(seed 1) - loss(seed 2)|`` per step."""

    @property
    def max_seed_spread(self) -> float:
        return max(self.seed_spread, default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "max_seed_spread": self.max_seed_spread}


def _run(spec: JobSpec, root: Path, seed: int, steps: int) -> tuple[list[float], dict[str, Any]]:
    """One run in ``root``: the loss of each step (from its event log) and its final checkpoint."""
    from gpufleet.runtime.checkpoint import CheckpointDir

    func, params = entrypoint_function(spec)
    with isolated_job(spec, root, events=True) as ckpt:
        func(**{**spec.args, "seed": seed, "steps": steps, **({"ckpt_dir": str(ckpt)} if "ckpt_dir" in params else {})})
    events, _ = read_events(root / "events.jsonl")
    by_step = {int(e["step"]): _as_float(e.get("loss")) for e in events if e["kind"] == EventKind.STEP and "step" in e}
    infos = CheckpointDir(ckpt).scan(verify=False)
    if not infos:
        raise CheckpointError(f"{spec.callable_entrypoint} saved no checkpoint; determinism needs a TrainSession loop")
    _, state = CheckpointDir(ckpt).load(infos[-1].path)
    return [by_step[s] for s in sorted(by_step)], state


def check_determinism(spec: JobSpec, steps: int = 10, seeds: tuple[int, int] = (0, 1)) -> DeterminismReport:
    """Two runs with ``seeds[0]`` compared bitwise, one with ``seeds[1]`` for the spread across seeds."""
    if steps <= 0:
        raise ParameterError("{steps}: run at least one step", steps=steps)
    wild = next((s for s in seeds if not 0 <= s <= MAX_SEED), None)
    if wild is not None:
        raise ParameterError(
            "{seeds:name} {pair!s}: seed {wild!s} is out of range: give two seeds from 0 to 2**32-1 "
            "(what numpy.random.seed and every shipped workload take), e.g. {seeds:name} 0,1",
            seeds=seeds,
            pair=f"{seeds[0]},{seeds[1]}",
            wild=_shown_seed(wild),
        )
    if seeds[0] == seeds[1]:
        raise ParameterError(
            "{seeds:name} {pair!s}: give two different non-negative seeds, e.g. {seeds:name} 0,1",
            seeds=seeds,
            pair=f"{seeds[0]},{seeds[1]}",
        )
    func, params = entrypoint_function(spec)
    missing = {"seed", "steps"} - params
    if missing:
        raise UsageError(
            f"{spec.callable_entrypoint} takes no {', '.join(sorted(missing))} argument; add it to compare runs"
        )
    supplied = {"seed", "steps", "ckpt_dir"} & params  # what each run passes itself, as `profile` checks
    check_args(func, str(spec.callable_entrypoint), {k: v for k, v in spec.args.items() if k not in supplied}, supplied)
    with tempfile.TemporaryDirectory(prefix="gpufleet-determinism-") as tmp:
        loss1, state1 = _run(spec, Path(tmp) / "run1", seeds[0], steps)
        loss2, state2 = _run(spec, Path(tmp) / "run2", seeds[0], steps)
        loss3, _ = _run(spec, Path(tmp) / "seed2", seeds[1], steps)
    first_step = next((i + 1 for i, (a, b) in enumerate(zip(loss1, loss2, strict=False)) if not _same(a, b)), None)
    if first_step is None and len(loss1) != len(loss2):
        first_step = min(len(loss1), len(loss2)) + 1
    diffs = compare_states(state1, state2)
    return DeterminismReport(
        job=spec.name,
        steps=steps,
        seeds=seeds,
        losses={"run1": loss1, "run2": loss2, "seed2": loss3},
        identical=first_step is None and not diffs["differing"] and not diffs["others"],
        first_loss_step=first_step,
        first_tensor=diffs["first"],
        first_tensor_max_abs_diff=diffs["max_abs_diff"],
        tensors_compared=diffs["compared"],
        tensors_differing=diffs["differing"],
        other_entries_differing=diffs["others"],
        seed_spread=[abs(a - b) for a, b in zip(loss1, loss3, strict=False)],
    )


def _shown_seed(seed: int) -> str:
    text = str(seed)
    return text if len(text) <= 30 else f"{text[:20]}... ({len(text)} digits)"


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def leaves(prefix: str, value: Any) -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(f"{prefix}.{key}", item)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from leaves(f"{prefix}.{index}", item)
    else:
        yield prefix, value


def compare_states(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Bitwise comparison of two loaded checkpoints: counts, and the first differing tensor."""
    import torch

    left, right = dict(leaves("", a)), dict(leaves("", b))
    compared, tensors, others, first, worst = 0, 0, 0, None, None
    for name in [*left, *(n for n in right if n not in left)]:
        x, y = left.get(name), right.get(name)
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            others += not plain_equal(x, y)
            continue
        compared += 1
        if x.dtype == y.dtype and x.shape == y.shape and bitwise_equal(x, y):
            continue
        tensors += 1
        if first is None:
            first = name.lstrip(".")
            worst = float((x.double() - y.double()).abs().max()) if x.shape == y.shape and x.numel() else None
    return {"compared": compared, "differing": tensors, "others": others, "first": first, "max_abs_diff": worst}


def plain_equal(x: Any, y: Any) -> bool:
    """Non-tensor leaves (ints, floats, strings); NaN equals NaN, as in the bitwise comparison."""
    try:
        return x is y or (type(x) is type(y) and bool(x == y or (x != x and y != y)))
    except (TypeError, ValueError):  # an object without a plain truth value: call it different
        return False


def bitwise_equal(x: Any, y: Any) -> bool:
    """Compare the bytes, so that NaN equals NaN and -0.0 differs from 0.0."""
    import torch

    if not x.numel():
        return True
    as_bytes = [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in (x, y)]
    return bool(torch.equal(*as_bytes))


def plot_losses(report: DeterminismReport, path: Path) -> Path:
    """PNG: the two same-seed curves, and the band between the two seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not path.parent.is_dir():
        raise UsageError(f"cannot write plot {str(path)!r}: folder {str(path.parent)!r} does not exist")
    run1, run2, other = report.losses["run1"], report.losses["run2"], report.losses["seed2"]
    n = min(len(run1), len(other))
    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.fill_between(range(1, n + 1), [min(a, b) for a, b in zip(run1, other, strict=False)],
                    [max(a, b) for a, b in zip(run1, other, strict=False)], alpha=0.25,
                    label=f"seeds {report.seeds[0]} and {report.seeds[1]}")  # fmt: skip
    ax.plot(range(1, len(run1) + 1), run1, label=f"seed {report.seeds[0]}, run 1")
    ax.plot(range(1, len(run2) + 1), run2, "--", label=f"seed {report.seeds[0]}, run 2")
    verdict = "bitwise identical" if report.identical else f"diverge at step {report.first_loss_step}"
    ax.set(xlabel="step", ylabel="training loss", title=f"{report.job}: same-seed runs {verdict}")
    ax.legend()
    fig.savefig(path, dpi=110)
    return path


@dataclass(frozen=True, slots=True)
class Spike:
    step: int
    loss: float | None
    """``None`` for a weight or optimizer tensor found non-finite (``nonfinite_state``): no loss was judged."""
    reason: str
    """``nan``, ``inf``, ``spike``, or the runtime's ``nonfinite_state``."""
    zscore: float | None
    source: str = "replay"
    """``runtime``: the session logged the step ``unhealthy`` as it trained; ``replay``: judged here."""


@dataclass(frozen=True, slots=True)
class LoggedLoss:
    """One judged step of a logged run: a loss to replay, or the runtime's own verdict on it."""

    step: int
    loss: float | None
    verdict: Spike | None = None
    """Set when the runtime logged this step ``unhealthy``: its verdict stands, the replay skips it."""


def _as_float(value: Any) -> float:
    """A loss from an untrusted log: numbers, or strings such as ``"nan"`` (the event log's NaN).

    NaN and infinities are kept (a NaN loss is what an unhealthy step reports); an integer beyond
    any float is not a loss.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"loss {value!r} is not a number")
    try:
        return float(value)
    except OverflowError:
        raise ValueError("loss is an integer beyond any float") from None


def _as_step(value: Any) -> int:
    """A step number from an untrusted log: a finite number (``ValueError`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"step {value!r} is not a number")
    try:
        return int(value)
    except OverflowError:  # int(inf)
        raise ValueError("step is not a finite number") from None


def _runtime_verdict(event: dict[str, Any], step: int) -> Spike | None:
    """The verdict an ``unhealthy`` event records; ``None`` for the end-of-run summary, which repeats one."""
    reason = event.get("reason")
    if not isinstance(reason, str) or reason == "unhealthy_step":
        return None
    raw_z = event.get("zscore")
    zscore = float(raw_z) if isinstance(raw_z, (int, float)) and not isinstance(raw_z, bool) else None
    try:
        loss: float | None = _as_float(event["loss"])
    except (KeyError, ValueError):
        if reason != "nonfinite_state":
            return None
        loss = None
    return Spike(step, loss, reason, zscore, source="runtime")


def read_losses(source: Path) -> list[LoggedLoss]:
    """The judged steps of a job folder, an ``events.jsonl`` or a ``step,loss`` CSV, in log order.

    The event log has ``step`` events (one every ``GPUFLEET_LOG_EVERY_S``, so a replay of them
    may lack the history the runtime judged against) and an ``unhealthy`` event for every step
    the runtime itself found bad, judged against its full history: that verdict is kept as it is.
    In rollback mode a bad step never gets a ``step`` event; in mark mode its ``step`` event follows.
    """
    path = source / "events.jsonl" if source.is_dir() else source
    if not path.is_file():
        raise UsageError(f"{str(path)!r} does not exist: give a job id, a job folder, an events.jsonl or a CSV")
    if path.suffix == ".csv":
        return [LoggedLoss(step, loss) for step, loss in _read_csv(path)]
    events, _ = read_events(path)
    points: list[LoggedLoss] = []
    last_bad: tuple[Any, int] | None = None
    for e in events:
        if e["kind"] not in (EventKind.STEP, EventKind.UNHEALTHY):
            continue
        try:
            step = _as_step(e["step"])
        except (KeyError, ValueError):
            continue
        if e["kind"] == EventKind.UNHEALTHY:
            verdict = _runtime_verdict(e, step)
            if verdict is not None:
                points.append(LoggedLoss(step, verdict.loss, verdict))
                last_bad = (e.get("attempt"), step)
            continue
        if last_bad == (e.get("attempt"), step):
            continue  # the "mark" action logs the unhealthy step again: judged once already
        last_bad = None
        try:
            points.append(LoggedLoss(step, _as_float(e["loss"])))
        except (KeyError, ValueError):
            continue
    return points


def _read_csv(path: Path) -> list[tuple[int, float]]:
    try:
        return _parse_csv(path)
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{str(path)!r} is not UTF-8 text (byte {err.start}); give a `step,loss` CSV saved as UTF-8"
        ) from None
    except csv.Error as err:
        raise UsageError(f"{str(path)!r} is not a readable CSV ({err}); give a `step,loss` CSV") from None


def _short(value: str | None, limit: int = 40) -> str:
    """A CSV cell for an error message: quoted, and cut to ``limit`` characters."""
    if value is not None and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    return repr(value)


def _parse_csv(path: Path) -> list[tuple[int, float]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if not {"step", "loss"} <= set(reader.fieldnames or ()):
            raise UsageError(f"{path}: needs a header with `step` and `loss` columns, found {reader.fieldnames}")
        points = []
        for row in reader:
            try:
                points.append((int(row["step"]), float(row["loss"])))
            except (TypeError, ValueError):
                step, loss = _short(row["step"]), _short(row["loss"])
                raise UsageError(f"{path}, line {reader.line_num}: step {step}, loss {loss} are not numbers") from None
    return points


def detect_spikes(losses: Iterable[LoggedLoss | tuple[int, float]], policy: HealthPolicy) -> list[Spike]:
    """The runtime's own verdicts, and the rest judged as ``TrainSession.report`` does.

    A verdict the runtime logged is kept whatever the replay would say (the replay of sampled
    ``step`` events may not have the ``min_history`` it had); a logged spike is dropped only when
    ``policy`` asks for a higher z-score than it reached. Healthy replayed losses join the window.
    """
    monitor = HealthMonitor(policy)
    spikes = []
    for item in losses:
        point = item if isinstance(item, LoggedLoss) else LoggedLoss(*item)
        if point.verdict is not None:
            if _exceeds(point.verdict, policy.spike_zscore):
                spikes.append(point.verdict)
            continue
        if point.loss is None:
            continue
        verdict = monitor.judge(point.loss)
        if verdict.healthy:
            monitor.accept(point.loss)
        else:
            spikes.append(Spike(point.step, point.loss, verdict.reason or "unhealthy", verdict.zscore))
    return spikes


def _exceeds(spike: Spike, threshold: float | None) -> bool:
    return spike.reason != "spike" or threshold is None or spike.zscore is None or spike.zscore > threshold


def find_spikes(source: Path, policy: HealthPolicy | None = None) -> list[Spike]:
    """Unhealthy steps of a logged run (see :func:`read_losses` for what ``source`` may be)."""
    return detect_spikes(read_losses(Path(source)), policy or HealthPolicy())


__all__ = [
    "DeterminismReport",
    "LoggedLoss",
    "Spike",
    "bitwise_equal",
    "check_determinism",
    "compare_states",
    "detect_spikes",
    "find_spikes",
    "leaves",
    "plain_equal",
    "plot_losses",
    "read_losses",
]
