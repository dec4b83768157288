"""The fault table: how a 2-rank DDP job recovers from each kind of fault, and whether it ends bit-exact.

    .venv/bin/python bench/chaos.py [--json] [--short] [--faults a,b,..] [--steps N]
                                    [--recovery wait|requeue] [--memory | --no-memory]

Every run is ``gpufleet.workloads.tinylm:train`` (its one-layer ``TINY`` shape) on 2 ranks with DDP,
gloo on CPU, on the local backend: a fresh ``GPUFLEET_HOME`` and memory-tier root per run, and the
home's own scheduler process (the one ``gpufleet submit`` starts, so a fault can kill it). First an
uninterrupted baseline run; then, for each fault, the same job, hit once it has reported a step
past a third of its steps:

==================  =================================================================================
``sigterm``         SIGTERM to the attempt's process group (a preemption: save, requeue, resume)
``kill9-rank``      ``kill -9`` of rank 1 (its PID from the ``group`` event)
``hang-rank``       SIGSTOP of rank 1, ``distributed.timeout_seconds`` 10 (20 elsewhere): the collectives time out
``nan-rank``        a NaN loss on rank 1 only (``GPUFLEET_FAULT=nan@P:r1``): every rank rolls back
``corrupt-ram``     rank 1 stopped, bytes of its own RAM copies flipped, then ``kill -9``
``corrupt-disk``    bytes of the newest disk checkpoint's largest shard flipped, then SIGTERM to the group
``scheduler-crash`` ``kill -9`` of the local scheduler; the next one (as the next command starts it) adopts
``notice-kill``     SIGUSR1 to the group (what a preemption notice becomes), SIGKILL once it has saved
``lost-keeper``     ``kill -9`` of the memory keeper, then ``kill -9`` of rank 1
``node-lost``       every rank and the keeper SIGKILLed, the job's memory-tier folder removed
==================  =================================================================================

Each row is measured from the job's events (``events.jsonl``, rank 0 writes them): the fault's
moment (recorded by the harness; for ``nan-rank``, the ``unhealthy`` event) to the first ``step``
event after the first ``restore`` that follows it; steps lost: the newest step reported before the
fault minus the restored step (never below 0); tier: the restore's ``tier`` ("own", "peer", "disk";
absent means disk); PIDs restarted: the ranks whose PID differs between the ``group`` event before
the fault and the first ``group`` (or ``group_reformed``) event after it; bitwise equal: a sha256
over the model and optimizer tensors of the job's final checkpoint, against the baseline's. A
rollback skips the bad batches, so ``nan-rank`` is compared with a run that skips the same batches
at the same step without any fault (the ``rollback`` event names them).

A fault that needs a part this build lacks (the memory tier's own copies, its keeper) gives a row
"n/a (needs ...)". Exit 1 when any row is not bitwise equal or a run failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _common as common

RANKS = 2
BENCH_DIR = Path(__file__).resolve().parent
PHASE_TIMEOUT_S = 300.0
"""A safety net only: every wait is on a state (an event, a file, a job state), never a sleep."""
CKPT_EVERY = 10
"""Disk checkpoint interval in steps; the memory tier (``--memory``) snapshots every step."""
GROUP_TIMEOUT_S = 20.0
"""``distributed.timeout_seconds`` of every run: a broken collective fails within it."""
HANG_TIMEOUT_S = 10.0
"""The same for ``hang-rank``, whose stopped rank only a collective's timeout reveals."""
SHORT_FAULTS = ("sigterm", "kill9-rank", "corrupt-disk")


class NotAvailable(Exception):
    """The fault needs a part this build (or these flags) lack: its row says so instead of failing."""


class JobEnded(RuntimeError):
    """The job ended before the state a harness waited for."""


