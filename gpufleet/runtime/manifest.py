"""What a checkpoint says it is (``manifest.json``, the model fingerprint), and the checks of its claims.

The manifest is read back from disk, so it is untrusted input: it is parsed by a strict model
(no coercion: ``"healthy": "false"`` is a string, not a boolean; ``"step": "60"`` is not a step;
no unknown fields), and anything that does not validate makes the checkpoint corrupt, with the
field named. ``schema_version`` stays 1: every field added since (``job``, ``fingerprint``,
``metrics``, and for sharded checkpoints ``format``, ``world_size``, ``strategy``, ``entries``) is
optional, so manifests written before them still read; a single-process manifest leaves the
sharded fields out when they hold their defaults, so older gpufleet versions read new ones too.

Two formats share the manifest: ``torch`` (one ``<entry>.pt`` per state entry, single process)
and ``dcp`` (written by N ranks through ``torch.distributed.checkpoint``: DCP's ``.metadata`` and
``__<rank>_<n>.distcp`` files, plus one ``rank-<5 digits>.pt`` per rank; see ``sharded.py``).
File names are checked against the format's own pattern, so neither can name a path outside
the folder (``../x``, ``a/b``, an empty name, a hidden name other than DCP's ``.metadata``).

Files are read the same careful way: the folder and each file are opened without following
links (``O_NOFOLLOW``; ``O_NONBLOCK`` so a FIFO cannot hang the reader), ``fstat``'ed, and read
only when they are regular files of the size the manifest states, so a link to ``/dev/zero`` or a
FIFO is a clear ``CorruptCheckpoint``, never a ``MemoryError`` or a hang.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError, field_validator, model_validator

from gpufleet.errors import CorruptCheckpoint, ForeignCheckpoint

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_MAX_BYTES = 1 << 20
"""A manifest is a few hundred bytes per file; anything past 1 MiB is not one we wrote."""
FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\.pt$")
"""A file of a ``torch`` checkpoint: ``<entry>.pt``."""
DCP_METADATA = ".metadata"
"""DCP's global metadata file (``FileSystemWriter`` writes ``.metadata.tmp``, then renames it)."""
DCP_FILE_RE = re.compile(r"^(?:\.metadata|__(\d{1,6})_\d{1,6}\.distcp|rank-(\d{5})\.pt)$")
"""A file of a ``dcp`` checkpoint: DCP's ``.metadata`` and ``__<rank>_<n>.distcp`` (torch 2.13's
``FileSystemWriter`` names), and the ranks' own ``rank-<5 digits>.pt``."""
Format = Literal["torch", "dcp"]
SHA256_RE = r"^[0-9a-f]{64}$"
STEP_RE = re.compile(r"^step-(\d{8})$")
# O_NOFOLLOW: a link is refused, not followed out of the folder; O_NONBLOCK: opening a FIFO
# returns at once (and fstat then refuses it) instead of waiting for a writer forever.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_HASH_CHUNK = 4 << 20


def rank_filename(rank: int) -> str:
    """The private file of ``rank`` in a ``dcp`` checkpoint (its RNG states and the like)."""
    return f"rank-{rank:05d}.pt"


def step_dirname(step: int) -> str:
    return f"step-{step:08d}"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class FileEntry(_Strict):
    """One file of a checkpoint, as the manifest records it."""

    sha256: str = Field(pattern=SHA256_RE)
    """Lower-case hex digest of the file's bytes."""
    bytes: int = Field(ge=0)
    """Exact size: a file of any other size is not read at all."""


