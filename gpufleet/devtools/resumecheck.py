"""Does a ported training script resume exactly? Run it twice as a backend would and compare.

The check a user runs once after porting a script to :class:`~gpufleet.runtime.TrainSession`:

1. the job runs to the end uninterrupted (job 1);
2. the job runs again (job 2) with ``GPUFLEET_DEBUG_PREEMPT_AT=N``: attempt 1 saves at step ``N``
   and exits 75 as on SIGTERM, attempt 2 resumes; with ``GPUFLEET_DEBUG_ROLLBACK_AT=R`` the
   session also rolls back once after step ``R`` and replays the same batches;
3. every entry of the two final checkpoints is compared bitwise (:func:`compare_final_states`), and so
   is every step's loss from the two event logs (``GPUFLEET_LOG_EVERY_S=0``).

A distributed spec (``resources.gpus`` ranks on one node) runs the same way: each attempt is the
group launcher over its ranks, as the local backend starts it, and each final checkpoint, sharded
by the ranks, is gathered into one state (:func:`gpufleet.runtime.sharded.full_state`: the whole
model and optimizer, the trainer state) with every rank's own file (``rank-00000`` ...: its RNG
states) beside it. A spec of several nodes is refused before anything runs: one machine cannot
start it as its backend would.

Each attempt is a separate process started like the local backend starts one (``entry_argv``,
``job_environment``, the spec's ``workdir``), so what is checked is the whole path a real
preemption takes: the script's own set-up code runs again, nothing survives in memory. On CPU
with deterministic algorithms a correct port is bitwise exact; the usual culprits when it is not
are batches drawn from the global RNG, a batch prefetched before the loop, and loop state (a best
validation loss, an EMA) kept in a local variable instead of the checkpoint; in a distributed
script, also a ``DataLoader`` without a generator of its own, whose every ``iter`` draws a seed
from the global RNG (one draw more at each resume mid-epoch: dropout masks shift from there on).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.devtools.debug import leaves, plain_equal
from gpufleet.errors import CheckpointError, ParameterError, UsageError
from gpufleet.jobs.events import EventKind, read_events
from gpufleet.jobs.protocol import ENV_ATTEMPT, ENV_LOG_EVERY_S, REQUEUE_EXIT_CODE, entry_argv, job_environment
from gpufleet.numpy_cpu import without_own_setting
from gpufleet.paths import attempt_log, events_file, job_dir, spec_file
from gpufleet.spec import JobSpec

ENV_PREEMPT_AT = "GPUFLEET_DEBUG_PREEMPT_AT"
ENV_ROLLBACK_AT = "GPUFLEET_DEBUG_ROLLBACK_AT"
IGNORED = ("trainer.rollbacks",)
"""Runtime bookkeeping that differs in a correct port: the count of rollbacks (an injected one included)."""
LOG_TAIL_LINES = 20
RNG_ENTRY = re.compile(r"^(?:trainer|rank-\d+)\.rng\.")
"""Saved RNG states: the trainer's of one process, each rank's own file of a sharded checkpoint."""
TORCH_RNG = re.compile(r"\.rng\.(?:torch|cuda)(?:\.|$)")
"""The torch generators' states: seeded the same in every process, so a difference means other draws."""

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailure:
    """An attempt that exited otherwise than the check expected."""

    run: str
    """``uninterrupted`` or ``preempted``."""
    attempt: int
    exit_code: int
    expected: str
    log: str
    tail: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeReport:
    job: str
    verdict: str
    """``exact``, ``differs`` or ``failed`` (a run did not get through; see ``failure``)."""
    final_step: int | None
    preempt_at: int | None
    rollback_at: int | None
    steps_compared: int = 0
    first_loss_step: int | None = None
    """First step whose loss differs, or that only one of the two runs logged."""
    first_loss: tuple[float | None, float | None] | None = None
    """That step's loss in the uninterrupted and in the preempted run (``None``: not logged)."""
    first_tensor: str | None = None
    first_tensor_max_abs_diff: float | None = None
    """Largest absolute difference of its elements (``None`` when dtype, shape or presence differ)."""
    first_tensor_at: list[int] | None = None
    """Index of its first element that differs, when the two have one shape."""
    first_difference: str | None = None
    """That tensor's difference in words: ``model.1.weight differs by up to 0.0074 (first at [3, 17])``."""
    tensors_compared: int = 0
    tensors_differing: int = 0
    other_entries: list[str] = field(default_factory=list)
    """Non-tensor checkpoint entries (step, data cursor, ``s.values``, RNG states) that differ, in
    checkpoint order; Python's RNG state (a tuple of 625 numbers) counts as one entry."""
    ignored: tuple[str, ...] = IGNORED
    exit_codes: dict[str, list[int]] = field(default_factory=dict)
    """Exit status of each attempt, per run."""
    seconds: dict[str, float] = field(default_factory=dict)
    folder: str | None = None
    """Where the two job folders were kept (``keep``), else ``None``: they were deleted."""
    world_size: int = 1
    """Ranks of each run: above 1, the final states were gathered from sharded checkpoints."""
    failure: RunFailure | None = None
    hints: list[str] = field(default_factory=list)
    """Likely causes of a difference, from where it shows first."""
    warnings: list[str] = field(default_factory=list)
    """RNG states that differ while every loss and every other tensor is bitwise equal (:func:`rng_warnings`):
    the verdict stays ``exact``, and each line names the generator and why it does not matter yet."""

    @property
    def exact(self) -> bool:
        return self.verdict == "exact"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exact": self.exact}