@dataclass(frozen=True, slots=True)
class Setup:
    """What every run of one table shares; the baseline runs with it too."""

    steps: int
    recovery: str
    memory: bool
    step_seconds: float = 0.02

    @property
    def fault_step(self) -> int:
        """The step a run must report before its fault strikes (past the first disk checkpoint)."""
        return max(CKPT_EVERY + 2, self.steps // 3)


def job_spec(
    setup: Setup, *, name: str, timeout_s: float = GROUP_TIMEOUT_S, skip: tuple[int, int] | None = None
) -> Any:
    """The job of every row: tinylm on 2 DDP ranks; ``skip`` runs the reference of a rollback instead."""
    from gpufleet.spec import parse_spec
    from gpufleet.workloads.tinylm import TINY

    args: dict[str, Any] = {**TINY, "steps": setup.steps, "step_seconds": setup.step_seconds}
    entrypoint = "gpufleet.workloads.tinylm:train"
    if skip is not None:
        entrypoint, args = "chaos:train_skipping", {**args, "skip_at": skip[0], "skip_to": skip[1]}
    checkpoint: dict[str, Any] = {"every_steps": CKPT_EVERY, "keep": 3, "grace_seconds": 60}
    if setup.memory:
        checkpoint["memory"] = {"every_steps": 1}
    return parse_spec(
        {
            "name": name,
            "entrypoint": entrypoint,
            "args": args,
            "resources": {"gpus": RANKS, "cpus": RANKS},
            "distributed": {"strategy": "ddp", "timeout_seconds": timeout_s, "recovery": setup.recovery},
            "checkpoint": checkpoint,
            "max_restarts": 5,
            # each elastic replica judges only its own share of the batch: it marks, it does not roll back alone
            **({"health": {"action": "mark"}} if setup.recovery == "continue" else {}),
        },
        source="bench",
    )


def train_skipping(skip_at: int, skip_to: int, **args: Any) -> dict[str, Any]:
    """tinylm, whose data jumps to position ``skip_to`` once step ``skip_at`` has ended: a rollback's outcome
    (back to a healthy step, the bad batches skipped) reached without a fault."""
    from gpufleet.workloads.tinylm import train

    def jump(sess: Any) -> None:
        if sess.step == skip_at and sess.data_position < skip_to:
            sess.data_position = skip_to

    return train(**args, on_step=jump)


# ---- one run on a fresh home --------------------------------------------------------------------


class Harness:
    """One job on a fresh ``GPUFLEET_HOME``, run by that home's own scheduler process."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.home = Path(tempfile.mkdtemp(prefix=f"gpufleet-chaos-{label}-"))
        shm_parent = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        self.shm = Path(tempfile.mkdtemp(prefix="gpufleet-chaos-shm-", dir=shm_parent))
        self.job_id = 0
        self._saved: dict[str, str | None] = {}
        self.backend: Any = None

    def __enter__(self) -> Harness:
        env = {
            "GPUFLEET_HOME": str(self.home),
            "GPUFLEET_LOCAL_SLOTS": str(RANKS),
            "GPUFLEET_LOG_EVERY_S": "0",
            "GPUFLEET_SCHEDULER_IDLE_S": "5",
            "GPUFLEET_SHM_DIR": str(self.shm),
        }
        self._saved = common.set_environ(env)
        from gpufleet.backends.local import LocalBackend

        self.backend = LocalBackend(self.home)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._stop_everything()
        finally:
            if self.backend is not None:
                self.backend.store.close()
            common.restore_environ(self._saved)
            shutil.rmtree(self.home, ignore_errors=True)
            shutil.rmtree(self.shm, ignore_errors=True)

    def _stop_everything(self) -> None:
        """The scheduler (it preempts what still runs, then exits) and the job's memory keeper."""
        from gpufleet.backends.local import scheduler_pid

        pid = scheduler_pid(self.home)
        if pid is not None and pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                wait_for("the scheduler to exit", lambda: scheduler_pid(self.home) is None, 60.0)
        if self.job_id:
            release_memory_tier(self.job_dir)
        for pid in processes_naming(self.home):  # a keeper started again after the recorded one was lost
            kill(pid, signal.SIGKILL)

    # ---- the job --------------------------------------------------------------------------------
    @property
    def job_dir(self) -> Path:
        return self.home / "jobs" / str(self.job_id)

    def submit(self, spec: Any, env: dict[str, str] | None = None) -> int:
        self.job_id = int(self.backend.submit(spec, env))
        return self.job_id

    def events(self) -> list[dict[str, Any]]:
        from gpufleet.jobs.events import read_events

        path = self.job_dir / "events.jsonl"
        return read_events(path)[0] if path.exists() else []

    def state(self) -> str:
        return str(self.backend.store.job(self.job_id).state)

    def wait_events(self, what: str, found: Callable[[list[dict[str, Any]]], Any]) -> Any:
        """The first truthy ``found(events)``; fails fast when the job ends first."""
        from gpufleet.jobs.store import TERMINAL

        result: Any = None

        def done() -> bool:
            nonlocal result
            result = found(self.events())
            if not result and self.state() in TERMINAL:
                raise JobEnded(f"the job ended ({self.state()}) before {what}")
            return bool(result)

        wait_for(what, done, PHASE_TIMEOUT_S)
        return result

    def wait_while_running(self, what: str, found: Callable[[], Any]) -> Any:
        """The first truthy ``found()``, or ``None`` when the job ends first (a part it never used)."""
        try:
            return self.wait_events(what, lambda _: found())
        except JobEnded:
            return None

    def wait_step(self, step: int) -> None:
        """Until the job has reported ``step`` and committed a disk checkpoint."""

        def past(evs: list[dict[str, Any]]) -> bool:
            steps = any(e["kind"] == "step" and e.get("step", 0) >= step for e in evs)
            return steps and any(e["kind"] == "checkpoint" for e in evs)

        self.wait_events(f"step {step} and a checkpoint", past)

    def wait_end(self) -> str:
        from gpufleet.jobs.store import TERMINAL

        wait_for("the job's end", lambda: self.state() in TERMINAL, PHASE_TIMEOUT_S)
        return self.state()

    def attempt_pid(self) -> int:
        attempts = self.backend.store.attempts(self.job_id)
        if not attempts or attempts[-1].pid is None:
            raise RuntimeError("the running attempt has no recorded PID")
        return int(attempts[-1].pid)

    def rank_pids(self) -> dict[int, int]:
        return pids_at(self.events(), time.time())

    def keeper_pid(self) -> int | None:
        try:
            data = json.loads((self.job_dir / "memory-keeper.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        pid = data.get("pid") if isinstance(data, dict) else None
        return pid if isinstance(pid, int) and pid > 0 else None

    def own_copies(self, rank: int) -> list[Path]:
        """Files of ``rank``'s own RAM copies (``<shm root>/<job key>/rank-<R>/``)."""
        return sorted(p for d in self.shm.glob(f"*/rank-{rank}") for p in d.rglob("*") if p.is_file())

    def digest(self, steps: int) -> str:
        """sha256 of the model and optimizer state of the job's newest verified checkpoint (at ``steps``)."""
        from gpufleet.runtime.checkpoint import CheckpointDir
        from gpufleet.runtime.sharded import full_state

        found = CheckpointDir(self.job_dir / "checkpoints").scan()
        newest = found[-1] if found else None
        if newest is None or newest.manifest is None:
            raise RuntimeError("the job left no verified checkpoint")
        if newest.step != steps:
            raise RuntimeError(f"the newest checkpoint is at step {newest.step}, not {steps}")
        state = full_state(newest.path, newest.manifest)
        return state_digest({"model": state["model"], "optimizer": state["optimizer"]})


def release_memory_tier(job_dir: Path) -> None:
    """Stop the job's memory keeper and drop its RAM copies (nothing to do in a build without the tier)."""
    try:
        from gpufleet.runtime.memtier import release
    except ImportError:
        return
    release(job_dir)


def processes_naming(folder: Path) -> list[int]:
    """PIDs whose command line names ``folder`` (what a run started and nothing ended), from ``/proc``."""
    needle, found = str(folder).encode(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def wait_for(what: str, done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.02)


def state_digest(state: Any) -> str:
    """sha256 over every leaf in key order: a tensor's dtype, shape and raw bytes, any other value's repr."""
    import torch

    h = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                h.update(repr(key).encode())
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                feed(item)
        else:
            h.update(repr(value).encode())

    feed(state)
    return h.hexdigest()


def flip_bytes(path: Path, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of ``path``, in place."""
    size = path.stat().st_size
    at = max(0, size // 2 - count // 2)
    with path.open("r+b") as fh:
        fh.seek(at)
        chunk = fh.read(count)
        fh.seek(at)
        fh.write(bytes(b ^ 0xFF for b in chunk))


def kill(pid: int, sig: int, *, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if group else os.kill)(pid, sig)


# ---- the faults ---------------------------------------------------------------------------------


Inject = Callable[[Harness], float]
"""Strikes the running job; returns the fault's moment (unix time)."""


def fault_sigterm(h: Harness) -> float:
    at = time.time()
    kill(h.attempt_pid(), signal.SIGTERM, group=True)
    return at


def fault_kill9_rank(h: Harness) -> float:
    pid = rank_pid(h, 1)
    at = time.time()
    kill(pid, signal.SIGKILL)
    return at


def fault_hang_rank(h: Harness) -> float:
    pid = rank_pid(h, 1)
    at = time.time()
    kill(pid, signal.SIGSTOP)
    return at


def fault_nan_rank(h: Harness) -> float:
    found = h.wait_events("the NaN step", lambda evs: [e for e in evs if e["kind"] == "unhealthy"])
    return float(found[0]["ts"])


def fault_corrupt_ram(h: Harness) -> float:
    if not h.wait_while_running("rank 1's own RAM copy", lambda: h.own_copies(1)):
        raise NotAvailable("needs the memory tier's own copies")
    pid = rank_pid(h, 1)
    kill(pid, signal.SIGSTOP)  # no snapshot replaces a copy between the flip and the kill
    for path in h.own_copies(1):
        flip_bytes(path)
    at = time.time()
    kill(pid, signal.SIGKILL)
    return at


def fault_corrupt_disk(h: Harness) -> float:
    from gpufleet.runtime.checkpoint import CheckpointDir

    found = CheckpointDir(h.job_dir / "checkpoints").scan(verify=False)
    if not found:
        raise RuntimeError("no disk checkpoint to corrupt")
    shards = [p for p in found[-1].path.iterdir() if p.is_file() and p.name != "manifest.json"]
    flip_bytes(max(shards, key=lambda p: p.stat().st_size))
    return fault_sigterm(h)


def fault_scheduler_crash(h: Harness) -> float:
    from gpufleet.backends.local import ensure_scheduler, scheduler_pid

    pid = int((h.home / "scheduler.pid").read_text(encoding="utf-8").strip())
    at = time.time()
    kill(pid, signal.SIGKILL)
    wait_for("the scheduler's death", lambda: scheduler_pid(h.home) is None, PHASE_TIMEOUT_S)
    ensure_scheduler(h.home)  # what the next `gpufleet` command does when it finds none
    return at


def fault_notice_kill(h: Harness) -> float:
    attempt = len(h.backend.store.attempts(h.job_id))
    group = h.attempt_pid()
    at = time.time()
    kill(group, signal.SIGUSR1, group=True)

    def saved(evs: list[dict[str, Any]]) -> bool:
        mine = [e for e in evs if e.get("attempt") == attempt and e["ts"] >= at]
        return any(e["kind"] == "session_end" or e.get("reason") == "preempt" for e in mine)

    h.wait_events("the save after the notice", saved)
    kill(group, signal.SIGKILL, group=True)
    return at


def fault_lost_keeper(h: Harness) -> float:
    keeper = h.wait_while_running("the memory keeper's record", h.keeper_pid)
    if keeper is None:
        raise NotAvailable("needs the memory tier's keeper")
    pid = rank_pid(h, 1)
    at = time.time()
    kill(keeper, signal.SIGKILL)
    kill(pid, signal.SIGKILL)
    return at


def fault_node_lost(h: Harness) -> float:
    pids = list(h.rank_pids().values())
    keeper = h.keeper_pid()
    at = time.time()
    for pid in pids + ([keeper] if keeper is not None else []):
        kill(pid, signal.SIGKILL)
    for folder in h.shm.iterdir():
        shutil.rmtree(folder, ignore_errors=True)
    return at


def rank_pid(h: Harness, rank: int) -> int:
    pids = h.rank_pids()
    if rank not in pids:
        raise RuntimeError(f"no `group` event names rank {rank}'s PID")
    return pids[rank]


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    inject: Inject
    needs_memory: bool = False
    timeout_s: float = GROUP_TIMEOUT_S
    fault_env: bool = False
    """The fault is planted at submit (``GPUFLEET_FAULT``) rather than struck while the job runs."""


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("sigterm", fault_sigterm),
        Fault("kill9-rank", fault_kill9_rank),
        Fault("hang-rank", fault_hang_rank, timeout_s=HANG_TIMEOUT_S),
        Fault("nan-rank", fault_nan_rank, fault_env=True),
        Fault("corrupt-ram", fault_corrupt_ram, needs_memory=True),
        Fault("corrupt-disk", fault_corrupt_disk),
        Fault("scheduler-crash", fault_scheduler_crash),
        Fault("notice-kill", fault_notice_kill),
        Fault("lost-keeper", fault_lost_keeper, needs_memory=True),
        Fault("node-lost", fault_node_lost),
    )
}


# ---- measuring a row from the events ------------------------------------------------------------


def pids_at(events: list[dict[str, Any]], ts: float) -> dict[int, int]:
    """Each rank's PID as the newest ``group`` event at or before ``ts`` lists it."""
    groups = [e for e in events if e["kind"] == "group" and e["ts"] <= ts]
    return {int(r["rank"]): int(r["pid"]) for r in (groups[-1].get("ranks", []) if groups else [])}


def pids_after(events: list[dict[str, Any]], ts: float) -> dict[int, int]:
    """Each rank's PID after ``ts``: the first ``group_reformed`` (its ``pids``) or ``group`` event after it."""
    for e in events:
        if e["ts"] <= ts:
            continue
        if e["kind"] == "group_reformed" and isinstance(e.get("pids"), dict):
            return {int(rank): int(pid) for rank, pid in e["pids"].items()}
        if e["kind"] == "group":
            return {int(r["rank"]): int(r["pid"]) for r in e.get("ranks", [])}
    return {}


@dataclass
class Row:
    fault: str
    recovery: str = "-"
    seconds: float | None = None
    """From the fault to the first ``step`` event after the restore that follows it."""
    steps_lost: int | None = None
    tier: str | None = None
    restarted: list[int] | None = None
    """Ranks whose PID changed across the fault."""
    equal: bool | None = None
    skipped: list[str] = field(default_factory=list)
    """What the restore passed over: ``tier_skipped`` tiers, ``checkpoint_skipped`` steps."""
    na: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.na is not None or (self.error is None and self.equal is True)

    def cells(self) -> list[str]:
        if self.na is not None:
            return [self.fault, f"n/a ({self.na})", "-", "-", "-", "-", "-"]
        restarted = "-" if self.restarted is None else (",".join(f"r{r}" for r in self.restarted) or "none")
        return [
            self.fault,
            self.recovery,
            "-" if self.seconds is None else f"{self.seconds:.2f}",
            "-" if self.steps_lost is None else str(self.steps_lost),
            self.tier or "-",
            restarted,
            {True: "yes", False: "NO", None: "NO (run failed)"}[self.equal],
        ]


def measure(row: Row, events: list[dict[str, Any]], fault_ts: float) -> None:
    """Fill in ``row`` from the job's events and the fault's moment."""
    after = [e for e in events if e["ts"] > fault_ts]
    restore = next((e for e in after if e["kind"] == "restore"), None)
    row.recovery = recovery_of(events, fault_ts)
    before = [int(e["step"]) for e in events if e["kind"] == "step" and e["ts"] <= fault_ts]
    if restore is not None:
        row.tier = "none" if restore.get("step") is None else str(restore.get("tier") or "disk")
        row.steps_lost = max(0, (max(before) if before else 0) - int(restore.get("step") or 0))
        resumed = next((e for e in after if e["kind"] == "step" and e["ts"] >= restore["ts"]), None)
        row.seconds = None if resumed is None else resumed["ts"] - fault_ts
    old, new = pids_at(events, fault_ts), pids_after(events, fault_ts)
    row.restarted = sorted(r for r in old if r in new and new[r] != old[r]) if new else []
    row.skipped = [
        f"{e.get('tier')}:{e.get('reason')}" if e["kind"] == "tier_skipped" else f"step {e.get('step')}"
        for e in after
        if e["kind"] in ("tier_skipped", "checkpoint_skipped")
    ]


def recovery_of(events: list[dict[str, Any]], fault_ts: float) -> str:
    """How the job went on: a rollback in place, a re-formed group, or a new attempt."""
    after = [e for e in events if e["ts"] > fault_ts]
    reformed = [e for e in after if e["kind"] == "group_reformed"]
    if any(e["kind"] == "rollback" for e in after):
        return "rollback"
    if reformed:
        return f"wait (gen {reformed[0].get('generation', '?')})"
    attempts = {int(e.get("attempt", 1)) for e in events}
    before = [int(e.get("attempt", 1)) for e in events if e["ts"] <= fault_ts]
    if before and max(attempts) > max(before):
        return f"requeue (attempt {max(attempts)})"
    return "-"


# ---- the table ----------------------------------------------------------------------------------


def run_baseline(setup: Setup, skip: tuple[int, int] | None = None) -> str:
    """The digest of an uninterrupted run (with ``skip``: one whose data skips as a rollback did)."""
    label = "baseline" if skip is None else "reference"
    env = (
        None
        if skip is None
        else {"PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")]))}
    )
    with Harness(label) as h:
        h.submit(job_spec(setup, name=f"chaos-{label}", skip=skip), env)
        state = h.wait_end()
        if state != "completed":
            raise RuntimeError(f"the {label} run ended {state}: {h.backend.store.job(h.job_id).reason}")
        return h.digest(setup.steps)