class CheckpointManifest(_Strict):
    """What ``manifest.json`` holds (schema_version 1)."""

    schema_version: int
    step: int = Field(ge=0)
    healthy: bool
    loss: float | None = Field(default=None, allow_inf_nan=False)
    """Loss of the last step; a NaN or infinite loss is written as ``null``."""
    data_position: int = Field(default=0, ge=0)
    reason: str = ""
    created_at: FiniteFloat
    save_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    files: dict[str, FileEntry] = Field(min_length=1)
    """File name -> its sha256 and byte count."""
    meta: dict[str, Any] = Field(default_factory=dict)
    job: str | None = None
    """Identity of the job that wrote it (the job id under gpufleet): another job's is not restored."""
    fingerprint: str | None = Field(default=None, pattern=SHA256_RE)
    """``model_fingerprint`` of the model saved: names a checkpoint written for another architecture."""
    metrics: dict[str, FiniteFloat] = Field(default_factory=dict)
    """Metrics measured at this step (``keep_best`` ranks checkpoints by one of them)."""
    format: Format = "torch"
    """``torch``: one ``<entry>.pt`` per entry, one process; ``dcp``: sharded by ``world_size`` ranks (DCP)."""
    world_size: int = Field(default=1, ge=1)
    """How many ranks wrote it (``1`` for the ``torch`` format)."""
    strategy: str | None = None
    """How the model was distributed when saved (``fsdp``, ``ddp``, ``none``); informative."""
    entries: list[str] | None = None
    """``dcp``: the top-level keys of the state saved (``model``, ``optimizer``, ...), which
    ``Expectation.objects`` is checked against (a ``torch`` checkpoint's are its file names)."""

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != SCHEMA_VERSION:
            raise ValueError(f"schema_version {value} is not {SCHEMA_VERSION} (written by another gpufleet?)")
        return value

    @field_validator("files", mode="before")
    @classmethod
    def _safe_names(cls, files: Any) -> Any:
        # Checked before the entries: a name like "../../etc/passwd.pt" would read outside the folder.
        # Either format's names pass here; the format's own rule is checked once it is known.
        for name in files if isinstance(files, dict) else ():
            if not isinstance(name, str) or not (FILE_RE.match(name) or DCP_FILE_RE.match(name)):
                raise ValueError(
                    f"invalid file {name!r}: names are letters, digits, '_', '.', '-' ending in .pt "
                    "(or DCP's .metadata and __<rank>_<n>.distcp)"
                )
        return files

    @model_validator(mode="after")
    def _format_files(self) -> CheckpointManifest:
        if self.format == "torch":
            wrong = sorted(name for name in self.files if not FILE_RE.match(name))
            if wrong:
                raise ValueError(f"file {wrong[0]!r} is not a file of a torch-format checkpoint (<entry>.pt)")
            if self.world_size != 1:
                raise ValueError(f"world_size {self.world_size}: a torch-format checkpoint is written by one process")
            return self
        ranks: set[int] = set()
        for name in self.files:
            match = DCP_FILE_RE.match(name)
            if match is None:
                raise ValueError(f"file {name!r} is not a file of a dcp checkpoint")
            rank = match.group(1) or match.group(2)
            if rank is not None and int(rank) >= self.world_size:
                raise ValueError(f"file {name!r} names rank {int(rank)} of a checkpoint of {self.world_size} ranks")
            if match.group(2) is not None:
                ranks.add(int(match.group(2)))
        if DCP_METADATA not in self.files:
            raise ValueError(f"a dcp checkpoint lists {DCP_METADATA}, DCP's index of the shards; this one does not")
        missing = sorted(set(range(self.world_size)) - ranks)
        if missing:
            raise ValueError(f"{rank_filename(missing[0])} is not listed; a dcp checkpoint has one per rank")
        return self

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files.values())

    @property
    def stems(self) -> frozenset[str]:
        """The state entries this checkpoint holds (``model`` for ``model.pt``; ``entries`` for dcp)."""
        if self.format == "dcp":
            return frozenset(self.entries or ())
        return frozenset(name.removesuffix(".pt") for name in self.files)

    @property
    def described(self) -> str:
        """``torch`` or ``dcp x4`` (format and ranks), for a listing."""
        return "torch" if self.format == "torch" else f"dcp x{self.world_size}"

    def to_json(self) -> str:
        data = self.model_dump(mode="json")
        if self.format == "torch":  # as before sharded checkpoints: older readers forbid unknown fields
            for key, default in _SHARDED_DEFAULTS.items():
                if key in data and data[key] == default:
                    del data[key]
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def parse(cls, text: str | bytes, where: Path) -> CheckpointManifest:
        """Parse an untrusted manifest; raise ``CorruptCheckpoint`` naming the field that is wrong."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            raise CorruptCheckpoint(f"{where}: {describe_invalid(err)}") from None


_SHARDED_DEFAULTS: dict[str, Any] = {"format": "torch", "world_size": 1, "strategy": None, "entries": None}


def describe_invalid(err: ValidationError, *, fix: str = "delete this checkpoint") -> str:
    """One line for the first problem of a manifest (and how many more there are), ending in ``fix``."""
    errors = err.errors(include_url=False)
    first = errors[0]
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    if first["type"] == "json_invalid":
        return f"manifest is not valid JSON ({first['msg'].removeprefix('Invalid JSON: ')}); {fix}"
    where = _loc(first["loc"])
    if first["type"] == "missing":
        return f"manifest field {where} is missing{more}; {fix}"
    message = str(first["msg"]).removeprefix("Value error, ")
    got = repr(first.get("input"))
    got = got if len(got) <= 60 else got[:57] + "..."
    return f"manifest field {where}: {message} (got {got}){more}; {fix}"


def _loc(loc: tuple[int | str, ...]) -> str:
    if not loc:
        return "(top level)"
    out = str(loc[0])
    for part in loc[1:]:
        out += f"[{part!r}]" if isinstance(part, int) or not str(part).isidentifier() else f".{part}"
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectation:
    """What the restoring job needs of a checkpoint, beyond its being intact."""

    job: str | None = None
    """This job's identity: a checkpoint written by another job (``manifest.job`` set and different) is refused."""
    objects: frozenset[str] = frozenset()
    """State entries that must be present (``optimizer`` for ``optimizer.pt``, or a dcp checkpoint's entry)."""

    def __post_init__(self) -> None:
        if isinstance(self.objects, str):
            raise TypeError(f"Expectation.objects={self.objects!r} is one string: pass a set of names")
        object.__setattr__(self, "objects", frozenset(self.objects))


