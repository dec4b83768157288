"""JobSpec: what to run, for whom, on what, and how to survive preemption.

A JobSpec is loaded from YAML, validated by pydantic (unknown fields are errors), and frozen.
The same spec runs unchanged on every backend::

    name: tinylm
    team: perception
    entrypoint: gpufleet.workloads.tinylm:train   # a Python module:function, or a command
    args: {steps: 400}                             # keyword arguments for a module:function
    resources: {gpu_type: L4, gpus: 1, cpus: 1}
    priority: 10                                   # higher preempts lower
    checkpoint: {every_steps: 50, keep: 3, grace_seconds: 30}
    max_restarts: 5

Floor 2 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...).
"""

from __future__ import annotations

import ast
import datetime
import inspect
import itertools
import math
import re
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from gpufleet.errors import SpecError
from gpufleet.paths import NAME_HINT, NAME_RE
from gpufleet.spec.gpu_source import PATTERNS, check_scrape_url
from gpufleet.yamlio import read_yaml, validate

CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_STEPS = 10**9
"""Most steps between two checkpoints (and batches skipped after a bad step): a billion."""
WEEK_S = 7 * 24 * 3600.0
"""Most seconds between two checkpoints, or one save, restore or step takes: a week."""
NAME_MAX = 255
"""Longest file or folder name, in bytes (ext4, XFS, btrfs); a longer one in ``workdir`` cannot be entered."""


def _clip(text: str, limit: int = 80) -> str:
    """``text`` on one line and at most ``limit`` characters, for naming a user-written path in a message."""
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_hint(item: Any) -> str:
    """What a YAML value that JSON cannot hold is, and what to write instead."""
    if isinstance(item, datetime.date):
        return f"a date or time ({item.isoformat()}): quote it to pass it as text"
    if isinstance(item, bytes | bytearray):
        return "binary data (!!binary): pass it as text, e.g. base64 in a string"
    if isinstance(item, set | frozenset):
        return "a set (!!set): write a list"
    if isinstance(item, tuple):
        return "a pair (from !!omap or !!pairs): write a mapping"
    return f"a {type(item).__name__}: args hold text, numbers, true/false, null, lists and mappings"


def _field_error(model: str, loc: tuple[str, ...], value: Any, message: str) -> ValidationError:
    """A validation error of a cross-field rule, located at the field the user has to change."""
    error = PydanticCustomError("value_error", "{message}", {"message": message})
    return ValidationError.from_exception_data(model, [InitErrorDetails(type=error, loc=loc, input=value)])


class _Frozen(BaseModel):
    # inf and NaN are refused everywhere: JSON cannot store them, so the job could not be read back.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Resources(_Frozen):
    """What one attempt occupies."""

    gpu_type: str = "cpu"
    """Accelerator model used for pricing and placement (``cpu`` for none)."""
    gpus: int = Field(default=1, ge=0, le=1024)
    """GPUs per node (virtual slots on the local backend)."""
    cpus: int = Field(default=1, ge=1, le=1024)
    """CPU threads per node, shared by its ranks (``torch.set_num_threads(cpus // ranks)``)."""
    nodes: int = Field(default=1, ge=1, le=1024)
    """Nodes the job spans; more than one needs a ``distributed`` block."""


class KeepBest(_Frozen):
    """The checkpoint with the best value of a logged metric survives pruning."""

    metric: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")
    """A metric passed to ``report(**metrics)`` or ``log(kind, **data)``, e.g. ``val_loss``."""
    mode: Literal["min", "max"] = "min"
    """Whether the best value is the lowest (``min``) or the highest (``max``)."""