def run_fault(fault: Fault, setup: Setup, baseline: str) -> Row:
    row = Row(fault.name)
    if fault.needs_memory and not setup.memory:
        row.na = "needs --memory"
        return row
    env = {"GPUFLEET_FAULT": f"nan@{setup.fault_step}:r1"} if fault.fault_env else None
    reference: tuple[int, int] | None = None
    try:
        with Harness(fault.name) as h:
            h.submit(job_spec(setup, name=f"chaos-{fault.name}", timeout_s=fault.timeout_s), env)
            if not fault.fault_env:
                h.wait_step(setup.fault_step)
            fault_ts = fault.inject(h)
            state = h.wait_end()
            events = h.events()
            measure(row, events, fault_ts)
            if state != "completed":
                raise RuntimeError(f"the job ended {state}: {h.backend.store.job(h.job_id).reason}")
            digest = h.digest(setup.steps)
            reference = rollback_skip(events, fault_ts)
        if fault.fault_env:
            if reference is None:
                raise RuntimeError("no rollback followed the NaN")
            baseline = run_baseline(setup, skip=reference)
        row.equal = digest == baseline
    except NotAvailable as err:
        row.na = str(err)
    except (RuntimeError, TimeoutError, OSError) as err:
        row.error = str(err)
    return row