def open_folder(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK) or (err.errno == errno.ENOTDIR and path.is_symlink()):
            raise CorruptCheckpoint(f"{path} is a symbolic link: only real step folders are restored") from None
        if err.errno == errno.ENOTDIR:
            raise CorruptCheckpoint(f"{path} is not a directory") from None
        raise CorruptCheckpoint(f"{path}: cannot open ({err.strerror})") from None


def _open_in(folder: int, name: str, where: Path) -> int:
    """A descriptor on ``name`` in the open ``folder``, never through a link; ``CorruptCheckpoint`` if it cannot be."""
    try:
        return os.open(name, _READ_FLAGS, dir_fd=folder)
    except FileNotFoundError:
        incomplete = " (incomplete save)" if name == MANIFEST else ""
        raise CorruptCheckpoint(f"{where}: {name} is missing{incomplete}") from None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK):
            raise CorruptCheckpoint(
                f"{where}: {name} is a symbolic link; a checkpoint holds regular files only"
            ) from None
        raise CorruptCheckpoint(f"{where}: {name} unreadable ({err.strerror})") from None


def open_regular(folder: int, name: str, where: Path, *, size: int) -> int:
    """A descriptor on ``name`` in the open ``folder``: a regular file of ``size`` bytes, not reached through a link.

    For readers that seek in a file rather than read it whole (DCP's shards); the caller closes it.
    """
    fd = _open_in(folder, name, where)
    try:
        _check_sized(fd, name, where, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_sized(fd: int, name: str, where: Path, size: int) -> None:
    """Refuse the open ``fd`` unless it is a regular file of the ``size`` bytes the manifest lists."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise CorruptCheckpoint(f"{where}: {name} is not a regular file; a checkpoint holds files only")
    if info.st_size != size:
        raise CorruptCheckpoint(f"{where}: {name} has {info.st_size} bytes, manifest says {size}")


def read_regular(folder: int, name: str, where: Path, *, size: int | None = None, limit: int | None = None) -> bytes:
    """The bytes of ``name`` in the open ``folder``: a regular file, of ``size`` bytes (or at most ``limit``)."""
    fd = _open_in(folder, name, where)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = (
                "a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else "special"
            )
            raise CorruptCheckpoint(f"{where}: {name} is not a regular file ({kind}); a checkpoint holds files only")
        if size is not None and info.st_size != size:
            raise CorruptCheckpoint(f"{where}: {name} has {info.st_size} bytes, manifest says {size}")
        if limit is not None and info.st_size > limit:
            raise CorruptCheckpoint(f"{where}: {name} has {info.st_size} bytes, more than the {limit} allowed")
        with io.FileIO(fd, "rb", closefd=False) as fh:
            data = fh.readall()
    except OSError as err:
        raise CorruptCheckpoint(f"{where}: {name} unreadable ({err.strerror})") from None
    finally:
        os.close(fd)
    if size is not None and len(data) != size:  # it changed while being read
        raise CorruptCheckpoint(f"{where}: {name} has {len(data)} bytes, manifest says {size}")
    return data


def hash_regular(folder: int, name: str, where: Path, *, size: int) -> str:
    """The sha256 of ``name`` in the open ``folder``, read in chunks: a regular file of ``size`` bytes.

    For a dcp checkpoint's shards, which can be large: nothing is held in memory but a chunk.
    """
    fd = _open_in(folder, name, where)
    digest = hashlib.sha256()
    seen = 0
    try:
        _check_sized(fd, name, where, size)
        while chunk := os.read(fd, _HASH_CHUNK):
            digest.update(chunk)
            seen += len(chunk)
    except OSError as err:
        raise CorruptCheckpoint(f"{where}: {name} unreadable ({err.strerror})") from None
    finally:
        os.close(fd)
    if seen != size:  # it changed while being read
        raise CorruptCheckpoint(f"{where}: {name} has {seen} bytes, manifest says {size}")
    return digest.hexdigest()


def read_manifest_at(folder: int, path: Path) -> CheckpointManifest:
    manifest = CheckpointManifest.parse(read_regular(folder, MANIFEST, path, limit=MANIFEST_MAX_BYTES), path)
    if step_dirname(manifest.step) != path.name:
        raise CorruptCheckpoint(f"{path}: manifest says step {manifest.step}, the folder is named {path.name}")
    return manifest


def check_trainer(path: Path, manifest: CheckpointManifest, state: Mapping[str, Any]) -> None:
    """The trainer state and the manifest describe the same checkpoint (a stale or edited one does not)."""
    trainer = state.get("trainer")
    if not isinstance(trainer, dict):
        return
    if "step" in trainer:
        held = trainer["step"]
        if isinstance(held, bool) or not isinstance(held, int) or held != manifest.step:
            raise CorruptCheckpoint(f"{path}: manifest says step {manifest.step}, trainer.pt holds step {held!r}")
    if "objects" in trainer:
        listed = trainer["objects"]
        if not isinstance(listed, list | tuple) or not all(isinstance(o, str) for o in listed):
            raise CorruptCheckpoint(f"{path}: trainer.pt 'objects' is not a list of names ({listed!r})")
        missing, extra = sorted(set(listed) - manifest.stems), sorted(manifest.stems - set(listed))
        if missing:
            names = ", ".join(f"{m}.pt" for m in missing)
            raise CorruptCheckpoint(f"{path}: trainer.pt lists {sorted(listed)}, but the manifest has no {names}")
        if extra:
            names = ", ".join(f"{e}.pt" for e in extra)
            raise CorruptCheckpoint(f"{path}: the manifest lists {names}, which trainer.pt does not name")


def check_expectation(path: Path, manifest: CheckpointManifest, expect: Expectation) -> None:
    if expect.job is not None and manifest.job is not None and manifest.job != expect.job:
        raise ForeignCheckpoint(
            f"{path}: written by job {manifest.job}, this is job {expect.job}; give each job its own checkpoint folder"
        )
    missing = sorted(expect.objects - manifest.stems)
    if missing:
        names = ", ".join(missing) if manifest.format == "dcp" else ", ".join(f"{m}.pt" for m in missing)
        what = "state entry " if manifest.format == "dcp" else ""
        raise ForeignCheckpoint(f"{path}: has no {what}{names}; was it written by another training script?")


def finite_or_none(value: float | None) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def model_fingerprint(state_dict: Mapping[str, Any]) -> str:
    """sha256 over the sorted ``name:shape:dtype`` of the tensors of a model's ``state_dict``.

    Names and shapes identify an architecture (and dtypes how it is stored) without reading a
    single weight, so two models with the same layers give the same fingerprint whatever their
    values, and a resized layer changes it. Non-tensor entries (``_extra_state``) are left out.
    """
    import torch

    lines = sorted(
        f"{name}:{','.join(str(d) for d in value.shape)}:{value.dtype}"
        for name, value in state_dict.items()
        if isinstance(value, torch.Tensor)
    )
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def state_dict_mismatch(saved: Mapping[str, Any], current: Mapping[str, Any], *, show: int = 3) -> str:
    """Why ``saved`` does not fit a model whose state_dict is ``current``, in one short line.

    Lists the first ``show`` missing keys (the model has them, the checkpoint does not),
    unexpected keys (the reverse) and shape or dtype mismatches, each with its count, in the
    words of ``load_state_dict``, for an error that says what changed in the model.
    """
    import torch

    def described(value: Any) -> tuple[list[int] | None, str | None]:
        if isinstance(value, torch.Tensor):
            return list(value.shape), str(value.dtype).removeprefix("torch.")
        return None, None

    def first(names: list[str]) -> str:
        extra = f" (+{len(names) - show} more)" if len(names) > show else ""
        return ", ".join(names[:show]) + extra

    missing = sorted(k for k in current if k not in saved)
    unexpected = sorted(k for k in saved if k not in current)
    shapes, dtypes = [], []
    for name in sorted(k for k in current if k in saved):
        (old_shape, old_dtype), (new_shape, new_dtype) = described(saved[name]), described(current[name])
        if old_shape != new_shape:
            shapes.append(f"shape of {name} is {old_shape} in the checkpoint, {new_shape} in the model")
        elif old_dtype != new_dtype:
            dtypes.append(f"dtype of {name} is {old_dtype} in the checkpoint, {new_dtype} in the model")
    parts = []
    if missing:
        parts.append(f"missing {len(missing)}: {first(missing)}")
    if unexpected:
        parts.append(f"unexpected {len(unexpected)}: {first(unexpected)}")
    for group in (shapes, dtypes):
        if group:
            more = f" (+{len(group) - show} more)" if len(group) > show else ""
            parts.append("; ".join(group[:show]) + more)
    return "; ".join(parts) if parts else "same names, shapes and dtypes"


__all__ = [
    "DCP_FILE_RE",
    "DCP_METADATA",
    "FILE_RE",
    "MANIFEST",
    "MANIFEST_MAX_BYTES",
    "SCHEMA_VERSION",
    "STEP_RE",
    "CheckpointManifest",
    "Expectation",
    "FileEntry",
    "Format",
    "check_expectation",
    "check_trainer",
    "describe_invalid",
    "finite_or_none",
    "hash_regular",
    "model_fingerprint",
    "open_folder",
    "open_regular",
    "rank_filename",
    "read_manifest_at",
    "read_regular",
    "state_dict_mismatch",
    "step_dirname",
]