class MemoryTier(_Frozen):
    """``checkpoint: {memory: {every_steps: N}}``: a copy of every rank's state in RAM that outlives the rank.

    Each snapshot (model, optimizer, RNG, data position, the session's own state: what a disk
    checkpoint holds) goes to shared memory the job owns on the node, and a second copy to a peer's
    keeper, so that losing one process or one node loses no copy. Every copy is hashed; a restore tries
    the own copy, then the peer's, then the disk, each verified before use."""

    every_steps: int | Literal["auto"] = 1
    """Steps between two snapshots (1: every step), or ``auto``: the fewest steps whose snapshot costs at
    most 2 % of the step time, from the measured snapshot cost."""
    peer: bool = True
    """Also send each snapshot to a peer's keeper (another node's on a fleet; a keeper process of the
    attempt on one machine). ``false`` keeps only the node's own copy."""

    @field_validator("every_steps")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_STEPS:
            raise ValueError(f"checkpoint.memory.every_steps={value} is invalid: give 1 to {MAX_STEPS:,} or auto")
        return value


class CheckpointPolicy(_Frozen):
    """When to save, how many to keep, and how long a preempted job has to save."""

    every_steps: int | None = Field(default=50, ge=1, le=MAX_STEPS)
    """Save every this many steps."""
    every_seconds: float | None = Field(default=None, gt=0, le=WEEK_S)
    """Save every this many seconds (with ``every_steps``, whichever is due first)."""
    every: Literal["auto"] | None = None
    """``auto``: save at Daly's interval for this run's measured save time and its preemption rate,
    re-estimated as saves are measured (``gpufleet.runtime.interval``). ``every_steps`` then defaults
    to none; an ``every_steps`` or ``every_seconds`` given as well still saves when it is due."""
    preemptions_per_hour: float | None = Field(default=None, ge=0, le=3600)
    """The preemption rate ``every: auto`` plans for (at most one a second) when the backend exports
    none in ``$GPUFLEET_PREEMPTIONS_PER_HOUR`` (e.g. the catalogue rate of the pool it runs on)."""
    keep: int = Field(default=3, ge=1, le=1000)
    """Newest checkpoints kept; the newest healthy one is always kept as well."""
    grace_seconds: float = Field(default=30.0, gt=0, le=3600)
    """Time between SIGTERM and SIGKILL when the job is preempted or cancelled."""
    keep_best: KeepBest | None = None
    """Also keep the healthy checkpoint with the best value of this metric (a new best is saved)."""
    on_no_space: Literal["continue", "requeue"] = "continue"
    """A save that finds the disk full: ``continue`` training and try again at the next interval,
    or ``requeue`` the job (exit 75) to run where there is room. The last good checkpoint stays."""
    memory: MemoryTier | None = None
    """A memory tier (:class:`MemoryTier`): snapshots in RAM, restored before the disk is read. Disk
    checkpoints go on at their own cadence."""
    async_save: bool = Field(default=False, alias="async")
    """``async: true`` (distributed jobs): a periodic save copies the state in memory and writes it in
    the background while training goes on; its manifest is committed when the write is done, and a
    preemption, a rollback or the end of training waits for the write in flight. Costs a second copy
    of the state in host memory while a write runs."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _auto_replaces_steps(cls, data: Any) -> Any:
        """``every: auto`` without an ``every_steps`` of its own does not also save every 50 steps."""
        if isinstance(data, dict) and data.get("every") == "auto" and "every_steps" not in data:
            return {**data, "every_steps": None}
        return data

    @model_validator(mode="after")
    def _some_trigger(self) -> CheckpointPolicy:
        if self.every_steps is None and self.every_seconds is None and self.every is None:
            raise ValueError("set checkpoint.every_steps, checkpoint.every_seconds or checkpoint.every: auto")
        if self.preemptions_per_hour is not None and self.every is None:
            raise ValueError("checkpoint.preemptions_per_hour is the rate every: auto plans for: set every: auto too")
        return self


class HealthPolicy(_Frozen):
    """How a bad step is recognised and what is done about it (PaLM, section 5.1)."""

    spike_zscore: float | None = Field(default=8.0, gt=0)
    """Robust z-score (median / MAD over ``window`` healthy losses) above which a loss is a spike;
    ``null`` disables spike detection (NaN and inf are always unhealthy)."""
    window: int = Field(default=50, ge=5, le=100_000)
    """Healthy losses the z-score is computed over."""
    min_history: int = Field(default=20, ge=3, le=100_000)
    """Healthy losses needed before spikes are judged."""
    action: Literal["rollback", "mark"] = "rollback"
    """``rollback``: restore the last healthy checkpoint and skip the offending data window;
    ``mark``: record the event and flag later checkpoints unhealthy until a healthy one follows."""
    max_rollbacks: int = Field(default=5, ge=0, le=1000)
    """Rollbacks a run may make; the next unhealthy step raises a ``HealthError`` instead."""
    skip_extra_batches: int = Field(default=0, ge=0, le=MAX_STEPS)
    """Batches skipped beyond the offending one (PaLM skipped 200-500 around a spike)."""

    @model_validator(mode="after")
    def _history_fits(self) -> HealthPolicy:
        if self.min_history > self.window:
            raise ValueError(f"health.min_history ({self.min_history}) must not exceed health.window ({self.window})")
        return self


GPU_SOURCE_HINT = "auto, none, nvml, synthetic:<pattern> or scrape:<http(s) URL of a dcgm-exporter>"


class Telemetry(_Frozen):
    """Where the job's GPU series come from, and what the diagnosis needs to know."""

    gpu_source: str = "auto"
    """``auto`` (NVML when a GPU is visible, else none), ``none``, ``nvml``, ``synthetic:<pattern>``
    (DCGM-shaped series with a chosen bottleneck, for laptops and demos) or ``scrape:<url>``
    (a node's dcgm-exporter, filtered to this job's ``hpc_job``)."""
    sample_seconds: float = Field(default=5.0, gt=0, le=3600)
    """Seconds between two GPU samples."""
    precision: Literal["bf16", "fp16", "fp8", "tf32", "fp32"] | None = None
    """Training dtype; the tensor-core rule only judges low-precision jobs."""

    @field_validator("gpu_source")
    @classmethod
    def _source(cls, value: str) -> str:
        kind, _, arg = value.partition(":")
        if value in ("auto", "none", "nvml"):
            return value
        if kind == "synthetic":
            if arg not in PATTERNS:
                raise ValueError(f"unknown synthetic GPU pattern {arg!r}; choose one of {', '.join(PATTERNS)}")
            return value
        if kind == "scrape":
            return f"scrape:{check_scrape_url(arg)}"
        raise ValueError(f"gpu_source {value!r} is not one of {GPU_SOURCE_HINT}")