def check_resume(
    spec: JobSpec,
    *,
    at: int | None = None,
    rollback_at: int | None = None,
    steps: int | None = None,
    keep: Path | None = None,
    progress: Progress | None = None,
) -> ResumeReport:
    """Run ``spec`` uninterrupted, then preempted at ``at`` (default: half its final step), and compare.

    ``steps`` replaces ``args.steps`` of a ``module:function`` job; a command's steps are part of
    its command line, so there it is a usage error. ``keep`` keeps the two job folders (as
    ``keep/jobs/1`` and ``keep/jobs/2``) for ``gpufleet debug spikes`` and friends.
    """
    say = progress or (lambda _line: None)
    spec = _with_steps(spec, steps)
    _check_runnable(spec)
    if spec.resume == "must":
        raise UsageError(
            f"{spec.name!r} has resume: must, which refuses the fresh job folder each run starts in; "
            "set resume: auto (or never) for the check"
        )
    for name, value in (("at", at), ("rollback_at", rollback_at)):
        if value is not None and value < 1:
            raise ParameterError(f"{{{name}}} must be a step number of at least 1", **{name: value})
    planned = spec.args.get("steps") if spec.callable_entrypoint else None
    if isinstance(planned, int) and not isinstance(planned, bool):
        _check_steps(at, rollback_at, planned)
    if keep is not None:
        if keep.exists() and (not keep.is_dir() or any(keep.iterdir())):
            raise ParameterError("{keep} exists and is not an empty folder: give a new or empty one", keep=str(keep))
        keep.mkdir(parents=True, exist_ok=True)
        return _check_in(spec, keep, at, rollback_at, say, kept=True)
    with tempfile.TemporaryDirectory(prefix="gpufleet-resume-check-") as tmp:
        return _check_in(spec, Path(tmp), at, rollback_at, say, kept=False)


def _check_runnable(spec: JobSpec) -> None:
    """Refuse, before the long uninterrupted run, a spec this machine cannot start as its backend would."""
    if spec.resources.nodes > 1:
        raise UsageError(
            f"{spec.name!r} spans {spec.resources.nodes} nodes (resources.nodes): resume-check starts every rank "
            "on this one machine, as the local backend does; check a copy of the spec with resources.nodes: 1"
        )


def _with_steps(spec: JobSpec, steps: int | None) -> JobSpec:
    if steps is None:
        return spec
    if steps < 1:
        raise ParameterError("{steps} must be at least 1", steps=steps)
    if spec.callable_entrypoint is None:
        raise ParameterError(
            "{steps:name} works for `module:function` entrypoints; {job!r} runs a command: "
            "set its step count in the spec's command line instead",
            steps=steps,
            job=spec.name,
        )
    return spec.copy_with(args={**spec.args, "steps": steps})