def rollback_skip(events: list[dict[str, Any]], fault_ts: float) -> tuple[int, int] | None:
    """The step a rollback after ``fault_ts`` went back to and the data position it went on from."""
    for e in events:
        if e["kind"] == "rollback" and e["ts"] >= fault_ts:
            return int(e["to_step"]), int(e["skip_to"])
    return None


HEADER = ["fault", "recovery", "fault->stepping s", "steps lost", "tier", "PIDs restarted", "bitwise equal"]


def render(setup: Setup, rows: list[Row], baseline_error: str | None) -> str:
    title = (
        f"Faults against tinylm on {RANKS} DDP ranks (gloo, local backend; {setup.steps} steps, disk checkpoint "
        f"every {CKPT_EVERY}, memory tier {'every step' if setup.memory else 'off'}, recovery {setup.recovery})"
    )
    body = [["baseline", "-", "-", "-", "-", "-", "reference" if baseline_error is None else "NO (run failed)"]]
    table = common.format_table(title, HEADER, body + [r.cells() for r in rows])
    notes = [f"{r.fault}: skipped {', '.join(r.skipped)}" for r in rows if r.skipped]
    notes += [f"{r.fault}: {r.error}" for r in rows if r.error]
    if baseline_error:
        notes.append(f"baseline: {baseline_error}")
    return "\n".join([table, *notes])