class OfferChoice(_Frozen):
    """One acceptable (GPU type, provider, region), as SkyPilot's ``any_of``/``ordered`` entries.

    An unset ``gpu_type`` inherits ``resources.gpu_type``; an unset provider or region accepts any.
    """

    gpu_type: str | None = None
    """The GPU type; unset, ``resources.gpu_type``."""
    provider: str | None = None
    """The provider; unset, any."""
    region: str | None = None
    """The region; unset, any."""


class Placement(_Frozen):
    """What ``gpufleet place`` needs to choose an offer for the job."""

    workload: str = "training"
    """Workload class: a GPU type's relative throughput is looked up per class."""
    gpu_hours: float | None = Field(default=None, gt=0)
    """Expected work in GPU-hours on a GPU of relative throughput 1.0 for this workload."""
    deadline_hours: float | None = Field(default=None, gt=0, le=1e6)
    """The job must finish within this many hours of being placed."""
    any_of: list[OfferChoice] = Field(default_factory=list)
    """Acceptable choices, unordered (the cheapest wins), as SkyPilot's ``any_of``."""
    ordered: list[OfferChoice] = Field(default_factory=list)
    """Choices in order of preference, as SkyPilot's ``ordered``."""
    checkpoint_gb: float = Field(default=0.0, ge=0)
    """Checkpoint size, for the egress cost when the job moves between providers."""
    save_seconds: float | None = Field(default=None, ge=1e-6, le=WEEK_S)
    """Measured checkpoint save time; the interval advisor needs it."""
    restore_seconds: float = Field(default=60.0, ge=0, le=WEEK_S)
    """Time to restart and restore after a preemption."""
    step_seconds: float | None = Field(default=None, ge=1e-6, le=WEEK_S)
    """Measured seconds per step on the reference GPU (a microsecond to a week); turns intervals into steps."""
    memory_gib: float | None = Field(default=None, gt=0, le=10_000)
    """GPU memory one worker needs; GPU types with less are rejected."""

    @model_validator(mode="after")
    def _one_preference_kind(self) -> Placement:
        if self.any_of and self.ordered:
            raise ValueError("placement: give any_of or ordered, not both")
        return self