def _check_steps(at: int | None, rollback_at: int | None, final: int) -> None:
    """``at`` must leave steps to resume; ``rollback_at`` must be a step the run reaches."""
    if final < 2:
        raise ParameterError(
            "the run ends at step {final!s}: a resume check needs at least 2 steps ({steps:name})",
            final=final,
            steps=None,
        )
    if at is not None and at >= final:
        raise ParameterError(
            "{at} is not before the run's last step {final!s}: choose a step from 1 to {last!s}",
            at=at,
            final=final,
            last=final - 1,
        )
    if rollback_at is not None and rollback_at > final:
        raise ParameterError(
            "{rollback_at} is beyond the run's last step {final!s}: choose 2 to {final!s}",
            rollback_at=rollback_at,
            final=final,
        )


def _check_in(
    spec: JobSpec, home: Path, at: int | None, rollback_at: int | None, say: Progress, *, kept: bool
) -> ResumeReport:
    seconds: dict[str, float] = {}
    codes: dict[str, list[int]] = {}

    def report(**fields: Any) -> ResumeReport:
        folder = str(home) if kept else None
        return ResumeReport(
            job=spec.name,
            rollback_at=rollback_at,
            world_size=spec.world_size,
            exit_codes=codes,
            seconds=seconds,
            folder=folder,
            **fields,
        )

    entry = spec.entrypoint if isinstance(spec.entrypoint, str) else " ".join(spec.entrypoint)
    say(f"uninterrupted run of {entry}")
    failure = _run_job(spec, home, 1, "uninterrupted", {}, (0,), say, codes, seconds)
    if failure is not None:
        return report(verdict="failed", final_step=None, preempt_at=at, failure=failure)
    final, base_state = final_checkpoint(job_dir(home, 1), spec)
    _check_steps(at, rollback_at, final)
    preempt = at or final // 2
    if rollback_at is not None:
        _check_rollback(job_dir(home, 1), preempt, rollback_at)
    extra = {ENV_PREEMPT_AT: str(preempt), **({ENV_ROLLBACK_AT: str(rollback_at)} if rollback_at else {})}
    also = f", rolled back once after step {rollback_at}" if rollback_at else ""
    say(f"preempted run: preempted at step {preempt} of {final}{also}, then resumed")
    failure = _run_job(spec, home, 2, "preempted", extra, (REQUEUE_EXIT_CODE, 0), say, codes, seconds)
    if failure is not None:
        return report(verdict="failed", final_step=final, preempt_at=preempt, failure=failure)
    _, run_state = final_checkpoint(job_dir(home, 2), spec)
    say("comparing the final checkpoints and every step's loss")
    ref_losses = step_losses(events_file(home, 1))
    run_losses = step_losses(events_file(home, 2))
    loss_step, loss_pair = first_loss_difference(ref_losses, run_losses)
    found = compare_final_states(_without(base_state, IGNORED), _without(run_state, IGNORED))
    first = found.first
    entries = [*found.tensors, *found.others]
    warnings = rng_warnings(entries) if loss_step is None else []
    return report(
        verdict="exact" if loss_step is None and (found.exact or warnings) else "differs",
        final_step=final,
        preempt_at=preempt,
        steps_compared=len(set(ref_losses) | set(run_losses)),
        first_loss_step=loss_step,
        first_loss=loss_pair,
        first_tensor=first.name if first else None,
        first_tensor_max_abs_diff=first.max_abs_diff if first else None,
        first_tensor_at=list(first.at) if first and first.at is not None else None,
        first_difference=first.describe() if first else None,
        tensors_compared=found.tensors_compared,
        tensors_differing=len(found.tensors),
        other_entries=found.others,
        hints=[] if warnings else hints(loss_step, preempt, rollback_at, entries),
        warnings=warnings,
    )