def choose_faults(text: str | None, short: bool) -> list[str]:
    names = list(SHORT_FAULTS) if short and text is None else list(FAULTS)
    if text is not None:
        names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAULTS]
    if unknown or not names:
        raise ValueError(
            f"--faults {text!r}: unknown {', '.join(unknown) or 'none given'}; choose from {', '.join(FAULTS)}"
        )
    return names


def run_table(setup: Setup, names: list[str]) -> tuple[list[Row], str | None]:
    """The baseline, then one row per fault (a failed baseline fails every row)."""
    common.progress(f"baseline: {setup.steps} steps, uninterrupted")
    try:
        baseline = run_baseline(setup)
    except (RuntimeError, TimeoutError, OSError) as err:
        return [Row(n, error="no baseline") for n in names], str(err)
    rows = []
    for name in names:
        common.progress(f"fault {name}")
        rows.append(run_fault(FAULTS[name], setup, baseline))
        common.progress(f"  {' | '.join(rows[-1].cells())}" + (f" ({rows[-1].error})" if rows[-1].error else ""))
    return rows, None


def main(argv: list[str]) -> int:
    p = common.parser("Faults against a 2-rank DDP job: recovery time, steps lost, tier, and bit-exactness.")
    p.add_argument("--short", action="store_true", help=f"only {', '.join(SHORT_FAULTS)}, and fewer steps")
    p.add_argument("--faults", default=None, help=f"comma-separated faults (default all: {', '.join(FAULTS)})")
    p.add_argument("--steps", type=int, default=None, help="steps of every run (default 60; 30 with --short)")
    p.add_argument(
        "--recovery", choices=("wait", "requeue"), default="wait", help="distributed.recovery (default wait)"
    )
    p.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a memory tier snapshotting every step (default on)",
    )
    args = p.parse_args(argv)
    try:
        names = choose_faults(args.faults, args.short)
    except ValueError as err:
        p.error(str(err))
    steps = args.steps if args.steps is not None else (30 if args.short else 60)
    if steps < 3 * CKPT_EVERY:
        p.error(f"--steps {steps}: give at least {3 * CKPT_EVERY}, so a fault lands past a disk checkpoint")
    setup = Setup(steps=steps, recovery=args.recovery, memory=args.memory)
    rows, baseline_error = run_table(setup, names)
    ok = baseline_error is None and all(r.ok for r in rows)
    result: dict[str, Any] = {
        "benchmark": "chaos",
        "setup": asdict(setup),
        "baseline_error": baseline_error,
        "rows": [{**asdict(r), "ok": r.ok} for r in rows],
    }
    failed = [r.fault for r in rows if not r.ok]
    verdict = (
        "every fault recovered bit-exact" if ok else f"not bitwise equal or failed: {', '.join(failed) or 'baseline'}"
    )
    return common.finish(
        json_mode=args.json, result=result, table=render(setup, rows, baseline_error), verdict=verdict, ok=ok
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