class Distributed(_Frozen):
    """A job of several ranks: ``resources.gpus`` ranks per node (one on a node without GPUs)."""

    strategy: Literal["none", "ddp", "fsdp"] = "none"
    """What the script does with the model (informational, for the runtime and the estimators)."""
    launcher: Literal["torchrun", "script"] = "torchrun"
    """``torchrun``: gpufleet starts the ranks with torchrun; ``script``: the command launches its
    own ranks, and gpufleet starts it once per node."""
    one_rank: bool = False
    """``true``: a world of one rank is a group too (torchrun starts one rank, checkpoints stay sharded).
    ``gpufleet resize --gpus 1`` sets it on a group, so the job keeps its launcher and resizes back;
    by default one rank with this block is refused as a likely mistake."""
    timeout_seconds: float = Field(default=300.0, gt=0, le=86400)
    """Process-group timeout: a lost or stuck rank fails every collective within it."""
    recovery: Literal["requeue", "wait", "continue"] | None = None
    """What the group does when a rank is lost. ``wait`` (exact; the default with a memory tier): the
    surviving ranks keep their processes, a replacement is started, the group re-forms and every rank
    goes on from the last step all of them committed, bit-exact. ``continue`` (elastic, torchft; DDP on
    one node, ``pip install 'gpufleet[elastic]'``): the survivors keep stepping with fewer replicas while
    a replacement starts and heals from a peer's live state; not bit-exact, the steps run short-handed
    and the samples skipped are recorded. ``requeue`` (the default otherwise): every rank exits and the
    job is run again from its checkpoint; also the fallback when ``wait`` or ``continue`` has not
    recovered within ``recovery_timeout_seconds``."""
    recovery_timeout_seconds: float = Field(default=120.0, gt=0, le=86400)
    """How long ``wait`` may take to re-form the group (``continue``: to heal a replacement) before the
    attempt is requeued instead."""
    straggler_factor: float = Field(default=1.5, gt=1.0, le=1000.0)
    """A rank whose compute or data wait a step exceeds the other ranks' median by this factor, over a
    sliding window of steps, is named a straggler (a ``straggler`` event: rank, host, phase, factor and
    the GPU-seconds the others spent waiting for it; ``gpufleet diagnose``). A rank only just this slow is
    named about one time in two: the measured ratio scatters by a few % (more on a shared CPU host)."""
    hang_factor: float = Field(default=10.0, gt=1.0, le=10000.0)
    """A step that has not ended after ``hang_factor`` times the job's rolling median step time (and at
    least ``hang_floor_seconds``) is a hang: the ranks that have not arrived are named with the phase each
    was in, and one that is frozen on this host (no progress, no CPU time) is killed, so the job's
    recovery policy applies before ``timeout_seconds`` runs out."""
    hang_floor_seconds: float = Field(default=30.0, gt=0, le=86400)
    """The least time without a step that counts as a hang, whatever the step time."""
    agree_every: int = Field(default=4, ge=1, le=1000)
    """Steps between two agreements of the ranks (one small all-reduce; they also meet at every step a
    checkpoint is due, and wait for each other there). Every step is still judged, on the same numbers
    on every rank, but up to ``agree_every`` steps late: an agreement that decides nothing is read at
    the next step boundary, its all-reduce overlapping that step's compute, so a bad step is rolled
    back a little later (more steps redone) and a preemption waits for the next agreement. A save
    only ever holds a state the ranks judged healthy. 1 judges every step one step late
    (``bench/dist_step_overhead.py --agree-every 1``)."""