def hints(loss_step: int | None, at: int, rollback_at: int | None, entries: list[str]) -> list[str]:
    """What a difference that shows first *there* usually means."""
    out = []
    if loss_step is not None and loss_step == at + 1:
        out.append(
            f"the first step after the resume (step {loss_step}) already differs: the batches probably come from the "
            "global RNG or one was fetched before the loop; draw each from gpufleet.runtime.data.batch_generator"
            "(seed, s.data_position + micro_step). A DataLoader without a generator of its own draws a seed from "
            "the global RNG at every iter(), one draw more at a resume mid-epoch, which shifts dropout and "
            "shuffling from there: give it DataLoader(..., generator=torch.Generator())"
        )
    elif loss_step is not None and rollback_at is not None and loss_step <= rollback_at:
        out.append(
            f"step {loss_step} differs after the injected rollback: state the session does not restore (a prefetched "
            "batch, an iterator, a counter in a local variable) carried over from the discarded steps"
        )
    others = [e for e in entries if not RNG_ENTRY.match(e)]
    if loss_step is None and others:
        out.append(
            f"every loss matches but {others[0]} ends differently: is it computed from something the checkpoint "
            "does not hold? Keep it in s.values or in an object passed as extra"
        )
    return out


RNG_NAMES = {
    "python": "Python's random module",
    "numpy": "numpy's global RNG",
    "torch": "torch's global RNG",
    "cuda": "torch's CUDA RNG",
}
"""The generator each saved RNG entry (``trainer.rng.<name>...``) holds, as a person calls it."""


def rng_warnings(entries: list[str]) -> list[str]:
    """One line per generator when RNG states are all that differ (``[]`` otherwise): every loss, weight and
    optimizer tensor being bitwise equal, the loop did not draw from it, or drew without effect so far.

    An unseeded generator the loop never uses starts elsewhere in each process (numpy's, Python's); a
    torch generator that ends elsewhere was drawn from a different number of times (a DataLoader
    without a generator of its own draws a seed at every ``iter()``, one more at a resume mid-epoch).
    """
    if not entries or not all(RNG_ENTRY.match(e) for e in entries):
        return []
    by_name: dict[str, list[str]] = {}
    for entry in entries:
        by_name.setdefault(RNG_ENTRY.sub("", entry).split(".")[0], []).append(entry)
    out = []
    for name, found in by_name.items():
        which = f"{RNG_NAMES.get(name, f'the {name} RNG')} differs ({', '.join(found)}) but no weight or loss does"
        if TORCH_RNG.search(found[0]):
            out.append(
                f"{which}: the resumed run drew from it a different number of times, without effect on this run; "
                "dropout or random augmentation would diverge from there. A DataLoader without a generator of its "
                "own draws a seed at every iter(): give it DataLoader(..., generator=torch.Generator())"
            )
        else:
            out.append(f"{which}: the loop does not use it; seed it if it should")
    return out


def _run_job(
    spec: JobSpec,
    home: Path,
    job_id: int,
    run: str,
    extra: dict[str, str],
    expected: tuple[int, ...],
    say: Progress,
    codes: dict[str, list[int]],
    seconds: dict[str, float],
) -> RunFailure | None:
    """Attempts of one job, one process each, until one exits 0; ``expected`` lists each one's exit status.

    The environment is the caller's minus any ``GPUFLEET_*`` (a debug hook or metrics port from
    the shell would change the run) plus what a backend exports, with a ``step`` event per step.
    """
    attempt_log(home, job_id, 1).parent.mkdir(parents=True, exist_ok=True)
    spec_file(home, job_id).write_text(spec.model_dump_json(indent=2), encoding="utf-8")
    inherited = {k: v for k, v in without_own_setting(os.environ).items() if not k.startswith("GPUFLEET_")}
    env = {**inherited, **job_environment(spec, job_id, home, "local"), ENV_LOG_EVERY_S: "0", **extra}
    argv = entry_argv(spec)
    codes[run] = []
    started = time.perf_counter()
    for attempt, want in enumerate(expected, 1):
        log = attempt_log(home, job_id, attempt)
        begun = time.perf_counter()
        code = _run_attempt(argv, {**env, ENV_ATTEMPT: str(attempt)}, spec.workdir, log)
        codes[run].append(code)
        say(f"  {run}, attempt {attempt}: exit {code} after {time.perf_counter() - begun:.1f}s")
        if code != want:
            return RunFailure(
                run=run,
                attempt=attempt,
                exit_code=code,
                expected=_expectation(want, extra),
                log=str(log),
                tail=_tail(log, LOG_TAIL_LINES),
            )
    seconds[run] = time.perf_counter() - started
    return None


