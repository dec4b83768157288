"""The sweep driver: an Optuna study whose trials are gpufleet jobs.

Each trial is asked of the study, its parameters go into the base JobSpec's ``args``, and it is
submitted as a job named ``<sweep>-t<number>`` on the sweep's backend, so it is queued, placed,
preempted, resumed, observed and priced like any other job. The driver follows the jobs from the
store: every new value of the objective's metric that a trial logged (an ``eval``, ``metrics`` or
``step`` event) is reported to Optuna at its step, once (a resumed trial redoes the steps after its
checkpoint, and the values it logs again are not reported twice); when the pruner says so, the job
is cancelled and the trial ends ``PRUNED``. A job that completes ends its trial with the metric's
last value; one that fails, or never logs the metric, fails its trial with the reason, and the
sweep stops after ``max_failures`` of them instead of burning its budget.

The driver shares the machine with the trials it runs, so a pass costs what is new since the last one:
the study is read again only after the driver wrote to it (it is the study's only writer while it runs),
and each job's metric events are read once (:class:`~gpufleet.sweeps.values.MetricReader`). A pass that
finds nothing new is one query of the job and one of its events per running trial.

The study lives in an Optuna RDB storage (SQLite under ``$GPUFLEET_HOME/sweeps/<name>/`` by
default), and each trial records its job's name before the job is submitted and its id after, so
a driver killed at any point (``kill -9``) and started again adopts the trials it left running,
marks the one it was about to submit as failed (no job exists for it: it is not counted), and
goes on: the study ends with exactly the requested number of finished-or-pruned trials.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.backends import get_backend
from gpufleet.backends.base import Backend, registered
from gpufleet.errors import Conflict, GpufleetError, UsageError
from gpufleet.extras import required
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.states import JobState
from gpufleet.jobs.store import TERMINAL, Job, Store
from gpufleet.paths import private_dir
from gpufleet.spec import JobSpec
from gpufleet.sweeps.feature import PRUNED
from gpufleet.sweeps.spec import SweepSpec
from gpufleet.sweeps.values import MetricReader, metric_values

with required("optuna", "sweeps", "gpufleet sweep"):
    import optuna
    import sqlalchemy.exc
    from optuna.study import StudyDirection
    from optuna.trial import FrozenTrial, TrialState

JOB_NAME = "gpufleet_job_name"
JOB_ID = "gpufleet_job_id"
FAILURE = "gpufleet_failure"
"""A trial that failed on its own: its reason. Counted against ``max_failures``."""
LOST = "gpufleet_lost"
"""A trial the driver asked for but never submitted (it was killed in between): not counted."""
PRUNED_AT = "gpufleet_pruned_at"

optuna.logging.set_verbosity(optuna.logging.WARNING)


def sweep_dir(home: Path, name: str) -> Path:
    return home / "sweeps" / name


def storage_url(home: Path, sweep: SweepSpec) -> str:
    if sweep.storage:
        return sweep.storage
    return f"sqlite:///{sweep_dir(home, sweep.name) / 'study.db'}"


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """An Optuna storage that cannot be opened (bad URL, missing driver, unreadable file): one line, exit 2."""
    try:
        yield
    except (ImportError, ValueError, OSError, sqlalchemy.exc.SQLAlchemyError) as err:
        problem = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise UsageError(
            f"sweep storage {url[:120]!r} cannot be opened: {problem}; give an SQLAlchemy URL whose driver is "
            "installed (sqlite:///path/study.db, postgresql://...), or drop storage: for the default"
        ) from None


def check_storage(url: str) -> None:
    """Refuse a storage URL that cannot work, without connecting or creating anything (exit 2, one line).

    Parsed, its dialect and driver imported, and an SQLite file's folder looked for: what ``create_study``
    would otherwise find only after the home's store and the sweep's folder exist.
    """
    from sqlalchemy.engine import make_url

    with storage_errors(url):
        parsed = make_url(url)
        dialect = parsed.get_dialect()
        load_driver = getattr(dialect, "import_dbapi", None) or getattr(dialect, "dbapi", None)  # SQLAlchemy 2, 1.4
        if callable(load_driver):
            load_driver()
        database = parsed.database or ""
        if parsed.get_backend_name() == "sqlite" and database and database != ":memory:":
            folder = Path(database).parent
            if not folder.is_dir():
                raise OSError(f"no folder {str(folder)[:120]!r} for the SQLite file")


def _sampler(sweep: SweepSpec) -> optuna.samplers.BaseSampler:
    kind, seed = sweep.sampler.kind, sweep.sampler.seed
    if kind == "grid":
        return optuna.samplers.GridSampler({k: list(p.grid or []) for k, p in sweep.space.items()}, seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _pruner(sweep: SweepSpec) -> optuna.pruners.BasePruner:
    p = sweep.pruner
    if p.kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=p.min_steps)
    if p.kind == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.min_steps, reduction_factor=p.reduction_factor)
    return optuna.pruners.NopPruner()


def open_study(home: Path, sweep: SweepSpec, base: JobSpec) -> optuna.Study:
    """The sweep's study, created on first use; a study of the same name with another space is refused."""
    if not sweep.storage:
        private_dir(sweep_dir(home, sweep.name))
    with storage_errors(storage_url(home, sweep)):
        study = optuna.create_study(
            study_name=sweep.name,
            storage=storage_url(home, sweep),
            load_if_exists=True,
            direction=sweep.objective.direction,
            sampler=_sampler(sweep),
            pruner=_pruner(sweep),
        )
    defined = {"space": {k: p.model_dump() for k, p in sweep.space.items()}, "objective": sweep.objective.model_dump()}
    known = study.user_attrs.get("definition")
    if known is None:
        study.set_user_attr("definition", defined)
        study.set_user_attr("sweep", sweep.model_dump())
    elif known != defined:
        raise Conflict(
            f"sweep {sweep.name!r} exists with another space or objective: give the sweep another name "
            f"(or remove {sweep_dir(home, sweep.name)})"
        )
    else:
        study.set_user_attr("sweep", sweep.model_dump())  # budget and parallelism may change between runs
    study.set_user_attr("base", base.model_dump(mode="json"))
    return study