class DataSource(_Frozen):
    """One source staged in before the first step of every attempt (``gpufleet.data.stage``)."""

    source: str = Field(min_length=1, max_length=4096)
    """A local path (absolute, or relative to the spec file), ``s3://bucket/prefix``, or any fsspec URL:
    one file, or every file under a prefix."""
    dest: str = Field(min_length=1, max_length=4096)
    """Folder it lands in, relative to the job's data folder (``$GPUFLEET_DATA_DIR``)."""
    cache: Literal["job", "shared"] = "job"
    """``job``: a scratch copy in the job's folder; ``shared``: read-only blobs in a cache shared by
    every job on the node, keyed by content, linked into the job's folder."""
    endpoint_url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://[^\s]+$")
    """An S3-compatible endpoint (MinIO, Ceph, a local server) for ``s3://`` sources."""
    allow_link_local: bool = False
    """Let the source or its ``endpoint_url`` name a link-local or cloud metadata address (169.254.0.0/16,
    fe80::/10, 169.254.169.254, fd00:ec2::254, metadata.google.internal), refused otherwise: there a
    node answers with its cloud credentials."""

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        from gpufleet.spec.sources import SCHEME_RE, split_source

        if SCHEME_RE.match(value) is None and "://" not in value and not value.startswith("/"):
            # relative: load_spec resolves it against the spec file, and split_source checks the result
            split_source("/" + value)  # what a path can hold: no NUL byte, not over PATH_MAX
            return value
        split_source(value)
        return value

    @field_validator("dest")
    @classmethod
    def _dest(cls, value: str) -> str:
        from gpufleet.spec.sources import check_dest

        return check_dest(value)

    @model_validator(mode="after")
    def _endpoint(self) -> DataSource:
        if self.endpoint_url is not None and not self.source.lower().startswith(("s3://", "s3a://")):
            raise ValueError(f"endpoint_url applies to s3:// sources only, not {_clip(self.source)}: remove it")
        if not self.allow_link_local:
            from gpufleet.spec.sources import check_hosts

            check_hosts(self.source, self.endpoint_url)
        return self