def _run_attempt(argv: list[str], env: dict[str, str], workdir: str | None, log: Path) -> int:
    """One attempt's process, its output in ``log``; a command that cannot start is exit 127, as in a shell."""
    with log.open("ab") as out:
        try:
            return subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env, check=False
            ).returncode
        except OSError as err:
            out.write(f"gpufleet: cannot start {argv[0]!r}: {err.strerror}\n".encode())
            return 127


def _expectation(code: int, extra: dict[str, str]) -> str:
    if code == REQUEUE_EXIT_CODE:
        return (
            f"exit {REQUEUE_EXIT_CODE} (saved, requeue me) at the injected preemption at step {extra[ENV_PREEMPT_AT]}: "
            "does the loop call TrainSession.report() once a step?"
        )
    return "exit 0 (training completed)"


def _tail(path: Path, lines: int) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def final_checkpoint(folder: Path, spec: JobSpec) -> tuple[int, dict[str, Any]]:
    """Step and whole state of the newest checkpoint a completed run left.

    A sharded checkpoint is verified as a restore would (every file's sha256, DCP's index), then
    gathered into one state; each rank's own file (its RNG states) joins it under its name,
    ``rank-00000`` ..., so that every rank's part is compared.
    """
    from gpufleet.runtime.checkpoint import CheckpointDir

    ckpts = CheckpointDir(folder / "checkpoints")
    infos = ckpts.scan(verify=False)
    if not infos:
        raise CheckpointError(
            f"{spec.name} completed but left no checkpoint in {folder / 'checkpoints'}: "
            "a resume check needs a TrainSession loop (TrainSession.from_env) in the script"
        )
    newest = infos[-1]
    if newest.manifest is None or newest.manifest.format != "dcp":
        _, state = ckpts.load(newest.path)
        return newest.step, state
    from gpufleet.runtime.sharded import full_state

    manifest, ranks = ckpts.check(newest.path)
    return newest.step, {**full_state(newest.path, manifest), **ranks}


def _check_rollback(folder: Path, at: int, rollback_at: int) -> None:
    """A rollback after step ``R`` returns to a checkpoint before ``R``: one must exist by then.

    The preempted run saves where the uninterrupted one did, and at the preemption as well.
    """
    events, _ = read_events(folder / "events.jsonl")
    saved = {int(e["step"]) for e in events if e["kind"] == EventKind.CHECKPOINT and isinstance(e.get("step"), int)}
    saved.add(at)
    if min(saved) >= rollback_at:
        raise ParameterError(
            "{rollback_at}: no checkpoint is saved before it to roll back to (the first is at step "
            "{first!s}); choose a step after {first!s}",
            rollback_at=rollback_at,
            first=min(saved),
        )