def suggest(trial: optuna.Trial, sweep: SweepSpec) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name, p in sweep.space.items():
        if p.values is not None:
            params[name] = trial.suggest_categorical(name, p.values)
        elif p.type == "int":
            step = int(p.step) if p.step else 1
            params[name] = trial.suggest_int(name, int(p.low or 0), int(p.high or 0), step=step, log=p.log)
        else:
            params[name] = trial.suggest_float(name, float(p.low or 0), float(p.high or 0), step=p.step, log=p.log)
    return params


def trial_job_name(sweep: SweepSpec, number: int) -> str:
    return f"{sweep.name[:52]}-t{number:04d}"


def total_steps(store: Store, job_id: int) -> int | None:
    """The steps the job's session said it runs (``session_start``'s ``total_steps``)."""
    start = store.last_event(job_id, EventKind.SESSION_START)
    value = start.data.get("total_steps") if start is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class Progress:
    """What the driver has done, for progress bars and the summary."""

    finished: int = 0
    pruned: int = 0
    running: int = 0
    failed: int = 0
    best: float | None = None
    stop: str | None = None
    gpu_hours: float = 0.0
    money: float = 0.0


class SweepDriver:
    """Runs one sweep to its budget; see the module docstring."""

    def __init__(
        self,
        home: Path,
        sweep: SweepSpec,
        base: JobSpec,
        backend: str = "local",
        *,
        poll_s: float = 0.5,
        on_tick: Callable[[SweepDriver, Progress], None] | None = None,
    ) -> None:
        self.home = home
        self.sweep = sweep
        self.base = base
        study = None
        if sweep.storage:  # the user's own storage is opened before the backend creates the home's state.db
            check_storage(sweep.storage)
            if backend not in registered():
                get_backend(backend, home)  # refused by name, before the study is created
            study = open_study(home, sweep, base)  # a folder that exists yet takes no file (/proc) fails here
        self.backend: Backend = get_backend(backend, home)
        self.store: Store = self.backend.store
        self.poll_s = poll_s
        self.on_tick = on_tick
        self.study = study if study is not None else open_study(home, sweep, base)
        self.stopping: dict[int, str] = {}
        """Jobs of pruned trials, until they have stopped: the reason to give them then."""
        self.values = MetricReader(self.store, sweep.objective.metric)
        """The objective's values the running trials' jobs logged, each event read once."""

    # ---- the study's view ---------------------------------------------------------------------
    def trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def progress(self, trials: Sequence[FrozenTrial] | None = None) -> Progress:
        """Counts, best value and spending, from ``trials`` as read (the study's now when not given).

        The best value is taken from the trials in hand rather than ``study.best_value``, which is one more
        query to the storage for a figure the list already holds."""
        p = Progress()
        trials = self.trials() if trials is None else trials
        values = []
        for t in trials:
            if t.state == TrialState.COMPLETE:
                p.finished += 1
                if t.value is not None:
                    values.append(t.value)
            elif t.state == TrialState.PRUNED:
                p.pruned += 1
            elif t.state == TrialState.RUNNING:
                p.running += 1
            elif t.state == TrialState.FAIL and FAILURE in t.user_attrs:
                p.failed += 1
        if values:
            p.best = max(values) if self.study.direction == StudyDirection.MAXIMIZE else min(values)
        jobs = [int(t.user_attrs[JOB_ID]) for t in trials if JOB_ID in t.user_attrs]
        if jobs and (self.sweep.budget.gpu_hours is not None or self.sweep.budget.money is not None):
            p.gpu_hours, p.money = spent(self.store, jobs)
        return p

    def target(self) -> int:
        size = self.sweep.grid_size
        return min(self.sweep.budget.trials, size) if size is not None else self.sweep.budget.trials

    def _tell(self, trial: optuna.Trial | int, value: float | None = None, *, state: TrialState | None = None) -> None:
        """``study.tell``, outside ``optimize``: the grid sampler calls ``study.stop()`` once its last point is
        told, which raises there, after the trial is stored. The driver knows the grid's size itself."""
        try:
            self.study.tell(trial, value, state=state)
        except RuntimeError as err:
            if "Study.stop" not in str(err):
                raise

    # ---- one pass -----------------------------------------------------------------------------
    def recover(self, trials: Sequence[FrozenTrial] | None = None) -> bool:
        """Adopt the trials a previous driver left running; fail the one it never submitted.

        ``trials``: the study's trials as last read (read now when not given). ``True`` when it wrote to the study.
        """
        wrote = False
        for t in self.trials() if trials is None else trials:
            if t.state != TrialState.RUNNING or JOB_ID in t.user_attrs:
                continue
            wrote = True
            name = t.user_attrs.get(JOB_NAME)
            found = [j for j in self.store.jobs() if j.name == name] if name else []
            if found:
                self.study._storage.set_trial_user_attr(t._trial_id, JOB_ID, found[-1].id)
            else:
                self.study._storage.set_trial_user_attr(t._trial_id, LOST, "the driver stopped before submitting it")
                self._tell(t.number, state=TrialState.FAIL)
        return wrote

    def follow(self, trials: Sequence[FrozenTrial] | None = None) -> bool:
        """Report new values, prune, and end the trials whose jobs ended; ``True`` when it wrote to the study.

        ``trials``: the study's trials as last read (read now when not given).
        """
        wrote = False
        for t in self.trials() if trials is None else trials:
            if t.state == TrialState.RUNNING and JOB_ID in t.user_attrs:
                wrote = self._follow(t, self.store.job(int(t.user_attrs[JOB_ID]))) or wrote
        return wrote

    def _follow(self, frozen: FrozenTrial, job: Job) -> bool:
        seen = max(frozen.intermediate_values, default=-1)
        fresh = []
        for step, value in self.values.new(job.id):
            if step > seen:
                fresh.append((step, value))
                seen = step
        trial = None
        if fresh:  # an ``optuna.Trial`` reads the trial from the storage: only made when there is news for it
            trial = optuna.Trial(self.study, frozen._trial_id)
            for step, value in fresh:
                trial.report(value, step)
        if job.state not in TERMINAL:
            if trial is not None and self._may_prune(job, seen) and trial.should_prune():
                self._prune(frozen, job, seen)
            return trial is not None
        last = self.values.last(job.id)
        self.values.forget(job.id)  # its trial ends here
        if job.state == JobState.COMPLETED and last is not None:
            self._tell(frozen.number, last)
            return True
        if job.state == JobState.COMPLETED:
            why = (
                f"the trial never logged {self.sweep.objective.metric!r}: "
                f'log it with session.log("eval", {self.sweep.objective.metric}=...)'
            )
        else:
            why = f"job {job.id} {job.state}" + (f": {job.reason}" if job.reason else "")
        self.study._storage.set_trial_user_attr(frozen._trial_id, FAILURE, why)
        self._tell(frozen.number, state=TrialState.FAIL)
        return True

    def _may_prune(self, job: Job, step: int) -> bool:
        """A pruner is set and ``step`` is not the job's last (its value then is the end: not worth stopping for)."""
        if self.sweep.pruner.kind == "none":
            return False
        last = total_steps(self.store, job.id)
        return last is None or step < last

    def _prune(self, frozen: FrozenTrial, job: Job, step: int) -> None:
        try:
            self.backend.cancel(job.id)
        except UsageError:
            return  # it ended meanwhile: the next pass ends its trial from the job's state
        value = frozen.intermediate_values.get(step)
        self.store.add_event(job.id, PRUNED, sweep=self.sweep.name, trial=frozen.number, step=step, value=value)
        self.stopping[job.id] = f"pruned by sweep {self.sweep.name} at step {step}"
        self.values.forget(job.id)
        self.study._storage.set_trial_user_attr(frozen._trial_id, PRUNED_AT, step)
        self._tell(frozen.number, state=TrialState.PRUNED)

    def settle(self) -> bool:
        """Give the pruned jobs that have stopped their reason; ``True`` when none is still stopping."""
        for job_id, reason in list(self.stopping.items()):
            if self.store.job(job_id).state in TERMINAL:
                self.store.set_reason(job_id, reason)  # after the backend's own "cancelled by request"
                del self.stopping[job_id]
        return not self.stopping

    def stop_reason(self, p: Progress) -> str | None:
        b = self.sweep.budget
        if p.finished + p.pruned >= self.target():
            return f"{p.finished + p.pruned} trials finished or pruned"
        if p.failed >= self.sweep.max_failures:
            return f"{p.failed} trials failed (max_failures {self.sweep.max_failures})"
        if b.gpu_hours is not None and p.gpu_hours >= b.gpu_hours:
            return f"GPU-hour budget spent ({p.gpu_hours:.3g} of {b.gpu_hours:g})"
        if b.money is not None and p.money >= b.money:
            return f"money budget spent ({p.money:.3g} of {b.money:g})"
        return None

    def launch(self, p: Progress) -> int:
        """Ask and submit trials while there is room; how many it asked (each one a write to the study)."""
        asked = 0
        while p.running < self.sweep.parallelism and p.finished + p.pruned + p.running < self.target():
            trial = self.study.ask()
            asked += 1
            params = suggest(trial, self.sweep)
            name = trial_job_name(self.sweep, trial.number)
            trial.set_user_attr(JOB_NAME, name)  # before the job exists: a restarted driver finds it by name
            spec = self.base.copy_with(name=name, args={**self.base.args, **params})
            try:
                job_id = self.backend.submit(spec)
            except GpufleetError as err:
                trial.set_user_attr(FAILURE, f"submit refused: {err}")
                self._tell(trial, state=TrialState.FAIL)
                p.failed += 1
                if p.failed >= self.sweep.max_failures:
                    return asked
                continue
            trial.set_user_attr(JOB_ID, job_id)
            p.running += 1
        return asked

    def run(self, *, once: bool = False) -> Progress:
        """Launch, follow and end trials until the budget is met (or failures stop it).

        ``once``: one pass (adopt, follow, launch what fits) and return, for a driver run from cron.
        """
        trials: list[FrozenTrial] | None = self.trials()  # the study as last read; only this driver writes to it
        if self.recover(trials):
            trials = None
        while True:
            try:
                self.backend.sync()  # the trials' scheduler only: the home's other jobs are not the sweep's
            except UsageError as err:  # e.g. the local scheduler had died: a new one was started, say so
                print(f"gpufleet: sweep {self.sweep.name}: {err}", file=sys.stderr, flush=True)
            self.settle()
            if trials is None:
                trials = self.trials()
            if self.follow(trials):
                trials = self.trials()
            p = self.progress(trials)
            p.stop = self.stop_reason(p)
            if p.stop is not None and p.failed >= self.sweep.max_failures and p.running:
                self._cancel_running()  # the trials fail for a reason they share: stop spending on them
                trials = None
                continue
            if p.stop is None:
                if self.launch(p):
                    trials = None
                p.stop = self.stop_reason(p)
            if self.on_tick is not None:
                self.on_tick(self, p)
            if once or (self.settle() and p.running == 0):
                return p
            time.sleep(self.poll_s)

    def _cancel_running(self) -> None:
        for t in self.trials():
            if t.state == TrialState.RUNNING and JOB_ID in t.user_attrs:
                with contextlib.suppress(UsageError):  # it ended meanwhile
                    self.backend.cancel(int(t.user_attrs[JOB_ID]))
                self.study._storage.set_trial_user_attr(t._trial_id, LOST, "cancelled: too many trials failed")
                self._tell(t.number, state=TrialState.FAIL)


def spent(store: Store, job_ids: Iterable[int]) -> tuple[float, float]:
    """GPU-hours and money of the trials' jobs so far (the ledger's own figures)."""
    from gpufleet.cost.ledger import build_ledger
    from gpufleet.cost.rates import load_rates
    from gpufleet.cost.usage import store_usages

    ledger = build_ledger(store_usages(store, job_ids=list(job_ids)), load_rates())
    return ledger.total.total_gpu_hours, ledger.total.money


__all__ = [
    "JOB_ID",
    "JOB_NAME",
    "Progress",
    "SweepDriver",
    "check_storage",
    "metric_values",
    "open_study",
    "spent",
    "storage_errors",
    "storage_url",
    "suggest",
    "sweep_dir",
    "trial_job_name",
]