class DataPolicy(_Frozen):
    """Where a job's data comes from, and how it is staged in."""

    sources: list[DataSource] = Field(min_length=1, max_length=64)
    """What to stage in, each to its own folder."""
    workers: int = Field(default=8, ge=1, le=64)
    """Files copied at once."""
    verify: Literal["stat", "full"] = "stat"
    """A re-run reuses a file whose size and modification time match its manifest entry (``stat``),
    or hashes every file again (``full``)."""

    @field_validator("sources", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("the source list is empty: give at least one `{source: ..., dest: ...}`, or drop `data`")
        return value

    @model_validator(mode="after")
    def _distinct(self) -> DataPolicy:
        dests = [s.dest.rstrip("/") for s in self.sources]
        for i, a in enumerate(dests):
            for b in dests[i + 1 :]:
                if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                    raise ValueError(f"data destinations {a!r} and {b!r} overlap: give each source its own folder")
        return self


def _continue_refusal(spec: JobSpec) -> str | None:
    """What ``distributed.recovery: continue`` lacks in ``spec``, or ``None`` when it can run.

    Each rank is a torchft replica group of one that averages its gradients with the others
    (``runtime.elastic``): that is DDP, on the one node where gpufleet's own rank supervisor runs
    torchft's Lighthouse; sharded state (FSDP) cannot be healed from one peer, and a memory tier's
    copies belong to a group that re-forms as a whole.
    """
    assert spec.distributed is not None
    if spec.distributed.strategy != "ddp":
        return f"distributed.strategy: ddp (not {spec.distributed.strategy})"
    if spec.distributed.launcher != "torchrun":
        return f"distributed.launcher: torchrun (not {spec.distributed.launcher})"
    if spec.resources.nodes != 1:
        return f"resources.nodes: 1 (not {spec.resources.nodes})"
    if spec.checkpoint.memory is not None:
        return "no checkpoint.memory"
    if spec.health.action == "rollback":  # each replica judges its own share: one rolling back alone would diverge
        return "health.action: mark (not rollback: each replica judges only its own share of the batch)"
    return None


class JobSpec(_Frozen):
    """One training job, as a user writes it."""

    name: str
    """The job's name: lowercase letters, digits, ``.``, ``_``, ``-`` (it is used in paths)."""
    team: str = "default"
    """Who pays: cost is reported per team, and quotas are per team."""
    entrypoint: str | list[str]
    """``package.module:function`` (called with ``args``), or a command as a list or a string
    (split like a shell would, but never run by one)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for a ``module:function`` entrypoint (values JSON can hold)."""
    workdir: str | None = None
    """The folder an attempt runs in; a relative path is relative to the spec file (``.``: the spec's folder).
    Without it, a command entrypoint runs in the spec file's folder, and a ``module:function`` one in the
    folder the local scheduler was started from: set it when that module is a file of yours."""
    resources: Resources = Field(default_factory=Resources)
    priority: int = Field(default=0, ge=-1000, le=1000)
    """A higher priority preempts a lower one."""
    provider: str = "local"
    """Pricing key, with ``resources.gpu_type`` and ``spot``."""
    spot: bool = False
    """Priced as a spot (preemptible) instance."""
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    health: HealthPolicy = Field(default_factory=HealthPolicy)
    max_restarts: int = Field(default=10, ge=0, le=1000)
    """Requeues before the job is failed."""
    resume: Literal["auto", "never", "must"] = "auto"
    """``auto``: restore the newest healthy checkpoint when there is one; ``must``: fail when there
    is none; ``never``: start from scratch, and refuse a checkpoint directory holding another run's
    checkpoints (a requeued attempt of the same job still resumes)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for every attempt (``GPUFLEET_*`` is reserved)."""
    telemetry: Telemetry = Field(default_factory=Telemetry)
    placement: Placement = Field(default_factory=Placement)
    distributed: Distributed | None = None
    """Set for a job of more than one rank (see :attr:`world_size`); absent, the job is one process."""
    data: DataPolicy | None = None
    """Data staged in before the first step of every attempt (``gpufleet.data``)."""

    @field_validator("name", "team", "provider")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError(f"{value!r} is not a valid name: {NAME_HINT}")
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list):
            if not value or not all(isinstance(v, str) and v for v in value):
                raise ValueError("a command entrypoint must be a non-empty list of non-empty strings")
            argv = value
        else:
            value = value.strip()
            if not value:
                raise ValueError("entrypoint is empty: give `package.module:function` or a command")
            if ":" in value and " " not in value and not CALLABLE_RE.match(value):
                raise ValueError(f"{value!r} is not `package.module:function`")
            if CALLABLE_RE.match(value):
                return value
            try:
                argv = shlex.split(value)  # as `command` will, when the job starts
            except ValueError as err:
                raise ValueError(
                    f"entrypoint {_clip(repr(value))} is neither `package.module:function` nor a command a shell could "
                    f"split ({str(err).lower()}): close its quotes, or write the command as a list"
                ) from None
            if not argv or not argv[0]:
                raise ValueError(
                    f"entrypoint {_clip(repr(value))} names no program: give `package.module:function` or a command"
                )
        if any("\0" in arg for arg in argv):
            raise ValueError("entrypoint holds a NUL byte, which no command can: remove it")
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if "\0" in value:
            raise ValueError(f"workdir {_clip(value)} holds a NUL byte, which no path can: give a folder's path")
        longest = max(len(part.encode("utf-8", "replace")) for part in value.split("/"))
        if longest > NAME_MAX:
            raise ValueError(
                f"workdir {_clip(value)} has a name of {longest:,} bytes, over the {NAME_MAX} a file system takes: "
                "shorten it"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not ENV_NAME_RE.match(key) or key.startswith("GPUFLEET_"):
                raise ValueError(f"env name {key!r} is invalid (letters, digits, '_'; GPUFLEET_* is reserved)")
            if "\0" in item:
                raise ValueError(f"env {key}: its value holds a NUL byte, which no environment variable can: remove it")
        return value

    @field_validator("args")
    @classmethod
    def _args_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Every value at any depth must be one JSON holds as itself: the job is stored, and exported,
        # as JSON, where inf and NaN do not exist (an export would write null) and a date, a set or
        # binary data would come back as something else.
        todo: list[tuple[str, Any]] = [(f"args.{key}", item) for key, item in value.items()]
        while todo:
            where, item = todo.pop()
            if isinstance(item, float) and not math.isfinite(item):
                raise ValueError(f"{_clip(where)} must be a finite number, got {item}")
            if isinstance(item, dict):
                for key, sub in item.items():
                    if not isinstance(key, str):
                        raise ValueError(f"{_clip(where)}: key {_clip(repr(key))} is not text: quote it")
                    todo.append((f"{where}.{key}", sub))
            elif isinstance(item, list):
                todo.extend((f"{where}[{i}]", sub) for i, sub in enumerate(item))
            elif item is not None and not isinstance(item, str | int | float):
                raise ValueError(f"{_clip(where)} is {_json_hint(item)}")
        return value

    @model_validator(mode="after")
    def _world(self) -> JobSpec:
        nodes, gpus = self.resources.nodes, self.resources.gpus
        if self.distributed is None and nodes > 1:
            raise _field_error(
                "JobSpec",
                ("resources", "nodes"),
                nodes,
                f"{nodes} nodes need a `distributed` block (e.g. `distributed: {{strategy: ddp}}`): "
                "add one, or set resources.nodes to 1",
            )
        if self.distributed is not None and self.world_size < 2 and not self.distributed.one_rank:
            raise _field_error(
                "JobSpec",
                ("distributed",),
                self.distributed.model_dump(),
                f"resources.gpus={gpus} on 1 node is a world of 1 rank: drop the `distributed` block, "
                "or raise resources.gpus to 2 or more (one rank per GPU), or set distributed.one_rank: true",
            )
        if self.distributed is not None and self.distributed.recovery == "continue":
            why = _continue_refusal(self)
            if why is not None:
                raise _field_error(
                    "JobSpec",
                    ("distributed", "recovery"),
                    "continue",
                    f"continue (elastic: survivors step short-handed) needs {why}; "
                    "use wait (exact: survivors keep their processes) or requeue",
                )
        argv = self.command  # `wait` re-runs a rank in process: only a Python script or module can be
        launched = self.distributed is not None and self.distributed.launcher == "torchrun" and nodes == 1
        if argv and launched and self.recovery == "wait":
            python = len(argv) > 1 and re.fullmatch(r"python(?:3(?:\.\d+)?)?", argv[0]) is not None
            target = argv[2] if python and argv[1] == "-m" and len(argv) > 2 else argv[1] if python else "-"
            if target.startswith("-"):
                raise _field_error(
                    "JobSpec",
                    ("entrypoint",),
                    _clip(shlex.join(argv)),
                    "distributed.recovery: wait re-runs each surviving rank in its own process, which only a "
                    "Python entrypoint allows: write `python train.py ARGS`, `python -m pkg.mod ARGS` or "
                    "`package.module:function`, or set distributed.recovery: requeue",
                )
        return self

    @property
    def recovery(self) -> Literal["requeue", "wait", "continue"]:
        """What a lost rank costs: ``wait`` (re-form in place), ``continue`` (the survivors step on
        short-handed) or ``requeue`` (see :class:`Distributed`).

        Unset, it is ``wait`` for a group with a memory tier (the survivors' and the peer's RAM copies
        make the in-place restore fast) and ``requeue`` otherwise; one process is always ``requeue``."""
        if self.distributed is None:
            return "requeue"
        if self.distributed.recovery is None:
            return "wait" if self.checkpoint.memory is not None else "requeue"
        return self.distributed.recovery

    @property
    def ranks_per_node(self) -> int:
        """Processes per node: one per GPU (one on a node without GPUs) when ``distributed`` is set, else 1."""
        return max(self.resources.gpus, 1) if self.distributed is not None else 1

    @property
    def world_size(self) -> int:
        """Ranks of the job: ``nodes * max(gpus, 1)`` with a ``distributed`` block, else 1."""
        return self.resources.nodes * self.ranks_per_node

    @property
    def total_gpus(self) -> int:
        """GPUs the whole job holds (``gpus`` per node times ``nodes``): what GPU-hours are counted over."""
        return self.resources.gpus * self.resources.nodes

    @property
    def callable_entrypoint(self) -> str | None:
        """``module:function`` when the entrypoint is a Python callable, else ``None``."""
        if isinstance(self.entrypoint, str) and CALLABLE_RE.match(self.entrypoint):
            return self.entrypoint
        return None

    @property
    def command(self) -> list[str] | None:
        """The argv of a command entrypoint, else ``None``."""
        if self.callable_entrypoint is not None:
            return None
        return list(self.entrypoint) if isinstance(self.entrypoint, list) else shlex.split(self.entrypoint)

    def copy_with(self, **changes: Any) -> JobSpec:
        """A validated copy with some fields replaced (the spec itself is immutable)."""
        return parse_spec({**self.model_dump(), **changes}, source="<copy>")


def parse_spec(data: Any, source: str = "<spec>") -> JobSpec:
    """Validate a mapping as a JobSpec; raise ``SpecError`` naming the first bad field."""
    return validate(
        JobSpec,
        data,
        source=source,
        what="a JobSpec",
        reference="the fields in docs/reference/jobspec.md",
        error=SpecError,
    )


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate a JobSpec YAML file (untrusted input: ``yaml.safe_load`` only)."""
    path = Path(path)
    data = read_yaml(path, what="spec", error=SpecError)
    _refuse_other_file(data, path)
    spec = parse_spec(data, source=str(path))
    if spec.workdir is not None and not Path(spec.workdir).is_absolute():
        spec = spec.copy_with(workdir=str((path.parent / spec.workdir).resolve()))
    elif spec.workdir is None and spec.command is not None:
        spec = spec.copy_with(workdir=str(path.parent.resolve()))
    if spec.data is not None and any(_relative_source(s.source) for s in spec.data.sources):
        sources = [
            {**s.model_dump(), "source": str((path.parent / s.source).resolve())} if _relative_source(s.source) else s
            for s in spec.data.sources
        ]
        spec = spec.copy_with(data={**spec.data.model_dump(), "sources": sources})
    return spec


def attribute_docstrings(body: list[ast.stmt]) -> dict[str, str]:
    """Each field of a class body and the string written right under it (PEP 257's attribute docstrings).

    How a model here documents its fields (``workdir: str | None = None`` then its docstring): the JobSpec
    reference and the views' JSON schema read them from the source rather than repeat them in ``Field``.
    """
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


OTHER_FILES = (
    ("jobs", "a batch of jobs, for `gpufleet place FILE`"),
    ("offers", "a catalogue of offers, for `gpufleet place --catalog FILE` or `gpufleet fleet use FILE`"),
    ("space", "a sweep, for `gpufleet sweep run FILE`"),
    ("switches", "a network topology, for `gpufleet slurm topology FILE`"),
    ("models", "a quality monitor, for `gpufleet quality monitor run FILE`"),
)
"""The other YAML files gpufleet reads, by a top-level key no JobSpec has: what each is, and what reads it."""


def _refuse_other_file(data: Any, path: Path) -> None:
    """Say which file ``path`` is when it is one of :data:`OTHER_FILES`, not a JobSpec missing its fields."""
    if not isinstance(data, dict) or "entrypoint" in data:
        return
    for key, what in OTHER_FILES:
        if key in data:
            raise SpecError(
                f"{path}: not a JobSpec: its `{key}` makes it {what}; a JobSpec has a name and an entrypoint "
                "(docs/reference/jobspec.md)"
            )


def _relative_source(source: str) -> bool:
    return "://" not in source and not source.startswith("/")


__all__ = [
    "CALLABLE_RE",
    "ENV_NAME_RE",
    "GPU_SOURCE_HINT",
    "MAX_STEPS",
    "NAME_MAX",
    "OTHER_FILES",
    "WEEK_S",
    "CheckpointPolicy",
    "DataPolicy",
    "DataSource",
    "Distributed",
    "HealthPolicy",
    "JobSpec",
    "KeepBest",
    "MemoryTier",
    "OfferChoice",
    "Placement",
    "Resources",
    "Telemetry",
    "attribute_docstrings",
    "load_spec",
    "parse_spec",
]