def _as_loss(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def step_losses(path: Path) -> dict[int, list[float]]:
    """Each step's losses in log order from ``step`` events, less the first pass of an injected rollback.

    A step logged twice by a rollback the health monitor decided (a spike: the batches after it
    change) keeps both values, which an exact resume reproduces too. An *injected* rollback
    replays the same batches, so its discarded first pass is dropped and the replay is compared.
    """
    events, _ = read_events(path)
    losses: dict[int, list[float]] = {}
    for e in events:
        if e["kind"] == EventKind.ROLLBACK and e.get("injected"):
            for step in range(int(e["to_step"]) + 1, int(e["from_step"]) + 1):
                if losses.get(step):
                    losses[step].pop()
            continue
        loss = _as_loss(e.get("loss"))
        if e["kind"] == EventKind.STEP and isinstance(e.get("step"), int) and loss is not None:
            losses.setdefault(int(e["step"]), []).append(loss)
    return {step: values for step, values in losses.items() if values}


def first_loss_difference(
    a: dict[int, list[float]], b: dict[int, list[float]]
) -> tuple[int | None, tuple[float | None, float | None] | None]:
    """The first step whose losses differ bitwise (NaN equals NaN), with the step's last loss in each."""
    for step in sorted(set(a) | set(b)):
        x, y = a.get(step, []), b.get(step, [])
        if len(x) != len(y) or not all(_same_float(p, q) for p, q in zip(x, y, strict=True)):
            return step, (x[-1] if x else None, y[-1] if y else None)
    return None, None


def _same_float(x: float, y: float) -> bool:
    return (x == y and math.copysign(1.0, x) == math.copysign(1.0, y)) or (math.isnan(x) and math.isnan(y))


def _without(state: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """A shallow copy of ``state`` without the dotted entries ``names`` (``trainer.rollbacks``)."""
    out = dict(state)
    for name in names:
        head, _, key = name.partition(".")
        if isinstance(out.get(head), dict) and key in out[head]:
            out[head] = {k: v for k, v in out[head].items() if k != key}
    return out


# ---- comparing two final states: pure functions over plain values ------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class TensorDifference:
    """How one tensor entry of the uninterrupted run's state differs from the resumed run's."""

    name: str
    """Dotted name in the state: ``model.1.weight``, ``optimizer.state.0.exp_avg``, ``rank-00001.rng.torch``."""
    left: str = ""
    right: str = ""
    """What each side holds when it is not the same kind of tensor: its dtype and/or shape, ``absent``,
    or the type of a value that is not a tensor; both empty when only the values differ."""
    max_abs_diff: float | None = None
    """Largest absolute difference over the elements whose bytes differ; a NaN against a number is ``inf``."""
    at: tuple[int, ...] | None = None
    """Index of the first element whose bytes differ (``()`` for a 0-d tensor)."""

    def describe(self) -> str:
        """One line: ``model.1.weight differs by up to 0.0074 (first at [3, 17])``."""
        if self.left or self.right:
            return f"{self.name} is {self.left} in the uninterrupted run, {self.right} in the resumed one"
        where = f" (first at {list(self.at)})" if self.at else ""
        by = "only in the sign of a zero" if self.max_abs_diff == 0 else f"by up to {self.max_abs_diff:.4g}"
        return f"{self.name} differs {by}{where}"


@dataclass(frozen=True, slots=True, kw_only=True)
class StateComparison:
    """Two states entry by entry: which tensors and which other entries differ, the first tensor described."""

    tensors_compared: int
    tensors: list[str]
    """Tensor entries that differ (in dtype, shape, presence or any byte), in the first state's order."""
    others: list[str]
    """Other entries that differ; a list of plain values (Python's RNG state, the loss history) is one."""
    first: TensorDifference | None

    @property
    def exact(self) -> bool:
        return not self.tensors and not self.others


def compare_final_states(a: Mapping[str, Any], b: Mapping[str, Any]) -> StateComparison:
    """Compare every entry of ``a`` (the uninterrupted run's state) with ``b`` (the resumed run's), bitwise.

    Entries are named by their dotted path through mappings and lists, in ``a``'s order, then those
    only ``b`` holds. A tensor entry differs when its dtype, its shape or any byte differs (so NaN
    equals NaN and -0.0 differs from 0.0, as a resumed run must reproduce every bit), or when only
    one side holds a tensor there; the first such entry is described (:class:`TensorDifference`).
    Other entries compare as the checkpoint stores them (:func:`_equal`).
    """
    import torch

    left, right = dict(leaves("", a)), dict(leaves("", b))
    compared, tensors, first = 0, [], None
    for name in _names(left, right):
        x, y = left.get(name, _MISSING), right.get(name, _MISSING)
        if not (isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor)):
            continue
        compared += 1
        found = tensor_difference(name.lstrip("."), x, y)
        if found is not None:
            tensors.append(found.name)
            first = first or found
    plain_a, plain_b = dict(_plain_entries("", a)), dict(_plain_entries("", b))
    counted = {f".{name}" for name in tensors}  # a tensor on one side only is named once, as a tensor
    others = [
        n.lstrip(".")
        for n in _names(plain_a, plain_b)
        if n not in counted and not _equal(plain_a.get(n, _MISSING), plain_b.get(n, _MISSING))
    ]
    return StateComparison(tensors_compared=compared, tensors=tensors, others=others, first=first)


def tensor_difference(name: str, x: Any, y: Any) -> TensorDifference | None:
    """How ``x`` differs from ``y`` (at least one a tensor; ``_MISSING`` for an absent entry), or ``None``."""
    import torch

    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return TensorDifference(name=name, left=_what(x), right=_what(y))
    if x.dtype != y.dtype or x.shape != y.shape:
        dtype, shape = x.dtype != y.dtype, x.shape != y.shape
        return TensorDifference(name=name, left=_layout(x, dtype, shape), right=_layout(y, dtype, shape))
    x, y = x.detach().cpu(), y.detach().cpu()
    differs = _differing_elements(x, y)
    flat = torch.nonzero(differs)
    if not len(flat):
        return None
    wide = torch.complex128 if x.is_complex() else torch.float64
    gap = (x.reshape(-1)[differs].to(wide) - y.reshape(-1)[differs].to(wide)).abs()
    gap = torch.where(gap.isnan(), math.inf, gap)
    return TensorDifference(name=name, max_abs_diff=float(gap.max()), at=_unravel(int(flat[0]), tuple(x.shape)))


def _differing_elements(x: Any, y: Any) -> Any:
    """A flat boolean mask of the elements whose bytes differ (two CPU tensors of one dtype and shape)."""
    import torch

    if not x.numel():
        return torch.zeros(0, dtype=torch.bool)
    rows = [t.contiguous().reshape(-1).view(torch.uint8).reshape(t.numel(), -1) for t in (x, y)]
    return (rows[0] != rows[1]).any(dim=1)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index in ``shape`` of element ``flat`` of the row-major order."""
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def _layout(t: Any, dtype: bool, shape: bool) -> str:
    """``float32``, ``of shape [3, 4]`` or both: what differs of a tensor."""
    parts = [str(t.dtype).removeprefix("torch.")] if dtype else []
    return " ".join([*parts, f"of shape {list(t.shape)}"] if shape else parts)


def _what(value: Any) -> str:
    import torch

    if value is _MISSING:
        return "absent"
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return f"not a tensor ({type(value).__name__})"


def _names(left: Mapping[str, Any], right: Mapping[str, Any]) -> list[str]:
    return [*left, *(n for n in right if n not in left)]


_MISSING = object()


def _holds_structure(value: Any) -> bool:
    """A mapping or a tensor somewhere inside ``value``."""
    import torch

    if isinstance(value, (dict, torch.Tensor)):
        return True
    return isinstance(value, (list, tuple)) and any(_holds_structure(v) for v in value)


def _plain_entries(prefix: str, value: Any) -> Iterable[tuple[str, Any]]:
    """Non-tensor entries by dotted name; a list without mappings or tensors inside is one entry."""
    import torch

    if isinstance(value, dict):
        for key, item in value.items():
            yield from _plain_entries(f"{prefix}.{key}", item)
    elif isinstance(value, (list, tuple)) and _holds_structure(value):
        for index, item in enumerate(value):
            yield from _plain_entries(f"{prefix}.{index}", item)
    elif not isinstance(value, torch.Tensor):
        yield prefix, value


def _equal(x: Any, y: Any) -> bool:
    """Plain values compared as the checkpoint stores them: NaN equals NaN, lists element by element."""
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_equal(p, q) for p, q in zip(x, y, strict=True))
    return plain_equal(x, y)


__all__ = [
    "IGNORED",
    "ResumeReport",
    "RunFailure",
    "StateComparison",
    "TensorDifference",
    "check_resume",
    "compare_final_states",
    "final_checkpoint",
    "first_loss_difference",
    "hints",
    "rng_warnings",
    "step_losses",
]
